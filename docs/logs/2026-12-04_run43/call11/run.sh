#!/usr/bin/env bash
# Run 43 call 11: MLA's split merge runs its W_UV products once before the wait on the zeroed
# rows (code warm-up; DEEPINFER_MLA_MERGE_WARM, default on in this binary) against none.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 100 $B/test_cuda_mla --gtest_filter='*Deferred*:*Invariance*' > $OUT/mla.log 2>&1
echo "test_cuda_mla rc=$? $(grep -E '^\[  PASSED' $OUT/mla.log) $(grep -c 'FAILED  \]' $OUT/mla.log) failed" | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2 3; do
  run warm deepseek-v2-lite 1 X=0
  run nowarm deepseek-v2-lite 1 DEEPINFER_MLA_MERGE_WARM=0
done
xz -9 $OUT/mla.log
