# GPU step (sourced by scripts/gpu_check.sh): where the batch-1 decode step's time goes beyond
# bytes (issue #6: 70 % of the roofline at concurrency 1). Three opt-in parts, each off unless its
# variable is set, so a full gpu_check run does not grow:
#
# DI_MERGE_SWEEP_CTX="512 1024 1536 2048": bench_cuda_model --preset deepseek-v2-lite --conc 1
#   at each context with the default MLA merge (by parts in the grid) and with each kernel forced
#   (DEEPINFER_MLA_MERGE=wide | split), interleaved per context: the check that the default picks
#   the faster kernel at every context (`merge_<ctx>_<kind>`, tok/s lines in the summary).
# DI_STALL_PRESETS="deepseek-v2-lite qwen3-30b-a3b": ncu PC sampling over one captured batch-1
#   step (ctx DI_STALL_CTX, 2048), every graph node on its own, clocks and caches left alone: per
#   kernel its time and the share of its warp samples per stall reason (scripts/ncu_summary.py),
#   e.g. `no_instructions` (instruction fetch) vs `long_scoreboard` (global loads) vs `barrier`.
#   Kernel replay may run a node's later passes with a warm instruction cache; the sampling
#   metrics below are few enough for one pass.
# DI_SASS_COUNT=1: SASS instructions per kernel of bench_cuda_model (cuobjdump -sass), the 40
#   largest, to `sass_count` in the summary (the code a once-per-layer kernel fetches cold).
if [ -x .gpu_bin/bench_cuda_model ] && [ -n "${DI_MERGE_SWEEP_CTX:-}" ]; then
  for ctx in $DI_MERGE_SWEEP_CTX; do
    for kind in default wide split; do
      name="merge_${ctx}_${kind}"
      envs=()
      [ "$kind" != default ] && envs=("DEEPINFER_MLA_MERGE=$kind")
      run_step "$name" 90 env "${envs[@]}" .gpu_bin/bench_cuda_model --preset deepseek-v2-lite \
        --conc 1 --ctx "$ctx" --reps 10 --tag "$name"
      grep -E '^\[model\].*conc' "$OUT/$name.log" >>"$OUT/summary_extra.txt" ||
        echo "[model] $name: no output" >>"$OUT/summary_extra.txt"
    done
  done
fi

NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "${DI_STALL_PRESETS:-}" ] && [ -n "$NCU" ] && [ -x .gpu_bin/bench_cuda_model ]; then
  stall_metrics=gpu__time_duration.sum,smsp__pcsamp_sample_count
  for reason in no_instructions long_scoreboard short_scoreboard wait barrier membar \
    branch_resolving math_pipe_throttle mio_throttle lg_throttle not_selected selected \
    dispatch_stall sleeping drain misc; do
    stall_metrics+=",smsp__pcsamp_warps_issue_stalled_$reason"
  done
  for preset in $DI_STALL_PRESETS; do
    name="stalls_$preset"
    run_step "$name" "${DI_NCU_TIMEOUT_S:-240}" "$NCU" --profile-from-start off \
      --graph-profiling node --metrics "$stall_metrics" --warp-sampling-interval 0 --csv \
      --page raw --clock-control none --cache-control none \
      .gpu_bin/bench_cuda_model --preset "$preset" --conc 1 --ctx "${DI_STALL_CTX:-2048}" \
      --reps 3 --ncu
    python3 scripts/ncu_summary.py "$OUT/$name.log" "$name" 24 >>"$OUT/summary_extra.txt" 2>&1
  done
elif [ -n "${DI_STALL_PRESETS:-}" ]; then
  echo "[ncu] stalls skipped: no ncu or bench_cuda_model" >>"$OUT/summary_extra.txt"
fi

if [ "${DI_SASS_COUNT:-0}" = 1 ] && [ -x .gpu_bin/bench_cuda_model ]; then
  CUOBJDUMP=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
  if [ -n "$CUOBJDUMP" ]; then
    run_step sass_count 120 bash -c "'$CUOBJDUMP' -sass .gpu_bin/bench_cuda_model | python3 scripts/sass_count.py 40"
    sed -n '/^\[sass\]/,$p' "$OUT/sass_count.log" >>"$OUT/summary_extra.txt"
  else
    echo "[sass] skipped: no cuobjdump" >>"$OUT/summary_extra.txt"
  fi
fi
