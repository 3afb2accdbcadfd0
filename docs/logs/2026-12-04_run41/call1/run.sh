#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
echo "== rowread cta4" | tee -a $S
timeout 120 $B/bench_cuda_rowread 2>&1 | tee -a $S
echo "== rowread cta8" | tee -a $S
timeout 120 $B/bench_cuda_rowread --cta8 2>&1 | tee -a $S
echo "== moe t1" | tee -a $S
timeout 120 $B/bench_cuda_moe --t1 2>&1 | grep "^\[moe\]" | tee -a $S
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu=$NCU" | tee -a $S
timeout 200 "$NCU" --profile-from-start off --graph-profiling node \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active \
    --csv --page raw --clock-control none --cache-control none $B/bench_cuda_moe --t1 --ncu > $OUT/ncu_raw.log 2>&1
python3 scripts/ncu_metrics.py "$OUT/ncu_raw.log" ncu_moe_t1 2>&1 | tee -a $S
timeout 300 "$NCU" --profile-from-start off --graph-profiling node -k regex:moe_ \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
    --clock-control none --cache-control none $B/bench_cuda_moe --t1 --ncu > $OUT/ncu_sections.log 2>&1
echo "sections rc=$? lines=$(wc -l < $OUT/ncu_sections.log)" | tee -a $S
