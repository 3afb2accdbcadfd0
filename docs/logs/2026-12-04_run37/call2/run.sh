#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
echo "== op tests (x_first)" | tee -a $OUT/summary.txt
timeout 100 $B/test_backend_ops --gtest_filter='FusedLinearGemv.*' > $OUT/ops_gemv.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "x_first=|^\[  (PASSED|FAILED) |FAILED" $OUT/ops_gemv.log | grep -v PASS$ | tail -20 | tee -a $OUT/summary.txt
grep -c "x_first=.*PASS$" $OUT/ops_gemv.log | sed 's/^/x_first PASS lines: /' | tee -a $OUT/summary.txt
echo "== A/B c=1 (xf = DEEPINFER_GEMV_X_FIRST, in = _IN mask, act = DEEPINFER_MOE_T1_ACT_FIRST)" | tee -a $OUT/summary.txt
run() { DEEPINFER_GEMV_X_FIRST=$2 DEEPINFER_GEMV_X_FIRST_IN=$3 DEEPINFER_MOE_T1_ACT_FIRST=$4 timeout 60 $B/bench_cuda_model --preset $1 --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed "s/\$/ xf=$2 in=$3 act=$4/" | tee -a $OUT/summary.txt; }
for i in 1 2; do
  run qwen3-30b-a3b 0 2 0; run qwen3-30b-a3b 1 2 0; run qwen3-30b-a3b 2 2 0; run qwen3-30b-a3b 0 2 1; run qwen3-30b-a3b 1 2 1; run qwen3-30b-a3b 1 3 0
done
for i in 1 2; do run deepseek-v2-lite 0 2 0; run deepseek-v2-lite 1 2 0; run deepseek-v2-lite 2 2 0; done
echo "== traces" | tee -a $OUT/summary.txt
for v in "1 2 1" "2 2 1"; do set -- $v
  DEEPINFER_GEMV_X_FIRST=$1 DEEPINFER_GEMV_X_FIRST_IN=$2 DEEPINFER_MOE_T1_ACT_FIRST=$3 timeout 60 $B/bench_cuda_model_trace --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 3 --trace $OUT/t_$1$3.csv > /dev/null 2>&1
  python3 scripts/trace_layers.py $OUT/t_$1$3.csv > $OUT/trace_qwen3_xf$1_act$3.txt 2>&1; head -22 $OUT/trace_qwen3_xf$1_act$3.txt | tee -a $OUT/summary.txt
  xz -f $OUT/t_$1$3.csv
done
echo "== test_cuda_moe with act_first" | tee -a $OUT/summary.txt
DEEPINFER_MOE_T1_ACT_FIRST=1 timeout 150 $B/test_cuda_moe > $OUT/test_cuda_moe.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_cuda_moe.log | tail -6 | tee -a $OUT/summary.txt
