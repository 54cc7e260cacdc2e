"""Traces end to end: the official Python MCP client calls quiver-server with its W3C trace
context (the SDK puts `traceparent` in `params._meta`); quiver-server exports its spans over
OTLP to a real OpenTelemetry Collector (built by scripts/otelcol.sh, writing what it
receives to a file), carries the context on to an http tool's API (`traceparent` header)
and to an upstream MCP server written with the official SDK (`_meta.traceparent`). The
assertions read what the collector received."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import BIN, ROOT, JsonHandler, free_port, start_server, stop, wait_until
from mcp import Client, StdioServerParameters
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

UPSTREAM = Path(__file__).resolve().parent / "servers" / "traced_upstream.py"
SERVER, CLIENT = 2, 3  # OTLP span kinds


class Api(JsonHandler):
    """A JSON API that remembers the trace headers of each request."""

    seen: list[dict] = []

    def do_GET(self):  # noqa: N802 - http.server naming
        Api.seen.append({k: self.headers.get(k) for k in ("traceparent", "tracestate")})
        self.reply_json({"tempC": 21})


@pytest.fixture(scope="module")
def collector():
    """The collector, on a free loopback port, and the file it writes spans to."""
    tmp = Path(tempfile.mkdtemp(prefix="quiver-otelcol-"))
    out = subprocess.run([str(ROOT / "scripts" / "otelcol.sh"), "start", str(tmp)], check=True, capture_output=True, text=True)
    pid, endpoint = out.stdout.split()
    yield endpoint, tmp / "traces.jsonl"
    os.kill(int(pid), 15)
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture()
def traced(collector):
    """quiver-server tracing every request to the collector, with an http tool and an upstream."""
    endpoint, _ = collector
    tmp = Path(tempfile.mkdtemp(prefix="quiver-traced-"))
    api = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    Api.port = api.server_address[1]
    threading.Thread(target=api.serve_forever, daemon=True).start()
    up_port = free_port()
    up_log = open(tmp / "upstream.log", "w")  # noqa: SIM115 - the child keeps it open
    upstream = subprocess.Popen([sys.executable, str(UPSTREAM), "http", str(up_port)], stdout=up_log, stderr=subprocess.STDOUT)
    config = tmp / "tools.yaml"
    config.write_text(f"""
server: {{name: traced}}
tools:
  - {{name: weather, input: {{city: string}}, handler: {{http: {{url: "http://127.0.0.1:{api.server_address[1]}/weather?city={{{{city}}}}", timeout: 2s}}}}}}
  - {{name: greet, input: {{name: string}}, handler: {{template: "Hello {{{{name}}}}!"}}}}
  - name: weather-then-greet
    input: {{city: string}}
    handler: {{pipeline: [{{tool: weather}}, {{tool: greet, input: {{name: "{{{{steps.0.text}}}}"}}}}]}}
upstreams:
  - {{name: sdk, http: {{url: "http://127.0.0.1:{up_port}/mcp"}}, tools: {{prefix: up_}}}}
""")
    env = {**os.environ, "OTEL_SERVICE_NAME": "quiver-under-test", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test"}
    sp = start_server(config, tmp / "server.log", "--otlp-endpoint", endpoint, "--trace-sample-ratio", "1",
                      "--trace-forward-tracestate", env=env)
    try:
        wait_until(lambda: all(u["state"] == "ready" for u in sp.status()["upstreams"]), timeout=30)
        yield sp
    finally:
        stop(sp.proc, upstream)
        api.shutdown()
        up_log.close()
        print((tmp / "server.log").read_text()[-3000:])
        shutil.rmtree(tmp, ignore_errors=True)


def spans_of(path: Path, trace_id: str) -> list[dict]:
    """Every span of `trace_id` the collector wrote, with its service name."""
    found = []
    if not path.exists():
        return found
    for line in path.read_text().splitlines():
        for rs in json.loads(line).get("resourceSpans", []):
            res = {a["key"]: a["value"].get("stringValue") for a in rs.get("resource", {}).get("attributes", [])}
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    if s["traceId"] == trace_id:
                        s["attrs"] = {a["key"]: next(iter(a["value"].values())) for a in s.get("attributes", [])}
                        s["resource"] = res
                        found.append(s)
    return found


def spans_named(path: Path, name: str) -> list[dict]:
    """Every span called `name` the collector wrote, whatever its trace."""
    found = []
    if not path.exists():
        return found
    for line in path.read_text().splitlines():
        for rs in json.loads(line).get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    if s["name"] == name:
                        s["attrs"] = {a["key"]: next(iter(a["value"].values())) for a in s.get("attributes", [])}
                        found.append(s)
    return found


ERROR = 2  # OTLP status code


def client_context(trace_id: str, span_id: str, state: TraceState | None = None):
    """Makes (trace_id, span_id) the client's current span: the SDK injects it into `_meta`."""
    sc = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=state)
    return trace.use_span(NonRecordingSpan(sc))


def test_a_call_continues_the_clients_trace_to_the_api_and_the_upstream(traced, collector):
    _, out = collector
    t_http, t_up, t_pipe = "0af7651916cd43dd8448eb211c80319c", "4bf92f3577b34da6a3ce929d0e0e4736", "5c0e2f7a9d1b4c3e8f6a0b1c2d3e4f50"
    client_span = "b7ad6b7169203331"
    Api.seen.clear()

    async def run():
        async with Client(traced.url, mode="legacy") as c:
            with client_context(t_http, client_span):
                r = await c.call_tool("weather", {"city": "Oslo"})
            assert not r.is_error, r
            with client_context(t_up, client_span, TraceState([("vendor", "v1")])):
                r = await c.call_tool("up_trace_context", {})
            assert not r.is_error, r
            seen_upstream = json.loads(r.content[0].text)
            with client_context(t_pipe, client_span):
                r = await c.call_tool("weather-then-greet", {"city": "Bergen"})
            assert not r.is_error, r
            return seen_upstream

    seen_upstream = asyncio.run(run())

    # The http tool: Quiver's server span under the client's, its client span under that,
    # and the API got a traceparent naming that client span.
    spans = wait_until(lambda: (s := spans_of(out, t_http)) and len(s) >= 2 and s, timeout=15)
    server = next(s for s in spans if s["kind"] == SERVER)
    assert server["name"] == "tools/call weather"
    assert server["parentSpanId"] == client_span
    assert server["attrs"]["mcp.method.name"] == "tools/call"
    assert server["attrs"]["gen_ai.tool.name"] == "weather"
    assert server["attrs"]["gen_ai.operation.name"] == "execute_tool"
    assert server["attrs"]["mcp.session.id"]
    assert server["resource"]["service.name"] == "quiver-under-test"
    assert server["resource"]["deployment.environment"] == "test"
    http_span = next(s for s in spans if s["kind"] == CLIENT)
    assert http_span["name"] == "GET"
    assert http_span["parentSpanId"] == server["spanId"]
    assert http_span["attrs"]["http.response.status_code"] == "200"
    # The URL as sent holds arguments (and could hold claims and secrets, in its path too):
    # the span has the origin and the configured URL with its placeholders as `{}`.
    api_origin = f"http://127.0.0.1:{Api.port}"
    assert http_span["attrs"]["url.full"] == api_origin, http_span["attrs"]
    assert http_span["attrs"]["url.template"] == f"{api_origin}/weather?city={{}}", http_span["attrs"]
    assert Api.seen[0]["traceparent"] == f"00-{t_http}-{http_span['spanId']}-01"

    # The upstream: a client span under Quiver's server span; the upstream's `_meta` names it.
    spans = wait_until(lambda: (s := spans_of(out, t_up)) and len(s) >= 2 and s, timeout=15)
    server = next(s for s in spans if s["kind"] == SERVER)
    assert server["name"] == "tools/call up_trace_context"
    upstream_call = next(s for s in spans if s["kind"] == CLIENT)
    assert upstream_call["name"] == "tools/call trace_context"
    assert upstream_call["parentSpanId"] == server["spanId"]
    assert upstream_call["attrs"]["quiver.upstream"] == "sdk"
    assert seen_upstream["traceparent"] == f"00-{t_up}-{upstream_call['spanId']}-01"
    assert seen_upstream["tracestate"] == "vendor=v1"
    # ... and so does the HTTP request that carried the call (for upstreams and proxies
    # that read the headers).
    assert seen_upstream["header.traceparent"] == seen_upstream["traceparent"]
    assert seen_upstream["header.tracestate"] == "vendor=v1"

    # A pipeline: one span per step under the server span; the http step's client span under its step.
    spans = wait_until(lambda: (s := spans_of(out, t_pipe)) and len(s) >= 4 and s, timeout=15)
    server = next(s for s in spans if s["kind"] == SERVER)
    steps = sorted((s for s in spans if s["name"].startswith("pipeline step")), key=lambda s: s["attrs"]["quiver.pipeline.step"])
    assert [s["name"] for s in steps] == ["pipeline step weather", "pipeline step greet"]
    assert all(s["parentSpanId"] == server["spanId"] for s in steps)
    http_span = next(s for s in spans if s["kind"] == CLIENT)
    assert http_span["parentSpanId"] == steps[0]["spanId"]


def test_the_http_traceparent_header_is_continued_and_bad_ones_start_a_new_trace(traced, collector):
    _, out = collector
    trace_id = "6d1e3f8a0b2c4d5e9f7a1b2c3d4e5f60"

    def post(headers: dict) -> dict:
        body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "greet", "arguments": {"name": "x"}}}).encode()
        req = urllib.request.Request(traced.url, data=body, method="POST", headers={
            "content-type": "application/json", "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2025-06-18", **headers})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.load(r)

    assert post({"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})["result"]["content"][0]["text"] == "Hello x!"
    spans = wait_until(lambda: spans_of(out, trace_id), timeout=15)
    assert [s["parentSpanId"] for s in spans] == ["00f067aa0ba902b7"]
    assert spans[0]["attrs"]["jsonrpc.request.id"] == "7"
    # Garbage in the header: the call is answered, and nothing is exported under it.
    for bad in ["00-zzzz-00f067aa0ba902b7-01", f"00-{trace_id}-0000000000000000-01", "x" * 4000]:
        assert post({"traceparent": bad})["result"]["content"][0]["text"] == "Hello x!"


def test_stdio_continues_the_meta_traceparent(collector):
    endpoint, out = collector
    tmp = Path(tempfile.mkdtemp(prefix="quiver-stdio-traced-"))
    config = tmp / "tools.yaml"
    config.write_text("tools:\n  - {name: greet, input: {name: string}, handler: {template: 'Hello {{name}}!'}}\n")
    trace_id = "7e2f4a9b1c3d5e6f8a0b2c4d6e8f0a1b"
    params = StdioServerParameters(command=str(BIN), args=["--stdio", "--config", f"file:{config}", "--otlp-endpoint", endpoint])

    async def run():
        async with Client(params, mode="legacy") as c:
            with client_context(trace_id, "1122334455667788"):
                r = await c.call_tool("greet", {"name": "stdio"})
            assert r.content[0].text == "Hello stdio!"

    try:
        asyncio.run(run())
        # The server exported what it had before exiting (stdin closed: it drains and flushes).
        spans = wait_until(lambda: spans_of(out, trace_id), timeout=15)
        assert spans[0]["name"] == "tools/call greet"
        assert spans[0]["parentSpanId"] == "1122334455667788"
        assert spans[0]["attrs"]["network.transport"] == "pipe"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_collector_that_hangs_costs_dropped_spans_never_slow_calls(tmp_path):
    """The export queue is bounded: when the collector accepts but never answers, spans
    beyond the queue are dropped and counted, and calls are answered as fast as ever."""
    import socket
    import time

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)  # accepts (the kernel does), never reads nor answers
    config = tmp_path / "tools.yaml"
    config.write_text("tools:\n  - {name: greet, input: {name: string}, handler: {template: 'Hello {{name}}!'}}\n")
    sp = start_server(config, tmp_path / "server.log", "--otlp-endpoint", f"http://127.0.0.1:{hung.getsockname()[1]}", "--trace-queue", "16")
    try:
        wait_until(lambda: sp.status()["ready"])
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "greet", "arguments": {"name": "x"}}}).encode()
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-06-18"}
        started = time.monotonic()
        for _ in range(300):
            req = urllib.request.Request(sp.url, data=body, method="POST", headers=headers)
            with urllib.request.urlopen(req, timeout=5) as r:
                assert json.load(r)["result"]["content"][0]["text"] == "Hello x!"
        elapsed = time.monotonic() - started
        dropped = next(float(line.split()[1]) for line in sp.metrics().splitlines() if line.startswith("quiver_trace_spans_dropped_total "))
        # One batch (16) is in the hung export and 16 wait in the queue: the rest are dropped
        # (a second batch may have gone out if the first export timed out meanwhile).
        assert dropped >= 200, dropped
        assert elapsed < 30, f"300 calls took {elapsed:.1f}s with a hung collector"
    finally:
        stop(sp.proc)
        hung.close()


def test_a_dispatch_exemplar_in_prometheus_names_a_trace_the_collector_has(traced, collector, tmp_path):
    """A real Prometheus with exemplar storage scrapes the server (OpenMetrics). Every
    exemplar it returns on the dispatch histogram names a trace the collector received, whose
    server span is the call of that series' tool: the client's trace for a call that came
    with a `traceparent`, and, for a call that came without one, a trace Quiver started
    (its id known to the test only from Prometheus)."""
    _, out = collector
    client_trace = "8f3e5d7c9b1a2f4e6d8c0b2a4f6e8d0c"

    async def run():
        async with Client(traced.url, mode="legacy") as c:
            with client_context(client_trace, "2233445566778899"):
                r = await c.call_tool("greet", {"name": "exemplar"})
            assert r.content[0].text == "Hello exemplar!"
            # No trace context: sampled by the ratio (1), a new trace.
            r = await c.call_tool("weather", {"city": "Tromso"})
            assert not r.is_error, r

    asyncio.run(run())
    # The exposition carries it (OpenMetrics: `# {trace_id="..."} value timestamp`).
    exposition = traced.metrics()
    assert f'# {{trace_id="{client_trace}"}}' in exposition, exposition[:2000]

    prom_port = free_port()
    (tmp_path / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s}}
scrape_configs:
  - job_name: quiver
    static_configs: [{{targets: ["127.0.0.1:{traced.admin}"]}}]
""")
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}", "--enable-feature=exemplar-storage"],
                            stdout=open(tmp_path / "prometheus.log", "w"), stderr=subprocess.STDOUT)  # noqa: SIM115

    def exemplars_by_tool():
        """{tool: {trace ids}} of the dispatch exemplars Prometheus stored, once both tools have one."""
        q = urllib.parse.urlencode({"query": "quiver_dispatch_duration_seconds_bucket", "start": "0", "end": "9999999999"})
        with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/query_exemplars?{q}", timeout=2) as r:
            doc = json.load(r)
        assert doc["status"] == "success", doc
        found: dict[str, set[str]] = {}
        for series in doc["data"]:
            tool = series["seriesLabels"]["tool"]
            found.setdefault(tool, set()).update(e["labels"]["trace_id"] for e in series["exemplars"])
        return found if {"greet", "weather"} <= found.keys() else None

    try:
        by_tool = wait_until(exemplars_by_tool, timeout=30)
    finally:
        stop(prom)
    assert by_tool["greet"] == {client_trace}, by_tool
    assert set(by_tool) == {"greet", "weather"}, by_tool
    started = by_tool["weather"]
    assert len(started) == 1 and client_trace not in started, by_tool

    # Each trace id Prometheus returned is one the collector received: the server span of
    # that tool's call, and (for the trace Quiver started) no parent, its http call below it.
    for tool, ids in by_tool.items():
        for trace_id in ids:
            assert len(trace_id) == 32 and int(trace_id, 16), trace_id
            # (The SDK lists the tools under the same context before a call: a tools/list span.)
            spans = wait_until(lambda t=trace_id: [s for s in spans_of(out, t) if s["kind"] == SERVER and s["name"].startswith("tools/call")], timeout=15)
            assert [s["name"] for s in spans] == [f"tools/call {tool}"], spans
            assert spans[0]["attrs"]["gen_ai.tool.name"] == tool
    (root,) = [s for s in spans_of(out, next(iter(started))) if s["kind"] == SERVER and s["name"].startswith("tools/call")]
    assert root.get("parentSpanId", "") == "", root
    http_span = wait_until(lambda: [s for s in spans_of(out, next(iter(started))) if s["kind"] == CLIENT], timeout=15)[0]
    assert http_span["parentSpanId"] == root["spanId"]


def test_reloads_and_an_upstream_reconnecting_are_traced(collector, tmp_path):
    """Work no request asked for starts traces of its own: each config reload (new text),
    rebuild (an upstream's tools changed) and connection attempt of an upstream that is
    down, with what came of it."""
    _, out = collector
    up_port = free_port()
    config = tmp_path / "tools.yaml"
    config.write_text(f"""
tools:
  - {{name: greet, input: {{name: string}}, handler: {{template: 'Hello {{{{name}}}}!'}}}}
upstreams:
  - {{name: late, http: {{url: "http://127.0.0.1:{up_port}/mcp"}}, tools: {{prefix: late_}}}}
""")
    endpoint, _ = collector
    sp = start_server(config, tmp_path / "server.log", "--otlp-endpoint", endpoint, "--trace-sample-ratio", "1")
    upstream = None
    try:
        # Nothing listens yet: failed attempts, each a span of its own.
        failed = wait_until(lambda: [s for s in spans_named(out, "upstream connect")
                                     if s["attrs"]["quiver.upstream"] == "late" and s["status"].get("code") == ERROR], timeout=20)
        assert failed[0]["attrs"]["error.type"] == "down"
        assert failed[0].get("parentSpanId", "") == "", "a connection attempt starts its own trace"
        upstream = subprocess.Popen([sys.executable, str(UPSTREAM), "http", str(up_port)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(lambda: all(u["state"] == "ready" for u in sp.status()["upstreams"]), timeout=30)
        ok = wait_until(lambda: [s for s in spans_named(out, "upstream connect")
                                 if s["attrs"]["quiver.upstream"] == "late" and s["status"].get("code") != ERROR], timeout=15)
        assert int(ok[0]["attrs"]["quiver.upstream.attempt"]) >= 2, ok[0]
        # Its tools arrived: the registry was rebuilt with them.
        rebuilt = wait_until(lambda: [s for s in spans_named(out, "config rebuild") if s["attrs"]["quiver.reload.result"] == "success"], timeout=15)
        assert int(rebuilt[0]["attrs"]["quiver.generation"]) >= 2

        # New config text: a reload span, and a rejected one as an error.
        config.write_text(config.read_text().replace("name: greet", "name: hello"))
        reloaded = wait_until(lambda: [s for s in spans_named(out, "config reload")
                                       if s["attrs"]["quiver.reload.result"] == "success" and int(s["attrs"]["quiver.generation"]) >= 3], timeout=15)
        assert reloaded[0]["kind"] == 1  # internal
        config.write_text("tools: [{name: broken, handler: {nope: 1}}]\n")
        invalid = wait_until(lambda: [s for s in spans_named(out, "config reload") if s["attrs"]["quiver.reload.result"] == "invalid"], timeout=15)
        assert invalid[0]["status"]["code"] == ERROR
        assert int(invalid[0]["attrs"]["quiver.reload.problems"]) >= 1
    finally:
        stop(sp.proc, *([upstream] if upstream else []))
