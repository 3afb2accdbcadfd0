#!/usr/bin/env bash
# Run 48's prepared verification call (no device was lent in run 48): the GPU suites on the tree
# after run 48's removals (the GQA cluster decode kernel and its test, the slot down kernel's
# MinBlocks-1 switch; every default kernel byte-identical to 45e4247's, which run 47 call 5
# verified: test_backend_ops 365/365, test_cuda_mla 75/75, test_cuda_golden 16/16, and
# test_cuda_moe 246/246 in call 1). Expect test_backend_ops one test fewer (the cluster test).
# run.sh already runs the attention part of test_backend_ops and the whole test_cuda_moe (with
# the feature patch); this is the full set, for a call to spare.
# Bundle (here): BUNDLE_TARGETS="test_backend_ops test_cuda_moe test_cuda_mla test_cuda_golden
#   bench_cuda_model" JOBS=2 bash scripts/build_gpu_bundle.sh; rm -f .gpu_pack/tokenizers.tar.xz;
#   move models/deepinfer-demo-code/model.safetensors aside; carry [".gpu_pack"]; restore it.
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
suite() { local name=$1; shift
  timeout 300 $B/$name "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/$name.log | tr '\n' ' ')" | tee -a $S; }
suite test_backend_ops
suite test_cuda_moe
suite test_cuda_mla
suite test_cuda_golden --gtest_filter='-*demo_code*'
for P in qwen3-30b-a3b deepseek-v2-lite; do
  for C in 1 32; do
    echo "$P c=$C $(timeout 90 $B/bench_cuda_model --preset $P --conc $C --ctx 2048 --reps 10 2>&1 | grep '^\[model\] preset' | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')" | tee -a $S
  done
done
for f in $OUT/*.log; do [ -f "$f" ] && xz -9 "$f"; done
