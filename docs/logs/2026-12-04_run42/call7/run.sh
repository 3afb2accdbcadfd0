#!/usr/bin/env bash
# Run 42 call 7: prefetch before the wait, less of it (bench_cuda_xread's lesson): the GEMV's
# first items by SM parity (DEEPINFER_GEMV_EARLY[_N]) and the GQA kernel's old K/V sub-tile
# (DEEPINFER_GQA_KV_EARLY). Bitwise checks under the switches first.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
for e in "DEEPINFER_GQA_KV_EARLY=1" "DEEPINFER_GQA_KV_EARLY=2" "DEEPINFER_GEMV_EARLY=1" "DEEPINFER_GEMV_EARLY=3"; do
  env $e timeout 200 $B/test_backend_ops --gtest_filter='*fused_linear*:*qkv_rope_attention*:*attention_o_proj*:*paged_attention*:*TensorCore*' > $OUT/ops.log 2>&1
  echo "ops $e rc=$? $(grep -E '^\[  PASSED' $OUT/ops.log) $(grep -c 'FAILED  \]' $OUT/ops.log) failed" | tee -a $S
done
run() { local tag=$1 preset=$2; shift 2
  r=$(env "$@" timeout 120 $B/bench_cuda_model --preset $preset --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset $r" | tee -a $S; }
for round in 1 2; do
  run base qwen3-30b-a3b X=0
  run qkv_e3 qwen3-30b-a3b DEEPINFER_GEMV_EARLY=3 DEEPINFER_GEMV_EARLY_N=5120
  run o_e1 qwen3-30b-a3b DEEPINFER_GEMV_EARLY=1 DEEPINFER_GEMV_EARLY_N=2048
  run o_e2 qwen3-30b-a3b DEEPINFER_GEMV_EARLY=2 DEEPINFER_GEMV_EARLY_N=2048
  run kv1 qwen3-30b-a3b DEEPINFER_GQA_KV_EARLY=1
  run kv2 qwen3-30b-a3b DEEPINFER_GQA_KV_EARLY=2
  run kv1_qkv_e3 qwen3-30b-a3b DEEPINFER_GQA_KV_EARLY=1 DEEPINFER_GEMV_EARLY=3 DEEPINFER_GEMV_EARLY_N=5120
  run kv2_qkv_e3 qwen3-30b-a3b DEEPINFER_GQA_KV_EARLY=2 DEEPINFER_GEMV_EARLY=3 DEEPINFER_GEMV_EARLY_N=5120
  run base deepseek-v2-lite X=0
  run o_e2 deepseek-v2-lite DEEPINFER_GEMV_EARLY=2 DEEPINFER_GEMV_EARLY_N=2048
  run o_e1 deepseek-v2-lite DEEPINFER_GEMV_EARLY=1 DEEPINFER_GEMV_EARLY_N=2048
  run base llama3-8b X=0
  run kv1 llama3-8b DEEPINFER_GQA_KV_EARLY=1
  run kv2 llama3-8b DEEPINFER_GQA_KV_EARLY=2
done
