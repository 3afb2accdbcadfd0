#!/usr/bin/env python3
"""Code bytes of every CUDA kernel in object files or binaries, without cuobjdump.

nvcc embeds each kernel's machine code (a cubin: an ELF of machine EM_CUDA) in the host object's
fatbin; every kernel is a section .text.<mangled name>. This finds the uncompressed cubins in the
given files, reads their section tables with readelf and prints one line per kernel: bytes,
instructions (16 bytes each on sm_90), the demangled name. Code run for the first time costs an
SM ~0.2 us per KB (docs/cuda_backend.md, "Cold code"), so this is how a change to a decode
kernel's size is checked before it goes to the GPU. Fatbins that nvcc compressed (large
translation units) show nothing; compare builds of the same unit.

  python3 scripts/kernel_code_sizes.py build-cuda/src/backend/CMakeFiles/di_backend_cuda.dir/cuda/kernels/gemv.cu.o
  python3 scripts/kernel_code_sizes.py --match combine_splits some.cu.o other.cu.o

Needs readelf and c++filt (binutils). Stdlib only otherwise.
"""
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


def kernel_sizes(cubin):
    """(mangled name, bytes) of each .text.<name> section of one cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(["readelf", "-SW", f.name], capture_output=True, text=True).stdout
    sizes = []
    for line in out.splitlines():
        m = re.search(r"\]\s+\.text\.(\S+)\s+PROGBITS\s+\S+\s+\S+\s+([0-9a-f]+)", line)
        if m:
            sizes.append((m.group(1), int(m.group(2), 16)))
    return sizes


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return out.stdout.splitlines()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="object files or binaries with embedded cubins")
    ap.add_argument("--match", default="", help="only kernels whose demangled name contains this")
    args = ap.parse_args()
    rows = []
    for path in args.files:
        with open(path, "rb") as f:
            data = f.read()
        for cubin in cubins(data):
            sizes = kernel_sizes(cubin)
            for (mangled, size), name in zip(sizes, demangle([m for m, _ in sizes])):
                name = re.sub(r"di::cuda::|\(anonymous namespace\)::", "", name)
                if args.match in name:
                    rows.append((size, name))
    if not rows:
        print("no uncompressed kernel code found (or nothing matched)", file=sys.stderr)
        return 1
    for size, name in sorted(rows):
        print(f"{size:8d} B {size // 16:6d} instr  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
