# GPU step (sourced by scripts/gpu_check.sh): per-kernel device times of one captured decode step
# (bench_cuda_model --ncu: one graph replay inside cudaProfilerStart/Stop; ncu profiles each graph
# node, clocks and caches left alone). The sum is the step's kernel time; step_ms minus it is the
# launch/gap overhead of the graph. Summaries (scripts/ncu_summary.py) land in summary_extra.txt.
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ -x .gpu_bin/bench_cuda_model ]; then
  ncu_case() {  # name preset conc ctx
    run_step "ncu_$1" 90 "$NCU" --profile-from-start off --graph-profiling node \
      --metrics gpu__time_duration.sum --csv --page raw --clock-control none --cache-control none \
      .gpu_bin/bench_cuda_model --preset "$2" --conc "$3" --ctx "$4" --reps 3 --ncu
    python3 scripts/ncu_summary.py "$OUT/ncu_$1.log" "$1" 22 >>"$OUT/summary_extra.txt" 2>&1
    grep -E '^\[model\]' "$OUT/ncu_$1.log" >>"$OUT/summary_extra.txt"
  }
  ncu_case llama8b_c1 llama3-8b 1 512
  ncu_case v2lite_c1 deepseek-v2-lite 1 2048
  ncu_case v2lite_c32 deepseek-v2-lite 32 2048
  ncu_case qwen3moe_c32 qwen3-30b-a3b 32 2048
else
  echo "[ncu] skipped: no ncu or bench_cuda_model" >>"$OUT/summary_extra.txt"
fi
