#!/usr/bin/env python3
"""Collect permissively licensed Python source and documentation from installed Debian packages.

Runs on the development machine (Debian 12, standard library only) after
    apt-get install -y <the packages in PACKAGES below>
and writes the demo model's training data into --out-dir (default .demo_data/, git-ignored):
    train.jsonl.xz   one JSON object per line: {"pkg": ..., "path": ..., "text": ...}
    valid.jsonl.xz   the held-out split, same format (a file lands here iff sha256(text) % 1000 < 15)
    manifest.json    packages, versions, licences, file/byte counts, excluded packages and files
The tokenizer is applied on the GPU machine (HF `tokenizers`, 16 cores), so the carried folder holds
compressed text: about 5x smaller than the raw bytes.

Licensing: a package is used only if the licence of its `Files: *` paragraph in
/usr/share/doc/<pkg>/copyright is permissive (ALLOWED_LICENCES). Inside a used package, any file whose
own DEP-5 paragraph names a non-permissive licence is dropped, and so is any file whose header
mentions the GPL/LGPL/AGPL/MPL (a safety net for files the copyright file does not list).
"""
import argparse
import fnmatch
import hashlib
import json
import lzma
import os
import random
import re
import subprocess
import sys

# Debian package -> short name used in docs. Order = priority when the size cap is hit.
PACKAGES = [
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "python3.11-doc",
    "python3-numpy",
    "python3-scipy",
    "python3-sympy",
    "python3-django",
    "python3-networkx",
    "python3-sqlalchemy",
    "python3-pandas",
    "python3-sklearn",
    "python3-matplotlib",
    "python3-astropy",
    "python3-twisted",
    "python3-tornado",
    "python3-jinja2",
    "python3-pygments",
    "python3-sphinx",
    "python3-babel",
    "python3-requests",
    "python3-setuptools",
    "python3-nltk",
    "python3-pip",
    "python3-docutils",
    "python3-urllib3",
    "python3-mpmath",
    "python3-dateutil",
    "python3-attr",
    "python3-markdown",
    "python3-yaml",
    "python3-packaging",
    "python3-psutil",
    "python3-pytest",
    "python3-hypothesis",
    "python3-torch",
]

# Normalised licence short names we accept for training data.
ALLOWED_LICENCES = {
    "mit", "expat", "x11", "bsd", "bsd-3", "bsd-2", "bsd-2-clause", "bsd-3-clause", "bsd-4-clause-uc", "0bsd", "isc",
    "apache-2.0", "apache-2", "apache", "psf", "psf-2", "psf-2.0", "python", "python-2.0", "psfl",
    "zlib", "public-domain", "publicdomain", "cc0", "cc0-1.0", "unlicense", "hpnd", "mit-cmu",
    "sympy", "matplotlib", "bsd-like", "bsd-style", "mit-like", "mit/x11", "psf-license",
}
DOC_EXTS = (".rst", ".txt", ".md", ".rst.txt")
SRC_ROOTS = ("/usr/lib/python3/dist-packages/", "/usr/lib/python3.11/", "/usr/share/doc/python3.11/html/_sources/")
MAX_FILE_BYTES = 400_000
MAX_LINE_CHARS = 2_000
HEADER_BAD = re.compile(r"GNU (Lesser |Library |Affero )?General Public License|\bL?GPL(v?[23])?\b|Mozilla Public License",
                        re.IGNORECASE)


def fail(msg):
    print(f"prepare_demo_data: ERROR: {msg}", file=sys.stderr)
    sys.exit(1)


def norm_licence(s):
    s = s.strip().lower()
    s = s.replace(" ", "-")
    s = re.sub(r"\+$", "", s)
    return s


def licence_ok(expr):
    if expr in KNOWN_LICENCES.values():
        return True
    # DEP-5 licence expressions: "BSD-3-clause or GPL-2+" is fine if one side is allowed,
    # "X and Y" needs both.
    expr = expr.strip()
    if not expr:
        return False
    for alt in re.split(r"\s+or\s+", expr, flags=re.IGNORECASE):
        parts = re.split(r"\s+and\s+|,\s*", alt, flags=re.IGNORECASE)
        if all(norm_licence(p) in ALLOWED_LICENCES for p in parts if p.strip()):
            return True
    return False


# Packages whose copyright file is free-form (not DEP-5) or whose `Files: *` licence is given as
# full text only: the licence read by hand from /usr/share/doc/<pkg>/copyright.
KNOWN_LICENCES = {
    "libpython3.11-minimal": "PSF-2",
    "libpython3.11-stdlib": "PSF-2",
    "python3.11-doc": "PSF-2",
    "python3-numpy": "BSD-3-clause",
    "python3-matplotlib": "Matplotlib (PSF-based, BSD-compatible)",
}


def classify_licence_text(body):
    low = body.lower()
    if "python software foundation" in low or "psf license" in low or "based on the psf license" in low:
        return "PSF"
    if "permission is hereby granted, free of charge" in low:
        return "Expat"
    if "redistribution and use in source and binary forms" in low:
        return "BSD"
    if "apache license" in low and "version 2.0" in low:
        return "Apache-2.0"
    return None


def parse_copyright(pkg):
    """Returns (main_licence, [(patterns, licence)], machine_readable) from the DEP-5 copyright file."""
    path = f"/usr/share/doc/{pkg}/copyright"
    if not os.path.isfile(path):
        return KNOWN_LICENCES.get(pkg), [], False
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    machine = text.startswith("Format:") or text.startswith("Format-Specification:")
    main, rules = None, []
    if machine:
        for para in re.split(r"\n\s*\n", text):
            files = re.search(r"^Files:\s*(.*(?:\n[ \t]+.*)*)", para, re.MULTILINE)
            lic = re.search(r"^License:[ \t]*(.*)((?:\n[ \t]+.*)*)", para, re.MULTILINE)
            if not files or not lic:
                continue
            pats = files.group(1).split()
            licence = lic.group(1).strip() or classify_licence_text(lic.group(2)) or "unknown"
            if "*" in pats:
                main = licence
            else:
                rules.append((pats, licence))
    if pkg in KNOWN_LICENCES:
        main = KNOWN_LICENCES[pkg]
    elif main is None or main == "unknown":
        main = classify_licence_text(text)
    return main, rules, machine


def file_rule_licence(rules, relpath):
    """Licence of the most specific DEP-5 paragraph matching relpath (upstream-relative, best effort)."""
    found = None
    for pats, licence in rules:
        for p in pats:
            if p.startswith("debian/"):
                continue
            tail = p.split("/", 1)[1] if "/" in p else p
            if fnmatch.fnmatch(relpath, p) or fnmatch.fnmatch(relpath, "*/" + p) or \
               fnmatch.fnmatch(relpath, "*/" + tail):
                found = licence
    return found


def pkg_version(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def pkg_files(pkg):
    r = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True)
    if r.returncode != 0:
        return []
    out = []
    for line in r.stdout.splitlines():
        if not line.startswith(SRC_ROOTS):
            continue
        if "/dist-packages/" not in line and "/python3.11/" in line and "/site-packages/" in line:
            continue
        low = line.lower()
        if low.endswith(".py") or low.endswith(DOC_EXTS):
            if os.path.isfile(line) and not os.path.islink(line):
                out.append(line)
    return sorted(out)


def relpath_of(path):
    for root in SRC_ROOTS:
        if path.startswith(root):
            return path[len(root):]
    return path


def usable_text(data):
    if len(data) > MAX_FILE_BYTES or len(data) < 64:
        return None, "size"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not-utf8"
    if "\x00" in text:
        return None, "binary"
    text = text.replace("\r\n", "\n")
    lines = text.split("\n")
    if max(len(l) for l in lines) > MAX_LINE_CHARS:
        return None, "long-lines"
    if HEADER_BAD.search(text[:6000]):
        return None, "copyleft-header"
    return text, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=".demo_data")
    ap.add_argument("--max-compressed-mb", type=float, default=28.0,
                    help="stop adding packages when the estimated xz size of train+valid passes this")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--packages", default=",".join(PACKAGES))
    args = ap.parse_args()

    os.makedirs(args.out_dir, exist_ok=True)
    seen = set()
    docs = []
    pkg_report, excluded_pkgs = [], []
    excluded_files = {}
    est_compressed = 0.0
    for pkg in args.packages.split(","):
        version = pkg_version(pkg)
        if version is None:
            excluded_pkgs.append({"package": pkg, "reason": "not installed"})
            print(f"  skip {pkg}: not installed")
            continue
        main_lic, rules, machine = parse_copyright(pkg)
        if main_lic is None or not licence_ok(main_lic):
            excluded_pkgs.append({"package": pkg, "version": version, "licence": main_lic,
                                  "reason": "licence of Files: * is not on the permissive list"})
            print(f"  skip {pkg}: licence {main_lic!r}")
            continue
        other = sorted({lic for pats, lic in rules if not all(p.startswith("debian/") for p in pats)})
        n_files = n_bytes = n_dup = 0
        pkg_docs = []
        for path in pkg_files(pkg):
            rel = relpath_of(path)
            rule_lic = file_rule_licence(rules, rel)
            if rule_lic is not None and not licence_ok(rule_lic):
                excluded_files.setdefault(pkg, []).append(f"{rel} ({rule_lic})")
                continue
            with open(path, "rb") as f:
                data = f.read()
            text, why = usable_text(data)
            if text is None:
                if why == "copyleft-header":
                    excluded_files.setdefault(pkg, []).append(f"{rel} (copyleft header)")
                continue
            h = hashlib.sha256(text.encode("utf-8")).hexdigest()
            if h in seen:
                n_dup += 1
                continue
            seen.add(h)
            pkg_docs.append({"pkg": pkg, "path": rel, "text": text, "sha": h})
            n_files += 1
            n_bytes += len(text.encode("utf-8"))
        if not pkg_docs:
            excluded_pkgs.append({"package": pkg, "version": version, "licence": main_lic,
                                  "reason": "no usable .py/.rst/.txt/.md files"})
            continue
        # Python/reST compresses ~5x with xz -6; measured exactly at the end.
        est = n_bytes / 5.0 / 1e6
        if est_compressed + est > args.max_compressed_mb:
            excluded_pkgs.append({"package": pkg, "version": version, "licence": main_lic,
                                  "reason": f"size cap ({args.max_compressed_mb} MB compressed) reached"})
            print(f"  skip {pkg}: size cap")
            continue
        est_compressed += est
        docs.extend(pkg_docs)
        pkg_report.append({"package": pkg, "version": version, "licence": main_lic,
                           "other_licences_in_copyright": other, "machine_readable_copyright": machine,
                           "files": n_files, "bytes": n_bytes, "duplicates_dropped": n_dup,
                           "files_excluded_for_licence": len(excluded_files.get(pkg, []))})
        print(f"  take {pkg} {version} [{main_lic}]: {n_files} files, {n_bytes / 1e6:.1f} MB "
              f"({n_dup} duplicates, {len(excluded_files.get(pkg, []))} licence exclusions)")

    if not docs:
        fail("no documents collected; are the packages installed?")
    rng = random.Random(args.seed)
    docs.sort(key=lambda d: d["sha"])
    rng.shuffle(docs)
    train = [d for d in docs if int(d["sha"][:8], 16) % 1000 >= 15]
    valid = [d for d in docs if int(d["sha"][:8], 16) % 1000 < 15]
    sizes = {}
    for name, split in (("train", train), ("valid", valid)):
        path = os.path.join(args.out_dir, f"{name}.jsonl.xz")
        with lzma.open(path, "wt", encoding="utf-8", preset=6) as f:
            for d in split:
                f.write(json.dumps({"pkg": d["pkg"], "path": d["path"], "text": d["text"]}, ensure_ascii=False))
                f.write("\n")
        sizes[name] = os.path.getsize(path)
        print(f"  wrote {path}: {len(split)} files, {sum(len(d['text'].encode()) for d in split) / 1e6:.1f} MB "
              f"text, {sizes[name] / 1e6:.1f} MB compressed")
    manifest = {
        "seed": args.seed,
        "held_out_rule": "sha256(text) as int of first 8 hex digits % 1000 < 15 (1.5%)",
        "dedup": "exact, by sha256 of the file text after CRLF->LF",
        "filters": {"max_file_bytes": MAX_FILE_BYTES, "max_line_chars": MAX_LINE_CHARS,
                    "min_file_bytes": 64, "copyleft_header_regex": HEADER_BAD.pattern},
        "packages": pkg_report,
        "excluded_packages": excluded_pkgs,
        "excluded_files": excluded_files,
        "train": {"files": len(train), "bytes": sum(len(d["text"].encode()) for d in train),
                  "compressed_bytes": sizes["train"]},
        "valid": {"files": len(valid), "bytes": sum(len(d["text"].encode()) for d in valid),
                  "compressed_bytes": sizes["valid"]},
    }
    with open(os.path.join(args.out_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    total = sum(sizes.values())
    if total > 30e6:
        fail(f"compressed data is {total / 1e6:.1f} MB > 30 MB; lower --max-compressed-mb")
    print(f"prepare_demo_data: {len(train)} train / {len(valid)} valid files, {total / 1e6:.1f} MB in {args.out_dir}")


if __name__ == "__main__":
    main()
