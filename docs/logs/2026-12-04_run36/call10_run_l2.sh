#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"
timeout 120 .gpu_bin/bench_cuda_l2lat --hops 400 2>&1 | tee $OUT/l2lat.txt
