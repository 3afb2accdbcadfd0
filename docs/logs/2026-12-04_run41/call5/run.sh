#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
echo "== test_cuda_moe" | tee -a $S
timeout 240 $B/test_cuda_moe > $OUT/test_cuda_moe.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|decode_t1_pipelined_down|ArmedCounter" $OUT/test_cuda_moe.log | tail -6 | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 150 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset")
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2; do
  run def qwen3-30b-a3b 1 X=0
  run gu4x4 qwen3-30b-a3b 1 DEEPINFER_MOE_T1_GU=4x4
  run def deepseek-v2-lite 1 X=0
  run gu2x6 deepseek-v2-lite 1 DEEPINFER_MOE_T1_GU=2x6
done
run def qwen3-30b-a3b 32 X=0
run def deepseek-v2-lite 32 X=0
