#!/usr/bin/env bash
# Run 42 call 11: the late trigger as the default of the tensor-core GQA decode and MLA cluster
# decode kernels; attention tests, A/B against DEEPINFER_ATTN_LATE_TRIGGER=0 at batch 1 and 32.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 90 $B/test_backend_ops --gtest_filter='*qkv_rope_attention*:*attention_o_proj*:*paged_attention*:*TensorCore*:*SplitCombine*' > $OUT/ops.log 2>&1
echo "ops rc=$? $(grep -E '^\[  PASSED' $OUT/ops.log) $(grep -c 'FAILED  \]' $OUT/ops.log) failed" | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2; do
  run late qwen3-30b-a3b 1 X=0
  run early qwen3-30b-a3b 1 DEEPINFER_ATTN_LATE_TRIGGER=0
  run late deepseek-v2-lite 1 X=0
  run early deepseek-v2-lite 1 DEEPINFER_ATTN_LATE_TRIGGER=0
done
run late qwen3-30b-a3b 32 X=0
run early qwen3-30b-a3b 32 DEEPINFER_ATTN_LATE_TRIGGER=0
run late deepseek-v2-lite 32 X=0
run early deepseek-v2-lite 32 DEEPINFER_ATTN_LATE_TRIGGER=0
xz -9 $OUT/ops.log
