#!/usr/bin/env bash
# Run 44 call 2: the cluster GQA decode kernel's merge per thread (4 elements of one head, the
# head's warp weights computed by the thread: one __syncthreads instead of two), the pushes as
# DSMEM stores + a cluster barrier (DEEPINFER_GQA_CLUSTER=1) or st.async completing on the
# owner's mbarrier (=2); A/B against the split kernel + combine; timelines (mark = the CTA's
# attention done, before the merge).
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 200 $B/test_backend_ops --gtest_filter='*paged_attention*:*GqaDecodeCluster*' > $OUT/ops.log 2>&1
echo "ops rc=$? $(grep -E '^\[  PASSED' $OUT/ops.log) $(grep -c 'FAILED  \]' $OUT/ops.log) failed" | tee -a $S
grep -E "FAIL|gqa cluster decode:" $OUT/ops.log | head -30 | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2 3; do
  run split qwen3-30b-a3b 1 X=0
  run cluster1 qwen3-30b-a3b 1 DEEPINFER_GQA_CLUSTER=1
  run cluster2 qwen3-30b-a3b 1 DEEPINFER_GQA_CLUSTER=2
done
for v in 1 2; do
  env DEEPINFER_GQA_CLUSTER=$v timeout 60 $B/bench_cuda_model_trace --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 10 --trace $OUT/trace_c$v.csv > $OUT/trace_c$v.log 2>&1
  python3 scripts/trace_layers.py $OUT/trace_c$v.csv > $OUT/trace_layers_c$v.txt 2>&1
  head -16 $OUT/trace_layers_c$v.txt | tee -a $S
  xz -9 $OUT/trace_c$v.csv
done
xz -9 $OUT/ops.log
