#!/usr/bin/env bash
set -u
rm -rf .gpu_bin .gpu_libs; tar -xJf .gpu_pack/bundle.tar.xz
ROOT=$(pwd); source "$ROOT/scripts/gpu_libpath.sh"; export DI_SOURCE_DIR=$ROOT
B=.gpu_bin
S=$OUT/summary.txt
for t in test_cuda_moe test_cuda_golden; do
  echo "== $t" | tee -a $S
  timeout 240 $B/$t > $OUT/$t.log 2>&1; echo "rc=$?" | tee -a $S
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|decode_t1_pipelined_down|vs_slot=[1-9]" $OUT/$t.log | tail -8 | tee -a $S
done
run() { local tag=$1 preset=$2 conc=$3; shift 3
  r=$(env "$@" timeout 120 $B/bench_cuda_model --preset $preset --conc $conc --ctx 2048 --reps 10 2>&1 | grep "^\[model\] preset")
  echo "$tag $preset c=$conc $r" | tee -a $S; }
for round in 1 2; do
  run def qwen3-30b-a3b 1 X=0
  run old_pipe qwen3-30b-a3b 1 DEEPINFER_MOE_T1_DOWN=pipe
  run c4_occ2 qwen3-30b-a3b 1 DEEPINFER_MOE_T1_SLOT_C=4 DEEPINFER_MOE_T1_SLOT_OCC=2
  run c2_occ3 qwen3-30b-a3b 1 DEEPINFER_MOE_T1_SLOT_C=2 DEEPINFER_MOE_T1_SLOT_OCC=3
  run def deepseek-v2-lite 1 X=0
  run old_smem deepseek-v2-lite 1 DEEPINFER_MOE_T1_DOWN=smem
  run c2_occ2 deepseek-v2-lite 1 DEEPINFER_MOE_T1_SLOT_C=2 DEEPINFER_MOE_T1_SLOT_OCC=2
  run c1_occ3 deepseek-v2-lite 1 DEEPINFER_MOE_T1_SLOT_C=1 DEEPINFER_MOE_T1_SLOT_OCC=3
done
