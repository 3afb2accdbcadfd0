# MoE experts on CUDA (issue #6): op tests (decode and cuBLAS prefill paths vs the CPU op, graph
# replays bitwise equal to eager), then the opt-in tensor-core grouped prefill GEMM in its own
# process (a fault there hides nothing else), then the benchmark likewise.
# Sourced by scripts/gpu_check.sh. Worst case 137 s (20 + 60 + 17 + 20 + 10 + 5 + 5,
# + 28 only if moe_test fails); expected ~50 s. moeperf: v1 = the old decode kernels (DEEPINFER_MOE_DECODE=v1),
# serial = the old router (DEEPINFER_MOE_ROUTE=serial), both timed here next to the new defaults.
moe_test_summary() {  # step name
  local log="$OUT/$1.log"
  echo "[moe] $1 rc=${rcs[-1]} ok=$(grep -c '^\[       OK \]' "$log") failed=$(grep -c '^\[  FAILED  \].*(' "$log") skipped=$(grep -c '^\[  SKIPPED \].*(' "$log")"
  grep -h '^\[moe-op\] graph_' "$log"
  grep -h '^\[moe-op\].*FAIL$' "$log" | head -8
  grep -h -E 'what\(\)|terminate|illegal|error:' "$log" | head -3
}
if [ -x .gpu_bin/test_cuda_moe ]; then
  # moeperf: v2 decode kernels and the warp router are the defaults now; first their own checks
  # (v2 == v1 bitwise, warp router == serial bitwise and == CPU), in their own process.
  run_step moe_test_v2 20 .gpu_bin/test_cuda_moe --gtest_color=no '--gtest_filter=CudaMoeDecodeV2*:CudaMoeRoute*'
  moe_test_summary moe_test_v2 >>"$OUT/summary_extra.txt"
  grep -h -E '^\[moe-op\] (decode_v2_vs_v1|route_warp)' "$OUT/moe_test_v2.log" | head -12 >>"$OUT/summary_extra.txt"
  run_step moe_test 60 .gpu_bin/test_cuda_moe --gtest_color=no '--gtest_filter=-*Grouped*:CudaMoeDecodeV2*:CudaMoeRoute*'
  moe_test_summary moe_test >>"$OUT/summary_extra.txt"
  if [ "${rcs[-1]}" != 0 ]; then  # the old kernels alone: does the failure come from v2 / warp?
    run_step moe_test_v1 28 env DEEPINFER_MOE_DECODE=v1 DEEPINFER_MOE_ROUTE=serial \
      .gpu_bin/test_cuda_moe --gtest_color=no '--gtest_filter=-*Grouped*:CudaMoeDecodeV2*:CudaMoeRoute*'
    moe_test_summary moe_test_v1 >>"$OUT/summary_extra.txt"
  fi
  run_step moe_test_grouped 17 .gpu_bin/test_cuda_moe --gtest_color=no '--gtest_filter=*Grouped*'
  moe_test_summary moe_test_grouped >>"$OUT/summary_extra.txt"
fi
if [ -x .gpu_bin/bench_cuda_moe ]; then
  run_step moe_bench 20 .gpu_bin/bench_cuda_moe
  grep -h -E '^\[moe\]' "$OUT/moe_bench.log" >>"$OUT/summary_extra.txt"
  # Old decode kernels in the same run (lines tagged decode_impl=v1; the untagged ones are v2).
  run_step moe_bench_v1 10 env DEEPINFER_MOE_DECODE=v1 .gpu_bin/bench_cuda_moe --quick
  grep -h -E '^\[moe\].*path=decode ' "$OUT/moe_bench_v1.log" | sed 's/^\[moe\] /[moe] decode_impl=v1 /' >>"$OUT/summary_extra.txt"
  run_step moe_bench_router 5 .gpu_bin/bench_cuda_moe --router
  grep -h -E '^\[moe\]' "$OUT/moe_bench_router.log" >>"$OUT/summary_extra.txt"
  run_step moe_bench_grouped 5 .gpu_bin/bench_cuda_moe --grouped
  grep -h -E '^\[moe\]' "$OUT/moe_bench_grouped.log" >>"$OUT/summary_extra.txt"
fi
