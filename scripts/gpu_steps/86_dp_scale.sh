# DP attention + EP decode throughput 1 -> N GPUs in the serving engine (issue #8): the same
# DeepSeek-V2-Lite-shaped model (random weights made on each device, same seeds on every rank;
# DeepSeek-V3 tokenizer) behind `deepinfer serve`, driven by `deepinfer bench sweep` (random
# 256-in / 256-out, concurrency = total over the group). Servers, one after another:
#   plain       no --dp-size (one GPU, the standalone engine, CUDA graphs)
#   dp1         --dp-size 1 (the group path on one GPU: NCCL self exchange, latency exchange + graphs)
#   dpN         --dp-size N (every GPU), and dpN_tput with DEEPINFER_EP_LATENCY=0 (the throughput
#               exchange everywhere, host syncs, eager: the path before the latency exchange)
# DI_DP_SCALE_CONC overrides the concurrency list. Output under $OUT/dpscale_<name>/.
if group_selected dpscale_ && [ -x .gpu_bin/deepinfer ] && [ -f .gpu_pack/tokenizers.tar.xz ]; then
  mkdir -p /tmp/di_tok && tar -xJf .gpu_pack/tokenizers.tar.xz -C /tmp/di_tok
  dps_dir=/tmp/di_models/v2lite_dp
  rm -rf "$dps_dir"
  .gpu_bin/deepinfer make-model --arch deepseek_v2 --preset deepseek-v2-lite --config-only \
    --vocab-size 129280 --out "$dps_dir" >"$OUT/make_v2lite_dp.log" 2>&1
  cp /tmp/di_tok/deepseek_v3/tokenizer*.json "$dps_dir"/
  . scripts/nccl_env.sh
  dps_ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  dps_conc=${DI_DP_SCALE_CONC:-1,8,32,64}
  dp_scale_serve() {  # name port env-assignment|"" serve-args...  (dps_run_conc: this run's list)
    local name=$1 port=$2 envset=$3
    shift 3
    local conc=${dps_run_conc:-$dps_conc}
    local o="$OUT/dpscale_$name"
    mkdir -p "$o"
    env $envset .gpu_bin/deepinfer serve --backend cuda --model "$dps_dir" --random-weights \
      --port "$port" --kv-cache-mb 20000 --max-running 128 --max-batched-tokens 16384 \
      --max-concurrent-requests 1024 "$@" >"$o/serve.log" 2>&1 &
    local pid=$! up=0
    for _ in $(seq 1 240); do
      if grep -q "listening on" "$o/serve.log" 2>/dev/null; then up=1; break; fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if [ "$up" = 1 ]; then
      run_step "dpscale_$name" 150 .gpu_bin/deepinfer bench sweep --base-url "http://127.0.0.1:$port" \
        --tokenizer "$dps_dir" --dataset random --input-len 256 --output-len 256 \
        --concurrency "$conc" --prompts-per-concurrency 1 --num-prompts 4 \
        --output-dir "$o" --gnuplot true --no-progress
      python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
        "http://127.0.0.1:$port/metrics" 2>/dev/null |
        grep -E '^deepinfer_(eplb_rebalances_total|moe_lb|engine_graph_steps_total|engine_device_sample_steps_total|engine_steps_total|engine_padding_steps_total|generation_tokens_total|engine_[a-z_]*microseconds_total)' \
        >"$o/metrics_tail.txt"
    else
      echo "[dpscale] $name: the server did not come up" >>"$OUT/summary_extra.txt"
    fi
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    {
      echo "[dpscale] $name ($envset $*): server rc=$? (143/0 = stopped by us)"
      grep -h "DP group" "$o/serve.log" | head -2
      sed -n '/^ *conc  *out tok/,$p' "$OUT/dpscale_$name.log" 2>/dev/null | head -8
      grep -h -i -E 'error|failed|graphs off' "$o/serve.log" 2>/dev/null | head -5
      cat "$o/metrics_tail.txt" 2>/dev/null
    } >>"$OUT/summary_extra.txt"
  }
  if [ -n "${DI_DP_SCALE_RUNS:-}" ]; then
    # "name|ENV=V|--dp-size 1|1,8;name2|...": a custom list (diagnostics); the optional fourth
    # field is that run's concurrency list (default DI_DP_SCALE_CONC).
    IFS=';' read -ra dps_runs <<<"$DI_DP_SCALE_RUNS"
    dps_port=8210
    for run in "${dps_runs[@]}"; do
      IFS='|' read -r dps_name dps_env dps_args dps_run_conc <<<"$run"
      # shellcheck disable=SC2086
      dp_scale_serve "$dps_name" "$dps_port" "$dps_env" $dps_args
      dps_port=$((dps_port + 1))
    done
  else
    dp_scale_serve plain 8200 ""
    dp_scale_serve dp1 8201 "" --dp-size 1
    if [ "$dps_ngpu" -ge 2 ]; then
      dp_scale_serve "dp$dps_ngpu" 8202 "" --dp-size "$dps_ngpu"
      dp_scale_serve "dp${dps_ngpu}_tput" 8203 "DEEPINFER_EP_LATENCY=0" --dp-size "$dps_ngpu"
    fi
  fi
else
  echo "[dpscale] skipped: .gpu_bin/deepinfer or .gpu_pack/tokenizers.tar.xz missing" >>"$OUT/summary_extra.txt"
fi
