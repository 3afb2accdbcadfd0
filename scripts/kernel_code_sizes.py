#!/usr/bin/env python3
"""Code bytes of every CUDA kernel in object files or binaries, without cuobjdump.

nvcc embeds each kernel's machine code (a cubin: an ELF of machine EM_CUDA) in the host object's
fatbin; every kernel is a section .text.<mangled name>. This finds the uncompressed cubins in the
given files, reads their section tables with readelf and prints one line per kernel: bytes,
instructions (16 bytes each on sm_90), the demangled name. Code run for the first time costs an
SM ~0.2 us per KB (docs/batch1_decode.md, "Cold code"), so this is how a change to a decode
kernel's size is checked before it goes to the GPU. Fatbins that nvcc compressed (large
translation units) show nothing; compare builds of the same unit.

  python3 scripts/kernel_code_sizes.py build-cuda/src/backend/CMakeFiles/di_backend_cuda.dir/cuda/kernels/gemv.cu.o
  python3 scripts/kernel_code_sizes.py --match combine_splits some.cu.o other.cu.o
  python3 scripts/kernel_code_sizes.py --budget tests/ops/kernel_code_budget.txt DIR_OR_OBJECTS...

--budget FILE: lines "<max instructions> <kernel name as printed>" ('#' comments); exits 1 when a
listed kernel is larger or is not found (a rename needs the budget updated too). A directory
argument stands for the .o files under it. Needs readelf and c++filt (binutils); stdlib
otherwise.

--compare OLD NEW: whether each kernel's machine code is byte for byte the same in two builds
(objects or folders of objects, e.g. a translation unit compiled from two commits with the same
flags): one line per kernel that differs or is in only one of them, then a count; exits 1 when a
kernel in both differs. Without a GPU this is how a refactor shows that the kernels that stay
run the same code (run 46: every kept kernel identical to afcdc3e's). Kernels are matched by
demangled name, so the anonymous-namespace hash of a changed file does not count.

  python3 scripts/kernel_code_sizes.py --compare /tmp/old/moe_gemm.o build-cuda/.../moe_gemm.cu.o
"""
import os
import argparse
import re
import struct
import subprocess
import sys
import tempfile

EM_CUDA = 0xBE


def cubins(data):
    """Yields the bytes of each 64-bit little-endian ELF of machine EM_CUDA inside data."""
    at = 0
    while True:
        at = data.find(b"\x7fELF\x02\x01\x01", at)
        if at < 0:
            return
        if struct.unpack_from("<H", data, at + 0x12)[0] != EM_CUDA:
            at += 4
            continue
        shoff = struct.unpack_from("<Q", data, at + 0x28)[0]
        shentsize, shnum = struct.unpack_from("<HH", data, at + 0x3A)
        end = at + shoff + shentsize * shnum
        yield data[at:end]
        at = end


def kernel_code(cubin):
    """(mangled name, machine code) of each .text.<name> section of one cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(["readelf", "-SW", f.name], capture_output=True, text=True).stdout
    code = []
    for line in out.splitlines():
        m = re.search(r"\]\s+\.text\.(\S+)\s+PROGBITS\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if m:
            offset, size = int(m.group(2), 16), int(m.group(3), 16)
            code.append((m.group(1), cubin[offset : offset + size]))
    return code


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return out.stdout.splitlines()


def check_budget(path, rows):
    found = {}
    for size, name in rows:
        found[name] = max(found.get(name, 0), size // 16)
    bad = 0
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            limit, name = line.split(None, 1)
            have = found.get(name)
            if have is None:
                print(f"MISSING  {name} (budget {limit})")
                bad += 1
            elif have > int(limit):
                print(f"OVER     {have:6d} > {int(limit):6d}  {name}")
                bad += 1
            else:
                print(f"ok       {have:6d} <= {int(limit):6d}  {name}")
    print(f"{bad} kernel(s) over budget or missing" if bad else "every kernel within its budget")
    return 1 if bad else 0


def object_paths(path):
    if not os.path.isdir(path):
        return [path]
    paths = []
    for root, _, names in os.walk(path):
        paths += [os.path.join(root, n) for n in sorted(names) if n.endswith(".o")]
    return paths


def kernels(paths, match=""):
    """(demangled name, machine code) of every kernel in the files; names without namespaces."""
    out = []
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        for cubin in cubins(data):
            code = kernel_code(cubin)
            for (_, text), name in zip(code, demangle([m for m, _ in code])):
                name = re.sub(r"di::cuda::|\(anonymous namespace\)::", "", name)
                if match in name:
                    out.append((name, text))
    return out


def compare(old_path, new_path, match):
    old, new = dict(kernels(object_paths(old_path), match)), dict(kernels(object_paths(new_path), match))
    if not old or not new:
        print("no uncompressed kernel code found on one side (or nothing matched)", file=sys.stderr)
        return 1
    both = sorted(set(old) & set(new))
    differ = [n for n in both if old[n] != new[n]]
    for n in differ:
        print(f"DIFFERS  {len(old[n]) // 16:6d} -> {len(new[n]) // 16:6d} instr  {n}")
    for n in sorted(set(old) - set(new)):
        print(f"OLD ONLY {len(old[n]) // 16:6d} instr  {n}")
    for n in sorted(set(new) - set(old)):
        print(f"NEW ONLY {len(new[n]) // 16:6d} instr  {n}")
    print(f"{len(both) - len(differ)} of {len(both)} kernels in both builds identical; "
          f"{len(set(old) - set(new))} only in the old one, {len(set(new) - set(old))} only in the new")
    return 1 if differ else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="object files or binaries with embedded cubins")
    ap.add_argument("--match", default="", help="only kernels whose demangled name contains this")
    ap.add_argument("--budget", help="check the kernels listed in this file against their maxima")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"),
                    help="is every kernel's machine code the same in two builds")
    args = ap.parse_args()
    if args.compare:
        return compare(args.compare[0], args.compare[1], args.match)
    if not args.files:
        ap.error("give object files or folders (or --compare OLD NEW)")
    paths = [p for path in args.files for p in object_paths(path)]
    rows = [(len(text), name) for name, text in kernels(paths, args.match)]
    if not rows:
        print("no uncompressed kernel code found (or nothing matched)", file=sys.stderr)
        return 1
    if args.budget:
        return check_budget(args.budget, rows)
    for size, name in sorted(rows):
        print(f"{size:8d} B {size // 16:6d} instr  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
