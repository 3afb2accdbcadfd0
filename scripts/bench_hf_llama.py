#!/usr/bin/env python3
"""HF transformers baseline for bench_cuda_llama: Llama-3.1-8B architecture with random bf16
weights on one GPU, batch 1, 512-token prompt, decode tok/s of `generate` (greedy, no EOS stop).

    python3 scripts/bench_hf_llama.py [--new-tokens 64] [--layers 32]
Prints one line: [hf] decode batch 1 ctx 512: X tok/s (..)
"""
import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--layers", type=int, default=32)
    args = ap.parse_args()
    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=args.layers, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, args.prompt), device="cuda")
    gen = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, **gen)  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **gen)  # prefill only
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, **gen)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
    n = out.shape[1] - args.prompt
    decode_s = (t2 - t1) - (t1 - t0)
    print(f"[hf] decode batch 1 ctx {args.prompt}: {(n - 1) / decode_s:.1f} tok/s "
          f"({n} new tokens, prefill {1e3 * (t1 - t0):.1f} ms, transformers generate, bf16)")


if __name__ == "__main__":
    main()
