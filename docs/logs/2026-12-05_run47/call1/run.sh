#!/usr/bin/env bash
# Run 47 call 1 (run 44's prepared call 7, one bound added). PARTS picks what runs (default
# "suites bounds"), ROUNDS how many rounds of the bounds (default 1):
#
# suites: the GPU suites on the committed tree (8817146; runs 45-46 changed host code only, every
#   kernel byte-identical to one run 44 tested here; a failure is in host code), then the
#   default batch-32 numbers.
# bounds: upper bounds, not results, from bench_cuda_model_dbg (dbg_skip_bitmask.patch here;
#   outputs are wrong, only the times mean anything). DEEPINFER_DBG_SKIP bits: 1 the router
#   without its cluster barrier and routing, 2 the routing only (barrier kept), 4 no split
#   combine (GQA), 8 no rope/store (GQA and MLA), 16 no MLA merge_uv, 32 (new) no router kernel
#   at all in the captured step: gate_up is o_proj's PDL dependent, every CTA waits and
#   normalizes x itself, expert = slot, weight 1/k (the bound of a router computed beside
#   o_proj from the attention output: logits = W_r diag(g) (h + W_o a) / rms, top-k scale-free).
#
# Bundle (here, before the call):
#   git apply docs/logs/2026-12-05_run47/call1/dbg_skip_bitmask.patch
#   ninja -C build-cuda bench_cuda_model && cp build-cuda/bench/bench_cuda_model /tmp/bench_cuda_model_dbg
#   git checkout src
#   BUNDLE_TARGETS="test_backend_ops test_cuda_moe test_cuda_mla test_cuda_golden bench_cuda_model" \
#     BUNDLE_EXTRA_BINS=/tmp/bench_cuda_model_dbg JOBS=2 bash scripts/build_gpu_bundle.sh
#   rm -f .gpu_pack/tokenizers.tar.xz
#   mv models/deepinfer-demo-code/model.safetensors /tmp/demo_model_moved.safetensors  # carry limit
#   (run with carry [".gpu_pack"]; restore the model after)
set -u
PARTS=${PARTS:-suites bounds}; ROUNDS=${ROUNDS:-1}
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin; S=$OUT/summary.txt
suite() { local name=$1; shift
  timeout 300 $B/$name "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/$name.log | tr '\n' ' ')" | tee -a $S; }
run() { local tag=$1 bin=$2 preset=$3 conc=$4; shift 4
  local t0=$SECONDS
  r=$(env "$@" timeout 60 $B/$bin --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset" | sed 's/.* tok_s=\([0-9.]*\) .*pct=\([0-9.]*\).*/tok_s=\1 pct=\2/')
  echo "$tag $preset c=$conc $r ($((SECONDS - t0)) s)" | tee -a $S; }
if [[ " $PARTS " == *" suites "* ]]; then
  suite test_backend_ops
  suite test_cuda_moe
  suite test_cuda_mla
  suite test_cuda_golden --gtest_filter='-*demo_code*'
  run head bench_cuda_model qwen3-30b-a3b 32 X=0
  run head bench_cuda_model deepseek-v2-lite 32 X=0
fi
if [[ " $PARTS " == *" bounds "* ]]; then
  for round in $(seq 1 "$ROUNDS"); do
    run head bench_cuda_model qwen3-30b-a3b 1 X=0
    run base bench_cuda_model_dbg qwen3-30b-a3b 1 X=0
    run skip32 bench_cuda_model_dbg qwen3-30b-a3b 1 DEEPINFER_DBG_SKIP=32
    run skip4_8 bench_cuda_model_dbg qwen3-30b-a3b 1 DEEPINFER_DBG_SKIP=12
    run skip1_4_8 bench_cuda_model_dbg qwen3-30b-a3b 1 DEEPINFER_DBG_SKIP=13
    run skip32_4_8 bench_cuda_model_dbg qwen3-30b-a3b 1 DEEPINFER_DBG_SKIP=44
    run head bench_cuda_model deepseek-v2-lite 1 X=0
    run base bench_cuda_model_dbg deepseek-v2-lite 1 X=0
    run skip32 bench_cuda_model_dbg deepseek-v2-lite 1 DEEPINFER_DBG_SKIP=32
    run skip8_16 bench_cuda_model_dbg deepseek-v2-lite 1 DEEPINFER_DBG_SKIP=24
    run skip32_8_16 bench_cuda_model_dbg deepseek-v2-lite 1 DEEPINFER_DBG_SKIP=56
  done
fi
for f in $OUT/*.log; do [ -f "$f" ] && xz -9 "$f"; done
