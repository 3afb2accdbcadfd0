# GPU step (sourced by scripts/gpu_check.sh): the small-M fused linear kernel (kernels/gemv.h).
# Its op cases with every templated row count enabled (DEEPINFER_GEMV_MAX_ROWS=8; the default run
# of test_backend_ops covers the default threshold), then the decode A/B on the real model:
# cuBLAS + separate elementwise kernels (DEEPINFER_GEMV_MAX_ROWS=0) vs the fused kernel for up to
# 4 and 8 rows, Llama-3.1-8B at batch 1/2/4/8 (512 context) and the MoE presets at batch 1.
run_step ops_gemv8 60 env DEEPINFER_GEMV_MAX_ROWS=8 .gpu_bin/test_backend_ops --gtest_color=no \
  --gtest_filter='*fused_linear*:*linear*'
{
  echo "[gemv] ops with DEEPINFER_GEMV_MAX_ROWS=8: rc=${rcs[${#rcs[@]}-1]} passed=$(grep -c '^\[       OK \]' "$OUT/ops_gemv8.log") failed=$(grep -c '^\[  FAILED  \].*(' "$OUT/ops_gemv8.log")"
  grep -E 'FAIL$' "$OUT/ops_gemv8.log" | head -10
} >>"$OUT/summary_extra.txt"
if [ -x .gpu_bin/bench_cuda_model ]; then
  for r in 0 1 4 8; do
    run_step "gemv_ab_llama_r$r" 40 env DEEPINFER_GEMV_MAX_ROWS=$r .gpu_bin/bench_cuda_model \
      --preset llama3-8b --conc 1,2,4,8 --ctx 512 --reps 10 --tag gemv_rows$r
    grep -E '^\[model\]' "$OUT/gemv_ab_llama_r$r.log" >>"$OUT/summary_extra.txt"
  done
  run_step gemv_ab_llama_r1_nopdl 40 env DEEPINFER_GEMV_MAX_ROWS=1 DEEPINFER_PDL=0 \
    .gpu_bin/bench_cuda_model --preset llama3-8b --conc 1 --ctx 512 --reps 10 --tag gemv_rows1_nopdl
  grep -E '^\[model\]' "$OUT/gemv_ab_llama_r1_nopdl.log" >>"$OUT/summary_extra.txt"
  for r in 0 1; do
    run_step "gemv_ab_v2lite_r$r" 40 env DEEPINFER_GEMV_MAX_ROWS=$r .gpu_bin/bench_cuda_model \
      --preset deepseek-v2-lite --conc 1 --ctx 2048 --reps 10 --tag gemv_rows$r
    grep -E '^\[model\]' "$OUT/gemv_ab_v2lite_r$r.log" >>"$OUT/summary_extra.txt"
    run_step "gemv_ab_qwen3moe_r$r" 40 env DEEPINFER_GEMV_MAX_ROWS=$r .gpu_bin/bench_cuda_model \
      --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 10 --tag gemv_rows$r
    grep -E '^\[model\]' "$OUT/gemv_ab_qwen3moe_r$r.log" >>"$OUT/summary_extra.txt"
  done
fi
# The GQA decode attention kernel vs the generic CUDA-core kernel (DEEPINFER_ATTN_DECODE=generic).
if [ -x .gpu_bin/bench_cuda_model ]; then
  run_step attn_ab_llama_generic 40 env DEEPINFER_ATTN_DECODE=generic .gpu_bin/bench_cuda_model \
    --preset llama3-8b --conc 1,8,64 --ctx 512 --reps 10 --tag attn_generic
  run_step attn_ab_llama_decode 40 .gpu_bin/bench_cuda_model \
    --preset llama3-8b --conc 1,8,64 --ctx 512 --reps 10 --tag attn_decode
  grep -hE '^\[model\]' "$OUT/attn_ab_llama_generic.log" "$OUT/attn_ab_llama_decode.log" >>"$OUT/summary_extra.txt"
fi
