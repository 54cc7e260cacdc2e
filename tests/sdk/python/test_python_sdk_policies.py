"""CEL policies over the claims of verified access tokens, seen by the official Python client.

Two users with tokens from a local issuer (RS256, PyJWT): a policy reads their `department`
claim, `sub`, `azp` and an argument. The platform user may restart in `dev` but not in
`prod`; the other user may not restart at all and does not see the tool in `tools/list`."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest
from conftest import BIN, free_port, wait_until
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError

TOOLS = """
policies:
  - name: platform-outside-prod
    expression: "caller.claims.department == 'platform' && args.namespace != 'prod'"
    tools: [restart]
  - name: known-clients
    expression: "caller.clientId in ['agent', 'cli'] && caller.subject != ''"
tools:
  - {name: add, handler: {builtin: add}}
  - name: restart
    input: {namespace: string}
    handler: {template: 'restarted {{namespace}}'}
"""


@pytest.fixture()
def governed(issuer):
    assert BIN.exists(), f"build the server first: {BIN}"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-policy-"))
    (tmp / "tools.yaml").write_text(TOOLS)
    port, admin = free_port(), free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(
        [str(BIN), "--config", f"file:{tmp / 'tools.yaml'}", "--listen", f"127.0.0.1:{port}",
         "--admin-listen", f"127.0.0.1:{admin}", "--auth-issuer", issuer.url, "--auth-audience", url],
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


async def session(url: str, token: str, work):
    transport = streamable_http_client(url, http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}))
    async with Client(transport) as c:
        return await work(c)


async def names(c) -> list[str]:
    return [t.name for t in (await c.list_tools(cache_mode="bypass")).tools]


async def restart(c, namespace: str):
    try:
        return await c.call_tool("restart", {"namespace": namespace})
    except MCPError as e:
        return e


def test_claims_and_arguments_decide_calls_and_listing(issuer, governed):
    alice = issuer.token("k1", governed, sub="alice", azp="agent", department="platform")
    bob = issuer.token("k1", governed, sub="bob", azp="agent", department="sales")

    async def as_alice(c):
        return await names(c), await restart(c, "dev"), await restart(c, "prod")

    listed, dev, prod = asyncio.run(session(governed, alice, as_alice))
    assert listed == ["add", "restart"]
    assert (dev.is_error, dev.content[0].text) == (False, "restarted dev")
    assert isinstance(prod, MCPError) and prod.code == -32003
    assert prod.message == "Forbidden: policy `platform-outside-prod` does not allow this call of tool restart"
    assert prod.data == {"tool": "restart", "policy": "platform-outside-prod"}

    async def as_bob(c):
        return await names(c), await restart(c, "dev")

    listed, dev = asyncio.run(session(governed, bob, as_bob))
    assert listed == ["add"]
    assert isinstance(dev, MCPError) and dev.data["policy"] == "platform-outside-prod"

    # An unknown client id: the policy on every tool hides them all and refuses `add`.
    stranger = issuer.token("k1", governed, sub="carol", azp="scraper", department="platform")

    async def as_stranger(c):
        try:
            r = await c.call_tool("add", {"a": 1, "b": 2})
        except MCPError as e:
            r = e
        return await names(c), r

    listed, r = asyncio.run(session(governed, stranger, as_stranger))
    assert listed == []
    assert isinstance(r, MCPError) and r.data == {"tool": "add", "policy": "known-clients"}
