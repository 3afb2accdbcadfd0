#!/usr/bin/env bash
# Run 42 call 5: the rope epilogue as a per-CTA arrival with the metadata in L1 before the wait.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 300 $B/test_backend_ops --gtest_filter='*QkvProjection*:*qkv_projection*:*FusedQkvRope*:*QkvRopeStoreWarp*:*qkv_rope*' > $OUT/test_backend_ops.log 2>&1; echo "test_backend_ops rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|QKV GEMV rope" $OUT/test_backend_ops.log | tail -12 | tee -a $S
grep -q "^\[  PASSED  \]" $OUT/test_backend_ops.log && ! grep -q "FAILED  \]" $OUT/test_backend_ops.log || { echo "tests failed: no bench" | tee -a $S; exit 1; }
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 120 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2; do
  run two_kernels qwen3-30b-a3b 1 DEEPINFER_QKV_ROPE_GEMV=0
  run rope qwen3-30b-a3b 1 DEEPINFER_QKV_ROPE_GEMV=1
  run rope_early3 qwen3-30b-a3b 1 DEEPINFER_QKV_ROPE_GEMV=1 DEEPINFER_GEMV_EARLY=3
done
for m in 0 1; do
  DEEPINFER_QKV_ROPE_GEMV=$m timeout 120 $B/bench_cuda_model_trace --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 10 --trace $OUT/trace_rope$m.csv > $OUT/trace_rope$m.log 2>&1
  python3 scripts/trace_layers.py $OUT/trace_rope$m.csv > $OUT/trace_layers_rope$m.txt 2>&1
  echo "== trace rope=$m" | tee -a $S; head -28 $OUT/trace_layers_rope$m.txt | tee -a $S
  xz -9 $OUT/trace_rope$m.csv
done
