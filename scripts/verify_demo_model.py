#!/usr/bin/env python3
"""Verify the exported demo model with HF transformers and write the engine's golden fixture.

Checks (all in fp32, TF32 off):
  1. HF `AutoModelForCausalLM.from_pretrained(dir)` logits == our training model's logits (loaded from
     the same model.safetensors) on held-out windows: max |diff| / max |logit| must be < --max-rel-diff.
  2. Held-out perplexity (main head) and the MTP head's teacher-forced top-1 accuracy on t+2.
  3. Greedy continuations (HF, fp32) of a few Python prefixes; HF generate() with KV cache agrees.
  4. MTP acceptance: on held-out prompts, greedy-decode with the main model; at each generated
     position the MTP head (fed the main model's greedy next token) predicts the token after it;
     acceptance = fraction equal to the main model's actual next-next greedy token.
  5. Tokenizer: AutoTokenizer == tokenizers.Tokenizer on held-out files; decode(encode(x)) == x;
     control tokens map to the ids in tokenizer_meta.json.
Writes into --out: verify.json, golden.json, loss.png. Exit status 1 if a check fails (outputs are
still written first).
"""
import argparse
import json
import math
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_model  # noqa: E402

SAMPLE_PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:", "def quicksort(arr):",
                  "# Return the mean of a list of numbers\ndef mean(xs):", "from typing import List\n\n\n"]
GOLDEN_TEXT = ["def fibonacci(n):", "import os\n", "class Stack:\n    def __init__(self):"]
GOLDEN_CHAT = "<｜User｜>Write a Python function that reverses a string.<｜Assistant｜>"


def log(msg):
    print(f"[verify {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def r6(x):
    return float(f"{x:.6g}")


@torch.no_grad()
def greedy_ours(model, ids, n):
    """ids [B, T] -> [B, T + n], no KV cache (full recompute; sequences are short)."""
    for _ in range(n):
        logits, _ = model(ids)
        ids = torch.cat((ids, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
    return ids


@torch.no_grad()
def greedy_hf(hf, ids, n):
    for _ in range(n):
        logits = hf(input_ids=ids, use_cache=False).logits
        ids = torch.cat((ids, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
    return ids


def plot_loss(train_log, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = []
    with open(train_log) as f:
        head = f.readline().rstrip("\n").split("\t")
        for line in f:
            rows.append(dict(zip(head, line.rstrip("\n").split("\t"))))
    if not rows:
        raise RuntimeError(f"{train_log} has no rows")
    step = [int(r["step"]) for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    ax.plot(step, [float(r["loss_main"]) for r in rows], label="train: next token", lw=1)
    ax.plot(step, [float(r["loss_mtp"]) for r in rows], label="train: MTP (token after next)", lw=1)
    ev = [r for r in rows if r.get("val_loss_main")]
    ax.plot([int(r["step"]) for r in ev], [float(r["val_loss_main"]) for r in ev], "o-", label="held-out: next token")
    ax.plot([int(r["step"]) for r in ev], [float(r["val_loss_mtp"]) for r in ev], "s-", label="held-out: MTP")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("deepinfer-demo-code training loss")
    fig.tight_layout()
    fig.savefig(png)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--state", required=True, help="prefix given to train_demo_model.py --state")
    ap.add_argument("--train-log", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data-dir", default=".demo_data")
    ap.add_argument("--model-name", default="deepinfer-demo-code")
    ap.add_argument("--check-windows", type=int, default=4)
    ap.add_argument("--check-len", type=int, default=512)
    ap.add_argument("--ppl-windows", type=int, default=256)
    ap.add_argument("--ppl-len", type=int, default=1024)
    ap.add_argument("--mtp-prompts", type=int, default=64)
    ap.add_argument("--mtp-prompt-len", type=int, default=64)
    ap.add_argument("--mtp-gen", type=int, default=64)
    ap.add_argument("--sample-tokens", type=int, default=64)
    ap.add_argument("--max-rel-diff", type=float, default=1e-3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    failures = []
    report = {"model": args.model_name}
    with open(args.state + ".json") as f:
        report["training"] = json.load(f)
    valid = torch.load(args.state + ".pt")["valid_stream"].long()
    with open(os.path.join(args.data_dir, "tokenizer", "tokenizer_meta.json")) as f:
        meta = json.load(f)

    # ---- loss curve first: it needs nothing else
    try:
        plot_loss(args.train_log, os.path.join(args.out, "loss.png"))
        log("wrote loss.png")
    except Exception as e:  # a missing plot must not hide the model checks
        failures.append(f"loss plot: {e!r}")
        traceback.print_exc()

    # ---- our model, from the exported file
    ours = demo_model.load_exported(args.model_dir, dev).float()
    cfg = ours.cfg

    # ---- HF model
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    report["transformers"] = transformers.__version__
    report["torch"] = torch.__version__
    t0 = time.time()
    try:
        hf, info = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32,
                                                        attn_implementation="eager", output_loading_info=True)
    except TypeError:
        hf, info = AutoModelForCausalLM.from_pretrained(args.model_dir, torch_dtype=torch.float32,
                                                        attn_implementation="eager", output_loading_info=True)
    hf = hf.to(dev).eval()
    info = {k: sorted(str(x) for x in v) for k, v in info.items() if isinstance(v, (list, set, tuple))}
    report["hf_class"] = type(hf).__name__
    report["hf_missing_keys"] = info.get("missing_keys", [])
    report["hf_unexpected_keys_count"] = len(info.get("unexpected_keys", []))
    report["hf_unexpected_keys_sample"] = info.get("unexpected_keys", [])[:5]
    log(f"HF {transformers.__version__} loaded {type(hf).__name__} in {time.time() - t0:.1f}s; "
        f"missing {len(report['hf_missing_keys'])}, unexpected {report['hf_unexpected_keys_count']} "
        f"(the MTP layer model.layers.{cfg['num_hidden_layers']}.* is expected to be unexpected to HF)")
    if report["hf_missing_keys"]:
        failures.append(f"HF reports missing keys: {report['hf_missing_keys'][:5]}")
    bad_unexpected = [k for k in info.get("unexpected_keys", [])
                      if not k.startswith(f"model.layers.{cfg['num_hidden_layers']}.")]
    if bad_unexpected:
        failures.append(f"HF reports unexpected non-MTP keys: {bad_unexpected[:5]}")

    # ---- 1. logits: HF vs ours
    L = args.check_len
    n = min(args.check_windows, valid.numel() // L)
    wins = valid[: n * L].view(n, L).to(dev)
    with torch.no_grad():
        lo_hf = hf(input_ids=wins, use_cache=False).logits.float()
        lo_ours, _ = ours(wins)
    diff = (lo_hf - lo_ours).abs()
    max_rel = (diff.max() / lo_hf.abs().max()).item()
    tok_rel = (diff.amax(-1) / lo_hf.abs().amax(-1)).flatten()
    report["logits_check"] = {
        "windows": n, "tokens_per_window": L,
        "max_abs_diff": diff.max().item(), "max_rel_diff": max_rel,
        "p999_token_rel_diff": tok_rel.quantile(0.999).item() if tok_rel.numel() > 1 else tok_rel.max().item(),
        "argmax_agreement": (lo_hf.argmax(-1) == lo_ours.argmax(-1)).float().mean().item(),
        "hf_heldout_loss": torch.nn.functional.cross_entropy(lo_hf[:, :-1].reshape(-1, lo_hf.shape[-1]),
                                                             wins[:, 1:].reshape(-1)).item(),
    }
    log(f"logits HF vs ours: max rel diff {max_rel:.2e}, argmax agreement "
        f"{report['logits_check']['argmax_agreement']:.6f}")
    if not (max_rel < args.max_rel_diff):
        failures.append(f"HF logits differ from the training model: max rel diff {max_rel:.3e}")
    del lo_hf, lo_ours, diff

    # ---- 2. held-out perplexity (ours, fp32, exported weights) + MTP teacher-forced accuracy
    P = args.ppl_len + 2
    nw = min(args.ppl_windows, (valid.numel()) // P)
    pw = valid[: nw * P].view(nw, P)
    tot_main = tot_mtp = 0.0
    acc_mtp = cnt = 0
    with torch.no_grad():
        for i in range(0, nw, 16):
            w = pw[i:i + 16].to(dev)
            ids, t1, t2 = w[:, :-2], w[:, 1:-1], w[:, 2:]
            lm, lt = ours(ids, next_ids=t1)
            V = lm.shape[-1]
            tot_main += torch.nn.functional.cross_entropy(lm.reshape(-1, V), t1.reshape(-1), reduction="sum").item()
            tot_mtp += torch.nn.functional.cross_entropy(lt.reshape(-1, V), t2.reshape(-1), reduction="sum").item()
            acc_mtp += (lt.argmax(-1) == t2).sum().item()
            cnt += t1.numel()
    report["heldout"] = {
        "windows": nw, "tokens": cnt, "seq_len": args.ppl_len,
        "loss_main": tot_main / cnt, "perplexity": math.exp(tot_main / cnt),
        "loss_mtp": tot_mtp / cnt, "mtp_top1_teacher_forced": acc_mtp / cnt,
        "bits_per_byte": (tot_main / cnt) / math.log(2) / report["training"]["bytes_per_token"],
    }
    log(f"held-out: {cnt} tokens, perplexity {report['heldout']['perplexity']:.3f}, "
        f"MTP teacher-forced top-1 {acc_mtp / cnt:.3f}")

    # ---- tokenizer
    from tokenizers import Tokenizer
    raw_tok = Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
    tok_report = {}
    try:
        hf_tok = AutoTokenizer.from_pretrained(args.model_dir)
        tok_report["hf_class"] = type(hf_tok).__name__
        import lzma
        texts = []
        with lzma.open(os.path.join(args.data_dir, "valid.jsonl.xz"), "rt", encoding="utf-8") as f:
            for line in f:
                texts.append(json.loads(line)["text"][:4000])
                if len(texts) >= 20:
                    break
        same = sum(hf_tok(t, add_special_tokens=False)["input_ids"] == raw_tok.encode(t, add_special_tokens=False).ids
                   for t in texts)
        roundtrip = sum(raw_tok.decode(raw_tok.encode(t, add_special_tokens=False).ids,
                                       skip_special_tokens=False) == t for t in texts)
        tok_report.update(files=len(texts), hf_equals_tokenizers=same, roundtrip_exact=roundtrip)
        specials = {k: raw_tok.token_to_id(k) for k in meta["control_tokens"]}
        tok_report["control_tokens_ok"] = specials == meta["control_tokens"]
        tok_report["hf_bos_added"] = hf_tok("x")["input_ids"][:1] == [meta["bos_token_id"]]
        if same != len(texts) or roundtrip != len(texts) or not tok_report["control_tokens_ok"]:
            failures.append(f"tokenizer check: {tok_report}")
    except Exception as e:
        failures.append(f"tokenizer check raised {e!r}")
        traceback.print_exc()
    report["tokenizer"] = tok_report
    log(f"tokenizer: {tok_report}")

    bos = meta["bos_token_id"]

    def encode(text):
        return [bos] + raw_tok.encode(text, add_special_tokens=False).ids

    # ---- 3. samples (HF greedy, fp32) and the KV-cache generate path
    samples = []
    for p in SAMPLE_PROMPTS:
        ids = torch.tensor([encode(p)], device=dev)
        out = greedy_hf(hf, ids, args.sample_tokens)[0].tolist()
        gen_ids = out[ids.shape[1]:]
        samples.append({"prompt": p, "completion": raw_tok.decode(gen_ids, skip_special_tokens=False),
                        "ids": gen_ids})
        log(f"sample {p!r} -> {samples[-1]['completion']!r}")
    report["samples"] = samples

    # ---- golden fixture
    golden = {"model": args.model_name, "prompts": [], "last_logits": [], "greedy": [], "texts": []}
    for text in GOLDEN_TEXT + [GOLDEN_CHAT]:
        ids = encode(text)
        t = torch.tensor([ids], device=dev)
        with torch.no_grad():
            last = hf(input_ids=t, use_cache=False).logits[0, -1].float()
        g = greedy_hf(hf, t, 24)[0, len(ids):].tolist()
        g_ours = greedy_ours(ours, t, 24)[0, len(ids):].tolist()
        if g != g_ours:
            failures.append(f"greedy continuation differs between HF and ours for {text!r}")
        golden["prompts"].append(ids)
        golden["last_logits"].append([r6(x) for x in last.tolist()])
        golden["greedy"].append(g)
        golden["texts"].append(text)
    gen_cache_agree = None
    try:
        agree = []
        for ids, g in zip(golden["prompts"], golden["greedy"]):
            t = torch.tensor([ids], device=dev)
            out = hf.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=24, do_sample=False,
                              use_cache=True, pad_token_id=meta["eos_token_id"])
            got = out[0, len(ids):].tolist()
            agree.append(got == g[:len(got)])
        gen_cache_agree = all(agree)
        if not gen_cache_agree:
            failures.append("HF generate() with KV cache disagrees with full-recompute greedy")
    except Exception as e:
        failures.append(f"HF generate() raised {e!r}")
        traceback.print_exc()
    report["hf_generate_kv_cache_agrees"] = gen_cache_agree
    gpath = os.path.join(args.out, "golden.json")
    with open(gpath, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
    log(f"wrote golden.json ({os.path.getsize(gpath) / 1e6:.2f} MB, {len(golden['prompts'])} prompts)")
    if os.path.getsize(gpath) > 2e6:
        failures.append("golden.json is over 2 MB")

    # ---- 4. MTP acceptance under greedy decoding
    pl, ng, npr = args.mtp_prompt_len, args.mtp_gen, args.mtp_prompts
    stride = max(pl, (valid.numel() - pl) // max(1, npr))
    starts = [i * stride for i in range(npr) if i * stride + pl <= valid.numel()]
    prompts = torch.stack([valid[s:s + pl] for s in starts]).to(dev)
    acc = tot = 0
    with torch.no_grad():
        for i in range(0, prompts.shape[0], 32):
            seq = greedy_ours(ours, prompts[i:i + 32], ng)  # [b, pl + ng]
            # Position j (j >= pl - 1) predicted seq[j+1] greedily; MTP at j gets seq[j+1] and guesses seq[j+2].
            _, mtp_logits = ours(seq[:, :-1], next_ids=seq[:, 1:])
            guess = mtp_logits.argmax(-1)  # [b, pl+ng-1]: guess at j for seq[j+2]
            j0 = pl - 1
            g = guess[:, j0:seq.shape[1] - 2]
            truth = seq[:, j0 + 2:]
            acc += (g == truth).sum().item()
            tot += truth.numel()
    report["mtp_acceptance"] = {"prompts": int(prompts.shape[0]), "prompt_len": pl, "generated": ng,
                                "positions": tot, "acceptance": acc / max(1, tot)}
    log(f"MTP acceptance (greedy, {tot} positions): {acc / max(1, tot):.3f}")

    report["failures"] = failures
    with open(os.path.join(args.out, "verify.json"), "w") as f:
        json.dump(report, f, indent=2, ensure_ascii=False)

    tr = report["training"]
    rows = [
        ("parameters (checkpoint)", f"{tr['params'] / 1e6:.2f}M"),
        ("training", f"{tr['steps']} steps, {tr['tokens_seen'] / 1e6:.0f}M tokens, {tr['train_seconds']:.0f}s"),
        ("held-out perplexity (fp32)", f"{report['heldout']['perplexity']:.3f}"),
        ("held-out bits/byte", f"{report['heldout']['bits_per_byte']:.3f}"),
        ("MTP teacher-forced top-1", f"{report['heldout']['mtp_top1_teacher_forced']:.3f}"),
        ("MTP acceptance (greedy)", f"{report['mtp_acceptance']['acceptance']:.3f}"),
        ("HF vs ours max rel diff", f"{report['logits_check']['max_rel_diff']:.2e}"),
        ("HF generate KV cache agrees", str(gen_cache_agree)),
        ("failures", str(len(failures))),
    ]
    print("\n| metric | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    if failures:
        print("\nFAILURES:\n  " + "\n  ".join(failures), flush=True)
        sys.exit(1)
    log("all checks passed")


if __name__ == "__main__":
    main()
