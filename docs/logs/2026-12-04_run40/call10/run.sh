#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
echo "== test_cuda_moe" | tee -a $S
timeout 200 $B/test_cuda_moe > $OUT/test_cuda_moe.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|CudaBackendIntegrity" $OUT/test_cuda_moe.log | tail -8 | tee -a $S
echo "== test_backend_ops FusedAttention*" | tee -a $S
timeout 120 $B/test_backend_ops --gtest_filter='FusedQkvRopeAttention.*:FusedAttention*' > $OUT/test_backend_ops_fused.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_backend_ops_fused.log | tail -4 | tee -a $S
