#!/usr/bin/env bash
# On a GPU machine: `deepinfer serve --dp-size N` (DP attention + EP over NCCL, issue #8) against
# the plain engine (no --dp-size) on the same concurrent greedy requests. Prints one line per
# request and a summary; exit status 0 only if every text is identical, both servers exited 0,
# and the group reported its ranks in /metrics.
#
#   scripts/gpu_check_dp.sh [N|auto] [deepinfer binary] [model dir] [backend]
#   defaults: auto build/bin/deepinfer models/deepinfer-demo-code cuda-fp32
# Extra serve flags: DI_DP_SERVE_ARGS="--kv-cache-mb 4096 --random-weights" (both servers),
# DI_DP_GROUP_ARGS="--eplb ..." (the group only: EPLB in the group vs a plain engine without). Logs in
# ${OUT:-/tmp}/dp_{plain,group}.log. LD_LIBRARY_PATH gets libnccl.so.2 as in scripts/ep_launch.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
dp=${1:-auto}
bin=${2:-build/bin/deepinfer}
model=${3:-models/deepinfer-demo-code}
backend=${4:-cuda-fp32}
out=${OUT:-/tmp}
mkdir -p "$out"

. scripts/nccl_env.sh  # libnccl.so.2 (not in the bundle), NVLS off, NCCL_SHM_DISABLE on a small /dev/shm
echo "[dp-check] libnccl dir: ${nccl_dir:-(the linker cache)}"

# shellcheck disable=SC2086
common=(serve --backend "$backend" --model "$model" --port 0 --block-size 16 ${DI_DP_SERVE_ARGS:-})
"$bin" "${common[@]}" >"$out/dp_plain.log" 2>&1 &
plain_pid=$!
# shellcheck disable=SC2086
"$bin" "${common[@]}" --dp-size "$dp" ${DI_DP_GROUP_ARGS:-} >"$out/dp_group.log" 2>&1 &
group_pid=$!
port_of() {  # waits up to 240 s for the "listening on" line
  for _ in $(seq 480); do
    p=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$1" | head -1)
    [ -n "$p" ] && { echo "$p"; return 0; }
    sleep 0.5
  done
  return 1
}
plain_port=$(port_of "$out/dp_plain.log") || { echo "[dp-check] plain server did not start"; tail -20 "$out/dp_plain.log"; }
group_port=$(port_of "$out/dp_group.log") || { echo "[dp-check] group server did not start"; tail -20 "$out/dp_group.log"; }
status=1
if [ -n "${plain_port:-}" ] && [ -n "${group_port:-}" ]; then
  grep -h "dp-size\|DP group\|NCCL\|EPLB" "$out/dp_group.log" | sed 's/^/[dp-check] group log: /'
  python3 - "$plain_port" "$group_port" "$(basename "$model")" <<'PY'
import json, sys, threading, urllib.request
plain, group, name = sys.argv[1], sys.argv[2], sys.argv[3]
prompts = ["def fibonacci(n):", "Write a Python function that reverses a list.", "class Stack:",
           "SELECT name FROM users WHERE", "Sort an array in JavaScript", "import numpy as np\n",
           "// quicksort in C\n", "Explain recursion:", "fn main() {", "#include <stdio.h>\n",
           "The quick brown fox", "public static void main("]
def complete(port, i, out):
    body = json.dumps({"model": name, "prompt": prompts[i], "max_tokens": 8 + 5 * (i % 5),
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        out[i] = json.loads(r.read())["choices"][0]["text"]
def run(port):
    out = [None] * len(prompts)
    ts = [threading.Thread(target=complete, args=(port, i, out)) for i in range(len(prompts))]
    for t in ts: t.start()
    for t in ts: t.join()
    return out
a, b = run(plain), run(group)
b2 = run(group)  # again, warm (prefix cache)
same = sum(x == y for x, y in zip(a, b)) + sum(x == y for x, y in zip(a, b2))
for i, (x, y) in enumerate(zip(a, b)):
    print(f"[dp-check] request {i}: {'same' if x == y else 'DIFFERENT'} plain={x!r} group={y!r}")
m = urllib.request.urlopen(f"http://127.0.0.1:{group}/metrics").read().decode()
keep = [l for l in m.splitlines() if l.startswith(("deepinfer_dp_", "deepinfer_engine_padding",
        "deepinfer_engine_steps", "deepinfer_kv_blocks_total", "deepinfer_engine_requests_finished"))]
for l in keep: print("[dp-check] metric", l)
ok = same == 2 * len(prompts) and any(l.startswith("deepinfer_dp_size") for l in keep)
print(f"[dp-check] identical {same}/{2 * len(prompts)} -> {'ok' if ok else 'MISMATCH'}")
sys.exit(0 if ok else 1)
PY
  status=$?
fi
kill -TERM "$plain_pid" "$group_pid" 2>/dev/null
wait "$plain_pid"; rc_plain=$?
wait "$group_pid"; rc_group=$?
echo "[dp-check] exit codes: plain $rc_plain, group $rc_group"
[ "$rc_plain" -eq 0 ] && [ "$rc_group" -eq 0 ] || status=1
tail -5 "$out/dp_group.log" | sed 's/^/[dp-check] group log: /'
exit "$status"
