# GPU step (sourced by scripts/gpu_check.sh): HF transformers `generate` on the MoE presets with
# random bf16 weights at batch 1 and 32, 2048-token prompts (scripts/bench_hf_moe.py): the
# same-run baselines of issue #6's tables.
if python3 -c 'import torch, transformers' 2>/dev/null; then
  run_step hf_v2lite 150 python3 scripts/bench_hf_moe.py --preset deepseek-v2-lite --batches 1,32
  run_step hf_qwen3moe 150 python3 scripts/bench_hf_moe.py --preset qwen3-30b-a3b --batches 1,32
  grep -h '^\[hf\]' "$OUT/hf_v2lite.log" "$OUT/hf_qwen3moe.log" >>"$OUT/summary_extra.txt"
  grep -h -E 'Error|error' "$OUT/hf_v2lite.log" "$OUT/hf_qwen3moe.log" | tail -4 >>"$OUT/summary_extra.txt"
fi
