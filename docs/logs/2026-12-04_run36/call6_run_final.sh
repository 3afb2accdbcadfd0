#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem --format=csv,noheader | tee $OUT/gpu.txt
run() { env $3 timeout 60 $B/$2 --preset $1 --conc ${4:-1} --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed "s/\$/ bin=$2 env=$3/" | tee -a $OUT/summary.txt; }
echo "== A/B: base = d95cc35, new = this commit (combine warm on), new with DEEPINFER_COMBINE_WARM=0" | tee -a $OUT/summary.txt
for i in 1 2 3; do
  run qwen3-30b-a3b bench_cuda_model_base X=1; run qwen3-30b-a3b bench_cuda_model X=1; run qwen3-30b-a3b bench_cuda_model DEEPINFER_COMBINE_WARM=0
done
for i in 1 2; do run llama3-8b bench_cuda_model_base X=1; run llama3-8b bench_cuda_model X=1; done
run deepseek-v2-lite bench_cuda_model_base X=1; run deepseek-v2-lite bench_cuda_model X=1
run qwen3-30b-a3b bench_cuda_model_base X=1 32; run qwen3-30b-a3b bench_cuda_model X=1 32
echo "== test_backend_ops" | tee -a $OUT/summary.txt
timeout 240 $B/test_backend_ops > $OUT/test_backend_ops.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_backend_ops.log | tail -8 | tee -a $OUT/summary.txt
grep -c "warm_vs_cold.*PASS" $OUT/test_backend_ops.log | sed 's/^/warm_vs_cold PASS lines: /' | tee -a $OUT/summary.txt
echo "== golden" | tee -a $OUT/summary.txt
timeout 150 $B/test_cuda_golden > $OUT/golden.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/golden.log | tail -6 | tee -a $OUT/summary.txt
