#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem --format=csv,noheader | tee $OUT/gpu.txt
echo "== mla deferred" | tee -a $OUT/summary.txt
timeout 150 $B/test_cuda_mla --gtest_filter='MlaDecodeDeferred.*' > $OUT/mla_deferred.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "warm pass|^\[  (PASSED|FAILED) |FAIL" $OUT/mla_deferred.log | tail -8 | tee -a $OUT/summary.txt
run() { DEEPINFER_WARM_DECODE=$2 timeout 60 $B/bench_cuda_model --preset $1 --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed "s/\$/ warm=$2/" | tee -a $OUT/summary.txt; }
echo "== A/B" | tee -a $OUT/summary.txt
for m in 0 2 0 2 6 0 2; do run qwen3-30b-a3b $m; done
for m in 0 8 0 8 0 8; do run deepseek-v2-lite $m; done
for m in 0 2 0 2; do run llama3-8b $m; done
echo "== traces" | tee -a $OUT/summary.txt
for m in 0 8; do
  DEEPINFER_WARM_DECODE=$m timeout 60 $B/bench_cuda_model_trace --preset deepseek-v2-lite --conc 1 --ctx 2048 --reps 3 --trace $OUT/v$m.csv > /dev/null 2>&1
  python3 scripts/trace_layers.py $OUT/v$m.csv > $OUT/trace_v2lite_warm$m.txt 2>&1; sed -n 1,22p $OUT/trace_v2lite_warm$m.txt | tee -a $OUT/summary.txt
  xz -f $OUT/v$m.csv
done
DEEPINFER_WARM_DECODE=2 timeout 60 $B/bench_cuda_model_trace --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 3 --trace $OUT/q2.csv > /dev/null 2>&1
python3 scripts/trace_layers.py $OUT/q2.csv > $OUT/trace_qwen3_warm2.txt 2>&1; sed -n 1,22p $OUT/trace_qwen3_warm2.txt | tee -a $OUT/summary.txt; xz -f $OUT/q2.csv
