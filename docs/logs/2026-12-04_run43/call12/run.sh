#!/usr/bin/env bash
# Run 43 call 12: the review's two mends (0fb463a: one column-cap constant for the slot down
# kernel; d6a2c78: the merge's pushed-sums buffer only at one token): the tests that cover them.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 100 $B/test_cuda_moe --gtest_filter='*DecodeT1*' > $OUT/moe.log 2>&1
echo "test_cuda_moe DecodeT1 rc=$? $(grep -E '^\[  PASSED' $OUT/moe.log) $(grep -c 'FAILED  \]' $OUT/moe.log) failed" | tee -a $S
timeout 120 $B/test_cuda_mla > $OUT/mla.log 2>&1
echo "test_cuda_mla rc=$? $(grep -E '^\[  PASSED' $OUT/mla.log) $(grep -c 'FAILED  \]' $OUT/mla.log) failed" | tee -a $S
