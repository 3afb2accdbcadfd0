#!/usr/bin/env bash
# Run 42 call 2: the GEMV's pre-wait items by SM parity (DEEPINFER_GEMV_EARLY, run 42's xread).
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
for e in 1 2 3; do
  DEEPINFER_GEMV_EARLY=$e timeout 200 $B/test_backend_ops --gtest_filter='*fused_linear*:*gemv*' > $OUT/ops_early$e.log 2>&1
  echo "ops early=$e rc=$? $(grep -E '^\[  PASSED' $OUT/ops_early$e.log)" | tee -a $S
done
run() { local tag=$1 preset=$2 conc=$3; shift 3
  local t0=$(date +%s.%N)
  r=$(env "$@" timeout 120 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.*tok_s=\([0-9.]*\).*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r ($(echo "$(date +%s.%N) - $t0" | bc | cut -c1-5) s)" | tee -a $S; }
for round in 1 2; do
  for e in 0 1 2 3; do run early$e qwen3-30b-a3b 1 DEEPINFER_GEMV_EARLY=$e; done
  for e in 0 1 2 3; do run early$e deepseek-v2-lite 1 DEEPINFER_GEMV_EARLY=$e; done
done
