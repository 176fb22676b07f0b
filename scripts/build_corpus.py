#!/usr/bin/env python3
"""Builds a realistic English text corpus with no network: Debian package descriptions.

Reads apt's `Translation-en` indexes (fetch them once with
`apt-get update -o Acquire::Languages=en`; they land in /var/lib/apt/lists/, lz4/gz/xz compressed
or plain), takes one document per package (short description + long description), drops
duplicate packages and duplicate texts, orders documents deterministically (by SHA-256 of the
package name, which mixes library, tool and game descriptions evenly), and writes the first
`--count` as JSONL lines `{"id": <package>, "text": <description>}`.

Same inputs give the same file byte for byte. Standard library only (decompression through
`apt-helper cat-file`, `lz4cat`, or Python's gzip/lzma).

  python3 scripts/build_corpus.py --count 2000 --out /tmp/corpus-2000.jsonl
"""

import argparse
import glob
import gzip
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys

LISTS = "/var/lib/apt/lists"


def read_index(path):
    if path.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            return f.read()
    if path.endswith(".xz"):
        with lzma.open(path, "rt", encoding="utf-8", errors="replace") as f:
            return f.read()
    if path.endswith(".lz4"):
        for tool in (["/usr/lib/apt/apt-helper", "cat-file"], ["lz4cat"]):
            if shutil.which(tool[0]) or os.path.exists(tool[0]):
                out = subprocess.run(tool + [path], check=True, capture_output=True).stdout
                return out.decode("utf-8", errors="replace")
        sys.exit(f"{path}: need apt-helper or lz4cat to decompress")
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def parse(text):
    """Yields (package, description) for every stanza with a Description-en field."""
    for stanza in text.split("\n\n"):
        package, lines, in_description = None, [], False
        for line in stanza.split("\n"):
            if line.startswith("Package:"):
                package = line.split(":", 1)[1].strip()
                in_description = False
            elif line.startswith("Description-en:"):
                lines = [line.split(":", 1)[1].strip()]
                in_description = True
            elif in_description and line.startswith(" "):
                body = line[1:]
                lines.append("" if body.strip() == "." else body)
            else:
                in_description = False
        if package and lines and lines[0]:
            yield package, "\n".join(lines).strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=2000, help="documents to write (default 2000)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--lists", default=LISTS, help="directory with *Translation-en* files")
    args = ap.parse_args()

    files = sorted(glob.glob(os.path.join(args.lists, "*Translation-en*")))
    if not files:
        sys.exit(f"no Translation-en index in {args.lists}: run `apt-get update -o Acquire::Languages=en`")
    # Main archive first, then updates/security: the first description of a package wins.
    files.sort(key=lambda p: (("security" in p) or ("updates" in p), p))
    by_package = {}
    for path in files:
        for package, description in parse(read_index(path)):
            by_package.setdefault(package, description)
    seen_texts = set()
    docs = []
    for package in sorted(by_package, key=lambda p: (hashlib.sha256(p.encode()).hexdigest(), p)):
        text = by_package[package]
        if text in seen_texts:
            continue
        seen_texts.add(text)
        docs.append((package, text))
    if len(docs) < args.count:
        sys.exit(f"only {len(docs)} distinct documents available, {args.count} asked")
    with open(args.out, "w", encoding="utf-8") as f:
        for package, text in docs[: args.count]:
            f.write(json.dumps({"id": package, "text": text}, ensure_ascii=False) + "\n")
    chars = sum(len(t) for _, t in docs[: args.count])
    print(f"{args.out}: {args.count} documents ({chars / args.count:.0f} characters mean) "
          f"from {len(docs)} distinct descriptions in {len(files)} index files")


if __name__ == "__main__":
    main()
