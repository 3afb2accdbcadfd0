#!/usr/bin/env bash
# Run 43 call 5: routing in the one-token expert kernels (moe_norm_route defer_routing; default
# on in this binary) against the router's routing (DEEPINFER_MOE_DEFER_ROUTE=0); tests.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 200 $B/test_cuda_moe > $OUT/moe.log 2>&1
echo "test_cuda_moe rc=$? $(grep -E '^\[  PASSED' $OUT/moe.log) $(grep -c 'FAILED  \]' $OUT/moe.log) failed" | tee -a $S
grep -E "deferred_route|FAIL" $OUT/moe.log | head -20 | tee -a $S
timeout 200 $B/test_cuda_golden > $OUT/golden.log 2>&1
echo "test_cuda_golden rc=$? $(grep -E '^\[  PASSED' $OUT/golden.log) $(grep -E '^\[  FAILED  \]' $OUT/golden.log | tr '\n' ' ')" | tee -a $S
timeout 150 $B/test_backend_ops --gtest_filter='*moe*:*Moe*' > $OUT/ops.log 2>&1
echo "ops rc=$? $(grep -E '^\[  PASSED' $OUT/ops.log) $(grep -c 'FAILED  \]' $OUT/ops.log) failed" | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2 3; do
  for m in qwen3-30b-a3b deepseek-v2-lite; do
    run defer $m 1 X=0
    run router $m 1 DEEPINFER_MOE_DEFER_ROUTE=0
  done
done
run defer qwen3-30b-a3b 32 X=0
run router qwen3-30b-a3b 32 DEEPINFER_MOE_DEFER_ROUTE=0
xz -9 $OUT/ops.log $OUT/moe.log $OUT/golden.log
