#!/usr/bin/env bash
# Run 43 call 2: upper bounds, not results (DEEPINFER_DBG_SKIP, a debug patch: the outputs are
# wrong): 1 the router with no cluster barrier and no routing (CTA 0 writes ids 0..k-1), 2 the
# barrier without routing, 3 no split combine (GQA), 4 no rope/store (GQA and MLA), 5 no MLA merge_uv.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2; do
  for m in qwen3-30b-a3b deepseek-v2-lite; do
    run base $m 1 X=0
    for k in 1 2 3 4 5; do run skip$k $m 1 DEEPINFER_DBG_SKIP=$k; done
  done
done
