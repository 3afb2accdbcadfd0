#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
echo "== test_cuda_moe" | tee -a $S
timeout 240 $B/test_cuda_moe > $OUT/test_cuda_moe.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|decode_t1_pipelined_down| FAIL" $OUT/test_cuda_moe.log | tail -8 | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 150 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset")
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2; do
  for P in deepseek-v2-lite qwen3-30b-a3b; do
    run def $P 1 X=0
    run ring2 $P 1 DEEPINFER_MOE_T1_SLOT_RING=1 DEEPINFER_MOE_T1_SLOT_C=2
    run ring1 $P 1 DEEPINFER_MOE_T1_SLOT_RING=1 DEEPINFER_MOE_T1_SLOT_C=1
  done
done
