#!/usr/bin/env python3
"""Fails when the modules of a crate import each other in a cycle.

Nodes are a crate's modules (one per file: `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`;
inline `mod x { .. }` blocks other than `mod tests` count as part of their file). An edge
A -> B is a path in A's non-test code that names B: `crate::b::..`, `super::..`,
`self::..` in `use` items and in expressions. A path names the deepest module it reaches,
so `use crate::config::HttpTool` names `config` (whose `pub use` then names where the type
lives); a bare `child::x` in a file names that file's child module.

Edges between a module and its own ancestor or descendant are left out: a folder module
orchestrating its children and the children sharing the folder's items is one subsystem,
not a layering problem (and a `mod` declaration is no dependency). A cycle between two
subsystems is reported however it runs, e.g. `config::compile` calling
`handlers::http`'s compile step while `handlers::http` uses `config::compile`'s context.

The same graph collapsed to a crate's top-level folders (`dispatch`, `exec`, `transport`, a
top-level file being its own folder) must be acyclic too: that is where layers hold or do
not. Test files (`tests.rs`, `*_tests.rs`, `#[cfg(test)]` items) are not counted.

Usage: scripts/check-cycles.py [CRATE_SRC_DIR ...]
       (default: model/src otel/src flags/src server/src operator/src)
Exit status 1 and each cycle printed when there is one.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rustsrc import blank  # noqa: E402

TEST_MOD = re.compile(r"^\s*#\[cfg\(test\)\]\s*$")
PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+|::\{)")
# A path that starts with a bare name (2018 edition): `child::x` names a child module of the
# file it is in (a crate of the same name would make the path ambiguous, a compile error).
BARE = re.compile(r"(?<![\w:])([A-Za-z_][A-Za-z0-9_]*)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{")


def modules(src):
    """Map module path tuple -> file for every module file under src."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] == "mod":
                parts = parts[:-1]
            if parts in (["lib"], ["main"]):
                parts = []
            if parts and parts[0] == "bin":
                continue  # binaries are their own crates
            if parts and (parts[-1] == "tests" or parts[-1].endswith("_tests")) and len(parts) > 1:
                continue  # a tests.rs child module or an x_tests.rs file is test code
            mods[tuple(parts)] = os.path.join(dirpath, f)
    return mods


def strip(text):
    """Drop comments, string literals and #[cfg(test)] items (to their closing brace)."""
    text = blank(text)
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        if TEST_MOD.match(lines[i]):
            # skip the next item: up to its matching closing brace (or `;` for a one-liner)
            depth, j, opened = 0, i + 1, False
            while j < len(lines):
                depth += lines[j].count("{") - lines[j].count("}")
                opened = opened or "{" in lines[j]
                if (opened and depth <= 0) or (not opened and lines[j].rstrip().endswith(";")):
                    break
                j += 1
            i = j + 1
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def resolve(mods, here, head, rest):
    """The deepest module a path names, or None outside the crate's modules."""
    if head == "crate":
        base = []
    elif head == "self":
        base = list(here)
    else:
        base = list(here[:-1])
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    best = tuple(base) if tuple(base) in mods else None
    for seg in rest:
        base.append(seg)
        if tuple(base) in mods:
            best = tuple(base)
        else:
            break
    return best


def group_items(text, start):
    """Top-level names inside the `{ .. }` group starting at text[start] == '{'."""
    depth, i, cur, names = 0, start, "", []
    while i < len(text):
        c = text[i]
        if c == "{":
            depth += 1
            if depth == 1:
                i += 1
                continue
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
        if depth == 1 and c == ",":
            names.append(cur.strip())
            cur = ""
        else:
            cur += c
        i += 1
    names.append(cur.strip())
    return [n for n in names if n]


def edges(mods):
    graph = {m: set() for m in mods}
    for here, path in mods.items():
        with open(path, encoding="utf-8") as f:
            text = strip(f.read())
        targets = []
        for m in PATH.finditer(text):
            rest = [s for s in m.group(2).split("::") if s and s != "{"]
            targets.append((m.group(1), rest))
        for m in BARE.finditer(text):
            if m.group(1) not in ("crate", "super", "self") and here + (m.group(1),) in mods:
                targets.append(("self", [m.group(1)] + [s for s in m.group(2).split("::") if s]))
        for m in USE_GROUP.finditer(text):
            prefix = [s for s in m.group(2).split("::") if s]
            for item in group_items(text, m.end() - 1):
                first = re.split(r"[\s:{]", item, maxsplit=1)[0]
                if first and first != "self":
                    targets.append((m.group(1), prefix + [first] + [s for s in re.findall(r"::([A-Za-z_]\w*)", item)]))
        for head, rest in targets:
            to = resolve(mods, here, head, rest)
            if to is None or to[: len(here)] == here or here[: len(to)] == to:
                continue  # itself, an ancestor or a descendant
            graph[here].add(to)
    return graph


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def name(m):
    return "::".join(m) or "crate"


def one_cycle(graph, comp):
    """A shortest cycle through the component's first module, for the message."""
    comp_set, start = set(comp), comp[0]
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w in comp_set and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def folders(graph):
    """The module graph collapsed to top-level folders, and one module edge per folder edge."""
    out, why = {}, {}
    for here, targets in graph.items():
        if not here:
            continue
        out.setdefault((here[0],), set())
        for to in targets:
            if to and to[0] != here[0]:
                out[(here[0],)].add((to[0],))
                why.setdefault(((here[0],), (to[0],)), (here, to))
    return out, why


def report(src, kind, graph, why=None):
    found = cycles(graph)
    for comp in found:
        print(f"{src}: import cycle among {len(comp)} {kind}: {', '.join(name(m) for m in comp)}")
        path = one_cycle(graph, comp)
        print("  e.g. " + " -> ".join(name(m) for m in path))
        if why:
            for a, b in zip(path, path[1:]):
                print(f"    {name(a)} -> {name(b)}: {name(why[(a, b)][0])} uses {name(why[(a, b)][1])}")
    return bool(found)


def main(argv):
    srcs = argv or ["model/src", "otel/src", "flags/src", "server/src", "operator/src"]
    bad = False
    for src in srcs:
        mods = modules(src)
        graph = edges(mods)
        top, why = folders(graph)
        bad_mods = report(src, "modules", graph)
        bad_folders = report(src, "top-level folders", top, why)
        bad = bad or bad_mods or bad_folders
        if not (bad_mods or bad_folders):
            print(f"{src}: {len(mods)} modules in {len(top)} top-level folders, no import cycle")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
