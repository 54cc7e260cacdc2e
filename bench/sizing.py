#!/usr/bin/env python3
"""Numbers for sizing a deployment (docs/operations.md), measured on the real binaries:

- server memory with 1,000 and 10,000 tools (JSON, as the operator writes its ConfigMaps),
  read from /proc/PID/status after a client has listed every tool (all pages of tools/list):
  VmRSS, its anonymous part (RssAnon), and the peak (VmHWM), which is what a memory limit
  must leave room for;
- Redis memory per 1,000 tasks (`--tasks-redis`): tasks created by a client of protocol
  2026-07-28 that declares the tasks extension, each finished with a small result, and the
  same number still running;
- Redis memory per 1,000 shared rate-limit budgets (`--limits-redis`, `shared: true`): one
  call each of as many callers, told apart by their address (the server trusts the loopback
  proxy's X-Forwarded-For), under `rate: 1/h`, so every budget is still in Redis when read.

Redis's `used_memory` is read before and after (`INFO memory`), with `DBSIZE` for the keys.
Each measurement starts its own redis-server (no persistence) and quiver-server on free
loopback ports, and stops them.

    bench/sizing.py --quiver PATH/quiver-server [--redis PATH/redis-server]

Without --redis, $QUIVER_REDIS_SERVER, else scripts/redis.sh (Debian's redis-server).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import free_port, ready, tools_dir  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def status(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon and VmHWM of a process, in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {k: float(fields[k].split()[0]) for k in ("VmRSS", "RssAnon", "VmHWM")}


def rpc(port: int, method: str, params: dict, headers: dict | None = None) -> dict:
    """One 2026-07-28 request of a client that declared the tasks extension."""
    params = {**params, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    }}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
         "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method, **(headers or {})}
    if "name" in params:
        h["Mcp-Name"] = params["name"]
    req = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=body, method="POST", headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)


class Server:
    def __init__(self, quiver: str, config: Path, *args: str):
        self.port, self.admin = free_port(), free_port()
        self.proc = subprocess.Popen(
            [quiver, "--config", f"file:{config}", "--listen", f"127.0.0.1:{self.port}",
             "--admin-listen", f"127.0.0.1:{self.admin}", *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})
        deadline = time.monotonic() + 60
        while not ready(self.admin):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"quiver-server did not become ready on {config}")
            time.sleep(0.01)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Redis:
    def __init__(self, binary: str, tmp: Path):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--dir", str(tmp)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.command("PING") == "PONG":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("redis-server did not answer")
            time.sleep(0.05)

    def command(self, *args: str) -> str:
        """One command; its answer as text (a bulk or simple string, or an integer)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(f"*{len(args)}\r\n".encode() + b"".join(f"${len(a)}\r\n{a}\r\n".encode() for a in args))
            data = b""
            while True:
                chunk = s.recv(65536)
                data += chunk
                head, _, rest = data.partition(b"\r\n")
                if head[:1] in b"+:-" and _:
                    return head[1:].decode()
                if head[:1] == b"$" and len(rest) >= int(head[1:]) + 2:
                    return rest[: int(head[1:])].decode()
                if not chunk:
                    raise OSError("redis closed the connection")

    def used(self) -> tuple[int, int]:
        """used_memory in bytes, and the number of keys."""
        info = dict(l.split(":", 1) for l in self.command("INFO", "memory").splitlines() if ":" in l)
        return int(info["used_memory"]), int(self.command("DBSIZE"))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def server_memory(quiver: str, tmp: Path) -> list[dict]:
    rows = []
    for n in (1000, 10000):
        s = Server(quiver, tools_dir(tmp, n, as_json=True))
        try:
            listed, cursor = 0, None
            while True:
                r = rpc(s.port, "tools/list", {"cursor": cursor} if cursor else {})["result"]
                listed += len(r["tools"])
                cursor = r.get("nextCursor")
                if not cursor:
                    break
            assert listed == n, f"listed {listed} of {n} tools"
            time.sleep(0.5)
            rows.append({"tools": n, **status(s.proc.pid)})
        finally:
            s.stop()
    return rows


TASK_TOOLS = """tools:
  - {name: nap, handler: {builtin: sleep}}
  - name: job
    input: {ms: integer}
    handler: {pipeline: [{tool: nap, input: {ms: "{{ms}}"}}, {tool: done, input: {text: "report ready"}}]}
  - {name: done, input: {text: string}, handler: {template: "{{text}}"}}
"""


def redis_tasks(quiver: str, redis_bin: str, tmp: Path, n: int, ms: int) -> dict:
    """Redis memory for n tasks: finished ones (ms 0) or still running (ms large)."""
    config = tmp / f"tasks-{n}-{ms}.yaml"
    config.write_text(TASK_TOOLS)
    redis = Redis(redis_bin, tmp)
    s = None
    try:
        before = redis.used()
        s = Server(quiver, config, f"--tasks-redis=127.0.0.1:{redis.port}", "--tasks-redis-prefix=ns/name/",
                   "--tasks-max=1000000", "--tasks-per-caller=100000", "--tasks-anonymous-max=1000000",
                   "--tasks-ttl=1h")
        ids = []
        for _ in range(n):
            r = rpc(s.port, "tools/call", {"name": "job", "arguments": {"ms": ms}})
            assert r.get("result", {}).get("resultType") == "task", r
            ids.append(r["result"]["taskId"])
        if ms == 0:
            # Every task finished: read the last one until it is.
            deadline = time.monotonic() + 60
            while rpc(s.port, "tasks/get", {"taskId": ids[-1]}).get("result", {}).get("status") != "completed":
                assert time.monotonic() < deadline, "the tasks did not finish"
                time.sleep(0.2)
            time.sleep(1)
        after = redis.used()
        return {"n": n, "bytes": after[0] - before[0], "keys": after[1] - before[1]}
    finally:
        if s:
            s.stop()
        redis.stop()


LIMIT_TOOLS = """tools:
  - name: echo
    limits: [{rate: 1/h, shared: true}]
    handler: {builtin: echo}
"""


def redis_limits(quiver: str, redis_bin: str, tmp: Path, n: int) -> dict:
    """Redis memory for n callers' budgets of one shared limit."""
    config = tmp / f"limits-{n}.yaml"
    config.write_text(LIMIT_TOOLS)
    redis = Redis(redis_bin, tmp)
    s = None
    try:
        before = redis.used()
        s = Server(quiver, config, f"--limits-redis=127.0.0.1:{redis.port}", "--limits-redis-prefix=ns/name",
                   "--limits-redis-timeout=2s", "--limits-redis-fail=closed", "--trusted-proxies=127.0.0.1/32")
        for i in range(n):
            addr = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
            r = rpc(s.port, "tools/call", {"name": "echo", "arguments": {"text": "x"}}, {"X-Forwarded-For": addr})
            assert "result" in r and not r["result"].get("isError"), r
        after = redis.used()
        return {"n": n, "bytes": after[0] - before[0], "keys": after[1] - before[1]}
    finally:
        if s:
            s.stop()
        redis.stop()


def redis_binary(given: str | None) -> str:
    if given:
        return given
    if os.environ.get("QUIVER_REDIS_SERVER"):
        return os.environ["QUIVER_REDIS_SERVER"]
    out = subprocess.run([str(ROOT / "scripts" / "redis.sh")], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--redis")
    a = ap.parse_args()
    redis_bin = redis_binary(a.redis)
    tmp = Path(tempfile.mkdtemp(prefix="quiver-sizing-"))
    version = subprocess.run([a.quiver, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"Command: `bench/sizing.py --quiver {a.quiver}` ({version}, "
          f"{subprocess.run([redis_bin, '--version'], capture_output=True, text=True).stdout.split()[2]})\n")

    print("| tools | VmRSS after tools/list | of it anonymous | peak (VmHWM) |")
    print("|---|---|---|---|")
    for r in server_memory(a.quiver, tmp):
        print(f"| {r['tools']:,} | {r['VmRSS'] / 1024:.1f} MiB | {r['RssAnon'] / 1024:.1f} MiB | {r['VmHWM'] / 1024:.1f} MiB |")

    print("\n| in Redis | count | used_memory growth | per 1,000 | keys |")
    print("|---|---|---|---|---|")
    rows = [("finished tasks (result `report ready`)", redis_tasks(a.quiver, redis_bin, tmp, n, 0)) for n in (1000, 10000)]
    rows += [("running tasks", redis_tasks(a.quiver, redis_bin, tmp, 1000, 60000))]
    rows += [("shared rate-limit budgets", redis_limits(a.quiver, redis_bin, tmp, n)) for n in (1000, 10000)]
    for what, r in rows:
        print(f"| {what} | {r['n']:,} | {r['bytes'] / 1024:.0f} KiB | {r['bytes'] / r['n'] * 1000 / 1024:.0f} KiB | {r['keys']:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
