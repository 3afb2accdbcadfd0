#!/usr/bin/env python3
"""Summarises `ncu --csv --page raw --metrics gpu__time_duration.sum` output: device time per
kernel name (grouped), count, share, and the total — the graph step's kernel time without launch
gaps. Usage: ncu ... > x.csv; python3 scripts/ncu_summary.py x.csv [label] [top]

With PC-sampling columns in the CSV (`smsp__pcsamp_sample_count` and
`smsp__pcsamp_warps_issue_stalled_<reason>`, e.g. from scripts/gpu_steps/33_batch1.sh), each
kernel line also gets its samples and the share of them per stall reason (the largest few),
and a last line gives those shares over all kernels."""
import csv
import re
import sys


def short(name):
    name = name.replace("(anonymous namespace)::", "")
    if name.startswith("void "):
        name = name[5:]
    prev = None
    while prev != name:                          # collapse template arguments, innermost first
        prev = name
        name = re.sub(r"<[^<>]*>", "#", name)
    name = re.sub(r"\(.*$", "", name)            # drop the argument list
    name = name.replace("#", "<>")
    return name.split("::")[-1][:70]


def read_ncu_csv(path, label):
    """The header and a reader over the rows of ncu's CSV (other output lines skipped); None
    (after saying so) when there are no kernel rows."""
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    reader = csv.reader(lines)
    header = next(reader, None)
    if not header or "Kernel Name" not in header:
        print(f"[ncu] {label}: no kernel rows in {path}")
        return None
    return header, reader


def main():
    path = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else path
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    rows = []
    table = read_ncu_csv(path, label)
    if table is None:
        return
    header, reader = table
    ki, ti = header.index("Kernel Name"), header.index("gpu__time_duration.sum")
    stall_prefix = "smsp__pcsamp_warps_issue_stalled_"
    si = header.index("smsp__pcsamp_sample_count") if "smsp__pcsamp_sample_count" in header else -1
    reasons = [(i, h[len(stall_prefix):]) for i, h in enumerate(header)
               if h.startswith(stall_prefix) and not h.endswith("_not_issued")]
    samples = {}  # kernel group -> [sample count, {reason: samples}]
    unit = "ns"
    for r in reader:
        if len(r) <= max(ki, ti):
            continue
        if r[ti] in ("ns", "usecond", "us", "msecond", "nsecond"):
            unit = r[ti]
            continue
        try:
            v = float(r[ti].replace(",", ""))
        except ValueError:
            continue
        scale = {"ns": 1e-3, "nsecond": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3}.get(unit, 1e-3)
        name = short(r[ki])
        rows.append((name, v * scale))
        if si >= 0:
            acc = samples.setdefault(name, [0.0, {}])
            acc[0] += number(r[si])
            for i, reason in reasons:
                acc[1][reason] = acc[1].get(reason, 0.0) + number(r[i])
    total = sum(t for _, t in rows)
    agg = {}
    for n, t in rows:
        a = agg.setdefault(n, [0.0, 0])
        a[0] += t
        a[1] += 1
    print(f"[ncu] {label}: {len(rows)} kernels, {total:.1f} us of kernel time")
    for n, (t, c) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:top]:
        line = f"  {t:9.1f} us {100 * t / max(total, 1e-9):5.1f}% {c:5d}x {t / c:8.2f} us/call  {n}"
        if n in samples:
            line += "  |" + stall_shares(*samples[n])
        print(line)
    if samples:
        count = sum(a[0] for a in samples.values())
        merged = {}
        for _, by_reason in samples.values():
            for reason, v in by_reason.items():
                merged[reason] = merged.get(reason, 0.0) + v
        print(f"[ncu] {label}: stall reasons over all kernels |" + stall_shares(count, merged, 8))


def number(cell):
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        return 0.0


def stall_shares(count, by_reason, top=4):
    """' N samples: reason a%, ...' for the largest `top` reasons."""
    largest = sorted(by_reason.items(), key=lambda kv: -kv[1])[:top]
    shares = [f"{reason} {100 * v / max(count, 1e-9):.0f}%" for reason, v in largest if v > 0]
    return f" {count:.0f} samples" + (": " + ", ".join(shares) if shares else "")


if __name__ == "__main__":
    main()
