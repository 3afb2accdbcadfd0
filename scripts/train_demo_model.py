#!/usr/bin/env python3
"""Train the deepinfer demo model (small DeepSeek-V3 with MTP) and export it in HF format.

Input (carried to the GPU machine as .demo_data/, made here by prepare_demo_data.py and
make_demo_tokenizer.py): train.jsonl.xz, valid.jsonl.xz, tokenizer/{tokenizer.json,tokenizer_config.json}.
Output: --out-dir with config.json, model.safetensors, tokenizer files; --log (loss log, TSV);
--state (tokenized held-out stream + run facts for verify_demo_model.py).

Loss = CE(next token) + mtp_weight * CE(token after next, from the MTP layer).
The training length is wall-time bound (--train-seconds, clipped by --deadline): the first steps
measure the step time, then the number of steps is fixed so the LR schedule (linear warm-up, cosine
to 10%) completes; the chosen step count is logged and can be replayed with --steps.
"""
import argparse
import json
import lzma
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_model  # noqa: E402


def fail(msg):
    print(f"train_demo_model: ERROR: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def log(msg):
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# Data


def read_docs(path, limit=None):
    if not os.path.isfile(path):
        fail(f"{path} not found: carry .demo_data/ (made by scripts/prepare_demo_data.py)")
    docs = []
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            docs.append(json.loads(line)["text"])
            if limit is not None and len(docs) >= limit:
                break
    if not docs:
        fail(f"{path} holds no documents")
    return docs


class Encoder:
    """HF `tokenizers` when present (GPU machine); a byte-only stand-in for CPU tests (--byte-tokens)."""

    def __init__(self, tokenizer_dir, byte_tokens):
        self.byte_tokens = byte_tokens
        meta_path = os.path.join(tokenizer_dir, "tokenizer_meta.json")
        if not os.path.isfile(meta_path):
            fail(f"{meta_path} not found: run scripts/make_demo_tokenizer.py --out-dir {tokenizer_dir}")
        with open(meta_path) as f:
            self.meta = json.load(f)
        self.bos, self.eos = self.meta["bos_token_id"], self.meta["eos_token_id"]
        if byte_tokens:
            self.tok = None
            return
        try:
            from tokenizers import Tokenizer
        except ImportError:
            fail("python package `tokenizers` is missing (use --byte-tokens only for CPU smoke tests)")
        self.tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
        if self.tok.get_vocab_size(with_added_tokens=True) != self.meta["vocab_size"]:
            fail("tokenizer.json vocab size differs from tokenizer_meta.json")

    def encode_docs(self, docs):
        """BOS + text + EOS per document, concatenated -> 1-D int32 tensor."""
        parts = []
        if self.tok is None:
            for d in docs:
                b = d.encode("utf-8")
                parts.append(torch.tensor([self.bos] + [3 + x for x in b] + [self.eos], dtype=torch.int32))
            return torch.cat(parts)
        batch = 512
        for i in range(0, len(docs), batch):
            encs = self.tok.encode_batch(docs[i:i + batch], add_special_tokens=False)
            for e in encs:
                parts.append(torch.tensor([self.bos] + e.ids + [self.eos], dtype=torch.int32))
        return torch.cat(parts)


def sample_batch(stream, batch, seq_plus, gen):
    """Random windows of seq_plus tokens from the token stream (on the stream's device)."""
    hi = stream.numel() - seq_plus
    starts = torch.randint(0, hi, (batch,), generator=gen, device=stream.device)
    idx = starts[:, None] + torch.arange(seq_plus, device=stream.device)[None, :]
    return stream[idx].long()


def eval_windows(stream, seq_plus, max_windows):
    n = min(max_windows, (stream.numel() - 1) // seq_plus)
    if n < 1:
        fail(f"held-out stream too short ({stream.numel()} tokens) for windows of {seq_plus}")
    return stream[: n * seq_plus].view(n, seq_plus).long()


def losses(model, win, mtp_weight, autocast_ctx):
    """win [B, L+2]: main predicts win[:,1:L+1] from win[:,:L]; MTP predicts win[:,2:] at the same positions."""
    L = win.shape[1] - 2
    ids, tgt1, tgt2 = win[:, :L], win[:, 1:L + 1], win[:, 2:L + 2]
    with autocast_ctx():
        logits, mtp_logits = model(ids, next_ids=tgt1)
    v = logits.shape[-1]
    loss_main = F.cross_entropy(logits.float().reshape(-1, v), tgt1.reshape(-1))
    loss_mtp = F.cross_entropy(mtp_logits.float().reshape(-1, v), tgt2.reshape(-1))
    return loss_main + mtp_weight * loss_mtp, loss_main, loss_mtp


@torch.no_grad()
def evaluate(model, windows, mtp_weight, autocast_ctx, batch):
    model.eval()
    tot_main = tot_mtp = 0.0
    n = 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i:i + batch]
        _, lm, lt = losses(model, w, mtp_weight, autocast_ctx)
        tot_main += lm.item() * w.shape[0]
        tot_mtp += lt.item() * w.shape[0]
        n += w.shape[0]
    model.train()
    return tot_main / n, tot_mtp / n


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=".demo_data")
    ap.add_argument("--out-dir", required=True, help="exported HF model directory")
    ap.add_argument("--log", required=True, help="loss log (TSV)")
    ap.add_argument("--state", required=True, help="JSON + .pt with held-out tokens and run facts for verify")
    ap.add_argument("--preset", default="demo", choices=["demo", "tiny"])
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64, help="sequences per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--bias-gamma", type=float, default=1e-3, help="aux-loss-free router bias step")
    ap.add_argument("--train-seconds", type=float, default=420.0)
    ap.add_argument("--deadline", type=float, default=0.0, help="absolute time.time() by which training must stop")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (replay); 0 = from the time budget")
    ap.add_argument("--measure-steps", type=int, default=30)
    ap.add_argument("--eval-every", type=int, default=0, help="0 = ~12 evaluations per run")
    ap.add_argument("--eval-windows", type=int, default=128)
    ap.add_argument("--max-train-docs", type=int, default=0)
    ap.add_argument("--max-valid-docs", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--byte-tokens", action="store_true", help="CPU tests without `tokenizers`")
    ap.add_argument("--compile", action="store_true", help="torch.compile the dense blocks (experimental)")
    args = ap.parse_args()

    t_start = time.time()
    for path in (args.log, args.state):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    dev = torch.device(args.device)
    use_bf16 = dev.type == "cuda"
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def autocast_ctx():
        return torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=use_bf16)

    # ---- data
    tok_dir = os.path.join(args.data_dir, "tokenizer")
    enc = Encoder(tok_dir, args.byte_tokens)
    t0 = time.time()
    train_docs = read_docs(os.path.join(args.data_dir, "train.jsonl.xz"), args.max_train_docs or None)
    valid_docs = read_docs(os.path.join(args.data_dir, "valid.jsonl.xz"), args.max_valid_docs or None)
    train_bytes = sum(len(d.encode("utf-8")) for d in train_docs)
    log(f"read {len(train_docs)} train / {len(valid_docs)} held-out files ({train_bytes / 1e6:.1f} MB) "
        f"in {time.time() - t0:.1f}s")
    t0 = time.time()
    train_stream = enc.encode_docs(train_docs)
    valid_stream = enc.encode_docs(valid_docs)
    del train_docs
    log(f"tokenized: {train_stream.numel() / 1e6:.2f}M train tokens ({train_bytes / train_stream.numel():.2f} "
        f"bytes/token), {valid_stream.numel() / 1e6:.3f}M held-out tokens in {time.time() - t0:.1f}s")
    vocab = enc.meta["vocab_size"]
    if int(train_stream.max()) >= vocab:
        fail("token id beyond the vocabulary")
    seq_plus = args.seq_len + 2
    if train_stream.numel() < 4 * seq_plus:
        fail("training stream too short")
    train_stream = train_stream.to(dev)
    valid_win = eval_windows(valid_stream, seq_plus, args.eval_windows).to(dev)

    # ---- model
    cfg = demo_model.demo_config(vocab_size=vocab, preset=args.preset)
    cfg["bos_token_id"], cfg["eos_token_id"] = enc.bos, enc.eos
    model = demo_model.DemoDeepseekV3(cfg).to(dev)
    n_params, n_emb = demo_model.count_parameters(model)
    log(f"model: {n_params / 1e6:.2f}M parameters in the checkpoint ({n_emb / 1e6:.2f}M embedding/head incl. "
        f"MTP copies) = {2 * n_params / 1e6:.1f} MB bf16")
    if args.preset == "demo" and 2 * n_params > 40e6:
        fail("checkpoint would exceed 40 MB")
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed_tokens" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    fwd = model
    if args.compile and hasattr(torch, "compile"):
        for layer in model.layers:
            layer.self_attn = torch.compile(layer.self_attn)
        log("torch.compile on attention blocks")

    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    logf = open(args.log, "w")
    logf.write("step\telapsed_s\tlr\tloss\tloss_main\tloss_mtp\ttok_per_s\tval_loss_main\tval_loss_mtp\tval_ppl\n")

    deadline = t_start + 1e9
    if args.deadline > 0:
        deadline = min(deadline, args.deadline)
    train_t0 = time.time()
    train_end = min(train_t0 + args.train_seconds, deadline)
    total_steps = args.steps if args.steps > 0 else None
    tokens_per_step = args.batch * args.seq_len

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        if total_steps is None:
            return args.lr
        p = min(1.0, (step - args.warmup) / max(1, total_steps - args.warmup))
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))

    try:
        from tqdm import tqdm
        bar = tqdm(total=total_steps, mininterval=10.0, unit="step", file=sys.stdout, dynamic_ncols=False,
                   ncols=100)
    except ImportError:
        bar = None

    step = 0
    t_measure = None
    last_eval = None
    eval_every = args.eval_every
    last_t, last_step = time.time(), 0
    tok_s = 0.0
    model.train()
    while True:
        if total_steps is not None and step >= total_steps:
            break
        if time.time() >= train_end and (total_steps is None or args.steps == 0):
            log(f"time budget reached at step {step}")
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        win = sample_batch(train_stream, args.batch, seq_plus, gen)
        loss, lm, lt = losses(fwd, win, args.mtp_weight, autocast_ctx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.update_router_bias(args.bias_gamma)
        step += 1
        if bar is not None:
            bar.update(1)

        if total_steps is None and step == 5:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t_measure = time.time()
        if total_steps is None and step == 5 + args.measure_steps:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            dt = (time.time() - t_measure) / args.measure_steps
            remaining = train_end - time.time()
            # Leave ~4% for evaluations and the tail.
            total_steps = max(step + 1, step + int(0.96 * remaining / dt))
            log(f"step time {dt * 1000:.1f} ms ({tokens_per_step / dt / 1e6:.2f}M tok/s) -> {total_steps} steps "
                f"({total_steps * tokens_per_step / 1e6:.0f}M tokens, "
                f"{total_steps * tokens_per_step / train_stream.numel():.2f} epochs)")
            if bar is not None:
                bar.total = total_steps
                bar.refresh()
        if eval_every == 0 and total_steps is not None:
            eval_every = max(1, total_steps // 12)

        do_log = step % 25 == 0 or step == 1
        is_last = total_steps is not None and step >= total_steps
        do_eval = is_last or (eval_every and step % eval_every == 0)
        if do_log or do_eval:
            now = time.time()
            if step > last_step:
                tok_s = (step - last_step) * tokens_per_step / max(1e-9, now - last_t)
            last_t, last_step = now, step
            vals = ("", "", "")
            if do_eval:
                vm, vt = evaluate(model, valid_win, args.mtp_weight, autocast_ctx, args.batch)
                last_eval = (vm, vt)
                vals = (f"{vm:.4f}", f"{vt:.4f}", f"{math.exp(vm):.3f}")
                log(f"step {step}: loss {loss.item():.4f} (main {lm.item():.4f}, mtp {lt.item():.4f}) "
                    f"held-out main {vm:.4f} (ppl {math.exp(vm):.2f}) mtp {vt:.4f}")
            if not math.isfinite(loss.item()):
                fail(f"loss is {loss.item()} at step {step}")
            logf.write(f"{step}\t{now - train_t0:.1f}\t{lr_at(step - 1):.3e}\t{loss.item():.4f}\t{lm.item():.4f}\t"
                       f"{lt.item():.4f}\t{tok_s:.0f}\t" + "\t".join(vals) + "\n")
            logf.flush()
    if bar is not None:
        bar.close()
    train_s = time.time() - train_t0
    if last_eval is None or (total_steps is not None and step < total_steps):
        last_eval = evaluate(model, valid_win, args.mtp_weight, autocast_ctx, args.batch)
    logf.close()
    loads = [m.e_score_correction_bias.tolist() for m in model.moe_layers()]
    log(f"trained {step} steps ({step * tokens_per_step / 1e6:.0f}M tokens) in {train_s:.0f}s; "
        f"held-out loss {last_eval[0]:.4f} (ppl {math.exp(last_eval[0]):.2f})")

    # ---- export
    size = demo_model.export_hf(model.float(), args.out_dir, tok_dir,
                                {"producer": "deepinfer scripts/train_demo_model.py", "seed": str(args.seed),
                                 "steps": str(step)})
    log(f"exported {args.out_dir} (model.safetensors {size / 1e6:.1f} MB)")
    if args.preset == "demo" and size > 40e6:
        fail(f"model.safetensors is {size / 1e6:.1f} MB > 40 MB")
    facts = {
        "seed": args.seed, "steps": step, "train_seconds": round(train_s, 1),
        "tokens_seen": step * tokens_per_step, "train_tokens": int(train_stream.numel()),
        "heldout_tokens": int(valid_stream.numel()), "bytes_per_token": round(train_bytes / train_stream.numel(), 3),
        "seq_len": args.seq_len, "batch": args.batch, "lr": args.lr, "mtp_weight": args.mtp_weight,
        "bias_gamma": args.bias_gamma, "params": n_params, "params_embedding_copies": n_emb,
        "final_train_loss": float(loss.item()), "heldout_loss_main_bf16": last_eval[0],
        "heldout_loss_mtp_bf16": last_eval[1], "heldout_ppl_bf16": math.exp(last_eval[0]),
        "router_bias": loads, "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "byte_tokens": args.byte_tokens,
    }
    with open(args.state + ".json", "w") as f:
        json.dump(facts, f, indent=2)
    torch.save({"valid_stream": valid_stream}, args.state + ".pt")
    log(f"done in {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    main()
