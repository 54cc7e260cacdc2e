"""quiver-server fronting MCP servers written with the official Python SDK, over stdio (a
process quiver-server runs) and Streamable HTTP, with local YAML tools beside them: driven
by the official Python client."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import mcp_types as types
import pytest
from conftest import BIN, ServerProcess, free_port, start_server, stop, wait_until
from mcp import Client

UPSTREAM = Path(__file__).resolve().parent / "servers" / "py_upstream.py"
TOKEN = "upstream-token-0123456789"


def config(http_url: str, stdio_tools: str = "{prefix: s_}") -> str:
    return f"""
server: {{name: gateway}}
tools:
  - {{name: local, input: {{name: string}}, handler: {{template: "local {{{{name}}}}"}}}}
upstreams:
  - name: py-stdio
    stdio:
      command: [{sys.executable}, {UPSTREAM}, stdio]
      env: {{UPSTREAM_TOKEN: "{{{{secret.up.token}}}}"}}
    timeout: 3s
    tools: {stdio_tools}
  - name: py-http
    http:
      url: {http_url}
      headers: {{Authorization: "Bearer {{{{secret.up.token}}}}"}}
    tools: {{prefix: h_, exclude: [crash, hang, grow], descriptions: {{echo: Echo over HTTP.}}}}
"""


@pytest.fixture()
def gateway():
    assert BIN.exists(), f"build the server first: {BIN} (cargo build -p quiver-server)"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-upstream-"))
    up_port = free_port()
    up_log = open(tmp / "upstream.log", "w")
    upstream = subprocess.Popen([sys.executable, str(UPSTREAM), "http", str(up_port)], stdout=up_log, stderr=subprocess.STDOUT)
    path = tmp / "tools.yaml"
    http_url = f"http://127.0.0.1:{up_port}/mcp"
    path.write_text(config(http_url))
    sp = start_server(path, tmp / "server.log", "--secrets", "env", env={**os.environ, "QUIVER_SECRET_UP_TOKEN": TOKEN})
    sp.http_url = http_url
    try:
        # Both upstreams connected and their tools in the registry.
        wait_until(lambda: all(u["state"] == "ready" and u["imported"] > 0 for u in sp.status()["upstreams"]), timeout=30)
        yield sp
    finally:
        stop(sp.proc, upstream)
        up_log.close()
        print((tmp / "server.log").read_text()[-4000:])
        shutil.rmtree(tmp, ignore_errors=True)


def upstream(sp: ServerProcess, name: str) -> dict:
    return next(u for u in sp.status()["upstreams"] if u["name"] == name)


async def names(c: Client) -> list[str]:
    out, cursor = [], None
    for _ in range(20):
        page = await c.list_tools(cursor=cursor, cache_mode="bypass")
        out += [t.name for t in page.tools]
        cursor = page.next_cursor
        if cursor is None:
            return out
    raise AssertionError("too many pages")


def test_one_endpoint_serves_local_stdio_and_http_tools(gateway):
    async def run():
        async with Client(gateway.url, mode="legacy") as c:
            tools = {t.name: t for t in (await c.list_tools(cache_mode="bypass")).tools}
            assert set(tools) == {
                "local",
                *(f"s_{n}" for n in ["echo", "add", "whoami", "crash", "hang", "grow", "count", "chatty"]),
                *(f"h_{n}" for n in ["echo", "add", "whoami", "count", "chatty"]),
            }
            assert tools["h_echo"].description == "Echo over HTTP."
            assert tools["s_add"].input_schema["required"] == ["a", "b"]
            r = await c.call_tool("local", {"name": "x"})
            assert r.content[0].text == "local x"
            r = await c.call_tool("s_add", {"a": 40, "b": 2})
            assert (r.is_error, r.content[0].text) == (False, "42")
            r = await c.call_tool("h_echo", {"text": "over http"})
            assert (r.is_error, r.content[0].text) == (False, "over http")
            # Quiver checks the arguments against the upstream's schema before forwarding.
            r = await c.call_tool("h_add", {"a": "forty", "b": 2})
            assert r.is_error and "arguments.a" in r.content[0].text, r.content[0].text
        status = gateway.status()
        assert {u["name"]: (u["transport"], u["serverInfo"]["name"]) for u in status["upstreams"]} == {
            "py-stdio": ("stdio", "py-upstream"),
            "py-http": ("http", "py-upstream"),
        }
        metrics = gateway.metrics()
        assert re.search(r'quiver_upstream_request_duration_seconds_count\{upstream="py-stdio"\} [1-9]', metrics), metrics
        assert 'quiver_upstream_up{upstream="py-http"} 1' in metrics

    asyncio.run(run())


@pytest.mark.parametrize("tool", ["s_count", "h_count"])
def test_upstream_progress_reaches_the_client(gateway, tool):
    async def run():
        seen = []

        async def on_progress(progress, total, message):
            seen.append((progress, total, message))

        async with Client(gateway.url, mode="legacy") as c:
            r = await c.call_tool(tool, {"n": 3}, progress_callback=on_progress)
            assert (r.is_error, r.content[0].text) == (False, "counted to 3")
        assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")], seen

    asyncio.run(run())


def test_upstream_log_messages_of_a_call_reach_its_client(gateway):
    """Over HTTP, an upstream's log messages travel on the call's own answer stream: they
    reach the calling client, the credential in one of them redacted. (Over stdio a log line
    cannot be tied to one of the calls multiplexed on a process: it is logged by the server.)"""

    async def run():
        seen = []

        async def on_log(params):
            seen.append((params.level, params.logger, params.data))

        async with Client(gateway.url, mode="legacy", logging_callback=on_log) as c:
            r = await c.call_tool("h_chatty", {})
            assert r.content[0].text == "done"
            await asyncio.to_thread(wait_until, lambda: len(seen) >= 2)
        assert seen[0] == ("info", "py-http", "working on it"), seen
        assert seen[1][0] == "warning" and "[redacted]" in seen[1][2] and TOKEN not in seen[1][2], seen

    asyncio.run(run())


def test_credentials_reach_the_upstream_and_never_the_model(gateway):
    async def run():
        async with Client(gateway.url, mode="legacy") as c:
            for tool in ["s_whoami", "h_whoami"]:
                r = await c.call_tool(tool, {})
                text = r.content[0].text
                # The upstream saw the credential (it echoes it); the client gets it redacted.
                assert "credential=" in text and "[redacted]" in text and TOKEN not in text, text

    asyncio.run(run())


def test_a_crashing_stdio_upstream_is_restarted(gateway):
    async def run():
        async with Client(gateway.url, mode="legacy") as c:
            before = upstream(gateway, "py-stdio")["restarts"]
            r = await c.call_tool("s_crash", {})
            assert r.is_error and "upstream `py-stdio`" in r.content[0].text, r.content[0].text
            await asyncio.to_thread(wait_until, lambda: (u := upstream(gateway, "py-stdio"))["restarts"] > before and u["state"] == "ready", 30)
            r = await c.call_tool("s_echo", {"text": "back"})
            assert (r.is_error, r.content[0].text) == (False, "back")
        assert re.search(r'quiver_upstream_restarts_total\{upstream="py-stdio"\} [1-9]', gateway.metrics())

    asyncio.run(run())


def test_a_hanging_call_times_out_while_others_go_through(gateway):
    async def run():
        async with Client(gateway.url, mode="legacy") as c:
            hung = asyncio.create_task(c.call_tool("s_hang", {"seconds": 60}))
            # Requests are multiplexed on the one process: this one is not stuck behind it.
            r = await c.call_tool("s_echo", {"text": "not blocked"})
            assert r.content[0].text == "not blocked"
            r = await hung
            assert r.is_error and "no answer within 3s" in r.content[0].text, r.content[0].text
            r = await c.call_tool("s_echo", {"text": "still fine"})
            assert r.content[0].text == "still fine"
        assert re.search(r'quiver_upstream_errors_total\{upstream="py-stdio",kind="timeout"\} 1', gateway.metrics())

    asyncio.run(run())


def test_upstream_list_changed_reaches_the_client(gateway):
    async def run():
        changed = asyncio.Event()

        async def on_message(msg):
            if isinstance(msg, types.ToolListChangedNotification) or getattr(msg, "method", None) == "notifications/tools/list_changed":
                changed.set()

        async with Client(gateway.url, mode="legacy", message_handler=on_message) as c:
            assert "s_grown" not in await names(c)
            await asyncio.to_thread(wait_until, lambda: "quiver_open_streams 1" in gateway.metrics())
            r = await c.call_tool("s_grow", {})
            assert r.content[0].text == "grown"
            await asyncio.wait_for(changed.wait(), timeout=10)
            assert "s_grown" in await names(c)
            r = await c.call_tool("s_grown", {})
            assert r.content[0].text == "I am new"

    asyncio.run(run())


def test_a_filter_change_hot_reloads_without_restarting_the_upstream(gateway):
    async def run():
        async with Client(gateway.url, mode="legacy") as c:
            pid = (await c.call_tool("s_whoami", {})).content[0].text.split()[0]
            gateway.config.write_text(config(gateway.http_url, "{prefix: py_, include: [echo, whoami, add], rename: {add: plus}}"))
            await asyncio.to_thread(wait_until, lambda: upstream(gateway, "py-stdio")["imported"] == 3)
            listed = await names(c)
            assert {n for n in listed if not n.startswith("h_")} == {"local", "py_echo", "py_whoami", "plus"}
            with pytest.raises(Exception, match="Unknown tool: s_whoami"):
                await c.call_tool("s_whoami", {})
            assert (await c.call_tool("plus", {"a": 1, "b": 2})).content[0].text == "3"
            assert (await c.call_tool("py_whoami", {})).content[0].text.split()[0] == pid, "the process was restarted"
            assert upstream(gateway, "py-stdio")["restarts"] == 0

    asyncio.run(run())


def test_an_invalid_upstream_edit_keeps_the_serving_tools(gateway):
    async def run():
        before = gateway.status()
        gateway.config.write_text(gateway.config.read_text().replace("prefix: s_", "prefix: h_"))
        status = await asyncio.to_thread(wait_until, lambda: (s := gateway.status())["lastReload"]["result"] == "invalid" and s)
        assert any("imports under the same prefix" in p or "upstreams[1].tools" in p for p in status["lastReload"]["problems"]), status["lastReload"]
        assert status["configHash"] == before["configHash"]
        async with Client(gateway.url, mode="legacy") as c:
            assert (await c.call_tool("s_echo", {"text": "kept"})).content[0].text == "kept"

    asyncio.run(run())


def test_a_stdio_server_behind_the_bridge_socket(tmp_path):
    """What the operator sets up for an upstream image: `quiver-server bridge` serves the
    program on a Unix socket (one process per connection), the gateway connects with
    `socket:`; two processes, and a crashed one comes back."""
    sock = tmp_path / "py.sock"
    bridge = subprocess.Popen(
        [str(BIN), "bridge", "--socket", str(sock), "--max-processes", "2", "--", sys.executable, str(UPSTREAM), "stdio"],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "bridge.log", "w"),
    )
    path = tmp_path / "tools.yaml"
    path.write_text(f"upstreams:\n  - {{name: sidecar, stdio: {{socket: {sock}, processes: 2}}, timeout: 5s}}\n")
    sp = start_server(path, tmp_path / "server.log")

    async def run():
        async with Client(sp.url, mode="legacy") as c:
            pids = set()
            for _ in range(6):
                pids.add((await c.call_tool("whoami", {})).content[0].text.split()[0])
            assert len(pids) == 2, f"calls spread over both processes: {pids}"
            r = await c.call_tool("crash", {})
            assert r.is_error
            await asyncio.to_thread(wait_until, lambda: (u := upstream(sp, "sidecar"))["restarts"] >= 1 and u["connections"] == 2, 30)
            assert (await c.call_tool("echo", {"text": "again"})).content[0].text == "again"

    try:
        wait_until(lambda: upstream(sp, "sidecar")["connections"] == 2 and upstream(sp, "sidecar")["imported"] == 8, timeout=30)
        asyncio.run(run())
    finally:
        stop(sp.proc, bridge)
    assert not sock.exists(), "the bridge removes its socket on SIGTERM"


HOSTILE = Path(__file__).resolve().parent / "servers" / "hostile_upstream.py"


def test_hostile_upstreams_cannot_take_the_server_down(tmp_path):
    """One upstream per way of breaking the protocol, beside a local tool: the server keeps
    serving, each upstream is reported as it deserves, and what can be served is."""
    modes = ["garbage", "huge", "silent", "evil", "flood", "liar"]
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools: [{name: local, handler: {template: fine}}]\nupstreams:\n"
        + "".join(
            f"  - {{name: {m}, stdio: {{command: [{sys.executable}, {HOSTILE}, {m}]}}, timeout: 2s, maxMessageBytes: 1048576, tools: {{prefix: {m}_}}}}\n"
            for m in modes
        )
    )
    sp = start_server(path, tmp_path / "server.log")
    proc = sp.proc
    try:
        wait_until(lambda: sp.status()["ready"])
        # The well-behaved parts come up; the broken ones are down with a reason, restarted
        # with backoff.
        wait_until(lambda: all(upstream(sp, m)["imported"] >= 1 for m in ["garbage", "evil", "flood", "liar"]), timeout=30)
        silent = wait_until(lambda: (u := upstream(sp, "silent"))["restarts"] >= 1 and u, timeout=30)
        assert silent["state"] != "ready" and "initialize: no answer within 2s" in silent["error"], silent
        # `huge` answers initialize, so it is briefly ready after each restart before its
        # tools/list breaks the limit: the reason is kept in lastError across those moments.
        huge = wait_until(lambda: (u := upstream(sp, "huge"))["restarts"] >= 1 and u, timeout=30)
        assert "over 1048576 bytes" in (huge["lastError"] or ""), huge
        assert huge["imported"] == 0, huge
        evil = upstream(sp, "evil")
        assert evil["imported"] == 10_000, evil["imported"]  # `ok` and t0.. up to the cap
        assert evil["skippedCount"] >= 5 and len(evil["skipped"]) <= 20, evil
        # A flood of list_changed is coalesced, not one rebuild each.
        generation = sp.status()["generation"]
        assert generation < 100, generation

        async def run():
            async with Client(sp.url, mode="legacy") as c:
                assert (await c.call_tool("local", {})).content[0].text == "fine"
                assert (await c.call_tool("garbage_ok", {"x": "y"})).content[0].text == "ok y"
                r = await c.call_tool("liar_ok", {})
                assert r.is_error and "broke the protocol" in r.content[0].text, r.content[0].text
                r = await c.call_tool("flood_ok", {"x": "z"})
                assert r.content[0].text == "ok z"

        asyncio.run(run())
        assert proc.poll() is None, "the server died"
        with urllib.request.urlopen(f"http://127.0.0.1:{sp.admin}/healthz", timeout=2) as r:
            assert r.status == 200
    finally:
        stop(proc)
