#!/usr/bin/env bash
# Run 44 call 6: the MLA split merge's two rank-order sum loops as one lambda (rank_sum; same
# instruction count): test_cuda_mla, and V2-Lite batch 1 as a check.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 240 $B/test_cuda_mla > $OUT/mla.log 2>&1
echo "test_cuda_mla rc=$? $(grep -E '^\[  PASSED' $OUT/mla.log) $(grep -c 'FAILED  \]' $OUT/mla.log) failed" | tee -a $S
grep -E "merge kernels differing" $OUT/mla.log | head -6 | tee -a $S
for round in 1 2; do
  r=$(timeout 60 $B/bench_cuda_model --preset deepseek-v2-lite --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "default deepseek-v2-lite c=1 $r" | tee -a $S
done
xz -9 $OUT/mla.log
