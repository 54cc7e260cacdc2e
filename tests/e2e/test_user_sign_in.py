"""Each user's own sign-in to an upstream, on kind, with a real browser: an McpServer of two
replicas with `auth.upstreamSignIn` (its vault in Redis) fronts an upstream MCP server that
trusts only its own authorization server, and every user's calls reach it as their own
account there.

- The upstream: go-mcp (official Go SDK) in its token-checking mode, verifying tokens of
  Keycloak's realm `upstream` for the audience `notes-upstream`. It serves its protected
  resource metadata (RFC 9728) and names it in its 401s; its tool `claims` reports the subject
  and expiry of the token each call came with. It lists its tools only to a token of that
  realm: the server's own session carries one of client `notes-lister` (a Secret).
- The ToolSet pins the realm (`identity.issuer`) and its pre-registered client
  `notes-registered` (whose access tokens live 30 s). The realm allows anonymous client
  registration only from 127.0.0.1, which the pods are not.
- Browsers reach the pods at `upstreamSignIn.url`, http://127.0.0.1:PORT: a port-forward on
  that fixed port to the pod that made the link. MCP calls go through port-forwards to one
  pod each; a call after a sign-in goes to the other pod, which finds the token in Redis.

alice (realm `quiver`) signs in upstream as carol, bob as dave, each in a Chromium of their
own; then the Deployment is restarted and their tokens still work (kept in Redis, refreshed
once expired); `kubectl quiver revoke` makes alice sign in again, `sign_out_upstream` bob.
No token, code, state, cookie or link shows in the pods' logs.

Keycloak (scripts/idp.sh) and Redis (scripts/redis.sh) run on this machine, listening on the
kind network's gateway address, as in test_governance.py: the pods and the tests name the
same issuer URL."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import Namespace, eventually, kubectl
from mcp import Client, types
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError
from redis_server import Redis, free_port, gateway_address
from test_governance import audit_records, claims, metrics, token

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "browser"))
from browser import Browser  # noqa: E402

GO_IMAGE = os.environ.get("QUIVER_E2E_GO_MCP_IMAGE", "quiver-e2e/go-mcp:dev")
NAME = "signin"
AUDIENCE = "notes-upstream"
# scripts/idp/realm.json and scripts/idp/upstream-realm.json
BROWSER_CLIENT, BROWSER_SECRET = "quiver-sign-in", "quiver-sign-in-secret-0123456789"
UPSTREAM_CLIENT, UPSTREAM_SECRET = "notes-registered", "notes-registered-secret-0123456789"
LISTER_CLIENT, LISTER_SECRET = "notes-lister", "notes-lister-secret-0123456789"
# Each user of the realm `quiver` and the account they sign in to upstream.
UPSTREAM_ACCOUNT = {"alice": "carol", "bob": "dave"}
# Bound on one MCP exchange through a port-forward (never a pass/fail timing).
PATIENCE = 60


def mcp_server(ns: str, issuer: str, upstream_issuer: str, redis: str, sign_in_port: int) -> dict:
    return {
        "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": NAME},
        "spec": {
            "replicas": 2,
            "auth": {
                "oidc": {"issuer": issuer, "audience": "quiver"},
                "upstreamSignIn": {
                    "url": f"http://127.0.0.1:{sign_in_port}",
                    "keysSecretRef": {"name": "sign-in-keys", "key": "ring"},
                    "browserClient": {"clientId": BROWSER_CLIENT,
                                      "clientSecretRef": {"name": "sign-in-browser", "key": "secret"}},
                    "redis": {"address": redis},
                },
            },
            "audit": {},
            "upstreams": [{
                "name": "notes",
                "http": {"url": f"http://notes.{ns}.svc:8080/mcp",
                         "headers": {"Authorization": "Bearer {{secret.lister.token}}"}},
                "identity": {"mode": "user", "issuer": upstream_issuer,
                             "client": {"id": UPSTREAM_CLIENT, "secret": "{{secret.upstream-client.secret}}"}},
                "tools": {"prefix": "notes_", "include": ["claims"]},
            }],
        },
    }


def upstream(ns: str, upstream_issuer: str) -> list[dict]:
    labels = {"app": "notes"}
    args = ["-http", ":8080", "-issuer", upstream_issuer, "-audience", AUDIENCE,
            "-resource", f"http://notes.{ns}.svc:8080/mcp"]
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "notes"},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {
                 "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [{
                     "name": "go-mcp", "image": GO_IMAGE, "imagePullPolicy": "IfNotPresent", "args": args,
                     "ports": [{"containerPort": 8080}],
                     "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 2},
                     "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                         "capabilities": {"drop": ["ALL"]}},
                 }]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "notes"},
         "spec": {"selector": labels, "ports": [{"port": 8080, "targetPort": 8080}]}},
    ]


class FixedPortForward:
    """`kubectl port-forward` from 127.0.0.1:PORT (a port chosen before the McpServer named it)
    to one pod's MCP port, until stopped."""

    def __init__(self, ns: Namespace, pod: str, port: int):
        self.proc = subprocess.Popen(
            ["kubectl", "-n", ns.name, "port-forward", f"pod/{pod}", "--address", "127.0.0.1", f"{port}:8080"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith(f"Forwarding from 127.0.0.1:{port}"):
            self.stop()
            raise AssertionError(f"port-forward to {pod} on {port}: {line}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)


@dataclass
class Setup:
    ns: Namespace
    env: dict[str, str]
    redis: Redis
    host: str
    sign_in_port: int
    forwards: list[FixedPortForward] = field(default_factory=list)

    @property
    def issuer(self) -> str:
        return self.env["QUIVER_IDP_ISSUER"]

    @property
    def upstream_issuer(self) -> str:
        return self.env["QUIVER_IDP_UPSTREAM_ISSUER"]

    def user_token(self, user: str) -> str:
        """A fresh access token of the realm `quiver` for `user`, addressed to Quiver."""
        return token(self.env["QUIVER_IDP_TOKEN_ENDPOINT"], {
            "grant_type": "password", "client_id": "agent", "username": user, "password": f"{user}-password"})


@pytest.fixture(scope="session")
def chromium() -> str:
    if not os.environ.get("QUIVER_CHROMIUM"):
        out = subprocess.run([str(ROOT / "scripts" / "chromium.sh")], check=True, timeout=900,
                             stdout=subprocess.PIPE, text=True)
        os.environ["QUIVER_CHROMIUM"] = out.stdout.strip().splitlines()[-1]
    return os.environ["QUIVER_CHROMIUM"]


@pytest.fixture
def signin(ns: Namespace, chromium: str, request) -> Iterator[Setup]:  # noqa: ARG001 - chromium installs it
    host = gateway_address()
    tmp = Path(tempfile.mkdtemp(prefix="quiver-e2e-sign-in-"))
    redis: Redis | None = None
    setup: Setup | None = None
    ready = False
    try:
        started = time.monotonic()
        subprocess.run([str(ROOT / "scripts" / "idp.sh"), "start", str(tmp / "idp")], check=True, timeout=900,
                       env={**os.environ, "QUIVER_IDP_HOST": host})
        env = dict(line.split("=", 1) for line in (tmp / "idp" / "env").read_text().split())
        print(f"Keycloak answered at {env['QUIVER_IDP_ISSUER']} after {time.monotonic() - started:.0f} s")
        redis = Redis(host, tmp)
        # The port browsers reach the pods at: chosen now, since the McpServer names it.
        setup = Setup(ns, env, redis, host, free_port("127.0.0.1"))
        upstream_token = env["QUIVER_IDP_UPSTREAM_ISSUER"] + "/protocol/openid-connect/token"
        lister = token(upstream_token, {"grant_type": "client_credentials"}, (LISTER_CLIENT, LISTER_SECRET))
        assert AUDIENCE in claims(lister)["aud"], claims(lister)
        ring = "k1:" + base64.b64encode(os.urandom(32)).decode()
        for name, key, value in [("sign-in-keys", "ring", ring), ("sign-in-browser", "secret", BROWSER_SECRET),
                                 ("upstream-client", "secret", UPSTREAM_SECRET), ("lister", "token", lister)]:
            ns.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {key: value}})
        for obj in upstream(ns.name, setup.upstream_issuer):
            ns.apply(obj)
        ns.apply(mcp_server(ns.name, setup.issuer, setup.upstream_issuer, f"{host}:{redis.port}", setup.sign_in_port))
        ns.wait_condition(NAME, "Ready", "True", 300)
        ns.wait_condition(NAME, "UpstreamsReady", "True", 180)
        ns.ready_pods(NAME, 2)
        ready = True
        yield setup
    finally:
        if setup:
            for f in setup.forwards:
                f.stop()
        if not ready:
            print(ns.dump())  # the `ns` fixture dumps only after a failed test body
        if not ready or getattr(request.node, "failed_call", False):
            print(kubectl("logs", "-n", ns.name, "deploy/notes", "--tail=50", check=False))
        if redis:
            redis.stop()
        subprocess.run([str(ROOT / "scripts" / "idp.sh"), "stop", str(tmp / "idp")], check=False, timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)


# --- MCP ------------------------------------------------------------------------------------


async def _call(port: int, bearer: str, tool: str, args: dict, eliciting: bool):
    async def decline(_context, _params) -> types.ElicitResult:
        return types.ElicitResult(action="decline")

    transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp",
                                       http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {bearer}"}))
    # An elicitation callback makes the client declare elicitation (form and url).
    async with Client(transport, mode="legacy", elicitation_callback=decline if eliciting else None) as c:
        try:
            return await c.call_tool(tool, args)
        except MCPError as e:
            return e


def call(port: int, bearer: str, tool: str, args: dict | None = None, *, eliciting: bool = False):
    """One tools/call in a session of the official client: its result, or the MCPError."""
    return asyncio.run(asyncio.wait_for(_call(port, bearer, tool, args or {}, eliciting), PATIENCE))


def lists_claims(port: int, bearer: str) -> bool:
    """Whether the pod lists the upstream's tool (imported once its session is up) and the
    sign-out tool."""

    async def go() -> bool:
        transport = streamable_http_client(
            f"http://127.0.0.1:{port}/mcp", http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {bearer}"}))
        async with Client(transport, mode="legacy") as c:
            names = {t.name for t in (await c.list_tools(cache_mode="bypass")).tools}
            return {"notes_claims", "sign_out_upstream"} <= names

    try:
        return asyncio.run(asyncio.wait_for(go(), PATIENCE))
    except Exception as e:  # a pod still starting: eventually() reports the last one
        raise AssertionError(f"tools/list: {e!r}") from e


def seen_upstream(result) -> dict:
    """What the upstream's `claims` saw of the token a call came with."""
    assert not isinstance(result, MCPError), result
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


def sign_in_link(result, sign_in_port: int) -> str:
    """The link of a call refused because its user has not signed in (a tool error)."""
    assert not isinstance(result, MCPError), result
    text = result.content[0].text
    assert result.is_error and "Open this link in your browser to sign in" in text, text
    m = re.search(rf"http://127\.0\.0\.1:{sign_in_port}/oauth/start\?t=\S+", text)
    assert m, text
    return m.group(0)


# --- the browser ----------------------------------------------------------------------------


def browser_sign_in(b: Browser, s: Setup, link: str, user: str) -> str:
    """Opens `link`, signs in as `user` at the realm `quiver`, then as their account at the
    realm `upstream` (accepting a consent page if one comes); the text of Quiver's last page."""
    b.open(link)
    signed: list[str] = []
    for _ in range(6):
        url = b.url
        if url.startswith(f"http://127.0.0.1:{s.sign_in_port}/"):
            break
        realm = next((r for r in (s.issuer, s.upstream_issuer) if url.startswith(r + "/")), None)
        assert realm, f"the sign-in left Quiver and Keycloak: {url}: {b.text[:300]}"
        if b.exists("form#kc-form-login input#password"):
            assert realm not in signed, f"Keycloak asked for a password again at {url}: {b.text[:300]}"
            who = user if realm == s.issuer else UPSTREAM_ACCOUNT[user]
            b.fill("input#username", who)
            b.fill("input#password", f"{who}-password")
            b.click("#kc-login", navigate=True)
            signed.append(realm)
        elif b.exists("#kc-oauth [name=accept]"):
            b.click("#kc-oauth [name=accept]", navigate=True)
        else:
            raise AssertionError(f"neither a login nor a consent page at {url}: {b.text[:300]}")
    # The browser proved it is the link's user at the company's realm first, then signed in
    # at the upstream's own.
    assert signed == [s.issuer, s.upstream_issuer], (signed, b.history)
    assert b.url.startswith(f"http://127.0.0.1:{s.sign_in_port}/oauth/callback?"), b.url
    return b.text


def browser_secrets(b: Browser) -> list[str]:
    """What of a sign-in must never be logged: the link's ticket, every code and state the
    browser carried, and the cookies it was given."""
    out = []
    for url in b.history:
        for key, values in urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).items():
            if key in ("t", "code", "state"):
                out += values
    out += [c["value"] for c in b.cookies()]
    return [v for v in out if len(v) >= 12]


# --- the pods -------------------------------------------------------------------------------


def refreshes(ns: Namespace, pods: list[str]) -> float:
    """Refreshes of users' tokens for `notes` that succeeded, over `pods`."""
    key = 'quiver_oauth_refreshes_total{upstream="notes",result="ok"}'
    return sum(metrics(ns, p).get(key, 0) for p in pods)


class Steps:
    """Prints how long each step took (the test's share of a CI run)."""

    def __init__(self):
        self.start = self.last = time.monotonic()

    def done(self, what: str) -> None:
        now = time.monotonic()
        print(f"user sign-in: {what} in {now - self.last:.1f} s ({now - self.start:.0f} s so far)")
        self.last = now


def new_pods(ns: Namespace, old: list[str]) -> list[str]:
    """Waits until two pods of the McpServer are Ready, none of them one of `old`."""

    def probe():
        ready = sorted(
            p["metadata"]["name"] for p in ns.pods(NAME)
            if p["metadata"].get("deletionTimestamp") is None
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])))
        return ready if len(ready) == 2 and not set(ready) & set(old) else None

    return eventually("two new pods Ready after the restart", probe, 300, 1)


def test_each_user_signs_in_upstream_in_a_browser_and_the_tokens_outlive_a_restart(signin: Setup):
    s, ns = signin, signin.ns
    pod_a, pod_b = ns.ready_pods(NAME, 2)
    steps = Steps()
    subjects = {u: claims(s.user_token(u))["sub"] for u in UPSTREAM_ACCOUNT}
    secrets: list[str] = []
    seen: dict[str, dict] = {}
    # Browsers open links at the fixed port: the pod that made them.
    s.forwards.append(FixedPortForward(ns, pod_a, s.sign_in_port))
    with ns.port_forward(f"pod/{pod_a}", 8080) as at_a, ns.port_forward(f"pod/{pod_b}", 8080) as at_b:
        eventually("pod A to list the upstream's tools", lambda: lists_claims(at_a, s.user_token("alice")), 120, 1)
        eventually("pod B to list the upstream's tools", lambda: lists_claims(at_b, s.user_token("alice")), 120, 1)
        for user in ("alice", "bob"):
            bearer = s.user_token(user)
            secrets.append(bearer)
            # 1. The first call answers with a link (a tool error); a client that declared
            # URL elicitation gets URLElicitationRequired with a link instead.
            link = sign_in_link(call(at_a, bearer, "notes_claims"), s.sign_in_port)
            e = call(at_a, bearer, "notes_claims", eliciting=True)
            assert isinstance(e, MCPError) and e.error.code == -32042, e
            elicitation = e.error.data["elicitations"][0]
            assert elicitation["mode"] == "url" and elicitation["elicitationId"], elicitation
            assert elicitation["url"].startswith(f"http://127.0.0.1:{s.sign_in_port}/oauth/start?t="), elicitation
            secrets += [link, elicitation["url"]]
            # 2. The user's own browser opens it and signs in twice.
            with Browser(allow_hosts=(s.host,)) as b:
                page = browser_sign_in(b, s, link, user)
                assert "Signed in to notes" in page, page
                secrets += browser_secrets(b)
            # 3. The retried call, at the other pod, reaches the upstream as the user's
            # account there: the upstream verified a token of its own realm, for itself,
            # issued to the pre-registered client.
            got = seen_upstream(call(at_b, bearer, "notes_claims", {"label": user}))
            assert got["preferred_username"] == UPSTREAM_ACCOUNT[user], got
            assert AUDIENCE in got["aud"] and got["azp"] == UPSTREAM_CLIENT and got["label"] == user, got
            seen[user] = got
            steps.done(f"{user} signed in as {UPSTREAM_ACCOUNT[user]}")
        assert seen["alice"]["sub"] != seen["bob"]["sub"]
        # Each sees their own account, whichever signed in last.
        assert seen_upstream(call(at_a, s.user_token("alice"), "notes_claims"))["sub"] == seen["alice"]["sub"]
        # Both users' tokens are in the Redis (this test's own), under the keys of this
        # McpServer's prefix (`NAMESPACE/NAME/`, as the operator renders it; keys carry its
        # SHA-256, so servers sharing a Redis see nothing of each other's).
        base = "quiver:oauth:v1:" + hashlib.sha256(f"{ns.name}/{NAME}/".encode()).hexdigest()
        assert s.redis.command(b"ZCARD", f"{base}:users".encode()) == b":2\r\n"

        # 4. The access token alice's last call carried expires (they live 30 s); her next
        # call carries a new one, got with her refresh token.
        last = seen_upstream(call(at_b, s.user_token("alice"), "notes_claims"))
        before = refreshes(ns, [pod_a, pod_b])
        eventually("the access token of alice's last call to expire", lambda: time.time() > last["exp"] + 1, 60, 0.5)
        got = seen_upstream(call(at_b, s.user_token("alice"), "notes_claims"))
        assert got["sub"] == seen["alice"]["sub"] and got["exp"] > last["exp"], (got, last)
        assert refreshes(ns, [pod_a, pod_b]) > before
        steps.done("alice's call after her token expired")

    # What the first pods logged and audited (gone after the restart).
    logs = {p: ns.k("logs", p, "-c", "server") for p in (pod_a, pod_b)}
    records = [r for p in (pod_a, pod_b) for r in audit_records(ns, p)]
    signed_in = sorted(r["caller"]["subject"] for r in records if r["event"] == "oauth.sign_in" and r["outcome"] == "ok")
    assert signed_in == sorted(subjects.values()), [r for r in records if r["event"].startswith("oauth.")]
    for f in s.forwards:
        f.stop()

    # 5. A restart of every pod: the users' tokens are in Redis, so no one signs in again.
    ns.k("rollout", "restart", f"deployment/{NAME}")
    pod_c, pod_d = new_pods(ns, [pod_a, pod_b])
    steps.done("both pods replaced")
    with ns.port_forward(f"pod/{pod_c}", 8080) as at_c, ns.port_forward(f"pod/{pod_d}", 8080) as at_d:
        eventually("pod C to list the upstream's tools", lambda: lists_claims(at_c, s.user_token("alice")), 120, 1)
        eventually("pod D to list the upstream's tools", lambda: lists_claims(at_d, s.user_token("alice")), 120, 1)
        for user, at in (("alice", at_c), ("bob", at_d), ("alice", at_d), ("bob", at_c)):
            got = seen_upstream(call(at, s.user_token(user), "notes_claims"))
            assert got["sub"] == seen[user]["sub"], (user, got)
        steps.done("both users' calls through the new pods")

        # 6. An administrator revokes alice: every ready pod is asked, one removes her token.
        subject = f"{s.issuer}|{subjects['alice']}"
        out = subprocess.run(["kubectl", "quiver", "-n", ns.name, "revoke", NAME, "--subject", subject, "-o", "json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr + out.stdout
        revoked = json.loads(out.stdout)
        assert (revoked["removed"], revoked["complete"], revoked["shared"]) == (1, True, True), revoked
        assert sorted(p["name"] for p in revoked["pods"]) == [pod_c, pod_d], revoked
        for at in (at_c, at_d):
            sign_in_link(call(at, s.user_token("alice"), "notes_claims"), s.sign_in_port)
            assert seen_upstream(call(at, s.user_token("bob"), "notes_claims"))["sub"] == seen["bob"]["sub"]

        # 7. bob signs himself out at one pod: that pod asks him to sign in again at once; the
        # other may still use the `Authorization` it keeps warm for at most 10 s with the vault
        # in Redis (docs/upstreams.md), then asks too.
        out = call(at_c, s.user_token("bob"), "sign_out_upstream", {"upstream": "notes"})
        assert not isinstance(out, MCPError) and not out.is_error, out
        assert "Signed out of upstream `notes`" in out.content[0].text, out.content[0].text
        sign_in_link(call(at_c, s.user_token("bob"), "notes_claims"), s.sign_in_port)

        def asks_again():
            r = call(at_d, s.user_token("bob"), "notes_claims")
            return r if not isinstance(r, MCPError) and r.is_error else None

        sign_in_link(eventually("the other pod to ask bob to sign in again", asks_again, 20, 1), s.sign_in_port)
        steps.done("revocation and sign-out")

    # Over every pod's records: a refresh is audited where it happened, before the restart
    # or after it.
    records += [r for p in (pod_c, pod_d) for r in audit_records(ns, p)]
    events = {(r["event"], r.get("caller", {}).get("subject")) for r in records if r["event"].startswith("oauth.")}
    assert {("oauth.revoke", subjects["alice"]), ("oauth.sign_out", subjects["bob"]),
            ("oauth.refresh", subjects["alice"]), ("oauth.refresh", subjects["bob"])} <= events, events

    # 8. Nothing of a token, code, state, cookie or link in any pod's output (logs and audit).
    logs |= {p: ns.k("logs", p, "-c", "server") for p in (pod_c, pod_d)}
    assert len(secrets) > 10, secrets
    for pod, text in logs.items():
        assert '"event":"oauth.' in text, f"{pod}: no audit record of a sign-in step in its output"
        assert "eyJ" not in text, f"{pod} logged something shaped like a JWT"
        for secret in secrets:
            assert secret[-40:] not in text, f"{pod} logged a token, code, state, cookie or link"
