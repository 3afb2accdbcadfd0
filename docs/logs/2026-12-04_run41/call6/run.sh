#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
timeout 300 "$NCU" --profile-from-start off --graph-profiling node -k regex:moe_down \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
    --clock-control none --cache-control none $B/bench_cuda_moe --t1 --ncu > $OUT/ncu_slot.log 2>&1
echo "ncu rc=$?" | tee -a $S
grep -E "moe_down_t1_slot_kernel<|^\s+(Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Waves Per|SM Active Cycles|Elapsed Cycles)" $OUT/ncu_slot.log | awk '!seen[$0]++' | head -40 | tee -a $S
tr() { local tag=$1 preset=$2; shift 2
  env "$@" timeout 120 $B/bench_cuda_model_trace --preset $preset --conc 1 --ctx 2048 --reps 10 --trace $OUT/trace_$tag.csv > $OUT/trace_$tag.log 2>&1
  python3 scripts/trace_layers.py $OUT/trace_$tag.csv > $OUT/trace_layers_$tag.txt 2>&1
  echo "-- $tag" | tee -a $S; sed -n 2,12p $OUT/trace_layers_$tag.txt | tee -a $S
  rm -f $OUT/trace_$tag.csv; }
tr v2_c4 deepseek-v2-lite X=0
tr v2_c1 deepseek-v2-lite DEEPINFER_MOE_T1_SLOT_C=1
tr v2_smem deepseek-v2-lite DEEPINFER_MOE_T1_DOWN=smem
tr q3_c4 qwen3-30b-a3b X=0
