# GPU step (sourced by scripts/gpu_check.sh): the MLA decode kernel's op tests, then the
# real-model decode benchmark with random device weights (bench/cuda/bench_cuda_model.cpp) for
# DeepSeek-V2-Lite and Qwen3-30B-A3B at concurrency 1 / 32 / 256 with 2048-token contexts, and
# Llama-3.1-8B at concurrency 1 with 512; V2-Lite once more with the generic attention kernel
# (DEEPINFER_MLA_KERNEL=0, lines tagged tag=generic-attn) as the A/B of the MLA decode kernel, and
# with 128- and 256-entry MLA splits (tag=mla-split128/256: fewer f32 partials at batch 256, fewer
# CTAs at batch 1; the default is 64).
# Worst case 120 s (the timeouts below); the split A/B runs are in 70_model_ab.sh, last.
# Lines in $OUT/summary_extra.txt:
#   [mla] test_cuda_mla rc=0 passed=16 failed=0
#   [model] preset=deepseek-v2-lite conc=32 ctx=2048 mode=eager step_ms=.. tok_s=.. roofline_tok_s=.. pct=..
if [ -x .gpu_bin/test_cuda_mla ]; then
  run_step mla_ops 120 .gpu_bin/test_cuda_mla --gtest_color=no
  {
    echo "[mla] test_cuda_mla rc=${rcs[${#rcs[@]}-1]} passed=$(grep -c '^\[       OK \]' "$OUT/mla_ops.log") failed=$(grep -o '^\[  FAILED  \] [A-Za-z][^ ,]*' "$OUT/mla_ops.log" | sort -u | wc -l)"
    grep -E '^\[mla\] .*FAIL' "$OUT/mla_ops.log" | head -20
  } >>"$OUT/summary_extra.txt"
fi
if [ -x .gpu_bin/bench_cuda_model ]; then
  run_step model_v2lite 30 .gpu_bin/bench_cuda_model --preset deepseek-v2-lite --conc 1,32,256 --ctx 2048
  run_step model_qwen3moe 40 .gpu_bin/bench_cuda_model --preset qwen3-30b-a3b --conc 1,32,256 --ctx 2048
  run_step model_llama8b 15 .gpu_bin/bench_cuda_model --preset llama3-8b --conc 1 --ctx 512
  run_step model_v2lite_generic 20 env DEEPINFER_MLA_KERNEL=0 .gpu_bin/bench_cuda_model \
    --preset deepseek-v2-lite --conc 1,32,256 --ctx 2048 --reps 3 --tag generic-attn
  for n in model_v2lite model_qwen3moe model_llama8b model_v2lite_generic; do
    grep -E '^\[model\]' "$OUT/$n.log" >>"$OUT/summary_extra.txt" || echo "[model] $n: no output (see $n.log)" >>"$OUT/summary_extra.txt"
  done
fi
