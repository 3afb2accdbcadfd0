#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
echo "== isolate call 3's default loss: A = HEAD + the GEMV x_first code (off), B = HEAD + the down act_first branch (off)" | tee -a $OUT/summary.txt
run() { local b=$1 m=$2; shift 2; env "$@" timeout 60 $B/$b --preset $m --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed "s/\$/ bin=$b $*/" | tee -a $OUT/summary.txt; }
for i in 1 2 3; do
  run bench_cuda_model_base qwen3-30b-a3b X=0
  run bench_cuda_model_A qwen3-30b-a3b X=0
  run bench_cuda_model_B qwen3-30b-a3b X=0
  run bench_cuda_model_A qwen3-30b-a3b DEEPINFER_GEMV_X_FIRST=2
  run bench_cuda_model_B qwen3-30b-a3b DEEPINFER_MOE_T1_ACT_FIRST=1
done
