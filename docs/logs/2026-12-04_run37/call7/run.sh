#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"
timeout 300 .gpu_bin/bench_cuda_gemv --shapes moe --reps 20 2>&1 | tee $OUT/gemv_moe.txt
