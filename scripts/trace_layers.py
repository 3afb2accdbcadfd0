#!/usr/bin/env python3
"""Per-layer timeline of one traced decode step (bench_cuda_model --trace, a -DDI_TRACE=1 build).

Reads the CSV (site,tag,cta,smid,start_ns,wait_ns,end_ns[,mark_ns]: one row per CTA of every instrumented
kernel, thread 0's view; also bench_cuda_moe --trace's chain of one-token MoE calls, whose
"layers" are the calls), groups the CTAs into launches, cuts the step into layers at the
launches of the step's first kernel (the qkv / q|kv_a projection), and prints, for the layers
whose kernel sequence is the most common one, the mean offset of every launch from its layer's
start (us): the first CTA's start, the first and the last CTA's return from griddepcontrol.wait,
and the last CTA's end; then each launch's share of the chain (its end minus the end before it).
Stdlib only.

  python3 scripts/trace_layers.py trace.csv [--gap-us 15]
"""
import argparse
import collections
import csv
import statistics
import sys

SITES = {
    1: "gemv",
    2: "qkv_rope_store",
    3: "gqa_decode_mma",
    4: "combine_splits",
    5: "moe_norm_route",
    6: "moe_gate_up_t1",
    7: "moe_down_t1",
    8: "mla_rope_store",
    9: "mla_cluster_decode",
    10: "mla_merge_uv",
    11: "argmax",
    12: "attn_o_proj",  # removed in run 46; kept to read earlier traces
    13: "moe_t1_fused",  # removed in run 46; kept to read earlier traces
}


def name_of(site, tag):
    base = SITES.get(site, f"site{site}")
    if site == 1:
        return f"gemv n={tag}"
    if site == 7:
        return base + {1: "(smem)", 2: "(slot)"}.get(tag, "(pipe)")
    if site == 3:
        return base + {1: "(fused)", 2: "(cluster)"}.get(tag, "")
    if site == 4:
        return base + ("(mla)" if tag == 1 else "")
    if site == 5:
        return base + ("(cluster)" if tag == 1 else "(counter)")
    return base


def launches_of(rows, gap_ns):
    """CTAs of one kernel (site, tag) sorted by start, split where starts are gap_ns apart."""
    by_key = collections.defaultdict(list)
    for r in rows:
        by_key[(r["site"], r["tag"])].append(r)
    out = []
    for key, ev in by_key.items():
        ev.sort(key=lambda r: r["start"])
        cur = [ev[0]]
        seen = {ev[0]["cta"]}
        for r in ev[1:]:
            # A gap, or a CTA index the launch already has (launches back to back: bench_cuda_moe
            # --trace's chain), begins the next launch.
            if r["start"] - cur[-1]["start"] > gap_ns or r["cta"] in seen:
                out.append((key, cur))
                cur = []
                seen = set()
            cur.append(r)
            seen.add(r["cta"])
        out.append((key, cur))
    result = []
    for key, ev in out:
        waits = [r["wait"] for r in ev if r["wait"] >= 0]
        ends = [r["end"] for r in ev if r["end"] >= 0]
        result.append({
            "key": key,
            "name": name_of(*key),
            "ctas": len(ev),
            "start": min(r["start"] for r in ev),
            "last_start": max(r["start"] for r in ev),
            "wait_first": min(waits) if waits else None,
            "wait_last": max(waits) if waits else None,
            "end": max(ends) if ends else None,
        })
    result.sort(key=lambda l: l["start"])
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--gap-us", type=float, default=15.0,
                    help="CTA starts of one kernel further apart than this begin a new launch")
    a = ap.parse_args()
    rows = []
    with open(a.csv) as f:
        for r in csv.DictReader(f):
            rows.append({"site": int(r["site"]), "tag": int(r["tag"]), "cta": int(r["cta"]),
                         "start": int(r["start_ns"]),
                         "wait": int(r["wait_ns"]), "end": int(r["end_ns"]),
                         "mark": int(r.get("mark_ns") or -1)})
    if not rows:
        sys.exit("no events")
    ls = launches_of(rows, a.gap_us * 1e3)
    anchor = ls[0]["key"]
    starts = [l["start"] for l in ls if l["key"] == anchor]
    layers = []
    for i, t0 in enumerate(starts):
        t1 = starts[i + 1] if i + 1 < len(starts) else None
        layers.append([l for l in ls if l["start"] >= t0 and (t1 is None or l["start"] < t1)])
    step_ns = max(l["end"] or l["start"] for l in ls) - ls[0]["start"]
    sigs = collections.Counter(tuple(l["key"] for l in layer) for layer in layers)
    sig, count = sigs.most_common(1)[0]
    # The last layer's window runs to the step's end (lm_head, argmax): leave it out of the mean.
    same = [layer for layer in layers[:-1] if tuple(l["key"] for l in layer) == sig]
    print(f"{len(rows)} CTAs, {len(ls)} launches, step {step_ns / 1e3:.1f} us; {len(layers)} "
          f"layers cut at '{ls[0]['name']}', {len(same)} with the common sequence")
    lengths = [starts[i + 1] - starts[i] for i in range(len(starts) - 1)
               if tuple(l["key"] for l in layers[i]) == sig]
    if lengths:
        print(f"layer length: mean {statistics.mean(lengths) / 1e3:.2f} us, "
              f"median {statistics.median(lengths) / 1e3:.2f} us")

    def mean_of(vals):
        vals = [v for v in vals if v is not None]
        return f"{statistics.mean(vals) / 1e3:7.2f}" if vals else "      -"

    print("  # kernel                       CTAs   start  last_st  wait_1st wait_last     end"
          "   (us from the layer's start; mean over those layers)")
    for pos, key in enumerate(sig):
        sel = [(layer[0]["start"], layer[pos]) for layer in same]
        rel = lambda f: [None if l[f] is None else l[f] - t0 for t0, l in sel]
        print(f"{pos:3d} {sel[0][1]['name']:<28} {sel[0][1]['ctas']:5d} {mean_of(rel('start'))} "
              f"{mean_of(rel('last_start'))}  {mean_of(rel('wait_first'))}  "
              f"{mean_of(rel('wait_last'))} {mean_of(rel('end'))}")
    print("per CTA (us; median / p90 over every CTA of the step): start -> wait return, "
          "wait return -> end")
    per = collections.defaultdict(list)
    for r in rows:
        per[(r["site"], r["tag"])].append(r)

    def q(vals, p):
        vals = sorted(vals)
        return vals[int(p * (len(vals) - 1))] / 1e3 if vals else float("nan")

    for key, ev in sorted(per.items(), key=lambda kv: min(r["start"] for r in kv[1])):
        pre = [r["wait"] - r["start"] for r in ev if r["wait"] >= 0]
        post = [r["end"] - r["wait"] for r in ev if r["wait"] >= 0 and r["end"] >= 0]
        marked = [r for r in ev if r["wait"] >= 0 and r["mark"] >= 0 and r["end"] >= 0]
        mark = ""
        if marked:  # the kernel's phase mark: wait -> mark, mark -> end
            mark = (f"  [mark: wait->mark {q([r['mark'] - r['wait'] for r in marked], .5):5.2f}"
                    f" / {q([r['mark'] - r['wait'] for r in marked], .9):5.2f},"
                    f" mark->end {q([r['end'] - r['mark'] for r in marked], .5):5.2f}]")
        print(f"    {name_of(*key):<28} {len(ev):7d} CTAs  pre-wait {q(pre, .5):6.2f} / "
              f"{q(pre, .9):6.2f}  post-wait {q(post, .5):6.2f} / {q(post, .9):6.2f}{mark}")
    tail = [l for l in ls if l["start"] >= starts[-1]]
    print("last layer and the step's tail (us from its start):")
    for l in tail:
        t0 = starts[-1]
        w = "-" if l["wait_last"] is None else f"{(l['wait_last'] - t0) / 1e3:.2f}"
        print(f"    {l['name']:<28} {l['ctas']:5d} start {(l['start'] - t0) / 1e3:7.2f} "
              f"wait_last {w:>7} end {((l['end'] or l['start']) - t0) / 1e3:7.2f}")
    # At batch 1 the kernels run one after another: a launch's share of the step is its end minus
    # the end of the launch that ended just before it.
    ended = sorted((l for l in ls if l["end"] is not None), key=lambda l: l["end"])
    share = collections.defaultdict(list)
    for prev, cur in zip(ended, ended[1:]):
        share[cur["name"]].append(cur["end"] - prev["end"])
    print("chain (us; each launch's end minus the previous launch's end; median over the step):")
    for name, v in sorted(share.items(), key=lambda kv: -sum(kv[1])):
        print(f"    {name:<28} {len(v):4d} x {statistics.median(v) / 1e3:6.2f}  "
              f"(sum {sum(v) / 1e3:8.1f})")


if __name__ == "__main__":
    main()
