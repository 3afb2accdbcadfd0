#!/usr/bin/env bash
# Run 44 call 5: the cluster GQA kernel (mode 2) with its PDL trigger at its start instead of
# after its wait (o_proj now follows it directly), and on Llama-3.1-8B (group 4) at batch 1; the
# cluster test on the final tree (helpers moved to common.cuh).
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 200 $B/test_backend_ops --gtest_filter='*GqaDecodeCluster*:*GqaDecodeMma*:*paged_attention_gqa*' > $OUT/ops.log 2>&1
echo "ops rc=$? $(grep -E '^\[  PASSED' $OUT/ops.log) $(grep -c 'FAILED  \]' $OUT/ops.log) failed" | tee -a $S
grep -E "FAILED  \]|gqa cluster decode:" $OUT/ops.log | head -10 | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2 3; do
  run default qwen3-30b-a3b 1 X=0
  run cluster2 qwen3-30b-a3b 1 DEEPINFER_GQA_CLUSTER=2
  run cluster2_early qwen3-30b-a3b 1 DEEPINFER_GQA_CLUSTER=2 DEEPINFER_ATTN_LATE_TRIGGER=0
done
for round in 1 2; do
  run default llama3-8b 1 X=0
  run cluster2 llama3-8b 1 DEEPINFER_GQA_CLUSTER=2
done
xz -9 $OUT/ops.log
