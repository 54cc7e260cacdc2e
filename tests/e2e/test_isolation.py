"""Tenant isolation on a real kind cluster: an McpServer's pods are admitted in a namespace
that enforces the Pod Security "restricted" profile, and a program the server starts (an exec
tool here; stdio upstreams take the same path) cannot read the pod's ServiceAccount token nor
the server's own environment, while it can read ordinary files of the image.

The server image is `FROM scratch`, so the probe program is quiver-server itself:
`quiver-server check --config file:PATH` reads PATH and says why it could not."""

from __future__ import annotations

import asyncio

from conftest import Namespace
from mcp import Client

READER = {
    "apiVersion": "quiver.dev/v1alpha1",
    "kind": "McpServer",
    "metadata": {"name": "reader"},
    "spec": {
        "tools": [
            {
                "name": "read",
                "description": "Ask the image's own binary to read a file",
                "input": {"path": "string"},
                "handler": {
                    "exec": {
                        "command": ["/usr/local/bin/quiver-server", "check", "--config", "file:{{path}}"],
                        "timeout": "5s",
                    }
                },
            }
        ],
    },
}

TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def read(port: int, path: str) -> str:
    async def run() -> str:
        async with Client(f"http://127.0.0.1:{port}/mcp") as c:
            r = await c.call_tool("read", {"path": path})
            assert r.is_error, f"check of {path} cannot succeed: {r.content}"
            return r.content[0].text

    return asyncio.run(run())


def test_restricted_namespace_and_children_confined_from_the_pods_credentials(ns: Namespace):
    ns.k("label", "namespace", ns.name, "pod-security.kubernetes.io/enforce=restricted",
         "pod-security.kubernetes.io/enforce-version=latest")
    ns.apply(READER)
    # Ready means the ReplicaSet's pods were admitted under "restricted" and serve.
    ns.wait_condition("reader", "Ready", "True")

    pod = ns.pods("reader")[0]
    spec = pod["spec"]
    assert spec.get("automountServiceAccountToken") is False, spec.get("automountServiceAccountToken")
    server = next(c for c in spec["containers"] if c["name"] == "server")
    assert any(m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount" for m in server.get("volumeMounts", [])), server

    with ns.port_forward("svc/reader", 8080) as port:
        # Control: an ordinary file of the image is readable (it is just not a ToolSet), so a
        # "Permission denied" below is the confinement, not a broken probe.
        passwd = read(port, "/etc/passwd")
        assert "cannot read" not in passwd and "ermission denied" not in passwd, passwd
        # The ServiceAccount token the server reads its ConfigMap and Secrets with: hidden.
        token = read(port, TOKEN)
        assert f"cannot read {TOKEN}" in token and "ermission denied" in token, token
        # The server's environment (it is PID 1 of its container): not readable either.
        environ = read(port, "/proc/1/environ")
        assert "cannot read /proc/1/environ" in environ and "ermission denied" in environ, environ


def test_the_nodes_registry_is_read_only():
    """The nodes pull from the cluster's registry over the kind network, which every pod can
    reach through its node: that side must refuse writes, or a pod could replace the images
    the nodes run next (the operator's included). Pushes go to a second instance published
    on the host's loopback only, which the nodes cannot resolve."""
    import os
    import subprocess

    import pytest

    if os.environ.get("QUIVER_RELEASE_REGISTRY") is None:
        pytest.skip("installed without a registry (QUIVER_E2E_INSTALL=local)")
    cluster = os.environ.get("QUIVER_CLUSTER", "quiver")
    node = f"{cluster}-worker"

    def curl(*args: str) -> str:
        proc = subprocess.run(
            ["docker", "exec", node, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", *args],
            capture_output=True, text=True, timeout=30,
        )
        return proc.stdout.strip() or f"exit {proc.returncode}"

    assert curl(f"http://{cluster}-registry:5000/v2/") == "200"
    assert curl("-X", "POST", f"http://{cluster}-registry:5000/v2/quiver/quiver-operator/blobs/uploads/") == "405"
    assert curl(f"http://{cluster}-registry-push:5000/v2/") in ("000", "exit 6"), "the push side is reachable from a node"
