#!/usr/bin/env python3
"""What fronting an MCP server costs: server CPU time per tools/call, over the wire.

Three ways to call the same `echo` tool, side by side in one run, in alternating order,
several repetitions:

  direct     client -> go-mcp (the upstream, official Go SDK, stateless JSON)
  forwarded  client -> quiver-server -> go-mcp   (an `upstreams:` http entry)
  local      client -> quiver-server             (a `template` tool: Quiver's own cost)

The headline figure is each server's CPU time (utime + stime from /proc, over the window)
divided by the calls answered, which does not depend on how fast this Python client is.
"forwarded" minus "local" on the quiver side is what forwarding adds. Every reply is checked.

    bench/upstream_overhead.py --quiver target-images/.../quiver-server --upstream go-mcp
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def wait_until(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit("timed out waiting for a server")


class Caller:
    """One keep-alive connection that calls a tool and checks every reply."""

    def __init__(self, port: int, tool: str):
        self.conn = http.client.HTTPConnection("127.0.0.1", port)
        self.tool = tool
        self.headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
        init = self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}})
        assert "result" in init, init
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, msg):
        self.conn.request("POST", "/mcp", json.dumps(msg), self.headers)
        r = self.conn.getresponse()
        body = r.read()
        sid = r.getheader("Mcp-Session-Id")
        if sid:
            self.headers["Mcp-Session-Id"] = sid
        if not body:
            return None
        if body.startswith(b"event:") or body.startswith(b"data:"):
            body = next(line[5:] for line in body.splitlines() if line.startswith(b"data:"))
        return json.loads(body)

    def call(self, i: int) -> float:
        start = time.perf_counter()
        r = self.post({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": self.tool, "arguments": {"text": f"m{i}"}}})
        took = time.perf_counter() - start
        if r["result"]["content"][0]["text"] != f"m{i}" or r["result"].get("isError"):
            raise SystemExit(f"wrong reply from {self.tool}: {r}")
        return took


def run(port: int, tool: str, calls: int, conns: int, pids: list[int]) -> dict:
    callers = [Caller(port, tool) for _ in range(conns)]
    lat: list[float] = []
    lock = threading.Lock()
    per = calls // conns

    def work(c: Caller, base: int):
        mine = [c.call(base + k) for k in range(per)]
        with lock:
            lat.extend(mine)

    before = [cpu_seconds(p) for p in pids]
    start = time.perf_counter()
    threads = [threading.Thread(target=work, args=(c, n * per + 1)) for n, c in enumerate(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    after = [cpu_seconds(p) for p in pids]
    done = per * conns
    lat.sort()
    return {
        "cpu_us": [(a[0] + a[1] - b[0] - b[1]) / done * 1e6 for a, b in zip(after, before)],
        "sys_us": [(a[1] - b[1]) / done * 1e6 for a, b in zip(after, before)],
        "rps": done / wall,
        "p50_us": lat[len(lat) // 2] * 1e6,
        "p99_us": lat[int(len(lat) * 0.99)] * 1e6,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--upstream", required=True, help="the go-mcp binary (tests/e2e/upstream-go/build.sh)")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--connections", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--repetitions", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="quiver-bench-up-"))
    up_port, q_port, q_admin = free_port(), free_port(), free_port()
    procs = []
    try:
        up = subprocess.Popen([a.upstream, "-http", f"127.0.0.1:{up_port}", "-stateless", "-json"], stderr=subprocess.DEVNULL)
        procs.append(up)
        cfg = tmp / "tools.yaml"
        cfg.write_text(
            "tools: [{name: echo, input: {text: string}, handler: {template: '{{text}}'}}]\n"
            f"upstreams: [{{name: go, http: {{url: 'http://127.0.0.1:{up_port}/mcp'}}, tools: {{prefix: up_}}}}]\n"
        )
        q = subprocess.Popen([a.quiver, "--config", f"file:{cfg}", "--listen", f"127.0.0.1:{q_port}", "--admin-listen", f"127.0.0.1:{q_admin}"], stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})
        procs.append(q)

        def ready():
            s = json.load(urllib.request.urlopen(f"http://127.0.0.1:{q_admin}/status", timeout=2))
            return s["upstreams"][0]["state"] == "ready" and s["upstreams"][0]["imported"] == 4

        wait_until(ready)
        scenarios = {
            "direct": (up_port, "echo", [up.pid]),
            "forwarded": (q_port, "up_echo", [q.pid, up.pid]),
            "local": (q_port, "echo", [q.pid]),
        }
        results: dict[tuple[str, int], list[dict]] = {}
        for conns in a.connections:
            for rep in range(a.repetitions):
                order = list(scenarios) if rep % 2 == 0 else list(reversed(scenarios))
                for name in order:
                    port, tool, pids = scenarios[name]
                    run(port, tool, min(2000, a.calls), conns, pids)  # warm-up
                    results.setdefault((name, conns), []).append(run(port, tool, a.calls, conns, pids))
        med = lambda rs, f: statistics.median(f(r) for r in rs)  # noqa: E731
        print(f"\n{a.calls} calls per run, median of {a.repetitions} runs; CPU is server utime+stime per call\n")
        print("| connections | path | quiver CPU/call (of it kernel) | go-mcp CPU/call | req/s | p50 | p99 |")
        print("|---|---|---|---|---|---|---|")
        for conns in a.connections:
            for name in scenarios:
                rs = results[(name, conns)]
                qcpu = "" if name == "direct" else f"{med(rs, lambda r: r['cpu_us'][0]):.0f} µs ({med(rs, lambda r: r['sys_us'][0]):.0f} µs)"
                gcpu = "" if name == "local" else f"{med(rs, lambda r: r['cpu_us'][-1]):.0f} µs"
                print(f"| {conns} | {name} | {qcpu} | {gcpu} | {med(rs, lambda r: r['rps']):,.0f} | {med(rs, lambda r: r['p50_us']):.0f} µs | {med(rs, lambda r: r['p99_us']):.0f} µs |")
            fwd = med(results[("forwarded", conns)], lambda r: r["cpu_us"][0])
            loc = med(results[("local", conns)], lambda r: r["cpu_us"][0])
            fsys = med(results[("forwarded", conns)], lambda r: r["sys_us"][0])
            lsys = med(results[("local", conns)], lambda r: r["sys_us"][0])
            print(f"| {conns} | **forwarding adds** | **{fwd - loc:.0f} µs ({fsys - lsys:.0f} µs)** | | | | |")
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
