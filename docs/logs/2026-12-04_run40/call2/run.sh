#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
for m in 1 2; do
  echo "== test_cuda_moe DEEPINFER_MOE_T1_DOWN_L2=$m" | tee -a $S
  DEEPINFER_MOE_T1_DOWN_L2=$m timeout 200 $B/test_cuda_moe > $OUT/test_cuda_moe_l2_$m.log 2>&1; echo "rc=$?" | tee -a $S
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_cuda_moe_l2_$m.log | tail -4 | tee -a $S
done
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 90 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset")
  echo "$tag $preset c=$conc $r" | tee -a $S; }
echo "== A/B" | tee -a $S
for round in 1 2 3; do
  run def deepseek-v2-lite 1 X=0
  run l2a deepseek-v2-lite 1 DEEPINFER_MOE_T1_DOWN_L2=1
  run l2b deepseek-v2-lite 1 DEEPINFER_MOE_T1_DOWN_L2=2
done
for round in 1 2; do
  run def qwen3-30b-a3b 1 X=0
  run l2a qwen3-30b-a3b 1 DEEPINFER_MOE_T1_DOWN_L2=1
  run l2b qwen3-30b-a3b 1 DEEPINFER_MOE_T1_DOWN_L2=2
done
for round in 1 2 3; do
  run def qwen3-30b-a3b 32 X=0
  run mw qwen3-30b-a3b 32 DEEPINFER_GQA_MMA_MERGE_WARP=1
done
echo "== traces" | tee -a $S
for m in 1 2; do
for preset in qwen3-30b-a3b deepseek-v2-lite; do
  DEEPINFER_MOE_T1_DOWN_L2=$m timeout 120 $B/bench_cuda_model_trace --preset $preset --conc 1 --ctx 2048 --reps 10 --trace $OUT/trace_${preset}_l2_$m.csv > /dev/null 2>&1
  python3 scripts/trace_layers.py $OUT/trace_${preset}_l2_$m.csv > $OUT/trace_layers_${preset}_l2_$m.txt 2>&1
  echo "-- $preset L2=$m" | tee -a $S
  sed -n 2,12p $OUT/trace_layers_${preset}_l2_$m.txt | tee -a $S
  rm -f $OUT/trace_${preset}_l2_$m.csv
done
done
