#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
for b in bench_cuda_model_base bench_cuda_model; do timeout 60 $B/$b --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed "s/\$/ bin=$b/" | tee -a $OUT/summary.txt; done
echo "== test_cuda_moe" | tee -a $OUT/summary.txt
timeout 230 $B/test_cuda_moe > $OUT/test_cuda_moe.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|CudaBackendIntegrity" $OUT/test_cuda_moe.log | tail -6 | tee -a $OUT/summary.txt
echo "== test_backend_ops" | tee -a $OUT/summary.txt
timeout 230 $B/test_backend_ops > $OUT/test_backend_ops.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_backend_ops.log | tail -6 | tee -a $OUT/summary.txt
grep "gqa_decode_g8_bs1" $OUT/test_backend_ops.log | head -4 | tee -a $OUT/summary.txt
