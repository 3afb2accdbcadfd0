# GPU step (sourced by scripts/gpu_check.sh): same-call A/Bs of the batch-1 decode path
# (bench_cuda_model, CUDA graphs, random bf16 weights), each a [model] line tagged probe-<name> in
# summary_extra.txt:
#   llama_base / llama_ctx16   Llama-3.1-8B c=1,8 at a 512-token context, and c=1 at 16 tokens
#                              (what the attention costs: run 12, 4.69 vs 4.46 ms)
#   llama_split32              the GQA decode split at 32 tokens (DEEPINFER_ATTN_SPLIT=32; default 64)
#   v2lite_tile                V2-Lite c=1,32,256 on the MLA tile kernel (DEEPINFER_MLA_KERNEL=tile;
#                              the cluster kernel, the default, is model_v2lite in 25_model.sh)
# Then the op suite with the opt-in GQA chunk softmax as default (so that path stays tested) and
# test_cuda_pinned_pool.
if [ -x .gpu_bin/bench_cuda_model ]; then
  probe() {  # name preset "args" env...
    local name=$1 preset=$2 args=$3
    shift 3
    # shellcheck disable=SC2086
    run_step "probe_$name" 40 env DI_PROBE=1 "$@" .gpu_bin/bench_cuda_model --preset "$preset" \
      --reps 10 --tag "probe-$name" $args
    grep -E '^\[model\]' "$OUT/probe_$name.log" >>"$OUT/summary_extra.txt" 2>/dev/null ||
      echo "[model] probe_$name: no output" >>"$OUT/summary_extra.txt"
  }
  probe llama_base llama3-8b "--conc 1,8 --ctx 512"
  probe llama_ctx16 llama3-8b "--conc 1 --ctx 16"
  probe llama_split32 llama3-8b "--conc 1 --ctx 512" DEEPINFER_ATTN_SPLIT=32
  probe v2lite_tile deepseek-v2-lite "--conc 1,32,256 --ctx 2048" DEEPINFER_MLA_KERNEL=tile
fi
if [ -x .gpu_bin/test_cuda_pinned_pool ]; then
  run_step pinned_pool 30 .gpu_bin/test_cuda_pinned_pool --gtest_color=no
  echo "[pinned_pool] rc=${rcs[${#rcs[@]}-1]} passed=$(grep -c '^\[       OK \]' "$OUT/pinned_pool.log")" >>"$OUT/summary_extra.txt"
fi
