#!/usr/bin/env bash
# Run 42 call 3: DEEPINFER_GEMV_EARLY per projection (DEEPINFER_GEMV_EARLY_N = its rows).
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
run() { local tag=$1 preset=$2; shift 2
  r=$(env "$@" timeout 120 $B/bench_cuda_model --preset $preset --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset $r" | tee -a $S; }
for round in 1 2; do
  run e0 qwen3-30b-a3b X=0
  run e3_all qwen3-30b-a3b DEEPINFER_GEMV_EARLY=3
  run e3_qkv qwen3-30b-a3b DEEPINFER_GEMV_EARLY=3 DEEPINFER_GEMV_EARLY_N=5120
  run e3_o qwen3-30b-a3b DEEPINFER_GEMV_EARLY=3 DEEPINFER_GEMV_EARLY_N=2048
  run e1_qkv qwen3-30b-a3b DEEPINFER_GEMV_EARLY=1 DEEPINFER_GEMV_EARLY_N=5120
  run e1_o qwen3-30b-a3b DEEPINFER_GEMV_EARLY=1 DEEPINFER_GEMV_EARLY_N=2048
  run e0 deepseek-v2-lite X=0
  run e3_qkva deepseek-v2-lite DEEPINFER_GEMV_EARLY=3 DEEPINFER_GEMV_EARLY_N=3648
  run e3_o deepseek-v2-lite DEEPINFER_GEMV_EARLY=3 DEEPINFER_GEMV_EARLY_N=2048
  run e1_qkva deepseek-v2-lite DEEPINFER_GEMV_EARLY=1 DEEPINFER_GEMV_EARLY_N=3648
  run e1_o deepseek-v2-lite DEEPINFER_GEMV_EARLY=1 DEEPINFER_GEMV_EARLY_N=2048
  run e2_qkva deepseek-v2-lite DEEPINFER_GEMV_EARLY=2 DEEPINFER_GEMV_EARLY_N=3648
done
