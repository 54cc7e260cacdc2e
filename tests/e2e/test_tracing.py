"""Traces on a kind cluster: an McpServer with `spec.tracing` exports its spans to an
OpenTelemetry Collector running in the cluster (tests/otelcol/image.sh: the test command's
collector as an image, writing what it receives to its stdout).

The official Python client calls three tools through a port-forward, with a W3C
`traceparent` header naming its own span: a template tool, an http tool that calls an API in
the cluster, and a tool of an upstream MCP server in the cluster (go-mcp, the official Go
SDK). The collector receives, in the client's trace: Quiver's server span of each call,
parented by the client's span, with the McpServer's name as `service.name`; the http tool's
client span and the upstream call's client span, each a child of its server span.
"""

from __future__ import annotations

import asyncio
import json
import os

from conftest import Namespace, eventually, kubectl
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

GO_IMAGE = os.environ.get("QUIVER_E2E_GO_MCP_IMAGE", "quiver-e2e/go-mcp:dev")
OTELCOL_IMAGE = os.environ.get("QUIVER_E2E_OTELCOL_IMAGE", "quiver-e2e/otelcol:dev")
TRACE_ID, CLIENT_SPAN = "7d3c2b1a09f8e7d6c5b4a39281706f5e", "a1b2c3d4e5f60718"
SERVER, CLIENT = 2, 3  # OTLP span kinds

HARDENED = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def deployment(name: str, image: str, args: list[str], port: int, probe: dict | None) -> list[dict]:
    labels = {"app": name}
    container = {"name": name, "image": image, "imagePullPolicy": "IfNotPresent", "args": args,
                 "ports": [{"containerPort": port}], "securityContext": HARDENED}
    if probe:
        container["readinessProbe"] = probe
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                      "containers": [container]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
         "spec": {"selector": labels, "ports": [{"port": port, "targetPort": port}]}},
    ]


def mcp_server(ns: str) -> dict:
    return {
        "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "traced"},
        "spec": {
            # Ratio 0 and every client's sampled flag trusted (no client authentication here):
            # only what the client sampled is traced.
            "tracing": {"endpoint": f"http://otelcol.{ns}.svc:4318", "samplingRatio": 0,
                        "trustClientSampling": "always"},
            "tools": [
                {"name": "hello", "description": "Greets.", "handler": {"template": "hello"}},
                {"name": "health", "description": "Asks the notes service whether it is healthy.",
                 "handler": {"http": {"url": f"http://notes.{ns}.svc:8080/healthz", "timeout": "5s"}}},
            ],
            "upstreams": [{"name": "notes", "http": {"url": f"http://notes.{ns}.svc:8080/mcp"},
                           "tools": {"prefix": "notes_", "include": ["echo"]}}],
        },
    }


def deploy(ns: Namespace) -> None:
    for obj in deployment("otelcol", OTELCOL_IMAGE, [], 4318, None):
        ns.apply(obj)
    for obj in deployment("notes", GO_IMAGE, ["-http", ":8080"], 8080,
                          {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 2}):
        ns.apply(obj)
    ns.k("rollout", "status", "deploy/otelcol", "--timeout=180s")
    ns.k("rollout", "status", "deploy/notes", "--timeout=180s")
    ns.apply(mcp_server(ns.name))
    ns.wait_condition("traced", "Ready", "True", 300)
    ns.wait_condition("traced", "UpstreamsReady", "True", 180)


def received(ns: Namespace) -> list[dict]:
    """Every span of TRACE_ID the in-cluster collector wrote to its stdout, with its service."""
    spans = []
    for line in ns.k("logs", "deploy/otelcol").splitlines():
        if not line.startswith('{"resourceSpans"'):
            continue  # the collector's own log lines
        for rs in json.loads(line)["resourceSpans"]:
            res = {a["key"]: a["value"].get("stringValue") for a in rs.get("resource", {}).get("attributes", [])}
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    if s["traceId"] == TRACE_ID:
                        s["attrs"] = {a["key"]: next(iter(a["value"].values())) for a in s.get("attributes", [])}
                        s["service"] = res.get("service.name")
                        spans.append(s)
    return spans


async def calls(url: str) -> list:
    headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
    async with Client(streamable_http_client(url, http_client=create_mcp_http_client(headers=headers)),
                      mode="legacy") as c:
        return [await c.call_tool(name, args) for name, args in
                [("hello", {}), ("health", {}), ("notes_echo", {"text": "traced"})]]


def test_an_mcpserver_exports_the_clients_trace_to_a_collector_in_the_cluster(ns: Namespace):
    deploy(ns)
    with ns.port_forward("svc/traced", 8080) as port:
        results = asyncio.run(calls(f"http://127.0.0.1:{port}/mcp"))
    assert [(r.is_error, r.content[0].text.strip()) for r in results] == [(False, "hello"), (False, "ok"), (False, "traced")]

    # Sampling ratio 0: only what the client sampled is traced, so every span here continues
    # the client's trace. The pods export in batches; wait for the three calls' spans.
    def three_calls() -> list[dict] | None:
        spans = received(ns)
        servers = [s for s in spans if s["kind"] == SERVER and s["attrs"].get("mcp.method.name") == "tools/call"]
        clients = [s for s in spans if s["kind"] == CLIENT]
        return spans if len(servers) >= 3 and len(clients) >= 2 else None

    spans = eventually("the collector in the cluster to receive the three calls' spans", three_calls, 120, 1)
    by_tool = {s["attrs"]["gen_ai.tool.name"]: s for s in spans
               if s["kind"] == SERVER and s["attrs"].get("mcp.method.name") == "tools/call"}
    assert set(by_tool) == {"hello", "health", "notes_echo"}, by_tool.keys()
    for tool, server in by_tool.items():
        assert server["parentSpanId"] == CLIENT_SPAN, (tool, server)
        assert server["service"] == "traced", server
        assert server["name"] == f"tools/call {tool}"
    children = {s["parentSpanId"]: s for s in spans if s["kind"] == CLIENT}
    http_span = children[by_tool["health"]["spanId"]]
    assert http_span["name"] == "GET" and http_span["attrs"]["url.full"] == f"http://notes.{ns.name}.svc:8080", http_span
    upstream_span = children[by_tool["notes_echo"]["spanId"]]
    assert upstream_span["name"] == "tools/call echo", upstream_span
    # The pods' exports all reached the collector.
    for pod in ns.pods("traced"):
        logs = kubectl("logs", "-n", ns.name, pod["metadata"]["name"], "-c", "server", check=False)
        assert "exporting spans failed" not in logs, logs[-2000:]
