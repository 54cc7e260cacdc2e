#!/usr/bin/env python3
"""Bounded MCP traffic against quiver-servers on loopback, for the Prometheus checks:
successful calls of several tools with varied latency, tool errors, invalid arguments,
calls refused by a rate limit, malformed JSON and unknown methods, plus one valid and one
invalid config reload.

    drive_traffic.py --seconds 30 --config PATH URL [URL ...]
"""

import argparse
import json
import random
import time
import urllib.error
import urllib.request
from pathlib import Path


ERRORS = {}


def post(url, body):
    """The HTTP status, or None when the request got no answer (counted in ERRORS by kind:
    a loaded machine may time one out; main() fails when more than 1% do)."""
    req = urllib.request.Request(url, data=body.encode(), method="POST", headers={
        "content-type": "application/json", "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2025-11-25"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError) as e:
        kind = f"{url}: {type(e).__name__}: {getattr(e, 'reason', e)}"
        ERRORS[kind] = ERRORS.get(kind, 0) + 1
        return None


def call(url, i, tool, args):
    return post(url, json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": tool, "arguments": args}}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--config", type=Path, required=True, help="ToolSet file of the first server (edited for reloads)")
    ap.add_argument("urls", nargs="+")
    a = ap.parse_args()
    rng = random.Random(7)
    deadline = time.monotonic() + a.seconds
    sent, i, reloaded, broke = 0, 0, False, False
    original = a.config.read_text()
    while time.monotonic() < deadline and sent < 200_000:
        i += 1
        url = a.urls[i % len(a.urls)]
        r = rng.random()
        if r < 0.02:
            call(url, i, "scarce", {})                           # over its rate limit: refused
        elif r < 0.45:
            call(url, i, "add", {"a": rng.randint(0, 99), "b": rng.randint(0, 99)})
        elif r < 0.65:
            call(url, i, "greet", {"name": rng.choice(["Ada", "Grace", "Linus"])})
        elif r < 0.75:
            call(url, i, "sleep", {"ms": rng.choice([1, 2, 5, 10, 20, 50])})
        elif r < 0.80:
            call(url, i, "inner_add", {"a": 1, "b": 2})         # forwarded to the upstream
        elif r < 0.86:
            call(url, i, "add", {"a": "not a number"})           # invalid arguments
        elif r < 0.88:
            call(url, i, "wc", {"text": "a b c"})                # exec handler
        elif r < 0.89:
            call(url, i, "checked", {})                          # its webhook is down (Ignore)
        elif r < 0.90:                                           # found by its result guard, or cut
            call(url, i, "leaky", {"text": rng.choice(["key AKIAZ2QXLMN7ORP4VWTY", "mail ada@acme.io", "nothing here", "word " * 300])})
        elif r < 0.93:
            post(url, "{not json")                               # parse error
        elif r < 0.96:
            post(url, json.dumps({"jsonrpc": "2.0", "id": i, "method": "no/such"}))
        else:
            post(url, json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/list"}))
        sent += 1
        left = deadline - time.monotonic()
        if not reloaded and left < a.seconds * 0.6:
            a.config.write_text(original.replace("tools:\n", "tools:\n  - {name: extra, handler: {builtin: now}}\n", 1))
            reloaded = True
        if reloaded and not broke and left < a.seconds * 0.3:
            a.config.write_text(original.replace("builtin: add", "builtin: nope"))  # rejected, old tools keep serving
            broke = True
    failed = sum(ERRORS.values())
    print(f"sent {sent} messages in {a.seconds:.0f} s, {failed} without an answer")
    for kind, n in sorted(ERRORS.items()):
        print(f"  {n} x {kind}")
    if failed * 100 > sent:
        raise SystemExit(f"more than 1% of the messages got no answer ({failed} of {sent})")


if __name__ == "__main__":
    main()
