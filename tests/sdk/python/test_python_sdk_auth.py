"""OAuth 2.1 / OIDC access tokens on the real binary, with the official Python SDK client.

A local issuer publishes its discovery document and RSA key set; tokens are minted with PyJWT
(RS256). The server must accept a valid token and refuse, with 401 and a
`WWW-Authenticate` that points at its protected-resource metadata, a missing, expired,
wrongly addressed or foreign token. It must also follow a key rotation by refetching the key set."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import BIN, Issuer, free_port, wait_until
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError


@pytest.fixture()
def guarded(issuer):
    """quiver-server accepting the issuer's tokens for its own URL."""
    assert BIN.exists(), f"build the server first: {BIN}"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-auth-"))
    config = tmp / "tools.yaml"
    config.write_text(
        "tools:\n  - {name: add, handler: {builtin: add}}\n"
        "  - {name: deploy, access: {scopes: [deploy:write], groups: [sre]}, handler: {template: deployed}}\n"
    )
    port, admin = free_port(), free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(
        [str(BIN), "--config", f"file:{config}", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
         "--auth-issuer", issuer.url, "--auth-audience", url, "--auth-resource", url],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=2).status == 200)
        wait_until(lambda: issuer.jwks_fetches > 0)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=5)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def raw_post(url: str, token: str | None):
    req = urllib.request.Request(url, data=b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json, text/event-stream")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


async def add(url: str, token: str):
    transport = streamable_http_client(url, http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}))
    async with Client(transport) as c:
        return await c.call_tool("add", {"a": 40, "b": 2})


async def deploy(url: str, token: str):
    transport = streamable_http_client(url, http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}))
    async with Client(transport) as c:
        try:
            return await c.call_tool("deploy", {})
        except MCPError as e:  # a refusal, as the client reports it
            return e


def test_a_tool_with_access_needs_the_tokens_scopes_and_groups(issuer, guarded):
    """Per-tool authorization from the token's claims, seen by the official client."""
    good = issuer.token("k1", guarded, scope="openid deploy:write", groups=["dev", "sre"])
    r = asyncio.run(deploy(guarded, good))
    assert (r.is_error, r.content[0].text) == (False, "deployed")
    for claims, missing in [
        ({"scope": "openid", "groups": ["sre"]}, ["deploy:write"]),
        ({"scp": ["deploy:write"], "groups": ["dev"]}, []),
        ({}, ["deploy:write"]),
    ]:
        refused = asyncio.run(deploy(guarded, issuer.token("k1", guarded, **claims)))
        assert isinstance(refused, MCPError), refused
        assert refused.code == -32003
        assert refused.data["missingScopes"] == missing
        assert "tool deploy requires" in refused.message
    # On the wire: 403, and a challenge that names the scope to ask for (the step-up flow).
    weak = issuer.token("k1", guarded, scope="openid", groups=["sre"])
    req = urllib.request.Request(
        guarded,
        data=b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"deploy","arguments":{}}}',
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {weak}",
        },
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    metadata_url = guarded.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    assert e.value.code == 403
    assert e.value.headers["WWW-Authenticate"] == (
        f'Bearer realm="mcp", error="insufficient_scope", scope="deploy:write", resource_metadata="{metadata_url}"'
    )


def test_a_valid_access_token_calls_tools_through_the_sdk(issuer, guarded):
    r = asyncio.run(add(guarded, issuer.token("k1", guarded)))
    assert (r.is_error, r.content[0].text) == (False, "42")


def test_refusals_point_at_the_protected_resource_metadata(issuer, guarded):
    status, headers = raw_post(guarded, None)
    assert status == 401
    metadata_url = guarded.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    assert headers["WWW-Authenticate"] == f'Bearer realm="mcp", resource_metadata="{metadata_url}"'
    with urllib.request.urlopen(metadata_url, timeout=5) as r:
        doc = json.load(r)
    assert doc == {
        "resource": guarded,
        "authorization_servers": [issuer.url],
        "bearer_methods_supported": ["header"],
        "scopes_supported": ["deploy:write"],
    }

    stranger = Issuer()
    stranger.add_key("k1")  # same kid, other key: the signature must fail
    now = int(time.time())
    for what, token in [
        ("expired", issuer.token("k1", guarded, exp=now - 600, iat=now - 900)),
        ("not yet valid", issuer.token("k1", guarded, nbf=now + 600)),
        ("another audience", issuer.token("k1", "http://elsewhere/mcp")),
        ("another issuer", issuer.token("k1", guarded, iss="http://evil.example")),
        ("a foreign key", stranger.token("k1", guarded)),
        ("not a JWT", "just-some-opaque-token-value"),
    ]:
        status, headers = raw_post(guarded, token)
        assert status == 401, what
        assert 'error="invalid_token"' in headers["WWW-Authenticate"], what
    stranger.srv.shutdown()
    with pytest.raises(Exception):  # noqa: B017 - the SDK surfaces the 401 as its own error type
        asyncio.run(add(guarded, issuer.token("k1", "http://elsewhere/mcp")))


def test_a_rotated_signing_key_is_fetched_when_first_seen(issuer, guarded):
    fetches = issuer.jwks_fetches
    issuer.add_key("k2")
    r = asyncio.run(add(guarded, issuer.token("k2", guarded)))
    assert (r.is_error, r.content[0].text) == (False, "42")
    assert issuer.jwks_fetches == fetches + 1
    # An unknown kid does not make a fetch per request: at most one per 30 s.
    for _ in range(3):
        assert raw_post(guarded, issuer.token("k1", guarded))[0] == 200
    forged = Issuer()
    forged.add_key("k9")
    for _ in range(3):
        assert raw_post(guarded, forged.token("k9", guarded, iss=issuer.url))[0] == 401
    assert issuer.jwks_fetches == fetches + 1
    forged.srv.shutdown()


def test_an_issuer_with_a_private_ca_is_trusted_through_its_ca_bundle(tmp_path):
    """An issuer inside the organisation, on HTTPS signed by a private CA: its keys are fetched
    only when the server is given that CA (`--auth-issuer-ca-configmap`, here from a dir:
    source, as the kube: source watches the ConfigMap)."""
    from test_python_sdk_tls import issue, make_ca, pem_cert, pem_key, write_secret

    ca = make_ca("issuer CA")
    cert, key = issue(ca, "127.0.0.1", server=True)
    (tmp_path / "issuer.crt").write_bytes(pem_cert(cert))
    (tmp_path / "issuer.key").write_bytes(pem_key(key))
    issuer = Issuer()
    issuer.add_key("k1")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "issuer.crt", tmp_path / "issuer.key")
    issuer.srv.socket = ctx.wrap_socket(issuer.srv.socket, server_side=True)
    issuer.url = issuer.url.replace("http://", "https://")
    secrets = tmp_path / "secrets"
    write_secret(secrets, "configmap:issuer-ca", {"ca.crt": pem_cert(ca[0])})
    config = tmp_path / "tools.yaml"
    config.write_text("tools:\n  - {name: add, handler: {builtin: add}}\n")
    procs = []

    def start(*extra: str) -> str:
        port, admin = free_port(), free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        log = open(tmp_path / f"server-{port}.log", "w")
        procs.append((subprocess.Popen(
            [str(BIN), "--config", f"file:{config}", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
             "--auth-issuer", issuer.url, "--auth-audience", url, "--secrets", f"dir:{secrets}", *extra],
            stdout=log,
            stderr=subprocess.STDOUT,
        ), log))
        wait_until(lambda: urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=2).status == 200)
        return url

    try:
        trusting = start("--auth-issuer-ca-configmap", "issuer-ca")
        wait_until(lambda: issuer.jwks_fetches > 0)
        r = asyncio.run(add(trusting, issuer.token("k1", trusting)))
        assert (r.is_error, r.content[0].text) == (False, "42")
        # Without the CA the issuer's certificate does not verify: no keys, every token refused.
        fetches = issuer.jwks_fetches
        public_roots = start()
        assert raw_post(public_roots, issuer.token("k1", public_roots))[0] == 401
        assert issuer.jwks_fetches == fetches, "the key set was never served to it"
    finally:
        for p, log in procs:
            p.terminate()
            p.wait(timeout=5)
            log.close()
        issuer.srv.shutdown()
