"""Identity to upstreams with a real OpenID provider: Keycloak (scripts/idp.sh) issues tokens
for two users; the official Python client calls quiver-server with them; quiver-server
exchanges each caller's token for one addressed to its upstream (RFC 8693) or forwards it
where it is addressed there already; the upstream, an official-SDK MCP server, checks every
token against the provider's keys and its own audience, and reports whose it was.

The provider is started once for the module (about two minutes on a cold machine); set
QUIVER_IDP_ENV to the `env` file of an instance started with `scripts/idp.sh start DIR` to
reuse it."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

import jwt
import pytest
from conftest import BIN, ROOT, JsonHandler, start_server, stop, wait_until
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

NOTES = Path(__file__).resolve().parent / "servers" / "notes_upstream.py"
AUDIENCE = "notes-upstream"
# The upstream's URL is in agent-forward's tokens (scripts/idp/realm.json), so its port is
# fixed: below the ephemeral range, so that no port handed out by the system can take it.
NOTES_PORT = 24817
NOTES_URL = f"http://127.0.0.1:{NOTES_PORT}/mcp"
# scripts/idp/realm.json
EXCHANGE_CLIENT, EXCHANGE_SECRET = "quiver", "quiver-exchange-secret-0123456789"
# Every user token the tests got: none may appear in the server's log.
ISSUED: list[str] = []


@pytest.fixture(scope="module")
def idp():
    given = os.environ.get("QUIVER_IDP_ENV")
    tmp = None
    if not given:
        tmp = Path(tempfile.mkdtemp(prefix="quiver-idp-"))
        subprocess.run([str(ROOT / "scripts" / "idp.sh"), "start", str(tmp)], check=True, timeout=900)
        given = str(tmp / "env")
    env = dict(line.split("=", 1) for line in Path(given).read_text().split())
    try:
        yield env
    finally:
        if tmp:
            subprocess.run([str(ROOT / "scripts" / "idp.sh"), "stop", str(tmp)], check=False, timeout=60)
            shutil.rmtree(tmp, ignore_errors=True)


def token(idp: dict, form: dict, basic: tuple[str, str] | None = None) -> str:
    req = urllib.request.Request(idp["QUIVER_IDP_TOKEN_ENDPOINT"], data=urllib.parse.urlencode(form).encode())
    if basic:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{basic[0]}:{basic[1]}".encode()).decode())
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)["access_token"]


def user_token(idp: dict, user: str, client: str = "agent") -> str:
    t = token(idp, {"grant_type": "password", "client_id": client, "username": user, "password": f"{user}-password"})
    ISSUED.append(t)
    return t


def claims(t: str) -> dict:
    return jwt.decode(t, options={"verify_signature": False})


class Api(JsonHandler):
    """An API for an http tool: checks the bearer token against the provider's keys and its
    audience, and records whose it was and the X-User header."""

    jwks: jwt.PyJWKClient
    issuer: str
    seen: list

    def do_GET(self):  # noqa: N802 - http.server naming
        auth = self.headers.get("authorization", "")
        try:
            t = auth.removeprefix("Bearer ")
            c = jwt.decode(t, self.jwks.get_signing_key_from_jwt(t), algorithms=["RS256"], audience=AUDIENCE, issuer=self.issuer)
        except jwt.PyJWTError as e:
            self.seen.append({"refused": str(e)})
            self.send_response(401)
            self.end_headers()
            return
        self.seen.append({"sub": c["sub"], "azp": c.get("azp"), "user": self.headers.get("x-user")})
        self.reply_json({"ok": True})


@pytest.fixture(scope="module")
def gateway(idp):
    assert BIN.exists(), f"build the server first: {BIN} (cargo build -p quiver-server)"
    issuer = idp["QUIVER_IDP_ISSUER"]
    tmp = Path(tempfile.mkdtemp(prefix="quiver-identity-"))
    port = NOTES_PORT
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, f"port {port} (the upstream's URL in realm.json) is taken"
    up_log = open(tmp / "upstream.log", "w")  # noqa: SIM115 - the child keeps it open
    upstream = subprocess.Popen([sys.executable, str(NOTES), str(port), issuer, AUDIENCE], stdout=up_log, stderr=subprocess.STDOUT)
    api = type("BoundApi", (Api,), {"jwks": jwt.PyJWKClient(f"{issuer}/protocol/openid-connect/certs"), "issuer": issuer, "seen": []})
    api_srv = ThreadingHTTPServer(("127.0.0.1", 0), api)
    threading.Thread(target=api_srv.serve_forever, daemon=True).start()
    secrets = tmp / "secrets"
    # The server's own credential for the upstream's session: the `quiver` client's service
    # account (client credentials), addressed to the upstream.
    own = token(idp, {"grant_type": "client_credentials"}, (EXCHANGE_CLIENT, EXCHANGE_SECRET))
    for name, key, value in [("own", "token", own), ("exchange", "secret", EXCHANGE_SECRET)]:
        (secrets / name).mkdir(parents=True, exist_ok=True)
        (secrets / name / key).write_text(value)
    url = f"http://127.0.0.1:{port}/mcp"
    config = tmp / "tools.yaml"
    config.write_text(f"""
tools:
  - name: api-whoami
    handler:
      http:
        url: http://127.0.0.1:{api_srv.server_address[1]}/whoami
        headers: {{X-User: "{{{{caller.preferred_username}}}}"}}
        identity: {{mode: exchange, audience: {AUDIENCE}}}
upstreams:
  - name: notes
    http: {{url: "{url}", headers: {{Authorization: "Bearer {{{{secret.own.token}}}}"}}}}
    identity: {{mode: exchange, audience: {AUDIENCE}}}
    tools: {{prefix: x_}}
  - name: notes-forward
    http: {{url: "{url}", headers: {{Authorization: "Bearer {{{{secret.own.token}}}}"}}}}
    identity: {{mode: forward, audience: "{NOTES_URL}"}}
    tools: {{prefix: f_}}
""")
    sp = start_server(
        config,
        tmp / "server.log",
        "--secrets", f"dir:{secrets}",
        "--auth-issuer", issuer,
        "--auth-audience", EXCHANGE_CLIENT,
        "--token-exchange-client-id", EXCHANGE_CLIENT,
        "--token-exchange-client-secret", "exchange.secret",
    )
    sp.api_seen = api.seen
    sp.upstream_log = tmp / "upstream.log"
    try:
        wait_until(lambda: all(u["state"] == "ready" and u["imported"] > 0 for u in sp.status()["upstreams"]), timeout=60)
        yield sp
    finally:
        stop(sp.proc, upstream)
        api_srv.shutdown()
        up_log.close()
        log = (tmp / "server.log").read_text()
        print(log[-4000:])
        print((tmp / "upstream.log").read_text()[-2000:])
        # No token of any kind in the server's log.
        for t in (own, EXCHANGE_SECRET, *ISSUED):
            assert t not in log
        shutil.rmtree(tmp, ignore_errors=True)


async def call(url: str, bearer: str, tool: str):
    transport = streamable_http_client(url, http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {bearer}"}))
    async with Client(transport) as c:
        return await c.call_tool(tool, {})


def test_each_user_reaches_the_upstream_with_an_exchanged_token_of_its_audience(idp, gateway):
    for user in ("alice", "bob"):
        t = user_token(idp, user)
        assert claims(t)["aud"] == EXCHANGE_CLIENT  # addressed to quiver only
        r = asyncio.run(call(gateway.url, t, "x_whoami"))
        assert not r.is_error, r.content[0].text
        seen = json.loads(r.content[0].text)
        # The upstream verified the token (signature, issuer, audience) and saw the user.
        assert seen["sub"] == claims(t)["sub"]
        assert seen["preferred_username"] == user
        assert AUDIENCE in ([seen["aud"]] if isinstance(seen["aud"], str) else seen["aud"])
        assert seen["azp"] == EXCHANGE_CLIENT  # issued to quiver on the user's behalf


def test_a_token_is_forwarded_only_when_addressed_to_the_upstream(idp, gateway):
    narrow = user_token(idp, "alice")
    r = asyncio.run(call(gateway.url, narrow, "f_whoami"))
    assert r.is_error and f"does not list `{NOTES_URL}` in `aud`" in r.content[0].text
    wide = user_token(idp, "alice", client="agent-forward")
    r = asyncio.run(call(gateway.url, wide, "f_whoami"))
    assert not r.is_error, r.content[0].text
    seen = json.loads(r.content[0].text)
    assert (seen["sub"], seen["azp"]) == (claims(wide)["sub"], "agent-forward")  # the caller's own token


def test_an_http_tool_gets_an_exchanged_token_and_the_callers_claims(idp, gateway):
    t = user_token(idp, "bob")
    before = len(gateway.api_seen)
    r = asyncio.run(call(gateway.url, t, "api-whoami"))
    assert not r.is_error, r.content[0].text
    assert gateway.api_seen[before:] == [{"sub": claims(t)["sub"], "azp": EXCHANGE_CLIENT, "user": "bob"}]


def test_a_refused_exchange_is_a_tool_error_not_the_servers_credential(idp, gateway):
    """An audience the provider will not issue to quiver: the call fails naming the exchange,
    and nothing reaches the upstream in its place (no fallback to the server's credential)."""
    t = user_token(idp, "alice")
    config = gateway.config.read_text()
    gateway.config.write_text(config.replace(f"audience: {AUDIENCE}}}\n    tools: {{prefix: x_}}", "audience: no-such-client}\n    tools: {prefix: x_}"))
    try:
        refused = "token exchange for audience `no-such-client` failed: the issuer refused (HTTP 400"
        wait_until(lambda: refused in asyncio.run(call(gateway.url, t, "x_whoami")).content[0].text, timeout=60)
        r = asyncio.run(call(gateway.url, t, "x_whoami"))
        assert r.is_error and t not in r.content[0].text
    finally:
        gateway.config.write_text(config)
        wait_until(lambda: not asyncio.run(call(gateway.url, t, "x_whoami")).is_error, timeout=60)
