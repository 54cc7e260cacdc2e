"""Governance on a real kind cluster with a real OpenID provider and a real Redis: one
McpServer of two replicas that authenticates callers with Keycloak, exchanges their tokens
for the upstream's audience, applies a CEL policy, counts a shared rate limit in Redis and
writes the audit trail.

- alice's call reaches an upstream MCP server in the cluster (go-mcp, official Go SDK, in its
  token-checking mode) with a token Keycloak exchanged for hers: the upstream verified it
  against Keycloak's keys and its own audience, and reports alice's subject;
- bob is denied by a policy on an argument, and the tool is not in his tools/list;
- loadgen.py drives calls through a NodePort (kube-proxy spreads its connections over both
  replicas) at a tool with `rate: R/s, shared: true`: the calls admitted stay within what one
  budget allows over the run, and come close to it (the other calls are refused with 429);
- every one of those calls has exactly one audit record in the pods' stdout, with its
  outcome, and quiver_audit_dropped_total stays 0.

Keycloak (scripts/idp.sh) and Redis (scripts/redis.sh) run on this machine, listening on the
kind network's gateway address: the pods reach them there, and so do the tests, so the
issuer URL (the tokens' `iss`) is the same for both.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Namespace, eventually, kubectl
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError
from redis_server import Redis, gateway_address

ROOT = Path(__file__).resolve().parents[2]
LOADGEN = Path(__file__).with_name("loadgen.py")
GO_IMAGE = os.environ.get("QUIVER_E2E_GO_MCP_IMAGE", "quiver-e2e/go-mcp:dev")
NODE_PORT = 30080
AUDIENCE = "notes-upstream"
# scripts/idp/realm.json
EXCHANGE_CLIENT, EXCHANGE_SECRET = "quiver", "quiver-exchange-secret-0123456789"
RATE, BURST = 20, 20  # the shared limit: RATE calls a second, BURST at once from idle
LOAD_SECONDS = 10


def host_port() -> int:
    """The 127.0.0.1 port kind maps to the control-plane node's NODE_PORT."""
    cluster = os.environ.get("QUIVER_CLUSTER", "quiver-e2e")
    out = subprocess.run(["docker", "port", f"{cluster}-control-plane", f"{NODE_PORT}/tcp"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return int(out.strip().splitlines()[0].rsplit(":", 1)[1])


def token(endpoint: str, form: dict, basic: tuple[str, str] | None = None) -> str:
    req = urllib.request.Request(endpoint, data=urllib.parse.urlencode(form).encode())
    if basic:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{basic[0]}:{basic[1]}".encode()).decode())
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)["access_token"]


def claims(jwt: str) -> dict:
    payload = jwt.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def mcp_server(issuer: str, redis: str) -> dict:
    return {
        "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "gov"},
        "spec": {
            "replicas": 2,
            "auth": {
                "oidc": {"issuer": issuer, "audience": EXCHANGE_CLIENT},
                "tokenExchange": {"clientId": EXCHANGE_CLIENT, "clientSecretRef": {"name": "exchange", "key": "secret"}},
            },
            "limitsRedis": {"address": redis, "timeout": "500ms"},
            "audit": {},
            "policies": [{
                # Only alice, and never with the label `forbidden`: bob can call it with no
                # arguments at all, so it is hidden from his tools/list.
                "name": "alice-unforbidden",
                "expression": "caller.claims.preferred_username == 'alice' && args.label != 'forbidden'",
                "tools": ["notes_claims"],
            }],
            "tools": [
                {"name": "add", "description": "Adds two numbers, at a rate shared by every replica.",
                 "limits": [{"rate": f"{RATE}/s", "burst": BURST, "per": "all", "shared": True}],
                 "handler": {"builtin": "add"}},
                {"name": "ping", "description": "Answers pong.", "handler": {"template": "pong"}},
            ],
            "upstreams": [{
                "name": "notes",
                "http": {"url": "http://notes.{ns}.svc:8080/mcp",
                         "headers": {"Authorization": "Bearer {{secret.own.token}}"}},
                "identity": {"mode": "exchange", "audience": AUDIENCE},
                "tools": {"prefix": "notes_", "include": ["claims", "echo"]},
            }],
        },
    }


def upstream(issuer: str) -> list[dict]:
    labels = {"app": "notes"}
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "notes"},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {
                 "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [{
                     "name": "go-mcp", "image": GO_IMAGE, "imagePullPolicy": "IfNotPresent",
                     "args": ["-http", ":8080", "-issuer", issuer, "-audience", AUDIENCE],
                     "ports": [{"containerPort": 8080}],
                     "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 2},
                     "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                         "capabilities": {"drop": ["ALL"]}},
                 }]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "notes"},
         "spec": {"selector": labels, "ports": [{"port": 8080, "targetPort": 8080}]}},
    ]


class Setup:
    def __init__(self, ns: Namespace, issuer: str, redis: Redis, token_endpoint: str):
        self.ns, self.issuer, self.redis, self.token_endpoint = ns, issuer, redis, token_endpoint

    def user_token(self, user: str) -> str:
        return token(self.token_endpoint, {"grant_type": "password", "client_id": "agent", "username": user,
                                           "password": f"{user}-password"})


@pytest.fixture(scope="module")
def gov() -> Iterator[Setup]:
    host = gateway_address()
    tmp = Path(tempfile.mkdtemp(prefix="quiver-e2e-gov-"))
    started = time.monotonic()
    name = f"e2e-governance-{uuid.uuid4().hex[:5]}"
    ns = Namespace(name)
    redis: Redis | None = None
    ok = False
    try:
        subprocess.run([str(ROOT / "scripts" / "idp.sh"), "start", str(tmp / "idp")], check=True, timeout=900,
                       env={**os.environ, "QUIVER_IDP_HOST": host})
        env = dict(line.split("=", 1) for line in (tmp / "idp" / "env").read_text().split())
        print(f"Keycloak answered at {env['QUIVER_IDP_ISSUER']} after {time.monotonic() - started:.0f} s")
        redis = Redis(host, tmp)
        kubectl("create", "namespace", name)
        issuer = env["QUIVER_IDP_ISSUER"]
        # The server's own credential for the upstream's session (initialize, tools/list): the
        # `quiver` client's service account, whose tokens Keycloak addresses to the upstream.
        own = token(env["QUIVER_IDP_TOKEN_ENDPOINT"], {"grant_type": "client_credentials"}, (EXCHANGE_CLIENT, EXCHANGE_SECRET))
        for secret, key, value in [("own", "token", own), ("exchange", "secret", EXCHANGE_SECRET)]:
            ns.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret}, "stringData": {key: value}})
        for obj in upstream(issuer):
            ns.apply(obj)
        spec = json.loads(json.dumps(mcp_server(issuer, f"{host}:{redis.port}")).replace("{ns}", name))
        ns.apply(spec)
        ns.wait_condition("gov", "Ready", "True", 300)
        ns.wait_condition("gov", "UpstreamsReady", "True", 180)
        ns.ready_pods("gov", 2)
        yield Setup(ns, issuer, redis, env["QUIVER_IDP_TOKEN_ENDPOINT"])
        ok = True
    finally:
        if not ok:
            print(ns.dump())
            print(kubectl("logs", "-n", name, "deploy/notes", "--tail=50", check=False))
        kubectl("delete", "namespace", name, "--wait=false", check=False)
        if redis:
            redis.stop()
        subprocess.run([str(ROOT / "scripts" / "idp.sh"), "stop", str(tmp / "idp")], check=False, timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)


async def session(url: str, bearer: str, calls: list[tuple[str, dict]]) -> tuple[set[str], list]:
    """tools/list and the calls, in one session of the official client with this token."""
    transport = streamable_http_client(url, http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {bearer}"}))
    async with Client(transport, mode="legacy") as c:
        tools = {t.name for t in (await c.list_tools(cache_mode="bypass")).tools}
        results = []
        for name, args in calls:
            try:
                results.append(await c.call_tool(name, args))
            except MCPError as e:
                results.append(e)
        return tools, results


def test_alice_reaches_the_upstream_with_an_exchanged_token_of_its_audience(gov: Setup):
    alice = gov.user_token("alice")
    assert claims(alice)["aud"] == EXCHANGE_CLIENT  # addressed to quiver only
    with gov.ns.port_forward("svc/gov", 8080) as port:
        tools, (seen, forbidden) = asyncio.run(session(
            f"http://127.0.0.1:{port}/mcp", alice,
            [("notes_claims", {"label": "mine"}), ("notes_claims", {"label": "forbidden"})]))
    assert {"notes_claims", "notes_echo", "add", "ping"} <= tools, tools
    assert not seen.is_error, seen.content[0].text
    got = json.loads(seen.content[0].text)
    # go-mcp verified the token (signature against Keycloak's keys, issuer, audience, expiry)
    # before the call ran: it came for alice, addressed to the upstream, issued to quiver.
    assert got["sub"] == claims(alice)["sub"] and got["preferred_username"] == "alice", got
    assert AUDIENCE in ([got["aud"]] if isinstance(got["aud"], str) else got["aud"]), got
    assert (got["azp"], got["label"]) == (EXCHANGE_CLIENT, "mine"), got
    # The argument half of the policy holds for alice too.
    assert isinstance(forbidden, MCPError) and forbidden.error.code == -32003, forbidden
    assert "policy `alice-unforbidden` does not allow this call of tool notes_claims" in forbidden.error.message


def test_bob_is_denied_by_the_policy_and_does_not_see_the_tool(gov: Setup):
    bob = gov.user_token("bob")
    before = upstream_refusals(gov.ns)
    with gov.ns.port_forward("svc/gov", 8080) as port:
        tools, (denied, echo) = asyncio.run(session(
            f"http://127.0.0.1:{port}/mcp", bob, [("notes_claims", {"label": "mine"}), ("notes_echo", {"text": "hi"})]))
    assert "notes_claims" not in tools and {"notes_echo", "add", "ping"} <= tools, tools
    assert isinstance(denied, MCPError) and denied.error.code == -32003, denied
    assert "policy `alice-unforbidden` does not allow this call of tool notes_claims" in denied.error.message
    # bob's other call of the same upstream goes through, as bob, with his exchanged token.
    assert (echo.is_error, echo.content[0].text) == (False, "hi")
    assert upstream_refusals(gov.ns) == before  # the upstream refused no token


def upstream_refusals(ns: Namespace) -> int:
    return ns.k("logs", "deploy/notes").count("refused a token")


def metrics(ns: Namespace, pod: str) -> dict[str, float]:
    text = kubectl("get", "--raw", f"/api/v1/namespaces/{ns.name}/pods/{pod}:9090/proxy/metrics")
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def audit_records(ns: Namespace, pod: str) -> list[dict]:
    """The pod's audit records: the JSON lines of its server container that have `event`."""
    records = []
    for line in ns.k("logs", pod, "-c", "server").splitlines():
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "event" in record:
                records.append(record)
    return records


def add_works(port: int, bearer: str) -> bool:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "ping", "arguments": {}}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=body, headers={
        "content-type": "application/json", "accept": "application/json, text/event-stream",
        "authorization": f"Bearer {bearer}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())["result"]["content"][0]["text"] == "pong"
    except OSError:
        return False


def test_a_shared_limit_holds_across_two_replicas_and_every_call_is_audited(gov: Setup):
    ns = gov.ns
    alice = gov.user_token("alice")
    selector = ns.get("svc", "gov")["spec"]["selector"]

    def create_service() -> bool:
        ns.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gov-nodeport"},
                  "spec": {"type": "NodePort", "selector": selector,
                           "ports": [{"name": "mcp", "port": 8080, "targetPort": 8080, "nodePort": NODE_PORT}]}})
        return True

    # The NodePort is free once an earlier test's namespace is gone.
    eventually(f"NodePort {NODE_PORT} to be free for this test", create_service, 180, 1)
    port = host_port()
    eventually("the NodePort answers on 127.0.0.1", lambda: add_works(port, alice), 120)
    pods = [p["metadata"]["name"] for p in ns.pods("gov")]
    assert len(pods) == 2
    before = {p: sum(1 for r in audit_records(ns, p) if r.get("tool") == "add") for p in pods}
    assert before == {p: 0 for p in pods}

    # 16 keep-alive connections, each sending its next call as soon as the last is answered.
    started = time.monotonic()
    load = subprocess.run(
        [sys.executable, str(LOADGEN), "--port", str(port), "--connections", "16", "--interval", "0",
         "--duration", str(LOAD_SECONDS)],
        capture_output=True, text=True, timeout=LOAD_SECONDS + 120,
        env={**os.environ, "QUIVER_LOADGEN_AUTHORIZATION": f"Bearer {alice}"},
    )
    elapsed = time.monotonic() - started
    summary = json.loads(load.stdout.strip().splitlines()[-1])
    print(json.dumps({"scenario": "shared limit, 2 replicas", "elapsed_s": round(elapsed, 2), **summary}))
    calls, admitted = summary["requests"], summary["ok"]
    refused = summary["failures"].get("http_429", 0)
    # Every call was answered: admitted, or refused by the limit with 429; nothing else.
    assert admitted + refused == calls and summary["failed"] == refused, summary
    # One budget for both replicas: at most BURST plus RATE a second over the whole run
    # (two budgets would let about twice that through), and the rate is given (the load
    # keeps the budget empty, so nearly all of it is used).
    assert admitted <= BURST + RATE * elapsed + 1, (admitted, elapsed)
    assert admitted >= 0.8 * RATE * LOAD_SECONDS, (admitted, elapsed)
    assert refused > admitted, "the load did not exceed the limit"

    # The audit trail: one record per call, on the replica that answered, with its outcome.
    def all_recorded() -> dict[str, list[dict]] | None:
        records = {p: [r for r in audit_records(ns, p) if r.get("tool") == "add"] for p in pods}
        return records if sum(len(r) for r in records.values()) >= calls else None

    records = eventually("an audit record for every call", all_recorded, 60, 1)
    outcomes = Counter(r["outcome"] for rs in records.values() for r in rs)
    assert sum(outcomes.values()) == calls, (outcomes, calls)
    assert outcomes == Counter({"ok": admitted, "rate_limited": refused}), (outcomes, admitted, refused)
    assert all(r["caller"]["subject"] == claims(alice)["sub"] for rs in records.values() for r in rs)
    # Both replicas served calls, and counted against the one budget in Redis: no check failed.
    assert all(len(rs) > 0 for rs in records.values()), {p: len(rs) for p, rs in records.items()}
    for p in pods:
        m = metrics(ns, p)
        assert m["quiver_audit_dropped_total"] == 0, p
        failures = {k: v for k, v in m.items() if k.startswith("quiver_limits_shared_failures_total")}
        assert len(failures) == 3 and not any(failures.values()), (p, failures)
    # Every call of `add` was decided by the script in Redis (its keys expire as soon as the
    # budget is full again, so the count is what remains to see): one EVALSHA a call, and at
    # most one more per replica refused as NOSCRIPT before its first SCRIPT LOAD.
    stats = gov.redis.command(b"INFO", b"commandstats").decode()
    evalsha = re.search(r"cmdstat_evalsha:calls=(\d+)", stats)
    assert evalsha and calls <= int(evalsha.group(1)) <= calls + len(pods), (stats, calls)
