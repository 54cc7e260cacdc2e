#!/usr/bin/env python3
"""quiver-server with a large ToolSet, side by side with smaller ones (default 10, 1,000 and
10,000 tools), on the real binary:

- load: exec -> first 200 of /readyz (median of --starts starts) and the RSS once idle
  (VmRSS and its anonymous part), then again after a full tools/list walk;
- tools/list: one page (the first, default page size 100) with oha, and a full cursor walk
  (every page, each reply parsed, its cursor followed), median of --walks walks;
- find_tools (toolSearch on, a second server on the same tools): --queries distinct queries
  sent in turn on one keep-alive connection, latency p50/p99, every reply checked;
- tools/call of the same `echo` tool with oha on 1 connection: latency p50/p99 and the
  server's CPU time per call, which must not depend on the registry's size;
- hot reload: one file of the ToolSet rewritten (one tool's description changed), timed
  from the rename to notifications/tools/list_changed on an open GET stream, and to the
  first tools/list page serving the new text (polled every 1 ms); median of --reloads.

The tools are generated: names of 25 verbs x 80 resources x 5 API groups, a sentence or
two of description, 1-6 parameters of mixed types (strings, optional integers and
booleans, enums, arrays), template handlers; in files of 1,000 tools, JSON as the operator
writes its ConfigMaps (--yaml: YAML as a person writes it). The server is pinned to CPU 1,
oha to CPU 0. Traffic to 127.0.0.1 only; every loop is bounded.

    bench/scale.py --quiver target/release/quiver-server --oha PATH/oha [--sizes 10,1000,10000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import free_port, memory, ready  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
           "MCP-Protocol-Version": "2025-06-18"}
CALL = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}'
LIST = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}'

VERBS = ["list", "get", "create", "update", "delete", "search", "export", "import", "archive", "restore",
         "approve", "reject", "assign", "close", "reopen", "sync", "validate", "preview", "publish", "retire",
         "count", "compare", "tag", "lock", "unlock"]
RESOURCES = ["invoice", "customer", "order", "shipment", "ticket", "incident", "deployment", "pod", "namespace",
             "secret", "certificate", "user", "group", "role", "permission", "project", "repository", "branch",
             "commit", "pipeline", "build", "artifact", "release", "environment", "cluster", "node", "volume",
             "snapshot", "backup", "database", "table", "index", "query", "report", "dashboard", "alert", "metric",
             "log", "trace", "span", "budget", "forecast", "contract", "vendor", "product", "price", "discount",
             "coupon", "cart", "payment", "refund", "subscription", "plan", "feature", "flag", "experiment",
             "survey", "response", "document", "folder", "file", "comment", "message", "channel", "meeting",
             "calendar", "task", "sprint", "epic", "milestone", "asset", "license", "device", "location",
             "warehouse", "supplier", "employee", "timesheet", "expense", "policy"]
GROUPS = ["billing", "ops", "crm", "dev", "hr"]
PARAMS = [("id", "string"), ("limit", "integer?"), ("dryRun", "boolean?"), ("owner", "string?"),
          ("reason", "string?"), ("since", "string?"), ("tags", {"type": "array", "items": {"type": "string"}}),
          ("state", {"type": "string", "enum": ["open", "pending", "closed"]}), ("page", "integer?"),
          ("note", "string?")]


def tool(i: int) -> dict:
    verb, res, group = VERBS[(i // 5) % 25], RESOURCES[(i // 125) % 80], GROUPS[i % 5]
    name = f"{group}_{verb}_{res}" + (f"_{i // 10000}" if i >= 10000 else "")
    desc = f"{verb.capitalize()} a {res} of the {group} service."
    if i % 3:
        desc += f" Use it when a user asks to {verb} {res}s; the answer lists what changed."
    params = dict([PARAMS[0]] + [PARAMS[1 + (i + k * 3) % 9] for k in range(i % 6)])
    return {"name": name, "description": desc, "input": params,
            "handler": {"template": f"{verb} {res} {{{{id}}}} in {group}"}}


ECHO = {"name": "echo", "description": "Returns the text it is given.", "input": {"text": "string"},
        "handler": {"builtin": "echo"}}


def write_tools(d: Path, n: int, yaml: bool, search: bool, marker: str = "") -> None:
    """n tools (the echo tool among them) in files of 1,000; toolSearch in the first when on."""
    d.mkdir(exist_ok=True)
    for f in range(0, n, 1000):
        tools = [ECHO if i == 0 else tool(i) for i in range(f, min(n, f + 1000))]
        if f == 0 and n > 1:
            tools[1] = {**tools[1], "description": tools[1]["description"] + marker}
        doc: dict = {}
        if f == 0 and search:
            doc["toolSearch"] = {"coreTools": ["echo"]}
        doc["tools"] = tools
        if yaml:
            text = "".join(f"{k}: {json.dumps(v)}\n" for k, v in doc.items() if k != "tools")
            text += "tools:\n" + "".join(f"  - {json.dumps(t)}\n" for t in tools)
        else:
            head = "".join(f"{json.dumps(k)}: {json.dumps(v)}, " for k, v in doc.items() if k != "tools")
            text = "{" + head + '"tools": [\n  ' + ",\n  ".join(json.dumps(t) for t in tools) + "\n]}\n"
        path = d / f"part-{f // 1000:03}.yaml"
        tmp = path.with_suffix(".new")
        tmp.write_text(text)
        tmp.rename(path)


def cpu(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


class Server:
    def __init__(self, quiver: str, config: Path):
        self.port, self.admin = free_port(), free_port()
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            ["taskset", "-c", "1", quiver, "--config", f"file:{config}", "--listen", f"127.0.0.1:{self.port}",
             "--admin-listen", f"127.0.0.1:{self.admin}", "--pin-workers"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})
        while not ready(self.admin):
            if self.proc.poll() is not None or time.perf_counter() - t0 > 60:
                self.stop()
                raise SystemExit(f"quiver-server did not become ready on {config}")
            time.sleep(0.0005)
        self.ready_ms = (time.perf_counter() - t0) * 1e3
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def rpc(self, method: str, params: dict) -> dict:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        self.conn.request("POST", "/mcp", body, HEADERS)
        r = self.conn.getresponse()
        raw = r.read()
        assert r.status == 200, (r.status, raw[:200])
        return json.loads(raw)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def walk(s: Server) -> tuple[float, int, int]:
    """A full cursor walk of tools/list: seconds, tools, pages."""
    t0 = time.perf_counter()
    tools = pages = 0
    cursor = None
    for _ in range(10_000):
        r = s.rpc("tools/list", {"cursor": cursor} if cursor else {})["result"]
        tools += len(r["tools"])
        pages += 1
        cursor = r.get("nextCursor")
        if not cursor:
            return time.perf_counter() - t0, tools, pages
    raise SystemExit("tools/list did not end within 10,000 pages")


def oha(oha_bin: str, port: int, body: bytes, n: int) -> dict:
    cmd = ["taskset", "-c", "0", oha_bin, "--no-tui", "--output-format", "json", "-m", "POST", "-d", body.decode(),
           "-c", "1", "-n", str(n)]
    for k, v in HEADERS.items():
        cmd += ["-H", f"{k}: {v}"]
    out = json.loads(subprocess.run(cmd + [f"http://127.0.0.1:{port}/mcp"], check=True, capture_output=True,
                                    text=True, timeout=300).stdout)
    codes = out.get("statusCodeDistribution", {})
    assert set(codes) == {"200"}, f"non-200 replies: {codes}"
    p = out["latencyPercentiles"]
    return {"p50_us": p["p50"] * 1e6, "p99_us": p["p99"] * 1e6, "n": n}


def queries(tools: int, n: int) -> list[str]:
    """Queries a model would send, each over the words of a tool the registry holds."""
    out = []
    for k in range(n):
        i = 1 + (k * 7919) % (tools - 1)
        verb, res, group = VERBS[(i // 5) % 25], RESOURCES[(i // 125) % 80], GROUPS[i % 5]
        out.append([f"{verb} {res}", f"{verb} the {res}s of {group}", f"find {res}", f"{res} {verb} state owner"][k % 4])
    return out


def find_tools(s: Server, qs: list[str], rounds: int) -> dict:
    lat = []
    for _ in range(rounds):
        for q in qs:
            t0 = time.perf_counter()
            r = s.rpc("tools/call", {"name": "find_tools", "arguments": {"query": q, "limit": 5}})
            lat.append(time.perf_counter() - t0)
            res = r["result"]
            assert not res.get("isError") and res["structuredContent"]["tools"], (q, str(r)[:300])
    lat.sort()
    return {"p50_us": statistics.median(lat) * 1e6, "p99_us": lat[int(len(lat) * 0.99)] * 1e6, "n": len(lat)}


class Stream(threading.Thread):
    """A GET /mcp stream; records when each notifications/tools/list_changed arrives."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.sock.sendall(f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
                          f"MCP-Protocol-Version: 2025-06-18\r\n\r\n".encode())
        self.changed: list[float] = []
        self.cond = threading.Condition()
        self.head = b""

    def run(self):
        buf = b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            if not self.head and b"\r\n\r\n" in buf:
                self.head, buf = buf.split(b"\r\n\r\n", 1)
            while b"notifications/tools/list_changed" in buf:
                buf = buf.split(b"notifications/tools/list_changed", 1)[1]
                with self.cond:
                    self.changed.append(time.perf_counter())
                    self.cond.notify_all()
            buf = buf[-64:]


def reload_times(s: Server, d: Path, n: int, yaml: bool, reps: int) -> dict:
    stream = Stream(s.port)
    stream.start()
    deadline = time.monotonic() + 10
    while not stream.head.startswith(b"HTTP/1.1 200"):
        assert time.monotonic() < deadline, f"GET stream not opened: {stream.head[:100]!r}"
        time.sleep(0.01)
    to_notice, to_served = [], []
    for k in range(reps):
        marker = f" (revision {k})"
        seen = len(stream.changed)
        t0 = time.perf_counter()
        write_tools(d, min(n, 1000), yaml, False, marker) if n <= 1000 else rewrite_first(d, yaml, marker)
        # The file is written and renamed inside write_tools: t0 is taken before.
        served = None
        for _ in range(60_000):
            first = s.rpc("tools/list", {})["result"]["tools"]
            if any(marker in (t.get("description") or "") for t in first):
                served = time.perf_counter()
                break
            time.sleep(0.001)
        assert served, "the edit was not served within a minute"
        with stream.cond:
            assert stream.cond.wait_for(lambda: len(stream.changed) > seen, 30), "no list_changed within 30 s"
            to_notice.append((stream.changed[seen] - t0) * 1e3)
        to_served.append((served - t0) * 1e3)
        time.sleep(0.2)  # past the watcher's coalescing window before the next write
    stream.sock.close()
    return {"notice_ms": statistics.median(to_notice), "served_ms": statistics.median(to_served),
            "notice_all": to_notice, "served_all": to_served}


def rewrite_first(d: Path, yaml: bool, marker: str) -> None:
    """Rewrites only the first file (tools 0-999) of a large ToolSet with one change."""
    tools = [ECHO] + [tool(i) for i in range(1, 1000)]
    tools[1] = {**tools[1], "description": tools[1]["description"] + marker}
    if yaml:
        text = "tools:\n" + "".join(f"  - {json.dumps(t)}\n" for t in tools)
    else:
        text = '{"tools": [\n  ' + ",\n  ".join(json.dumps(t) for t in tools) + "\n]}\n"
    path = d / "part-000.yaml"
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    tmp.rename(path)


def measure(args, tmp: Path, n: int) -> dict:
    plain, searched = tmp / f"plain-{n}", tmp / f"search-{n}"
    write_tools(plain, n, args.yaml, False)
    write_tools(searched, n, args.yaml, True)
    row: dict = {"tools": n, "bytes": sum(f.stat().st_size for f in plain.iterdir())}
    starts = []
    for _ in range(args.starts):
        s = Server(args.quiver, plain)
        time.sleep(0.5)
        starts.append((s.ready_ms, *memory(s.proc.pid)))
        s.stop()
    row["ready_ms"] = statistics.median(x[0] for x in starts)
    row["rss_idle"] = statistics.median(x[1] for x in starts) / 1024
    row["anon_idle"] = statistics.median(x[2] for x in starts) / 1024
    s = Server(args.quiver, plain)
    try:
        walks = [walk(s) for _ in range(args.walks)]
        assert all(w[1] == n for w in walks), f"a walk listed {walks[0][1]} of {n} tools"
        row["walk_ms"] = statistics.median(w[0] for w in walks) * 1e3
        row["pages"] = walks[0][2]
        time.sleep(0.5)
        rss, anon = memory(s.proc.pid)
        row["rss_listed"], row["anon_listed"] = rss / 1024, anon / 1024
        row["page"] = oha(args.oha, s.port, LIST, args.requests // 10)
        c0 = cpu(s.proc.pid)
        row["call"] = oha(args.oha, s.port, CALL, args.requests)
        row["call"]["cpu_us"] = (cpu(s.proc.pid) - c0) / args.requests * 1e6
        row["reload"] = reload_times(s, plain, n, args.yaml, args.reloads)
    finally:
        s.stop()
    s = Server(args.quiver, searched)
    try:
        row["find"] = find_tools(s, queries(n, args.queries), args.rounds) if n > 1 else None
    finally:
        s.stop()
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--oha", required=True)
    ap.add_argument("--sizes", default="10,1000,10000")
    ap.add_argument("--yaml", action="store_true", help="YAML files instead of JSON")
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--walks", type=int, default=5)
    ap.add_argument("--requests", type=int, default=20000, help="tools/call requests (a tenth for tools/list)")
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--reloads", type=int, default=7)
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="quiver-scale-"))
    try:
        rows = [measure(a, tmp, n) for n in sizes]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    base = rows[0]
    ratio = lambda r, f: f"{f(r) / f(base):.2f}x" if f(base) else "-"  # noqa: E731
    print("| measure | " + " | ".join(f"{r['tools']:,} tools" for r in rows) + " |")
    print(f"|---|{'---|' * len(rows)}")
    lines = [
        ("ToolSet files (bytes)", lambda r: f"{r['bytes'] / 1024:.0f} KiB"),
        ("exec -> /readyz 200", lambda r: f"{r['ready_ms']:.1f} ms"),
        ("VmRSS idle (anonymous)", lambda r: f"{r['rss_idle']:.1f} MiB ({r['anon_idle']:.1f})"),
        ("VmRSS after a full tools/list walk (anonymous)", lambda r: f"{r['rss_listed']:.1f} MiB ({r['anon_listed']:.1f})"),
        ("tools/list, first page, p50 / p99", lambda r: f"{r['page']['p50_us']:.0f} / {r['page']['p99_us']:.0f} µs"),
        ("tools/list, full cursor walk", lambda r: f"{r['walk_ms']:.1f} ms ({r['pages']} pages)"),
        ("find_tools, p50 / p99", lambda r: f"{r['find']['p50_us']:.0f} / {r['find']['p99_us']:.0f} µs" if r["find"] else "-"),
        ("tools/call echo, p50 / p99", lambda r: f"{r['call']['p50_us']:.0f} / {r['call']['p99_us']:.0f} µs"),
        ("tools/call echo, server CPU per call", lambda r: f"{r['call']['cpu_us']:.1f} µs ({ratio(r, lambda x: x['call']['cpu_us'])})"),
        ("edit -> list_changed", lambda r: f"{r['reload']['notice_ms']:.1f} ms"),
        ("edit -> tools/list serves it", lambda r: f"{r['reload']['served_ms']:.1f} ms"),
    ]
    for label, f in lines:
        print(f"| {label} | {' | '.join(f(r) for r in rows)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
