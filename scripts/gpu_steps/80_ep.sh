# Expert parallelism inside the model (issue #8): bench_cuda_ep, one process per GPU through
# scripts/ep_launch.sh (fresh unique-id file, one rank per GPU). World 1 always (the baseline and
# the EP path over NCCL's self send/recv); world 2 when this host has >= 2 GPUs.
#   [ep-golden] rank=.. world=.. model=.. tokens_same=N/N max_rel_err=.. status=ok   (EP == 1 GPU)
#   [ep-bench] world=.. conc_per_rank=.. mode=plain|ep step_ms=.. tok_s_total=..      (scaling)
# Worst case 7 min with 2 GPUs (timeouts 45 + 45 + 120 s per world); expected ~1.5 min.
# Needs .gpu_bin/bench_cuda_ep and libnccl.so.2 on the machine (found by ep_launch.sh).
if [ -x .gpu_bin/bench_cuda_ep ]; then
  ep_ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  ep_gold=(--golden tests/fixtures/golden/deepseek_v3 --golden tests/fixtures/golden/deepseek_v2
           --golden tests/fixtures/golden/qwen3_moe --golden models/deepinfer-demo-code)
  ep_worlds=(1)
  [ "$ep_ngpu" -ge 2 ] && ep_worlds+=(2)
  echo "ep: $ep_ngpu GPU(s): worlds ${ep_worlds[*]}$([ "$ep_ngpu" -lt 2 ] && echo ' (only world 1: fewer than 2 GPUs)')" \
    >>"$OUT/summary_extra.txt"
  for w in "${ep_worlds[@]}"; do
    run_step "ep_golden_w$w" 35 bash scripts/ep_launch.sh "$w" .gpu_bin/bench_cuda_ep "${ep_gold[@]}"
    run_step "ep_golden_fp32_w$w" 35 bash scripts/ep_launch.sh "$w" .gpu_bin/bench_cuda_ep --fp32 "${ep_gold[@]}"
  done
  for w in "${ep_worlds[@]}"; do
    run_step "ep_bench_w$w" 90 bash scripts/ep_launch.sh "$w" .gpu_bin/bench_cuda_ep --bench \
      --conc 1,32,128 --ctx 2048 --reps 5
  done
  for w in "${ep_worlds[@]}"; do
    for s in golden golden_fp32 bench; do
      f="$OUT/ep_${s}_w$w.log"
      [ -f "$f" ] || continue
      echo "ep_${s}_w$w: $(grep '^\[ep-launch\] world' "$f" | tail -1)"
      grep -o '\[ep-golden\].*' "$f" | sed 's/ moe_layers=.*tokens_same/ tokens_same/'
      grep -o '\[ep-bench\] world=.*' "$f"
      grep -o '\[ep\] rank=.* error=.*' "$f" | head -2
    done
  done >>"$OUT/summary_extra.txt"
else
  echo "ep: .gpu_bin/bench_cuda_ep missing" >>"$OUT/summary_extra.txt"
fi
# The EP exchanges against their host models on one GPU (tests/unit/parallel/test_ep_nccl.cpp):
# NCCL at world size 1 (throughput exchange, latency exchange captured in a CUDA graph) and 1-4
# simulated ranks through the in-process loopback transport.
if [ -x .gpu_bin/test_ep_nccl ]; then
  run_step ep_nccl 90 bash -c '. scripts/nccl_env.sh && exec .gpu_bin/test_ep_nccl --gtest_color=no'
  echo "ep_nccl (test_ep_nccl): rc=${rcs[${#rcs[@]}-1]} $(grep -c '^\[       OK \]' "$OUT/ep_nccl.log") ok, $(grep -c '^\[  FAILED  \].*(' "$OUT/ep_nccl.log") failed" \
    >>"$OUT/summary_extra.txt"
fi
