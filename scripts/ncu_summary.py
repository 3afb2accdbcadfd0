#!/usr/bin/env python3
"""Summarises `ncu --csv --page raw --metrics gpu__time_duration.sum` output: device time per
kernel name (grouped), count, share, and the total — the graph step's kernel time without launch
gaps. Usage: ncu ... > x.csv; python3 scripts/ncu_summary.py x.csv [label] [top]"""
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


def main():
    path = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else path
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    reader = csv.reader(lines)
    header = next(reader, None)
    if not header or "Kernel Name" not in header:
        print(f"[ncu] {label}: no kernel rows in {path}")
        return
    ki, ti = header.index("Kernel Name"), header.index("gpu__time_duration.sum")
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
        rows.append((short(r[ki]), v * scale))
    total = sum(t for _, t in rows)
    agg = {}
    for n, t in rows:
        a = agg.setdefault(n, [0.0, 0])
        a[0] += t
        a[1] += 1
    print(f"[ncu] {label}: {len(rows)} kernels, {total:.1f} us of kernel time")
    for n, (t, c) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {t:9.1f} us {100 * t / max(total, 1e-9):5.1f}% {c:5d}x {t / c:8.2f} us/call  {n}")


if __name__ == "__main__":
    main()
