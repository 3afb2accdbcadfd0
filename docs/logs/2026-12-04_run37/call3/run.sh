#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
echo "== op tests (x_first, real load)" | tee -a $OUT/summary.txt
timeout 100 $B/test_backend_ops --gtest_filter='FusedLinearGemv.*' > $OUT/ops_gemv.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED" $OUT/ops_gemv.log | tail -8 | tee -a $OUT/summary.txt
grep -c "x_first=.*PASS$" $OUT/ops_gemv.log | sed 's/^/x_first PASS lines: /' | tee -a $OUT/summary.txt
echo "== A/B c=1" | tee -a $OUT/summary.txt
run() { local b=$1 m=$2; shift 2; env "$@" timeout 60 $B/$b --preset $m --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed "s/\$/ bin=$b $*/" | tee -a $OUT/summary.txt; }
for i in 1 2; do
  run bench_cuda_model_base qwen3-30b-a3b X=0
  run bench_cuda_model qwen3-30b-a3b X=0
  run bench_cuda_model qwen3-30b-a3b DEEPINFER_GEMV_X_FIRST=1
  run bench_cuda_model qwen3-30b-a3b DEEPINFER_GEMV_X_FIRST=2
  run bench_cuda_model qwen3-30b-a3b DEEPINFER_GEMV_BULK=3
  run bench_cuda_model qwen3-30b-a3b DEEPINFER_MOE_T1_ACT_FIRST=1
done
for i in 1 2; do
  run bench_cuda_model_base deepseek-v2-lite X=0
  run bench_cuda_model deepseek-v2-lite X=0
  run bench_cuda_model deepseek-v2-lite DEEPINFER_GEMV_X_FIRST=1
  run bench_cuda_model deepseek-v2-lite DEEPINFER_GEMV_X_FIRST=2
  run bench_cuda_model deepseek-v2-lite DEEPINFER_GEMV_BULK=3
done
echo "== traces" | tee -a $OUT/summary.txt
for v in DEEPINFER_GEMV_X_FIRST=1 DEEPINFER_GEMV_X_FIRST=2 DEEPINFER_MOE_T1_ACT_FIRST=1; do
  tag=$(echo $v | tr -c 'A-Za-z0-9\n' _)
  env $v timeout 60 $B/bench_cuda_model_trace --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 3 --trace $OUT/t_$tag.csv > /dev/null 2>&1
  python3 scripts/trace_layers.py $OUT/t_$tag.csv > $OUT/trace_qwen3_$tag.txt 2>&1; echo "-- $v" | tee -a $OUT/summary.txt; sed -n 3,21p $OUT/trace_qwen3_$tag.txt | tee -a $OUT/summary.txt
  xz -f $OUT/t_$tag.csv
done
echo "== test_cuda_moe with act_first" | tee -a $OUT/summary.txt
DEEPINFER_MOE_T1_ACT_FIRST=1 timeout 150 $B/test_cuda_moe --gtest_filter='*T1*:CudaMoeFused.*:CudaMoeGraph.*' > $OUT/test_cuda_moe.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_cuda_moe.log | tail -6 | tee -a $OUT/summary.txt
