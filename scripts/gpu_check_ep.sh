#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, on the bundle from scripts/build_ep_bundle.sh
# (carry build-cuda/ep_bundle): test_ep_nccl at EP world size 1 (one process, one GPU, NCCL self
# send/recv). Full log in $OUT/ep_nccl.log (+ gtest XML, environment); a short table at the end.
# Exit code: 0 all passed; 1 a test failed; 2 the binary cannot start (missing library);
# 3 tests skipped (no GPU seen); 124/137 a part timed out. Expected ~1 min; worst case ~6 min
# (the timeouts below).
set -u
OUT=${OUT:-/tmp/gpu_check_ep_out}
mkdir -p "$OUT"
ROOT=$(pwd)
BUNDLE=$ROOT/build-cuda/ep_bundle
BIN=$BUNDLE/test_ep_nccl
LOG=$OUT/ep_nccl.log
if [ ! -x "$BIN" ]; then
  echo "[gpu_check_ep] $BIN missing: run scripts/build_ep_bundle.sh and carry build-cuda/ep_bundle"
  exit 2
fi

# libnccl.so.2 (nccl_dir), NVLS off, NCCL_SHM_DISABLE on a small /dev/shm.
. "$ROOT/scripts/nccl_env.sh"
export LD_LIBRARY_PATH="$BUNDLE/lib:$ROOT/.gpu_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# One process on one host: bootstrap over loopback, no network transport probing.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}

{
  echo "date: $(date -u)"
  nvidia-smi 2>&1 | head -15
  echo "libnccl dir: ${nccl_dir:-(ldconfig cache)}"
  ldconfig -p 2>/dev/null | grep nccl
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  env | grep '^NCCL_'
  echo "== ldd $BIN"
  ldd "$BIN"
} >"$OUT/env.txt" 2>&1
missing=$(ldd "$BIN" 2>/dev/null | grep 'not found')
if [ -n "$missing" ]; then
  echo "[gpu_check_ep] cannot start $BIN, missing: $missing (see $OUT/env.txt)"
  exit 2
fi

# Three runs, each with its own timeout, so a hang in one cannot hide the others' results:
# the NCCL correctness tests, the N-simulated-rank loopback test, the timings.
: >"$LOG"
rc=0
t_all=$(date +%s)
run_part() {  # name timeout_s gtest_filter
  local name=$1 limit=$2 filter=$3 t0=$(date +%s) part_rc
  echo "===== part $name: --gtest_filter=$filter (timeout $limit s)" >>"$LOG"
  timeout --kill-after=5 "$limit" "$BIN" --gtest_color=no --gtest_filter="$filter" \
    --gtest_output="xml:$OUT/ep_nccl_$name.xml" >>"$LOG" 2>&1
  part_rc=$?
  echo "===== part $name: rc=$part_rc in $(($(date +%s) - t0)) s" >>"$LOG"
  echo "[gpu_check_ep] part $name rc=$part_rc ($(($(date +%s) - t0)) s)"
  [ "$part_rc" != 0 ] && rc=$part_rc
}
run_part nccl 120 '-*Timing*:*SimulatedRanks*'
run_part loopback 90 '*SimulatedRanks*'
run_part timing 120 '*Timing*'
secs=$(($(date +%s) - t_all))

# A kernel fault is sticky for the whole process: rerun each failed test alone so one bad test
# does not hide the others' results.
if [ "$rc" != 0 ]; then
  : >"$OUT/ep_nccl_isolated.log"
  for t in $(sed -n 's/^\[  FAILED  \] \([^ ,]*\).*(.*/\1/p' "$LOG" | sort -u); do
    if timeout --kill-after=5 60 "$BIN" --gtest_color=no --gtest_filter="$t" >>"$OUT/ep_nccl_isolated.log" 2>&1; then
      echo "ALONE-PASS $t" | tee -a "$OUT/ep_nccl_isolated.log"
    else
      echo "ALONE-FAIL $t" | tee -a "$OUT/ep_nccl_isolated.log"
    fi
  done
fi

echo "== test_ep_nccl (EP world size 1, one GPU): rc=$rc in ${secs} s, log $LOG"
grep -E '^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z].*\([0-9]+ ms\)' "$LOG" | sed -E 's/^\[ *([A-Z]+) *\] /\1\t/' |
  awk -F'\t' '{printf "  %-8s %s\n", $1, $2}'
grep -E '^\[ep-bench\]' "$LOG" | sed 's/^/  /'
grep -E 'Failure|rror|what\(\)|NCCL WARN|needs one CUDA GPU' "$LOG" | sort | uniq -c | sort -rn | head -8 |
  sed 's/^/  > /'
grep -E '^\[  (PASSED|FAILED) +\] [0-9]+ test' "$LOG" | sed 's/^/  /'
if [ "$rc" != 0 ]; then
  tail -5 "$LOG" | sed 's/^/  | /'
  exit "$rc"
fi
if grep -q '^\[  SKIPPED \]' "$LOG"; then
  echo "[gpu_check_ep] tests were SKIPPED: no GPU seen by the test (see $OUT/env.txt)"
  exit 3
fi
echo "[gpu_check_ep] all passed"
exit 0
