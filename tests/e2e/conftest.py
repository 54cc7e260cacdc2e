"""Fixtures of the end-to-end suite: a namespace per test, kubectl, port-forwards, polling.

The suite runs against the kind cluster scripts/e2e.sh brings up (KUBECONFIG points at
it). Without a cluster it fails rather than skips: the README test command runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> str:
    """Runs kubectl against the e2e cluster and returns its stdout."""
    proc = subprocess.run(
        ["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=120
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def kget(*args: str) -> Any:
    """kubectl get ... -o json, parsed."""
    return json.loads(kubectl("get", *args, "-o", "json"))


def eventually(what: str, probe: Callable[[], T | None], timeout: float = 120, every: float = 0.2) -> T:
    """Polls `probe` until it returns something truthy; fails naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except (AssertionError, subprocess.SubprocessError) as e:
            last_error = e
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}" + (f" (last error: {last_error})" if last_error else ""))


class Namespace:
    """A throwaway namespace and helpers scoped to it."""

    def __init__(self, name: str):
        self.name = name

    def k(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return kubectl("-n", self.name, *args, stdin=stdin, check=check)

    def get(self, *args: str) -> Any:
        return kget("-n", self.name, *args)

    def apply(self, obj: dict | str) -> None:
        # JSON, not YAML: kubectl reads YAML 1.1, where an unquoted key such as `n` or `y`
        # is a boolean (PyYAML's dumper does not quote those), and JSON is valid YAML.
        text = obj if isinstance(obj, str) else json.dumps(obj)
        self.k("apply", "-f", "-", stdin=text)

    def quiver(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`kubectl quiver -n NS ARGS` (kubectl finds kubectl-quiver on PATH)."""
        proc = subprocess.run(
            ["kubectl", "quiver", "-n", self.name, *args], capture_output=True, text=True, timeout=120
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl quiver {' '.join(args)}: exit {proc.returncode}: {proc.stderr}{proc.stdout}")
        return proc

    def patch_mcps(self, name: str, patch: dict) -> None:
        self.k("patch", "mcpservers", name, "--type=merge", "-p", json.dumps(patch))

    def condition(self, name: str, ctype: str) -> dict | None:
        obj = self.get("qmcp", name)
        for c in obj.get("status", {}).get("conditions", []):
            if c["type"] == ctype:
                return c
        return None

    def wait_condition(self, name: str, ctype: str, status: str, timeout: float = 180) -> dict:
        def probe() -> dict | None:
            c = self.condition(name, ctype)
            return c if c and c["status"] == status else None

        return eventually(f"qmcp/{name} {ctype}={status}", probe, timeout)

    def pods(self, name: str) -> list[dict]:
        return self.get("pods", "-l", f"app.kubernetes.io/instance={name}")["items"]

    def ready_pods(self, name: str, want: int) -> list[str]:
        """Waits until exactly `want` pods of McpServer `name` are Ready and not terminating;
        their names, sorted."""

        def probe():
            names = sorted(
                p["metadata"]["name"]
                for p in self.pods(name)
                if p["metadata"].get("deletionTimestamp") is None
                and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
            )
            return names if len(names) == want else None

        return eventually(f"{want} ready pods of {name}", probe, 180)

    @contextlib.contextmanager
    def port_forward(self, target: str, port: int) -> Iterator[int]:
        """kubectl port-forward to 127.0.0.1 on a free port; yields that port."""
        proc = subprocess.Popen(
            ["kubectl", "-n", self.name, "port-forward", target, "--address", "127.0.0.1", f":{port}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            m = re.match(r"Forwarding from 127\.0\.0\.1:(\d+)", line)
            if not m:
                proc.kill()
                raise AssertionError(f"port-forward {target}: {line}{proc.stdout.read()}")
            yield int(m.group(1))
        finally:
            proc.terminate()
            proc.wait(timeout=10)

    def dump(self) -> str:
        """What a person needs to see when a test fails: objects, events, pod logs."""
        out = [f"===== namespace {self.name} ====="]
        out.append(kubectl("get", "quiver,deploy,rs,pods,svc,cm,hpa", "-n", self.name, "-o", "wide", check=False))
        out.append(kubectl("get", "quiver", "-n", self.name, "-o", "yaml", check=False))
        out.append(kubectl("get", "events", "-n", self.name, "--sort-by=.lastTimestamp", check=False))
        for pod in kget("pods", "-n", self.name).get("items", []):
            pname = pod["metadata"]["name"]
            out.append(f"----- logs {pname} -----")
            out.append(kubectl("logs", "-n", self.name, pname, "--all-containers", "--tail=100", check=False))
        out.append("----- operator logs -----")
        out.append(kubectl("logs", "-n", "quiver-system", "deploy/quiver", "--tail=100", check=False))
        return "\n".join(out)


@pytest.fixture(scope="session", autouse=True)
def cluster() -> None:
    if not os.environ.get("KUBECONFIG"):
        pytest.fail("KUBECONFIG is not set: run the e2e suite through scripts/e2e.sh (make e2e)")
    kubectl("get", "crd", "mcpservers.quiver.dev")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ARG001
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.failed_call = report.failed


@pytest.fixture
def ns(request) -> Iterator[Namespace]:
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    name = f"e2e-{base}-{uuid.uuid4().hex[:5]}"
    kubectl("create", "namespace", name)
    namespace = Namespace(name)
    yield namespace
    if getattr(request.node, "failed_call", False):
        print(namespace.dump())
    kubectl("delete", "namespace", name, "--wait=false", check=False)


def pytest_collection_modifyitems(items: list) -> None:
    """test_upgrade.py last: it moves the whole installation to the next release."""
    items.sort(key=lambda item: item.module.__name__ == "test_upgrade")
