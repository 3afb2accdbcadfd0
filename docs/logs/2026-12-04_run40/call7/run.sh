#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
echo "== bench_cuda_moe --t1" | tee -a $S
timeout 200 $B/bench_cuda_moe --t1 2>&1 | grep "^\[moe\]" | tee -a $S
echo "== bench_cuda_moe_trace --t1 --trace" | tee -a $S
timeout 200 $B/bench_cuda_moe_trace --t1 --trace $OUT/t1 2>&1 | grep "^\[moe\]\|^\[trace\]" | tee -a $S
for f in $OUT/t1.*.csv; do
  echo "-- $f" | tee -a $S
  python3 scripts/trace_layers.py $f 2>&1 | tee $f.txt | head -20 | tee -a $S
  xz -9 $f
done
