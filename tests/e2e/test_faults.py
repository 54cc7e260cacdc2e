"""Faults under steady load on kind: a tools reload every 100 ms, a rolling update of three
replicas, SIGTERM of a pod, and 2,000 concurrent keep-alive connections. The load comes from
tests/e2e/loadgen.py through a NodePort that kind publishes on 127.0.0.1, so it reaches the
pods the way a Service's clients do (kube-proxy picks a ready endpoint per connection) and
follows endpoint changes. Every request is counted; each scenario requires zero failures.

Figures are printed, and appended as JSON lines to $QUIVER_FAULTS_REPORT when it is set
(docs/performance.md records one run).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Namespace, eventually, kubectl

LOADGEN = Path(__file__).with_name("loadgen.py")
NODE_PORT = 30080


def host_port() -> int:
    """The 127.0.0.1 port kind maps to the control-plane node's NODE_PORT."""
    cluster = os.environ.get("QUIVER_CLUSTER", "quiver-e2e")
    out = subprocess.run(
        ["docker", "port", f"{cluster}-control-plane", f"{NODE_PORT}/tcp"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout
    return int(out.strip().splitlines()[0].rsplit(":", 1)[1])


def report(scenario: str, figures: dict) -> None:
    line = json.dumps({"scenario": scenario, **figures})
    print(line)
    if path := os.environ.get("QUIVER_FAULTS_REPORT"):
        with open(path, "a") as f:
            f.write(line + "\n")


class Load:
    """loadgen.py in a process of its own (its own CPU time, no GIL shared with kubectl)."""

    def __init__(self, port: int, connections: int, interval: float, hold: bool = False) -> None:
        args = [sys.executable, str(LOADGEN), "--port", str(port), "--connections", str(connections),
                "--interval", str(interval), "--duration", "400"]
        self.proc = subprocess.Popen(args + (["--hold"] if hold else []), stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.started = json.loads(self.proc.stdout.readline() or "{}")

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=60)
        return json.loads(out.strip().splitlines()[-1])


def add_works(port: int) -> bool:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "add", "arguments": {"a": 1, "b": 2}}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=body, headers={
        "content-type": "application/json", "accept": "application/json, text/event-stream"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())["result"]["content"][0]["text"] == "3"
    except OSError:
        return False


def ready_count(ns: Namespace, name: str) -> int:
    return sum(
        1 for p in ns.pods(name)
        if p["metadata"].get("deletionTimestamp") is None
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    )


def tools(note: str) -> list[dict]:
    return [
        {"name": "add", "description": "Add two numbers", "handler": {"builtin": "add"}},
        {"name": "note", "description": note, "handler": {"template": note}},
    ]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Namespace, int]]:
    """An McpServer of 3 replicas behind a NodePort published on 127.0.0.1."""
    name = f"e2e-faults-{uuid.uuid4().hex[:5]}"
    kubectl("create", "namespace", name)
    ns = Namespace(name)
    ns.apply({"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "load"},
              "spec": {"replicas": 3, "tools": tools("v0")}})
    eventually("3 ready pods", lambda: ready_count(ns, "load") == 3, 300)
    selector = ns.get("svc", "load")["spec"]["selector"]
    ns.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "load-nodeport"},
              "spec": {"type": "NodePort", "selector": selector,
                       "ports": [{"name": "mcp", "port": 8080, "targetPort": 8080, "nodePort": NODE_PORT}]}})
    port = host_port()
    eventually("the NodePort answers on 127.0.0.1", lambda: add_works(port), 120)
    ok = False
    try:
        yield ns, port
        ok = True
    finally:
        if not ok:
            print(ns.dump())
        kubectl("delete", "namespace", name, "--wait=false", check=False)


@contextlib.contextmanager
def api_proxy() -> Iterator[str]:
    """`kubectl proxy` on a free 127.0.0.1 port: PATCHes without a kubectl process each."""
    proc = subprocess.Popen(["kubectl", "proxy", "--port=0", "--address=127.0.0.1"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        yield "http://" + line.strip().rsplit(" ", 1)[1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_reload_every_100ms_for_30s_fails_no_request(served):
    ns, port = served
    load = Load(port, connections=16, interval=0.05)
    edits = 0
    with api_proxy() as api:
        url = f"{api}/apis/quiver.dev/v1alpha1/namespaces/{ns.name}/mcpservers/load"
        start = next_at = time.monotonic()
        while time.monotonic() - start < 30:
            edits += 1
            patch = json.dumps({"spec": {"tools": tools(f"v{edits}")}}).encode()
            req = urllib.request.Request(url, data=patch, method="PATCH",
                                         headers={"content-type": "application/merge-patch+json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200
            # Paced, not waited on: the next edit goes out 100 ms after the previous one.
            next_at += 0.1
            time.sleep(max(0.0, next_at - time.monotonic()))
        elapsed = time.monotonic() - start
    figures = load.stop()

    def converged():
        m = ns.get("qmcp", "load")
        st = m.get("status", {})
        # The operator writes the ToolSet as JSON (one tool per line).
        rendered = json.loads(ns.get("cm", "load-tools")["data"]["tools.yaml"])
        notes = [t["handler"]["template"] for t in rendered["tools"] if t["name"] == "note"]
        return (st.get("observedGeneration") == m["metadata"]["generation"]
                and st.get("configLoadedReplicas") == 3 and notes == [f"v{edits}"])

    eventually("every pod serves the last edit", converged, 120)
    report("reload every 100 ms for 30 s, 3 replicas",
           {"edits": edits, "edit_period_ms": round(elapsed / edits * 1000, 1), **figures})
    assert figures["failed"] == 0, figures
    assert figures["ok"] == figures["requests"] > 1000, figures


def test_a_rolling_update_of_3_replicas_fails_no_request(served):
    ns, port = served
    before = {p["metadata"]["name"] for p in ns.pods("load")}
    load = Load(port, connections=16, interval=0.05)
    ns.patch_mcps("load", {"spec": {"podTemplate": {"annotations": {"e2e/rollout": uuid.uuid4().hex}}}})
    eventually("the Deployment rolled", lambda: ns.get("deploy", "load")["metadata"]["generation"] > 1
               and ns.get("deploy", "load")["status"].get("observedGeneration") == ns.get("deploy", "load")["metadata"]["generation"], 60)
    ns.k("rollout", "status", "deployment/load", "--timeout=300s")
    eventually("old pods gone", lambda: not (before & {p["metadata"]["name"] for p in ns.pods("load")}), 120)
    figures = load.stop()
    report("rolling update of 3 replicas", figures)
    assert figures["failed"] == 0, figures
    assert figures["ok"] == figures["requests"] > 200, figures


def test_sigterm_of_a_pod_fails_no_request(served):
    ns, port = served
    eventually("3 ready pods", lambda: ready_count(ns, "load") == 3, 180)
    victim = ns.pods("load")[0]["metadata"]["name"]
    load = Load(port, connections=16, interval=0.05)
    ns.k("delete", "pod", victim, "--wait=true", "--timeout=120s")
    eventually("3 ready pods again", lambda: ready_count(ns, "load") == 3, 180)
    figures = load.stop()
    report("SIGTERM of one of 3 pods", figures)
    assert figures["failed"] == 0, figures
    assert figures["ok"] == figures["requests"] > 200, figures


def rss_bytes(ns: Namespace, pod: str) -> float:
    with ns.port_forward(f"pod/{pod}", 9090) as admin:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10) as r:
            text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("quiver_process_resident_memory_bytes "):
            return float(line.split()[1])
    raise AssertionError("no quiver_process_resident_memory_bytes in /metrics")


def test_2000_concurrent_keep_alive_connections_fail_nothing_and_memory_stays_bounded(served):
    ns, port = served
    ns.k("scale", "qmcp", "load", "--replicas=1")
    eventually("one pod left", lambda: len(ns.pods("load")) == 1 and ready_count(ns, "load") == 1, 180)
    pod = ns.pods("load")[0]["metadata"]["name"]
    idle = rss_bytes(ns, pod)
    # Every connection is opened first and held; each sends a request every 4 s.
    load = Load(port, connections=2000, interval=4.0, hold=True)
    assert load.started.get("open") == 2000, load.started
    time.sleep(20)
    loaded = rss_bytes(ns, pod)
    figures = load.stop()
    report("2,000 keep-alive connections on one pod", {
        **figures, "rss_idle_mib": round(idle / 2**20, 1), "rss_loaded_mib": round(loaded / 2**20, 1)})
    assert figures["max_open_connections"] == 2000, figures
    assert figures["failed"] == 0, figures
    assert figures["ok"] == figures["requests"] >= 2000, figures
    assert loaded < 256 * 2**20, f"RSS {loaded / 2**20:.0f} MiB with 2,000 connections"
