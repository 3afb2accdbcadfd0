#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
echo "== test_cuda_moe (gate_up variant by waves)" | tee -a $OUT/summary.txt
timeout 150 $B/test_cuda_moe > $OUT/test_cuda_moe.log 2>&1; echo "rc=$?" | tee -a $OUT/summary.txt
grep -E "decode_t1_pipelined_down|^\[  (PASSED|FAILED) |FAILED  \]" $OUT/test_cuda_moe.log | tail -6 | tee -a $OUT/summary.txt
run() { local m=$1; shift; env "$@" timeout 60 $B/bench_cuda_model --preset $m --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed "s/\$/ $*/" | tee -a $OUT/summary.txt; }
for i in 1 2 3; do run deepseek-v2-lite DEEPINFER_MOE_T1_GU=2x6; run deepseek-v2-lite X=0; done
for i in 1 2; do run qwen3-30b-a3b DEEPINFER_MOE_T1_GU=2x6; run qwen3-30b-a3b X=0; done
