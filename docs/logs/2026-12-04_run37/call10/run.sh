#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
run() { local m=$1; shift; env "$@" timeout 60 $B/bench_cuda_model --preset $m --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed "s/\$/ $*/" | tee -a $OUT/summary.txt; }
echo "== the batch-1 switches re-checked at HEAD (549a917)" | tee -a $OUT/summary.txt
Q=qwen3-30b-a3b
run $Q X=0
for v in DEEPINFER_PDL_DECODE=9 DEEPINFER_PDL_DECODE=12 DEEPINFER_PDL_DECODE=15 DEEPINFER_PDL_DECODE=5; do run $Q $v; done
run $Q X=0
for v in DEEPINFER_MOE_T1_GU=2x8 DEEPINFER_MOE_T1_GU=4x4 DEEPINFER_MOE_T1_DOWN=v1 DEEPINFER_MOE_T1_DOWN=smem DEEPINFER_MOE_T1_PDL=1 DEEPINFER_MOE_T1_PDL=0 DEEPINFER_GQA_MMA_SPLITS_PER_CTA=2 DEEPINFER_ATTN_SPLIT=128; do run $Q $v; done
run $Q X=0
V=deepseek-v2-lite
run $V X=0
for v in DEEPINFER_MLA_CLUSTER_SPLIT=32 DEEPINFER_MLA_CLUSTER_SPLIT=128 DEEPINFER_MOE_T1_GU=2x8 DEEPINFER_MOE_T1_GU=4x4 DEEPINFER_MOE_T1_DOWN=pipe DEEPINFER_MOE_T1_PDL=0 DEEPINFER_PDL_DECODE=9; do run $V $v; done
run $V X=0
