#!/usr/bin/env bash
# Run 44 call 7: joint upper bounds, not results (run 43's debug patch with DEEPINFER_DBG_SKIP as
# a bit mask, dbg_skip_bitmask.patch; the outputs are wrong, only the times mean anything):
# 1 the router without its cluster barrier and routing, 2 the routing only (barrier kept),
# 4 no split combine (GQA), 8 no rope/store (GQA and MLA), 16 no MLA merge_uv.
# (bundle: BUNDLE_TARGETS="bench_cuda_model test_backend_ops", built with the patch applied;
# the switch is off unless the variable is set, so the tests run the real kernels)
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
# bceadad's cluster kernel (the st.async form only) has not run on a GPU since the change:
timeout 120 $B/test_backend_ops --gtest_filter='*GqaDecodeCluster*:*gqa_decode*' > $OUT/cluster_tests.log 2>&1
echo "cluster tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/cluster_tests.log | tr '\n' ' ')" | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 60 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2; do
  run base qwen3-30b-a3b 1 X=0
  run skip4_8 qwen3-30b-a3b 1 DEEPINFER_DBG_SKIP=12
  run skip2_4_8 qwen3-30b-a3b 1 DEEPINFER_DBG_SKIP=14
  run skip1_4_8 qwen3-30b-a3b 1 DEEPINFER_DBG_SKIP=13
  run base deepseek-v2-lite 1 X=0
  run skip8_16 deepseek-v2-lite 1 DEEPINFER_DBG_SKIP=24
  run skip1_8_16 deepseek-v2-lite 1 DEEPINFER_DBG_SKIP=25
done
