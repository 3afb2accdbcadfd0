#!/usr/bin/env bash
# Runs an expert-parallel program on the healthy GPUs of this host and restarts it with fewer when
# a GPU fails (issue #8: "the EP size is chosen at start from the healthy GPUs found; when a GPU
# fails, the instance restarts with the new count").
#
#   scripts/ep_supervise.sh [--max-restarts K] [--min-world M] CMD [ARGS...]
#   scripts/ep_supervise.sh --single [--max-restarts K] [--min-world M] CMD [ARGS...]
#
# --single: one process drives every GPU (`deepinfer serve --dp-size {world}`, the DP engine
# group): CMD runs once with CUDA_VISIBLE_DEVICES = the healthy GPUs, every argument "{world}"
# replaced by their number. `serve` exits with status 75 when its group can no longer serve (NCCL
# aborted after a failure), and exits 0 on SIGTERM; a 0 ends supervision, anything else restarts.
#   scripts/ep_supervise.sh --single deepinfer serve --backend cuda --dp-size {world} --model M
#
# 1. Probe: every GPU nvidia-smi lists is healthy when `nvidia-smi -i G --query-gpu=...` answers
#    within DI_EP_PROBE_TIMEOUT_S (default 10) and, if DI_EP_PROBE_CMD is set, that command
#    succeeds with CUDA_VISIBLE_DEVICES=G (e.g. a small allocation + kernel).
# 2. Launch: scripts/ep_launch.sh with WORLD = number of healthy GPUs and CUDA_VISIBLE_DEVICES =
#    their indices (rank r drives the r-th of them).
# 3. Exit 0 when every rank exits 0. Otherwise probe again, drop the GPUs that fail now, and
#    relaunch with the new count (at most K restarts, default 3; never below M ranks, default 1).
#    A failure with every GPU still healthy restarts with the same GPUs (a crash, not a GPU loss).
# Lines: "[ep-supervise] healthy GPUs: 0 1 ... -> world N", "[ep-supervise] restart k: ...".
set -u
max_restarts=3
min_world=1
single=0
while [ $# -gt 0 ]; do
  case $1 in
    --single) single=1; shift ;;
    --max-restarts) max_restarts=$2; shift 2 ;;
    --min-world) min_world=$2; shift 2 ;;
    *) break ;;
  esac
done
if [ $# -eq 0 ]; then
  echo "usage: scripts/ep_supervise.sh [--single] [--max-restarts K] [--min-world M] CMD [ARGS...]" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)

probe() {  # prints the indices of the healthy GPUs
  local t=${DI_EP_PROBE_TIMEOUT_S:-10} g
  for g in $(timeout "$t" nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null); do
    timeout "$t" nvidia-smi -i "$g" --query-gpu=pci.bus_id,temperature.gpu --format=csv,noheader \
      >/dev/null 2>&1 || continue
    if [ -n "${DI_EP_PROBE_CMD:-}" ]; then
      CUDA_VISIBLE_DEVICES=$g timeout "$t" bash -c "$DI_EP_PROBE_CMD" >/dev/null 2>&1 || continue
    fi
    printf '%s ' "$g"
  done
}

restarts=0
while true; do
  gpus=$(probe)
  gpus=${gpus% }
  world=$(wc -w <<<"$gpus")
  echo "[ep-supervise] healthy GPUs: ${gpus:-none} -> world $world"
  if [ "$world" -lt "$min_world" ]; then
    echo "[ep-supervise] fewer than $min_world healthy GPU(s): giving up"
    exit 1
  fi
  if [ "$single" = 1 ]; then
    args=()
    for a in "$@"; do args+=("${a//\{world\}/$world}"); done
    CUDA_VISIBLE_DEVICES=$(tr ' ' ',' <<<"$gpus") "${args[@]}" &
    child=$!
    # Forward a stop request to the child (serve drains its requests and exits 0).
    trap 'kill -TERM "$child" 2>/dev/null' TERM INT
    wait "$child"
    rc=$?
    if kill -0 "$child" 2>/dev/null; then wait "$child"; rc=$?; fi  # wait was interrupted
    trap - TERM INT
  else
    CUDA_VISIBLE_DEVICES=$(tr ' ' ',' <<<"$gpus") bash "$here/ep_launch.sh" "$world" "$@"
    rc=$?
  fi
  if [ "$rc" -eq 0 ]; then
    echo "[ep-supervise] world $world finished (restarts: $restarts)"
    exit 0
  fi
  if [ "$restarts" -ge "$max_restarts" ]; then
    echo "[ep-supervise] world $world failed (rc $rc) after $restarts restart(s): giving up"
    exit "$rc"
  fi
  restarts=$((restarts + 1))
  echo "[ep-supervise] restart $restarts: world $world failed (rc $rc); probing again"
done
