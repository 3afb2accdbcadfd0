#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"
timeout 60 .gpu_bin/bench_cuda_green --small-sms 16 --n 200 2>&1 | tee $OUT/green.txt
timeout 60 .gpu_bin/bench_cuda_green --small-sms 32 --n 200 2>&1 | grep -v "one-stream\|two-streams" | tee -a $OUT/green.txt
