# MoE decode A/B at the model level (moeperf, issue #6): DeepSeek-V2-Lite with the old MoE kernels
# (DEEPINFER_MOE_DECODE=v1 DEEPINFER_MOE_ROUTE=serial: one-thread router, v1 decode kernels, 4-kernel
# batch-1 path; tag=moe-old), to set against the untagged default lines of 25_model.sh (warp
# router, tensor-core decode kernels, 2-kernel batch-1 path). Worst case 15 s.
# Lines: [model] preset=deepseek-v2-lite tag=moe-old conc=1 ctx=2048 mode=graph step_ms=.. pct=..
if [ -x .gpu_bin/bench_cuda_model ]; then
  run_step model_v2lite_moe_old 15 env DEEPINFER_MOE_DECODE=v1 DEEPINFER_MOE_ROUTE=serial \
    .gpu_bin/bench_cuda_model --preset deepseek-v2-lite --conc 1,32 --ctx 2048 --reps 3 --tag moe-old
  grep -E '^\[model\]' "$OUT/model_v2lite_moe_old.log" >>"$OUT/summary_extra.txt" 2>/dev/null ||
    echo "[model] model_v2lite_moe_old: no output (see model_v2lite_moe_old.log)" >>"$OUT/summary_extra.txt"
fi
