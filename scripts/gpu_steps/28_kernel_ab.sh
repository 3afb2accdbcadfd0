# Same-call A/B runs of this session's decode kernel changes (bench_cuda_model, random weights,
# CUDA graphs), each against its switch-off twin; lines tagged ab-<name> in summary_extra.txt:
#   pipelined batch-1 MoE down kernel                V2-Lite / Qwen3 c=1 DEEPINFER_MOE_T1_DOWN=v1
#   MLA decode head groups (auto)                    V2-Lite c=1,32      DEEPINFER_MLA_HEAD_SPLIT=1
# The "on" side is model_llama8b / model_v2lite / model_qwen3moe of 25_model.sh (same call).
if [ -x .gpu_bin/bench_cuda_model ]; then
  run_step ab_v2lite_t1v1 20 env DEEPINFER_MOE_T1_DOWN=v1 .gpu_bin/bench_cuda_model \
    --preset deepseek-v2-lite --conc 1 --ctx 2048 --tag ab-moe-t1-v1
  run_step ab_v2lite_hs1 25 env DEEPINFER_MLA_HEAD_SPLIT=1 .gpu_bin/bench_cuda_model \
    --preset deepseek-v2-lite --conc 1,32 --ctx 2048 --tag ab-mla-hs1
  run_step ab_qwen3_t1v1 25 env DEEPINFER_MOE_T1_DOWN=v1 .gpu_bin/bench_cuda_model \
    --preset qwen3-30b-a3b --conc 1 --ctx 2048 --tag ab-moe-t1-v1
  for n in ab_v2lite_t1v1 ab_v2lite_hs1 ab_qwen3_t1v1; do
    grep -E '^\[model\]' "$OUT/$n.log" >>"$OUT/summary_extra.txt" 2>/dev/null ||
      echo "[model] $n: no output (see $n.log)" >>"$OUT/summary_extra.txt"
  done
fi
