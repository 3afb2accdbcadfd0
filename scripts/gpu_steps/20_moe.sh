# MoE experts on CUDA (issue #6): the op tests (both paths vs the CPU op, graph replay bitwise
# equal to eager) and the MoE benchmark. Sourced by scripts/gpu_check.sh. Worst case 60 s (45 + 15).
if [ -x .gpu_bin/test_cuda_moe ]; then
  run_step moe_test 45 .gpu_bin/test_cuda_moe --gtest_color=no
  {
    echo "[moe] test_cuda_moe rc=${rcs[-1]} ok=$(grep -c '^\[       OK \]' "$OUT/moe_test.log") failed=$(grep -c '^\[  FAILED  \].*(' "$OUT/moe_test.log") skipped=$(grep -c '^\[  SKIPPED \].*(' "$OUT/moe_test.log")"
    grep -h '^\[moe-op\] graph_' "$OUT/moe_test.log"
    grep -h '^\[moe-op\].*FAIL$' "$OUT/moe_test.log" | head -10
    grep -h -E 'what\(\)|terminate|illegal|error:' "$OUT/moe_test.log" | head -3
  } >>"$OUT/summary_extra.txt"
fi
if [ -x .gpu_bin/bench_cuda_moe ]; then
  run_step moe_bench 15 .gpu_bin/bench_cuda_moe
  grep -h '^\[moe\]' "$OUT/moe_bench.log" >>"$OUT/summary_extra.txt"
fi
