#!/usr/bin/env bash
# Run 43 call 1: trigger positions (rope/store, router, slot down) and the fused tensor-core
# attention (opt-in since run 29) after run 42's late attention trigger; batch 1 A/B, one binary.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
timeout 120 $B/test_backend_ops --gtest_filter='*qkv_rope*:*moe*:*Moe*:*mla*' > $OUT/ops.log 2>&1
echo "ops rc=$? $(grep -E '^\[  PASSED' $OUT/ops.log) $(grep -c 'FAILED  \]' $OUT/ops.log) failed" | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2; do
  for m in qwen3-30b-a3b deepseek-v2-lite; do
    run base $m 1 X=0
    run rope1 $m 1 DEEPINFER_ROPE_TRIGGER=1
    run rope2 $m 1 DEEPINFER_ROPE_TRIGGER=2
    run router1 $m 1 DEEPINFER_ROUTER_TRIGGER=1
    run router2 $m 1 DEEPINFER_ROUTER_TRIGGER=2
    run down1 $m 1 DEEPINFER_MOE_DOWN_TRIGGER=1
    run down2 $m 1 DEEPINFER_MOE_DOWN_TRIGGER=2
    run down3 $m 1 DEEPINFER_MOE_DOWN_TRIGGER=3
    run fusedmma $m 1 DEEPINFER_ATTN_FUSED_MMA=1
  done
done
xz -9 $OUT/ops.log
