#!/usr/bin/env python3
"""The over-the-wire comparison: the same `echo` tool in quiver-server and in the servers a
user would pick instead, each pinned to one core, driven by oha from the other core.

Run through `make bench-wire` (scripts/bench-wire.sh builds and installs everything, then
calls this with the paths). Every server gets the same request on keep-alive connections:

    POST /mcp  {"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}

The headline figure is **server CPU time per request**: the server's utime + stime over
the window (from /proc, children included) divided by the 2xx replies. The load generator
saturates its own core before a fast server does, so req/s measures oha as much as the
server; CPU per request does not. Also reported: req/s, p50/p99 latency (oha), RSS.

Checks, so a fast wrong answer cannot win: before the run each server's reply is parsed
(JSON-RPC result, content[0].text == "hello", no error); during the run oha must see only
HTTP 200 and exactly (replies x that reply's size) bytes, so every reply of the window had
the verified reply's length. Scenarios run in alternating order (forward, then reversed)
in every repetition; the table gives medians.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
BODY = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}'
HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-06-18",
}
SERVER_CPU, LOAD_CPU = "1", "0"
H2_STREAMS = 8  # concurrent streams per HTTP/2 connection
BEGIN, END = "<!-- bench-wire:begin -->", "<!-- bench-wire:end -->"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_tree(pid: int) -> list[int]:
    """The process and its descendants (a Node or uvicorn runner may fork)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def cpu(pids: list[int]) -> tuple[float, float]:
    """utime and stime, in seconds, of these processes and their descendants."""
    user = system = 0.0
    for root in pids:
        for p in proc_tree(root):
            try:
                f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            user += int(f[11]) / TICK
            system += int(f[12]) / TICK
    return user, system


def rss_mib(pids: list[int]) -> float:
    total = 0
    for root in pids:
        for p in proc_tree(root):
            try:
                total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE
            except OSError:
                pass
    return total / 2**20


@dataclass
class Server:
    name: str
    argv: list[str]
    note: str
    port: int = field(default_factory=free_port)
    env: dict = field(default_factory=dict)
    needs: list[str] = field(default_factory=list)  # names of servers this one calls
    admin: int | None = None  # quiver's admin port
    config: Path | None = None  # quiver's ToolSet file (rewritten by the reload row)
    h2c: bool = False  # serves HTTP/2 with prior knowledge
    reload_every: float | None = None  # rewrite the ToolSet this often during the window
    proc: subprocess.Popen | None = None
    expect: str = "hello"  # the text of the verified reply's content block
    body: bytes = BODY  # the request every call of this server's windows sends
    headers: dict = field(default_factory=lambda: dict(HEADERS))
    reply_size: int = 0
    idle_rss: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"


def post_once(url: str, body: bytes = BODY, headers: dict | None = None) -> tuple[int, bytes, str]:
    req = urllib.request.Request(url, data=body, headers=headers or HEADERS, method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status, r.read(), r.headers.get("Content-Type", "")


def verify(s: Server, timeout: float = 30.0) -> None:
    """Waits until the server answers, then checks its reply and records the reply's size."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if s.proc and s.proc.poll() is not None:
            raise SystemExit(f"{s.name} exited with {s.proc.returncode} before answering")
        try:
            status, body, ctype = post_once(s.url, s.body, s.headers)
        except OSError as e:
            last = e
            time.sleep(0.05)
            continue
        # A server that fronts another serves its tools once it has listed them: until
        # then the call is refused as an unknown tool.
        if s.needs and status == 200 and b'"error"' in body:
            last = body[:200]
            time.sleep(0.05)
            continue
        break
    else:
        raise SystemExit(f"{s.name} did not answer within {timeout:.0f} s: {last}")
    if status != 200 or not ctype.startswith("application/json"):
        raise SystemExit(f"{s.name}: HTTP {status} {ctype!r}: {body[:300]!r}")
    msg = json.loads(body)
    result = msg.get("result") or {}
    content = result.get("content") or [{}]
    if msg.get("id") != 1 or result.get("isError") or content[0].get("text") != s.expect or len(content) != 1:
        raise SystemExit(f"{s.name} gave a wrong reply: {body[:300]!r}")
    s.reply_size = len(body)


def oha(oha_bin: str, s: Server, conns: int, seconds: float | None = None, requests: int | None = None, http2: bool = False) -> dict:
    cmd = ["taskset", "-c", LOAD_CPU, oha_bin, "--no-tui", "--output-format", "json", "-m", "POST", "-d", s.body.decode(), "-c", str(conns)]
    for k, v in s.headers.items():
        cmd += ["-H", f"{k}: {v}"]
    if http2:
        cmd += ["--http2", "-p", str(H2_STREAMS)]
    cmd += ["-z", f"{seconds}s"] if seconds else ["-n", str(requests)]
    out = subprocess.run(cmd + [s.url], check=True, capture_output=True, text=True, timeout=(seconds or 60) + 60)
    return json.loads(out.stdout)


def reloads(s: Server) -> float:
    """Successful reloads so far, from quiver's own counter."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{s.admin}/metrics", timeout=5).read().decode()
    m = re.search(r'^quiver_config_reloads_total\{[^}]*result="success"[^}]*\} (\S+)', text, re.M)
    return float(m.group(1)) if m else 0.0


class Rewriter(threading.Thread):
    """Rewrites a ToolSet every `every` seconds, each time with another tool description,
    so every write is a change (a new registry generation and `list_changed`)."""

    writes = itertools.count(1)  # across windows: a window never starts with the same text

    def __init__(self, path: Path, every: float):
        super().__init__(daemon=True)
        self.path, self.every, self.stop = path, every, threading.Event()
        self.base = path.read_text()

    def run(self):
        while not self.stop.wait(self.every):
            n = next(self.writes)
            tmp = self.path.with_suffix(".new")
            tmp.write_text(re.sub(r"description: .*", f"description: Returns the text it is given ({n}).", self.base, count=1))
            tmp.rename(self.path)


def window(oha_bin: str, s: Server, servers: dict[str, Server], conns: int, seconds: float, http2: bool = False) -> dict:
    pids = [s.proc.pid] + [servers[n].proc.pid for n in s.needs]
    rewriter = Rewriter(s.config, s.reload_every) if s.reload_every else None
    reloaded = reloads(s) if rewriter else 0.0
    before = [cpu([p]) for p in pids]
    if rewriter:
        rewriter.start()
    try:
        r = oha(oha_bin, s, conns, seconds=seconds, http2=http2)
    finally:
        if rewriter:
            rewriter.stop.set()
            rewriter.join()
    after = [cpu([p]) for p in pids]
    reloaded = reloads(s) - reloaded if rewriter else None
    codes = {str(k): v for k, v in (r.get("statusCodeDistribution") or {}).items()}
    ok = codes.get("200", 0)
    errors = r.get("errorDistribution") or {}
    bad = {k: v for k, v in codes.items() if k != "200"}
    if bad or not ok:
        raise SystemExit(f"{s.name} at {conns} connections: status codes {codes}, errors {errors}")
    data = r["summary"].get("totalData")
    if data is not None and data != ok * s.reply_size:
        raise SystemExit(f"{s.name} at {conns} connections: {data} bytes for {ok} replies of {s.reply_size} bytes")
    lat = r.get("latencyPercentiles") or {}
    spent = [(a[0] + a[1] - b[0] - b[1]) / ok * 1e6 for a, b in zip(after, before)]
    return {
        "ok": ok,
        # Requests cut off at the window's end are not failures of the server.
        "errors": sum(v for k, v in errors.items() if k != "aborted due to deadline"),
        "cpu_us": spent[0],
        "sys_us": (after[0][1] - before[0][1]) / ok * 1e6,
        "upstream_cpu_us": spent[1] if len(spent) > 1 else None,
        "rps": r["summary"]["requestsPerSec"],
        "p50_us": lat.get("p50", 0) * 1e6,
        "p99_us": lat.get("p99", 0) * 1e6,
        "rss": rss_mib(pids[:1]),
        "reloads": reloaded,
    }


def versions(args) -> dict[str, str]:
    v: dict[str, str] = {}
    lock = (ROOT / "bench/peers/rust/Cargo.lock").read_text()
    for crate in ("rmcp", "axum", "hyper", "tokio"):
        m = re.search(rf'name = "{crate}"\nversion = "([^"]+)"', lock)
        v[crate] = m.group(1) if m else "?"
    gomod = (ROOT / "tests/e2e/upstream-go/go.mod").read_text()
    m = re.search(r"github.com/modelcontextprotocol/go-sdk (v\S+)", gomod)
    v["go-sdk"] = m.group(1) if m else "?"
    for d in ("typescript-v1", "typescript-v2"):
        pl = ROOT / f"bench/peers/{d}/package-lock.json"
        if pl.exists():
            pkgs = json.loads(pl.read_text())["packages"]
            for name, meta in pkgs.items():
                if name.startswith("node_modules/@modelcontextprotocol/") and name.count("/") == 2:
                    v[name.removeprefix("node_modules/")] = meta["version"]
    v["node"] = subprocess.run([args.node, "--version"], capture_output=True, text=True).stdout.strip()
    v["python mcp"] = subprocess.run([args.python, "-c", "import importlib.metadata as m; print(m.version('mcp'))"], capture_output=True, text=True).stdout.strip()
    v["python"] = subprocess.run([args.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True).stdout.strip()
    v["go"] = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()
    v["oha"] = subprocess.run([args.oha, "--version"], capture_output=True, text=True).stdout.strip().removeprefix("oha ")
    v["quiver"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return v


# The 2026-07-28 (stateless) form of the same call: vMCP serves a call without a session
# only in this revision, which names the method and the tool in headers too.
MODERN_BODY = (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"},'
               b'"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}')
MODERN_HEADERS = {**HEADERS, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "echo"}


def gateway_peers(args, tmp: Path, rmcp: Server) -> list[Server]:
    """The gateways a user would put in front of an MCP server instead of quiver, each
    fronting the same rmcp peer with authentication, telemetry and audit off. (agentgateway
    cannot be built here: see "Other gateways" in docs/performance.md.)"""
    out = []
    if args.vmcp:
        # ToolHive's Virtual MCP server, standalone: one static backend, anonymous clients,
        # no outgoing auth, no telemetry section (so no exporter and no /metrics), no audit,
        # no optimizer (which would keep it on session-bound calls).
        cfg = tmp / "vmcp.yaml"
        cfg.write_text("name: bench\ngroupRef: bench\n"
                       f"backends:\n  - {{name: rmcp, url: '{rmcp.url}', transport: streamable-http}}\n"
                       "incomingAuth: {type: anonymous}\n"
                       "outgoingAuth: {source: inline, default: {type: unauthenticated}}\n"
                       "aggregation: {conflictResolution: priority, conflictResolutionConfig: {priorityOrder: [rmcp]}}\n")
        s = Server("vmcp→rmcp", [], "ToolHive vMCP (`vmcp serve`) fronting the rmcp peer; 2026-07-28 stateless calls",
                   needs=["rmcp"], body=MODERN_BODY, headers=dict(MODERN_HEADERS))
        s.argv = [args.vmcp, "serve", "--config", str(cfg), "--host", "127.0.0.1", "--port", str(s.port)]
        out.append(s)
    return out


def build_servers(args, tmp: Path) -> dict[str, Server]:
    echo = tmp / "echo.yaml"
    echo.write_text("tools:\n  - name: echo\n    description: Returns the text it is given.\n    input: {text: string}\n    handler: {template: '{{text}}'}\n")

    def server(name: str, argv, note: str, **kw) -> Server:
        """argv: a function of the port the server is to listen on."""
        s = Server(name, [], note, **kw)
        s.argv = argv(s.port)
        return s

    def quiver(name: str, binary: str, config: Path, note: str, needs: list[str] | None = None, flags: tuple[str, ...] = (), **kw) -> Server:
        admin = free_port()
        return server(name, lambda port: [binary, "--config", f"file:{config}", "--listen", f"127.0.0.1:{port}",
                                          "--admin-listen", f"127.0.0.1:{admin}", "--pin-workers", "--http2", *flags],
                      note, env={"RUST_LOG": "warn"}, needs=needs or [], admin=admin, config=config, **{"h2c": True, **kw})

    def peer(name: str, cmd: list[str], note: str, **kw) -> Server:
        return server(name, lambda port: [*cmd, "--port", str(port)], note, **kw)

    servers: list[Server] = [quiver("quiver", args.quiver, echo, "quiver-server, `template` tool, fat LTO")]
    servers.append(quiver("quiver per-core", args.quiver, echo, "the same with `--per-core-listeners` (a current-thread runtime per CPU, its own SO_REUSEPORT socket)",
                          flags=("--per-core-listeners",)))
    if args.quiver_pgo:
        servers.append(quiver("quiver-pgo", args.quiver_pgo, echo, "the same, built with PGO"))
        servers.append(quiver("quiver-pgo per-core", args.quiver_pgo, echo, "the PGO build with `--per-core-listeners`",
                              flags=("--per-core-listeners",)))
    if args.baseline:
        servers.append(quiver("baseline", args.baseline, echo, "another quiver-server build (`--baseline`), for a side-by-side comparison"))
    if args.governance:
        # The same tool governed: a typical policy (one that an anonymous caller passes on
        # its second clause), a per-caller rate limit high enough never to refuse, and the
        # audit trail (to a file). `--governance-split` adds a row for each of them alone.
        policy = "policies: [{name: typical, expression: \"'sre' in caller.groups || args.text != 'prod'\"}]\n"
        limit = "limits: [{rate: 1000000/s, burst: 1000000}]\n"
        audit = ("--audit", f"file:{tmp / 'audit.jsonl'}")
        rows = [("quiver+gov", policy + limit, audit, "quiver with a typical policy, a per-caller rate limit and the audit trail (to a file) on")]
        if args.governance_split:
            rows += [("quiver+policy", policy, (), "quiver with a typical policy"),
                     ("quiver+limit", limit, (), "quiver with a per-caller rate limit (never refusing)"),
                     ("quiver+audit", "", ("--audit", f"file:{tmp / 'audit-only.jsonl'}"), "quiver with the audit trail (to a file) on")]
        if args.baseline:
            rows.append(("baseline+gov", policy + limit, ("--audit", f"file:{tmp / 'audit-baseline.jsonl'}"), "the `--baseline` build, governed as quiver+gov"))
        for name, extra, flags, note in rows:
            cfg = tmp / f"{name.replace('+', '-')}.yaml"
            cfg.write_text(echo.read_text() + extra)
            binary = args.baseline if name.startswith("baseline") else args.quiver
            servers.append(quiver(name, binary, cfg, note, flags=flags))
    if args.otlp_endpoint:
        # Tracing on, exporting to a real collector (on the load generator's CPU); requests
        # carry no traceparent, so the ratio alone decides.
        for label, ratio in (("1%", "0.01"), ("100%", "1")):
            servers.append(quiver(f"quiver+trace {label}", args.quiver, echo, f"quiver, traces exported over OTLP/HTTP, {label} of requests sampled",
                                  flags=("--otlp-endpoint", args.otlp_endpoint, "--trace-sample-ratio", ratio), h2c=False))
    servers += [
        peer("axum-fixed", [f"{args.peers}/axum-fixed"], "ceiling: fixed bytes, body not read", h2c=True),
        peer("axum-serde", [f"{args.peers}/axum-serde"], "ceiling: serde into typed structs", h2c=True),
        peer("rmcp", [f"{args.peers}/rmcp-echo"], "official Rust SDK, stateless + JSON", h2c=True),
        server("go-sdk", lambda port: [args.go_mcp, "-stateless", "-json", "-http", f"127.0.0.1:{port}"],
               "official Go SDK, stateless + JSON"),
    ]
    for d, label in (("typescript-v1", "ts-sdk-v1"), ("typescript-v2", "ts-sdk-v2")):
        script = ROOT / f"bench/peers/{d}/server.mjs"
        if script.exists() and (ROOT / f"bench/peers/{d}/node_modules").exists():
            servers.append(peer(label, [args.node, str(script)], f"official TypeScript SDK ({d[-2:]}), stateless + JSON"))
    servers.append(peer("python-sdk", [args.python, str(ROOT / "bench/peers/python/server.py")], "official Python SDK, stateless + JSON"))
    if args.reload_every:
        # quiver while its ToolSet is rewritten every 100 ms (a new registry each time).
        cfg = tmp / "reloaded.yaml"
        cfg.write_text(echo.read_text())
        servers.append(quiver("quiver+reload", args.quiver, cfg, f"quiver, ToolSet rewritten every {args.reload_every * 1000:.0f} ms during the window",
                              reload_every=args.reload_every, h2c=False))
    if args.forwarding:
        # The issue-12 figure: quiver fronting rmcp as an `upstreams:` entry.
        rmcp = next(s for s in servers if s.name == "rmcp")
        fwd = tmp / "forward.yaml"
        fwd.write_text(f"upstreams:\n  - name: rmcp\n    http: {{url: '{rmcp.url}'}}\n")
        servers.append(quiver("quiver→rmcp", args.quiver, fwd, "quiver forwarding to the rmcp peer (`upstreams:`)", needs=["rmcp"], h2c=False))
        if args.baseline:
            servers.append(quiver("baseline→rmcp", args.baseline, fwd, "the `--baseline` build forwarding to the rmcp peer", needs=["rmcp"], h2c=False))
        # The floor of any hop: a relay that copies bytes between each client connection and
        # its own upstream connection, parsing nothing.
        servers.append(server("relay→rmcp", lambda port: [f"{args.peers}/tcp-relay", "--port", str(port), "--to", f"127.0.0.1:{rmcp.port}"],
                              "floor of a hop: TCP byte relay in front of the rmcp peer", needs=["rmcp"]))
        servers += gateway_peers(args, tmp, rmcp)
    if args.http_tools:
        # A hand-written http tool and the same request imported from an OpenAPI document,
        # side by side: each POSTs `/mcp?text=hello` to the axum-fixed peer and returns its
        # fixed JSON answer (text and structuredContent).
        fixed = next(s for s in servers if s.name == "axum-fixed")
        target = f"http://127.0.0.1:{fixed.port}"
        answer = '{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hello"}]}}'
        hand = tmp / "http-tool.yaml"
        hand.write_text("tools:\n  - name: echo\n    input: {text: string}\n"
                        f"    handler: {{http: {{method: POST, url: '{target}/mcp?text={{{{text}}}}'}}}}\n")
        doc = {"openapi": "3.0.3", "info": {"title": "fixed", "version": "1"}, "servers": [{"url": target}],
               "paths": {"/mcp": {"post": {"operationId": "echo",
                                          "parameters": [{"name": "text", "in": "query", "required": True, "schema": {"type": "string"}}],
                                          "responses": {"200": {"description": "ok"}}}}}}
        imported = tmp / "openapi-tool.yaml"
        imported.write_text("openapi:\n  - name: fixed\n    document: " + json.dumps(json.dumps(doc)) + "\n")
        servers.append(quiver("quiver→http", args.quiver, hand, "quiver, a hand-written `http` tool POSTing to the axum-fixed peer",
                              needs=["axum-fixed"], expect=answer, h2c=False))
        servers.append(quiver("quiver→openapi", args.quiver, imported, "quiver, the same request as an operation imported from an OpenAPI document",
                              needs=["axum-fixed"], expect=answer, h2c=False))
        if args.baseline:
            servers.append(quiver("baseline→http", args.baseline, hand, "the `--baseline` build, the hand-written `http` tool",
                                  needs=["axum-fixed"], expect=answer, h2c=False))
            servers.append(quiver("baseline→openapi", args.baseline, imported, "the `--baseline` build, the imported operation",
                                  needs=["axum-fixed"], expect=answer, h2c=False))
    only = set(args.only or [])
    keep = only | {n for s in servers if s.name in only for n in s.needs}
    return {s.name: s for s in servers if not only or s.name in keep}


def gateway_lines(results, servers, loads) -> list[str]:
    """One row per hop in front of rmcp: what the hop adds per call, that is its own CPU plus
    what the upstream spent in its window, minus what rmcp spends on the call served directly."""
    hops = [n for n, s in servers.items() if s.needs == ["rmcp"]]
    if not hops or "rmcp" not in servers:
        return []
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    lines = ["**Gateways in front of rmcp: forwarding overhead per call** (own CPU + upstream CPU − rmcp's CPU "
             "for the call served directly, same load)", "",
             "| hop | connections | overhead/call | own CPU | upstream CPU | vs relay | p50 | p99 | RSS after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label in loads:
        direct = results.get(("rmcp", label))
        if label.startswith("h2c") or not direct:
            continue
        base = med(direct, "cpu_us")
        over = {n: med(results[(n, label)], "cpu_us") + med(results[(n, label)], "upstream_cpu_us") - base
                for n in hops if (n, label) in results}
        relay = over.get("relay→rmcp")
        for n, o in over.items():
            rs = results[(n, label)]
            ratio = f"{o / relay:.1f}x" if relay and relay > 0 else ""
            lines.append(f"| {n} | {label} | {o:.1f} µs | {med(rs, 'cpu_us'):.1f} µs | {med(rs, 'upstream_cpu_us'):.1f} µs | {ratio} | "
                         f"{med(rs, 'p50_us'):.0f} µs | {med(rs, 'p99_us'):.0f} µs | {med(rs, 'rss'):.1f} MiB |")
    return lines + [""]


def table(results, servers, loads, args, v) -> str:
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    lines = [
        f"Command: `make bench-wire` (`scripts/bench-wire.sh --seconds {args.seconds:g} --repetitions {args.repetitions}`); "
        f"{time.strftime('%Y-%m-%d')}, commit {v['quiver']}, {os.cpu_count()} vCPUs, Linux {os.uname().release}. "
        f"Each server pinned to CPU {SERVER_CPU}, oha {v['oha']} on CPU {LOAD_CPU}; {args.seconds:g} s windows after a warm-up, "
        f"{args.repetitions} repetitions in alternating order, medians. CPU is the server's utime+stime per 2xx reply "
        "(for a row in front of rmcp, that server's own; the upstream's is added in brackets).",
        "",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if k != "quiver") + ".",
        "",
    ]
    for label in loads:
        title = f"HTTP/2 with prior knowledge, {label.split()[1].replace('x', ' connections x ')} streams" if label.startswith("h2c") \
            else f"{label} connection{'s' if label != '1' else ''}, HTTP/1.1"
        lines += [f"**{title}**", "",
                  "| server | CPU/request | vs axum-fixed | vs quiver | req/s | p50 | p99 | RSS after |",
                  "|---|---|---|---|---|---|---|---|"]
        q = med(results[("quiver", label)], "cpu_us") if ("quiver", label) in results else None
        b = med(results[("axum-fixed", label)], "cpu_us") if ("axum-fixed", label) in results else None
        for name, s in servers.items():
            rs = results.get((name, label))
            if not rs:
                continue
            c = med(rs, "cpu_us")
            extra = f" (+ {med(rs, 'upstream_cpu_us'):.1f} µs upstream)" if s.needs else ""
            if s.reload_every:
                extra = f" ({med(rs, 'reloads'):.0f} reloads per window; non-200 replies: 0, connection errors: {max(r['errors'] for r in rs)})"
            ratio = lambda base: f"{c / base:.2f}x" if base else ""  # noqa: E731
            lines.append(f"| {name} | {c:.1f} µs{extra} | {ratio(b)} | {ratio(q)} | {med(rs, 'rps'):,.0f} | "
                         f"{med(rs, 'p50_us'):.0f} µs | {med(rs, 'p99_us'):.0f} µs | {med(rs, 'rss'):.1f} MiB |")
        lines.append("")
    lines += gateway_lines(results, servers, loads)
    lines += ["| server | what it is | idle RSS | reply bytes |", "|---|---|---|---|"]
    lines += [f"| {s.name} | {s.note} | {s.idle_rss:.1f} MiB | {s.reply_size} |" for s in servers.values()]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quiver", required=True, help="the quiver-server binary (release build)")
    ap.add_argument("--quiver-pgo", help="a PGO-built quiver-server, measured as its own row")
    ap.add_argument("--otlp-endpoint", help="an OTLP/HTTP collector: adds rows with tracing on at 1%% and 100%% sampling")
    ap.add_argument("--baseline", help="another quiver-server build (e.g. the previous commit's), measured as rows of its own")
    ap.add_argument("--peers", required=True, help="directory of the Rust peers (axum-fixed, axum-serde, rmcp-echo, tcp-relay)")
    ap.add_argument("--go-mcp", required=True, help="the go-mcp binary (tests/e2e/upstream-go)")
    ap.add_argument("--vmcp", help="ToolHive's vmcp binary: adds the vmcp→rmcp row")
    ap.add_argument("--node", default="node")
    ap.add_argument("--python", required=True, help="a Python with the mcp package (the peer)")
    ap.add_argument("--oha", required=True)
    ap.add_argument("--connections", type=int, nargs="+", default=[1, 16, 128])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--only", nargs="*", help="measure only these servers (and what they call)")
    ap.add_argument("--h2c", type=int, default=2, help=f"HTTP/2 connections of the h2c row ({H2_STREAMS} streams each; 0: no h2c row)")
    ap.add_argument("--reload-every", type=float, default=0.1, help="the quiver+reload row rewrites its ToolSet this often, in seconds (0: no such row)")
    ap.add_argument("--no-forwarding", dest="forwarding", action="store_false", help="skip the quiver→rmcp row")
    ap.add_argument("--no-governance", dest="governance", action="store_false", help="skip the quiver+gov row (a policy, a rate limit and the audit trail on)")
    ap.add_argument("--no-http-tools", dest="http_tools", action="store_false", help="skip the quiver→http and quiver→openapi rows (a hand-written and an imported http tool)")
    ap.add_argument("--governance-split", action="store_true", help="add rows with the policy, the rate limit and the audit trail each on alone")
    ap.add_argument("--write", help="replace the block between the bench-wire markers in this Markdown file")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="quiver-bench-wire-"))
    servers = build_servers(args, tmp)
    try:
        for s in servers.values():
            s.proc = subprocess.Popen(["taskset", "-c", SERVER_CPU, *s.argv], stdout=subprocess.DEVNULL,
                                      stderr=open(tmp / f"{s.name}.log", "wb"), env={**os.environ, **s.env})
        for s in servers.values():
            verify(s)
        time.sleep(1.0)  # let start-up work (JIT, imports, GC) settle before idle RSS is read
        for s in servers.values():
            s.idle_rss = rss_mib([s.proc.pid])
            oha(args.oha, s, 16, requests=2000)  # warm-up: JITs, pools, caches
            print(f"{s.name}: ready, reply {s.reply_size} bytes, idle RSS {s.idle_rss:.1f} MiB", file=sys.stderr)
        loads = [(f"{c}", c, False) for c in args.connections]
        if args.h2c:
            loads.append((f"h2c {args.h2c}x{H2_STREAMS}", args.h2c, True))
        results: dict[tuple[str, str], list[dict]] = {}
        names = list(servers)
        for rep in range(args.repetitions):
            for label, conns, h2 in loads:
                order = names if rep % 2 == 0 else names[::-1]
                for name in order:
                    if h2 and not servers[name].h2c:
                        continue
                    r = window(args.oha, servers[name], servers, conns, args.seconds, http2=h2)
                    results.setdefault((name, label), []).append(r)
                    print(f"rep {rep + 1} {label:<9} {name:<14} {r['cpu_us']:8.1f} µs/req {r['rps']:10,.0f} req/s p99 {r['p99_us']:8.0f} µs", file=sys.stderr)
        for s in servers.values():
            if s.proc.poll() is not None:
                raise SystemExit(f"{s.name} exited during the run (log: {tmp / (s.name + '.log')})")
        out = table(results, servers, [label for label, _, _ in loads], args, versions(args))
        print(out)
        if args.write:
            doc = Path(args.write)
            text = doc.read_text()
            if BEGIN not in text or END not in text:
                raise SystemExit(f"{doc} has no {BEGIN} ... {END} block")
            head, rest = text.split(BEGIN, 1)
            doc.write_text(head + BEGIN + "\n" + out + END + rest.split(END, 1)[1])
            print(f"written into {doc}", file=sys.stderr)
    finally:
        for s in servers.values():
            if s.proc and s.proc.poll() is None:
                s.proc.terminate()
        for s in servers.values():
            if s.proc:
                try:
                    s.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    s.proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
