#!/usr/bin/env python3
"""Fails when an ELF binary needs a glibc symbol version above a ceiling (default 2.34, the glibc
of the Lambda runtime provided.al2023).

    check-glibc.py [--max 2.34] PATH...

A PATH is an ELF file, a zip (every member that is an ELF file, e.g. a Lambda's bootstrap.zip) or
a directory (every ELF file and zip under it, recursively). The versions are the ones the dynamic
loader checks: the version needs of .gnu.version_r, each with the dynamic symbols that use it
(.gnu.version). A version above the ceiling, GLIBC_PRIVATE, a file that is not ELF, an ELF
without section headers, or no ELF at all is a failure; each is named with the binary and the
symbols. Exit 0: all pass; 1: a failure; 2: bad arguments.

Needs pyelftools (pinned in scripts/build-lambdas.sh, which installs it with the Lambda tools).
"""
import argparse
import io
import os
import re
import sys
import zipfile

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

ELF_MAGIC = b"\x7fELF"
GLIBC = re.compile(r"^GLIBC_(\d+(?:\.\d+)+)$")


def parse_version(text):
    """'2.34' -> (2, 34); compared as numbers, never as strings (2.4 < 2.34)."""
    return tuple(int(part) for part in text.split("."))


def order(name):
    """Sort key of a version name: GLIBC_2.9 before GLIBC_2.14, GLIBC_PRIVATE last."""
    match = GLIBC.match(name)
    return (0, parse_version(match.group(1))) if match else (1, ())


def glibc_needs(stream):
    """[(version, library, [symbols])] for every GLIBC_* (and GLIBC_PRIVATE) version the ELF needs."""
    elf = ELFFile(stream)
    if elf.num_sections() == 0:
        if any(seg["p_type"] == "PT_DYNAMIC" for seg in elf.iter_segments()):
            raise ELFError("dynamically linked but has no section headers: versions unreadable")
        return []  # static, no dynamic section: it needs no glibc at run time
    verneed = versym = dynsym = None
    for section in elf.iter_sections():
        kind = section["sh_type"]
        if kind == "SHT_GNU_verneed":
            verneed = section
        elif kind == "SHT_GNU_versym":
            versym = section
        elif kind == "SHT_DYNSYM":
            dynsym = section
    if verneed is None:
        return []
    # Version index -> (name, library).
    by_index = {}
    for need, auxes in verneed.iter_versions():
        for aux in auxes:
            by_index[aux["vna_other"]] = (aux.name, need.name)
    symbols = {index: [] for index in by_index}
    if versym is not None and dynsym is not None:
        for i, symbol in enumerate(dynsym.iter_symbols()):
            ndx = versym.get_symbol(i)["ndx"]
            if isinstance(ndx, int):
                ndx &= 0x7FFF  # the hidden bit
                if ndx in symbols and symbol.name:
                    symbols[ndx].append(symbol.name)
    out = []
    for index, (name, library) in by_index.items():
        if name.startswith("GLIBC_"):
            out.append((name, library, sorted(set(symbols[index]))))
    return out


def check_one(label, data, ceiling):
    """(ok, message) for one file's bytes."""
    if not data.startswith(ELF_MAGIC):
        return False, f"FAIL {label}: not an ELF file"
    try:
        needs = glibc_needs(io.BytesIO(data))
    except (ELFError, ValueError, KeyError) as err:
        return False, f"FAIL {label}: unreadable ELF ({err})"
    bad = []
    highest = None
    for name, library, syms in needs:
        match = GLIBC.match(name)
        if match is None:  # GLIBC_PRIVATE: tied to one build of glibc
            bad.append((name, library, syms))
            continue
        version = parse_version(match.group(1))
        if highest is None or version > highest[0]:
            highest = (version, name)
        if version > ceiling:
            bad.append((name, library, syms))
    if bad:
        parts = []
        for name, library, syms in sorted(bad, key=lambda b: order(b[0])):
            named = ", ".join(f"{s}@{name}" for s in syms) or f"(no symbol) {name}"
            parts.append(f"{named} ({library})")
        return False, f"FAIL {label}: needs " + "; ".join(parts)
    top = highest[1] if highest else "no glibc version"
    return True, f"ok   {label}: {top} at most"


def inputs(path):
    """(label, bytes) for every candidate under path."""
    if os.path.isdir(path):
        found = []
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                full = os.path.join(root, name)
                if os.path.islink(full) or not os.path.isfile(full):
                    continue
                if name.endswith(".zip"):
                    found.extend(inputs(full))
                else:
                    with open(full, "rb") as f:
                        if f.read(4) == ELF_MAGIC:
                            f.seek(0)
                            found.append((full, f.read()))
        return found
    if zipfile.is_zipfile(path):
        found = []
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if info.is_dir():
                    continue
                data = z.read(info)
                # A Lambda zip's entry point must be ELF even if someone renamed a script into it.
                if data.startswith(ELF_MAGIC) or info.filename == "bootstrap":
                    found.append((f"{path}:{info.filename}", data))
        if not found:
            found.append((path, b""))  # reported as not ELF
        return found
    with open(path, "rb") as f:
        return [(path, f.read())]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max", default="2.34", help="highest glibc version allowed (default 2.34)")
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    try:
        ceiling = parse_version(args.max)
    except ValueError:
        parser.error(f"--max: not a version: {args.max}")
    failures = checked = 0
    for path in args.paths:
        if not os.path.exists(path):
            print(f"FAIL {path}: no such file", file=sys.stderr)
            failures += 1
            continue
        found = inputs(path)
        if not found:
            print(f"FAIL {path}: no ELF file found", file=sys.stderr)
            failures += 1
        for label, data in found:
            ok, message = check_one(label, data, ceiling)
            checked += 1
            print(message, file=sys.stdout if ok else sys.stderr)
            failures += not ok
    print(f"glibc ceiling {args.max}: {checked} binaries, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
