# Tensor-core prefill attention (issue #5, src/backend/cuda/kernels/attention_prefill_wgmma.cu and
# attention_prefill_mma.cu): the kernels vs the CPU op on ragged / cached / mixed batches, d
# 64/128, GQA 1/2/3/4/8, block sizes 1/16/48/64, through the wgmma path (must run for every d 128
# case), the mma.sync variants and the simt path. One line per run:
#   [attn_prefill] <case> ... path=wgmma|mma|simt cfg=WxM routed_mma=0|1 ran_wgmma=0|1 ... PASS|FAIL
# Timing before/after is in the core bench (bench_cuda_llama: "attention prefill 8K causal" lines).
run_step attn_prefill 60 .gpu_bin/test_cuda_attn_prefill --gtest_color=no
echo "attn_prefill (tensor-core prefill vs CPU): $(grep -c ' PASS$' "$OUT/attn_prefill.log") PASS," \
  "$(grep -c ' FAIL$' "$OUT/attn_prefill.log") FAIL, rc ${rcs[${#rcs[@]}-1]}" >>"$OUT/summary_extra.txt"
