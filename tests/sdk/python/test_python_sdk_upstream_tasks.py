"""Upstream tools that run only as tasks of their own (`execution.taskSupport: required`),
served by an MCP server written with the official TypeScript SDK (its in-memory task store
and message queue), fronted by quiver-server over Streamable HTTP and stdio, and driven by
the official Python SDK client of either protocol revision.

A call of such a tool is made as a task at the upstream and followed to its end; the
upstream task's questions reach the client of the call; the client's own task maps onto
the upstream's, and cancelling it cancels the upstream's."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from pathlib import Path

import mcp_types as types
import pytest
from conftest import BIN, ROOT, free_port, start_server, stop, wait_until
from mcp import Client
from test_python_sdk_tasks import call_as_task, cancel, get, poll, result
from test_python_sdk_upstream_offers import listening

UPSTREAM = ROOT / "tests" / "sdk" / "typescript" / "servers" / "ts-task-upstream.mjs"


def config(url: str) -> str:
    return f"""
server: {{name: gateway}}
upstreams:
  - name: jobs
    http: {{url: {url}}}
    tools: {{prefix: t_, tasks: {{report: optional, confirm_delete: optional}}}}
  - name: local
    stdio: {{command: [node, {UPSTREAM}, stdio], processes: 2}}   # a task lives in one of them
    tools: {{prefix: s_, tasks: {{report: optional}}}}
"""


@pytest.fixture()
def gateway():
    assert BIN.exists(), f"build the server first: {BIN} (cargo build -p quiver-server)"
    assert (UPSTREAM.parent.parent / "node_modules" / "@modelcontextprotocol" / "sdk").exists(), "npm ci in tests/sdk/typescript first"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-upstream-tasks-"))
    port = free_port()
    log = open(tmp / "upstream.log", "w")
    upstream = subprocess.Popen(["node", str(UPSTREAM), "http", str(port)], stdout=log, stderr=subprocess.STDOUT)
    path = tmp / "tools.yaml"
    path.write_text(config(f"http://127.0.0.1:{port}/mcp"))
    wait_until(lambda: listening(port), timeout=30)
    sp = start_server(path, tmp / "server.log")
    try:
        wait_until(lambda: sp.status()["tools"] == 8 and all(u["state"] == "ready" for u in sp.status()["upstreams"]), timeout=30)
        yield sp
    finally:
        stop(sp.proc, upstream)
        log.close()
        print((tmp / "server.log").read_text()[-3000:])
        shutil.rmtree(tmp, ignore_errors=True)


def confirming(answer: types.ElicitResult):
    async def on_elicit(context, params):
        assert params.message == "Delete a.txt?"
        return answer

    return on_elicit


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_tool_that_runs_only_as_a_task_is_served_to_a_plain_call(gateway, mode):
    async def run():
        async with Client(gateway.url, mode=mode) as c:
            for name in ["t_report", "s_report", "s_report", "s_report"]:
                r = await c.call_tool(name, {"topic": "q3"})
                assert (r.is_error, r.content[0].text) == (False, "report on q3"), r

    asyncio.run(run())


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_the_upstream_tasks_question_reaches_the_client_of_the_call(gateway, mode):
    """The upstream's task asks the user (its `input_required`, the question on the
    `tasks/result` stream): the question reaches this call's client, in its session
    (legacy) or as its input round (2026-07-28), and its answer decides the result."""

    async def run():
        yes = types.ElicitResult(action="accept", content={"confirm": True})
        async with Client(gateway.url, mode=mode, elicitation_callback=confirming(yes)) as c:
            r = await c.call_tool("t_confirm_delete", {"file": "a.txt"})
            assert (r.is_error, r.content[0].text) == (False, "deleted a.txt"), r
        no = types.ElicitResult(action="decline")
        async with Client(gateway.url, mode=mode, elicitation_callback=confirming(no)) as c:
            r = await c.call_tool("t_confirm_delete", {"file": "a.txt"})
            assert (r.is_error, r.content[0].text) == (False, "kept a.txt"), r

    asyncio.run(run())


def test_the_clients_task_maps_onto_the_upstreams(gateway):
    """A 2025-11-25 client's task of an upstream task tool: listed as required, working while
    the upstream's works, its result the upstream's; cancelling it cancels the upstream's."""

    async def run():
        async with Client(gateway.url, mode="legacy") as c:
            listed = {t.name: t.execution.task_support if t.execution else None for t in (await c.list_tools()).tools}
            assert (listed["t_forever"], listed["t_report"]) == ("required", "optional"), listed
            done = await call_as_task(c, "t_report", {"topic": "q4"})
            assert (await poll(c, done.task.task_id)).status == "completed"
            r = await result(c, done.task.task_id)
            assert r.content[0].text == "report on q4", r

            made = await call_as_task(c, "t_forever", {"tag": "first"})
            assert (await get(c, made.task.task_id)).status == "working"
            assert (await cancel(c, made.task.task_id)).status == "cancelled"

            async def cancelled_upstream() -> str:
                r = await c.call_tool("t_cancelled", {})
                return r.content[0].text

            for _ in range(200):
                if "first" in (await cancelled_upstream()).split(","):
                    break
                await asyncio.sleep(0.05)
            assert (await cancelled_upstream()).split(",") == ["first"]

    asyncio.run(run())


# quiver-server itself as a 2026-07-28 upstream whose tools run only as tasks (the tasks
# extension): it lists no task support in that revision, and refuses a plain call naming
# the extension, which has the gateway make the call again as a task.
INNER = """
server: {name: inner}
tools:
  - name: job
    task: required
    handler: {exec: {command: [/bin/sh, -c, 'sleep 0.3; echo job done']}}
  - name: confirm_delete
    input: {file: string}
    task: required
    handler:
      elicit:
        key: confirm
        message: "Delete {{file}}?"
        schema: {type: object, properties: {confirm: {type: boolean}}, required: [confirm]}
"""


@pytest.fixture()
def gateway_2026():
    assert BIN.exists(), f"build the server first: {BIN} (cargo build -p quiver-server)"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-upstream-tasks-2026-"))
    (tmp / "inner.yaml").write_text(INNER)
    inner = start_server(tmp / "inner.yaml", tmp / "inner.log")
    wait_until(lambda: inner.status()["ready"])
    (tmp / "tools.yaml").write_text(f"""
server: {{name: gateway}}
upstreams:
  - name: inner
    http: {{url: {inner.url}}}
    revision: "2026-07-28"
    tools: {{prefix: q_}}
""")
    sp = start_server(tmp / "tools.yaml", tmp / "server.log")
    try:
        wait_until(lambda: sp.status()["tools"] == 2, timeout=30)
        yield sp
    finally:
        stop(sp.proc, inner.proc)
        print((tmp / "server.log").read_text()[-3000:])
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_2026_upstreams_task_tools_are_served(gateway_2026, mode):
    """Followed through `tasks/get`; the task's question (`inputRequests`) reaches the
    call's client and its answer goes back with `tasks/update`."""

    async def on_elicit(context, params):
        assert params.message == "Delete a.txt?"
        return types.ElicitResult(action="accept", content={"confirm": True})

    async def run():
        async with Client(gateway_2026.url, mode=mode, elicitation_callback=on_elicit) as c:
            r = await c.call_tool("q_job", {})
            assert (r.is_error, r.content[0].text.strip()) == (False, "job done"), r
            r = await c.call_tool("q_confirm_delete", {"file": "a.txt"})
            assert not r.is_error and r.structured_content == {"action": "accept", "content": {"confirm": True}}, r

    asyncio.run(run())
