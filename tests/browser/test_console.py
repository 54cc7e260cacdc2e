"""The operator's console in a real browser, against a real API server and Keycloak.

Needs what scripts/operator-it.sh provides: a control plane (KUBECONFIG) with the CRD
installed, and the binaries QUIVER_OPERATOR_BIN and QUIVER_SERVER_BIN. Keycloak is started
for the module (scripts/idp.sh; QUIVER_IDP_ENV reuses a running one).

Two namespaces: `weather` in A, whose McpServer points its catalog URL at a quiver-server
on 127.0.0.1 that checks Keycloak's tokens (1,002 tools: `greet`, `deploy` for the group
`sre` only, and 1,000 more); `secret` in B. A real Prometheus scrapes the server with the
labels a ServiceMonitor gives it (namespace A, service `weather`), for the console's figures. alice may list McpServers in A only; bob
nowhere. A second operator on standby (a Lease held by someone else) serves the console.
Screenshots go to QUIVER_SCREENSHOTS (default: a temporary directory, printed)."""

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
from browser import Browser, keycloak_sign_in

ROOT = Path(__file__).resolve().parents[2]
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


def sign_in(b: Browser, base: str, user: str) -> str:
    done = keycloak_sign_in(b, f"{base}/", user, f"{user}-password")
    assert done.url == f"{base}/", done.history
    # The session is a cookie the page's scripts cannot read; no token reaches the browser.
    # (Keycloak's own cookies share the host 127.0.0.1: only the console's are looked at.)
    ours = {c["name"]: c for c in b.cookies() if c["name"].startswith("quiver_console")}
    assert set(ours) >= {"quiver_console", "quiver_console_site"}, ours
    assert all(c["httpOnly"] for c in ours.values()), ours
    assert ours["quiver_console_site"]["sameSite"] == "Strict", ours
    assert not any("eyJ" in c["value"] for c in ours.values()), ours
    return done.text


def test_a_user_browses_their_namespace_tries_a_tool_and_sees_a_refusal(console, shots):
    console, prometheus = console["base"], console["prometheus"]
    with Browser() as b:
        # Listing catches up with the McpServers just created.
        text = sign_in(b, console, "alice")
        if "weather" not in text:  # the console's watch had not listed yet ("Starting")
            text = wait_until("alice's server listed", lambda: b.open(f"{console}/") and "weather" in b.text and b.text)
        assert NS_A in text and "Forecasts and greetings" in text
        assert "secret" not in text and NS_B not in text, text
        b.screenshot(str(shots / "console-servers.png"))

        # A link on another site (an opaque data: page) opens the server's page signed in, but
        # the same-site cookie stays behind: no listing with alice's token, a link instead.
        link = f"<a id=go href='{console}/servers/{NS_A}/weather'>weather</a>"
        b.open("data:text/html," + urllib.parse.quote(link))
        b.click("#go", navigate=True)
        assert "followed a link from another site" in b.text, b.text[:500]
        assert not b.exists("a[href$='/tools/greet']")
        b.open(f"{console}/")

        # The server page: 1,002 tools listed with alice's own token, timed by the browser.
        b.click(f"a[href='/servers/{NS_A}/weather']", navigate=True)
        assert b.url == f"{console}/servers/{NS_A}/weather"
        assert b.exists("a[href$='/tools/greet']") and b.exists("a[href$='/tools/t0999']")
        rows = b.evaluate("document.querySelectorAll('main table tbody tr').length")
        nav = b.evaluate("JSON.stringify(performance.getEntriesByType('navigation')[0].toJSON())")
        timing = json.loads(nav)
        print(f"server page with 1,002 tools: response {timing['responseEnd'] - timing['requestStart']:.1f} ms, "
              f"loaded {timing['loadEventEnd'] - timing['startTime']:.1f} ms, {timing['transferSize']} bytes")
        (shots / "console-timing.json").write_text(nav)
        # deploy is for the group sre: not among alice's tools, but named under who may call what.
        assert not b.exists("a[href$='/tools/deploy']")
        text = b.text
        assert "callers with a member of sre" in text, text[:2000]
        assert "claude mcp add --transport http weather" in text
        assert rows >= 1002, rows
        b.screenshot(str(shots / "console-server.png"), max_height=1400)

        # Try greet through its form: the call carries alice's token and the result shows.
        b.click("a[href$='/tools/greet']", navigate=True)
        assert b.exists("label[for='arg-name']")
        b.fill("#arg-name", "Alice <b>")
        b.click("form[action$='/tools/greet'] button[type=submit]", navigate=True)
        result = b.wait_for("document.querySelector('#result') && document.querySelector('#result').innerText")
        assert "Hello, Alice <b>!" in result, result
        assert not b.exists("#result b"), "a tool's text must not become markup"
        b.screenshot(str(shots / "console-try-it.png"))

        # deploy, opened by its address: the page says why, and a call gets the server's refusal.
        b.open(f"{console}/servers/{NS_A}/weather/tools/deploy")
        assert "does not list this tool to you" in b.text
        b.click("form[action$='/tools/deploy'] button[type=submit]", navigate=True)
        refusal = b.wait_for("document.querySelector('#result') && document.querySelector('#result').innerText")
        assert "Refused" in refusal and "-32003" in refusal, refusal
        b.screenshot(str(shots / "console-refused.png"))

        # The server's last hour, from Prometheus once it has scraped both calls: greet's call
        # in its row, deploy's refusal under the refusals.
        wait_until("Prometheus has both calls", lambda: prom_query(
            prometheus, 'quiver_dispatch_duration_seconds_count{tool="greet"}') and prom_query(
            prometheus, 'quiver_requests_total{method="tools/call", outcome="forbidden"}'))
        b.open(f"{console}/servers/{NS_A}/weather")
        greet = b.evaluate("[...document.querySelectorAll('main tr')].find(r => r.querySelector(\"a[href$='/tools/greet']\")).innerText")
        cells = greet.split("\t")
        assert cells[-3].strip() == "1" and cells[-2].strip() == "0" and cells[-1].strip().endswith(("µs", "ms")), greet
        refused = b.evaluate("[...document.querySelectorAll('main table')].find(t => t.caption && t.caption.innerText == 'Calls refused').innerText")
        assert "forbidden\t1" in refused, refused
        b.screenshot(str(shots / "console-last-hour.png"), start="#health", max_height=900)

        # B's server is not there for alice, by any address.
        b.open(f"{console}/servers/{NS_B}/secret")
        assert "No such server" in b.text


def test_a_user_without_a_grant_sees_no_server_and_a_forged_form_is_refused(console):
    console = console["base"]
    with Browser() as b:
        text = sign_in(b, console, "bob")
        assert "weather" not in text and "secret" not in text
        assert "may not list McpServers" in text
        b.open(f"{console}/servers/{NS_A}/weather")
        assert "No such server" in b.text
    # A form posted without the session's token (another site's form) calls nothing.
    req = urllib.request.Request(f"{console}/servers/{NS_A}/weather/tools/greet", data=b"name=x", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.url.endswith("/login") or "/realms/" in r.url
