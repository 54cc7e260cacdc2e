"""ServiceMonitor selection against the real prometheus-operator (built from its Go module by
scripts/prometheus-operator.sh). Run by scripts/chart-it.sh on its control plane, once the
chart is installed as docs/observability.md tells kube-prometheus-stack users
(`server.serviceMonitorLabels.release=$KPS_RELEASE`, the operator's own ServiceMonitor and
the PrometheusRule labelled the same), the Quiver operator runs with the chart's arguments
and the prometheus-operator watches the cluster.

Two Prometheus objects: one as kube-prometheus-stack creates it (ServiceMonitors and rules
labelled `release: <release>`, from every namespace) and a team's own one selecting
`team: payments`. The prometheus-operator writes the configuration it generates for each
into the Secret `prometheus-<name>` (gzipped); the tests read it back and check which
ServiceMonitors it took, and run each job's relabelling over the targets Prometheus's
Kubernetes discovery would find (built from the real Service, Endpoints and Pods), so a job
that selects nothing, or the wrong port, fails here."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RELEASE = os.environ.get("KPS_RELEASE", "kube-prometheus-stack")
STACK = ("monitoring", f"{RELEASE}-prometheus")
TEAM = ("payments", "payments")
CHART_NS = os.environ.get("QUIVER_CHART_NAMESPACE", "quiver-system")
# Whether the chart was installed with `server.serviceMonitor=true` (as the page tells
# kube-prometheus-stack users): then every McpServer has a ServiceMonitor unless it opts out.
DEFAULT_MONITOR = os.environ.get("QUIVER_DEFAULT_SERVICE_MONITOR") == "true"

TOOLS = {"tools": [{"name": "add", "handler": {"builtin": "add"}}]}
# (namespace, name, spec.monitoring) of the McpServers under test.
SERVERS = [
    # Only the chart's label: the stack's Prometheus takes it, the team's does not.
    ("shop", "catalog", {"serviceMonitor": True}),
    # Its own team label, plus the chart's: both take it.
    ("payments", "ledger", {"serviceMonitor": True, "serviceMonitorLabels": {"team": "payments"}}),
    # Its own `release` overrides the chart's: neither takes it.
    ("shop", "legacy", {"serviceMonitor": True, "serviceMonitorLabels": {"release": "another-stack"}}),
]


def kubectl(*args: str, stdin: str | None = None) -> str:
    return subprocess.run(["kubectl", *args], input=stdin, check=True, capture_output=True, text=True).stdout


def get(kind: str, ns: str, name: str) -> dict:
    return json.loads(kubectl("get", kind, name, "-n", ns, "-o", "json"))


def wait_until(what: str, predicate, timeout: float = 90.0):
    """Polls `predicate` until it returns a truthy value; fails naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (subprocess.CalledProcessError, KeyError, ValueError) as e:
            last = e
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout}s (last error: {last})")


def prometheus(ns: str, name: str, selector: dict) -> dict:
    """A Prometheus as kube-prometheus-stack's chart writes one: ServiceMonitors and rules
    chosen by label, from every namespace."""
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "serviceMonitorSelector": {"matchLabels": selector},
            "serviceMonitorNamespaceSelector": {},
            "podMonitorSelector": {"matchLabels": selector},
            "podMonitorNamespaceSelector": {},
            "ruleSelector": {"matchLabels": selector},
            "ruleNamespaceSelector": {},
            "replicas": 1,
        },
    }


@pytest.fixture(scope="module")
def cluster():
    """The Prometheus objects and the McpServers; every ServiceMonitor created."""
    docs = []
    for ns in sorted({STACK[0], TEAM[0], *(s[0] for s in SERVERS)}):
        docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    docs.append(prometheus(*STACK, {"release": RELEASE}))
    docs.append(prometheus(*TEAM, {"team": "payments"}))
    for ns, name, monitoring in SERVERS:
        docs.append({"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": name, "namespace": ns},
                     "spec": {**TOOLS, "monitoring": monitoring}})
    kubectl("apply", "-f", "-", stdin="\n---\n".join(json.dumps(d) for d in docs))
    for ns, name, _ in SERVERS:
        wait_until(f"ServiceMonitor {ns}/{name}", lambda ns=ns, name=name: get("servicemonitor", ns, name))
    return None


def generated_config(ns: str, name: str) -> dict:
    secret = get("secret", ns, f"prometheus-{name}")
    return yaml.safe_load(gzip.decompress(base64.b64decode(secret["data"]["prometheus.yaml.gz"])))


def monitor_jobs(config: dict) -> dict[str, dict]:
    """The scrape jobs generated from ServiceMonitors, by `namespace/name`."""
    jobs = {}
    for job in config.get("scrape_configs") or []:
        kind, _, rest = job["job_name"].partition("/")
        if kind == "serviceMonitor":
            ns, name, _endpoint = rest.split("/")
            jobs[f"{ns}/{name}"] = job
    return jobs


def wait_for_jobs(prom: tuple[str, str], want: set[str], absent: set[str]) -> dict[str, dict]:
    """The generated jobs once they include `want` and none of `absent` (the
    prometheus-operator regenerates the config as ServiceMonitors come and go)."""
    def ready():
        jobs = monitor_jobs(generated_config(*prom))
        return jobs if want <= set(jobs) and not absent & set(jobs) else None

    try:
        return wait_until(f"Prometheus {prom[0]}/{prom[1]} scraping {sorted(want)} and not {sorted(absent)}", ready)
    except AssertionError:
        got = sorted(monitor_jobs(generated_config(*prom)))
        raise AssertionError(f"Prometheus {prom[0]}/{prom[1]}: ServiceMonitor jobs {got}, want {sorted(want)} and not {sorted(absent)}") from None


def test_the_chart_label_puts_every_mcp_server_in_the_stack_prometheus(cluster):
    for ns, name, monitoring in SERVERS:
        labels = get("servicemonitor", ns, name)["metadata"]["labels"]
        want = {"release": RELEASE, **monitoring.get("serviceMonitorLabels", {})}
        assert {k: labels.get(k) for k in want} == want, f"{ns}/{name}: {labels}"
    want = {f"{CHART_NS}/quiver"} | {
        f"{m['metadata']['namespace']}/{m['metadata']['name']}"
        for m in json.loads(kubectl("get", "mcpservers", "-A", "-o", "json"))["items"]
        if stack_selects(m["spec"].get("monitoring") or {}) and config_valid(m)
    }
    assert {"shop/catalog", "payments/ledger"} <= want and "shop/legacy" not in want, sorted(want)
    jobs = wait_for_jobs(STACK, want, {"shop/legacy"})
    assert set(jobs) == want, sorted(jobs)


def config_valid(mcp: dict) -> bool:
    """Whether the operator built the McpServer's objects (an invalid spec gets none)."""
    return any(c["type"] == "ConfigValid" and c["status"] == "True" for c in (mcp.get("status") or {}).get("conditions", []))


def stack_selects(monitoring: dict) -> bool:
    """Whether an McpServer's ServiceMonitor exists and carries the stack's `release` label:
    it has one when it asks (or by default, DEFAULT_MONITOR), and the chart's label applies
    unless its own `release` overrides it."""
    has_one = monitoring.get("serviceMonitor", DEFAULT_MONITOR)
    return bool(has_one) and monitoring.get("serviceMonitorLabels", {}).get("release", RELEASE) == RELEASE


def test_an_mcp_servers_own_labels_put_it_in_another_prometheus(cluster):
    jobs = wait_for_jobs(TEAM, {"payments/ledger"}, {"shop/catalog", "shop/legacy"})
    assert set(jobs) == {"payments/ledger"}, sorted(jobs)


def test_the_stack_prometheus_loads_the_charts_alerts(cluster):
    """The chart's PrometheusRule, labelled like its ServiceMonitors, reaches the rule files
    the prometheus-operator generates for the stack's Prometheus."""
    ns, name = STACK
    ours = {r["alert"] for g in yaml.safe_load((ROOT / "deploy/prometheus/quiver-rules.yaml").read_text())["groups"]
            for r in g["rules"] if "alert" in r}

    def loaded():
        cm = get("configmap", ns, f"prometheus-{name}-rulefiles-0")
        return {r["alert"] for body in cm["data"].values() for g in yaml.safe_load(body)["groups"] for r in g["rules"] if "alert" in r}

    assert wait_until("the chart's alerts in the rule files", lambda: ours <= loaded() and loaded()) >= ours


# --- What Prometheus would scrape: its Kubernetes discovery (role endpoints) and relabelling.

def sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def discovered_targets(ns: str, service: str) -> list[dict[str, str]]:
    """The targets Prometheus's `role: endpoints` discovery makes of one Service: a label set
    per address and port of its Endpoints, with the Service's and the Pod's meta labels."""
    svc = get("service", ns, service)
    eps = get("endpoints", ns, service)
    common = {"__meta_kubernetes_namespace": ns, "__meta_kubernetes_endpoints_name": service,
              "__meta_kubernetes_service_name": service}
    for k, v in (svc["metadata"].get("labels") or {}).items():
        common[f"__meta_kubernetes_service_label_{sanitize(k)}"] = v
        common[f"__meta_kubernetes_service_labelpresent_{sanitize(k)}"] = "true"
    targets = []
    for subset in eps.get("subsets") or []:
        addresses = [(a, "true") for a in subset.get("addresses") or []] + [(a, "false") for a in subset.get("notReadyAddresses") or []]
        for addr, ready in addresses:
            for port in subset.get("ports") or []:
                t = dict(common)
                t["__address__"] = f"{addr['ip']}:{port['port']}"
                t["__meta_kubernetes_endpoint_port_name"] = port.get("name", "")
                t["__meta_kubernetes_endpoint_port_protocol"] = port.get("protocol", "TCP")
                t["__meta_kubernetes_endpoint_ready"] = ready
                ref = addr.get("targetRef") or {}
                if ref:
                    t["__meta_kubernetes_endpoint_address_target_kind"] = ref["kind"]
                    t["__meta_kubernetes_endpoint_address_target_name"] = ref["name"]
                if ref.get("kind") == "Pod":
                    pod = get("pod", ns, ref["name"])
                    t["__meta_kubernetes_pod_name"] = ref["name"]
                    t["__meta_kubernetes_pod_phase"] = pod["status"].get("phase", "")
                    for k, v in (pod["metadata"].get("labels") or {}).items():
                        t[f"__meta_kubernetes_pod_label_{sanitize(k)}"] = v
                    for c in pod["spec"]["containers"]:
                        for cp in c.get("ports") or []:
                            if cp["containerPort"] == port["port"]:
                                t["__meta_kubernetes_pod_container_name"] = c["name"]
                                t["__meta_kubernetes_pod_container_port_name"] = cp.get("name", "")
                targets.append(t)
    return targets


def go_replacement(template: str) -> str:
    """A Go regexp replacement template (`$1`, `${1}`, `${name}`) as Python's."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: f"\\g<{m.group(1) or m.group(2)}>", template)


def relabel(labels: dict[str, str], rules: list[dict], shard: str = "0") -> dict[str, str] | None:
    """Prometheus's relabelling of one target (the actions the prometheus-operator emits);
    None when it is dropped. An action not known here fails the test rather than pass it."""
    labels = dict(labels)
    for r in rules:
        action = r.get("action", "replace").lower()
        regex = re.compile(f"^(?:{r.get('regex', '(.*)').replace('$(SHARD)', shard)})$")
        value = r.get("separator", ";").join(labels.get(s, "") for s in r.get("source_labels", []))
        if action == "keep":
            if not regex.match(value):
                return None
        elif action == "drop":
            if regex.match(value):
                return None
        elif action == "replace":
            m = regex.match(value)
            if m:
                out = m.expand(go_replacement(str(r.get("replacement", "$1"))))
                if out:
                    labels[r["target_label"]] = out
                else:
                    labels.pop(r["target_label"], None)
        elif action == "hashmod":
            digest = hashlib.md5(value.encode()).digest()
            labels[r["target_label"]] = str(int.from_bytes(digest[8:], "big") % int(r["modulus"]))
        else:
            raise AssertionError(f"relabel action {action!r} is not simulated here: extend relabel()")
    return labels


def scraped(job: dict, ns: str, service: str) -> list[dict[str, str]]:
    """The targets of `service` that `job` keeps, relabelled, as Prometheus would scrape them."""
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] == "endpoints", sd
    assert sd["namespaces"]["names"] == [ns], "the job discovers in the ServiceMonitor's namespace"
    out = []
    for t in discovered_targets(ns, service):
        t = {**t, "job": job["job_name"], "__metrics_path__": job.get("metrics_path", "/metrics")}
        kept = relabel(t, job.get("relabel_configs") or [])
        if kept is not None:
            out.append(kept)
    return out


def admin_endpoints(ns: str, service: str) -> set[str]:
    """podIP:port of each ready pod behind `service` on its port named `admin`."""
    svc = get("service", ns, service)
    (admin,) = [p for p in svc["spec"]["ports"] if p.get("name") == "admin"]
    eps = get("endpoints", ns, service)
    return {f"{a['ip']}:{p['port']}" for s in eps.get("subsets") or [] for a in s.get("addresses") or []
            for p in s.get("ports") or [] if p.get("name") == admin["name"]}


@pytest.mark.parametrize(("ns", "name", "service"), [("shop", "catalog", "catalog"), ("payments", "ledger", "ledger"),
                                                     (CHART_NS, "quiver", "quiver-metrics")])
def test_each_job_scrapes_the_admin_port_of_the_servers_pods(cluster, ns, name, service):
    """The job's relabelling keeps exactly the Service's `admin` port of each ready pod, at
    /metrics, labelled with the namespace, service and pod the dashboards select on."""
    jobs = wait_for_jobs(STACK, {f"{ns}/{name}"}, set())
    job = jobs[f"{ns}/{name}"]
    assert job["metrics_path"] == "/metrics"
    want = wait_until(f"ready endpoints of {ns}/{service}", lambda: admin_endpoints(ns, service))
    got = wait_until(f"{ns}/{name}'s job keeping every ready pod", lambda: (t := scraped(job, ns, service)) and
                     {x["__address__"] for x in t} >= want and t)
    assert {t["__address__"] for t in got} == want, "the admin port of each pod, no other port"
    for t in got:
        assert t["namespace"] == ns and t["service"] == service and t["job"] == service and t["endpoint"] == "admin"
        pod = get("pod", ns, t["pod"])
        ports = [p for c in pod["spec"]["containers"] for p in c.get("ports") or []]
        assert any(p.get("name") == "admin" and f"{pod['status']['podIP']}:{p['containerPort']}" == t["__address__"]
                   for p in ports), "the pod's own admin port"
