#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 120 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset")
  echo "$tag $preset c=$conc $r" | tee -a $S; }
echo "== sweep of existing switches, batch 1" | tee -a $S
P=qwen3-30b-a3b
run def $P 1 X=0
run trig0 $P 1 DEEPINFER_MOE_T1_TRIGGER=0
run early0 $P 1 DEEPINFER_MOE_T1_DOWN_EARLY=0
run spc2 $P 1 DEEPINFER_GQA_MMA_SPLITS_PER_CTA=2
run def $P 1 X=0
run split128 $P 1 DEEPINFER_ATTN_SPLIT=128
run split32 $P 1 DEEPINFER_ATTN_SPLIT=32
run gu4x4 $P 1 DEEPINFER_MOE_T1_GU=4x4
run def $P 1 X=0
run gu2x8 $P 1 DEEPINFER_MOE_T1_GU=2x8
run t1pdl0 $P 1 DEEPINFER_MOE_T1_PDL=0
run split96 $P 1 DEEPINFER_ATTN_SPLIT=96
run def $P 1 X=0
P=deepseek-v2-lite
run def $P 1 X=0
run trig0 $P 1 DEEPINFER_MOE_T1_TRIGGER=0
run early0 $P 1 DEEPINFER_MOE_T1_DOWN_EARLY=0
run sharedearly0 $P 1 DEEPINFER_MOE_SHARED_EARLY=0
run def $P 1 X=0
run gu2x6 $P 1 DEEPINFER_MOE_T1_GU=2x6
run gu2x8 $P 1 DEEPINFER_MOE_T1_GU=2x8
run mlasplit128 $P 1 DEEPINFER_MLA_CLUSTER_SPLIT=128
run def $P 1 X=0
run mlasplit32 $P 1 DEEPINFER_MLA_CLUSTER_SPLIT=32
run t1pdl0 $P 1 DEEPINFER_MOE_T1_PDL=0
run downpipe $P 1 DEEPINFER_MOE_T1_DOWN=pipe
run def $P 1 X=0
