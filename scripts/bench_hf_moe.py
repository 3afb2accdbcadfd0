#!/usr/bin/env python3
"""HF transformers baseline for bench_cuda_model's MoE presets (issue #6): DeepSeek-V2-Lite and
Qwen3-30B-A3B architectures with random bf16 weights on one GPU, decode tok/s of `generate`
(greedy, no EOS stop) at batch 1 and 32 with 2048-token prompts, as the issue's HF numbers.

    python3 scripts/bench_hf_moe.py --preset deepseek-v2-lite [--batches 1,32] [--new-tokens 16]

Decode time = generate(N new tokens) - generate(1 new token) (the prefill), per batch.
Prints one line per batch:
  [hf] preset=deepseek-v2-lite batch=32 ctx=2048 tok_s=.. (..)
"""
import argparse
import time

import torch
import transformers


def make_config(preset):
    if preset == "deepseek-v2-lite":
        return transformers.DeepseekV2Config(
            vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
            num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
            n_shared_experts=2, n_routed_experts=64, num_experts_per_tok=6, first_k_dense_replace=1,
            n_group=1, topk_group=1, topk_method="greedy", routed_scaling_factor=1.0,
            norm_topk_prob=False, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
            v_head_dim=128, qk_nope_head_dim=128, max_position_embeddings=4096,
            rope_theta=10000.0, tie_word_embeddings=False)
    if preset == "qwen3-30b-a3b":
        return transformers.Qwen3MoeConfig(
            vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
            num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
            num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
            max_position_embeddings=4096, rope_theta=1000000.0, tie_word_embeddings=False)
    raise SystemExit(f"unknown preset {preset}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="deepseek-v2-lite")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=16)
    args = ap.parse_args()
    cfg = make_config(args.preset)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).eval()
    torch.cuda.synchronize()
    print(f"[hf] preset={args.preset} built in {time.perf_counter() - t0:.1f} s, "
          f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
    gen = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    for b in [int(x) for x in args.batches.split(",")]:
        ids = torch.randint(0, cfg.vocab_size, (b, args.prompt), device="cuda")
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=2, min_new_tokens=2, **gen)  # warm-up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, **gen)  # prefill only
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=args.new_tokens,
                                 min_new_tokens=args.new_tokens, **gen)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
        n = out.shape[1] - args.prompt
        decode_s = (t2 - t1) - (t1 - t0)
        print(f"[hf] preset={args.preset} batch={b} ctx={args.prompt} "
              f"tok_s={b * (n - 1) / decode_s:.1f} ({n} new tokens per sequence, prefill "
              f"{1e3 * (t1 - t0):.0f} ms, transformers generate, bf16)", flush=True)
        del ids, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
