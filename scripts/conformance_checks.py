#!/usr/bin/env python3
"""Judges every scenario a conformance run saved, scored or not (scripts/conformance.sh).

Usage: conformance_checks.py EXPECTED_FAILURES_YAML REVISION RESULTS_DIR

Each scenario's checks are in RESULTS_DIR/server-<scenario>-<timestamp>/checks.json. A check
fails when its status is FAILURE or WARNING (what the suite itself counts as failed). Exit 1
when a scenario not listed under `server:` in the expected-failures file has a failed check,
when a listed scenario that ran has none (a stale entry), or when an entry has no reason.
Entries are the suite's own format (`- scenario`, one per line), each with its reason as a
`# comment` on the same line.
"""

import json
import re
import sys
from pathlib import Path

ENTRY = re.compile(r"^\s*-\s*([A-Za-z0-9_./:-]+)\s*(?:#\s*(.*\S))?\s*$")
DIR = re.compile(r"^server-(.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$")


def expected(path):
    """{scenario: reason} of the `server:` section; problems for entries without one."""
    listed, problems, section = {}, [], None
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith((" ", "-")):
            section = line.split(":", 1)[0].strip()
            continue
        m = ENTRY.match(line)
        if section != "server" or not m:
            continue
        if not m.group(2):
            problems.append(f"{path}:{n}: `{m.group(1)}` gives no reason (add `# why` on its line)")
        listed[m.group(1)] = m.group(2) or ""
    return listed, problems


def results(root):
    """{scenario: [failed check ids and messages]} of every scenario that ran."""
    out = {}
    for d in sorted(Path(root).iterdir()):
        m = DIR.match(d.name)
        if not m or not (d / "checks.json").is_file():
            continue
        checks = json.loads((d / "checks.json").read_text())
        out[m.group(1)] = [
            f"{c.get('id')}: {c.get('status')} {c.get('errorMessage') or c.get('description') or ''}".strip()
            for c in checks
            if c.get("status") in ("FAILURE", "WARNING")
        ]
    return out


def main():
    path, revision, root = sys.argv[1:4]
    listed, problems = expected(path)
    ran = results(root)
    if not ran:
        problems.append(f"no scenario results in {root}")
    for scenario, failed in sorted(ran.items()):
        if failed and scenario not in listed:
            problems.append(f"{scenario}: {len(failed)} failed check(s): " + "; ".join(failed[:5]))
        elif not failed and scenario in listed:
            problems.append(f"{scenario}: passes but is listed as expected to fail ({listed[scenario]}); remove it")
    expected_failing = sorted(s for s in ran if ran[s] and s in listed)
    print(
        f"conformance ({revision}): {len(ran)} scenarios judged (scored and unscored), "
        f"{len(expected_failing)} failing as listed: {', '.join(expected_failing) or 'none'}"
    )
    for p in problems:
        print(f"conformance ({revision}): {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
