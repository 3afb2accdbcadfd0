# MLA split-size A/B for DeepSeek-V2-Lite (bench_cuda_model; see 25_model.sh), last because it
# only tunes a default: 128- and 256-entry splits (fewer f32 partials at batch 256, fewer CTAs at
# batch 1) against the default 64.
if [ -x .gpu_bin/bench_cuda_model ]; then
  run_step model_v2lite_split128 15 env DEEPINFER_MLA_SPLIT=128 .gpu_bin/bench_cuda_model \
    --preset deepseek-v2-lite --conc 1,256 --ctx 2048 --reps 3 --tag mla-split128
  run_step model_v2lite_split256 15 env DEEPINFER_MLA_SPLIT=256 .gpu_bin/bench_cuda_model \
    --preset deepseek-v2-lite --conc 1,256 --ctx 2048 --reps 3 --tag mla-split256
  for n in model_v2lite_split128 model_v2lite_split256; do
    grep -E '^\[model\]' "$OUT/$n.log" >>"$OUT/summary_extra.txt" 2>/dev/null || true
  done
fi
