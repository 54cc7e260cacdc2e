"""Tool search seen by the official Python client: `tools/list` shows the core tools and
`find_tools`; `find_tools` returns the matching tools this caller may see, with their schemas;
a found tool is called by name with every check of a listed one (schema, policy)."""

from __future__ import annotations

import asyncio
import json
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
from test_python_sdk_auth import Issuer

TOOLS = """
toolSearch: {coreTools: [echo], defaultLimit: 3, maxLimit: 5}
policies:
  - {name: platform-only, expression: "caller.claims.department == 'platform'", tools: [delete_pod]}
tools:
  - {name: echo, handler: {builtin: echo}}
  - name: list_pods
    description: List the pods of a namespace.
    input: {namespace: string}
    handler: {template: 'pods of {{namespace}}'}
  - name: delete_pod
    description: Delete one pod.
    input: {namespace: string, pod: string}
    handler: {template: 'deleted {{namespace}}/{{pod}}'}
  - name: get_weather
    description: Current weather for a city.
    input: {city: string}
    handler: {template: 'sunny in {{city}}'}
"""


@pytest.fixture()
def issuer():
    i = Issuer()
    i.add_key("k1")
    yield i
    i.srv.shutdown()


@pytest.fixture()
def searching(issuer):
    assert BIN.exists(), f"build the server first: {BIN}"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-search-"))
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


async def call(c, name: str, args: dict):
    try:
        return await c.call_tool(name, args)
    except MCPError as e:
        return e


def found(result) -> list[str]:
    assert not result.is_error, result.content[0].text
    assert json.loads(result.content[0].text) == result.structured_content
    return [t["name"] for t in result.structured_content["tools"]]


def test_list_then_find_then_call(issuer, searching):
    alice = issuer.token("k1", searching, sub="alice", department="platform")

    async def as_alice(c):
        listed = (await c.list_tools(cache_mode="bypass")).tools
        hits = await c.call_tool("find_tools", {"query": "remove a pod"})
        more = await c.call_tool("find_tools", {"query": "pods", "limit": 5})
        bad_limit = await call(c, "find_tools", {"query": "pods", "limit": 6})
        done = await c.call_tool("delete_pod", {"namespace": "dev", "pod": "web-1"})
        bad = await c.call_tool("delete_pod", {"namespace": "dev"})
        return listed, hits, more, bad_limit, done, bad

    listed, hits, more, bad_limit, done, bad = asyncio.run(session(searching, alice, as_alice))
    assert [t.name for t in listed] == ["echo", "find_tools"]
    finder = listed[1]
    assert finder.input_schema["required"] == ["query"] and finder.input_schema["properties"]["limit"]["maximum"] == 5
    assert found(hits)[0] == "delete_pod"
    first = hits.structured_content["tools"][0]
    assert first["description"] == "Delete one pod." and sorted(first["inputSchema"]["required"]) == ["namespace", "pod"]
    assert sorted(found(more)) == ["delete_pod", "list_pods"]
    assert bad_limit.is_error and "limit" in bad_limit.content[0].text
    assert (done.is_error, done.content[0].text) == (False, "deleted dev/web-1")
    assert bad.is_error and "pod" in bad.content[0].text


def test_find_tools_never_reveals_what_the_caller_cannot_see(issuer, searching):
    bob = issuer.token("k1", searching, sub="bob", department="sales")

    async def as_bob(c):
        hits = await c.call_tool("find_tools", {"query": "delete a pod"})
        refused = await call(c, "delete_pod", {"namespace": "dev", "pod": "web-1"})
        return hits, refused

    hits, refused = asyncio.run(session(searching, bob, as_bob))
    assert "delete_pod" not in found(hits)
    assert found(hits) == ["list_pods"]
    assert isinstance(refused, MCPError) and refused.code == -32003
    assert refused.data == {"tool": "delete_pod", "policy": "platform-only"}
