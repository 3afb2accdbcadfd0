#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
run() { local m=$1 c=$2; shift 2; env "$@" timeout 60 $B/bench_cuda_model --preset $m --conc $c --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed "s/\$/ $*/" | tee -a $OUT/summary.txt; }
for i in 1 2 3; do
  run qwen3-30b-a3b 1 DEEPINFER_GEMV_RING=-1; run qwen3-30b-a3b 1 DEEPINFER_GEMV_RING=2 DEEPINFER_GEMV_RING_IN=2; run qwen3-30b-a3b 1 DEEPINFER_GEMV_RING=2 DEEPINFER_GEMV_RING_IN=1
done
for i in 1 2; do
  run deepseek-v2-lite 1 DEEPINFER_GEMV_RING=-1; run deepseek-v2-lite 1 DEEPINFER_GEMV_RING=2 DEEPINFER_GEMV_RING_IN=2
done
