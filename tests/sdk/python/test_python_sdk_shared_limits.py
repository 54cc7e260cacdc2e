"""Shared rate limits across replicas, backed by a real Redis (Debian's redis-server,
unpacked by scripts/redis.sh), with the official Python SDK client.

- Two replicas serving the same ToolSet count one `shared: true` budget: together they admit
  exactly the burst, and every refusal carries -32004 with a retry hint.
- Redis down: a replica failing open counts the limit on its own (its own burst), a replica
  failing closed refuses (kind `unavailable`); both count the failure. Redis back: the shared
  budget applies again after the backoff.
- Redis slow (DEBUG SLEEP): a call waits at most the timeout, then fails open; counted as
  `timeout`.
- Redis over TLS only, requiring client certificates, with an ACL user limited to the
  commands docs/governance.md lists: two replicas presenting the client certificate and
  authenticating as that user share one budget; a replica that trusts another CA fails its
  handshake, counts it, and fails open.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import BIN, ROOT, free_port, start_server, stop, wait_until
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from test_python_sdk_tls import issue, make_ca, pem_cert, pem_key

BURST = 6

TOOLS = f"""
tools:
  - name: metered
    limits: [{{rate: {BURST}/h, per: all, shared: true}}]
    handler: {{template: ok}}
"""


def redis_binary() -> str:
    given = os.environ.get("QUIVER_REDIS_SERVER")
    if given:
        return given
    out = subprocess.run([str(ROOT / "scripts" / "redis.sh")], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


class Redis:
    def __init__(self, tmp: Path):
        self.bin, self.port, self.tmp = redis_binary(), free_port(), tmp
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.bin, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--enable-debug-command", "local", "--dir", str(self.tmp)],
            stdout=open(self.tmp / "redis.log", "a"),  # noqa: SIM115 - the child keeps it open
            stderr=subprocess.STDOUT,
        )
        wait_until(lambda: self.command(b"PING") == b"+PONG\r\n")

    def stop(self) -> None:
        if self.proc:
            stop(self.proc)
            self.proc = None

    def command(self, *args: bytes, timeout: float = 2) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            msg = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
            s.sendall(msg)
            return s.recv(4096)

    def send(self, *args: bytes) -> socket.socket:
        """Sends a command without waiting for its answer (DEBUG SLEEP)."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
        return s


def metric(admin: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=2) as r:
        text = r.read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + " ") or l.startswith(name + "{"))


@pytest.fixture()
def setup():
    assert BIN.exists(), f"build the server first: {BIN}"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-shared-"))
    redis = Redis(tmp)
    redis.start()
    config = tmp / "tools.yaml"
    config.write_text(TOOLS)
    flags = ("--limits-redis", f"127.0.0.1:{redis.port}", "--limits-redis-timeout", "100ms")
    replicas = [
        start_server(config, tmp / "a.log", *flags),
        start_server(config, tmp / "b.log", *flags),
        start_server(config, tmp / "closed.log", *flags, "--limits-redis-fail", "closed"),
    ]
    try:
        for r in replicas:
            wait_until(lambda r=r: r.status()["ready"])
        yield redis, replicas
    finally:
        stop(*(r.proc for r in replicas))
        redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)


async def calls(url: str, n: int) -> list:
    """`n` calls of `metered`: "ok" or the refusal's error."""
    out = []
    async with Client(streamable_http_client(url)) as c:
        for _ in range(n):
            try:
                out.append((await c.call_tool("metered", {})).content[0].text)
            except MCPError as e:
                out.append(e.error)
    return out


def oks(results: list) -> int:
    return sum(r == "ok" for r in results)


def test_replicas_share_one_budget_and_redis_failures_are_handled(setup):
    redis, (a, b, closed) = setup

    async def both():
        # Interleaved: A, B, A, B, ... all within one burst window.
        ra, rb = [], []
        for _ in range(BURST):
            ra += await calls(a.url, 1)
            rb += await calls(b.url, 1)
        return ra, rb

    ra, rb = asyncio.run(both())
    assert oks(ra) + oks(rb) == BURST, (ra, rb)
    refused = [r for r in ra + rb if r != "ok"]
    assert all(e.code == -32004 and e.data["limit"]["kind"] == "rate" and e.data["retryAfterMs"] > 0 for e in refused)
    assert metric(a.admin, "quiver_limited_total") + metric(b.admin, "quiver_limited_total") == BURST
    assert metric(a.admin, "quiver_limits_shared_failures_total") == 0

    # Redis down. Failing open, each replica counts the same limit on its own: its own burst.
    redis.stop()
    assert oks(asyncio.run(calls(a.url, BURST + 2))) == BURST
    assert metric(a.admin, 'quiver_limits_shared_failures_total{kind="error"}') >= 1
    # Failing closed: refused, as unavailable, with a retry hint.
    res = asyncio.run(calls(closed.url, 2))
    assert all(e != "ok" and e.code == -32004 and e.data["limit"]["kind"] == "unavailable" for e in res), res
    assert metric(closed.admin, "quiver_limits_shared_failures_total") >= 1

    # Redis back (empty): after the backoff, the shared budget again.
    redis.start()
    wait_until(lambda: asyncio.run(calls(closed.url, 1)) == ["ok"], timeout=10)
    # `closed` took one of the fresh budget; the open replicas share the rest.
    time.sleep(1.2)  # the open replicas' backoff after their last failure (1 s) has passed
    ra = asyncio.run(calls(a.url, BURST))
    assert oks(ra) == BURST - 1, ra


def test_a_slow_redis_costs_at_most_the_timeout_and_fails_open(setup):
    redis, (a, _, _) = setup
    sleeper = redis.send(b"DEBUG", b"SLEEP", b"3")
    try:
        start = time.monotonic()
        res = asyncio.run(calls(a.url, 1))
        took = time.monotonic() - start
        assert res == ["ok"], res
        assert took < 2.5, f"a call waited {took:.2f}s on a sleeping Redis"
        assert metric(a.admin, 'quiver_limits_shared_failures_total{kind="timeout"}') == 1
    finally:
        sleeper.close()


# What docs/governance.md gives a Quiver user for shared limits.
LIMITS_ACL = b"resetkeys ~quiver:rl:* resetchannels -@all +evalsha +script|load +time +get +set".split()


class TlsRedis:
    """redis-server speaking TLS only on loopback, requiring client certificates."""

    def __init__(self, tmp: Path):
        self.tmp, self.port = tmp, free_port()
        ca, other = make_ca("redis CA"), make_ca("another CA")
        server, client = issue(ca, "127.0.0.1", server=True), issue(ca, "quiver", server=False)
        for name, data in [("ca.crt", pem_cert(ca[0])), ("other-ca.crt", pem_cert(other[0])),
                           ("server.crt", pem_cert(server[0])), ("server.key", pem_key(server[1])),
                           ("client.crt", pem_cert(client[0])), ("client.key", pem_key(client[1]))]:
            (tmp / name).write_bytes(data)
        self.proc = subprocess.Popen(
            [redis_binary(), "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
             "--tls-cert-file", str(tmp / "server.crt"), "--tls-key-file", str(tmp / "server.key"),
             "--tls-ca-cert-file", str(tmp / "ca.crt"), "--tls-auth-clients", "yes",
             "--save", "", "--appendonly", "no", "--dir", str(tmp)],
            stdout=open(tmp / "redis.log", "a"),  # noqa: SIM115 - the child keeps it open
            stderr=subprocess.STDOUT,
        )
        self.ctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
        self.ctx.load_cert_chain(tmp / "client.crt", tmp / "client.key")
        wait_until(self.answers)

    def answers(self) -> bool:
        try:
            return self.command(b"PING") == b"+PONG\r\n"
        except OSError:
            return False  # not listening yet

    def command(self, *args: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw:
            with self.ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
                return s.recv(4096)


def test_over_mutual_tls_replicas_share_one_budget_as_an_acl_user(tmp_path):
    assert BIN.exists(), f"build the server first: {BIN}"
    redis = TlsRedis(tmp_path)
    replicas = []
    try:
        assert redis.command(b"ACL", b"SETUSER", b"quiver", b"on", b">limits-pw", *LIMITS_ACL) == b"+OK\r\n"
        config = tmp_path / "tools.yaml"
        config.write_text(TOOLS)
        env = {**os.environ, "QUIVER_LIMITS_REDIS_PASSWORD": "limits-pw"}

        def flags(ca: str) -> tuple:
            return ("--limits-redis", f"127.0.0.1:{redis.port}", "--limits-redis-timeout", "2s",
                    "--limits-redis-tls", "--limits-redis-ca", str(tmp_path / ca),
                    "--limits-redis-client-cert", str(tmp_path / "client.crt"),
                    "--limits-redis-client-key", str(tmp_path / "client.key"),
                    "--limits-redis-username", "quiver")

        replicas = [start_server(config, tmp_path / f"{n}.log", *flags(ca), env=env)
                    for n, ca in [("a", "ca.crt"), ("b", "ca.crt"), ("untrusting", "other-ca.crt")]]
        for r in replicas:
            wait_until(lambda r=r: r.status()["ready"])
        a, b, untrusting = replicas

        async def both():
            ra, rb = [], []
            for _ in range(BURST):
                ra += await calls(a.url, 1)
                rb += await calls(b.url, 1)
            return ra, rb

        ra, rb = asyncio.run(both())
        assert oks(ra) + oks(rb) == BURST, (ra, rb)
        assert metric(a.admin, "quiver_limits_shared_failures_total") == 0
        assert metric(b.admin, "quiver_limits_shared_failures_total") == 0
        # The budget is in Redis, under the user's keys.
        assert redis.command(b"KEYS", b"quiver:rl:*").startswith(b"*1\r\n")

        # Another CA: the handshake fails, is counted, and the replica counts alone (open).
        assert oks(asyncio.run(calls(untrusting.url, 2))) == 2
        assert metric(untrusting.admin, 'quiver_limits_shared_failures_total{kind="error"}') >= 1
        assert "TLS handshake failed" in (tmp_path / "untrusting.log").read_text()
    finally:
        stop(*(r.proc for r in replicas))
        stop(redis.proc)
