# MoE experts on CUDA (issue #6): op tests (decode and cuBLAS prefill paths vs the CPU op, graph
# replays bitwise equal to eager), then the opt-in tensor-core grouped prefill GEMM in its own
# process (a fault there hides nothing else), then the benchmark likewise.
# Sourced by scripts/gpu_check.sh. Worst case 60 s (28 + 17 + 10 + 5); expected ~25 s.
moe_test_summary() {  # step name
  local log="$OUT/$1.log"
  echo "[moe] $1 rc=${rcs[-1]} ok=$(grep -c '^\[       OK \]' "$log") failed=$(grep -c '^\[  FAILED  \].*(' "$log") skipped=$(grep -c '^\[  SKIPPED \].*(' "$log")"
  grep -h '^\[moe-op\] graph_' "$log"
  grep -h '^\[moe-op\].*FAIL$' "$log" | head -8
  grep -h -E 'what\(\)|terminate|illegal|error:' "$log" | head -3
}
if [ -x .gpu_bin/test_cuda_moe ]; then
  run_step moe_test 28 .gpu_bin/test_cuda_moe --gtest_color=no '--gtest_filter=-*Grouped*'
  moe_test_summary moe_test >>"$OUT/summary_extra.txt"
  run_step moe_test_grouped 17 .gpu_bin/test_cuda_moe --gtest_color=no '--gtest_filter=*Grouped*'
  moe_test_summary moe_test_grouped >>"$OUT/summary_extra.txt"
fi
if [ -x .gpu_bin/bench_cuda_moe ]; then
  run_step moe_bench 10 .gpu_bin/bench_cuda_moe
  grep -h -E '^\[moe\]' "$OUT/moe_bench.log" >>"$OUT/summary_extra.txt"
  run_step moe_bench_grouped 5 .gpu_bin/bench_cuda_moe --grouped
  grep -h -E '^\[moe\]' "$OUT/moe_bench_grouped.log" >>"$OUT/summary_extra.txt"
fi
