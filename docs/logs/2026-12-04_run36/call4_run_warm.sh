#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/gpu.txt
echo "== op tests" | tee -a $OUT/summary.txt
timeout 200 $B/test_backend_ops --gtest_filter='WarmDecode.*:GqaDecodeMma.*:FusedQkvRopeAttention.*:GqaDecodeLayout.*' > $OUT/ops_warm.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "warm_vs_cold|^\[  (PASSED|FAILED) |FAILED" $OUT/ops_warm.log | tail -40 | tee -a $OUT/summary.txt
echo "== A/B qwen3 c=1" | tee -a $OUT/summary.txt
run() { DEEPINFER_WARM_DECODE=$2 timeout 60 $B/bench_cuda_model --preset $1 --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\]" | sed "s/\$/ warm=$2/" | tee -a $OUT/summary.txt; }
for m in 0 7 1 2 4 0 7 3 0 7; do run qwen3-30b-a3b $m; done
for m in 0 7 0 7; do run llama3-8b $m; done
echo "== traces" | tee -a $OUT/summary.txt
for m in 0 7; do
  DEEPINFER_WARM_DECODE=$m timeout 60 $B/bench_cuda_model_trace --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 3 --trace $OUT/t$m.csv > $OUT/trace_run$m.log 2>&1
  python3 scripts/trace_layers.py $OUT/t$m.csv > $OUT/trace_qwen3_warm$m.txt 2>&1; head -30 $OUT/trace_qwen3_warm$m.txt | tee -a $OUT/summary.txt
  xz -f $OUT/t$m.csv
done
echo "== batch 32 (no warm launch expected)" | tee -a $OUT/summary.txt
for m in 0 7; do DEEPINFER_WARM_DECODE=$m timeout 60 $B/bench_cuda_model --preset qwen3-30b-a3b --conc 32 --ctx 2048 --reps 5 2>&1 | grep "^\[model\]" | sed "s/\$/ warm=$m/" | tee -a $OUT/summary.txt; done
echo "== test_cuda_moe (fused kernel at HEAD)" | tee -a $OUT/summary.txt
timeout 220 $B/test_cuda_moe > $OUT/test_cuda_moe.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) |tests ran" $OUT/test_cuda_moe.log | tail -5 | tee -a $OUT/summary.txt
