#!/usr/bin/env python3
"""The training run of PGO (scripts/pgo.sh): drives an instrumented quiver-server through
its real HTTP path with what production traffic looks like, then stops it with SIGTERM so
the profile is written.

Starts the server on examples/tools.yaml (every handler kind: builtin, template,
pipeline, exec, http; resources; prompts) and, from several connections at once, sends a
mix dominated by tools/call and tools/list, with every other method, sessionful and
stateless requests, malformed and refused requests, admin endpoints, and a config reload
every 200 ms (a tool added and removed) so the reload and list_changed paths are trained
too. Every reply is checked; a wrong one fails the run rather than train on errors.

    bench/pgo_workload.py --quiver PATH/TO/instrumented/quiver-server --seconds 20
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    def __init__(self, port: int, session: bool):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self.headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
        self.n = 0
        if session:
            init = self.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "pgo", "version": "1"}})
            assert "result" in init, init
            self.send({"jsonrpc": "2.0", "method": "notifications/initialized"}, want=202)

    def send(self, msg, want: int = 200, raw: bytes | None = None):
        self.conn.request("POST", "/mcp", raw if raw is not None else json.dumps(msg), self.headers)
        r = self.conn.getresponse()
        body = r.read()
        if sid := r.getheader("Mcp-Session-Id"):
            self.headers["Mcp-Session-Id"] = sid
        if r.status != want:
            raise SystemExit(f"HTTP {r.status} (wanted {want}) for {raw or msg}: {body[:300]!r}")
        if not body:
            return None
        if body.startswith((b"event:", b"data:", b"id:")):
            body = next(line[5:] for line in body.splitlines() if line.startswith(b"data:"))
        return json.loads(body)

    def rpc(self, method: str, params=None, want: int = 200):
        self.n += 1
        msg = {"jsonrpc": "2.0", "id": self.n, "method": method}
        if params is not None:
            msg["params"] = params
        return self.send(msg, want)

    def call(self, tool: str, args: dict, expect: str | None = None):
        r = self.rpc("tools/call", {"name": tool, "arguments": args})
        res = r.get("result") or {}
        if res.get("isError") or (expect is not None and res["content"][0]["text"] != expect):
            raise SystemExit(f"{tool}({args}) answered {r}")
        return res


def traffic(port: int, admin: int, deadline: float, session: bool, counts: dict, lock: threading.Lock):
    try:
        drive(port, admin, deadline, session, counts, lock)
    except BaseException as e:  # SystemExit in a thread would vanish silently
        with lock:
            counts["failures"].append(f"{type(e).__name__}: {e}")


def drive(port: int, admin: int, deadline: float, session: bool, counts: dict, lock: threading.Lock):
    c = Client(port, session)
    a = http.client.HTTPConnection("127.0.0.1", admin, timeout=10)
    i = 0
    while time.monotonic() < deadline:
        i += 1
        c.call("add", {"a": i, "b": 2}, str(i + 2))
        c.call("echo", {"text": f"m{i}"}, f"m{i}")
        c.call("greet", {"name": "pgo"}, "Hello pgo!")
        c.call("sha256", {"text": "abc"})
        if i % 2 == 0:
            c.call("add-then-greet", {"a": 1, "b": i})
            lst = c.rpc("tools/list")
            assert lst["result"]["tools"], lst
        if i % 5 == 0:
            c.rpc("resources/list")
            c.rpc("resources/read", {"uri": c.rpc("resources/list")["result"]["resources"][0]["uri"]})
            c.rpc("prompts/list")
            c.rpc("prompts/get", {"name": "summarize", "arguments": {"topic": "pgo"}})
            c.rpc("ping")
            c.rpc("resources/templates/list")
        if i % 7 == 0:  # the error paths, as clients really hit them
            unknown = c.rpc("tools/call", {"name": "no-such-tool", "arguments": {}})
            assert "error" in unknown or unknown["result"].get("isError"), unknown
            bad = c.rpc("tools/call", {"name": "add", "arguments": {"a": "x"}})
            assert "error" in bad or bad["result"].get("isError"), bad
            assert "error" in c.rpc("no/such/method")
            c.send(None, want=400, raw=b'{"jsonrpc":"2.0","id":1,"method":')
        if i % 25 == 0:
            c.call("word-count", {"text": "one two three"}, "3\n")
            c.call("fetch-status", {})
            for path in ("/metrics", "/status", "/readyz"):
                a.request("GET", path)
                r = a.getresponse()
                r.read()
                assert r.status == 200, (path, r.status)
    with lock:
        counts["iterations"] += i


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--connections", type=int, default=4)
    a = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="quiver-pgo-"))
    port, admin = free_port(), free_port()
    base = (ROOT / "examples/tools.yaml").read_text().replace("127.0.0.1:9090", f"127.0.0.1:{admin}")
    cfg = tmp / "tools.yaml"
    cfg.write_text(base)
    proc = subprocess.Popen([a.quiver, "--config", f"file:{cfg}", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}"],
                            env={**os.environ, "RUST_LOG": "warn"}, cwd=tmp)
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        deadline = time.monotonic() + a.seconds
        counts, lock = {"iterations": 0, "failures": []}, threading.Lock()
        threads = [threading.Thread(target=traffic, args=(port, admin, deadline, n % 2 == 0, counts, lock)) for n in range(a.connections)]
        for t in threads:
            t.start()
        reloads = 0
        extra = "\n  - name: reloaded\n    input: {text: string}\n    handler: {template: '{{text}}'}\n"
        while time.monotonic() < deadline:
            time.sleep(0.2)
            reloads += 1
            body = base.replace("\ntools:\n", "\ntools:" + extra, 1) if reloads % 2 else base
            tmp_cfg = tmp / "tools.yaml.new"
            tmp_cfg.write_text(body)
            tmp_cfg.rename(cfg)
        for t in threads:
            t.join()
        if proc.poll() is not None:
            raise SystemExit(f"quiver-server exited early ({proc.returncode})")
        if counts["failures"] or not counts["iterations"]:
            raise SystemExit("pgo workload failed: " + "; ".join(counts["failures"] or ["no traffic"]))
        print(f"pgo workload: {counts['iterations']} iterations ({counts['iterations'] * 12} requests or so), {reloads} reloads", file=sys.stderr)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    if proc.returncode != 0:
        raise SystemExit(f"quiver-server exited with {proc.returncode}: no profile written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
