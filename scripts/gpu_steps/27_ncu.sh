# GPU step (sourced by scripts/gpu_check.sh): per-kernel device times of one captured decode step
# (bench_cuda_model --ncu: one graph replay inside cudaProfilerStart/Stop; ncu profiles each graph
# node, clocks and caches left alone). The sum is the step's kernel time; step_ms minus it is the
# launch/gap overhead of the graph. Summaries (scripts/ncu_summary.py) land in summary_extra.txt.
# DI_NCU_CASES="name preset conc ctx;..." replaces the default cases; DI_NCU_TIMEOUT_S (150) caps
# each (a V2-Lite / Qwen3 step at conc 32 replays ~900 nodes, each profiled on its own).
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ -x .gpu_bin/bench_cuda_model ]; then
  ncu_case() {  # name preset conc ctx
    run_step "ncu_$1" "${DI_NCU_TIMEOUT_S:-150}" "$NCU" --profile-from-start off --graph-profiling node \
      --metrics gpu__time_duration.sum --csv --page raw --clock-control none --cache-control none \
      .gpu_bin/bench_cuda_model --preset "$2" --conc "$3" --ctx "$4" --reps 3 --ncu
    python3 scripts/ncu_summary.py "$OUT/ncu_$1.log" "$1" 22 >>"$OUT/summary_extra.txt" 2>&1
    grep -E '^\[model\]' "$OUT/ncu_$1.log" >>"$OUT/summary_extra.txt"
  }
  cases=${DI_NCU_CASES:-"llama8b_c1 llama3-8b 1 512;v2lite_c1 deepseek-v2-lite 1 2048;v2lite_c32 deepseek-v2-lite 32 2048;qwen3moe_c32 qwen3-30b-a3b 32 2048"}
  IFS=';' read -ra ncu_cases <<<"$cases"
  for c in "${ncu_cases[@]}"; do
    read -ra a <<<"$c"
    ncu_case "${a[@]}"
  done
else
  echo "[ncu] skipped: no ncu or bench_cuda_model" >>"$OUT/summary_extra.txt"
fi
