#!/usr/bin/env python3
"""Means per kernel of every numeric metric in `ncu --csv --page raw --metrics a,b,...` output
(kernel names shortened as scripts/ncu_summary.py does; the units row of the CSV is printed as
the header's second line). Usage: ncu ... > x.csv; python3 scripts/ncu_metrics.py x.csv [label]"""
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
    metrics = [(i, h) for i, h in enumerate(header) if "__" in h]
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
