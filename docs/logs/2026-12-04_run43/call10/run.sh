#!/usr/bin/env bash
# Run 43 call 10: the final HEAD (the router's sorted rounds tidied to the 2 / 4-slot instances,
# MLA's one-barrier merge): test_cuda_moe, test_cuda_mla, batch-1 numbers.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 200 $B/test_cuda_moe > $OUT/moe.log 2>&1
echo "test_cuda_moe rc=$? $(grep -E '^\[  PASSED' $OUT/moe.log) $(grep -c 'FAILED  \]' $OUT/moe.log) failed" | tee -a $S
timeout 200 $B/test_cuda_mla > $OUT/mla.log 2>&1
echo "test_cuda_mla rc=$? $(grep -E '^\[  PASSED' $OUT/mla.log) $(grep -c 'FAILED  \]' $OUT/mla.log) failed" | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for m in qwen3-30b-a3b deepseek-v2-lite; do
  for c in 1 1 1 32; do run head $m $c X=0; done
done
xz -9 $OUT/moe.log $OUT/mla.log
