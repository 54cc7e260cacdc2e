"""The audit recipe of docs/governance.md, for real: deploy/otelcol/audit-pipeline.yaml in a
real OpenTelemetry Collector (deploy/otelcol/builder.yaml, built by scripts/otelcol.sh
build-agent) reading container log files as a node agent does.

Run by scripts/chart-it.sh on its control plane while the Quiver operator runs: an McpServer
with `spec.audit` gets its pod (kwok runs pods without containers), and the real quiver-server
binary plays that pod's container with the pod's own audit and log arguments, tracing every
request. Its stdout and stderr are written, as the kubelet writes them (CRI format), to
<dir>/<namespace>_<pod>_<uid>/server/0.log; another pod's container, also called `server`,
writes beside it. The agent watches the pods on the node through the API (k8s_attributes)
and sends to a second collector (the trace backend's build) that writes audit records, log
lines and the server's spans to three files. The official MCP Python client makes calls that
are allowed and refused."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from mcp import Client
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("QUIVER_SERVER_BIN", ROOT / "target" / "debug" / "quiver-server"))
NS, NAME = "audit-recipe", "audited"
TOOLS = {
    "server": {"name": NAME},
    "policies": [{"name": "no-prod", "expression": "args.name != 'prod'", "tools": ["greet"]}],
    "tools": [
        {"name": "greet", "input": {"name": "string"}, "handler": {"template": "Hello {{name}}!"}},
        {"name": "add", "handler": {"builtin": "add"}},
    ],
}
ALLOWED, REFUSED = "a0d17000000000000000000000000001", "a0d17000000000000000000000000002"


def kubectl(*args: str, stdin: str | None = None) -> str:
    return subprocess.run(["kubectl", *args], input=stdin, check=True, capture_output=True, text=True).stdout


def wait_until(what: str, predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (subprocess.CalledProcessError, KeyError, ValueError, IndexError, OSError) as e:
            last = e
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout}s (last error: {last})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def running_pod(selector: str) -> dict:
    def found():
        pods = json.loads(kubectl("get", "pods", "-n", NS, "-l", selector, "-o", "json"))["items"]
        return next((p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")), None)

    return wait_until(f"a running pod {selector}", found, timeout=120)


class Kubelet:
    """Writes a container's output as the kubelet does: one CRI line per line of output,
    `<RFC 3339 time, nanoseconds> <stream> F <line>`, both streams into one file."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("a", encoding="utf-8")
        self.lock = threading.Lock()
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}

    def write(self, stream: str, line: str) -> None:
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
        with self.lock:
            self.file.write(f"{now} {stream} F {line}\n")
            self.file.flush()
            self.lines[stream].append(line)

    def follow(self, stream: str, pipe) -> threading.Thread:
        def run():
            for raw in pipe:
                self.write(stream, raw.decode("utf-8", "replace").rstrip("\n"))

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t


def start(args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)


def stop(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=5)


def otelcol(which: str) -> str:
    out = subprocess.run([str(ROOT / "scripts" / "otelcol.sh"), which], check=True, capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


def value(v: dict):
    """An OTLP JSON AnyValue as Python."""
    (kind, x), = v.items() if v else (("stringValue", None),)
    if kind == "kvlistValue":
        return {kv["key"]: value(kv["value"]) for kv in x.get("values", [])}
    if kind == "arrayValue":
        return [value(e) for e in x.get("values", [])]
    if kind == "intValue":
        return int(x)
    return x


def records(path: Path) -> list[dict]:
    """Every log record the file exporter wrote, flattened: resource and record attributes,
    body, ids, severity and event name."""
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        for rl in json.loads(line).get("resourceLogs", []):
            resource = {a["key"]: value(a["value"]) for a in rl.get("resource", {}).get("attributes", [])}
            for sl in rl.get("scopeLogs", []):
                for r in sl.get("logRecords", []):
                    out.append({"resource": resource, "attrs": {a["key"]: value(a["value"]) for a in r.get("attributes", [])},
                                "body": value(r.get("body", {})), "traceId": r.get("traceId", ""), "spanId": r.get("spanId", ""),
                                "severity": r.get("severityText", ""), "eventName": r.get("eventName", "")})
    return out


def span_ids(path: Path) -> set[tuple[str, str]]:
    if not path.exists():
        return set()
    return {(s["traceId"], s["spanId"]) for line in path.read_text().splitlines()
            for rs in json.loads(line).get("resourceSpans", []) for ss in rs.get("scopeSpans", []) for s in ss.get("spans", [])}


@pytest.fixture(scope="module")
def pipeline():
    assert BIN.exists(), f"build the server first: {BIN}"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-audit-recipe-"))
    procs: list[subprocess.Popen] = []
    try:
        yield from run_pipeline(tmp, procs)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                stop(p)
        for log in sorted(tmp.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text()[-3000:]}")
        shutil.rmtree(tmp, ignore_errors=True)


def run_pipeline(tmp: Path, procs: list[subprocess.Popen]):
    # The McpServer (the operator makes its pod) and another workload's container called `server`.
    kubectl("apply", "-f", "-", stdin="\n---\n".join(json.dumps(d) for d in [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": NAME, "namespace": NS},
         "spec": {**TOOLS, "audit": {}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": NS, "labels": {"app": "web"}},
         "spec": {"containers": [{"name": "server", "image": "web:1"}]}},
    ]))
    pod = running_pod(f"app.kubernetes.io/instance={NAME}")
    web = running_pod("app=web")
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "server"]
    # What the operator gives the pod for its audit trail and logs.
    pod_args = [a for a in container["args"] if a.startswith(("--audit", "--log-format"))]
    assert "--audit=stdout" in pod_args and "--log-format=json" in pod_args, container["args"]
    pod_env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    assert pod_env.get("QUIVER_INSTANCE") == f"{NS}/{NAME}"

    # The backend: audit records, log lines and spans, each to its own file.
    ports = {k: free_port() for k in ("audit", "logs", "traces")}
    backend = {
        "receivers": {f"otlp/{k}": {"protocols": {"http": {"endpoint": f"127.0.0.1:{p}"}}} for k, p in ports.items()},
        "exporters": {f"file/{k}": {"path": str(tmp / f"{k}.jsonl"), "flush_interval": "100ms"} for k in ports},
        "service": {"telemetry": {"metrics": {"level": "none"}}, "pipelines": {
            "logs/audit": {"receivers": ["otlp/audit"], "exporters": ["file/audit"]},
            "logs/logs": {"receivers": ["otlp/logs"], "exporters": ["file/logs"]},
            "traces": {"receivers": ["otlp/traces"], "exporters": ["file/traces"]}}},
    }
    (tmp / "backend.yaml").write_text(yaml.safe_dump(backend))
    procs.append(start([otelcol("build"), "--config", f"file:{tmp / 'backend.yaml'}"], tmp / "backend.log"))
    for p in ports.values():
        wait_until(f"the backend on port {p}", lambda p=p: socket.create_connection(("127.0.0.1", p), timeout=1).close() or True)

    # The agent with the committed config; only paths, endpoints and credentials from the environment.
    pods_dir = tmp / "pods"
    kubelet = Kubelet(pods_dir / f"{NS}_{pod['metadata']['name']}_{pod['metadata']['uid']}" / "server" / "0.log")
    other = Kubelet(pods_dir / f"{NS}_web_{web['metadata']['uid']}" / "server" / "0.log")
    other.write("stdout", json.dumps({"time": "2026-11-29T10:00:00.000Z", "event": "tools/call", "tool": "not-quiver", "outcome": "ok"}))
    other.write("stderr", "GET / 200")
    (tmp / "telemetry.yaml").write_text("service: {telemetry: {metrics: {level: none}}}\n")
    env = {**os.environ, "QUIVER_POD_LOGS": str(pods_dir), "QUIVER_OTELCOL_STATE": str(tmp / "state"),
           "K8S_NODE_NAME": pod["spec"]["nodeName"], "K8S_AUTH_TYPE": "kubeConfig",
           "AUDIT_OTLP_ENDPOINT": f"http://127.0.0.1:{ports['audit']}", "LOGS_OTLP_ENDPOINT": f"http://127.0.0.1:{ports['logs']}"}
    procs.append(start([otelcol("build-agent"), "--config", f"file:{ROOT / 'deploy/otelcol/audit-pipeline.yaml'}",
                        "--config", f"file:{tmp / 'telemetry.yaml'}"], tmp / "agent.log", env))

    # The server, as the pod's container.
    (tmp / "tools.yaml").write_text(yaml.safe_dump(TOOLS))
    port, admin = free_port(), free_port()
    server = subprocess.Popen(
        [str(BIN), "--config", f"file:{tmp / 'tools.yaml'}", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
         *pod_args, "--otlp-endpoint", f"http://127.0.0.1:{ports['traces']}", "--trace-sample-ratio", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **pod_env})
    procs.append(server)
    followers = [kubelet.follow("stdout", server.stdout), kubelet.follow("stderr", server.stderr)]
    wait_until("the server ready", lambda: json.loads(urlopen(f"http://127.0.0.1:{admin}/status"))["ready"])
    calls = asyncio.run(call_tools(f"http://127.0.0.1:{port}/mcp"))
    wait_until(f"{calls} audit records on stdout", lambda: len(kubelet.lines["stdout"]) >= calls)
    stop(server)
    for t in followers:
        t.join(timeout=10)
    yield {"tmp": tmp, "pod": pod, "kubelet": kubelet, "calls": calls}


def urlopen(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def in_trace(trace_id: str):
    """Makes a sampled span of `trace_id` the client's current one: the SDK sends it in `_meta`."""
    sc = SpanContext(int(trace_id, 16), int("c0ffee0000000001", 16), is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.use_span(NonRecordingSpan(sc))


async def call_tools(url: str) -> int:
    """Allowed and refused calls; returns how many (one audit record each)."""
    async with Client(url, mode="legacy") as c:
        with in_trace(ALLOWED):
            assert not (await c.call_tool("greet", {"name": "dev"})).is_error
        with in_trace(REFUSED), pytest.raises(MCPError, match="no-prod"):
            await c.call_tool("greet", {"name": "prod"})
        # Traced by the server alone (no trace context from the client).
        assert not (await c.call_tool("add", {"a": 2, "b": 3})).is_error
        with pytest.raises(MCPError):
            await c.call_tool("no-such-tool", {})
    return 4


def test_every_audit_record_reaches_the_audit_destination_with_its_trace(pipeline):
    tmp, kubelet, pod = pipeline["tmp"], pipeline["kubelet"], pipeline["pod"]
    written = [json.loads(line) for line in kubelet.lines["stdout"]]
    assert len(written) == pipeline["calls"] and all(w["event"] == "tools/call" for w in written), written
    got = wait_until("every record in the audit destination", lambda: (r := records(tmp / "audit.jsonl")) and len(r) >= len(written) and r)
    assert len(got) == len(written), "each record once"
    by_request = {r["attrs"]["requestId"]: r for r in got}
    for w in written:
        r = by_request[w["requestId"]]
        assert r["body"] == json.dumps(w, separators=(",", ":")) or json.loads(r["body"]) == w, "the line itself stays the body"
        for field in ("event", "tool", "outcome", "session", "traceId", "spanId"):
            assert r["attrs"][field] == w[field], field
        assert r["attrs"]["mcpServer"] == {"namespace": NS, "name": NAME}
        assert r["attrs"]["log.iostream"] == "stdout"
        assert r["eventName"] == "tools/call"
        assert (r["traceId"], r["spanId"]) == (w["traceId"], w["spanId"]), "the record's trace on the log record"
        assert r["resource"]["k8s.namespace.name"] == NS
        assert r["resource"]["quiver.mcp_server.name"] == NAME
        assert r["resource"]["k8s.pod.name"] == pod["metadata"]["name"]
        assert r["resource"]["k8s.pod.uid"] == pod["metadata"]["uid"]
    outcomes = {r["attrs"]["traceId"]: r["attrs"] for r in got}
    assert outcomes[ALLOWED]["outcome"] == "ok"
    assert outcomes[REFUSED]["outcome"] == "forbidden" and "no-prod" in outcomes[REFUSED]["reason"]
    assert sorted(r["attrs"]["outcome"] for r in got) == sorted(w["outcome"] for w in written)
    # The ids lead to the server's own spans in the trace backend.
    spans = wait_until("the records' spans in the trace backend",
                       lambda: (s := span_ids(tmp / "traces.jsonl")) >= {(w["traceId"], w["spanId"]) for w in written} and s)
    assert {(r["traceId"], r["spanId"]) for r in got} <= spans


def test_log_lines_go_to_the_log_destination_and_nothing_crosses(pipeline):
    tmp, kubelet, pod = pipeline["tmp"], pipeline["kubelet"], pipeline["pod"]
    stderr = kubelet.lines["stderr"]
    assert stderr, "the server logged"
    logs = wait_until("every log line in the log destination", lambda: (r := records(tmp / "logs.jsonl")) and len(r) >= len(stderr) and r)
    assert sorted(r["body"] for r in logs) == sorted(stderr), "every stderr line, once, and nothing else"
    for r in logs:
        assert r["attrs"]["log.iostream"] == "stderr"
        assert "event" not in r["attrs"] and "mcpServer" not in r["attrs"], "no audit record among the logs"
        assert r["severity"] in {"TRACE", "DEBUG", "INFO", "WARN", "ERROR"}, r
        if "trace_id" in r["attrs"]:  # a line written under a sampled request's span
            assert (r["traceId"], r["spanId"]) == (r["attrs"]["trace_id"], r["attrs"]["span_id"])
        assert r["resource"]["quiver.mcp_server.name"] == NAME and r["resource"]["k8s.pod.name"] == pod["metadata"]["name"]
    audit = records(tmp / "audit.jsonl")
    assert all(r["attrs"]["log.iostream"] == "stdout" for r in audit), "no log line among the audit records"
    # The other workload's `server` container: read by the agent, kept by neither pipeline.
    assert not any(r["resource"].get("k8s.pod.name") == "web" for r in logs + audit)
    assert not any("not-quiver" in str(r["body"]) or r["body"] == "GET / 200" for r in logs + audit)


def test_the_documented_daemonset_is_accepted_by_the_api_server():
    """docs/governance.md's DaemonSet sketch, with the ConfigMap its command creates, passes
    the real API server's validation (a server-side dry run)."""
    doc = (ROOT / "docs" / "governance.md").read_text()
    (block,) = re.findall(r"<!-- tested: audit-agent -->\n```yaml\n(.*?)```", doc, re.S)
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "observability"}}))
    kubectl("create", "configmap", "quiver-audit-pipeline", "-n", "observability",
            f"--from-file=config.yaml={ROOT / 'deploy/otelcol/audit-pipeline.yaml'}", "--dry-run=server")
    out = kubectl("apply", "--dry-run=server", "-f", "-", stdin=block)
    assert "daemonset.apps/quiver-audit-agent created (server dry run)" in out, out
