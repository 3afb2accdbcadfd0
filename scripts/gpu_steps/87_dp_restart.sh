# Restart with fewer GPUs (issue #8), on real GPUs: scripts/ep_supervise.sh --single runs
# `serve --dp-size {world}` on every healthy GPU; then GPU 1 is made to fail its health probe (a
# marker file that DI_EP_PROBE_CMD checks) and the server process is killed (the crash a lost GPU
# causes), and the supervisor must restart it on the remaining GPUs with the smaller world, which
# must serve a completion again. Needs 2+ GPUs. Summary: "[dp-restart] ..." lines.
if step_selected dp_restart && [ -x .gpu_bin/deepinfer ] && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  rs_dir="$OUT/dp_restart"
  mkdir -p "$rs_dir"
  rm -f /tmp/di_dead_gpu_*
  . scripts/nccl_env.sh
  rs_port=8290
  export DI_EP_PROBE_CMD='test ! -e /tmp/di_dead_gpu_$CUDA_VISIBLE_DEVICES'
  scripts/ep_supervise.sh --single --max-restarts 2 .gpu_bin/deepinfer serve --backend cuda \
    --dp-size '{world}' --model models/deepinfer-demo-code --port "$rs_port" --kv-cache-mb 2048 \
    >"$rs_dir/supervise.log" 2>&1 &
  rs_sup=$!
  rs_complete() {  # prints the completion's text or nothing
    python3 - "$rs_port" <<'PY' 2>/dev/null
import json, sys, urllib.request
req = urllib.request.Request(
    f"http://127.0.0.1:{sys.argv[1]}/v1/completions",
    data=json.dumps({"model": "deepinfer-demo-code", "prompt": "def add(a, b):",
                     "max_tokens": 16, "temperature": 0}).encode(),
    headers={"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["text"].replace("\n", "\\n"))
PY
  }
  rs_wait_listening() {  # n-th "listening on" line
    for _ in $(seq 1 240); do
      [ "$(grep -c 'listening on' "$rs_dir/supervise.log")" -ge "$1" ] && return 0
      sleep 0.5
    done
    return 1
  }
  if rs_wait_listening 1; then
    first=$(rs_complete)
    echo "[dp-restart] $(grep -m1 'healthy GPUs' "$rs_dir/supervise.log"); completion: '${first}'" >>"$OUT/summary_extra.txt"
    touch /tmp/di_dead_gpu_1
    pkill -KILL -P "$rs_sup" 2>/dev/null  # the server: the supervisor's child (not itself)
    if rs_wait_listening 2; then
      second=$(rs_complete)
      echo "[dp-restart] after GPU 1 failed: $(grep 'healthy GPUs' "$rs_dir/supervise.log" | tail -1); $(grep -m1 'restart 1' "$rs_dir/supervise.log"); $(grep 'DP group: [0-9]* ranks' "$rs_dir/supervise.log" | tail -1 | sed 's/.*DP group: \([0-9]* ranks ([^)]*)\).*/\1/'); completion: '${second}' (same as before: $([ "$first" = "$second" ] && echo yes || echo no))" >>"$OUT/summary_extra.txt"
    else
      echo "[dp-restart] FAILED: no restart after GPU 1 failed" >>"$OUT/summary_extra.txt"
    fi
  else
    echo "[dp-restart] FAILED: the first server did not come up" >>"$OUT/summary_extra.txt"
  fi
  kill -TERM "$rs_sup" 2>/dev/null
  wait "$rs_sup"
  echo "[dp-restart] supervisor exit $? after SIGTERM (0 = the server drained and stopped)" >>"$OUT/summary_extra.txt"
  rm -f /tmp/di_dead_gpu_*
  unset DI_EP_PROBE_CMD
fi
