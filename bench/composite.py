#!/usr/bin/env python3
"""A composite tool's fan-out over the wire: one `tools/call` of a pipeline whose step runs an
http tool once per element of a 100-element array with `forEach.maxParallel: 8`, against
one call of that http tool alone, both through the same quiver-server, side by side in one
run.

The API behind the http tool is a loopback server that answers each request after a fixed
delay (--delay-ms, default 40), whatever else it is serving, so one call's latency is that
delay plus Quiver's and the loopback's cost, and a fan-out that keeps 8 requests in flight
should take ceil(100/8) = 13 rounds of it. The figure of merit is

    ratio = fan-out time / (100/8 x one call's time)

which would be 1.0 for a perfect split into 12.5 rounds, 1.04 for 13 full rounds, and
grows with any per-run overhead, serialisation or idle slot. Medians of --runs runs each.

    python3 bench/composite.py --server target/release/quiver-server
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

STATELESS = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": STATELESS, "io.modelcontextprotocol/clientCapabilities": {}}
ITEMS, PARALLEL = 100, 8


def api(delay: float) -> ThreadingHTTPServer:
    class Slow(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 - http.server naming
            time.sleep(delay)
            body = json.dumps({"path": self.path}).encode()
            # One write: a head and a body written apart meet the client's delayed ACK
            # (40 ms here), which would swamp what is measured.
            head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
            self.wfile.write(head.encode() + body)
            self.wfile.flush()

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port: int, name: str, args: dict) -> dict:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": name, "arguments": args, "_meta": META}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=body, method="POST", headers={
        "content-type": "application/json", "accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": STATELESS, "Mcp-Method": "tools/call", "Mcp-Name": name})
    with urllib.request.urlopen(req, timeout=120) as r:
        reply = json.loads(r.read())
    result = reply.get("result") or {}
    if result.get("isError") or "error" in reply:
        raise SystemExit(f"{name} failed: {reply}")
    return result


def timed(port: int, name: str, args: dict, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        call(port, name, args)
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True, help="the quiver-server binary")
    ap.add_argument("--delay-ms", type=float, default=40.0)
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    srv = api(a.delay_ms / 1000)
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-composite-"))
    (tmp / "tools.yaml").write_text(f"""
tools:
  - name: slow
    input: {{id: integer}}
    handler: {{http: {{url: "{base}/item/{{{{id}}}}", timeout: 10s}}}}
  - name: fan
    input: {{ids: {{type: array, items: {{type: integer}}}}}}
    handler:
      pipeline:
        - tool: slow
          forEach: {{items: "{{{{ids}}}}", maxParallel: {PARALLEL}, maxItems: {ITEMS}}}
          input: {{id: "{{{{item}}}}"}}
""")
    port = free_port()
    proc = subprocess.Popen([a.server, "--config", f"file:{tmp / 'tools.yaml'}", "--listen", f"127.0.0.1:{port}"],
                            env={"RUST_LOG": "warn", "PATH": "/usr/bin:/bin"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 30
        while True:
            try:
                call(port, "slow", {"id": 0})
                break
            except Exception:  # noqa: BLE001 - not up yet
                if time.time() > deadline or proc.poll() is not None:
                    raise SystemExit(f"the server did not start: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
                time.sleep(0.1)
        ids = list(range(ITEMS))
        result = call(port, "fan", {"ids": ids})
        assert len(result["structuredContent"]["items"]) == ITEMS, result
        timed(port, "slow", {"id": 1}, 3)  # warm-up
        one: list[float] = []
        fan: list[float] = []
        # Interleaved, so that the machine's noise falls on both alike.
        for _ in range(a.runs):
            one.extend(timed(port, "slow", {"id": 1}, 5))
            fan.extend(timed(port, "fan", {"ids": ids}, 1))
        t1, tf = statistics.median(one), statistics.median(fan)
        ideal = ITEMS / PARALLEL * t1
        rounds = math.ceil(ITEMS / PARALLEL) * t1
        print(json.dumps({
            "delay_ms": a.delay_ms, "items": ITEMS, "max_parallel": PARALLEL, "runs": a.runs,
            "one_call_ms": round(t1 * 1000, 2), "fan_out_ms": round(tf * 1000, 2),
            "ratio_to_100_over_8": round(tf / ideal, 3), "ratio_to_13_rounds": round(tf / rounds, 3),
            "fan_out_ms_min_max": [round(min(fan) * 1000, 1), round(max(fan) * 1000, 1)],
        }, indent=2))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        srv.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
