#!/usr/bin/env bash
# One device call for A/Bs (run on the GPU machine from the repository root, on the bundle of
# scripts/build_gpu_bundle.sh, carry [".gpu_pack"]): unpacks the bundle, runs the test steps
# named in ONLY, then the decode benchmark arms of AB interleaved for ROUNDS rounds, then the
# shell in EXTRA. Logs under $OUT; the [step] / [model] lines on stdout.
#
#   ONLY="ops gemv_ops8 golden moe mla gemv_bench"      (any subset, in that order or another)
#   AB="tag|preset|conc|ENV=V ENV=V;tag|preset|conc|"  (BIN=name among the assignments: that
#                                                      binary of .gpu_bin instead of bench_cuda_model,
#                                                      e.g. a baseline from BUNDLE_EXTRA_BINS)
#   ROUNDS=3 EXTRA='grep ... $OUT/gemv_bench.log' bash scripts/gpu_ab.sh
#
# Every arm is one `bench_cuda_model --preset P --conc C --ctx 2048 --reps 10 --tag TAG<round>`.
set -u
ROOT=$(pwd); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export DI_SOURCE_DIR=$ROOT
if [ -f .gpu_pack/bundle.tar.xz ]; then rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz; fi
source "$ROOT/scripts/gpu_libpath.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/env.txt" 2>&1
t0=$(date +%s)
for step in ${ONLY:-}; do
  s0=$(date +%s)
  case $step in
    ops) timeout 300 .gpu_bin/test_backend_ops --gtest_color=no > "$OUT/ops.log" 2>&1; rc=$? ;;
    gemv_ops8) DEEPINFER_GEMV_MAX_ROWS=8 timeout 120 .gpu_bin/test_backend_ops --gtest_color=no --gtest_filter='*fused_linear*:FusedLinearGemv.*' > "$OUT/gemv_ops8.log" 2>&1; rc=$? ;;
    golden) timeout 200 .gpu_bin/test_cuda_golden --gtest_color=no > "$OUT/golden.log" 2>&1; rc=$? ;;
    moe) timeout 200 .gpu_bin/test_cuda_moe --gtest_color=no > "$OUT/moe.log" 2>&1; rc=$? ;;
    mla) timeout 200 .gpu_bin/test_cuda_mla --gtest_color=no > "$OUT/mla.log" 2>&1; rc=$? ;;
    gemv_bench) timeout 200 .gpu_bin/bench_cuda_gemv > "$OUT/gemv_bench.log" 2>&1; rc=$? ;;
    *) echo "unknown step $step"; rc=99 ;;
  esac
  log="$OUT/$step.log"
  echo "[step] $step rc=$rc $(( $(date +%s) - s0 )) s  passed=$(grep -c '^\[       OK \]' "$log" 2>/dev/null) failed=$(grep -c '^\[  FAILED  \].*(' "$log" 2>/dev/null)"
  grep -h '^\[  FAILED  \].*(' "$log" 2>/dev/null | head -8
done
if [ -n "${AB:-}" ]; then
  IFS=';' read -ra arms <<<"$AB"
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for arm in "${arms[@]}"; do
      IFS='|' read -r tag preset conc envs <<<"$arm"
      bin=bench_cuda_model; case " $envs " in *" BIN="*) bin=${envs##*BIN=}; bin=${bin%% *};; esac; line=$(env $envs timeout 120 .gpu_bin/$bin --preset "$preset" --conc "$conc" --ctx 2048 --reps 10 --tag "$tag$round" 2>>"$OUT/ab_err.log" | grep '^\[model\]')
      echo "$line env=${envs:-none}" | tee -a "$OUT/ab.txt"
    done
  done
fi
if [ -n "${EXTRA:-}" ]; then bash -c "$EXTRA"; fi
echo "[total] $(( $(date +%s) - t0 )) s"
