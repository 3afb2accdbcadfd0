#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
echo "== HEAD $(git rev-parse --short HEAD 2>/dev/null)" | tee -a $S
echo "== test_backend_ops (switch tests first)" | tee -a $S
timeout 120 $B/test_backend_ops --gtest_filter='SplitCombine.*:QkvRopeStoreWarp.*' > $OUT/switch_tests.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|^\[       OK|Failure" $OUT/switch_tests.log | head -20 | tee -a $S
timeout 300 $B/test_backend_ops > $OUT/test_backend_ops.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_backend_ops.log | tail -8 | tee -a $S
echo "== test_cuda_moe" | tee -a $S
timeout 200 $B/test_cuda_moe > $OUT/test_cuda_moe.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_cuda_moe.log | tail -6 | tee -a $S
echo "== A/B batch 1" | tee -a $S
run() { local tag=$1 preset=$2; shift 2
  r=$(env "$@" timeout 90 $B/bench_cuda_model --preset $preset --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset")
  echo "$tag $preset $r" | tee -a $S; }
for round in 1 2 3; do
  run def qwen3-30b-a3b X=0
  run cw qwen3-30b-a3b DEEPINFER_COMBINE_WARP=1
  run rw qwen3-30b-a3b DEEPINFER_ROPE_STORE_WARP=1
  run both qwen3-30b-a3b DEEPINFER_COMBINE_WARP=1 DEEPINFER_ROPE_STORE_WARP=1
done
for round in 1 2; do
  run def llama3-8b X=0
  run both llama3-8b DEEPINFER_COMBINE_WARP=1 DEEPINFER_ROPE_STORE_WARP=1
done
