#!/usr/bin/env python3
"""Reads run.sh's summary.txt and prints, per preset and batch, each variant's mean tok/s over
the rounds, its % of the roofline, its change against the base row and what that change is per
layer in microseconds (the step time difference spread over the model's layers), and at batch 1
how many microseconds a layer would still have to lose for the 70 % line. Rows of the
patched binary (bench_cuda_model_dbg) compare against `dbg_base`, rows of bench_cuda_model and the
pfnext binary against `head` / `pfnext0`. The 70 % line is issue #6's target.

    python3 docs/logs/2026-12-05_run48/prepared_call/read_summary.py OUT/summary.txt
"""
import re
import statistics
import sys
from collections import OrderedDict

LAYERS = {"qwen3-30b-a3b": 48, "deepseek-v2-lite": 27}
TARGET_70 = {"qwen3-30b-a3b": 479.0, "deepseek-v2-lite": 606.0}
# HBM peak (TB/s) by the GPU name run.sh's first line records. The issue's roofline is 4.3 TB/s,
# 0.896 of the H200's 4.8 peak; on another card the same fraction of its peak is its line, so the
# bench's pct (always against 4.3 TB/s) is rescaled for the "to 70 %" column and said so.
PEAK_TB_S = {"H200": 4.8, "H100": 3.35}
ISSUE_TB_S = 4.3
ROW = re.compile(r"^(\S+) (\S+) c=(\d+) tok_s=([0-9.]+) pct=([0-9.]+)")
# Which row a variant is compared against (by its tag).
HEAD_TAGS = {"head", "gu2x8", "mla_min2"}


def base_of(tag):
    if tag.startswith("pfnext"):
        return "pfnext0"
    if tag in HEAD_TAGS or tag.startswith(("gqa_spc", "tc_stages", "mla_wide")):
        return "head"
    return "dbg_base"


def main(path):
    rows = OrderedDict()  # (preset, conc) -> tag -> [(tok_s, pct)]
    skipped = 0
    failed = []
    scale = 1.0  # the device's roofline against the issue's
    with open(path, encoding="utf-8") as f:
        for line in f:
            for name, peak in PEAK_TB_S.items():
                if name in line and "NVIDIA" in line and scale == 1.0 and name != "H200":
                    scale = 0.896 * peak / ISSUE_TB_S
                    print(f"note: {name} (peak {peak} TB/s): the 70 % line below is "
                          f"{0.896 * peak:.2f} TB/s x 70 %, not the issue's H200 line; "
                          "% roof stays against 4.3 TB/s as the bench prints it")
            if "skipped (time)" in line:
                skipped += 1
                continue
            m = ROW.match(line)
            if not m:
                if re.match(r"^\S+ \S+ c=\d+ ", line):  # a bench row without a number
                    failed.append(line.strip())
                continue
            tag, preset, conc = m.group(1), m.group(2), int(m.group(3))
            rows.setdefault((preset, conc), OrderedDict()).setdefault(tag, []).append(
                (float(m.group(4)), float(m.group(5))))
    if not rows:
        sys.exit(f"{path}: no bench rows")
    for (preset, conc), tags in rows.items():
        layers = LAYERS.get(preset, 1)
        print(f"== {preset} c={conc}" + (f" (70 %: {TARGET_70[preset] * scale:.0f} tok/s)"
                                         if conc == 1 and preset in TARGET_70 else ""))
        print(f"  {'variant':<18} {'n':>2} {'tok/s':>8} {'min-max':>15} {'% roof':>7} "
              f"{'vs base':>8} {'us/layer':>9} {'to 70 %':>8}")
        for tag, vals in tags.items():
            tok = [v[0] for v in vals]
            mean = statistics.mean(tok)
            pct = statistics.mean(v[1] for v in vals)
            base = tags.get(base_of(tag))
            change = per_layer = ""
            if base and tag != base_of(tag) and mean > 0:
                b = statistics.mean(v[0] for v in base)
                change = f"{100.0 * (mean / b - 1.0):+.1f} %"
                # step time per token (us) at this batch, its difference spread over the layers
                dt = (1e6 * conc / b - 1e6 * conc / mean) / layers
                per_layer = f"{-dt:+.2f}"
            # what a layer would still have to lose for the 70 % line (negative: past it)
            to70 = ""
            if conc == 1 and preset in TARGET_70:
                target = TARGET_70[preset] * scale
                to70 = f"{(1e6 / mean - 1e6 / target) / layers:.2f}"
            spread = f"{min(tok):.1f}-{max(tok):.1f}" if len(tok) > 1 else ""
            print(f"  {tag:<18} {len(tok):>2} {mean:>8.1f} {spread:>15} {pct:>7.1f} "
                  f"{change:>8} {per_layer:>9} {to70:>8}")
    if skipped:
        print(f"({skipped} rows skipped for time)")
    for line in failed:
        print(f"no number (the bench failed or timed out): {line}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
