#!/usr/bin/env bash
# Launches WORLD ranks of an expert-parallel program on this host, one process per GPU
# (parallel/cuda/ep_comm.h): rank r gets DI_EP_RANK=r DI_EP_WORLD=WORLD DI_EP_DEVICE=r and, for
# WORLD > 1, a fresh unique-id file under /tmp. Output of rank r is prefixed "r<r>| " on stdout.
# When one rank fails the others are killed (they would wait in NCCL forever). Exit status 0 only
# if every rank exited 0. Run it under `timeout` (its process group is killed with it).
#
#   scripts/ep_launch.sh 2 .gpu_bin/bench_cuda_ep --golden tests/fixtures/golden/deepseek_v3
set -u
world=$1
shift

# libnccl.so.2, NVLS off, NCCL_SHM_DISABLE on a small /dev/shm (DI_EP_SKIP_NCCL_SEARCH=1: no
# library search, for programs without NCCL and tests).
. "$(dirname "$0")/nccl_env.sh"
[ -z "${DI_EP_SKIP_NCCL_SEARCH:-}" ] && echo "[ep-launch] libnccl dir: ${nccl_dir:-(the linker cache, or NOT FOUND)}"
echo "[ep-launch] /dev/shm ${shm_kb:-?} KiB NCCL_SHM_DISABLE=${NCCL_SHM_DISABLE:-unset}"
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}
export DI_EP_INIT_TIMEOUT_S=${DI_EP_INIT_TIMEOUT_S:-60}

idfile=""
if [ "$world" -gt 1 ]; then
  idfile=$(mktemp -u /tmp/di_ep_id.XXXXXXXX)
  rm -f "$idfile"
fi
logdir=$(mktemp -d /tmp/di_ep_logs.XXXXXXXX)
declare -a pids
for r in $(seq 0 $((world - 1))); do
  DI_EP_RANK=$r DI_EP_WORLD=$world DI_EP_DEVICE=$r DI_EP_UNIQUE_ID_FILE=$idfile \
    "$@" >"$logdir/rank$r.log" 2>&1 &
  pids+=($!)
done
rc=0
for _ in "${pids[@]}"; do
  wait -n
  st=$?
  if [ "$st" -ne 0 ] && [ "$rc" -eq 0 ]; then
    rc=$st  # the first failure (the ranks killed below then report 143)
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  fi
done
for r in $(seq 0 $((world - 1))); do sed "s/^/r$r| /" "$logdir/rank$r.log"; done
rm -rf "$logdir"
[ -n "$idfile" ] && rm -f "$idfile"
echo "[ep-launch] world=$world rc=$rc"
exit "$rc"
