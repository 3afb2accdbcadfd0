# GPU step (sourced by scripts/gpu_check.sh): where a batch-1 decode step goes inside the graph.
# dup_<preset>_<n>: bench_cuda_model --dup PATTERN issues every op whose profiling key contains
# PATTERN twice (ProfilingBackend::set_duplicate); the step's growth over the plain run divided
# by dup_per_step is that op's cost in the graph (launch gaps and PDL overlap included). A lower
# bound where the op's bytes fit in L2 (the duplicate re-reads them from L2: attention's KV,
# o_proj, the router's gate). Runs only when DI_DUP_PRESETS names presets (the two MoE models
# have their op patterns below; others get the MoE block and attention); DI_DUP_CTX (2048).
if [ -x .gpu_bin/bench_cuda_model ] && [ -n "${DI_DUP_PRESETS:-}" ]; then
  for preset in $DI_DUP_PRESETS; do
    case $preset in
      qwen3-30b-a3b) pats=("" moe_residual moe_norm_route qkv_rope_attention "[5120x2048]"
                         "[2048x4096]" "[151936x2048]") ;;
      deepseek-v2-lite) pats=("" moe_residual moe_norm_route paged_attention mla_rope_store
                            head_linear "[3648x2048]" "]·[2048x2048]" "[102400x2048]") ;;
      *) pats=("" moe_residual paged_attention) ;;
    esac
    n=0
    for pat in "${pats[@]}"; do
      name="dup_${preset}_$n"
      n=$((n + 1))
      if [ -z "$pat" ]; then
        run_step "$name" 60 .gpu_bin/bench_cuda_model --preset "$preset" --conc 1 \
          --ctx "${DI_DUP_CTX:-2048}" --reps 20 --tag dup-none
      else
        run_step "$name" 60 .gpu_bin/bench_cuda_model --preset "$preset" --conc 1 \
          --ctx "${DI_DUP_CTX:-2048}" --reps 20 --tag dup --dup "$pat"
      fi
      grep -E '^\[model\].*conc' "$OUT/$name.log" >>"$OUT/summary_extra.txt" ||
        echo "[model] $name: no output" >>"$OUT/summary_extra.txt"
    done
  done
fi
