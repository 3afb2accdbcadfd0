# GPU step (sourced by scripts/gpu_check.sh): what a PDL dependent's first read of its input
# waits for after griddepcontrol.wait (bench/cuda/bench_cuda_xread.cu, run 41): 0-128 KB per SM
# of its own weight loads in flight, one shared x or a copy per CTA, and weights on odd-numbered
# SMs only (ctas=loading / idle_sm; run 42: 0.57 / 0.27 us against 2.17 when every SM loads 128
# KB: a queue shared by all SMs, not the reader's own). Step name: xread; [xread] lines into the
# summary.
if [ -x .gpu_bin/bench_cuda_xread ]; then
  run_step xread 60 .gpu_bin/bench_cuda_xread --reps 20
  grep -E '^\[xread\]' "$OUT/xread.log" >>"$OUT/summary_extra.txt"
fi
