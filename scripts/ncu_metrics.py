#!/usr/bin/env python3
"""Means per kernel of the numeric metrics in `ncu --csv --page raw --metrics a,b,...` output
(kernel names shortened as scripts/ncu_summary.py does; each metric's unit from the CSV's units
row). The raw page also carries ncu's own columns (device__attribute_*, launch__*, profiler__*,
the other rollups of a metric): pass the metrics asked of ncu as the third argument to print
only those, in that order; without it every column with "__" in its name is printed.
Usage: ncu ... > x.csv; python3 scripts/ncu_metrics.py x.csv [label] [metric,metric,...]"""
import sys

from ncu_summary import read_ncu_csv, short


def main():
    path = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else path
    table = read_ncu_csv(path, label)
    if table is None:
        return
    header, reader = table
    ki = header.index("Kernel Name")
    if len(sys.argv) > 3:
        wanted = [m for m in sys.argv[3].split(",") if m]
        missing = [m for m in wanted if m not in header]
        if missing:
            print(f"[ncu] {label}: not in the CSV: {', '.join(missing)}")
        metrics = [(header.index(m), m) for m in wanted if m in header]
    else:
        metrics = [(i, h) for i, h in enumerate(header) if "__" in h]
    if not metrics:
        print(f"[ncu] {label}: no metric columns")
        return
    units = {}
    sums, counts = {}, {}
    for r in reader:
        if len(r) <= max(i for i, _ in metrics):
            continue
        values = {}
        for i, h in metrics:
            try:
                values[h] = float(r[i].replace(",", ""))
            except ValueError:
                if not r[ki]:
                    units[h] = r[i]  # the units row (no kernel name)
        if not r[ki] or not values:
            continue
        name = short(r[ki])
        acc = sums.setdefault(name, {})
        for h, v in values.items():
            acc[h] = acc.get(h, 0.0) + v
        counts[name] = counts.get(name, 0) + 1
    print(f"[ncu] {label}: means per kernel over {sum(counts.values())} launches")
    print("  " + " | ".join(f"{h} ({units.get(h, '')})" for _, h in metrics))
    for name, acc in sums.items():
        n = counts[name]
        cells = " | ".join(f"{acc.get(h, float('nan')) / n:.4g}" for _, h in metrics)
        print(f"  {name} x{n}: {cells}")


if __name__ == "__main__":
    main()
