#!/usr/bin/env bash
# Run 44 call 3: the cluster GQA decode kernel with the rope/store prologue inside at batch 1
# (DEEPINFER_GQA_CLUSTER_ROPE=1): bit-equality with rope/store + the cluster kernel, the CPU
# oracle; A/B against the split kernel + combine and the cluster kernel alone; timelines.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 240 $B/test_backend_ops --gtest_filter='*paged_attention*:*GqaDecodeCluster*:*qkv_rope_attention*:*QkvRope*' > $OUT/ops.log 2>&1
echo "ops rc=$? $(grep -E '^\[  PASSED' $OUT/ops.log) $(grep -c 'FAILED  \]' $OUT/ops.log) failed" | tee -a $S
grep -E "FAIL|gqa cluster decode:|gqa cluster fused prologue:" $OUT/ops.log | head -30 | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2 3; do
  run split qwen3-30b-a3b 1 X=0
  run cluster2 qwen3-30b-a3b 1 DEEPINFER_GQA_CLUSTER=2
  run cluster2_rope qwen3-30b-a3b 1 DEEPINFER_GQA_CLUSTER=2 DEEPINFER_GQA_CLUSTER_ROPE=1
  run cluster1_rope qwen3-30b-a3b 1 DEEPINFER_GQA_CLUSTER=1 DEEPINFER_GQA_CLUSTER_ROPE=1
done
for v in split rope; do
  e="X=0"; [ $v = rope ] && e="DEEPINFER_GQA_CLUSTER=2 DEEPINFER_GQA_CLUSTER_ROPE=1"
  env $e timeout 60 $B/bench_cuda_model_trace --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 10 --trace $OUT/trace_$v.csv > $OUT/trace_$v.log 2>&1
  python3 scripts/trace_layers.py $OUT/trace_$v.csv > $OUT/trace_layers_$v.txt 2>&1
  head -16 $OUT/trace_layers_$v.txt | tee -a $S
  xz -9 $OUT/trace_$v.csv
done
xz -9 $OUT/ops.log
