# Sourced by the GPU-machine scripts that run NCCL (EP, the DP engine group): puts libnccl.so.2 on
# LD_LIBRARY_PATH when the loader does not already find it (the GPU bundle does not carry it; pip's
# nvidia wheels do), and turns NVLink multicast (NVLS) off (the device tool's KINDS.md).
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
  for nccl_sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    for nccl_d in "$nccl_sp/nvidia/nccl/lib" "$nccl_sp/nvidia/cu13/lib" "$nccl_sp/torch/lib"; do
      if [ -e "$nccl_d/libnccl.so.2" ]; then
        export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$nccl_d"
        break 2
      fi
    done
  done
fi
export NCCL_NVLS_ENABLE=0
