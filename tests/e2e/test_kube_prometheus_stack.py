"""The Dispatch dashboard fills on a Prometheus set up as kube-prometheus-stack sets it up.

The real prometheus-operator runs in the cluster (kube-prometheus-stack/stack.yaml: the
chart's defaults for release `kube-prometheus-stack`, so its Prometheus selects
ServiceMonitors and rules by `release: kube-prometheus-stack` in every namespace) and starts
a Prometheus pod; every image is built here (kube-prometheus-stack/images.sh, loaded by
scripts/e2e.sh). Quiver's release is upgraded with exactly the `--set` flags of
docs/observability.md ("Installing the dashboards with kube-prometheus-stack", the block
marked `tested: kube-prometheus-stack`), deploy/samples/calculator.yaml is applied as it is,
and a bounded number of tools/call go through a port-forward. Then that Prometheus must
scrape both server pods and the operator, hold Quiver's alerts from the chart's
PrometheusRule, and answer every query of the Dispatch dashboard, as the ConfigMap for
Grafana's sidecar holds it (tests/observability/check_queries.py), with data on the panels
plain calls fill. Afterwards the release is rolled back and the stack removed, so the other
tests run as before.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Namespace, eventually, kget, kubectl
from mcp import Client
from test_faults import add_works
from test_pinning import PULLED, api_document

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "tests" / "observability"))
import check_queries  # noqa: E402

STACK = Path(__file__).parent / "kube-prometheus-stack" / "stack.yaml"
MONITORING = Namespace("monitoring")
PROMETHEUS = "kube-prometheus-stack-prometheus"
# Grafana's $__rate_interval for the ServiceMonitors' 15 s scrape interval (four intervals).
RATE_WINDOW = "1m"
# Panels of the Dispatch dashboard that successful tools/call on a plain McpServer fill.
# The others (errors, reloads, upstreams, limits, policies, audit, tasks) stay empty until
# what they show happens; their queries must still be valid.
FILLED_BY_CALLS = [
    "$namespace",
    "$mcpserver",
    "$tool",
    "Dispatch latency (p50 / p90 / p99) [A]",
    "Dispatch latency (p50 / p90 / p99) [B]",
    "Dispatch latency (p50 / p90 / p99) [C]",
    "Dispatch p99 by McpServer [A]",
    "Dispatch p99 by tool [A]",
    "Dispatch latency heatmap [A]",
    "Requests per second by method [A]",
    "In-flight requests [A]",
    "Config generation and tools [A]",
    "Config generation and tools [B]",
    "CPU per pod [A]",
    "Memory per pod [A]",
    "Allocator and version [A]",
]


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run the e2e suite through scripts/e2e.sh, which builds and loads the images")
    return value


def documented_values() -> list[str]:
    """The `--set` flags docs/observability.md gives kube-prometheus-stack users, without
    imageRegistry: the page says to leave it out for the published chart (whose default it
    is) and for images already on the nodes (`kind load`)."""
    block = subprocess.run(
        ["python3", str(ROOT / "scripts" / "doc-block.py"), str(ROOT / "docs" / "observability.md"), "kube-prometheus-stack"],
        capture_output=True, text=True, check=True,
    ).stdout
    words = shlex.split(block.replace("\\\n", " "))
    assert words[:4] == ["helm", "install", "quiver", "charts/quiver"], block
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    assert any(s.startswith("imageRegistry=") for s in sets), block
    return [a for s in sets if not s.startswith("imageRegistry=") for a in ("--set", s)]


def helm(*args: str) -> str:
    proc = subprocess.run(["helm", *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def chart() -> list[str]:
    """The chart the release was installed from: the published one (scripts/e2e.sh) or the
    clone's (QUIVER_E2E_INSTALL=local)."""
    registry = os.environ.get("QUIVER_RELEASE_REGISTRY")
    if registry:
        return [f"oci://{registry}/charts/quiver", "--version", env("QUIVER_RELEASE_VERSION")]
    return [str(ROOT / "charts" / "quiver")]


def established(crd: str) -> bool:
    conditions = kget("crd", crd).get("status", {}).get("conditions", [])
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def stack_yaml() -> str:
    prometheus = env("QUIVER_E2E_PROMETHEUS_IMAGE")
    text = STACK.read_text()
    for key, value in {
        "PROMETHEUS_OPERATOR_IMAGE": env("QUIVER_E2E_PROMETHEUS_OPERATOR_IMAGE"),
        "PROMETHEUS_CONFIG_RELOADER_IMAGE": env("QUIVER_E2E_PROMETHEUS_CONFIG_RELOADER_IMAGE"),
        "PROMETHEUS_IMAGE": prometheus,
        "PROMETHEUS_VERSION": prometheus.rsplit(":", 1)[1],
    }.items():
        text = text.replace("${" + key + "}", value)
    assert "${" not in text, "a placeholder of stack.yaml has no value"
    return text


@pytest.fixture(scope="module")
def kube_prometheus_stack() -> Iterator[None]:
    """The monitoring.coreos.com CRDs, the operator and its Prometheus pod Ready, and the
    Quiver release upgraded with the documented values; all undone afterwards."""
    crds = env("QUIVER_E2E_PROMETHEUS_OPERATOR_CRDS")
    revision = json.loads(helm("history", "quiver", "-n", "quiver-system", "-o", "json"))[-1]["revision"]
    stack = stack_yaml()
    try:
        # Server-side: the CRDs are too large for a client-side apply's annotation.
        applied = kubectl("apply", "--server-side", "-f", crds, "-o", "name").split()
        assert "customresourcedefinition.apiextensions.k8s.io/servicemonitors.monitoring.coreos.com" in applied, applied
        for crd in (name.split("/", 1)[1] for name in applied):
            eventually(f"CRD {crd} Established", lambda crd=crd: established(crd), 60)
        kubectl("apply", "-f", "-", stdin=stack)
        MONITORING.k("rollout", "status", "deploy/kube-prometheus-stack-operator", "--timeout=180s")
        eventually("the Prometheus pod the operator starts", lambda: MONITORING.k(
            "get", "statefulset", f"prometheus-{PROMETHEUS}", check=False), 120)
        MONITORING.k("rollout", "status", f"statefulset/prometheus-{PROMETHEUS}", "--timeout=300s")
        # The documented values, and one alert told to fire at once (`prometheusRules.for`)
        # rather than after its 5 minutes, so that its test waits for a scrape, not a clock.
        helm("upgrade", "quiver", *chart(), "-n", "quiver-system", "--reset-then-reuse-values",
             *documented_values(), "--set", "prometheusRules.for.QuiverToolDefinitionsAwaitingApproval=0s",
             "--wait", "--timeout", "5m")
        yield
    finally:
        try:
            helm("rollback", "quiver", str(revision), "-n", "quiver-system", "--wait", "--timeout", "5m")
        finally:
            kubectl("delete", "--ignore-not-found", "--timeout=120s", "-f", "-", stdin=stack, check=False)
            kubectl("delete", "--ignore-not-found", "--timeout=120s", "-f", crds, check=False)


@pytest.fixture
def monitoring_dump(request) -> Iterator[None]:
    """On failure, what the monitoring namespace holds: pods, events, the operator's and
    Prometheus's logs."""
    yield
    if getattr(request.node, "failed_call", False):
        print(MONITORING.dump())


def query(prom: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{prom}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)["data"]["result"]


def alerts_loaded(prom: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{prom}/api/v1/rules?type=alert", timeout=10) as r:
        groups = json.load(r)["data"]["groups"]
    return {rule["name"] for g in groups for rule in g["rules"]}


def test_dispatch_dashboard_fills_on_kube_prometheus_stack(kube_prometheus_stack, monitoring_dump, ns: Namespace):  # noqa: ARG001
    ns.k("apply", "-f", str(ROOT / "deploy" / "samples" / "calculator.yaml"))
    ns.wait_condition("calculator", "Ready", "True", 300)
    sm = ns.get("servicemonitor", "calculator")
    assert sm["metadata"]["labels"].get("release") == "kube-prometheus-stack", sm["metadata"]
    # What the release put where kube-prometheus-stack looks: the PrometheusRule, and the
    # dashboard ConfigMap its Grafana's sidecar loads (label grafana_dashboard: "1").
    rules = [r for pr in kget("prometheusrules", "-n", "quiver-system")["items"]
             if pr["metadata"]["labels"].get("release") == "kube-prometheus-stack"
             for g in pr["spec"]["groups"] for r in g["rules"]]
    alerts = {r["alert"] for r in rules if "alert" in r}
    assert len(alerts) >= 10, alerts
    dashboards = [json.loads(text) for cm in MONITORING.get("configmaps", "-l", "grafana_dashboard=1")["items"]
                  for key, text in cm.get("data", {}).items() if key == "quiver-dispatch.json"]
    assert len(dashboards) == 1, "no Dispatch dashboard ConfigMap in namespace monitoring"

    with MONITORING.port_forward(f"svc/{PROMETHEUS}", 9090) as prom:
        # Both server pods and the operator scraped through the ServiceMonitors the documented
        # values label: the server ones by the operator, the operator's by the chart.
        servers = f'up{{namespace="{ns.name}", service="calculator"}} == 1'
        eventually("both calculator pods up in Prometheus", lambda: len(query(prom, servers)) == 2, 240, 1)
        eventually("the Quiver operator up in Prometheus",
                   lambda: query(prom, 'up{namespace="quiver-system"} == 1'), 240, 1)
        eventually("Quiver's alerts loaded from the chart's PrometheusRule",
                   lambda: alerts <= alerts_loaded(prom), 180, 1)

        # Batches of 20 calls, each followed by a scrape of both pods, until Prometheus has
        # seen the dispatch counters grow within the rate window (two scrapes): at most 10.
        growing = f'sum(rate(quiver_dispatch_duration_seconds_count{{namespace="{ns.name}"}}[{RATE_WINDOW}])) > 0'
        last_scrape = f'min(timestamp(up{{namespace="{ns.name}", service="calculator"}}))'
        calls = 0
        with ns.port_forward("svc/calculator", 8080) as port:
            for _ in range(10):
                for _ in range(20):
                    assert add_works(port), "tools/call add through the port-forward failed"
                calls += 20
                sent = time.time()
                eventually("a scrape of both calculator pods after the calls",
                           lambda: float(query(prom, last_scrape)[0]["value"][1]) > sent, 60, 0.5)
                if query(prom, growing):
                    break
        assert query(prom, growing), f"{calls} tools/call, and Prometheus saw no dispatch within {RATE_WINDOW}"

        failures: list[str] = []
        results = check_queries.check_dashboard(f"http://127.0.0.1:{prom}", dashboards[0], RATE_WINDOW, failures,
                                                require_data=False)
    assert not failures, "invalid queries:\n" + "\n".join(failures)
    assert set(FILLED_BY_CALLS) <= set(results), sorted(set(FILLED_BY_CALLS) - set(results))
    empty = [what for what in FILLED_BY_CALLS
             if not results[what] or (not what.startswith("$") and not check_queries.has_data(results[what]))]
    assert not empty, f"after {calls} tools/call, panels without data: {empty}"
    tools = {s["tool"] for s in results["$tool"]}
    assert "add" in tools, tools
    print({"scenario": "kube-prometheus-stack dashboard", "tools_calls": calls,
           "queries": len(results), "filled": len(FILLED_BY_CALLS)})


def test_a_definition_awaiting_approval_fires_its_alert(kube_prometheus_stack, monitoring_dump, ns: Namespace):  # noqa: ARG001
    """`pin: warn` on an OpenAPI document that another team edits: the edited operation stays
    served, and QuiverToolDefinitionsAwaitingApproval fires on this Prometheus, from the
    chart's rule, for the McpServer's namespace and the source."""
    ns.apply(api_document(pulled=False))
    ns.apply({
        "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "watched"},
        "spec": {"replicas": 1, "openapi": [{"name": "items", "configMap": {"name": "items-api", "key": "openapi.json"},
                                             "server": "https://items.example", "pin": "warn"}]},
    })
    ns.wait_condition("watched", "Ready", "True", 300)
    ns.wait_condition("watched", "ToolDefinitionsApproved", "True", 120)
    firing = (f'ALERTS{{alertname="QuiverToolDefinitionsAwaitingApproval", alertstate="firing", '
              f'namespace="{ns.name}", service="watched", upstream="openapi.items"}}')
    with MONITORING.port_forward(f"svc/{PROMETHEUS}", 9090) as prom:
        eventually("the pod scraped", lambda: query(prom, f'up{{namespace="{ns.name}", service="watched"}} == 1'), 240, 1)
        assert not query(prom, firing), "the alert fired before anything changed"
        ns.apply(api_document(pulled=True))
        pending = ns.wait_condition("watched", "ToolDefinitionsApproved", "False", 120)
        assert "openapi.items/listItems (changed)" in pending["message"], pending
        alert = eventually("QuiverToolDefinitionsAwaitingApproval firing", lambda: query(prom, firing), 240, 2)
    assert alert[0]["metric"]["severity"] == "warning", alert
    with ns.port_forward("svc/watched", 8080) as port:
        async def described() -> str:
            async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as c:
                return {t.name: t.description for t in (await c.list_tools(cache_mode="bypass")).tools}["listItems"]
        assert PULLED in asyncio.run(described()), "warn serves the edited operation"
