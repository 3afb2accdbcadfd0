#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, on the bundle from scripts/build_gpu_bundle.sh
# (carry .gpu_bin and .gpu_libs): every CUDA op test, the golden models and graph test, the
# Llama-3.1-8B-shaped benchmark and the HF transformers baseline. Each step has a timeout; a
# failing step never stops the next. Full logs under $OUT; a short table at the end.
# Total worst case ~7.5 min (the timeouts below).
set -u
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
ROOT=$(pwd)
export DI_SOURCE_DIR=$ROOT
# The bundle may come packed (scripts/build_gpu_bundle.sh writes .gpu_pack/bundle.tar.xz). A
# warm device machine keeps the last call's .gpu_bin (ignored paths survive): unpack whenever the
# bundle is newer, else a second call would run the first call's binaries.
if [ -f .gpu_pack/bundle.tar.xz ] && { [ ! -d .gpu_bin ] || [ .gpu_pack/bundle.tar.xz -nt .gpu_bin ]; }; then
  rm -rf .gpu_bin .gpu_libs
  tar -xJf .gpu_pack/bundle.tar.xz
  touch .gpu_bin
fi
source "$ROOT/scripts/gpu_libpath.sh"

{
  echo "date: $(date -u)"
  nvidia-smi 2>&1 | head -15
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  for b in .gpu_bin/*; do echo "== ldd $b"; ldd "$b"; done
} >"$OUT/env.txt" 2>&1
missing=$(for b in .gpu_bin/*; do ldd "$b" 2>/dev/null; done | grep 'not found' | sort -u)

declare -a names rcs secs
# Whole-run budget (the device session's time is scarce): a step gets at most what is left of it,
# and steps past it are skipped (rc=skip in the table). GPU_CHECK_SKIP="name name ..." skips
# steps by name (e.g. what an earlier run of the same binaries already measured);
# GPU_CHECK_ONLY="glob glob ..." runs only the steps whose name matches one of the globs
# (e.g. "ops golden dp_* dpscale_*"; "hf" for the HF baseline).
BUDGET_S=${GPU_CHECK_BUDGET_S:-1000000}
BUDGET_S=${BUDGET_S%.*}
RUN_T0=$(date +%s)
step_selected() {  # name: true unless GPU_CHECK_ONLY is set and no glob of it matches
  [ -z "${GPU_CHECK_ONLY:-}" ] && return 0
  local - pat
  set -f  # the globs are step-name patterns, not file names
  for pat in $GPU_CHECK_ONLY; do
    # shellcheck disable=SC2053
    [[ $1 == $pat ]] && return 0
  done
  return 1
}
group_selected() {  # prefix: could GPU_CHECK_ONLY select a step named prefix...? (skip setup)
  [ -z "${GPU_CHECK_ONLY:-}" ] && return 0
  local - pat
  set -f
  for pat in $GPU_CHECK_ONLY; do
    # shellcheck disable=SC2053
    [[ $pat == "$1"* || $1 == $pat ]] && return 0
  done
  return 1
}
run_step() {  # name timeout_s command...
  local name=$1 limit=$2
  shift 2
  case " ${GPU_CHECK_SKIP:-} " in
    *" $name "*)
      names+=("$name"); rcs+=("skip"); secs+=(0)
      echo "[gpu_check] $name skipped: GPU_CHECK_SKIP" | tee "$OUT/$name.log"
      return ;;
  esac
  if ! step_selected "$name"; then
    names+=("$name"); rcs+=("skip"); secs+=(0)
    echo "[gpu_check] $name skipped: not in GPU_CHECK_ONLY" >"$OUT/$name.log"
    return
  fi
  local left=$((BUDGET_S - ($(date +%s) - RUN_T0)))
  if [ "$left" -lt 5 ]; then
    names+=("$name"); rcs+=("skip"); secs+=(0)
    echo "[gpu_check] $name skipped: budget spent" | tee "$OUT/$name.log"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  names+=("$name")
  rcs+=("$rc")
  secs+=("$(($(date +%s) - t0))")
  echo "[gpu_check] $name rc=$rc ($(($(date +%s) - t0)) s)"
}

run_step ops 160 .gpu_bin/test_backend_ops --gtest_color=no
# A kernel fault (illegal address) is sticky for the whole process: rerun each failed op test
# alone so one bad kernel does not hide the others' results.
if [ "${rcs[0]}" != 0 ]; then
  failed=$(sed -n 's/^\[  FAILED  \] \([^ ,]*\).*(.*/\1/p' "$OUT/ops.log" | head -60)
  : >"$OUT/ops_isolated.log"
  t0=$(date +%s)
  for t in $failed; do
    [ $(($(date +%s) - t0)) -gt 60 ] && break
    if timeout 20 .gpu_bin/test_backend_ops --gtest_color=no --gtest_filter="$t" >>"$OUT/ops_isolated.log" 2>&1; then
      echo "ALONE-PASS $t" >>"$OUT/ops_isolated.log"
    else
      echo "ALONE-FAIL $t" >>"$OUT/ops_isolated.log"
    fi
  done
fi
run_step golden 90 .gpu_bin/test_cuda_golden --gtest_color=no
if [ -x .gpu_bin/bench_cuda_llama ]; then
  run_step bench 200 .gpu_bin/bench_cuda_llama
fi
# More steps, one file per subsystem (scripts/gpu_steps/*.sh, sourced in name order): each calls
# run_step NAME TIMEOUT CMD... and may append lines to $OUT/summary_extra.txt for the table.
for f in scripts/gpu_steps/*.sh; do
  [ -e "$f" ] && . "$f"
done
if [[ " ${GPU_CHECK_SKIP:-} " == *" hf "* ]] || ! step_selected hf; then
  echo "[hf] skipped: GPU_CHECK_SKIP" >"$OUT/hf.log"
elif python3 -c 'import torch, transformers' >/dev/null 2>&1; then
  run_step hf 75 python3 scripts/bench_hf_llama.py
else
  echo "[hf] skipped: torch/transformers not importable" >"$OUT/hf.log"
fi

echo
echo "================ gpu_check summary ================"
[ -n "$missing" ] && echo "MISSING LIBRARIES: $missing"
printf '%-8s %5s %6s  %s\n' step rc secs result
for i in "${!names[@]}"; do
  n=${names[$i]}
  log="$OUT/$n.log"
  res=""
  case $n in
    ops | golden)
      p=$(grep -c '^\[       OK \]' "$log")
      f=$(grep -c '^\[  FAILED  \].*(' "$log")
      s=$(grep -c '^\[  SKIPPED \].*(' "$log")
      res="$p ok, $f failed, $s skipped" ;;
    bench) res="$(grep -c '^\[bench\]' "$log") measurements" ;;
    hf) res=$(grep '^\[hf\]' "$log" | tail -1) ;;
  esac
  [ "${rcs[$i]}" = 124 ] || [ "${rcs[$i]}" = 137 ] && res="TIMEOUT; $res"
  printf '%-8s %5s %6s  %s\n' "$n" "${rcs[$i]}" "${secs[$i]}" "$res"
done
if [ -s "$OUT/ops_isolated.log" ]; then
  echo "---- failed op tests rerun alone: $(grep -c ALONE-PASS "$OUT/ops_isolated.log") pass, $(grep -c ALONE-FAIL "$OUT/ops_isolated.log") fail ----"
  grep -h '^ALONE-FAIL' "$OUT/ops_isolated.log" | head -15
  grep -h 'FAIL$' "$OUT/ops_isolated.log" | head -15
fi
echo "---- failing ops (first 25) ----"
grep -h 'FAIL$' "$OUT/ops.log" 2>/dev/null | head -25
grep -h '^\[sample\]' "$OUT/ops.log" 2>/dev/null | head -5
grep -h -B2 -A8 'Failure' "$OUT/ops.log" 2>/dev/null | grep -v '^\[op\]' | head -20
echo "---- golden (worst logit error, greedy flips per model) ----"
awk '/^\[golden\]/ { m=$2; e=$0; sub(/.*max_rel_err=/, "", e); sub(/ .*/, "", e);
       if (e+0 > w[m]) w[m]=e+0; n[m]++; if ($0 ~ /flip/) f[m]++ }
     END { for (m in w) printf "%-14s worst max_rel_err %.3e, %d/%d runs with a greedy flip\n", m, w[m], f[m], n[m] }' \
  "$OUT/golden.log" 2>/dev/null
grep -h '^\[graph\]' "$OUT/golden.log" 2>/dev/null
grep -h -A6 'Failure' "$OUT/golden.log" 2>/dev/null | head -12
grep -h -E 'what\(\)|terminate|error' "$OUT/golden.log" "$OUT/ops.log" 2>/dev/null | head -5
echo "---- bench ----"
grep -h -E '^\[bench\]|error|Error' "$OUT/bench.log" 2>/dev/null | head -30
grep -h -E '^\[hf\]|Error' "$OUT/hf.log" 2>/dev/null | tail -3
[ -s "$OUT/summary_extra.txt" ] && { echo "---- more ----"; cat "$OUT/summary_extra.txt"; }
echo "logs: $OUT"
