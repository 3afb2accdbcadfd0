# GPU step (sourced by scripts/gpu_check.sh): what a dependency between decode kernels costs apart
# from their work (bench/cuda/bench_cuda_launch.cu): kernel chains as plain launches and as PDL
# dependents, a grid barrier inside one kernel, and launches in thread-block clusters by size,
# CTA count and shared memory. Seconds; [launch] lines into the summary.
if [ -x .gpu_bin/bench_cuda_launch ]; then
  run_step launch_costs 60 .gpu_bin/bench_cuda_launch --reps 20
  grep -E '^\[launch\] (chain|barrier|flags)' "$OUT/launch_costs.log" >>"$OUT/summary_extra.txt"
fi
