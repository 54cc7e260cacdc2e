"""The official Python MCP SDK on protocol 2026-07-28 (stateless) against quiver-server:
era negotiation, input-required rounds answered by the client's callbacks, and a
`subscriptions/listen` stream told of a reload, over Streamable HTTP and stdio."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import mcp_types as types
import pytest
from conftest import BIN, free_port, wait_until
from mcp import Client, StdioServerParameters

CONFIG = """apiVersion: quiver.dev/v1alpha1
kind: ToolSet
server: {name: sdk-modern, version: 2.0.0}
tools:
  - name: echo
    description: Returns its text
    input: {text: string}
    handler: {builtin: echo}
  - name: ask-name
    description: Asks the user for their name
    handler:
      elicit:
        key: user
        message: "What is your name?"
        schema: {type: object, properties: {name: {type: string}}, required: [name]}
  - name: greet-asked
    description: Asks the user's name, then the model for a greeting, then combines them
    handler:
      pipeline:
        - {tool: ask-name}
        - {tool: ask-model, input: {name: "{{steps.0.structured.content.name}}"}}
        - {tool: echo, input: {text: "{{steps.1.text}}, {{steps.0.structured.content.name}}!"}}
  - name: ask-model
    description: Asks the client's model for a greeting
    input: {name: string}
    handler: {sample: {key: greeting, prompt: "Greet {{name}}", maxTokens: 20}}
"""


def start(config: Path):
    port, admin = free_port(), free_port()
    log = open(config.parent / "server.log", "w")
    proc = subprocess.Popen(
        [str(BIN), "--config", f"file:{config}", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    import urllib.request, json  # noqa: E401

    def ready():
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/status", timeout=2) as r:
            return json.load(r)["ready"]

    wait_until(ready)
    return proc, log, f"http://127.0.0.1:{port}/mcp"


@pytest.fixture()
def modern():
    assert BIN.exists(), f"build the server first: {BIN}"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-2026-"))
    config = tmp / "tools.yaml"
    config.write_text(CONFIG)
    proc, log, url = start(config)
    try:
        yield config, url
    finally:
        proc.terminate()
        proc.wait(timeout=5)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


async def on_elicit(context, params):
    assert params.message == "What is your name?"
    return types.ElicitResult(action="accept", content={"name": "Ada"})


async def on_sample(context, params):
    prompt = params.messages[0].content
    assert getattr(prompt, "text", "") == "Greet Ada"
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="Good morning"), model="test-model"
    )


def test_auto_mode_answers_input_requests_over_http(modern):
    _, url = modern

    async def run():
        async with Client(url, mode="auto", elicitation_callback=on_elicit, sampling_callback=on_sample) as c:
            assert c.protocol_version == "2026-07-28"
            r = await c.call_tool("greet-asked", {})
            assert not r.is_error, r
            assert r.content[0].text == "Good morning, Ada!"
            # A client that cannot answer gets the missing capability named, not a hang.
        async with Client(url, mode="auto") as bare:
            with pytest.raises(Exception) as e:
                await bare.call_tool("ask-name", {})
            assert "elicitation" in str(e.value)

    asyncio.run(run())


def test_listen_stream_hears_of_a_reload(modern):
    config, url = modern

    async def run():
        changed = asyncio.Event()

        async def on_message(m):
            if isinstance(m, types.ServerNotification) and isinstance(m, types.ToolListChangedNotification):
                changed.set()
            elif getattr(m, "method", None) == "notifications/tools/list_changed":
                changed.set()
            elif getattr(getattr(m, "root", None), "method", None) == "notifications/tools/list_changed":
                changed.set()

        async with Client(url, mode="auto", message_handler=on_message) as c:
            assert c.protocol_version == "2026-07-28"
            before = [t.name for t in (await c.list_tools(cache_mode="bypass")).tools]
            async with c.listen(tools_list_changed=True):
                config.write_text(CONFIG.replace("name: echo\n", "name: echo2\n", 1).replace("tool: echo,", "tool: echo2,"))
                await asyncio.wait_for(changed.wait(), 10)
            after = [t.name for t in (await c.list_tools(cache_mode="bypass")).tools]
            assert "echo2" in after and "echo" not in after and "echo" in before

    asyncio.run(run())


def test_stdio_auto_mode_speaks_2026(modern):
    config, _ = modern

    async def run():
        params = StdioServerParameters(command=str(BIN), args=["--stdio", "--config", f"file:{config}", "--admin-listen", "off"])
        async with Client(params, mode="auto", elicitation_callback=on_elicit, sampling_callback=on_sample) as c:
            assert c.protocol_version == "2026-07-28"
            r = await c.call_tool("greet-asked", {})
            assert r.content[0].text == "Good morning, Ada!"

    asyncio.run(run())
