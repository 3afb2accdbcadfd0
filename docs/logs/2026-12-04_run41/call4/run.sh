#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
for t in test_cuda_moe test_cuda_golden test_backend_ops; do
  echo "== $t" | tee -a $S
  timeout 300 $B/$t > $OUT/$t.log 2>&1; echo "rc=$?" | tee -a $S
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|decode_t1_pipelined_down" $OUT/$t.log | tail -6 | tee -a $S
done
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 120 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset")
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2; do
  run def qwen3-30b-a3b 1 X=0
  run old_pipe qwen3-30b-a3b 1 DEEPINFER_MOE_T1_DOWN=pipe
  run def deepseek-v2-lite 1 X=0
  run old_smem deepseek-v2-lite 1 DEEPINFER_MOE_T1_DOWN=smem
done
echo "== traces" | tee -a $S
for preset in qwen3-30b-a3b deepseek-v2-lite; do
  timeout 120 $B/bench_cuda_model_trace --preset $preset --conc 1 --ctx 2048 --reps 10 --trace $OUT/trace_$preset.csv > $OUT/trace_$preset.log 2>&1
  python3 scripts/trace_layers.py $OUT/trace_$preset.csv > $OUT/trace_layers_$preset.txt 2>&1
  head -30 $OUT/trace_layers_$preset.txt | tee -a $S
  xz -9 $OUT/trace_$preset.csv
done
