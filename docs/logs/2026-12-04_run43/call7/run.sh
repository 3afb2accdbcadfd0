#!/usr/bin/env bash
# Run 43 call 7: HEAD 3db8675 (sorted router rounds, slot-grid fix): the GPU test suites and
# the decode table (batch 1 / 32 / 256, ctx 2048); plus an upper bound from a debug binary
# (bench_cuda_model_dbg, route_tail_bound.patch: DEEPINFER_DBG_TAIL=1 float exp in the routing
# weights, 2 no weight math; outputs wrong for 2, bits changed for 1).
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 300 $B/test_backend_ops > $OUT/ops.log 2>&1
echo "test_backend_ops rc=$? $(grep -E '^\[  PASSED' $OUT/ops.log) $(grep -c 'FAILED  \]' $OUT/ops.log) failed" | tee -a $S
timeout 200 $B/test_cuda_moe > $OUT/moe.log 2>&1
echo "test_cuda_moe rc=$? $(grep -E '^\[  PASSED' $OUT/moe.log) $(grep -c 'FAILED  \]' $OUT/moe.log) failed" | tee -a $S
timeout 200 $B/test_cuda_golden > $OUT/golden.log 2>&1
echo "test_cuda_golden rc=$? $(grep -E '^\[  PASSED' $OUT/golden.log) failed: $(grep -E '^\[  FAILED  \] [A-Z]' $OUT/golden.log | sed 's/,.*//' | sort -u | tr '\n' ' ')" | tee -a $S
run() { local bin=$1 tag=$2 preset=$3 conc=$4; shift 4
  r=$(env "$@" timeout 90 $B/$bin --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for m in qwen3-30b-a3b deepseek-v2-lite; do
  for c in 1 1 1 32 256; do run bench_cuda_model head $m $c X=0; done
done
for round in 1 2; do
  run bench_cuda_model_dbg dbg0 qwen3-30b-a3b 1 X=0
  run bench_cuda_model_dbg tail_expf qwen3-30b-a3b 1 DEEPINFER_DBG_TAIL=1
  run bench_cuda_model_dbg tail_none qwen3-30b-a3b 1 DEEPINFER_DBG_TAIL=2
done
xz -9 $OUT/ops.log $OUT/moe.log $OUT/golden.log
