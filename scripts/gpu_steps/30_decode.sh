# Issue #5, decode helper: fp32 verification mode ("cuda-fp32"), the fused qkv_rope_store op, and
# batch invariance of decode. The fp32 op table and fp32 goldens run inside the core steps (ops,
# golden: same binaries); this step re-runs only the batch-invariance tests (a few seconds) and
# summarizes. Timeout 60 s.
run_step decode_batch_inv 60 .gpu_bin/test_cuda_golden --gtest_color=no --gtest_filter='BatchInvariance.*'
{
  c() { grep -h -c -E "$1" "$2" 2>/dev/null || true; }
  echo "decode: fp32 goldens (tol 1e-4, greedy == fixture): $(c '^\[golden-fp32\].*PASS$' "$OUT/golden.log") pass, $(c '^\[golden-fp32\].*FAIL$' "$OUT/golden.log") fail"
  echo "decode: fp32 op table (nmse <= 1e-9): $(c '^\[op-fp32\].*PASS$' "$OUT/ops.log") pass, $(c '^\[op-fp32\].*FAIL$' "$OUT/ops.log") fail"
  echo "decode: qkv_rope_store op (bf16 + fp32): $(c '^\[op(-fp32)?\] qkv_rope_store.*PASS$' "$OUT/ops.log") pass, $(c '^\[op(-fp32)?\] qkv_rope_store.*FAIL$' "$OUT/ops.log") fail"
  grep -h '^\[golden-fp32\].*FAIL$' "$OUT/golden.log" 2>/dev/null | head -5
  grep -h '^\[batch-inv\]' "$OUT/decode_batch_inv.log" 2>/dev/null
  grep -h -A4 'Failure' "$OUT/decode_batch_inv.log" 2>/dev/null | head -8
} >>"$OUT/summary_extra.txt"
