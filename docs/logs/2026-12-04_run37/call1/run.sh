#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/gpu.txt
echo "== op tests (gemv)" | tee -a $OUT/summary.txt
timeout 150 $B/test_backend_ops --gtest_filter='FusedLinearGemv.*:*fused_linear*' > $OUT/ops_gemv.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "three_vs_two|more_resident policy|^\[  (PASSED|FAILED) |FAILED" $OUT/ops_gemv.log | tail -40 | tee -a $OUT/summary.txt
echo "== A/B qwen3 c=1 (mr = DEEPINFER_GEMV_MORE_RESIDENT, bulk = DEEPINFER_GEMV_BULK)" | tee -a $OUT/summary.txt
run() { DEEPINFER_GEMV_MORE_RESIDENT=$2 DEEPINFER_GEMV_BULK=$3 timeout 60 $B/bench_cuda_model --preset $1 --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed "s/\$/ mr=$2 bulk=$3/" | tee -a $OUT/summary.txt; }
for i in 1 2; do run qwen3-30b-a3b 0 -1; run qwen3-30b-a3b -1 -1; run qwen3-30b-a3b 0 2; run qwen3-30b-a3b -1 2; done
run deepseek-v2-lite 0 -1; run deepseek-v2-lite -1 -1; run deepseek-v2-lite 0 2
echo "== traces" | tee -a $OUT/summary.txt
for m in 0 -1; do
  DEEPINFER_GEMV_MORE_RESIDENT=$m timeout 60 $B/bench_cuda_model_trace --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 3 --trace $OUT/t$m.csv > $OUT/trace_run$m.log 2>&1
  python3 scripts/trace_layers.py $OUT/t$m.csv > $OUT/trace_qwen3_mr$m.txt 2>&1; head -30 $OUT/trace_qwen3_mr$m.txt | tee -a $OUT/summary.txt
  xz -f $OUT/t$m.csv
done
echo "== green" | tee -a $OUT/summary.txt
timeout 60 $B/bench_cuda_green --small-sms 16 --n 200 2>&1 | tee -a $OUT/summary.txt
