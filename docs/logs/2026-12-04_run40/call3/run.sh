#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
echo "== test_cuda_moe DEEPINFER_MOE_T1_SMEM=w8" | tee -a $S
DEEPINFER_MOE_T1_SMEM=w8 timeout 200 $B/test_cuda_moe > $OUT/test_cuda_moe_w8.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_cuda_moe_w8.log | tail -4 | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 120 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset")
  echo "$tag $preset c=$conc $r" | tee -a $S; }
echo "== A/B" | tee -a $S
for round in 1 2 3; do
  run def deepseek-v2-lite 1 X=0
  run w8 deepseek-v2-lite 1 DEEPINFER_MOE_T1_SMEM=w8
done
for round in 1 2; do
  run def qwen3-30b-a3b 32 X=0
  run mw0 qwen3-30b-a3b 32 DEEPINFER_GQA_MMA_MERGE_WARP=0
  run def llama3-8b 32 X=0
  run mw0 llama3-8b 32 DEEPINFER_GQA_MMA_MERGE_WARP=0
  run def qwen3-30b-a3b 1 X=0
  run mw0 qwen3-30b-a3b 1 DEEPINFER_GQA_MMA_MERGE_WARP=0
done
run def qwen3-30b-a3b 256 X=0
run mw0 qwen3-30b-a3b 256 DEEPINFER_GQA_MMA_MERGE_WARP=0
echo "== test_backend_ops (defaults)" | tee -a $S
timeout 300 $B/test_backend_ops > $OUT/test_backend_ops.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|one-barrier merge:" $OUT/test_backend_ops.log | tail -8 | tee -a $S
echo "== test_cuda_moe (defaults)" | tee -a $S
timeout 200 $B/test_cuda_moe > $OUT/test_cuda_moe.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_cuda_moe.log | tail -4 | tee -a $S
