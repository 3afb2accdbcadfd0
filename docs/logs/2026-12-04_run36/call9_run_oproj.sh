#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
run() { env $2 timeout 60 $B/$1 --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed "s/\$/ bin=$1 env=$2/" | tee -a $OUT/summary.txt; }
for i in 1 2; do
  run bench_cuda_model X=1
  run bench_cuda_model "DEEPINFER_ATTN_O_PROJ=1 DEEPINFER_ATTN_O_PROJ_HEADS=2"
  run bench_cuda_model_unrolled "DEEPINFER_ATTN_O_PROJ=1 DEEPINFER_ATTN_O_PROJ_HEADS=2"
done
DEEPINFER_ATTN_O_PROJ_HEADS=2 timeout 100 $B/test_backend_ops_unrolled --gtest_filter='*attention_o_proj*:FusedAttentionOProj.*' > $OUT/ops.log 2>&1; echo "ops rc=$?" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/ops.log | tail -4 | tee -a $OUT/summary.txt
