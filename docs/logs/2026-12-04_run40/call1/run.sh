#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
echo "== switch test GqaDecodeMma.*" | tee -a $S
timeout 240 $B/test_backend_ops --gtest_filter='GqaDecodeMma.*' > $OUT/switch_test.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|one-barrier merge:|Failure" $OUT/switch_test.log | head -20 | tee -a $S
grep -c "PASS$" $OUT/switch_test.log | sed 's/^/PASS lines: /' | tee -a $S
grep -c "FAIL$" $OUT/switch_test.log | sed 's/^/FAIL lines: /' | tee -a $S
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 90 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset")
  echo "$tag $preset c=$conc $r" | tee -a $S; }
echo "== A/B" | tee -a $S
for round in 1 2 3; do
  run def qwen3-30b-a3b 1 X=0
  run mw qwen3-30b-a3b 1 DEEPINFER_GQA_MMA_MERGE_WARP=1
done
for round in 1 2; do
  run def llama3-8b 1 X=0
  run mw llama3-8b 1 DEEPINFER_GQA_MMA_MERGE_WARP=1
  run def deepseek-v2-lite 1 X=0
  run deep deepseek-v2-lite 1 DEEPINFER_MOE_T1_SMEM=deep
done
run def qwen3-30b-a3b 32 X=0
run mw qwen3-30b-a3b 32 DEEPINFER_GQA_MMA_MERGE_WARP=1
echo "== traces" | tee -a $S
for preset in qwen3-30b-a3b deepseek-v2-lite; do
  timeout 120 $B/bench_cuda_model_trace --preset $preset --conc 1 --ctx 2048 --reps 10 --trace $OUT/trace_$preset.csv > $OUT/trace_$preset.log 2>&1
  python3 scripts/trace_layers.py $OUT/trace_$preset.csv > $OUT/trace_layers_$preset.txt 2>&1
  head -30 $OUT/trace_layers_$preset.txt | tee -a $S
  xz -9 $OUT/trace_$preset.csv
done
DEEPINFER_GQA_MMA_MERGE_WARP=1 timeout 120 $B/bench_cuda_model_trace --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 10 --trace $OUT/trace_qwen3_mw.csv > /dev/null 2>&1
python3 scripts/trace_layers.py $OUT/trace_qwen3_mw.csv > $OUT/trace_layers_qwen3_mw.txt 2>&1
xz -9 $OUT/trace_qwen3_mw.csv
