# GPU step (sourced by scripts/gpu_check.sh): the batch-1 GEMV designs (kernels/gemv.h):
#   gemv_bench            bench_cuda_gemv: each Llama-3.1-8B projection alone vs a pure-read floor,
#                         per setting (ring policy / registers / rings), checked bitwise against
#                         the registers;
#   ops_gemv_<setting>    the fused linear op cases with every row count on the GEMV
#                         (DEEPINFER_GEMV_MAX_ROWS=8) per setting;
#   gemv_model_<preset>_<setting>   the model at batch 1 (and Llama at 2) per setting, [model] lines
#                         tagged gemv-<setting>. Settings: default (ring policy), regs
#                         (DEEPINFER_GEMV_RING=0).
if [ -x .gpu_bin/bench_cuda_gemv ]; then
  run_step gemv_bench 120 .gpu_bin/bench_cuda_gemv --reps 20
  grep -E '^\[(copy|floor|gemv|check)\]' "$OUT/gemv_bench.log" >>"$OUT/summary_extra.txt"
fi
gemv_env() {  # setting -> env assignments
  case $1 in
    regs) echo DEEPINFER_GEMV_RING=0 ;;
    *) echo DI_GEMV_DEFAULT=1 ;;
  esac
}
if [ -x .gpu_bin/test_backend_ops ]; then
  for st in ${DI_GEMV_OPS_SETTINGS:-default regs}; do
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
    for st in ${DI_GEMV_MODEL_SETTINGS:-default regs}; do
      # shellcheck disable=SC2046,SC2086
      run_step "gemv_model_${preset}_$st" 40 env $(gemv_env "$st") .gpu_bin/bench_cuda_model \
        --preset "$preset" $args --reps 10 --tag "gemv-$st"
      grep -E '^\[model\].*conc' "$OUT/gemv_model_${preset}_$st.log" >>"$OUT/summary_extra.txt" ||
        echo "[model] gemv_model_${preset}_$st: no output" >>"$OUT/summary_extra.txt"
    done
  done
fi
# Decode A/Bs on the attention side: DI_DECODE_AB="tag|ENV=V;tag|ENV=V" (e.g.
# "split64|DEEPINFER_ATTN_SPLIT=64;split32|DEEPINFER_ATTN_SPLIT=32" or
# "hs1|DEEPINFER_GQA_HEAD_SPLIT=1;hs2|DEEPINFER_GQA_HEAD_SPLIT=2") on the cases of
# DI_DECODE_AB_CASES ("preset|args;..."; default: Llama at batch 1 / 8 / 32 / 64 with a 512
# context and batch 1 at 2048, Qwen3-30B-A3B at 1 / 32 with 2048), [model] lines tagged <tag>.
# An assignment DI_AB_BIN=<file> runs .gpu_bin/<file> instead of bench_cuda_model.
if [ -n "${DI_DECODE_AB:-}" ] && [ -x .gpu_bin/bench_cuda_model ]; then
  IFS=';' read -ra ab_runs <<<"$DI_DECODE_AB"
  IFS=';' read -ra ab_cases <<<"${DI_DECODE_AB_CASES:-llama3-8b|--conc 1,8,32,64 --ctx 512;llama3-8b|--conc 1 --ctx 2048;qwen3-30b-a3b|--conc 1,32 --ctx 2048}"
  for run in "${ab_runs[@]}"; do
    tag=${run%%|*} envs=${run#*|}
    for pc in "${ab_cases[@]}"; do
      preset=${pc%%|*} args=${pc#*|}
      name="decode_ab_${tag}_${preset}_$(echo "$args" | tr -dc '0-9' | tail -c 9)"
      # DI_AB_BIN=<name> among the assignments: that binary of .gpu_bin instead (e.g. a
      # bench_cuda_model built from the previous commit, for a before/after in one call).
      bin=bench_cuda_model
      case " $envs " in *" DI_AB_BIN="*) bin=${envs##*DI_AB_BIN=} bin=${bin%% *} ;; esac
      # shellcheck disable=SC2086
      run_step "$name" 60 env $envs ".gpu_bin/$bin" --preset "$preset" $args --reps 10 \
        --tag "$tag"
      grep -E '^\[model\].*conc' "$OUT/$name.log" >>"$OUT/summary_extra.txt" ||
        echo "[model] $name: no output" >>"$OUT/summary_extra.txt"
    done
  done
fi
