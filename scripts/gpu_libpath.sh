# Sourced by the device-side scripts (gpu_check.sh, gpu_ab.sh) with ROOT = the repository root:
# the bundle's libraries (.gpu_libs) first on LD_LIBRARY_PATH, then cuBLAS 13 where the GPU image
# keeps it when the loader does not find it.
export LD_LIBRARY_PATH="$ROOT/.gpu_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# cuBLAS 13 may live outside the default search path (CUDA toolkit dirs or pip's nvidia wheels).
if ! ldconfig -p 2>/dev/null | grep -q 'libcublasLt.so.13'; then
  cands=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64
         /usr/local/cuda-13*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu)
  for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    cands+=("$sp/nvidia/cublas/lib" "$sp/nvidia/cu13/lib" "$sp/nvidia/cuda_runtime/lib" "$sp/torch/lib")
  done
  for d in "${cands[@]}"; do
    if [ -e "$d/libcublasLt.so.13" ]; then
      export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
      break
    fi
  done
fi
