# Serving Pareto sweeps on the GPU (issue #7): the real `deepinfer serve --backend cuda` with
# random weights made on the device (`--random-weights`, config from `make-model --config-only`)
# and a real tokenizer, driven by `deepinfer bench sweep` (random dataset, 1024 in / 128 out,
# concurrency 1..256). Llama-3.1-8B shape with the Llama 3 tokenizer; DeepSeek-V2-Lite shape with
# the DeepSeek-V3 tokenizer (vocab set to its 129,280: the V2 tokenizer is not available here; the
# larger vocabulary adds 0.1 GB to the 31 GB read per step). gnuplot is not on the GPU machine:
# the sweep writes sweep.json / sweep.dat / *.gp there (--gnuplot true) and the PNGs are drawn
# from them afterwards (scripts/plot_sweep.sh). Output under $OUT/sweep_<name>/.
if group_selected sweep_ && [ -x .gpu_bin/deepinfer ] && [ -f .gpu_pack/tokenizers.tar.xz ]; then
  mkdir -p /tmp/di_tok && tar -xJf .gpu_pack/tokenizers.tar.xz -C /tmp/di_tok
  http_get() {  # URL: body on stdout, non-zero when unreachable (curl, else python3)
    if command -v curl >/dev/null 2>&1; then curl -sf "$1"; else
      python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"
    fi
  }
  sweep_model() {  # name arch preset tokenizer vocab port
    local name=$1 arch=$2 preset=$3 tok=$4 vocab=$5 port=$6
    local dir=/tmp/di_models/$name
    rm -rf "$dir"
    .gpu_bin/deepinfer make-model --arch "$arch" --preset "$preset" --config-only \
      ${vocab:+--vocab-size "$vocab"} --out "$dir" >"$OUT/make_$name.log" 2>&1
    cp /tmp/di_tok/"$tok"/tokenizer*.json "$dir"/
    .gpu_bin/deepinfer serve --backend cuda --model "$dir" --random-weights --port "$port" \
      --kv-cache-mb 40000 --max-running 256 --max-batched-tokens 16384 \
      --max-concurrent-requests 1024 >"$OUT/serve_$name.log" 2>&1 &
    local pid=$!
    local up=0
    for _ in $(seq 1 120); do
      if http_get "http://127.0.0.1:$port/health" >/dev/null 2>&1; then up=1; break; fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if [ "$up" = 1 ]; then
      run_step "sweep_$name" 150 .gpu_bin/deepinfer bench sweep --base-url "http://127.0.0.1:$port" \
        --tokenizer "$dir" --dataset random --input-len 1024 --output-len 128 \
        --concurrency 1,8,32,128,256 --prompts-per-concurrency 1 --num-prompts 4 \
        --output-dir "$OUT/sweep_$name" --gnuplot true --no-progress
      http_get "http://127.0.0.1:$port/metrics" | grep -E '^deepinfer_(engine_graph_steps_total|engine_steps_total|generation_tokens_total) ' \
        >"$OUT/sweep_$name/metrics_tail.txt" 2>/dev/null
    else
      echo "[sweep] $name: the server did not come up (see serve_$name.log)" >>"$OUT/summary_extra.txt"
    fi
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    {
      echo "[sweep] $name: server rc=$? (143/0 = stopped by us)"
      sed -n '/^ *conc  *out tok/,$p' "$OUT/sweep_$name.log" 2>/dev/null | head -12
      grep -h -i -E 'error|failed' "$OUT/sweep_$name.log" "$OUT/serve_$name.log" 2>/dev/null | head -5
      cat "$OUT/sweep_$name/metrics_tail.txt" 2>/dev/null
    } >>"$OUT/summary_extra.txt"
  }
  sweep_model llama8b llama llama3-8b llama3 "" 8100
  sweep_model v2lite deepseek_v2 deepseek-v2-lite deepseek_v3 129280 8101
else
  echo "[sweep] skipped: .gpu_bin/deepinfer or .gpu_pack/tokenizers.tar.xz missing" >>"$OUT/summary_extra.txt"
fi
