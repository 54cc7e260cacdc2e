#!/usr/bin/env python3
"""Fails when docs/architecture.md does not name a module of a crate.

Every non-test source file under each crate's src/ (test files: `tests.rs`, `*_tests.rs`,
files under a `tests/` folder) must appear in the map by its path relative to the crate's
src/ in backticks: `dispatch/tools.rs`; a folder's `mod.rs` is named by `dispatch/mod.rs` or
by the folder itself, `dispatch/`. A crate's section starts with a heading naming the crate
(`quiver-server`), so the same relative path in two crates is told apart.

It also holds the test layout the map states: unit tests in a `mod tests` at the end of the
file; grown out of it, a folder module's tests in the folder's `tests.rs`, a file module
`x.rs`'s in `x_tests.rs` beside it, never in a `tests/` folder under src/ (that place is for
a crate's integration tests, beside src/).

Usage: scripts/check-architecture.py [DOC]   (default: docs/architecture.md)
"""

import os
import re
import sys

CRATES = {"quiver-model": "model/src", "quiver-otel": "otel/src", "quiver-flags": "flags/src",
          "quiver-server": "server/src", "quiver-operator": "operator/src"}


def sections(text):
    """The text of the doc under each crate's headings (a heading naming the crate)."""
    out, cur = {c: "" for c in CRATES}, None
    for line in text.splitlines():
        if line.startswith("#"):
            cur = next((c for c in CRATES if f"`{c}`" in line or f" {c}" in line), cur if line.startswith("###") else None)
        if cur:
            out[cur] += line + "\n"
    return out


def files(src):
    for dirpath, dirs, names in os.walk(src):
        dirs[:] = [d for d in dirs if d != "tests"]
        for n in names:
            if n.endswith(".rs") and n != "tests.rs" and not n.endswith("_tests.rs"):
                yield os.path.relpath(os.path.join(dirpath, n), src)


def layout_problems():
    out = []
    for src in CRATES.values():
        for dirpath, dirs, names in os.walk(src):
            rel = os.path.relpath(dirpath, src)
            if os.path.basename(dirpath) == "tests":
                out.append(f"{src}/{rel}: unit tests go in tests.rs or x_tests.rs, not a tests/ folder")
            if "tests.rs" in names and not ({"mod.rs", "lib.rs", "main.rs"} & set(names)):
                out.append(f"{src}/{rel}/tests.rs: a tests.rs holds a folder module's tests (beside its mod.rs)")
    return out


def main(argv):
    doc = argv[0] if argv else "docs/architecture.md"
    with open(doc, encoding="utf-8") as f:
        text = sections(f.read())
    missing = []
    for crate, src in CRATES.items():
        named = set(re.findall(r"`([^`\s]+)`", text[crate]))
        for rel in sorted(files(src)):
            names = {rel}
            if rel.endswith("/mod.rs"):
                names.add(rel[: -len("mod.rs")])
            if not names & named:
                missing.append(f"{crate}: {rel}")
    for m in missing:
        print(f"{doc} does not name {m}")
    layout = layout_problems()
    for m in layout:
        print(m)
    missing += layout
    if not missing:
        print(f"{doc} names every module of {', '.join(CRATES)}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
