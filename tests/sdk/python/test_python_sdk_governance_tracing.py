"""Spans of governance decisions, end to end: the official Python MCP client calls a traced
quiver-server (its W3C trace context in `params._meta`); the server exports over OTLP to a
real OpenTelemetry Collector (scripts/otelcol.sh, writing what it receives to a file). A
call a policy denies has a `quiver.policy` span saying so under the request's server span,
and a call a rate limit refuses a `quiver.limit` span; allowed calls have them too,
saying `allow` and `admitted`."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import ROOT, start_server, stop, wait_until
from mcp import Client
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

SERVER, INTERNAL = 2, 1  # OTLP span kinds

TOOLS = """
server: {name: governed-traced}
policies:
  - name: no-prod
    expression: "args.name != 'prod'"
    tools: [greet]
tools:
  - {name: greet, input: {name: string}, handler: {template: "Hello {{name}}!"}}
  - name: once
    handler: {template: "once"}
    limits: [{rate: 1/h, burst: 1}]
"""


@pytest.fixture(scope="module")
def collector():
    """The collector, on a free loopback port, and the file it writes spans to."""
    tmp = Path(tempfile.mkdtemp(prefix="quiver-otelcol-gov-"))
    out = subprocess.run([str(ROOT / "scripts" / "otelcol.sh"), "start", str(tmp)], check=True, capture_output=True, text=True)
    pid, endpoint = out.stdout.split()
    yield endpoint, tmp / "traces.jsonl"
    os.kill(int(pid), 15)
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture()
def server(collector):
    endpoint, _ = collector
    tmp = Path(tempfile.mkdtemp(prefix="quiver-gov-traced-"))
    (tmp / "tools.yaml").write_text(TOOLS)
    sp = start_server(tmp / "tools.yaml", tmp / "server.log", "--otlp-endpoint", endpoint, "--trace-sample-ratio", "1")
    try:
        yield sp
    finally:
        stop(sp.proc)
        print((tmp / "server.log").read_text()[-3000:])
        shutil.rmtree(tmp, ignore_errors=True)


def spans_of(path: Path, trace_id: str) -> list[dict]:
    """Every span of `trace_id` the collector wrote, its attributes flattened into `attrs`."""
    found = []
    if not path.exists():
        return found
    for line in path.read_text().splitlines():
        for rs in json.loads(line).get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    if s["traceId"] == trace_id:
                        s["attrs"] = {a["key"]: next(iter(a["value"].values())) for a in s.get("attributes", [])}
                        found.append(s)
    return found


def in_trace(trace_id: str):
    """Makes a sampled span of `trace_id` the client's current one: the SDK sends it in `_meta`."""
    sc = SpanContext(int(trace_id, 16), int("c0ffee0000000001", 16), is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.use_span(NonRecordingSpan(sc))


def decision(out: Path, trace_id: str, name: str) -> tuple[dict, dict]:
    """The server span of `trace_id` and its span called `name`, once the collector has both."""
    spans = wait_until(lambda: (s := spans_of(out, trace_id)) and any(x["name"] == name for x in s) and s, timeout=15)
    server = next(s for s in spans if s["kind"] == SERVER)
    span = next(s for s in spans if s["name"] == name)
    assert span["kind"] == INTERNAL
    assert span["parentSpanId"] == server["spanId"]
    return server, span


def test_a_denied_call_has_the_policy_decision_span(server, collector):
    _, out = collector
    denied, allowed = "7e57000000000000000000000000d001", "7e57000000000000000000000000a001"

    async def run():
        async with Client(server.url, mode="legacy") as c:
            with in_trace(denied), pytest.raises(MCPError) as e:
                await c.call_tool("greet", {"name": "prod"})
            assert "no-prod" in str(e.value)
            with in_trace(allowed):
                r = await c.call_tool("greet", {"name": "dev"})
            assert not r.is_error, r

    asyncio.run(run())

    server_span, policy = decision(out, denied, "quiver.policy")
    assert server_span["name"] == "tools/call greet"
    assert policy["attrs"]["quiver.policy.decision"] == "deny"
    assert policy["attrs"]["quiver.policy.name"] == "no-prod"
    assert policy["attrs"]["quiver.policy.result"] == "false"
    _, policy = decision(out, allowed, "quiver.policy")
    assert policy["attrs"]["quiver.policy.decision"] == "allow"
    assert "quiver.policy.name" not in policy["attrs"]


def test_a_refused_call_has_the_limit_decision_span(server, collector):
    _, out = collector
    first, refused = "7e57000000000000000000000000b001", "7e57000000000000000000000000b002"

    async def run():
        async with Client(server.url, mode="legacy") as c:
            with in_trace(first):
                r = await c.call_tool("once", {})
            assert not r.is_error, r
            with in_trace(refused), pytest.raises(MCPError) as e:
                await c.call_tool("once", {})
            assert "Rate limited" in str(e.value)

    asyncio.run(run())

    _, limit = decision(out, first, "quiver.limit")
    assert limit["attrs"]["quiver.limit.outcome"] == "admitted"
    _, limit = decision(out, refused, "quiver.limit")
    assert limit["attrs"]["quiver.limit.outcome"] == "rate_limited"
    assert limit["attrs"]["quiver.limit.kind"] == "rate"
    assert limit["attrs"]["quiver.limit.scope"] == "tool"
    assert limit["attrs"]["quiver.limit.name"] == "once"
    # A tool without policies opens no policy span.
    assert not any(s["name"] == "quiver.policy" for s in spans_of(out, refused))
