#!/usr/bin/env bash
# scripts/ep_supervise.sh with a stand-in `nvidia-smi` (4 GPUs; a GPU listed in $DEAD no longer
# answers) and a rank program that records what it was given: GPU 2 "fails" during the first run
# (its rank exits 1 and marks it dead). Expected: world 4 on GPUs 0-3, one restart, world 3 on
# GPUs 0,1,3 where every rank sees DI_EP_WORLD=3 and its own GPU, exit 0. Then every GPU dead:
# the supervisor gives up with a non-zero status. Then --single (one process for every GPU, as
# `serve --dp-size {world}`): a restart after status 75 with the world substituted, and SIGTERM
# forwarded to the server. Label cpu (no GPU needed).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export DEAD=$work/dead RECORD=$work/record DI_EP_SKIP_NCCL_SEARCH=1 DI_EP_PROBE_TIMEOUT_S=5
touch "$DEAD" "$RECORD"
mkdir -p "$work/bin"
cat >"$work/bin/nvidia-smi" <<'SMI'
#!/usr/bin/env bash
# --query-gpu=index lists 0..3; "-i G ..." fails for a dead G.
if [ "${1:-}" = "-i" ]; then
  grep -qx "$2" "$DEAD" && exit 1
  echo "00000000:0$2:00.0, 40"
  exit 0
fi
printf '0\n1\n2\n3\n'
SMI
chmod +x "$work/bin/nvidia-smi"
cat >"$work/rank.sh" <<'RANK'
#!/usr/bin/env bash
# The physical GPU of this rank: entry DI_EP_DEVICE of CUDA_VISIBLE_DEVICES.
IFS=, read -ra vis <<<"$CUDA_VISIBLE_DEVICES"
gpu=${vis[$DI_EP_DEVICE]}
echo "rank=$DI_EP_RANK world=$DI_EP_WORLD gpu=$gpu" >>"$RECORD"
if [ "$gpu" = 2 ] && ! grep -qx 2 "$DEAD"; then
  echo 2 >>"$DEAD"  # the GPU dies under this rank
  exit 1
fi
exit 0
RANK
chmod +x "$work/rank.sh"

out=$(PATH="$work/bin:$PATH" bash "$root/scripts/ep_supervise.sh" --max-restarts 2 "$work/rank.sh" 2>&1)
echo "$out"
fail() { echo "FAIL: $*"; cat "$RECORD"; exit 1; }
grep -q '\[ep-supervise\] healthy GPUs: 0 1 2 3 -> world 4' <<<"$out" || fail "first probe"
grep -q '\[ep-supervise\] restart 1: world 4 failed' <<<"$out" || fail "restart"
grep -q '\[ep-supervise\] healthy GPUs: 0 1 3 -> world 3' <<<"$out" || fail "second probe"
grep -q '\[ep-supervise\] world 3 finished (restarts: 1)' <<<"$out" || fail "finish"
second=$(grep 'world=3' "$RECORD" | sort)
[ "$(wc -l <<<"$second")" = 3 ] || fail "3 ranks in the second run"
[ "$second" = "$(printf 'rank=0 world=3 gpu=0\nrank=1 world=3 gpu=1\nrank=2 world=3 gpu=3')" ] ||
  fail "second run's ranks and GPUs: $second"

# Every GPU dead: no healthy GPU, non-zero exit, no launch.
printf '0\n1\n2\n3\n' >"$DEAD"
: >"$RECORD"
if PATH="$work/bin:$PATH" bash "$root/scripts/ep_supervise.sh" "$work/rank.sh" >"$work/out2" 2>&1; then
  fail "succeeded without GPUs"
fi
grep -q 'fewer than 1 healthy GPU' "$work/out2" || fail "give-up message: $(cat "$work/out2")"
[ ! -s "$RECORD" ] || fail "ranks ran without GPUs"
# --single: one process drives every healthy GPU (`serve --dp-size {world}`). The stand-in server
# exits 75 (what `serve` does when its NCCL group was aborted) and kills GPU 1 on its first run;
# the supervisor must restart it on GPUs 0,2,3 with "{world}" replaced by 3.
: >"$DEAD"
: >"$RECORD"
cat >"$work/server.sh" <<'SERVER'
#!/usr/bin/env bash
echo "visible=$CUDA_VISIBLE_DEVICES args=$*" >>"$RECORD"
if ! grep -qx 1 "$DEAD"; then
  echo 1 >>"$DEAD"
  exit 75
fi
exit 0
SERVER
chmod +x "$work/server.sh"
out3=$(PATH="$work/bin:$PATH" bash "$root/scripts/ep_supervise.sh" --single --max-restarts 2 \
  "$work/server.sh" serve --dp-size '{world}' --model m 2>&1)
echo "$out3"
[ "$(cat "$RECORD")" = "$(printf 'visible=0,1,2,3 args=serve --dp-size 4 --model m\nvisible=0,2,3 args=serve --dp-size 3 --model m')" ] ||
  fail "--single runs: $(cat "$RECORD")"
grep -q '\[ep-supervise\] restart 1: world 4 failed (rc 75)' <<<"$out3" || fail "--single restart"
grep -q '\[ep-supervise\] world 3 finished (restarts: 1)' <<<"$out3" || fail "--single finish"

# --single forwards SIGTERM to the server, which drains and exits 0: supervision ends with 0.
cat >"$work/long.sh" <<'LONG'
#!/usr/bin/env bash
trap 'echo stopped >>"$RECORD"; exit 0' TERM
echo started >>"$RECORD"
while true; do sleep 0.1; done
LONG
chmod +x "$work/long.sh"
: >"$RECORD"
: >"$DEAD"
PATH="$work/bin:$PATH" bash "$root/scripts/ep_supervise.sh" --single "$work/long.sh" >"$work/out4" 2>&1 &
sup=$!
for _ in $(seq 100); do grep -q started "$RECORD" && break; sleep 0.1; done
kill -TERM "$sup"
rc=0
wait "$sup" || rc=$?
[ "$rc" = 0 ] || fail "supervisor exit status after SIGTERM: $rc ($(cat "$work/out4"))"
grep -q stopped "$RECORD" || fail "the server did not get SIGTERM"
echo "PASS"
