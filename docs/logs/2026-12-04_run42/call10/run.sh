#!/usr/bin/env bash
# Run 42 call 10: the attention kernels' PDL trigger after their wait instead of at their start
# (DEEPINFER_ATTN_TRIGGER_LATE bits: 1 GQA tensor-core decode, 2 split combine, 4 MLA cluster
# decode, 8 MLA merge), so that o_proj's early weight loads start later.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
DEEPINFER_ATTN_TRIGGER_LATE=15 timeout 60 $B/test_backend_ops --gtest_filter='*qkv_rope_attention_qwen3*:*attention_o_proj_qwen3moe*:*mla_decode_hq16*' > $OUT/ops.log 2>&1
echo "ops late=15 rc=$? $(grep -E '^\[  PASSED' $OUT/ops.log) $(grep -c 'FAILED  \]' $OUT/ops.log) failed" | tee -a $S
run() { local tag=$1 preset=$2; shift 2
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc 1 --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset $r" | tee -a $S; }
for round in 1 2; do
  for l in 0 1 2 3; do run late$l qwen3-30b-a3b DEEPINFER_ATTN_TRIGGER_LATE=$l; done
  for l in 0 4 8 12; do run late$l deepseek-v2-lite DEEPINFER_ATTN_TRIGGER_LATE=$l; done
done
