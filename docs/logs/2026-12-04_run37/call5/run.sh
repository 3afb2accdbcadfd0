#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
echo "== test_cuda_moe (router logits pushed into CTA 0)" | tee -a $OUT/summary.txt
timeout 200 $B/test_cuda_moe > $OUT/test_cuda_moe.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_cuda_moe.log | tail -6 | tee -a $OUT/summary.txt
echo "== A/B c=1: base = 1548ebe, new = the router change" | tee -a $OUT/summary.txt
run() { local b=$1 m=$2; shift 2; env "$@" timeout 60 $B/$b --preset $m --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed "s/\$/ bin=$b/" | tee -a $OUT/summary.txt; }
for i in 1 2 3; do
  run bench_cuda_model_base qwen3-30b-a3b X=0; run bench_cuda_model qwen3-30b-a3b X=0
done
for i in 1 2 3; do
  run bench_cuda_model_base deepseek-v2-lite X=0; run bench_cuda_model deepseek-v2-lite X=0
done
for c in 32; do
  for b in bench_cuda_model_base bench_cuda_model; do timeout 60 $B/$b --preset qwen3-30b-a3b --conc $c --ctx 2048 --reps 5 2>&1 | grep "^\[model\] preset" | sed "s/\$/ bin=$b/" | tee -a $OUT/summary.txt; done
done
echo "== trace" | tee -a $OUT/summary.txt
timeout 60 $B/bench_cuda_model_trace --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 3 --trace $OUT/t.csv > /dev/null 2>&1
python3 scripts/trace_layers.py $OUT/t.csv > $OUT/trace_qwen3.txt 2>&1; sed -n 1,22p $OUT/trace_qwen3.txt | tee -a $OUT/summary.txt; xz -f $OUT/t.csv
timeout 60 $B/bench_cuda_model_trace --preset deepseek-v2-lite --conc 1 --ctx 2048 --reps 3 --trace $OUT/tv.csv > /dev/null 2>&1
python3 scripts/trace_layers.py $OUT/tv.csv > $OUT/trace_v2lite.txt 2>&1; sed -n 1,22p $OUT/trace_v2lite.txt | tee -a $OUT/summary.txt; xz -f $OUT/tv.csv
