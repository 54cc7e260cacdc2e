"""The operator's console in a real browser, against a real API server and Keycloak.

Needs what scripts/operator-it.sh provides: a control plane (KUBECONFIG) with the CRD
installed, and the binaries QUIVER_OPERATOR_BIN and QUIVER_SERVER_BIN. Keycloak is started
for the module (scripts/idp.sh; QUIVER_IDP_ENV reuses a running one).

Two namespaces: `weather` in A, whose McpServer points its catalog URL at a quiver-server
on 127.0.0.1 that checks Keycloak's tokens (1,002 tools: `greet`, `deploy` for the group
`sre` only, and 1,000 more); `secret` in B. A real Prometheus scrapes the server with the
labels a ServiceMonitor gives it (namespace A, service `weather`), for the console's figures. alice may list McpServers in A only; bob
nowhere. A second operator on standby (a Lease held by someone else) serves the console.
The browser is Chromium (QUIVER_CHROMIUM) driven by playwright-core from npm, in
console.test.mjs; this file brings up what it reads. Screenshots go to QUIVER_SCREENSHOTS
(default: a temporary directory, printed)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SUFFIX = str(os.getpid())
NS_A, NS_B = f"q-console-a-{SUFFIX}", f"q-console-b-{SUFFIX}"

pytestmark = pytest.mark.skipif(
    not (os.environ.get("KUBECONFIG") and os.environ.get("QUIVER_OPERATOR_BIN")),
    reason="needs a control plane and the operator binary: run through scripts/operator-it.sh",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - not yet; said in the failure
            last = e
        time.sleep(0.1)
    raise AssertionError(f"{what} did not hold within {timeout} s (last error: {last})")


def kubectl(*args: str, stdin: str | None = None) -> str:
    out = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
    return out.stdout


def apply(doc: dict) -> None:
    kubectl("apply", "-f", "-", stdin=json.dumps(doc))


TOOLS = [
    {"name": "greet", "title": "Greeting", "description": "Says hello to someone.",
     "input": {"name": "string"}, "annotations": {"readOnlyHint": True},
     "handler": {"template": "Hello, {{name}}!"}},
    {"name": "deploy", "description": "Deploys a service.", "input": {"service": "string"},
     "access": {"groups": ["sre"]}, "handler": {"template": "deployed {{service}}"}},
] + [
    {"name": f"t{i:04}", "description": f"Tool number {i} of a large catalog.", "input": {"x": "integer"},
     "handler": {"template": "{{x}}"}}
    for i in range(1000)
]


@pytest.fixture(scope="module")
def chromium():
    if not os.environ.get("QUIVER_CHROMIUM"):
        out = subprocess.run([str(ROOT / "scripts" / "chromium.sh")], check=True, timeout=900,
                             stdout=subprocess.PIPE, text=True)
        os.environ["QUIVER_CHROMIUM"] = out.stdout.strip()


@pytest.fixture(scope="module")
def playwright():
    """playwright-core from npm (package-lock.json), installed once: it drives the given
    Chromium and downloads no browser of its own."""
    if not (HERE / "node_modules" / "playwright-core").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error", "--cache",
                        os.path.join(os.environ.get("QUIVER_CACHE", os.path.expanduser("~/.cache/quiver")), "npm")], cwd=HERE, check=True, timeout=600)


@pytest.fixture(scope="module")
def idp():
    given = os.environ.get("QUIVER_IDP_ENV")
    work = None
    if not given:
        work = tempfile.mkdtemp(prefix="quiver-console-idp-")
        subprocess.run([str(ROOT / "scripts" / "idp.sh"), "start", work], check=True, timeout=900)
        given = os.path.join(work, "env")
    env = dict(line.split("=", 1) for line in Path(given).read_text().split())
    try:
        yield env["QUIVER_IDP_ISSUER"]
    finally:
        if work:
            subprocess.run([str(ROOT / "scripts" / "idp.sh"), "stop", work], check=False, timeout=120)
            shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def shots():
    d = os.environ.get("QUIVER_SCREENSHOTS") or tempfile.mkdtemp(prefix="quiver-console-shots-")
    os.makedirs(d, exist_ok=True)
    print(f"console screenshots in {d}")
    return Path(d)


@pytest.fixture(scope="module")
def console(idp, chromium):
    work = Path(tempfile.mkdtemp(prefix="quiver-console-"))
    procs: list[subprocess.Popen] = []
    try:
        # The MCP server the catalog entry points at, checking Keycloak's tokens.
        port, admin = free_port(), free_port()
        (work / "tools.yaml").write_text(json.dumps({"tools": TOOLS}))
        server_log = open(work / "server.log", "w")
        procs.append(subprocess.Popen(
            [os.environ["QUIVER_SERVER_BIN"], "--config", f"file:{work / 'tools.yaml'}",
             "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
             "--auth-issuer", idp, "--auth-audience", "quiver"],
            stdout=server_log, stderr=subprocess.STDOUT))
        wait_until("the MCP server is ready",
                   lambda: urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=2).status == 200)

        # Prometheus scrapes it as a ServiceMonitor would label it.
        pport = free_port()
        (work / "prometheus.yml").write_text(json.dumps({
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "quiver-server", "static_configs": [{
                "targets": [f"127.0.0.1:{admin}"],
                "labels": {"namespace": NS_A, "service": "weather", "pod": "weather-0"}}]}]}))
        prom_log = open(work / "prometheus.log", "w")
        procs.append(subprocess.Popen(
            [shutil.which("prometheus") or "prometheus", "--config.file", str(work / "prometheus.yml"),
             "--storage.tsdb.path", str(work / "tsdb"), "--web.listen-address", f"127.0.0.1:{pport}"],
            stdout=prom_log, stderr=subprocess.STDOUT))
        prometheus = f"http://127.0.0.1:{pport}"
        wait_until("Prometheus scrapes the server", lambda: prom_query(prometheus, f'up{{namespace="{NS_A}"}} == 1'))

        for ns in (NS_A, NS_B):
            kubectl("create", "namespace", ns)
        mcp = {"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer"}
        apply({**mcp, "metadata": {"name": "weather", "namespace": NS_A}, "spec": {
            "server": {"title": "Weather"},
            "catalog": {"description": "Forecasts and greetings", "url": f"http://127.0.0.1:{port}/mcp"},
            "auth": {"oidc": {"issuer": idp, "audience": "quiver"}},
            # The CRD takes 256 tools; the pages read access rules from these two, and the
            # listing comes from the server (all 1,002).
            "tools": TOOLS[:2]}})
        apply({**mcp, "metadata": {"name": "secret", "namespace": NS_B},
               "spec": {"tools": [{"name": "hidden", "handler": {"template": "x"}}]}})
        apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "mcp-reader", "namespace": NS_A},
               "rules": [{"apiGroups": ["quiver.dev"], "resources": ["mcpservers"], "verbs": ["list"]}]})
        apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "alice-reads", "namespace": NS_A},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mcp-reader"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "oidc:alice"}]})
        # Held by someone else for an hour: the console's operator stays on standby.
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        apply({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "quiver-operator", "namespace": NS_A},
               "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600,
                        "acquireTime": now, "renewTime": now}})

        cport = free_port()
        base = f"http://127.0.0.1:{cport}"
        op_log = open(work / "operator.log", "w")
        procs.append(subprocess.Popen(
            [os.environ["QUIVER_OPERATOR_BIN"], "--leader-elect", f"--lease-namespace={NS_A}",
             "--probe-pods=false", "--admin-listen=127.0.0.1:0",
             f"--console-listen=127.0.0.1:{cport}", f"--console-url={base}", f"--console-issuer={idp}",
             "--console-username-claim=preferred_username", "--console-reach=listed",
             f"--console-prometheus={prometheus}"],
            stdout=op_log, stderr=subprocess.STDOUT, env={**os.environ, "POD_NAME": "console-standby"}))
        wait_until("the console answers", lambda: urllib.request.urlopen(f"{base}/static/console.css", timeout=2).status == 200)
        yield {"base": base, "prometheus": prometheus}
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for ns in (NS_A, NS_B):
            subprocess.run(["kubectl", "delete", "namespace", ns, "--wait=false"], capture_output=True, timeout=60)
        for log in ("server.log", "operator.log", "prometheus.log"):
            f = work / log
            if f.exists():
                print(f"--- {log} (last 30 lines)\n" + "\n".join(f.read_text(errors="replace").splitlines()[-30:]))
        shutil.rmtree(work, ignore_errors=True)


def prom_query(prometheus: str, query: str) -> list:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]["result"]


def run_browser(console: dict, shots: Path, name: str) -> None:
    """Runs one test of console.test.mjs (playwright-core driving Chromium) and fails with
    its report unless it passed."""
    env = {**os.environ, "QUIVER_CONSOLE": console["base"], "QUIVER_PROMETHEUS": console["prometheus"],
           "QUIVER_NS_A": NS_A, "QUIVER_NS_B": NS_B, "QUIVER_SCREENSHOTS": str(shots)}
    out = subprocess.run(["node", "--test", "--test-reporter=spec", f"--test-name-pattern={name}",
                          "console.test.mjs"], cwd=HERE, env=env, capture_output=True, text=True, timeout=600)
    print(out.stdout, out.stderr)
    assert out.returncode == 0, f"console.test.mjs '{name}' failed (report above)"
    assert "pass 1" in out.stdout, f"console.test.mjs ran no test named '{name}'"


def test_a_user_browses_their_namespace_tries_a_tool_and_sees_a_refusal(console, shots, playwright):
    run_browser(console, shots, "a user browses their namespace")


def test_a_user_without_a_grant_sees_no_server_and_a_forged_form_is_refused(console, shots, playwright):
    run_browser(console, shots, "a user without a grant")
