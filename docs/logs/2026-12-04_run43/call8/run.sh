#!/usr/bin/env bash
# Run 43 call 8: MLA's split merge at one token with the rank sums pushed to rank 0 before its
# one cluster barrier (default in this binary) against the pull after it and a second barrier
# (DEEPINFER_MLA_MERGE_PUSH=0); MLA tests.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 240 $B/test_cuda_mla > $OUT/mla.log 2>&1
echo "test_cuda_mla rc=$? $(grep -E '^\[  PASSED' $OUT/mla.log) $(grep -c 'FAILED  \]' $OUT/mla.log) failed" | tee -a $S
grep -E "merge kernels differing" $OUT/mla.log | head -12 | tee -a $S
timeout 120 $B/test_backend_ops --gtest_filter='*mla*:*Mla*' > $OUT/ops.log 2>&1
echo "ops rc=$? $(grep -E '^\[  PASSED' $OUT/ops.log) $(grep -c 'FAILED  \]' $OUT/ops.log) failed" | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2 3; do
  run push deepseek-v2-lite 1 X=0
  run pull deepseek-v2-lite 1 DEEPINFER_MLA_MERGE_PUSH=0
done
xz -9 $OUT/ops.log $OUT/mla.log
