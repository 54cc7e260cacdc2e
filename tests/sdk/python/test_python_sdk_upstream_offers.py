"""quiver-server fronting the resources, resource templates and prompts of two MCP servers
written with the official Python SDK (one over stdio, one over Streamable HTTP) that list the
same URIs and prompt names: driven by the official Python client in both protocol eras."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import mcp_types as types
import pytest
from conftest import BIN, start_server, free_port, stop, wait_until
from mcp import Client
from mcp.shared.exceptions import MCPError

UPSTREAM = Path(__file__).resolve().parent / "servers" / "library_upstream.py"
TOKEN = "library-token-0123456789abcdef"


def config(http_url: str) -> str:
    return f"""
server: {{name: gateway}}
resources:
  - {{uri: "file:///local.md", name: local, text: "local text"}}
prompts:
  - {{name: local-prompt, messages: [{{role: user, text: "local"}}]}}
policies:
  - name: no-beta-chapters
    expression: "false"
    resources: ["beta+book://*"]
upstreams:
  - name: alpha
    stdio:
      command: [{sys.executable}, {UPSTREAM}, alpha, stdio]
      env: {{LIBRARY_TOKEN: "{{{{secret.lib.token}}}}"}}
    tools: {{prefix: a_}}
    resources: {{exclude: ["file:///leak*"]}}
    prompts: {{}}
  - name: beta
    http:
      url: {http_url}
      headers: {{Authorization: "Bearer {{{{secret.lib.token}}}}"}}
    tools: {{prefix: b_}}
    resources: {{}}
    prompts: {{prefix: beta_}}
"""


@pytest.fixture()
def gateway():
    assert BIN.exists(), f"build the server first: {BIN} (cargo build -p quiver-server)"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-offers-"))
    port = free_port()
    log = open(tmp / "upstream.log", "w")
    env = {**os.environ, "LIBRARY_TOKEN": TOKEN}
    upstream = subprocess.Popen([sys.executable, str(UPSTREAM), "beta", "http", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
    path = tmp / "tools.yaml"
    path.write_text(config(f"http://127.0.0.1:{port}/mcp"))
    sp = start_server(path, tmp / "server.log", "--secrets", "env", env={**os.environ, "QUIVER_SECRET_LIB_TOKEN": TOKEN})
    try:
        wait_until(lambda: all(u["state"] == "ready" and u["resources"] > 0 and u["prompts"] > 0 for u in sp.status()["upstreams"]), timeout=30)
        yield sp
    finally:
        stop(sp.proc, upstream)
        log.close()
        print((tmp / "server.log").read_text()[-4000:])
        shutil.rmtree(tmp, ignore_errors=True)


async def text_of(c: Client, uri: str) -> str:
    r = await c.read_resource(uri)
    assert [str(x.uri) for x in r.contents] == [uri]
    return r.contents[0].text


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_two_upstreams_resources_and_prompts_are_served_apart(gateway, mode):
    async def run():
        async with Client(gateway.url, mode=mode) as c:
            uris = sorted(str(r.uri) for r in (await c.list_resources(cache_mode="bypass")).resources)
            assert uris == [
                "alpha+file:///guide.md",
                "beta+file:///guide.md",
                "beta+file:///leak.txt",
                "file:///local.md",
            ]
            templates = sorted(t.uri_template for t in (await c.list_resource_templates(cache_mode="bypass")).resource_templates)
            assert templates == ["alpha+book://{title}/chapter/{n}", "beta+book://{title}/chapter/{n}"]
            # The same URI at two upstreams: each read goes to its own.
            assert await text_of(c, "alpha+file:///guide.md") == "# alpha guide, edition 1"
            assert await text_of(c, "beta+file:///guide.md") == "# beta guide, edition 1"
            assert await text_of(c, "alpha+book://dune/chapter/3") == "alpha: dune, chapter 3"
            assert await text_of(c, "file:///local.md") == "local text"
            # The upstream's Secret value never reaches the client.
            leaked = await text_of(c, "beta+file:///leak.txt")
            assert TOKEN not in leaked and "[redacted]" in leaked, leaked
            # A URI the filter leaves out is not read, listed or not.
            with pytest.raises(MCPError):
                await c.read_resource("alpha+file:///leak.txt")
            # Policies select an upstream's resources by their served URI.
            with pytest.raises(MCPError, match="no-beta-chapters"):
                await c.read_resource("beta+book://dune/chapter/1")

            prompts = {p.name: p for p in (await c.list_prompts(cache_mode="bypass")).prompts}
            assert set(prompts) == {"local-prompt", "summarize", "beta_summarize"}
            assert [(a.name, a.required) for a in prompts["beta_summarize"].arguments] == [("text", True), ("style", False)]
            r = await c.get_prompt("beta_summarize", {"text": "a long story"})
            assert r.messages[0].role == "user" and r.messages[0].content.text == "[beta] Summarize (short): a long story"
            assert TOKEN not in r.messages[1].content.text and "[redacted]" in r.messages[1].content.text
            r = await c.get_prompt("summarize", {"text": "t", "style": "long"})
            assert r.messages[0].content.text == "[alpha] Summarize (long): t"
            with pytest.raises(MCPError, match="Missing required argument"):
                await c.get_prompt("summarize", {})

    asyncio.run(run())


def test_updates_and_list_changes_of_an_upstream_reach_subscribers(gateway):
    async def run():
        seen: list[tuple[str, str]] = []
        arrived = asyncio.Event()

        async def on_message(m):
            method = getattr(m, "method", None) or getattr(getattr(m, "root", None), "method", None)
            if method:
                params = getattr(m, "params", None)
                seen.append((method, str(getattr(params, "uri", "")) if params else ""))
                arrived.set()

        async def wait_for(method: str, uri: str = ""):
            for _ in range(200):
                if (method, uri) in seen:
                    return
                arrived.clear()
                await asyncio.wait_for(arrived.wait(), 10)
            raise AssertionError(f"{method} {uri} never came: {seen}")

        async with Client(gateway.url, mode="legacy", message_handler=on_message) as c:
            await c.subscribe_resource("alpha+file:///guide.md")
            r = await c.call_tool("a_new_edition", {})
            assert not r.is_error, r
            await wait_for("notifications/resources/updated", "alpha+file:///guide.md")
            assert await text_of(c, "alpha+file:///guide.md") == "# alpha guide, edition 2"
            # The other upstream's guide was not subscribed to: not told.
            r = await c.call_tool("b_new_edition", {})
            assert not r.is_error, r
            assert ("notifications/resources/updated", "beta+file:///guide.md") not in seen

            r = await c.call_tool("a_add_appendix", {})
            assert not r.is_error, r
            await wait_for("notifications/resources/list_changed")
            await wait_for("notifications/prompts/list_changed")
            uris = [str(x.uri) for x in (await c.list_resources(cache_mode="bypass")).resources]
            assert "alpha+file:///appendix.md" in uris
            names = [p.name for p in (await c.list_prompts(cache_mode="bypass")).prompts]
            assert "translate" in names
            r = await c.get_prompt("translate", {"text": "hola"})
            assert r.messages[0].content.text == "Translate: hola"

    asyncio.run(run())


def test_2026_listens_get_an_upstreams_updates(gateway):
    async def run():
        async with Client(gateway.url, mode="auto") as c:
            assert c.protocol_version == "2026-07-28"
            async with c.listen(resource_subscriptions=["alpha+file:///guide.md"]) as sub:
                r = await c.call_tool("a_new_edition", {})
                assert not r.is_error, r
                event = await asyncio.wait_for(sub.__anext__(), 10)
                assert "alpha+file:///guide.md" in repr(event), event

    asyncio.run(run())


def test_a_subscription_no_upstream_serves_is_refused(gateway):
    async def run():
        async with Client(gateway.url, mode="legacy") as c:
            for uri in ["gamma+file:///guide.md", "alpha+file:///leak.txt", "alpha+not a uri"]:
                with pytest.raises(MCPError):
                    await c.subscribe_resource(uri)

    asyncio.run(run())
