# Where a decode step goes, op by op (bench_cuda_model --profile: ProfilingBackend synchronizes
# around every op of one eager step; times are device time + one launch each, so small ops are
# overstated by a few us). Llama-3.1-8B at batch 1 (issue #5's 85% target) and DeepSeek-V2-Lite /
# Qwen3-30B-A3B at batch 1 and 32 (issue #6's 70% target). The top rows land in the summary.
if [ -x .gpu_bin/bench_cuda_model ]; then
  run_step profile_llama8b 20 .gpu_bin/bench_cuda_model --preset llama3-8b --conc 1 --ctx 512 --reps 3 --profile
  run_step profile_v2lite 25 .gpu_bin/bench_cuda_model --preset deepseek-v2-lite --conc 1,32 --ctx 2048 --reps 3 --profile
  run_step profile_qwen3moe 25 .gpu_bin/bench_cuda_model --preset qwen3-30b-a3b --conc 1 --ctx 2048 --reps 3 --profile
  for n in profile_llama8b profile_v2lite profile_qwen3moe; do
    awk '/^\[profile\]/ {print; c = 12; next} c > 0 {print; c--}' "$OUT/$n.log" >>"$OUT/summary_extra.txt"
  done
fi
