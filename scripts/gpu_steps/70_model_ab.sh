# MLA split-size A/B for DeepSeek-V2-Lite (bench_cuda_model; see 25_model.sh), last because it
# only tunes a default: 32-entry splits (twice the CTAs at batch 1: the kernel's latency there)
# and 128-entry ones (fewer f32 partials at batch 32) against the default 64.
if [ -x .gpu_bin/bench_cuda_model ]; then
  run_step model_v2lite_split32 20 env DEEPINFER_MLA_SPLIT=32 .gpu_bin/bench_cuda_model \
    --preset deepseek-v2-lite --conc 1,32 --ctx 2048 --reps 5 --tag mla-split32
  run_step model_v2lite_split128 20 env DEEPINFER_MLA_SPLIT=128 .gpu_bin/bench_cuda_model \
    --preset deepseek-v2-lite --conc 1,32 --ctx 2048 --reps 5 --tag mla-split128
  for n in model_v2lite_split32 model_v2lite_split128; do
    grep -E '^\[model\]' "$OUT/$n.log" >>"$OUT/summary_extra.txt" 2>/dev/null || true
  done
fi
