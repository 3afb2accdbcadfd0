#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
echo "== test_cuda_moe" | tee -a $S
timeout 200 $B/test_cuda_moe > $OUT/test_cuda_moe.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|decode_t1_pipelined_down" $OUT/test_cuda_moe.log | tail -6 | tee -a $S
for v in default split; do
  if [ $v = default ]; then E=X=0; else E=DEEPINFER_MOE_T1_DOWN=$v; fi
  echo "== bench_cuda_moe --t1 $v" | tee -a $S
  env $E timeout 200 $B/bench_cuda_moe --t1 2>&1 | grep "^\[moe\]" | tee -a $S
done
DEEPINFER_MOE_T1_DOWN=split timeout 200 $B/bench_cuda_moe_trace --t1 --trace $OUT/t1_split 2>&1 | grep "^\[trace\]" | tee -a $S
for f in $OUT/t1_split.*.csv; do python3 scripts/trace_layers.py $f > $f.txt 2>&1; sed -n 1,6p $f.txt | tee -a $S; xz -9 $f; done
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 120 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset")
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2; do
  for P in deepseek-v2-lite qwen3-30b-a3b; do
    run def $P 1 X=0
    run split $P 1 DEEPINFER_MOE_T1_DOWN=split
  done
done
