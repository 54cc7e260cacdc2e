#!/usr/bin/env python3
"""Start-up and memory of quiver-server, from outside, on the real binary:

- cold start: from exec to the first 200 of /readyz (polled every 0.5 ms), with the
  example ToolSet and with 1,000 and 10,000 generated tools (one file per 1,000 tools in a
  directory, as a ConfigMap with several keys is mounted);
- idle memory once ready: VmRSS, and its anonymous part (heap, stacks: what the process
  itself allocated; the rest is the binary's code and data pages, shared page cache);
- memory per tool: the growth of anonymous RSS from 1,000 to 10,000 tools, per tool,
  next to the size of one tool's descriptor as served by tools/list.

Medians of --runs starts each. The server is pinned to CPU 1 like in bench/wire.py.

    bench/startup.py --quiver target/release/quiver-server
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return s.recv(12).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def memory(pid: int) -> tuple[float, float]:
    """VmRSS and RssAnon in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return float(fields["VmRSS"].split()[0]), float(fields["RssAnon"].split()[0])


def tools_dir(root: Path, n: int, as_json: bool = False) -> Path:
    """n tools in files of 1,000: YAML as a person writes it, or JSON as the operator does."""
    d = root / f"tools-{n}{'-json' if as_json else ''}"
    d.mkdir()
    for f in range(0, n, 1000):
        if as_json:
            tools = [{"name": f"tool-{i}", "description": f"Tool number {i}", "input": {"x": "string"},
                      "handler": {"template": f"{i}:{{{{x}}}}"}} for i in range(f, min(n, f + 1000))]
            text = '{"tools": [\n  ' + ",\n  ".join(json.dumps(t, separators=(",", ":")) for t in tools) + "\n]}\n"
        else:
            lines = ["tools:"]
            for i in range(f, min(n, f + 1000)):
                lines.append(f"  - {{name: tool-{i}, description: Tool number {i}, input: {{x: string}}, handler: {{template: \"{i}:{{{{x}}}}\"}}}}")
            text = "\n".join(lines) + "\n"
        (d / f"part-{f // 1000:03}.yaml").write_text(text)
    return d


def descriptor_bytes(port: int) -> tuple[int, int]:
    """Bytes and count of every tool descriptor served by tools/list (all pages)."""
    total = count = 0
    cursor = None
    while True:
        params = {"cursor": cursor} if cursor else {}
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=body, method="POST", headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"})
        r = json.load(urllib.request.urlopen(req, timeout=10))["result"]
        for t in r["tools"]:
            total += len(json.dumps(t, separators=(",", ":")))
            count += 1
        cursor = r.get("nextCursor")
        if not cursor:
            return total, count


def start(quiver: str, config: Path) -> dict:
    port, admin = free_port(), free_port()
    t0 = time.perf_counter()
    p = subprocess.Popen(["taskset", "-c", "1", quiver, "--config", f"file:{config}", "--listen", f"127.0.0.1:{port}",
                          "--admin-listen", f"127.0.0.1:{admin}", "--pin-workers"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})
    try:
        while not ready(admin):
            if p.poll() is not None or time.perf_counter() - t0 > 30:
                raise SystemExit(f"quiver-server did not become ready on {config}")
            time.sleep(0.0005)
        took = time.perf_counter() - t0
        time.sleep(0.5)  # idle: let start-up buffers be returned
        rss, anon = memory(p.pid)
        desc, n = descriptor_bytes(port)
        return {"start_ms": took * 1e3, "rss": rss, "anon": anon, "desc": desc, "tools": n}
    finally:
        p.terminate()
        p.wait(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="quiver-startup-"))
    example = tmp / "example.yaml"
    example.write_text((ROOT / "examples/tools.yaml").read_text())
    configs = {"example ToolSet (8 tools)": example, "1,000 tools": tools_dir(tmp, 1000), "10,000 tools": tools_dir(tmp, 10000),
               "1,000 tools, JSON as the operator writes it": tools_dir(tmp, 1000, as_json=True),
               "10,000 tools, JSON": tools_dir(tmp, 10000, as_json=True)}
    rows = {}
    for name, cfg in configs.items():
        runs = [start(a.quiver, cfg) for _ in range(a.runs)]
        rows[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{name}: {rows[name]}", file=sys.stderr)
    print(f"Command: `bench/startup.py --quiver {a.quiver} --runs {a.runs}` (medians of {a.runs} starts, pinned to CPU 1)\n")
    print("| ToolSet | exec to /readyz 200 | VmRSS idle | of it anonymous | tools/list descriptors |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['start_ms']:.1f} ms | {r['rss'] / 1024:.1f} MiB | {r['anon'] / 1024:.1f} MiB | {r['desc'] / 1024:.0f} KiB |")
    big, small = rows["10,000 tools"], rows["1,000 tools"]
    per_tool = (big["anon"] - small["anon"]) * 1024 / (big["tools"] - small["tools"])
    per_desc = (big["desc"] - small["desc"]) / (big["tools"] - small["tools"])
    print(f"\nAnonymous memory per tool (1,000 → 10,000 tools): {per_tool:.0f} B, of which the descriptor's own bytes "
          f"(as served) {per_desc:.0f} B: {per_tool - per_desc:.0f} B beyond them.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
