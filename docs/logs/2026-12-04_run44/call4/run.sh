#!/usr/bin/env bash
# Run 44 call 4 (the tree as committed): the whole op table (the split kernel's sub-tile code now
# in gqa_decode_mma.cuh; the cluster kernel's tests), the GPU goldens, and the cluster kernel
# (opt-in, mode 2) against the default at batch 1 and 4; the batch-1 / 32 numbers of record.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 300 $B/test_backend_ops > $OUT/ops.log 2>&1
echo "test_backend_ops rc=$? $(grep -E '^\[  PASSED' $OUT/ops.log) $(grep -c 'FAILED  \]' $OUT/ops.log) failed" | tee -a $S
grep -E "FAILED  \]|gqa cluster decode:" $OUT/ops.log | head -20 | tee -a $S
timeout 200 $B/test_cuda_golden --gtest_filter='-*demo_code*' > $OUT/golden.log 2>&1
echo "test_cuda_golden rc=$? $(grep -E '^\[  PASSED' $OUT/golden.log) $(grep -c 'FAILED  \]' $OUT/golden.log) failed" | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2 3; do
  run default qwen3-30b-a3b 1 X=0
  run cluster2 qwen3-30b-a3b 1 DEEPINFER_GQA_CLUSTER=2
done
run default qwen3-30b-a3b 4 X=0
run cluster2 qwen3-30b-a3b 4 DEEPINFER_GQA_CLUSTER=2
run default qwen3-30b-a3b 32 X=0
run default deepseek-v2-lite 1 X=0
run default deepseek-v2-lite 1 X=0
run default deepseek-v2-lite 32 X=0
xz -9 $OUT/ops.log $OUT/golden.log
