"""The official Python MCP SDK drives the server-to-client side of the protocol against the real
binary: progress of a long call, log messages filtered by `logging/setLevel`, resource
subscriptions answered with `notifications/resources/updated` when the config changes the
resource, and a sampling request the client answers, on the handshake era (2025-11-25)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import mcp_types as types
import pytest
from conftest import BIN, start_server, stop, wait_until
from mcp import Client

TOOLS = """
server: {{name: interop}}
tools:
  - {{name: add, handler: {{builtin: add}}}}
  - {{name: greet, input: {{name: string}}, handler: {{template: "Hello {{{{name}}}}!"}}}}
  - name: sum-and-greet
    input: {{a: number, b: number}}
    handler:
      pipeline:
        - {{tool: add, log: "adding {{{{a}}}} and {{{{b}}}}", logLevel: info}}
        - {{tool: greet, input: {{name: "{{{{steps.0.text}}}}"}}, log: "greeting {{{{steps.0.text}}}}", logLevel: debug}}
  - name: haiku
    input: {{topic: string}}
    handler: {{sample: {{prompt: "A haiku about {{{{topic}}}}", systemPrompt: "Be brief.", maxTokens: 60}}}}
resources:
  - {{uri: "doc://motd", name: motd, text: "{motd}"}}
"""


@pytest.fixture()
def interop():
    assert BIN.exists(), f"build the server first: {BIN} (cargo build -p quiver-server)"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-interop-"))
    config = tmp / "tools.yaml"
    config.write_text(TOOLS.format(motd="first"))
    sp = start_server(config, tmp / "server.log")
    try:
        wait_until(lambda: sp.status()["ready"])
        yield sp
    finally:
        stop(sp.proc)
        if sp.proc.returncode not in (0, -15):
            print((tmp / "server.log").read_text())
        shutil.rmtree(tmp, ignore_errors=True)


def test_progress_and_log_messages_follow_the_level(interop):
    """`progress_callback` gets one report per step and the final one; `logging/setLevel`
    decides which step messages arrive: at `info` the debug message of the second step is
    held back, at `debug` both arrive, in order, before the answer."""

    async def run():
        logs: list[tuple[str, str]] = []

        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            logs.append((params.level, str(params.data)))

        async with Client(interop.url, mode="legacy", logging_callback=on_log) as c:
            progress: list[tuple[float, float | None, str | None]] = []

            async def on_progress(p: float, total: float | None, message: str | None) -> None:
                progress.append((p, total, message))

            await c.set_logging_level("info")
            r = await c.call_tool("sum-and-greet", {"a": 2, "b": 3}, progress_callback=on_progress)
            assert (r.is_error, r.content[0].text) == (False, "Hello 5!")
            assert progress == [(0, 2, "add"), (1, 2, "greet"), (2, 2, None)]
            assert logs == [("info", "adding 2 and 3")]

            logs.clear()
            await c.set_logging_level("debug")
            r = await c.call_tool("sum-and-greet", {"a": 1, "b": 1})
            assert r.content[0].text == "Hello 2!"
            assert logs == [("info", "adding 1 and 1"), ("debug", "greeting 2")]

    asyncio.run(run())


def test_stateless_requests_opt_in_to_log_messages_and_progress(interop):
    """On 2026-07-28 there is no `logging/setLevel`: each request carries its level in
    `_meta` (the client's `log_level`), and a request without it hears no log message."""

    async def run():
        for level, want in [("debug", [("info", "adding 4 and 5"), ("debug", "greeting 9")]), (None, [])]:
            logs: list[tuple[str, str]] = []

            async def on_log(params: types.LoggingMessageNotificationParams, logs=logs) -> None:
                logs.append((params.level, str(params.data)))

            async with Client(interop.url, mode="auto", logging_callback=on_log, log_level=level) as c:
                assert c.protocol_version == "2026-07-28"
                progress: list[tuple[float, float | None, str | None]] = []

                async def on_progress(p: float, total: float | None, message: str | None, progress=progress) -> None:
                    progress.append((p, total, message))

                r = await c.call_tool("sum-and-greet", {"a": 4, "b": 5}, progress_callback=on_progress)
                assert r.content[0].text == "Hello 9!"
                assert progress == [(0, 2, "add"), (1, 2, "greet"), (2, 2, None)]
                assert logs == want, level

    asyncio.run(run())


def test_a_subscribed_resource_reports_its_change(interop):
    """After `resources/subscribe`, editing the config so the resource's text changes sends
    `notifications/resources/updated` for its URI; the next read returns the new text. An
    unsubscribed client hears nothing of the next change."""

    async def run():
        updated: list[str] = []

        async def on_message(message) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                updated.append(str(message.params.uri))

        async with Client(interop.url, mode="legacy", message_handler=on_message) as c:
            read = await c.read_resource("doc://motd", cache_mode="bypass")
            assert read.contents[0].text == "first"
            await c.subscribe_resource("doc://motd")
            interop.config.write_text(TOOLS.format(motd="second"))
            await wait_for(lambda: updated == ["doc://motd"])
            read = await c.read_resource("doc://motd", cache_mode="bypass")
            assert read.contents[0].text == "second"

            await c.unsubscribe_resource("doc://motd")
            interop.config.write_text(TOOLS.format(motd="third"))
            await wait_for(lambda: reads_as(c, "third"))
            assert updated == ["doc://motd"], "no update after unsubscribing"

    asyncio.run(run())


def test_a_sample_tool_asks_the_client_model(interop):
    """The `sample` handler sends `sampling/createMessage` with the rendered prompt, system
    prompt and token budget; the client's answer becomes the tool's text and structured
    content."""

    async def run():
        asked: list[types.CreateMessageRequestParams] = []

        async def on_sample(_ctx, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
            asked.append(params)
            return types.CreateMessageResult(
                role="assistant",
                content=types.TextContent(type="text", text="Quiet kube pods / ..."),
                model="test-model",
                stop_reason="endTurn",
            )

        async with Client(interop.url, mode="legacy", sampling_callback=on_sample) as c:
            r = await c.call_tool("haiku", {"topic": "pods"})
            assert not r.is_error, r.content
            assert r.content[0].text == "Quiet kube pods / ..."
            assert r.structured_content["model"] == "test-model"
            assert len(asked) == 1
            assert asked[0].messages[0].content.text == "A haiku about pods"
            assert (asked[0].system_prompt, asked[0].max_tokens) == ("Be brief.", 60)

    asyncio.run(run())


async def reads_as(c: Client, text: str) -> bool:
    read = await c.read_resource("doc://motd", cache_mode="bypass")
    return read.contents[0].text == text


async def wait_for(predicate, timeout: float = 10.0) -> None:
    """Polls `predicate` (a function, or a coroutine function) on the event loop until it
    holds; notifications are delivered while it waits."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout}s")
