#!/usr/bin/env python3
"""What fronting an MCP server costs: server CPU time per tools/call, over the wire.

Up to four ways to call the same `echo` tool, side by side in one run, in alternating
order, several repetitions:

  direct     client -> go-mcp (the upstream, official Go SDK, stateless JSON)
  forwarded  client -> quiver-server -> go-mcp   (an `upstreams:` http entry)
  local      client -> quiver-server             (a `template` tool: Quiver's own cost)
  user       client -> quiver-server -> go-mcp   (an entry with `identity: {mode: user}`:
             each call carries the caller's own upstream token from the server's token
             vault, the user having signed in once before the measuring starts)

The headline figure is each server's CPU time (utime + stime from /proc, over the window)
divided by the calls answered, which does not depend on how fast this Python client is.
"forwarded" minus "local" on the quiver side is what forwarding adds. Every reply is checked.

    bench/upstream_overhead.py --quiver target-images/.../quiver-server --upstream go-mcp

The paths are `direct forwarded local` unless `--paths` names others; `--user` adds `user`.
Without `user` nothing else changes: no identity provider, no authentication.

With `user`, the run needs Keycloak (`scripts/idp.sh`, started and stopped here, or the
one whose `env` file `--idp-env` names) and quiver-server changes as follows, for every
path through it, so that `forwarded` and `user` differ only by the sign-in:

- it is started with `--auth-issuer` (Keycloak's realm `quiver`, audience `quiver`) and the
  `--upstream-sign-in-*` flags (the vault in memory), and every call through it (`forwarded`
  and `local` too) carries alice's access token (client `agent`, password grant; fetched
  again before a window once it is four minutes old);
- its ToolSet has two entries for the same go-mcp: `go` (tools `up_*`, nothing else) and
  `me` (tools `me_*`, `identity: {mode: user}` pinned to the realm `upstream` with its
  pre-registered client `notes-registered`);
- before measuring, alice signs in: her first call of `me_echo` answers with a link, which a
  cookie-keeping HTTP "browser" here follows through Keycloak's login forms (alice at the
  realm `quiver`, carol at the realm `upstream`). go-mcp serves no protected resource
  metadata (RFC 9728) in its plain mode, which the sign-in reads from the upstream's origin,
  so for the sign-in only go-mcp is stopped and a stub serving just that document listens on
  its port; go-mcp is then started again on the same port, in the same plain mode (it ignores
  the `Authorization` header: the upstream's cost is the same for both paths).

The client `notes-registered` issues access tokens of 30 s, so the server refreshes alice's
token about every 22 s, on the call that finds it due: one call in such a window pays a
token request to Keycloak. The output counts the refreshes that fell into measured `user`
windows (`quiver_oauth_refreshes_total`); the question asked of `user` is the cost of a call
with a cached token.

`--callgrind` runs quiver-server under valgrind's callgrind instead (one worker thread,
jemalloc's time-driven housekeeping off, as bench/guard.py does) and counts the instructions
and allocations quiver-server spends per call of each path through it (default `forwarded
user`): for each path and repetition, on one keep-alive connection, calls one at a time,
`--callgrind-warmup` warm-up calls, counters zeroed, N1 calls, a dump, N2 calls, a dump;
per call = (dump 2 - dump 1) / (N2 - N1) (`--callgrind-calls N1 N2`). The count does not
depend on the machine's load, so it resolves differences far below the CPU times' noise. A
window in which the user's token was refreshed is measured again (at most twice).

    bench/upstream_overhead.py --quiver Q --upstream go-mcp --user
    bench/upstream_overhead.py --quiver Q --upstream go-mcp --callgrind
"""

from __future__ import annotations

import argparse
import base64
import http.client
import http.server
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
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import guard  # noqa: E402  (callgrind_control and the dump parser)

TICK = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parent.parent
PATHS = ["direct", "forwarded", "local", "user"]
UPSTREAM_CLIENT = ("notes-registered", "notes-registered-secret-0123456789")  # scripts/idp/upstream-realm.json
SIGN_IN_CLIENT = ("quiver-sign-in", "quiver-sign-in-secret-0123456789")  # scripts/idp/realm.json
TOKEN_AGE = 240  # seconds: the callers' token (10 min) is fetched again past this age


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

    def __init__(self, port: int, tool: str, token: str | None = None):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.tool = tool
        self.headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
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

    def close(self):
        self.conn.close()


def run(port: int, tool: str, calls: int, conns: int, pids: list[int], token: str | None = None, refreshes=None) -> dict:
    callers = [Caller(port, tool, token) for _ in range(conns)]
    lat: list[float] = []
    lock = threading.Lock()
    per = calls // conns

    def work(c: Caller, base: int):
        mine = [c.call(base + k) for k in range(per)]
        with lock:
            lat.extend(mine)

    refreshed = refreshes() if refreshes else 0
    before = [cpu_seconds(p) for p in pids]
    start = time.perf_counter()
    threads = [threading.Thread(target=work, args=(c, n * per + 1)) for n, c in enumerate(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    after = [cpu_seconds(p) for p in pids]
    refreshed = (refreshes() - refreshed) if refreshes else 0
    for c in callers:
        c.close()
    done = per * conns
    lat.sort()
    return {
        "cpu_us": [(a[0] + a[1] - b[0] - b[1]) / done * 1e6 for a, b in zip(after, before)],
        "sys_us": [(a[1] - b[1]) / done * 1e6 for a, b in zip(after, before)],
        "rps": done / wall,
        "p50_us": lat[len(lat) // 2] * 1e6,
        "p99_us": lat[int(len(lat) * 0.99)] * 1e6,
        "refreshes": refreshed,
    }


# --- the user's sign-in ----------------------------------------------------------------


def form_post(url: str, fields: dict[str, str], timeout=60) -> dict:
    body = urllib.parse.urlencode(fields).encode()
    req = urllib.request.Request(url, body, {"Content-Type": "application/x-www-form-urlencoded"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


class UserToken:
    """A caller's access token of the realm `quiver` (client `agent`, password grant),
    fetched again once it is TOKEN_AGE old."""

    def __init__(self, token_endpoint: str, user: str):
        self.endpoint, self.user = token_endpoint, user
        self.value, self.at = "", 0.0

    def get(self) -> str:
        if not self.value or time.monotonic() - self.at > TOKEN_AGE:
            r = form_post(self.endpoint, {"grant_type": "password", "client_id": "agent", "username": self.user, "password": f"{self.user}-password"})
            self.value, self.at = r["access_token"], time.monotonic()
        return self.value


class Browser:
    """A browser: cookies by host and path (as server/tests/upstream_sign_in.rs keeps them),
    no redirect followed on its own."""

    def __init__(self):
        self.jar: dict[tuple[str, str, str], str] = {}

    def request(self, method: str, url: str, body: str | None = None) -> tuple[int, str, str]:
        """(status, absolute Location or "", body) of one request."""
        u = urllib.parse.urlsplit(url)
        host, path = u.hostname or "", u.path or "/"
        headers = {"Cookie": "; ".join(f"{n}={v}" for (h, p, n), v in self.jar.items() if h == host and path.startswith(p))}
        if body is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        conn = http.client.HTTPConnection(host, u.port, timeout=60)
        try:
            conn.request(method, path + (f"?{u.query}" if u.query else ""), body, headers)
            r = conn.getresponse()
            text = r.read().decode(errors="replace")
            for c in r.headers.get_all("Set-Cookie") or []:
                parts = [x.strip() for x in c.split(";")]
                name, _, value = parts[0].partition("=")
                cpath, gone = "/", not value
                for a in parts[1:]:
                    low = a.lower()
                    if low.startswith("path="):
                        cpath = a[5:]
                    if low == "max-age=0" or low.startswith("expires=thu, 01 jan 1970"):
                        gone = True
                self.jar.pop((host, cpath, name), None)
                if not gone:
                    self.jar[(host, cpath, name)] = value
            loc = r.getheader("Location")
            return r.status, urllib.parse.urljoin(url, loc) if loc else "", text
        finally:
            conn.close()

    def through_idp(self, url: str, user: str, stop_at: str) -> tuple[int, str, str]:
        """Follows `url` through Keycloak, signing in as `user` when it asks, up to the first
        answer from `stop_at`: that answer."""
        nxt = url
        for _ in range(10):
            status, loc, text = self.request("GET", nxt)
            if nxt.startswith(stop_at):
                return status, loc, text
            if status == 302:
                nxt = loc
                continue
            if status != 200 or 'id="kc-form-login"' not in text:
                raise SystemExit(f"sign-in: {nxt} answered {status} without a login form: {text[:500]}")
            form = text[text.index('id="kc-form-login"'):]
            action = form.split('action="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
            status, loc, text = self.request("POST", action, urllib.parse.urlencode({"username": user, "password": f"{user}-password", "credentialId": ""}))
            if status != 302:
                raise SystemExit(f"sign-in: the login of {user} answered {status}: {text[:500]}")
            nxt = loc
        raise SystemExit("sign-in: more redirects than a sign-in takes")


def sign_in(link: str, mcp_base: str, user: str, upstream_user: str) -> str:
    """Opens the sign-in link: `user` at the realm `quiver`, `upstream_user` at the realm
    `upstream`; the last page."""
    b = Browser()
    callback = f"{mcp_base}/oauth/callback"
    status, loc, text = b.request("GET", link)
    if status != 302:
        raise SystemExit(f"sign-in: the link answered {status}: {text[:500]}")
    status, loc, text = b.through_idp(loc, user, callback)
    if status == 302:
        status, loc, text = b.through_idp(loc, upstream_user, callback)
    if status != 200 or "Signed in" not in text:
        raise SystemExit(f"sign-in: the last page is {status}: {text[:1000]}")
    return text


class MetadataStub(http.server.BaseHTTPRequestHandler):
    """The upstream's protected resource metadata (RFC 9728), alone: it listens on go-mcp's
    port while the user signs in."""

    doc = b""

    def do_GET(self):  # noqa: N802
        if self.path.startswith("/.well-known/oauth-protected-resource"):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(self.doc)))
            self.end_headers()
            self.wfile.write(self.doc)
        else:
            self.send_error(404)

    def do_POST(self):  # noqa: N802
        self.send_error(503)

    def log_message(self, *args):
        pass


def metadata_stub(port: int, resource: str, issuer: str) -> http.server.ThreadingHTTPServer:
    handler = type("Stub", (MetadataStub,), {"doc": json.dumps({"resource": resource, "authorization_servers": [issuer], "scopes_supported": ["openid", "profile"]}).encode()})
    for _ in range(100):  # go-mcp's socket may linger a moment
        try:
            srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
            break
        except OSError:
            time.sleep(0.1)
    else:
        raise SystemExit(f"could not listen on 127.0.0.1:{port} for the metadata stub")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


# --- the servers -----------------------------------------------------------------------


class Servers:
    """go-mcp and quiver-server (under callgrind when asked), and Keycloak for `user`;
    `stop()` ends what was started here."""

    def __init__(self, a, tmp: Path, user: bool):
        self.a, self.tmp, self.user = a, tmp, user
        self.up_port, self.q_port, self.q_admin = free_port(), free_port(), free_port()
        self.up = None
        self.q = None
        self.idp_dir: Path | None = None
        self.idp: dict[str, str] = {}
        self.alice: UserToken | None = None
        self.stub = None

    def start_upstream(self):
        self.up = subprocess.Popen([self.a.upstream, "-http", f"127.0.0.1:{self.up_port}", "-stateless", "-json"], stderr=subprocess.DEVNULL)
        up_url = f"http://127.0.0.1:{self.up_port}/mcp"

        def answers():
            req = urllib.request.Request(up_url, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode(), {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
            with urllib.request.urlopen(req, timeout=2) as r:
                return r.status == 200

        wait_until(answers)

    def stop_upstream(self):
        self.up.terminate()
        self.up.wait(timeout=10)

    def start_idp(self):
        if self.a.idp_env:
            text = Path(self.a.idp_env).read_text()
        else:
            self.idp_dir = self.tmp / "idp"
            r = subprocess.run([str(ROOT / "scripts/idp.sh"), "start", str(self.idp_dir)], capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                raise SystemExit(f"scripts/idp.sh start failed:\n{r.stderr[-3000:]}")
            text = (self.idp_dir / "env").read_text()
        self.idp = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        self.alice = UserToken(self.idp["QUIVER_IDP_TOKEN_ENDPOINT"], "alice")

    def start_quiver(self):
        up_url = f"http://127.0.0.1:{self.up_port}/mcp"
        cfg = self.tmp / "tools.yaml"
        text = (
            "tools: [{name: echo, input: {text: string}, handler: {template: '{{text}}'}}]\n"
            f"upstreams: [{{name: go, http: {{url: '{up_url}'}}, tools: {{prefix: up_}}}}]\n"
        )
        args = ["--config", f"file:{cfg}", "--listen", f"127.0.0.1:{self.q_port}", "--admin-listen", f"127.0.0.1:{self.q_admin}"]
        env = {"RUST_LOG": "warn"}
        if self.user:
            client_id, client_secret = UPSTREAM_CLIENT
            text = (
                "tools: [{name: echo, input: {text: string}, handler: {template: '{{text}}'}}]\n"
                "upstreams:\n"
                f"  - {{name: go, http: {{url: '{up_url}'}}, tools: {{prefix: up_}}}}\n"
                f"  - name: me\n"
                f"    http: {{url: '{up_url}'}}\n"
                f"    identity:\n"
                f"      mode: user\n"
                f"      issuer: '{self.idp['QUIVER_IDP_UPSTREAM_ISSUER']}'\n"
                f"      client: {{id: {client_id}, secret: '{{{{secret.upstream-client.secret}}}}'}}\n"
                f"      scopes: [openid, profile]\n"
                f"    tools: {{prefix: me_}}\n"
            )
            args += [
                "--auth-issuer", self.idp["QUIVER_IDP_ISSUER"], "--auth-audience", "quiver", "--secrets", "env",
                "--upstream-sign-in-url", f"http://127.0.0.1:{self.q_port}", "--upstream-sign-in-keys", "signin.keys",
                "--upstream-sign-in-client-id", SIGN_IN_CLIENT[0], "--upstream-sign-in-client-secret", "signin.browser",
            ]
            env |= {
                "QUIVER_SECRET_SIGNIN_KEYS": "k1:" + base64.b64encode(os.urandom(32)).decode(),
                "QUIVER_SECRET_SIGNIN_BROWSER": SIGN_IN_CLIENT[1],
                "QUIVER_SECRET_UPSTREAM_CLIENT_SECRET": client_secret,
            }
        cfg.write_text(text)
        log = (self.tmp / "quiver.log").open("wb")
        if self.a.callgrind:
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.tmp / 'callgrind.out'}", f"--log-file={self.tmp / 'valgrind.log'}",
                   "--dump-instr=no", "--dump-line=no", "--compress-strings=no", "--compress-pos=no",
                   self.a.quiver, *args, "--worker-threads", "1"]
            env |= {"PATH": "/usr/bin:/bin", "_RJEM_MALLOC_CONF": guard.MALLOC_CONF}
            self.q = subprocess.Popen(cmd, env=env, cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT)
        else:
            self.q = subprocess.Popen([self.a.quiver, *args], stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, **env})
        self.wait_ready()

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.q_admin}/status", timeout=10) as r:
            return json.load(r)

    def wait_ready(self):
        want = 2 if self.user else 1

        def ready():
            if self.q.poll() is not None:
                raise SystemExit(f"quiver-server exited ({self.q.returncode}):\n{self.log_tail()}")
            ups = self.status()["upstreams"]
            return len(ups) == want and all(u["state"] == "ready" and u["imported"] == 4 for u in ups)

        try:
            wait_until(ready, timeout=600 if self.a.callgrind else 20)
        except SystemExit:
            raise SystemExit(f"quiver-server did not become ready:\n{self.log_tail()}") from None

    def log_tail(self) -> str:
        return (self.tmp / "quiver.log").read_text(errors="replace")[-3000:]

    def token(self) -> str | None:
        return self.alice.get() if self.user else None

    def metric(self, prefix: str, *labels: str) -> int:
        """The sum of the samples of quiver-server's metrics whose line starts with `prefix`
        and holds every one of `labels`."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.q_admin}/metrics", timeout=30) as r:
            text = r.read().decode()
        return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
                   if line.startswith(prefix) and all(x in line for x in labels))

    def refreshes(self) -> int:
        """Refreshes of the users' tokens of upstream `me` so far (any result)."""
        return self.metric("quiver_oauth_refreshes_total{", 'upstream="me"')

    def sign_in(self):
        """Alice's first call of me_echo answers with a link; she opens it, signs in, and her
        next call goes through. go-mcp is replaced by the metadata stub meanwhile."""
        c = Caller(self.q_port, "me_echo", self.token())
        r = c.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "me_echo", "arguments": {"text": "x"}}})
        c.close()
        said = r["result"]["content"][0]["text"] if "result" in r else ""
        m = re.search(r"http://127\.0\.0\.1:\d+/oauth/start\?t=[^\s\"'<>)]+", said)
        if not (r.get("result", {}).get("isError") and m):
            raise SystemExit(f"the first call of me_echo did not answer with a sign-in link: {r}")
        self.stop_upstream()
        self.stub = metadata_stub(self.up_port, f"http://127.0.0.1:{self.up_port}/mcp", self.idp["QUIVER_IDP_UPSTREAM_ISSUER"])
        try:
            sign_in(m.group(0), f"http://127.0.0.1:{self.q_port}", "alice", "carol")
        finally:
            self.stub.shutdown()
            self.stub.server_close()
            self.stub = None
        self.start_upstream()
        if self.metric("quiver_oauth_sign_ins_total{", 'upstream="me"', 'result="ok"') != 1:
            raise SystemExit(f"the sign-in was not counted as one that succeeded:\n{self.log_tail()}")
        self.wait_ready()
        # The connections quiver-server kept to the go-mcp before are gone: a call may find one.
        for tool in ("up_echo", "me_echo"):
            for attempt in range(50):
                try:
                    c = Caller(self.q_port, tool, self.token())
                    c.call(attempt)
                    c.close()
                    break
                except (SystemExit, OSError, KeyError, TypeError, ValueError, AssertionError):
                    time.sleep(0.2)
            else:
                raise SystemExit(f"{tool} does not answer after the sign-in:\n{self.log_tail()}")

    def stop(self):
        if self.stub:
            self.stub.shutdown()
            self.stub.server_close()
        for p in (self.q, self.up):
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=120 if p is self.q and self.a.callgrind else 10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if self.idp_dir:
            subprocess.run([str(ROOT / "scripts/idp.sh"), "stop", str(self.idp_dir)], capture_output=True, timeout=120)


# --- the two measurements ----------------------------------------------------------------


def spread(xs: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))} … {fmt.format(max(xs))})" if len(xs) > 1 else fmt.format(xs[0])


def cpu_times(a, s: Servers, paths: list[str]):
    scenarios = {
        "direct": (s.up_port, "echo", [s.up.pid]),
        "forwarded": (s.q_port, "up_echo", [s.q.pid, s.up.pid]),
        "local": (s.q_port, "echo", [s.q.pid]),
        "user": (s.q_port, "me_echo", [s.q.pid, s.up.pid]),
    }
    scenarios = {k: v for k, v in scenarios.items() if k in paths}
    results: dict[tuple[str, int], list[dict]] = {}
    for conns in a.connections:
        for rep in range(a.repetitions):
            order = list(scenarios) if rep % 2 == 0 else list(reversed(scenarios))
            for name in order:
                port, tool, pids = scenarios[name]
                token = None if name == "direct" else s.token()
                refreshes = s.refreshes if name == "user" else None
                run(port, tool, min(2000, a.calls), conns, pids, token)  # warm-up
                results.setdefault((name, conns), []).append(run(port, tool, a.calls, conns, pids, token, refreshes))
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
        if "forwarded" in scenarios and "local" in scenarios:
            fwd = med(results[("forwarded", conns)], lambda r: r["cpu_us"][0])
            loc = med(results[("local", conns)], lambda r: r["cpu_us"][0])
            fsys = med(results[("forwarded", conns)], lambda r: r["sys_us"][0])
            lsys = med(results[("local", conns)], lambda r: r["sys_us"][0])
            print(f"| {conns} | **forwarding adds** | **{fwd - loc:.0f} µs ({fsys - lsys:.0f} µs)** | | | | |")
    if "user" in scenarios and "forwarded" in scenarios:
        tick_us = 1e6 / TICK / a.calls
        print(f"\nA call with the user's own upstream token against a plain forwarded call, same server: quiver CPU/call, "
              f"median (min … max) of {a.repetitions} runs; the difference is taken per repetition (the two paths ran in the same repetition). "
              f"/proc counts CPU in ticks of {1e3 / TICK:.0f} ms: {tick_us:.2f} µs per call at {a.calls} calls.\n")
        print("| connections | forwarded | user | user − forwarded | token refreshes in the user windows |")
        print("|---|---|---|---|---|")
        for conns in a.connections:
            f = [r["cpu_us"][0] for r in results[("forwarded", conns)]]
            u = [r["cpu_us"][0] for r in results[("user", conns)]]
            d = [y - x for x, y in zip(f, u)]
            n = sum(r["refreshes"] for r in results[("user", conns)])
            print(f"| {conns} | {spread(f, '{:.1f} µs')} | {spread(u, '{:.1f} µs')} | **{spread(d, '{:+.1f} µs')}** | {n} |")


def instruction_counts(a, s: Servers, paths: list[str]):
    tools = {"forwarded": "up_echo", "local": "echo", "user": "me_echo"}
    scenarios = [p for p in paths if p in tools]
    n1, n2 = a.callgrind_calls
    dumps_seen: set[Path] = set()

    def dump() -> Path:
        guard.callgrind(s.q.pid, "-d")
        for _ in range(600):
            new = set(s.tmp.glob("callgrind.out.*")) - dumps_seen
            if new:
                (d,) = new
                dumps_seen.add(d)
                return d
            time.sleep(0.1)
        raise SystemExit("callgrind wrote no dump")

    def window(name: str, base: int) -> tuple[float, float, int]:
        c = Caller(s.q_port, tools[name], s.token())
        refreshed = s.refreshes()
        for k in range(a.callgrind_warmup):
            c.call(base + k)
        guard.callgrind(s.q.pid, "-z")
        for k in range(n1):
            c.call(base + 10_000 + k)
        first = dump()
        for k in range(n2):
            c.call(base + 20_000 + k)
        second = dump()
        c.close()
        (i1, a1), (i2, a2) = guard.parse_dump(first), guard.parse_dump(second)
        return (i2 - i1) / (n2 - n1), (a2 - a1) / (n2 - n1), s.refreshes() - refreshed

    results: dict[str, list[tuple[float, float, int]]] = {}
    for rep in range(a.repetitions):
        order = scenarios if rep % 2 == 0 else list(reversed(scenarios))
        for name in order:
            for attempt in range(3):
                r = window(name, (rep * 10 + attempt) * 100_000)
                if r[2] == 0:
                    break
                print(f"  repetition {rep + 1}, {name}: the user's token was refreshed in the window; measured again", flush=True)
            results.setdefault(name, []).append(r)
            print(f"  repetition {rep + 1}, {name}: {r[0]:,.0f} instructions, {r[1]:.1f} allocations per call"
                  + (f" ({r[2]} token refresh(es) in the window)" if r[2] else ""), flush=True)
    print(f"\nquiver-server under callgrind, one connection, calls one at a time: instructions and allocations per call "
          f"(between dumps after {n1} and {n2} calls), median (min … max) of {a.repetitions} repetitions\n")
    print("| path | instructions/call | allocations/call |")
    print("|---|---|---|")
    for name in scenarios:
        rs = results[name]
        print(f"| {name} | {spread([r[0] for r in rs], '{:,.0f}')} | {spread([r[1] for r in rs], '{:.1f}')} |")
    for a_, b_, what in (("user", "forwarded", "a cached user token adds"), ("forwarded", "local", "forwarding adds")):
        if a_ in results and b_ in results:
            di = [x[0] - y[0] for x, y in zip(results[a_], results[b_])]
            da = [x[1] - y[1] for x, y in zip(results[a_], results[b_])]
            print(f"| **{what}** ({a_} − {b_}, per repetition) | **{spread(di, '{:+,.0f}')}** | {spread(da, '{:+.1f}')} |")
    print(f"\nThe dumps: {s.tmp} (callgrind_annotate)")
    if any(r[2] for rs in results.values() for r in rs):
        print("\nSome windows held a token refresh even after two more tries (marked above).")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--upstream", required=True, help="the go-mcp binary (tests/e2e/upstream-go/build.sh)")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--connections", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--paths", nargs="+", choices=PATHS, help="default: direct forwarded local (with --callgrind: forwarded user)")
    ap.add_argument("--user", action="store_true", help="add the path `user` (Keycloak is started for it)")
    ap.add_argument("--idp-env", help="the env file of a Keycloak started with `scripts/idp.sh start DIR` (else one is started here)")
    ap.add_argument("--callgrind", action="store_true", help="count quiver-server's instructions per call under callgrind instead of CPU time")
    ap.add_argument("--callgrind-calls", type=int, nargs=2, default=[200, 1200], metavar=("N1", "N2"))
    ap.add_argument("--callgrind-warmup", type=int, default=50)
    a = ap.parse_args()
    paths = list(a.paths or (["forwarded", "user"] if a.callgrind else ["direct", "forwarded", "local"]))
    if a.user and "user" not in paths:
        paths.append("user")
    paths = [p for p in PATHS if p in paths]
    if a.callgrind:
        paths = [p for p in paths if p != "direct"]
        if not paths or a.callgrind_calls[1] <= a.callgrind_calls[0]:
            raise SystemExit("--callgrind needs a path through quiver-server and N2 > N1")
    user = "user" in paths
    tmp = Path(tempfile.mkdtemp(prefix="quiver-bench-up-"))
    s = Servers(a, tmp, user)
    try:
        s.start_upstream()
        if user:
            s.start_idp()
        s.start_quiver()
        if user:
            s.sign_in()
        if a.callgrind:
            instruction_counts(a, s, paths)
        else:
            cpu_times(a, s, paths)
        if user:
            print(f"\nRefreshes of the user's upstream token over the whole run: {s.refreshes()} (its access tokens live 30 s)")
    finally:
        s.stop()


if __name__ == "__main__":
    sys.exit(main())
