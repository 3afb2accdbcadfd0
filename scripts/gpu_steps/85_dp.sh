# DP attention + EP in the serving engine (issue #8): `deepinfer serve --dp-size N` against the
# plain engine on concurrent greedy requests (scripts/gpu_check_dp.sh), on the demo MoE model.
# N = 1 always (the group path over NCCL's self exchange, fp32 for equality and bf16 reported);
# N = every GPU when the host has 2 or more.
if [ -x .gpu_bin/deepinfer ]; then
  dp_ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  dp_worlds=(1)
  [ "$dp_ngpu" -ge 2 ] && dp_worlds+=("$dp_ngpu")
  for w in "${dp_worlds[@]}"; do
    for be in cuda-fp32 cuda; do
      run_step "dp_w${w}_$be" 120 env OUT="$OUT/dp_w${w}_$be" \
        scripts/gpu_check_dp.sh "$w" .gpu_bin/deepinfer models/deepinfer-demo-code "$be"
      { echo "dp w=$w backend=$be rc=${rcs[${#rcs[@]}-1]}"; grep -E '^\[dp-check\] (summary|exit|identical|DIFF)' "$OUT/dp_w${w}_$be.log" | head -6; } >>"$OUT/summary_extra.txt"
    done
  done
fi
