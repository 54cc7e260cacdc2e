#!/usr/bin/env python3
"""Fails on a non-test function longer than the limit that does not say why.

A function may run long when splitting it would hide its logic (a flat table, a state
machine read top to bottom); it says so in a comment among the lines just above it (its doc
comment or attributes) that starts with `// Long:` followed by the reason.

Usage: scripts/check-fn-length.py [--max N] [--list] [SRC_DIR ...]
       (default: --max 100, model/src otel/src flags/src server/src operator/src)
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rustsrc import blank  # noqa: E402

FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\"[^\"]*\"\s+)?fn\s+([A-Za-z_]\w*)")
TEST_ATTR = re.compile(r"^\s*#\[(?:cfg\(test\)|test|tokio::test)")


def functions(path):
    """(name, first line, length, has reason) of every non-test fn in the file."""
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    lines, comments = blank(raw).split("\n"), raw.split("\n")
    out, i, skip_until = [], 0, -1
    while i < len(lines):
        line = lines[i]
        if i > skip_until and TEST_ATTR.match(line):
            # skip the item the attribute applies to
            depth, j, opened = 0, i + 1, False
            while j < len(lines):
                c = lines[j]
                depth += c.count("{") - c.count("}")
                opened = opened or "{" in c
                if (opened and depth <= 0) or (not opened and c.rstrip().endswith(";")):
                    break
                j += 1
            i = j + 1
            continue
        m = FN.match(line)
        if m:
            depth, j, opened = 0, i, False
            while j < len(lines):
                c = lines[j]
                depth += c.count("{") - c.count("}")
                opened = opened or "{" in c
                if opened and depth <= 0:
                    break
                if not opened and c.rstrip().endswith(";"):
                    break  # a declaration without a body (trait item)
                j += 1
            if opened:
                k, reason = i - 1, False
                while k >= 0 and re.match(r"^\s*(//|#\[|\*|/\*)", comments[k]):
                    reason = reason or re.match(r"^\s*// Long:\s*\S", comments[k]) is not None
                    k -= 1
                out.append((m.group(1), i + 1, j - i + 1, reason))
                # nested fns are counted inside their parent; continue after the header
        i += 1
    return out


def main(argv):
    limit, listing, srcs = 100, False, []
    while argv:
        a = argv.pop(0)
        if a == "--max":
            limit = int(argv.pop(0))
        elif a == "--list":
            listing = True
        else:
            srcs.append(a)
    srcs = srcs or ["model/src", "otel/src", "flags/src", "server/src", "operator/src"]
    bad, rows = [], []
    for src in srcs:
        for dirpath, _, files in os.walk(src):
            for f in sorted(files):
                if not f.endswith(".rs") or f == "tests.rs":
                    continue
                path = os.path.join(dirpath, f)
                for name, line, length, reason in functions(path):
                    rows.append((length, f"{path}:{line} {name}", reason))
                    if length > limit and not reason:
                        bad.append((length, f"{path}:{line} {name}"))
    if listing:
        for length, where, reason in sorted(rows, reverse=True)[:20]:
            print(f"{length:5} {where}{'  (says why)' if reason else ''}")
    for length, where in sorted(bad, reverse=True):
        print(f"{where}: {length} lines (over {limit}; split it, or say why in a '// Long:' comment above it)")
    if not bad:
        print(f"no non-test function over {limit} lines without a reason ({', '.join(srcs)})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
