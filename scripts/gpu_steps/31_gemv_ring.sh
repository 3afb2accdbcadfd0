# GPU step (sourced by scripts/gpu_check.sh): the batch-1 GEMV designs (kernels/gemv.h):
#   gemv_bench            bench_cuda_gemv: each Llama-3.1-8B projection alone vs a pure-read floor,
#                         per setting (ring policy / registers / rings / tensor-core kernel), the
#                         FMA settings checked bitwise against the registers, mma within 2e-2;
#   ops_gemv_<setting>    the fused linear op cases with every row count on the GEMV
#                         (DEEPINFER_GEMV_MAX_ROWS=8) per setting;
#   gemv_model_<preset>_<setting>   the model at batch 1 (and Llama at 2) per setting, [model] lines
#                         tagged gemv-<setting>. Settings: default (ring policy), regs
#                         (DEEPINFER_GEMV_RING=0), mma (DEEPINFER_GEMV_MMA=1).
if [ -x .gpu_bin/bench_cuda_gemv ]; then
  run_step gemv_bench 120 .gpu_bin/bench_cuda_gemv --reps 20
  grep -E '^\[(copy|floor|gemv|check)\]' "$OUT/gemv_bench.log" >>"$OUT/summary_extra.txt"
fi
gemv_env() {  # setting -> env assignments
  case $1 in
    regs) echo DEEPINFER_GEMV_RING=0 ;;
    mma) echo DEEPINFER_GEMV_MMA=1 ;;
    *) echo DI_GEMV_DEFAULT=1 ;;
  esac
}
if [ -x .gpu_bin/test_backend_ops ]; then
  for st in ${DI_GEMV_OPS_SETTINGS:-default regs mma}; do
    # shellcheck disable=SC2046
    run_step "ops_gemv_$st" 60 env $(gemv_env "$st") DEEPINFER_GEMV_MAX_ROWS=8 \
      .gpu_bin/test_backend_ops --gtest_color=no --gtest_filter='*fused_linear*:*linear*'
    echo "[ops] gemv $st, DEEPINFER_GEMV_MAX_ROWS=8: passed=$(grep -c '^\[       OK \]' "$OUT/ops_gemv_$st.log") failed=$(grep -c '^\[  FAILED  \].*(' "$OUT/ops_gemv_$st.log")" >>"$OUT/summary_extra.txt"
    grep -E 'FAIL$' "$OUT/ops_gemv_$st.log" | head -5 >>"$OUT/summary_extra.txt"
  done
fi
if [ -x .gpu_bin/bench_cuda_model ]; then
  for pc in "llama3-8b|--conc 1,2 --ctx 512" "deepseek-v2-lite|--conc 1 --ctx 2048" "qwen3-30b-a3b|--conc 1 --ctx 2048"; do
    preset=${pc%%|*} args=${pc#*|}
    for st in ${DI_GEMV_MODEL_SETTINGS:-default regs mma}; do
      # shellcheck disable=SC2046,SC2086
      run_step "gemv_model_${preset}_$st" 40 env $(gemv_env "$st") .gpu_bin/bench_cuda_model \
        --preset "$preset" $args --reps 10 --tag "gemv-$st"
      grep -E '^\[model\].*conc' "$OUT/gemv_model_${preset}_$st.log" >>"$OUT/summary_extra.txt" ||
        echo "[model] gemv_model_${preset}_$st: no output" >>"$OUT/summary_extra.txt"
    done
  done
fi
