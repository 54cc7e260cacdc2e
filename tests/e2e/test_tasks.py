"""Tasks through a rolling update on a real kind cluster, with a real Redis holding them.

An McpServer of two replicas fronts a remote go-mcp (official Go SDK) whose `slow` tool
takes as long as it is asked. A client that declared the tasks extension starts, through one
pod, a task of two minutes and one of five; the McpServer's pod template then changes, so
every pod is replaced. The pod that runs the tasks leaves the Service at once but keeps
running them for its `tasks.drain` (150 s): the two-minute task completes there and its
result is read through a pod that did not exist when it started; the five-minute one is
still running when the drain ends and fails with the error that says so.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

from conftest import Namespace, eventually
from redis_server import Redis, gateway_address

GO_IMAGE = os.environ.get("QUIVER_E2E_GO_MCP_IMAGE", "quiver-e2e/go-mcp:dev")
TWO_MINUTES_MS = 120_000
FIVE_MINUTES_MS = 300_000
DRAIN_SECONDS = 150
TASKS_META = {"io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}


def go_remote() -> list[dict]:
    labels = {"app": "go-remote"}
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "go-remote"},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {
                 "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [{
                     "name": "go-mcp", "image": GO_IMAGE, "imagePullPolicy": "IfNotPresent",
                     "args": ["-http", ":8080"], "ports": [{"containerPort": 8080}],
                     "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 2},
                     "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                         "capabilities": {"drop": ["ALL"]}},
                 }]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "go-remote"},
         "spec": {"selector": labels, "ports": [{"port": 8080, "targetPort": 8080}]}},
    ]


def mcp_server(ns: str, redis: str) -> dict:
    return {
        "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "jobs"},
        "spec": {
            "replicas": 2,
            "tasks": {"redis": {"address": redis}, "drain": f"{DRAIN_SECONDS}s"},
            "tools": [{"name": "ping", "description": "Answers pong.", "handler": {"template": "pong"}}],
            "upstreams": [{
                "name": "work", "http": {"url": f"http://go-remote.{ns}.svc:8080/mcp"}, "timeout": "5m",
                "tools": {"prefix": "work_", "include": ["slow"]},
            }],
        },
    }


def rpc(port: int, method: str, params: dict) -> dict:
    """One JSON-RPC request of a client that declared the tasks extension."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": TASKS_META}})
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/mcp", data=body.encode(), method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    if text.lstrip().startswith("{"):
        return json.loads(text)
    return json.loads(next(line[5:] for line in text.splitlines() if line.startswith("data:") and line[5:].strip()))


def pod_names(ns: Namespace) -> dict[str, bool]:
    """The McpServer's pods: name -> whether it is terminating."""
    return {p["metadata"]["name"]: p["metadata"].get("deletionTimestamp") is not None for p in ns.pods("jobs")}


def test_a_two_minute_task_survives_a_rolling_update_and_is_read_through_another_replica(ns: Namespace):
    tmp = Path(tempfile.mkdtemp(prefix="quiver-e2e-tasks-"))
    host = gateway_address()
    redis = Redis(host, tmp)
    try:
        for obj in go_remote():
            ns.apply(obj)
        ns.apply(mcp_server(ns.name, f"{host}:{redis.port}"))
        ns.wait_condition("jobs", "Ready", "True", 300)
        ns.wait_condition("jobs", "UpstreamsReady", "True", 180)
        first = ns.ready_pods("jobs", 2)
        owner = first[0]
        grace = ns.get("pod", owner)["spec"]["terminationGracePeriodSeconds"]
        assert grace >= DRAIN_SECONDS, f"the pod's grace period ({grace}s) fits the drain"

        with ns.port_forward(f"pod/{owner}", 8080) as port:
            ids = {}
            for name, ms in [("two", TWO_MINUTES_MS), ("five", FIVE_MINUTES_MS)]:
                created = rpc(port, "tools/call", {"name": "work_slow", "arguments": {"ms": ms}})
                assert created.get("result", {}).get("resultType") == "task", created
                ids[name] = created["result"]["taskId"]
        started = time.monotonic()

        # Every pod is replaced: the pod template changes.
        ns.patch_mcps("jobs", {"spec": {"podTemplate": {"annotations": {"e2e.quiver.dev/rollout": "1"}}}})
        def replaced() -> list[str] | None:
            names = [
                p["metadata"]["name"] for p in ns.pods("jobs")
                if p["metadata"].get("deletionTimestamp") is None and p["metadata"]["name"] not in first
                and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
            ]
            return names if len(names) == 2 else None

        fresh = eventually("two ready pods that did not exist when the tasks started", replaced, 240, 1)
        assert pod_names(ns).get(owner) is True, f"{owner} is still draining its tasks: {pod_names(ns)}"

        with ns.port_forward(f"pod/{fresh[0]}", 8080) as port:
            during = rpc(port, "tasks/get", {"taskId": ids["two"]})
            assert during["result"]["status"] == "working", during

            def ended(task: str):
                got = rpc(port, "tasks/get", {"taskId": ids[task]})
                return got["result"] if got.get("result", {}).get("status") != "working" else None

            done = eventually("the two-minute task to end", lambda: ended("two"), 240, 2)
            assert done["status"] == "completed", done
            assert done["result"]["content"][0]["text"] == "done", done
            assert time.monotonic() - started >= TWO_MINUTES_MS / 1000 - 5

            failed = eventually("the five-minute task to end with the drain", lambda: ended("five"), 240, 2)
            assert failed["status"] == "failed", failed
            assert failed["error"]["code"] == -32603, failed
            assert "stopped before the task finished" in failed["error"]["message"], failed
        # The same answer through the Service, whichever pod it picks.
        with ns.port_forward("svc/jobs", 8080) as port:
            again = rpc(port, "tasks/get", {"taskId": ids["two"]})
            assert again["result"]["status"] == "completed", again
        eventually(f"{owner} to be gone", lambda: owner not in pod_names(ns) or None, 60, 1)
    finally:
        redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)
