#!/usr/bin/env bash
# Run 42 call 1: bench_cuda_xread incl. the odd-SM mode (never run before).
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz; ROOT=$(pwd)
source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/gpu.txt
.gpu_bin/bench_cuda_xread --reps 20 2>&1 | tee $OUT/xread.log | grep '^\[xread\]'
