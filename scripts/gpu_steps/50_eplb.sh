# EPLB in the engine (issue #8): the EPLB ops (moe_count_experts, moe_map_replicas, copy_rows) vs
# the CPU oracle, and EplbRuntime on the MoE goldens (EPLB on vs off, several rebalances mid-run).
# Look for "[eplb-op] ... count=PASS map=PASS copy_rows=PASS" and
# "[eplb-golden] model=... rebalances>=2 counted==expected greedy_same=N/N".
if [ -x .gpu_bin/test_cuda_eplb ]; then
  run_step eplb 60 .gpu_bin/test_cuda_eplb --gtest_color=no
  {
    echo "eplb: rc=${rcs[-1]} $(grep -c 'count=PASS map=PASS copy_rows=PASS' "$OUT/eplb.log") op shapes pass" \
         "of $(grep -c '^\[eplb-op\]' "$OUT/eplb.log")"
    grep '^\[eplb-golden\]' "$OUT/eplb.log"
  } >>"$OUT/summary_extra.txt"
else
  echo "eplb: .gpu_bin/test_cuda_eplb missing" >>"$OUT/summary_extra.txt"
fi
