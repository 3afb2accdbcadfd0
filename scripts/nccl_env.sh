# Sourced by the scripts that run NCCL on the GPU machine (ep_launch.sh, gpu_check_dp.sh,
# gpu_check_ep.sh, gpu_steps/80_ep.sh and 86_dp_scale.sh). libnccl.so.2 is not in the GPU bundle
# (218 MB): when the dynamic linker's cache lacks it, look in pip's nvidia-nccl wheel, torch and
# the CUDA toolkit, then a bounded search; `nccl_dir` is what was found (empty: the cache has it,
# or nothing was found) and it is appended to LD_LIBRARY_PATH. DI_EP_SKIP_NCCL_SEARCH=1 skips
# the search (programs without NCCL, tests). Always: NVLink multicast (NVLS) off, as the device
# tool's KINDS.md asks, and NCCL's shared-memory transport off by default when /dev/shm is small
# (containers; GPUs of one host talk over P2P/NVLink anyway). Sets `shm_kb`.
nccl_dir=""
if [ -z "${DI_EP_SKIP_NCCL_SEARCH:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
  nccl_cands=()
  nccl_d=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null) &&
    nccl_cands+=("$nccl_d")
  for nccl_sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    nccl_cands+=("$nccl_sp/nvidia/nccl/lib" "$nccl_sp/nvidia/cu13/lib" "$nccl_sp/torch/lib")
  done
  nccl_cands+=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib
               /usr/local/cuda-13*/lib64 /usr/local/cuda-13*/lib /usr/lib/x86_64-linux-gnu
               /usr/local/lib /opt/nccl/lib)
  for nccl_d in "${nccl_cands[@]}"; do
    if [ -e "$nccl_d/libnccl.so.2" ]; then nccl_dir=$nccl_d; break; fi
  done
  if [ -z "$nccl_dir" ]; then
    nccl_f=$(timeout 20 find /usr /opt /root /home -name 'libnccl.so.2*' -not -path '*/proc/*' 2>/dev/null | head -1)
    [ -n "$nccl_f" ] && nccl_dir=$(dirname "$nccl_f")
  fi
  [ -n "$nccl_dir" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$nccl_dir"
fi
export NCCL_NVLS_ENABLE=0
shm_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $2}')
if [ -n "$shm_kb" ] && [ "$shm_kb" -lt 262144 ]; then
  export NCCL_SHM_DISABLE=${NCCL_SHM_DISABLE:-1}
fi
