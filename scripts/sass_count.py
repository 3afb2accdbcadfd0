#!/usr/bin/env python3
"""Counts SASS instructions per kernel in `cuobjdump -sass BINARY` output (stdin) and prints the
total and the largest kernels: the code a once-per-layer kernel fetches cold. For each kernel also
the instructions after its first griddepcontrol.wait (ACQBULK in SASS): what a PDL dependent runs
once its predecessor is done (docs/batch1_decode.md, "Cold code").

  cuobjdump -sass .gpu_bin/bench_cuda_model | python3 scripts/sass_count.py [top]
      [--match SUBSTRING ...]   only kernels whose mangled name contains one of these
      [--dump DIR]              also write each printed kernel's SASS to DIR/<name>.sass
                                (tar the folder: the device tool returns a limited number of files)
"""
import argparse
import os
import re
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("top", nargs="?", type=int, default=40, help="largest kernels to print")
    ap.add_argument("--match", nargs="*", default=[], help="mangled-name substrings")
    ap.add_argument("--dump", help="folder for the printed kernels' SASS")
    a = ap.parse_args()
    counts, post, text, fn = {}, {}, {}, None
    waited = False
    for line in sys.stdin:
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            fn, waited = m.group(1), False
            counts[fn], post[fn], text[fn] = 0, 0, []
            continue
        if fn is None:
            continue
        if a.dump:
            text[fn].append(line)
        # An instruction line starts with its offset comment, /*0a30*/; the encoding's second
        # half on the next line is /* 0x... */ and does not match.
        if re.search(r"/\*[0-9a-f]{4,}\*/", line):
            counts[fn] += 1
            if waited:
                post[fn] += 1
            elif "ACQBULK" in line:
                waited = True
    names = [n for n in counts if not a.match or any(s in n for s in a.match)]
    total = sum(counts[n] for n in names)
    print(f"[sass] {len(names)} kernels, {total} instructions ({16 * total / 1024:.0f} KB)")
    shown = sorted(names, key=lambda n: -counts[n])[:a.top]
    for name in shown:
        print(f"  {counts[name]:6d} {16 * counts[name] / 1024:6.1f} KB  after the wait "
              f"{post[name]:6d}  {name[:150]}")
    if a.dump:
        os.makedirs(a.dump, exist_ok=True)
        for name in shown:
            short = re.sub(r"[^A-Za-z0-9]+", "_", name)[-150:]
            with open(os.path.join(a.dump, short + ".sass"), "w") as f:
                f.writelines(text[name])


if __name__ == "__main__":
    main()
