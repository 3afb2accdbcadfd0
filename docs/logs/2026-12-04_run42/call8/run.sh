#!/usr/bin/env bash
# Run 42 call 8: the kept policy (the qkv GEMV's second item after the wait on even SMs) - tests,
# A/B against DEEPINFER_GEMV_EARLY=0 in one binary, a trace.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
for t in test_backend_ops test_cuda_golden; do
  timeout 300 $B/$t > $OUT/$t.log 2>&1; echo "$t rc=$?" | tee -a $S
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|GEMV odd-SM" $OUT/$t.log | tail -6 | tee -a $S
done
grep -q "^\[  PASSED  \] 3" $OUT/test_backend_ops.log && ! grep -q "FAILED  \]" $OUT/test_backend_ops.log || { echo "test_backend_ops failed: no bench" | tee -a $S; exit 1; }
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 120 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2 3; do
  run policy qwen3-30b-a3b 1 X=0
  run early_off qwen3-30b-a3b 1 DEEPINFER_GEMV_EARLY=0
done
for round in 1 2; do
  run policy deepseek-v2-lite 1 X=0
  run early_off deepseek-v2-lite 1 DEEPINFER_GEMV_EARLY=0
done
run policy qwen3-30b-a3b 32 X=0
run policy deepseek-v2-lite 32 X=0
timeout 120 $B/bench_cuda_model_trace --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 10 --trace $OUT/trace_qwen3.csv > $OUT/trace_qwen3.log 2>&1
python3 scripts/trace_layers.py $OUT/trace_qwen3.csv > $OUT/trace_layers_qwen3.txt 2>&1
head -22 $OUT/trace_layers_qwen3.txt | tee -a $S
xz -9 $OUT/trace_qwen3.csv
xz -9 $OUT/test_backend_ops.log $OUT/test_cuda_golden.log
