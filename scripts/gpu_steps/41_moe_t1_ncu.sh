# GPU step (sourced by scripts/gpu_check.sh): the one-token MoE kernels alone under ncu
# (bench_cuda_moe --t1 --ncu: the chain of 8 calls replayed once inside cudaProfilerStart/Stop;
# run 40 found down streaming at 2.6-2.7 TB/s against gate_up's 3.9-4.1 in that chain; run 41
# ran it by hand: docs/logs/2026-12-04_run41/call1). Means per
# kernel of time, DRAM bytes read and throughput, L2 hit rate and achieved occupancy
# (scripts/ncu_metrics.py) land in summary_extra.txt. Step name: ncu_moe_t1.
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ -x .gpu_bin/bench_cuda_moe ]; then
  NCU_METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active
  run_step ncu_moe_t1 "${DI_NCU_TIMEOUT_S:-150}" "$NCU" --profile-from-start off --graph-profiling node \
    --metrics "$NCU_METRICS" \
    --csv --page raw --clock-control none --cache-control none .gpu_bin/bench_cuda_moe --t1 --ncu
  python3 scripts/ncu_metrics.py "$OUT/ncu_moe_t1.log" ncu_moe_t1 "$NCU_METRICS" >>"$OUT/summary_extra.txt" 2>&1
else
  echo "[ncu] ncu_moe_t1 skipped: no ncu or bench_cuda_moe" >>"$OUT/summary_extra.txt"
fi
