#!/usr/bin/env bash
# Builds test_ep_nccl HERE (no GPU needed) into build-cuda and packs what the GPU machine needs
# into one git-ignored folder that travels as a `carry` path:
#   build-cuda/ep_bundle/test_ep_nccl   stripped; cudart static, NCCL dynamic (found there at run
#                                       time by scripts/gpu_check_ep.sh), GTest static
#   build-cuda/ep_bundle/lib/           shared libraries it needs that the GPU image lacks (fmt);
#                                       glibc, libstdc++/libgcc and libnccl are not copied
# Then, on the GPU machine from the repository root: scripts/gpu_check_ep.sh
#
#   scripts/build_ep_bundle.sh            # JOBS=2 by default
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}

# Reuse an existing build-cuda (other bundles share it) rather than reconfigure it.
if [ ! -f build-cuda/build.ninja ]; then
  cmake -S . -B build-cuda -G Ninja -DDI_CUDA=ON -DDI_BUILD_PYTHON=OFF -DDI_BUILD_BENCH=OFF \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build build-cuda -j"$JOBS" --target test_ep_nccl

bundle=build-cuda/ep_bundle
rm -rf "$bundle"
mkdir -p "$bundle/lib"
bin=$(find build-cuda/tests -type f -name test_ep_nccl -perm -u+x | head -1)
[ -n "$bin" ] || { echo "test_ep_nccl was not built (is NCCL next to CUDA?)" >&2; exit 1; }
cp "$bin" "$bundle/"
strip --strip-unneeded "$bundle/test_ep_nccl"

skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libstdc\+\+\.so|libgcc_s\.so|libnccl|libcudart|libcuda\.so)'
ldd "$bundle/test_ep_nccl" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    if [[ ! "$name" =~ $skip ]]; then cp -L "$path" "$bundle/lib/$name"; fi
  done

echo "bundle: $(pwd)/$bundle ($(du -sh "$bundle" | cut -f1) in all; carry: $bundle)"
ls -la "$bundle" "$bundle/lib"
