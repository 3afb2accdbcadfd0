#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
run() { env $3 timeout 60 $B/$2 --preset $1 --conc ${4:-1} --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed "s/\$/ bin=$2 env=$3/" | tee -a $OUT/summary.txt; }
echo "== A/B: base = d95cc35, new (combine warm pass, noinline body), new with DEEPINFER_COMBINE_WARM=0" | tee -a $OUT/summary.txt
for i in 1 2 3; do
  run qwen3-30b-a3b bench_cuda_model_base X=1; run qwen3-30b-a3b bench_cuda_model X=1; run qwen3-30b-a3b bench_cuda_model DEEPINFER_COMBINE_WARM=0
done
for i in 1 2; do run llama3-8b bench_cuda_model_base X=1; run llama3-8b bench_cuda_model X=1; done
run deepseek-v2-lite bench_cuda_model_base X=1; run deepseek-v2-lite bench_cuda_model X=1
run qwen3-30b-a3b bench_cuda_model_base X=1 32; run qwen3-30b-a3b bench_cuda_model X=1 32
echo "== op tests" | tee -a $OUT/summary.txt
timeout 200 $B/test_backend_ops --gtest_filter='WarmCombine.*:GqaDecode*:FusedQkvRope*:FusedAttentionOProj*:BackendOpsTable.*' > $OUT/ops.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/ops.log | tail -6 | tee -a $OUT/summary.txt
grep -c "warm_vs_cold.*PASS" $OUT/ops.log | sed 's/^/warm_vs_cold PASS lines: /' | tee -a $OUT/summary.txt
echo "== traces" | tee -a $OUT/summary.txt
for w in 0 1; do
  DEEPINFER_COMBINE_WARM=$w timeout 60 $B/bench_cuda_model_trace --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 3 --trace $OUT/q$w.csv > /dev/null 2>&1
  python3 scripts/trace_layers.py $OUT/q$w.csv > $OUT/trace_qwen3_combine_warm$w.txt 2>&1; grep -E "layer length|combine|gemv n=2048" $OUT/trace_qwen3_combine_warm$w.txt | tee -a $OUT/summary.txt; rm -f $OUT/q$w.csv
done
