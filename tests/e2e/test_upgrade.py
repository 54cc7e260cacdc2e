"""An upgrade that loses nothing: the release installed by scripts/e2e.sh (version A, from the
cluster's OCI registry) is upgraded to the next version B with the commands of
docs/install.md ("tested: verify" with VERSION=B, then "tested: upgrade"), while steady load
from tests/e2e/loadgen.py runs against an McpServer of two replicas through a NodePort on
127.0.0.1. Every request is counted and none may fail. Afterwards the operator and the
McpServer's pods run B's images, the CRD is the same object (updated in place, labelled
with B), and the McpServer is the same object, Ready.

conftest.py runs this module last: it changes the release every other test runs against.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import Namespace, eventually, kget, kubectl
from test_faults import NODE_PORT, Load, add_works, host_port, ready_count

ROOT = Path(__file__).parents[2]


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run the e2e suite through scripts/e2e.sh, which publishes both releases")
    return value


def doc_block(name: str, version: str, cwd: Path) -> str:
    """Runs one `tested:` block of docs/install.md as written, with REGISTRY and VERSION set."""
    block = subprocess.run(
        ["python3", str(ROOT / "scripts" / "doc-block.py"), str(ROOT / "docs" / "install.md"), name],
        capture_output=True, text=True, check=True,
    ).stdout
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block], cwd=cwd, capture_output=True, text=True, timeout=600,
        # cosign's attempt to refresh Sigstore's trust root goes to a closed loopback port
        # (scripts/release-install.sh says why); the registry is loopback, never proxied.
        env={**os.environ, "REGISTRY": env("QUIVER_RELEASE_REGISTRY"), "VERSION": version,
             "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1,localhost"},
    )
    assert proc.returncode == 0, f"docs/install.md block {name} failed:\n{block}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def images(ns: str, selector: str) -> set[str]:
    pods = kget("pods", "-n", ns, "-l", selector)["items"]
    return {c["image"] for p in pods if p["metadata"].get("deletionTimestamp") is None for c in p["spec"]["containers"]}


def rolled(ns: Namespace, name: str, image: str) -> bool:
    """Every live pod of the McpServer runs `image`, the Deployment is complete, none terminating."""
    d = ns.get("deploy", name)
    st = d.get("status", {})
    pods = ns.pods(name)
    return (
        st.get("observedGeneration") == d["metadata"]["generation"]
        and st.get("updatedReplicas") == st.get("replicas") == st.get("readyReplicas") == d["spec"]["replicas"]
        and len(pods) == d["spec"]["replicas"]
        and all(p["metadata"].get("deletionTimestamp") is None for p in pods)
        and all(c["image"] == image for p in pods for c in p["spec"]["containers"])
    )


def test_helm_upgrade_to_the_next_release_under_load_fails_no_request():
    registry, old, new = env("QUIVER_RELEASE_REGISTRY"), env("QUIVER_RELEASE_VERSION"), env("QUIVER_UPGRADE_VERSION")
    keys = Path(env("QUIVER_COSIGN_PUB")).parent
    assert images("quiver-system", "app.kubernetes.io/name=quiver-operator") == {f"{registry}/quiver-operator:{old}"}
    crd_before = kget("crd", "mcpservers.quiver.dev")
    assert crd_before["metadata"]["labels"]["helm.sh/chart"] == f"quiver-{old}"

    name = f"e2e-upgrade-{uuid.uuid4().hex[:5]}"
    kubectl("create", "namespace", name)
    ns = Namespace(name)
    ok = False
    try:
        ns.apply({"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "steady"},
                  "spec": {"replicas": 2, "tools": [{"name": "add", "description": "Add two numbers", "handler": {"builtin": "add"}}]}})
        eventually("2 ready pods", lambda: ready_count(ns, "steady") == 2, 300)
        # Ready pods come before the Deployment's status says the rollout is complete (and
        # before a pod of an earlier ReplicaSet is gone): wait for that, do not look once.
        eventually("the old release's server rolled out", lambda: rolled(ns, "steady", f"{registry}/quiver-server:{old}"), 120)
        mcp_uid = ns.get("qmcp", "steady")["metadata"]["uid"]
        selector = ns.get("svc", "steady")["spec"]["selector"]
        service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "steady-nodeport"},
                   "spec": {"type": "NodePort", "selector": selector,
                            "ports": [{"name": "mcp", "port": 8080, "targetPort": 8080, "nodePort": NODE_PORT}]}}

        def create_service() -> bool:
            # The NodePort is free again once an earlier test's namespace is gone.
            return kubectl("apply", "-n", name, "-f", "-", stdin=json.dumps(service), check=False) != ""

        eventually(f"NodePort {NODE_PORT} to be free for this test", create_service, 180, 1)
        port = host_port()
        eventually("the NodePort answers on 127.0.0.1", lambda: add_works(port), 120)

        # The user's steps: verify B, then upgrade to it, while clients call a tool.
        doc_block("verify", new, keys)
        load = Load(port, connections=8, interval=0.05)
        t0 = time.monotonic()
        doc_block("upgrade", new, keys)
        eventually("the McpServer's pods to run the new server image",
                   lambda: rolled(ns, "steady", f"{registry}/quiver-server:{new}"), 300, 0.5)
        upgrade_s = time.monotonic() - t0
        time.sleep(2)  # requests after the last old pod left, on the new ones only
        figures = load.stop()
        print({"scenario": "helm upgrade under load", "upgrade_seconds": round(upgrade_s, 1), **figures})
        assert figures["failed"] == 0, figures
        assert figures["ok"] > 100, figures

        assert images("quiver-system", "app.kubernetes.io/name=quiver-operator") == {f"{registry}/quiver-operator:{new}"}
        crd_after = kget("crd", "mcpservers.quiver.dev")
        assert crd_after["metadata"]["uid"] == crd_before["metadata"]["uid"], "the CRD was recreated, not updated"
        assert crd_after["metadata"]["labels"]["helm.sh/chart"] == f"quiver-{new}"
        assert ns.get("qmcp", "steady")["metadata"]["uid"] == mcp_uid
        ns.wait_condition("steady", "Ready", "True", 120)
        ok = True
    finally:
        if not ok:
            print(ns.dump())
        kubectl("delete", "namespace", name, "--wait=false", check=False)
