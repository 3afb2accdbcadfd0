#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
run() { local m=$1; shift; env "$@" timeout 60 $B/bench_cuda_model --preset $m --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed "s/\$/ $*/" | tee -a $OUT/summary.txt; }
for i in 1 2 3 4; do run deepseek-v2-lite X=0; run deepseek-v2-lite DEEPINFER_MOE_T1_GU=4x4; done
for c in 32; do for v in X=0 DEEPINFER_MOE_T1_GU=4x4; do env $v timeout 60 $B/bench_cuda_model --preset deepseek-v2-lite --conc $c --ctx 2048 --reps 5 2>&1 | grep "^\[model\] preset" | sed "s/\$/ $v/" | tee -a $OUT/summary.txt; done; done
