#!/usr/bin/env python3
"""Counts SASS instructions per kernel in `cuobjdump -sass BINARY` output (stdin or a file) and
prints the total and the largest kernels: the code a once-per-layer kernel fetches cold.
Usage: cuobjdump -sass .gpu_bin/bench_cuda_model | python3 scripts/sass_count.py [top]"""
import re
import sys


def main():
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    counts, fn = {}, None
    for line in sys.stdin:
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            fn = m.group(1)
            continue
        # An instruction line starts with its offset comment, /*0a30*/; the encoding's second
        # half on the next line is /* 0x... */ and does not match.
        if fn and re.search(r"/\*[0-9a-f]{4,}\*/", line):
            counts[fn] = counts.get(fn, 0) + 1
    print(f"[sass] {len(counts)} kernels, {sum(counts.values())} instructions "
          f"({16 * sum(counts.values()) / 1024:.0f} KB)")
    for name, n in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {n:6d} {16 * n / 1024:6.1f} KB  {name[:150]}")


if __name__ == "__main__":
    main()
