#!/usr/bin/env bash
# Builds the bundle for run.sh here (no GPU needed): the debug patch applied to the tree, the
# patched bench_cuda_model (and its -DDI_TRACE=1 build for the timelines), the tree restored, then
# the bundle with the unpatched bench_cuda_model beside them. Leaves .gpu_pack/bundle.tar.xz.
# Afterwards: move models/deepinfer-demo-code/model.safetensors aside (the 64 MiB carry limit),
# run `bash docs/logs/2026-12-05_run48/prepared_call/run.sh` with carry [".gpu_pack"], restore
# the model (never commit its deletion).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
here=docs/logs/2026-12-05_run48/prepared_call
if ! git diff --quiet -- src tests; then
  echo "src/ or tests/ has uncommitted changes: commit or stash them first" >&2
  exit 1
fi
git apply "$here/dbg_alias_skip.patch"
trap 'git checkout -- src tests' EXIT  # the tree comes back whatever happens
cmake -S . -B build-cuda -G Ninja -DDI_CUDA=ON -DDI_BLAS=OFF -DDI_BUILD_PYTHON=OFF \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build-cuda -j"${JOBS:-2}" bench_cuda_model
cp build-cuda/bench/bench_cuda_model /tmp/bench_cuda_model_dbg
extra=/tmp/bench_cuda_model_dbg
if [ "${TRACE:-1}" = 1 ]; then
  cmake -S . -B build-cuda-trace -G Ninja -DDI_CUDA=ON -DDI_BLAS=OFF -DDI_BUILD_PYTHON=OFF \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS=-DDI_TRACE=1 >/dev/null
  ninja -C build-cuda-trace -j"${JOBS:-2}" bench_cuda_model
  cp build-cuda-trace/bench/bench_cuda_model /tmp/bench_cuda_model_dbg_trace
  extra="$extra /tmp/bench_cuda_model_dbg_trace"
fi
git checkout -- src
# The real form of the next-weight prefetch (prefetch_next_feature.patch: MoeResidualParams::
# next_weight from the models, DEEPINFER_MOE_PREFETCH_NEXT, its bitwise test), for an A/B in
# the same call: bench_cuda_model_pfnext and test_cuda_moe_pfnext.
git apply "$here/prefetch_next_feature.patch"
ninja -C build-cuda -j"${JOBS:-2}" bench_cuda_model test_cuda_moe
cp build-cuda/bench/bench_cuda_model /tmp/bench_cuda_model_pfnext
cp "$(find build-cuda -type f -name test_cuda_moe -perm -u+x | head -1)" /tmp/test_cuda_moe_pfnext
extra="$extra /tmp/bench_cuda_model_pfnext /tmp/test_cuda_moe_pfnext"
git checkout -- src tests
trap - EXIT
BUNDLE_TARGETS="bench_cuda_model test_backend_ops" BUNDLE_EXTRA_BINS="$extra" \
  bash scripts/build_gpu_bundle.sh
rm -f .gpu_pack/tokenizers.tar.xz
ls -la .gpu_pack
