"""Tasks of protocol 2025-11-25 driven by the official Python MCP SDK over Streamable HTTP.

The SDK has the wire types of tasks but no client API for them: `tasks/*` go through the
session's `send_request` (checked against the SDK's result types), and the task-augmented
`tools/call` through its raw request method (its `CallToolResult` check would refuse the
`CreateTaskResult`)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import mcp_types as types
import pytest
from conftest import BIN, start_server, stop, wait_until
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

CONFIG = """server: {name: sdk-tasks}
tools:
  - {name: slow, input: {secs: string}, handler: {exec: {command: [/bin/sh, -c, 'sleep "$1"; echo "slept $1"', sh, "{{secs}}"]}}}
  - {name: nap, handler: {exec: {command: [/bin/sleep, "60"], timeout: 5m}}}
  - {name: broken, handler: {exec: {command: [/bin/sh, -c, "echo no luck >&2; exit 4"]}}}
  - {name: job, task: required, handler: {exec: {command: [/bin/echo, job done]}}}
  - {name: quick, task: forbidden, handler: {exec: {command: [/bin/echo, quick]}}}
  - {name: hello, handler: {template: hi}}
"""

RELATED = "io.modelcontextprotocol/related-task"
TERMINAL = ("completed", "failed", "cancelled")


@pytest.fixture()
def tasks_server():
    assert BIN.exists(), f"build the server first: {BIN} (cargo build -p quiver-server)"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-sdk-tasks-"))
    config = tmp / "tools.yaml"
    config.write_text(CONFIG)
    sp = start_server(config, tmp / "server.log", "--tasks-ttl", "2m")
    try:
        wait_until(lambda: sp.status()["ready"])
        yield sp
    finally:
        stop(sp.proc)
        shutil.rmtree(tmp, ignore_errors=True)


async def call_as_task(client: Client, name: str, arguments: dict, ttl: int | None = 30000) -> types.CreateTaskResult:
    s = client.session
    req = types.CallToolRequest(
        params=types.CallToolRequestParams(name=name, arguments=arguments, task=types.TaskMetadata(ttl=ttl))
    )
    data = req.model_dump(by_alias=True, mode="json", exclude_none=True)
    opts: dict = {}
    s._stamp(data, opts)
    raw = await s._dispatcher.send_raw_request(data["method"], data.get("params"), opts)
    return types.CreateTaskResult.model_validate(raw, by_name=False)


async def get(client: Client, task_id: str) -> types.GetTaskResult:
    return await client.session.send_request(
        types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id)), types.GetTaskResult
    )


async def result(client: Client, task_id: str) -> types.CallToolResult:
    return await client.session.send_request(
        types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id)), types.CallToolResult
    )


async def cancel(client: Client, task_id: str) -> types.CancelTaskResult:
    return await client.session.send_request(
        types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id)), types.CancelTaskResult
    )


async def list_all(client: Client) -> list[str]:
    ids, cursor = [], None
    for _ in range(20):
        req = types.ListTasksRequest(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        page = await client.session.send_request(req, types.ListTasksResult)
        ids += [t.task_id for t in page.tasks]
        cursor = page.next_cursor
        if not cursor:
            break
    return ids


async def poll(client: Client, task_id: str) -> types.GetTaskResult:
    for _ in range(200):
        g = await get(client, task_id)
        if g.status in TERMINAL:
            return g
        await asyncio.sleep((g.poll_interval or 1000) / 1000)
    raise AssertionError(f"task {task_id} did not end")


def test_capabilities_and_task_support_in_tools_list(tasks_server):
    async def run():
        async with Client(tasks_server.url, mode="legacy") as c:
            caps = c.server_capabilities.tasks
            assert caps is not None and caps.requests.tools.call is not None
            assert caps.list is not None and caps.cancel is not None
            tools = {t.name: t for t in (await c.list_tools(cache_mode="bypass")).tools}
            support = {n: (t.execution.task_support if t.execution else None) for n, t in tools.items()}
            assert support == {
                "slow": "optional",
                "nap": "optional",
                "broken": "optional",
                "job": "required",
                "quick": None,
                "hello": None,
            }

    asyncio.run(run())


def test_create_poll_result_and_list(tasks_server):
    async def run():
        async with Client(tasks_server.url, mode="legacy") as c:
            created = await call_as_task(c, "slow", {"secs": "0.3"}, ttl=45000)
            t = created.task
            assert t.status == "working" and t.ttl == 45000 and t.poll_interval
            done = await poll(c, t.task_id)
            assert done.status == "completed"
            res = await result(c, t.task_id)
            assert res.content[0].text.strip() == "slept 0.3"
            assert res.is_error is False
            assert res.meta[RELATED]["taskId"] == t.task_id
            # tasks/result blocks until the end: asked at once, it answers when the call ends.
            waiting = await call_as_task(c, "slow", {"secs": "0.5"})
            res = await result(c, waiting.task.task_id)
            assert res.content[0].text.strip() == "slept 0.5"
            assert await list_all(c) == [t.task_id, waiting.task.task_id]
            # A TTL over the server's --tasks-ttl is shortened to it.
            long = await call_as_task(c, "slow", {"secs": "0"}, ttl=10**12)
            assert long.task.ttl == 120000

    asyncio.run(run())


def test_list_shows_only_the_callers_own_tasks(tasks_server):
    async def run():
        async with Client(tasks_server.url, mode="legacy") as a, Client(tasks_server.url, mode="legacy") as b:
            mine = (await call_as_task(a, "nap", {})).task.task_id
            theirs = (await call_as_task(b, "nap", {})).task.task_id
            assert await list_all(a) == [mine]
            assert await list_all(b) == [theirs]
            for op in (get, result, cancel):
                with pytest.raises(MCPError) as e:
                    await op(b, mine)
                assert e.value.error.code == -32602
            assert (await get(a, mine)).status == "working"
            for client, tid in ((a, mine), (b, theirs)):
                assert (await cancel(client, tid)).status == "cancelled"

    asyncio.run(run())


def test_cancel_and_cancelling_an_ended_task(tasks_server):
    async def run():
        async with Client(tasks_server.url, mode="legacy") as c:
            tid = (await call_as_task(c, "nap", {})).task.task_id
            cancelled = await cancel(c, tid)
            assert cancelled.status == "cancelled" and cancelled.task_id == tid
            assert (await get(c, tid)).status == "cancelled"
            with pytest.raises(MCPError) as e:
                await cancel(c, tid)
            assert e.value.error.code == -32602 and "terminal status 'cancelled'" in e.value.error.message

    asyncio.run(run())


def test_required_and_forbidden_tools_and_a_failing_tool(tasks_server):
    async def run():
        async with Client(tasks_server.url, mode="legacy") as c:
            with pytest.raises(MCPError) as e:
                await c.call_tool("job", {})
            assert e.value.error.code == -32601
            assert "Task augmentation required" in e.value.error.message
            job = await call_as_task(c, "job", {})
            assert (await result(c, job.task.task_id)).content[0].text.strip() == "job done"
            for name in ("quick", "hello"):
                with pytest.raises(MCPError) as e:
                    await call_as_task(c, name, {})
                assert e.value.error.code == -32601
            # Without a task an optional tool answers as before.
            plain = await c.call_tool("slow", {"secs": "0"})
            assert plain.content[0].text.strip() == "slept 0"
            failing = await call_as_task(c, "broken", {})
            ended = await poll(c, failing.task.task_id)
            assert ended.status == "failed" and ended.status_message
            res = await result(c, failing.task.task_id)
            assert res.is_error is True
            assert res.meta[RELATED]["taskId"] == failing.task.task_id

    asyncio.run(run())


def test_over_stdio_a_waiting_result_does_not_hold_up_the_session(tmp_path):
    config = tmp_path / "tools.yaml"
    config.write_text(CONFIG)
    params = StdioServerParameters(
        command=str(BIN), args=["--stdio", "--config", f"file:{config}", "--admin-listen", "127.0.0.1:0"]
    )

    async def run():
        async with Client(params, mode="legacy") as c:
            assert c.server_capabilities.tasks is not None
            tid = (await call_as_task(c, "nap", {})).task.task_id
            waiting = asyncio.create_task(result(c, tid))
            # While tasks/result waits, the same session is served: another task runs to its
            # end and this one is cancelled, which ends the wait.
            quick = await call_as_task(c, "slow", {"secs": "0"})
            assert (await result(c, quick.task.task_id)).content[0].text.strip() == "slept 0"
            assert (await cancel(c, tid)).status == "cancelled"
            with pytest.raises(MCPError) as e:
                await asyncio.wait_for(waiting, 10)
            assert e.value.error.code == -32602

    asyncio.run(run())
