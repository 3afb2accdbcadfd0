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
    # EPLB in the group (tiny periods: several rebalances mid-request) vs the plain engine without.
    run_step "dp_eplb_w${w}" 120 env OUT="$OUT/dp_eplb_w${w}" \
      DI_DP_GROUP_ARGS="--eplb --eplb-window-prefill 2 --eplb-period-prefill 2 --eplb-window-decode 4 --eplb-period-decode 3 --eplb-bucket-decode 2 --eplb-min-gain-prefill 0 --eplb-min-gain-decode 0" \
      scripts/gpu_check_dp.sh "$w" .gpu_bin/deepinfer models/deepinfer-demo-code cuda-fp32
    { echo "dp+eplb w=$w backend=cuda-fp32 rc=${rcs[${#rcs[@]}-1]}"; grep -E '^\[dp-check\] (summary|exit|identical|DIFF|group log: EPLB rebalance)' "$OUT/dp_eplb_w${w}.log" | head -8; } >>"$OUT/summary_extra.txt"
  done
fi
