#!/usr/bin/env bash
# Run 42 call 9 (6d33c48): test_cuda_moe after the slot kernel's MinBlocks variants were trimmed;
# the defaults against DEEPINFER_MOE_T1_SLOT_OCC=1 and DEEPINFER_GEMV_EARLY=0 once more.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 200 $B/test_cuda_moe > $OUT/test_cuda_moe.log 2>&1; echo "test_cuda_moe rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|decode_t1_pipelined_down" $OUT/test_cuda_moe.log | tail -6 | tee -a $S
run() { local tag=$1 preset=$2; shift 2
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset $r" | tee -a $S; }
for round in 1 2; do
  run default qwen3-30b-a3b X=0
  run occ1 qwen3-30b-a3b DEEPINFER_MOE_T1_SLOT_OCC=1
  run early_off qwen3-30b-a3b DEEPINFER_GEMV_EARLY=0
  run default deepseek-v2-lite X=0
done
xz -9 $OUT/test_cuda_moe.log
