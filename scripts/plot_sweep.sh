#!/usr/bin/env bash
# Draws the Pareto PNGs of a `deepinfer bench sweep` output directory that was written on another
# machine (the GPU machine has no gnuplot: scripts/gpu_steps/90_sweep.sh passes --gnuplot true):
# the .gp scripts name that machine's paths, so they are rewritten to this directory first.
#   scripts/plot_sweep.sh docs/logs/<run>/sweep_llama8b
set -euo pipefail
dir=$(cd "$1" && pwd)
for gp in "$dir"/pareto.gp "$dir"/ttft_vs_throughput.gp; do
  [ -f "$gp" ] || { echo "plot_sweep: $gp missing" >&2; exit 1; }
  # Every quoted path in the script: keep the file name, put it in $dir.
  sed -E "s#'[^']*/([^/']+\.(png|dat))'#'$dir/\1'#g" "$gp" >"$gp.local"
  gnuplot "$gp.local"
  rm -f "$gp.local"
done
ls -la "$dir"/*.png
