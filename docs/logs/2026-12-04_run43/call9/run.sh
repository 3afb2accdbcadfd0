#!/usr/bin/env bash
# Run 43 call 9: the share of SMs whose qkv GEMV warps load their second item before the wait
# (kEarly; DEEPINFER_GEMV_EARLY_SPLIT=m/k: SMs with (smid + 1) % m < k; 2/1 = the odd SMs, the
# default), Qwen3-30B-A3B batch 1.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2; do
  for s in 2/1 4/1 3/1 3/2 4/3 1/1 1/0; do run "split=$s" qwen3-30b-a3b 1 DEEPINFER_GEMV_EARLY_SPLIT=$s; done
done
