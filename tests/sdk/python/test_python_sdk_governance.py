"""Rate and concurrency limits and the audit trail on the real binary, driven by the official
Python SDK client with OIDC tokens of two users (a local issuer, as in the auth tests).

- Audit: under concurrent load from both users, the audit file holds exactly one record per
  tools/call, resources/read and prompts/get (matched by session and request id), plus one
  per refused credential, and `quiver_audit_dropped_total` stays 0. A tool that opts in has
  its arguments recorded with its `writeOnly` property and a secret value redacted.
- A queue too small for a burst drops records and counts every drop.
- Limits: a per-caller rate refuses a user's third call with -32004, a retry hint, HTTP 429
  and `Retry-After`, while the other user still has its budget; a concurrency limit refuses
  a call while another is in flight. The refusals are counted by tool, never by caller.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import BIN, Issuer, free_port, stop, wait_until
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError

SECRET = "s3cr3t-value-from-a-secret"

TOOLS = """
tools:
  - {name: add, handler: {builtin: add}}
  - name: login
    audit: {arguments: true}
    inputSchema:
      type: object
      properties:
        user: {type: string}
        password: {type: string, writeOnly: true}
        note: {type: string}
    handler: {template: "hello {{user}}"}
  - name: scarce
    limits: [{rate: 2/m}]
    handler: {template: ok}
  - name: single
    limits: [{concurrency: 1, per: all}]
    handler: {builtin: sleep}
  - {name: nap, handler: {builtin: sleep}}
resources:
  - {uri: "doc://readme", name: readme, text: "read me"}
prompts:
  - {name: summarize, arguments: [{name: topic, required: true}], messages: [{role: user, text: "Summarize {{topic}}"}]}
"""


class Governed:
    def __init__(self, url: str, admin: int, audit: Path, log: Path):
        self.url, self.admin, self.audit, self.log = url, admin, audit, log

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/metrics", timeout=2) as r:
            return r.read().decode()

    def metric(self, name: str) -> float:
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.audit.read_text().splitlines() if line]


def start(issuer: Issuer, tmp: Path, *flags: str) -> tuple[subprocess.Popen, Governed]:
    config = tmp / "tools.yaml"
    config.write_text(TOOLS)
    secrets = tmp / "secrets"
    (secrets / "db").mkdir(parents=True, exist_ok=True)
    (secrets / "db" / "password").write_text(SECRET)
    port, admin = free_port(), free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    audit = tmp / "audit.jsonl"
    log = tmp / "server.log"
    proc = subprocess.Popen(
        [str(BIN), "--config", f"file:{config}", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
         "--auth-issuer", issuer.url, "--auth-audience", url, "--secrets", f"dir:{secrets}",
         "--audit", f"file:{audit}", *flags],
        stdout=open(log, "w"),  # noqa: SIM115 - the child keeps it open
        stderr=subprocess.STDOUT,
    )
    g = Governed(url, admin, audit, log)
    wait_until(lambda: urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=2).status == 200)
    wait_until(lambda: issuer.jwks_fetches > 0)
    return proc, g


@pytest.fixture()
def governed(issuer):
    assert BIN.exists(), f"build the server first: {BIN}"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-gov-"))
    proc, g = start(issuer, tmp)
    try:
        yield g
    finally:
        stop(proc)
        if proc.returncode not in (0, -15):
            print(g.log.read_text())
        shutil.rmtree(tmp, ignore_errors=True)


def client(url: str, token: str) -> Client:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return Client(streamable_http_client(url, http_client=http))


async def session_load(url: str, token: str, calls: int) -> tuple[str | None, int]:
    """One session: `calls` concurrent tool calls, a read and a prompt; returns the number of
    audited requests it made."""
    async with client(url, token) as c:
        results = await asyncio.gather(*(c.call_tool("add", {"a": i, "b": 1}) for i in range(calls)))
        assert [r.content[0].text for r in results] == [str(i + 1) for i in range(calls)]
        await c.read_resource("doc://readme")
        await c.get_prompt("summarize", {"topic": "audit"})
        return calls + 2


def raw_post(url: str, token: str | None, body: dict):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json, text/event-stream")
    req.add_header("MCP-Protocol-Version", "2025-06-18")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read() or b"{}")


def test_audit_records_equal_calls_one_for_one_under_load(governed, issuer):
    alice = issuer.token("k1", governed.url, sub="alice", azp="agent-a")
    bob = issuer.token("k1", governed.url, sub="bob", client_id="agent-b")

    async def load():
        return await asyncio.gather(*(session_load(governed.url, t, 40) for t in [alice, bob] * 4))

    made = sum(asyncio.run(load()))
    # A refused credential is recorded too.
    status, _, _ = raw_post(governed.url, "not-a-token", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert status == 401
    # An opted-in tool's arguments, sensitive parts redacted.

    async def login():
        async with client(governed.url, alice) as c:
            r = await c.call_tool("login", {"user": "ann", "password": "hunter2-hunter2", "note": f"key {SECRET}"})
            assert r.content[0].text == "hello ann"

    asyncio.run(login())
    expected = made + 2
    wait_until(lambda: governed.metric("quiver_audit_records_total") >= expected, timeout=20)
    records = governed.records()
    assert governed.metric("quiver_audit_dropped_total") == 0
    assert len(records) == expected, f"{len(records)} records for {expected} audited requests"

    calls = [r for r in records if r["event"] == "tools/call" and r["tool"] == "add"]
    assert len(calls) == 8 * 40
    # One for one: the client speaks 2026-07-28 (no sessions), so each of a user's four
    # clients sent the same request ids: every (user, event, id) is recorded exactly four times.
    seen = Counter(
        (r["caller"]["subject"], r["event"], json.dumps(r["requestId"]))
        for r in records
        if r["event"] != "authentication" and r.get("tool") != "login"
    )
    assert set(seen.values()) == {4}, seen
    assert len(seen) == 2 * (40 + 2)
    assert all(r["outcome"] == "ok" for r in calls)
    assert {r["caller"]["subject"] for r in calls} == {"alice", "bob"}
    assert {r["caller"].get("clientId") for r in calls} == {"agent-a", "agent-b"}
    assert {r["caller"]["issuer"] for r in calls} == {issuer.url}
    assert all(r["bytesIn"] > 0 and r["bytesOut"] > 0 and r["durationMs"] >= 0 for r in calls)
    assert all("arguments" not in r for r in calls), "add does not opt in"
    assert sum(r["event"] == "resources/read" and r["uri"] == "doc://readme" for r in records) == 8
    assert sum(r["event"] == "prompts/get" and r["prompt"] == "summarize" for r in records) == 8

    [denied] = [r for r in records if r["event"] == "authentication"]
    assert denied["outcome"] == "unauthenticated" and "not valid" in denied["reason"]

    [login_rec] = [r for r in records if r.get("tool") == "login"]
    assert login_rec["arguments"]["user"] == "ann"
    assert login_rec["arguments"]["password"] == "[redacted]"
    assert SECRET not in json.dumps(login_rec) and "hunter2" not in json.dumps(login_rec)
    # The audit file holds records only; the logs went elsewhere.
    assert all("event" in r for r in records)


def test_a_full_audit_queue_counts_every_drop(issuer):
    tmp = Path(tempfile.mkdtemp(prefix="quiver-gov-"))
    proc, g = start(issuer, tmp, "--audit-queue", "1")
    try:
        token = issuer.token("k1", g.url, sub="carol")

        async def burst():
            async with client(g.url, token) as c:
                await asyncio.gather(*(c.call_tool("add", {"a": i, "b": 0}) for i in range(300)))

        asyncio.run(burst())
        # Every call either written or counted as dropped; with a queue of one, some dropped.
        wait_until(lambda: g.metric("quiver_audit_records_total") + g.metric("quiver_audit_dropped_total") >= 300, timeout=20)
        written, dropped = g.metric("quiver_audit_records_total"), g.metric("quiver_audit_dropped_total")
        assert written + dropped == 300
        assert dropped > 0, "a queue of one under 300 concurrent calls drops some"
        assert len(g.records()) == written
        wait_until(lambda: "audit records dropped" in g.log.read_text())
    finally:
        stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def test_rate_and_concurrency_limits_refuse_with_a_retry_hint(governed, issuer):
    alice = issuer.token("k1", governed.url, sub="alice")
    bob = issuer.token("k1", governed.url, sub="bob")

    async def scarce(token: str, times: int):
        async with client(governed.url, token) as c:
            out = []
            for _ in range(times):
                try:
                    out.append((await c.call_tool("scarce", {})).content[0].text)
                except MCPError as e:
                    out.append(e.error)
            return out

    a = asyncio.run(scarce(alice, 3))
    assert a[:2] == ["ok", "ok"]
    err = a[2]
    assert err.code == -32004
    assert "retry after" in err.message
    assert 1000 <= err.data["retryAfterMs"] <= 30_000
    assert err.data["limit"] == {"scope": "tool", "name": "scarce", "kind": "rate", "perCaller": True}
    # Another caller has its own budget.
    assert asyncio.run(scarce(bob, 1)) == ["ok"]

    # Over HTTP the refusal is a 429 with Retry-After.
    status, headers, body = raw_post(
        governed.url, alice,
        {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "scarce", "arguments": {}}},
    )
    assert status == 429, body
    assert 1 <= int(headers["Retry-After"]) <= 30
    assert body["id"] == 7 and body["error"]["code"] == -32004

    # Concurrency: one call of `single` in flight at a time, across callers.
    async def overlap():
        async with client(governed.url, alice) as a_c, client(governed.url, bob) as b_c:
            slow = asyncio.create_task(a_c.call_tool("single", {"ms": 1500}))
            # The slow call is in flight once the server counts it.
            for _ in range(500):
                if governed.metric("quiver_inflight_requests") >= 1:
                    break
                await asyncio.sleep(0.01)
            with pytest.raises(MCPError) as e:
                await b_c.call_tool("single", {"ms": 1})
            assert e.value.error.code == -32004
            assert e.value.error.data["limit"]["kind"] == "concurrency"
            assert (await slow).content[0].text.startswith("slept")
            # Its place is free again.
            assert (await b_c.call_tool("single", {"ms": 1})).content[0].text.startswith("slept")

    asyncio.run(overlap())
    text = governed.metrics()
    assert 'quiver_limited_total{tool="scarce",scope="tool",kind="rate"} 2' in text
    assert 'quiver_limited_total{tool="single",scope="tool",kind="concurrency"} 1' in text
    assert "alice" not in text and "bob" not in text
    limited = [r for r in governed.records() if r["outcome"] == "rate_limited"]
    assert sorted(r["tool"] for r in limited) == ["scarce", "scarce", "single"]
    assert all("retry after" in r["reason"] for r in limited)


def test_a_call_abandoned_by_its_client_is_recorded_once(governed, issuer):
    import socket
    token = issuer.token("k1", governed.url, sub="dave")
    port = int(governed.url.split(":")[2].split("/")[0])
    body = json.dumps({"jsonrpc": "2.0", "id": "gone-1", "method": "tools/call",
                       "params": {"name": "nap", "arguments": {"ms": 10000}}}).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\n"
            + f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        )
        wait_until(lambda: governed.metric("quiver_inflight_requests") >= 1)
    # The client is gone; the call is dropped and recorded as such, once.
    wait_until(lambda: any(r.get("requestId") == "gone-1" for r in governed.records()), timeout=8)
    [rec] = [r for r in governed.records() if r.get("requestId") == "gone-1"]
    assert rec["outcome"] == "disconnected" and rec["tool"] == "nap" and rec["caller"]["subject"] == "dave"


def test_a_call_refused_for_its_meta_is_audited(governed, issuer):
    """A 2026-07-28 call whose `_meta` is wrong is refused before it reaches its tool, and
    the audit trail still says who asked for what and why it was refused."""
    token = issuer.token("k1", governed.url, sub="erin")
    caps = {"io.modelcontextprotocol/clientCapabilities": {}}
    cases = {
        "no-meta": ({}, "invalid_params"),
        "mismatch": ({"_meta": {"io.modelcontextprotocol/protocolVersion": "2099-01-01", **caps}}, "header_mismatch"),
        "bad-level": ({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", **caps,
                                 "io.modelcontextprotocol/logLevel": "loud"}}, "invalid_params"),
    }
    for rid, (extra, _) in cases.items():
        body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                "params": {"name": "add", "arguments": {"a": 1, "b": 2}, **extra}}
        req = urllib.request.Request(governed.url, data=json.dumps(body).encode(), method="POST")
        for k, v in {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                     "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "add",
                     "Authorization": f"Bearer {token}"}.items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                answer = json.loads(r.read())
        except urllib.error.HTTPError as e:
            answer = json.loads(e.read())
        assert "error" in answer and "result" not in answer, answer

    def recorded():
        return {r["requestId"]: r for r in governed.records() if r.get("requestId") in cases}

    wait_until(lambda: len(recorded()) == len(cases), timeout=10)
    for rid, rec in recorded().items():
        assert rec["event"] == "tools/call" and rec["tool"] == "add", rec
        assert rec["caller"]["subject"] == "erin"
        assert rec["outcome"] == cases[rid][1], rec
        assert rec["reason"], rec
