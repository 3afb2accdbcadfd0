#!/usr/bin/env bash
# Run 44 call 1: the GQA decode kernel with its splits merged in a 16-CTA cluster
# (DEEPINFER_GQA_CLUSTER=1, opt-in) against the split kernel + combine; the refactor of the
# split kernel's sub-tile code (same bits expected: GqaDecodeMma / SplitCombine switch tests and
# the table's attention cases); timeline of both (trace build).
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 200 $B/test_backend_ops --gtest_filter='*paged_attention*:*Gqa*:*SplitCombine*:*QkvRope*:*qkv_rope*' > $OUT/ops.log 2>&1
echo "ops rc=$? $(grep -E '^\[  PASSED' $OUT/ops.log) $(grep -c 'FAILED  \]' $OUT/ops.log) failed" | tee -a $S
grep -E "FAIL|gqa cluster decode:|one-barrier merge:|warp merge:" $OUT/ops.log | head -30 | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2 3; do
  run split qwen3-30b-a3b 1 X=0
  run cluster qwen3-30b-a3b 1 DEEPINFER_GQA_CLUSTER=1
done
for round in 1 2; do
  run split qwen3-30b-a3b 4 X=0
  run cluster qwen3-30b-a3b 4 DEEPINFER_GQA_CLUSTER=1
done
if [ -x $B/bench_cuda_model_trace ]; then
  for v in split cluster; do
    e=X=0; [ $v = cluster ] && e=DEEPINFER_GQA_CLUSTER=1
    env $e timeout 60 $B/bench_cuda_model_trace --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 10 --trace $OUT/trace_$v.csv > $OUT/trace_$v.log 2>&1
    python3 scripts/trace_layers.py $OUT/trace_$v.csv > $OUT/trace_layers_$v.txt 2>&1
    head -14 $OUT/trace_layers_$v.txt | tee -a $S
    xz -9 $OUT/trace_$v.csv
  done
fi
xz -9 $OUT/ops.log
