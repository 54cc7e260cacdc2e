"""Quiver end to end on a real kind cluster: the operator from the Helm chart, real pods of
quiver-server, the official MCP Python SDK talking to them through kubectl port-forward."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import subprocess
import threading
import time
import urllib.request

import mcp_types as types
from conftest import Namespace, eventually, kubectl
from mcp import Client
from mcp.shared.exceptions import MCPError

CALCULATOR = {
    "apiVersion": "quiver.dev/v1alpha1",
    "kind": "McpServer",
    "metadata": {"name": "calc"},
    "spec": {
        "replicas": 2,
        "server": {"name": "calc", "version": "1.0.0"},
        "tools": [
            {"name": "add", "description": "Add two numbers", "handler": {"builtin": "add"}},
            {"name": "say", "input": {"text": "string"}, "handler": {"template": "{{text}}"}},
        ],
    },
}


def mcp_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/mcp"


def admin_get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.read().decode()


def pod_identity(ns: Namespace, name: str) -> dict[str, int]:
    """uid -> total restarts of every pod of an McpServer."""
    return {
        p["metadata"]["uid"]: sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses", []))
        for p in ns.pods(name)
    }


def test_ready_with_printer_columns_and_tools_served(ns: Namespace):
    ns.apply(CALCULATOR)
    ns.wait_condition("calc", "Ready", "True")
    table = ns.k("get", "qmcp", "calc").splitlines()
    header, row = re.split(r"\s{2,}", table[0].strip()), re.split(r"\s{2,}", table[1].strip())
    assert header == ["NAME", "READY", "REPLICAS", "TOOLS", "ENDPOINT", "AGE"]
    assert row[:5] == ["calc", "True", "2/2", "2", f"http://calc.{ns.name}.svc:8080/mcp"]
    status = ns.get("qmcp", "calc")["status"]
    assert status["configLoadedReplicas"] == 2, "both pods report the current config hash"

    async def run(port: int):
        async with Client(mcp_url(port)) as c:
            assert c.server_info.name == "calc"
            tools = await c.list_tools(cache_mode="bypass")
            assert sorted(t.name for t in tools.tools) == ["add", "say"]
            r = await c.call_tool("add", {"a": 40, "b": 2})
            assert (r.is_error, r.content[0].text) == (False, "42")
            r = await c.call_tool("say", {"text": "through kind"})
            assert r.content[0].text == "through kind"

    with ns.port_forward("svc/calc", 8080) as port:
        asyncio.run(run(port))


class ConfigMapWatch:
    """`kubectl get cm -w` in the background: when each new version reached a watcher."""

    def __init__(self, ns: Namespace, name: str):
        self.proc = subprocess.Popen(
            ["kubectl", "-n", ns.name, "get", "cm", name, "--watch", "-o", "jsonpath={.metadata.resourceVersion}{\"\\n\"}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.seen: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.seen.append((time.monotonic(), line.strip()))

    def first_after(self, t: float) -> float | None:
        return next((at for at, _ in self.seen if at > t), None)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


EDITS = 5


def test_tool_edit_reaches_running_pods_without_restart(ns: Namespace):
    ns.apply(CALCULATOR)
    ns.wait_condition("calc", "Ready", "True")
    pods = ns.ready_pods("calc", 2)
    before = pod_identity(ns, "calc")
    deploy_gen = ns.get("deploy", "calc")["metadata"]["generation"]
    tools = list(CALCULATOR["spec"]["tools"])
    cm_watch = ConfigMapWatch(ns, "calc-tools")
    eventually("the ConfigMap watch to start", lambda: cm_watch.seen, 30)

    async def run(mcp_port: int, admin_port: int) -> list[tuple[float, float, float, float]]:
        notified: list[float] = []

        async def on_message(msg):
            if isinstance(msg, types.ToolListChangedNotification) or getattr(msg, "method", None) == "notifications/tools/list_changed":
                notified.append(time.monotonic())

        samples = []
        async with Client(mcp_url(mcp_port), mode="legacy", message_handler=on_message) as c:
            await c.list_tools(cache_mode="bypass")
            # The SDK opens its GET stream after initialize; wait until this pod counts it.
            await asyncio.to_thread(
                eventually, "the SDK's GET stream", lambda: re.search(r"^quiver_open_streams [1-9]", admin_get(admin_port, "/metrics"), re.M), 30
            )
            for i in range(EDITS):
                name = f"shout-{i}"
                tools.append({"name": name, "input": {"text": "string"}, "handler": {"template": f"{{{{text}}}}!{i}"}})
                start = time.monotonic()
                await asyncio.to_thread(ns.patch_mcps, "calc", {"spec": {"tools": tools}})
                patched_at = time.monotonic()
                callable_at = None
                while time.monotonic() < start + 60:
                    try:
                        r = await c.call_tool(name, {"text": "hi"})
                    except MCPError as e:  # -32602 "Unknown tool" until the pod has the new config
                        assert "Unknown tool" in str(e), e
                    else:
                        callable_at = time.monotonic()
                        assert (r.is_error, r.content[0].text) == (False, f"hi!{i}")
                        break
                    await asyncio.sleep(0.01)
                assert callable_at, f"{name} never became callable"
                await asyncio.to_thread(eventually, "tools/list_changed", lambda: any(t > start for t in notified), 30)
                cm_at = await asyncio.to_thread(eventually, "the ConfigMap update", lambda: cm_watch.first_after(start), 30)
                samples.append(
                    (callable_at - start, next(t for t in notified if t > start) - start, callable_at - cm_at, patched_at - start)
                )
        return samples

    try:
        with ns.port_forward(f"pod/{pods[0]}", 8080) as mcp_port, ns.port_forward(f"pod/{pods[0]}", 9090) as admin_port:
            samples = asyncio.run(run(mcp_port, admin_port))
    finally:
        cm_watch.close()
    ms = lambda xs: " ".join(f"{x * 1000:.0f}" for x in xs)  # noqa: E731
    edit, notify, from_cm, kubectl_patch = zip(*samples)
    print(
        f"\nhot reload on kind over {EDITS} edits (ms):"
        f"\n  McpServer edit -> new tool callable in a running pod: {ms(edit)} (median {statistics.median(edit) * 1000:.0f})"
        f"\n  McpServer edit -> tools/list_changed at the SDK client: {ms(notify)} (median {statistics.median(notify) * 1000:.0f})"
        f"\n  ConfigMap update seen by a watcher -> callable: {ms(from_cm)} (median {statistics.median(from_cm) * 1000:.0f})"
        f"\n  the `kubectl patch` process (start to exit), included in the first line: {ms(kubectl_patch)}"
    )

    # The other replica serves them too, and nothing restarted or rolled.
    with ns.port_forward(f"pod/{pods[1]}", 8080) as port:

        async def other():
            async with Client(mcp_url(port)) as c:
                return sorted(t.name for t in (await c.list_tools(cache_mode="bypass")).tools)

        assert asyncio.run(other()) == sorted(t["name"] for t in tools)
    assert pod_identity(ns, "calc") == before, "pod UIDs and restart counts unchanged"
    assert ns.get("deploy", "calc")["metadata"]["generation"] == deploy_gen, "the Deployment did not roll"
    eventually(f"status toolCount {len(tools)}", lambda: ns.get("qmcp", "calc")["status"].get("toolCount") == len(tools), 30)


def test_invalid_edit_is_reported_and_old_tools_keep_serving(ns: Namespace):
    ns.apply(CALCULATOR)
    ns.wait_condition("calc", "Ready", "True")
    cm_before = ns.get("cm", "calc-tools")["data"]
    bad = CALCULATOR["spec"]["tools"] + [{"name": "broken", "handler": {"http": {"url": "not a url {{"}}}]
    ns.patch_mcps("calc", {"spec": {"tools": bad}})
    cond = ns.wait_condition("calc", "ConfigValid", "False", 60)
    assert "tools[2].handler.http.url" in cond["message"], cond["message"]
    events = ns.k("get", "events", "--field-selector", "involvedObject.name=calc,involvedObject.kind=McpServer")
    assert "InvalidToolConfig" in events and "tools[2].handler.http.url" in events, events
    assert ns.get("cm", "calc-tools")["data"] == cm_before, "the last good ConfigMap stays"

    async def run(port: int):
        async with Client(mcp_url(port)) as c:
            tools = await c.list_tools(cache_mode="bypass")
            assert sorted(t.name for t in tools.tools) == ["add", "say"]
            assert (await c.call_tool("add", {"a": 1, "b": 2})).content[0].text == "3"

    with ns.port_forward("svc/calc", 8080) as port:
        asyncio.run(run(port))


def helper_image() -> str:
    """An image with a shell that every kind node holds (kind's storage helper)."""
    deploy = json.loads(kubectl("get", "deploy", "-n", "local-path-storage", "local-path-provisioner", "-o", "json"))
    args = deploy["spec"]["template"]["spec"]["containers"][0]["command"]
    return args[args.index("--helper-image") + 1]


def test_tuning_pins_exclusive_cpus_sets_sysctls_and_allocator(ns: Namespace):
    ns.apply(
        {
            "apiVersion": "quiver.dev/v1alpha1",
            "kind": "McpServer",
            "metadata": {"name": "pinned"},
            "spec": {
                "replicas": 1,
                "resources": {"limits": {"memory": "128Mi"}},
                "tuning": {
                    "profile": "latency",
                    "cpuPinning": True,
                    "cpus": 1,
                    "allocator": "system",
                    "sysctls": {"net.ipv4.tcp_keepalive_time": "30"},
                    "unsafeSysctls": {"net.core.somaxconn": "4096"},
                },
                # The kind cluster's worker is the node with exclusive CPUs (deploy/kind/cluster.yaml).
                "podTemplate": {
                    "nodeSelector": {"quiver.dev/exclusive-cpus": "true"},
                    "tolerations": [{"key": "quiver.dev/exclusive-cpus", "operator": "Exists", "effect": "NoSchedule"}],
                },
                "tools": [{"name": "add", "handler": {"builtin": "add"}}],
            },
        }
    )
    ns.wait_condition("pinned", "Ready", "True", 240)
    pod = ns.pods("pinned")[0]
    pname = pod["metadata"]["name"]
    assert pod["status"]["qosClass"] == "Guaranteed"
    ctr = pod["spec"]["containers"][0]
    assert ctr["resources"]["requests"]["cpu"] == ctr["resources"]["limits"]["cpu"] == "1"
    assert "--pin-workers" in ctr["args"]

    # What the server says about itself...
    with ns.port_forward(f"pod/{pname}", 9090) as port:
        tuning = json.loads(admin_get(port, "/status"))["tuning"]
        build_info = next(line for line in admin_get(port, "/metrics").splitlines() if line.startswith("quiver_build_info"))
    assert 'allocator="system"' in build_info, build_info
    assert tuning["pinned"] is True and tuning["workerThreads"] == 1
    assert len(tuning["allowedCpus"]) == 1 and tuning["allowedCpus"] != [0], tuning

    # ...checked from outside the server: an ephemeral container in the pod's PID and network
    # namespaces reads the kernel's view of the server process, its threads and the sysctls.
    script = (
        "grep Cpus_allowed_list /proc/1/status; "
        "for t in /proc/1/task/*; do echo \"thread $(cat $t/comm) $(grep Cpus_allowed_list $t/status | cut -f2)\"; done; "
        "echo somaxconn $(cat /proc/sys/net/core/somaxconn); "
        "echo keepalive $(cat /proc/sys/net/ipv4/tcp_keepalive_time)"
    )
    ns.k("debug", pname, "--image", helper_image(), "--target", "server", "--container", "probe",
         "--profile", "restricted", "--", "sh", "-c", script)
    out = eventually(
        "the probe container's output",
        lambda: (lambda o: o if "keepalive" in o else None)(ns.k("logs", pname, "-c", "probe", check=False)),
        60,
    )
    cpus = re.search(r"^Cpus_allowed_list:\s*(\S+)", out, re.M).group(1)
    assert cpus == str(tuning["allowedCpus"][0]), f"the server's cpuset is the exclusive CPU: {out}"
    workers = re.findall(r"^thread quiver-worker (\S+)$", out, re.M)
    assert workers and all(w == cpus for w in workers), f"every worker pinned to {cpus}: {out}"
    assert "somaxconn 4096" in out and "keepalive 30" in out, out

    # The shared pool on that node no longer includes the exclusive CPU: kube-proxy there runs elsewhere.
    node = pod["spec"]["nodeName"]
    print(f"\npinned pod on {node}: cpuset {cpus}, {len(workers)} worker thread(s) pinned; sysctls applied")


def test_scale_subresource_and_autoscaling(ns: Namespace):
    ns.apply(CALCULATOR)
    ns.wait_condition("calc", "Ready", "True")
    kubectl("scale", "qmcp/calc", "-n", ns.name, "--replicas=3")
    eventually("Deployment at 3 replicas", lambda: ns.get("deploy", "calc")["spec"]["replicas"] == 3, 60)
    eventually(
        "status 3/3 ready",
        lambda: (lambda s: s.get("readyReplicas") == 3 and s.get("replicas") == 3)(ns.get("qmcp", "calc").get("status", {})),
        180,
    )
    ns.patch_mcps("calc", {"spec": {"replicas": None, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}}})
    hpa = eventually("an HPA", lambda: ns.get("hpa").get("items"), 60)[0]
    assert hpa["metadata"]["name"] == "calc"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 4)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "calc"}


def test_delete_collects_every_child(ns: Namespace):
    ns.apply(CALCULATOR)
    ns.wait_condition("calc", "Ready", "True")
    kinds = "deploy,svc,cm,sa,role,rolebinding"
    children = ns.k("get", kinds, "-l", "app.kubernetes.io/instance=calc", "-o", "name").split()
    assert len(children) >= 6, children
    ns.k("delete", "qmcp", "calc")
    eventually(
        "children garbage-collected",
        lambda: ns.k("get", kinds + ",pods", "-l", "app.kubernetes.io/instance=calc", "-o", "name").strip() == "",
        120,
    )
