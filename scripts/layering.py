#!/usr/bin/env python3
"""The house rules of docs/architecture.md that cargo cannot check:

- no `#[path]` includes (a file belongs to one crate, compiled once);
- no Rust source file over 900 lines;
- no import cycle between the top-level modules of one crate (test modules and doc comments
  aside: `a` uses `crate::b` and `b` uses `crate::a` is one tangle, not two modules).

Exits 1 naming every violation.
"""
import os
import re
import sys

MAX_LINES = 900
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {"target", "node_modules", ".git", ".ephem"}


def rust_files():
    for root, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        for name in files:
            if name.endswith(".rs"):
                yield os.path.join(root, name)


def code_only(text):
    """The file without its inline test module and without comment lines."""
    text = text.split("#[cfg(test)]\nmod tests {")[0]
    return "\n".join(line for line in text.split("\n") if not line.lstrip().startswith("//"))


def crates():
    for entry in sorted(os.listdir(ROOT)):
        if os.path.isfile(os.path.join(ROOT, entry, "Cargo.toml")) and os.path.isdir(os.path.join(ROOT, entry, "src")):
            yield entry


def module_graph(src):
    graph = {}
    for root, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs") or name == "tests.rs":
                continue
            rel = os.path.relpath(os.path.join(root, name), src)
            top = rel.split(os.sep)[0].removesuffix(".rs")
            if top in ("lib", "main", "bin"):
                continue
            with open(os.path.join(root, name), encoding="utf-8") as f:
                for used in re.findall(r"\bcrate::([a-z_0-9]+)", code_only(f.read())):
                    if used != top:
                        graph.setdefault(top, set()).add(used)
    return graph


def cycles(graph):
    """Every module that reaches itself through `crate::` uses, as the path that does."""
    found = []
    for start in sorted(graph):
        stack = [(start, [start])]
        seen = set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    cycle = path + [start]
                    if min(cycle[:-1]) == start:  # report each cycle once
                        found.append(" -> ".join(cycle))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return found


def main():
    problems = []
    for path in rust_files():
        rel = os.path.relpath(path, ROOT)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if re.search(r"#\[path\s*=", text):
            problems.append(f"{rel}: a #[path] include")
        lines = text.count("\n")
        if lines > MAX_LINES:
            problems.append(f"{rel}: {lines} lines (at most {MAX_LINES})")
    for crate in crates():
        for cycle in cycles(module_graph(os.path.join(ROOT, crate, "src"))):
            problems.append(f"{crate}: modules import each other: {cycle}")
    for problem in problems:
        print(f"layering: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"layering: no #[path] include, no file over {MAX_LINES} lines, no import cycle between a crate's modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
