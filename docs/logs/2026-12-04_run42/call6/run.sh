#!/usr/bin/env bash
# Run 42 call 6: existing switches re-measured at batch 1 on c6e212b's code (the slot down kernel
# changed the neighbourhood of every earlier tuning): splits, merges, the opt-in fusions.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
run() { local tag=$1 preset=$2; shift 2
  r=$(env "$@" timeout 120 $B/bench_cuda_model --preset $preset --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset $r" | tee -a $S; }
for round in 1 2; do
  run base qwen3-30b-a3b X=0
  run attn_split32 qwen3-30b-a3b DEEPINFER_ATTN_SPLIT=32
  run attn_split96 qwen3-30b-a3b DEEPINFER_ATTN_SPLIT=96
  run attn_split128 qwen3-30b-a3b DEEPINFER_ATTN_SPLIT=128
  run spc2 qwen3-30b-a3b DEEPINFER_GQA_MMA_SPLITS_PER_CTA=2
  run fused_mma qwen3-30b-a3b DEEPINFER_ATTN_FUSED_MMA=1
  run o_proj2 qwen3-30b-a3b DEEPINFER_ATTN_O_PROJ=1 DEEPINFER_ATTN_O_PROJ_HEADS=2
  run gu4x4 qwen3-30b-a3b DEEPINFER_MOE_T1_GU=4x4
  run gu2x8 qwen3-30b-a3b DEEPINFER_MOE_T1_GU=2x8
  run slotc2 qwen3-30b-a3b DEEPINFER_MOE_T1_SLOT_C=2
  run base deepseek-v2-lite X=0
  run mla_split16 deepseek-v2-lite DEEPINFER_MLA_CLUSTER_SPLIT=16
  run mla_split64 deepseek-v2-lite DEEPINFER_MLA_CLUSTER_SPLIT=64
  run merge_split deepseek-v2-lite DEEPINFER_MLA_MERGE=split
  run merge_wide deepseek-v2-lite DEEPINFER_MLA_MERGE=wide
  run defer0 deepseek-v2-lite DEEPINFER_MLA_DEFER=0
  run gu2x6 deepseek-v2-lite DEEPINFER_MOE_T1_GU=2x6
  run gu2x8 deepseek-v2-lite DEEPINFER_MOE_T1_GU=2x8
  run gu4x4 deepseek-v2-lite DEEPINFER_MOE_T1_GU=4x4
  run slotc2 deepseek-v2-lite DEEPINFER_MOE_T1_SLOT_C=2
  run shared_early0 deepseek-v2-lite DEEPINFER_MOE_SHARED_EARLY=0
done
