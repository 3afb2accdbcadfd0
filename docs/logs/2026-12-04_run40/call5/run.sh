#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
for m in 3 4; do
  echo "== test_cuda_moe DEEPINFER_MOE_T1_DOWN_L2=$m" | tee -a $S
  DEEPINFER_MOE_T1_DOWN_L2=$m timeout 200 $B/test_cuda_moe > $OUT/test_cuda_moe_l2_$m.log 2>&1; echo "rc=$?" | tee -a $S
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_cuda_moe_l2_$m.log | tail -4 | tee -a $S
done
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 120 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset")
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2 3; do
  for P in deepseek-v2-lite qwen3-30b-a3b; do
    run def $P 1 X=0
    run roll2 $P 1 DEEPINFER_MOE_T1_DOWN_L2=3
    run roll4 $P 1 DEEPINFER_MOE_T1_DOWN_L2=4
  done
done
