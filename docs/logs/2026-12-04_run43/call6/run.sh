#!/usr/bin/env bash
# Run 43 call 6: where the attention's last kernels trigger o_proj: the split combine (Qwen3;
# DEEPINFER_COMBINE_TRIGGER 1 after its wait, 2 once its partials landed, 3 at exit), the GQA
# kernel at its first scores (DEEPINFER_ATTN_LATE_TRIGGER=2), MLA's split merge (V2-Lite;
# DEEPINFER_MLA_MERGE_TRIGGER 1 after its wait, 2 parts merged, 3 after W_UV). Default 0 = start.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 150 $B/test_backend_ops --gtest_filter='*SplitCombine*:*paged_attention*:*TensorCore*:*mla*:*Mla*' > $OUT/ops.log 2>&1
echo "ops rc=$? $(grep -E '^\[  PASSED' $OUT/ops.log) $(grep -c 'FAILED  \]' $OUT/ops.log) failed" | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2; do
  run base qwen3-30b-a3b 1 X=0
  for k in 1 2 3; do run comb$k qwen3-30b-a3b 1 DEEPINFER_COMBINE_TRIGGER=$k; done
  run gqa2 qwen3-30b-a3b 1 DEEPINFER_ATTN_LATE_TRIGGER=2
  run base deepseek-v2-lite 1 X=0
  for k in 1 2 3; do run merge$k deepseek-v2-lite 1 DEEPINFER_MLA_MERGE_TRIGGER=$k; done
done
xz -9 $OUT/ops.log
