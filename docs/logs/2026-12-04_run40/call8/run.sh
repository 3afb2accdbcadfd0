#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
for v in default pipe smem v1; do
  echo "== DEEPINFER_MOE_T1_DOWN=$v" | tee -a $S
  if [ $v = default ]; then E=X=0; else E=DEEPINFER_MOE_T1_DOWN=$v; fi
  env $E timeout 200 $B/bench_cuda_moe --t1 2>&1 | grep "^\[moe\]" | tee -a $S
  env $E timeout 200 $B/bench_cuda_moe_trace --t1 --trace $OUT/t1_$v 2>&1 | grep "^\[trace\]" | tee -a $S
done
xz -9 $OUT/*.csv
