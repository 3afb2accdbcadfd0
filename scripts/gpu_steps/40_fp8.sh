# Block-scaled FP8 linear (issue #6): op test vs the CPU reference + FP8 DeepSeek-V3-small model on
# both backends (test_cuda_fp8), then the FP8-vs-bf16 GEMM bench (bench_cuda_fp8). ~30 s expected.
# Sourced by scripts/gpu_check.sh (run_step, $OUT).
if [ -x .gpu_bin/test_cuda_fp8 ]; then
  # Op and model tests in separate processes: a sticky CUDA fault in one must not hide the other.
  run_step fp8_ops 60 .gpu_bin/test_cuda_fp8 --gtest_color=no --gtest_filter='CudaFp8Linear.*'
  run_step fp8_model 60 .gpu_bin/test_cuda_fp8 --gtest_color=no --gtest_filter='CudaFp8Model.*'
  {
    echo "fp8 ops: $(grep -c '^\[       OK \]' "$OUT/fp8_ops.log") ok, $(grep -c '^\[  FAILED  \]' "$OUT/fp8_ops.log") failed lines;" \
      "max norm_err $(sed -n 's/.*norm_err=\([0-9.e+-]*\).*/\1/p' "$OUT/fp8_ops.log" | sort -g | tail -1)" \
      "(bound 0.05), max err/bound $(sed -n 's/.*worst_err_over_bound=\([0-9.e+-]*\).*/\1/p' "$OUT/fp8_ops.log" | sort -g | tail -1) (bound 1)"
    grep '^\[fp8\] model' "$OUT/fp8_model.log" || echo "fp8 model: no result line (see fp8_model.log)"
  } >>"$OUT/summary_extra.txt"
fi
if [ -x .gpu_bin/bench_cuda_fp8 ]; then
  run_step fp8_bench 90 .gpu_bin/bench_cuda_fp8
  grep '^\[fp8\]' "$OUT/fp8_bench.log" | grep -E 'square|m=1 |m=4096|FAILED' >>"$OUT/summary_extra.txt" || true
fi
