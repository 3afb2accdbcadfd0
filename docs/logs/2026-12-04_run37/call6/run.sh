#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
echo "== HEAD $(git rev-parse --short HEAD 2>/dev/null)" | tee -a $OUT/summary.txt
echo "== test_backend_ops" | tee -a $OUT/summary.txt
timeout 240 $B/test_backend_ops > $OUT/test_backend_ops.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_backend_ops.log | tail -6 | tee -a $OUT/summary.txt
echo "== test_cuda_golden" | tee -a $OUT/summary.txt
timeout 120 $B/test_cuda_golden > $OUT/test_cuda_golden.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_cuda_golden.log | tail -6 | tee -a $OUT/summary.txt
echo "== models" | tee -a $OUT/summary.txt
for m in "qwen3-30b-a3b 1" "deepseek-v2-lite 1" "llama3-8b 1" "qwen3-30b-a3b 32" "deepseek-v2-lite 32"; do set -- $m
  timeout 60 $B/bench_cuda_model --preset $1 --conc $2 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | tee -a $OUT/summary.txt
done
echo "== l2lat (c8b02ad's one measure())" | tee -a $OUT/summary.txt
timeout 120 $B/bench_cuda_l2lat --hops 400 > $OUT/l2lat.txt 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt; tail -n 30 $OUT/l2lat.txt | tee -a $OUT/summary.txt
