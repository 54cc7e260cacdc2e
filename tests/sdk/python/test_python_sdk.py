"""The official Python MCP SDK (`mcp` on PyPI) against a running quiver-server."""

from __future__ import annotations

import asyncio
import time

import mcp_types as types
import pytest
from conftest import BIN, wait_until
from mcp import Client, StdioServerParameters

EXPECTED_TOOLS = ["add", "greet", "add-then-greet", "word-count", "weather"]


async def list_all_tools(client: Client) -> tuple[list[str], int]:
    names, pages, cursor = [], 0, None
    for _ in range(20):
        page = await client.list_tools(cursor=cursor, cache_mode="bypass")
        pages += 1
        names += [t.name for t in page.tools]
        cursor = page.next_cursor
        if cursor is None:
            break
    return names, pages


@pytest.mark.parametrize(("mode", "version"), [("legacy", "2025-11-25"), ("auto", "2026-07-28")])
def test_initialize_and_paginated_list(server, mode, version):
    """`legacy` initializes (2025-11-25); `auto` probes server/discover and stays on the
    stateless revision, which the server speaks beside the handshake era."""

    async def run():
        async with Client(server.url, mode=mode) as c:
            assert c.protocol_version == version
            assert c.server_info.name == "sdk-test"
            assert c.server_capabilities.tools.list_changed is True
            names, pages = await list_all_tools(c)
            assert names == EXPECTED_TOOLS
            assert pages == 3, "pageSize 2 over 5 tools"

    asyncio.run(run())


def test_every_handler_kind(server):
    async def run():
        async with Client(server.url, mode="legacy") as c:
            r = await c.call_tool("add", {"a": 19, "b": 23})
            assert (r.is_error, r.content[0].text, r.structured_content) == (False, "42", {"result": 42})
            r = await c.call_tool("greet", {"name": "Ada"})
            assert r.content[0].text == "Hello Ada!"
            r = await c.call_tool("add-then-greet", {"a": 2, "b": 3})
            assert r.content[0].text == "Hello 5!"
            r = await c.call_tool("word-count", {"text": "one two three"})
            assert r.content[0].text.strip() == "3"
            r = await c.call_tool("weather", {"city": "Oslo"})
            assert r.structured_content == {"path": "/weather?city=Oslo", "tempC": 21}
            r = await c.call_tool("add", {"a": "not a number", "b": 1})
            assert r.is_error and "arguments.a: expected number, got string" in r.content[0].text

    asyncio.run(run())


def test_resources_and_prompts(server):
    async def run():
        async with Client(server.url, mode="legacy") as c:
            res = await c.list_resources(cache_mode="bypass")
            assert [r.uri for r in res.resources] == ["doc://readme"]
            tpl = await c.list_resource_templates(cache_mode="bypass")
            assert tpl.resource_templates[0].uri_template == "greeting://{name}"
            read = await c.read_resource("greeting://Grace", cache_mode="bypass")
            assert read.contents[0].text == "Hi Grace"
            p = await c.get_prompt("summarize", {"topic": "MCP"})
            assert p.messages[0].content.text == "Summarize MCP"

    asyncio.run(run())


def test_list_changed_after_editing_the_config(server):
    async def run():
        changed = asyncio.Event()

        async def on_message(msg):
            if isinstance(msg, types.ToolListChangedNotification) or getattr(msg, "method", None) == "notifications/tools/list_changed":
                changed.set()

        async with Client(server.url, mode="legacy", message_handler=on_message) as c:
            await c.list_tools(cache_mode="bypass")
            # The GET stream opens after initialization; wait until the server counts it.
            await asyncio.to_thread(wait_until, lambda: "quiver_open_streams 1" in server.metrics())
            text = server.config.read_text().replace("tools:\n", "tools:\n  - {name: fresh, handler: {template: brand new}}\n", 1)
            start = time.monotonic()
            server.config.write_text(text)
            await asyncio.wait_for(changed.wait(), timeout=10)
            elapsed_ms = (time.monotonic() - start) * 1000
            print(f"\nfile edit -> tools/list_changed received by the Python SDK: {elapsed_ms:.1f} ms")
            names, _ = await list_all_tools(c)
            assert names[0] == "fresh" and names[1:] == EXPECTED_TOOLS
            r = await c.call_tool("fresh", {})
            assert r.content[0].text == "brand new"

    asyncio.run(run())


def test_invalid_edit_keeps_the_previous_tools(server):
    async def run():
        before = server.status()
        server.config.write_text(server.config.read_text().replace("builtin: add", "builtin: addd"))
        status = await asyncio.to_thread(wait_until, lambda: (s := server.status())["lastReload"]["result"] == "invalid" and s)
        assert any("tools[0].handler.builtin: unknown builtin `addd`" in p for p in status["lastReload"]["problems"])
        assert status["generation"] == before["generation"] and status["configHash"] == before["configHash"]
        async with Client(server.url, mode="legacy") as c:
            r = await c.call_tool("add", {"a": 1, "b": 1})
            assert r.content[0].text == "2"

    asyncio.run(run())


def test_stdio_transport(stdio_config):
    params = StdioServerParameters(command=str(BIN), args=["--stdio", "--config", f"file:{stdio_config}", "--admin-listen", "127.0.0.1:0"])

    async def run():
        async with Client(params, mode="legacy") as c:
            names, _ = await list_all_tools(c)
            assert names == EXPECTED_TOOLS
            r = await c.call_tool("add-then-greet", {"a": 40, "b": 2})
            assert r.content[0].text == "Hello 42!"

    asyncio.run(run())
