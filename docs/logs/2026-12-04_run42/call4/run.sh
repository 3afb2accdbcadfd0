#!/usr/bin/env bash
# Run 42 call 4: the QKV GEMV with the rope/store epilogue (DEEPINFER_QKV_ROPE_GEMV) - tests, A/B.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 300 $B/test_backend_ops > $OUT/test_backend_ops.log 2>&1; echo "test_backend_ops rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|QKV GEMV rope" $OUT/test_backend_ops.log | tail -12 | tee -a $S
grep -q "^\[  PASSED  \]" $OUT/test_backend_ops.log && ! grep -q "FAILED  \]" $OUT/test_backend_ops.log || { echo "tests failed: no bench" | tee -a $S; exit 1; }
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 120 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2 3; do
  run two_kernels qwen3-30b-a3b 1 DEEPINFER_QKV_ROPE_GEMV=0
  run rope qwen3-30b-a3b 1 DEEPINFER_QKV_ROPE_GEMV=1
  run rope_early3 qwen3-30b-a3b 1 DEEPINFER_QKV_ROPE_GEMV=1 DEEPINFER_GEMV_EARLY=3
done
