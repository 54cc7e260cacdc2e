"""quiver-server fronting the resources, resource templates and prompts of two MCP servers
written with the official Python SDK (one over stdio, one over Streamable HTTP) that list the
same URIs and prompt names, and of two written with the official Go SDK (go-mcp, over stdio):
driven by the official Python client in both protocol eras."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import mcp_types as types
import pytest
from conftest import BIN, ROOT, start_server, free_port, stop, wait_until
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
  - name: no-forbidden-titles
    expression: "args.title != 'forbidden'"
    resources: ["alpha+book://{{title}}/chapter/{{n}}"]
upstreams:
  - name: alpha
    stdio:
      command: [{sys.executable}, {UPSTREAM}, alpha, stdio]
      env: {{LIBRARY_TOKEN: "{{{{secret.lib.token}}}}"}}
    tools: {{prefix: a_}}
    resources: {{exclude: ["file:///leak*", "welcome://*"]}}
    prompts: {{exclude: [greeting]}}
  - name: beta
    http:
      url: {http_url}
      headers: {{Authorization: "Bearer {{{{secret.lib.token}}}}"}}
    tools: {{prefix: b_}}
    resources: {{exclude: ["welcome://*"]}}
    prompts: {{prefix: beta_, exclude: [greeting]}}
"""


def serving(sp, names: list[str]) -> bool:
    """Whether upstreams `names` (in order) are ready with resources and prompts imported, and
    the registry generation that imported them is the one served: /status reports an
    upstream's import as that generation is built, a moment before it is served, and its
    top-level tool count is the served generation's."""
    status = sp.status()
    ups = status["upstreams"]
    return ([u["name"] for u in ups] == names
            and all(u["state"] == "ready" and u["resources"] > 0 and u["prompts"] > 0 for u in ups)
            and status["tools"] == sum(u["imported"] for u in ups))


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
        wait_until(lambda: serving(sp, ["alpha", "beta"]), timeout=30)
        yield sp
    finally:
        stop(sp.proc, upstream)
        log.close()
        print((tmp / "server.log").read_text()[-4000:])
        shutil.rmtree(tmp, ignore_errors=True)


class Notifications:
    """The notifications a client received (method and `uri`), and a wait for one of them."""

    def __init__(self):
        self.seen: list[tuple[str, str]] = []
        self.arrived = asyncio.Event()

    async def on_message(self, m):
        method = getattr(m, "method", None) or getattr(getattr(m, "root", None), "method", None)
        if method:
            params = getattr(m, "params", None)
            self.seen.append((method, str(getattr(params, "uri", "")) if params else ""))
            self.arrived.set()

    async def wait_for(self, method: str, uri: str = ""):
        for _ in range(200):
            if (method, uri) in self.seen:
                return
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 10)
        raise AssertionError(f"{method} {uri} never came: {self.seen}")


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
            # Policies select an upstream's resources by their served URI, or its template
            # (whose variables they read as `args`).
            with pytest.raises(MCPError, match="no-beta-chapters"):
                await c.read_resource("beta+book://dune/chapter/1")
            with pytest.raises(MCPError, match="no-forbidden-titles"):
                await c.read_resource("alpha+book://forbidden/chapter/1")
            # Only what the upstream lists, or its templates produce, is read: no dot
            # segments, encoded slashes, or other spellings of an excluded URI.
            for sneaky in [
                "alpha+file:///public/../leak.txt",
                "alpha+file:///%6ceak.txt",
                "alpha+FILE:///leak.txt",
                "alpha+book://..%2F..%2Fleak.txt/chapter/1",
                "alpha+book://../chapter/1",
                "alpha+file:///unlisted.md",
            ]:
                with pytest.raises(MCPError, match="not found"):
                    await c.read_resource(sneaky)

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
        notes = Notifications()
        seen, on_message, wait_for = notes.seen, notes.on_message, notes.wait_for

        async with Client(gateway.url, mode="legacy", message_handler=on_message) as c:
            await c.subscribe_resource("alpha+file:///guide.md")
            r = await c.call_tool("a_new_edition", {})
            assert not r.is_error, r
            await wait_for("notifications/resources/updated", "alpha+file:///guide.md")
            assert await text_of(c, "alpha+file:///guide.md") == "# alpha guide, edition 2"
            # The other upstream's guide was not subscribed to: not told. (Then alpha's again,
            # which is: had beta's come, it would have come before it.)
            r = await c.call_tool("b_new_edition", {})
            assert not r.is_error, r
            seen.clear()
            r = await c.call_tool("a_new_edition", {})
            assert not r.is_error, r
            await wait_for("notifications/resources/updated", "alpha+file:///guide.md")
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
                with pytest.raises(MCPError, match="not found"):
                    await c.subscribe_resource(uri)
            # A policy refuses a subscription as it refuses a read.
            with pytest.raises(MCPError, match="no-beta-chapters"):
                await c.subscribe_resource("beta+book://dune/chapter/1")

    asyncio.run(run())


# The same offers from servers on the official Go SDK: two go-mcp processes
# (tests/e2e/upstream-go) over stdio, `-name ga` and `-name gb`, both listing file:///guide.md,
# the template book://{title}/chapter/{n} and the prompt summarize.
GO_MCP_SOURCE = ROOT / "tests" / "e2e" / "upstream-go"


@functools.cache
def go_mcp() -> Path:
    """The go-mcp binary: QUIVER_GO_MCP if set, else built once per run with the command line
    of tests/e2e/upstream-go/build.sh (static, modules through Go's proxy) into the cache
    outside the clone. Go's build cache makes the build of an unchanged source take about a
    second, and a changed one is never served stale. build.sh itself is not run: it also
    builds an image, which needs dockerd."""
    given = os.environ.get("QUIVER_GO_MCP")
    if given:
        assert os.access(given, os.X_OK), f"QUIVER_GO_MCP={given} is not an executable"
        return Path(given)
    go = shutil.which("go")
    if go is None:
        pytest.fail(f"`go` is not on PATH: it builds the Go SDK upstream of these tests ({GO_MCP_SOURCE}); or set QUIVER_GO_MCP")
    out = Path(os.environ.get("QUIVER_CACHE", Path.home() / ".cache" / "quiver")) / "upstream-go" / "sdk-tests" / "go-mcp"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOFLAGS": "-mod=mod -buildvcs=false", "CGO_ENABLED": "0"}
    proc = subprocess.run([go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(out), "."],
                          cwd=GO_MCP_SOURCE, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"building go-mcp in {GO_MCP_SOURCE} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return out


def go_config(binary: Path) -> str:
    return f"""
server: {{name: gateway}}
upstreams:
  - name: ga
    stdio: {{command: [{binary}, -name, ga]}}
    tools: {{prefix: ga_}}
    resources: {{}}
    prompts: {{}}
  - name: gb
    stdio: {{command: [{binary}, -name, gb]}}
    tools: {{prefix: gb_}}
    resources: {{}}
    prompts: {{prefix: gb_}}
"""


@pytest.fixture()
def go_gateway():
    assert BIN.exists(), f"build the server first: {BIN} (cargo build -p quiver-server)"
    binary = go_mcp()
    tmp = Path(tempfile.mkdtemp(prefix="quiver-go-offers-"))
    path = tmp / "tools.yaml"
    path.write_text(go_config(binary))
    sp = start_server(path, tmp / "server.log")
    try:
        wait_until(lambda: serving(sp, ["ga", "gb"]), timeout=30)
        yield sp
    finally:
        stop(sp.proc)
        print((tmp / "server.log").read_text()[-4000:])
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_two_go_sdk_upstreams_resources_and_prompts_are_served_apart(go_gateway, mode):
    async def run():
        async with Client(go_gateway.url, mode=mode) as c:
            uris = sorted(str(r.uri) for r in (await c.list_resources(cache_mode="bypass")).resources)
            assert uris == ["ga+file:///guide.md", "gb+file:///guide.md"]
            templates = sorted(t.uri_template for t in (await c.list_resource_templates(cache_mode="bypass")).resource_templates)
            assert templates == ["ga+book://{title}/chapter/{n}", "gb+book://{title}/chapter/{n}"]
            # The same URI at two upstreams: each read reaches its own process.
            assert await text_of(c, "ga+file:///guide.md") == "# ga guide, edition 1"
            assert await text_of(c, "gb+file:///guide.md") == "# gb guide, edition 1"
            # A URI of an upstream's template, read through the served template.
            assert await text_of(c, "gb+book://dune/chapter/3") == "gb: dune, chapter 3"
            assert await text_of(c, "ga+book://emma/chapter/12") == "ga: emma, chapter 12"
            with pytest.raises(MCPError):
                await c.read_resource("ga+file:///missing.md")

            prompts = {p.name: p for p in (await c.list_prompts(cache_mode="bypass")).prompts}
            assert set(prompts) == {"summarize", "gb_summarize"}
            for p in prompts.values():
                assert [(a.name, a.required) for a in p.arguments] == [("text", True)]
            for name, upstream in [("summarize", "ga"), ("gb_summarize", "gb")]:
                r = await c.get_prompt(name, {"text": "a long story"})
                assert [m.role for m in r.messages] == ["user", "assistant"]
                assert r.messages[0].content.text == f"[{upstream}] Summarize: a long story"
                # The link to the upstream's guide names the guide as served here.
                link = r.messages[1].content
                assert (link.type, str(link.uri)) == ("resource_link", f"{upstream}+file:///guide.md"), link
            with pytest.raises(MCPError, match="Missing required argument"):
                await c.get_prompt("gb_summarize", {})

    asyncio.run(run())


def test_a_go_sdk_upstreams_update_reaches_its_subscriber(go_gateway):
    async def run():
        notes = Notifications()
        seen, on_message, wait_for = notes.seen, notes.on_message, notes.wait_for

        async with Client(go_gateway.url, mode="legacy", message_handler=on_message) as c:
            await c.subscribe_resource("ga+file:///guide.md")
            # gb's guide changes first, unsubscribed: its update is not sent on. gb sent it
            # before its answer to the call, so a wrongly forwarded one would be sent on
            # before ga's, which is awaited.
            r = await c.call_tool("gb_new_edition", {})
            assert (r.is_error, r.content[0].text) == (False, "edition 2"), r
            r = await c.call_tool("ga_new_edition", {})
            assert (r.is_error, r.content[0].text) == (False, "edition 2"), r
            await wait_for("notifications/resources/updated", "ga+file:///guide.md")
            assert await text_of(c, "ga+file:///guide.md") == "# ga guide, edition 2"
            assert await text_of(c, "gb+file:///guide.md") == "# gb guide, edition 2"
            assert [s for s in seen if s[0] == "notifications/resources/updated"] == [("notifications/resources/updated", "ga+file:///guide.md")], seen

            # Unsubscribed from ga's guide and subscribed to gb's: ga's next edition is not
            # sent on (ga sent it before gb's, which is awaited), gb's is.
            await c.unsubscribe_resource("ga+file:///guide.md")
            await c.subscribe_resource("gb+file:///guide.md")
            r = await c.call_tool("ga_new_edition", {})
            assert (r.is_error, r.content[0].text) == (False, "edition 3"), r
            r = await c.call_tool("gb_new_edition", {})
            assert (r.is_error, r.content[0].text) == (False, "edition 3"), r
            await wait_for("notifications/resources/updated", "gb+file:///guide.md")
            assert [s for s in seen if s[0] == "notifications/resources/updated"] == [
                ("notifications/resources/updated", "ga+file:///guide.md"),
                ("notifications/resources/updated", "gb+file:///guide.md"),
            ], seen
            assert await text_of(c, "ga+file:///guide.md") == "# ga guide, edition 3"

    asyncio.run(run())


def test_2026_listens_get_a_go_sdk_upstreams_updates(go_gateway):
    async def run():
        async with Client(go_gateway.url, mode="auto") as c:
            assert c.protocol_version == "2026-07-28"
            async with c.listen(resource_subscriptions=["gb+file:///guide.md"]) as sub:
                r = await c.call_tool("gb_new_edition", {})
                assert not r.is_error, r
                event = await asyncio.wait_for(sub.__anext__(), 10)
                assert "gb+file:///guide.md" in repr(event), event
            assert await text_of(c, "gb+file:///guide.md") == "# gb guide, edition 2"

    asyncio.run(run())


# An upstream that speaks protocol 2026-07-28: `revision: 2026-07-28` chosen for one that
# speaks both, and `auto` finding it for one that refuses `initialize`.
def stateless_config(both_url: str, only_url: str) -> str:
    return f"""
server: {{name: gateway}}
upstreams:
  - name: both
    http: {{url: {both_url}}}
    revision: "2026-07-28"
    tools: {{prefix: both_}}
    resources: {{exclude: ["file:///leak*"]}}
    prompts: {{prefix: both_}}
  - name: only
    http: {{url: {only_url}}}
    tools: {{prefix: only_}}
    resources: {{exclude: ["file:///leak*"]}}
    prompts: {{prefix: only_}}
"""


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture()
def stateless_gateway():
    assert BIN.exists(), f"build the server first: {BIN} (cargo build -p quiver-server)"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-offers-2026-"))
    ports = free_port(), free_port()
    log = open(tmp / "upstreams.log", "w")
    ups = [
        subprocess.Popen([sys.executable, str(UPSTREAM), "both", "http", str(ports[0])], stdout=log, stderr=subprocess.STDOUT),
        subprocess.Popen([sys.executable, str(UPSTREAM), "only", "http", str(ports[1]), "--2026-only"], stdout=log, stderr=subprocess.STDOUT),
    ]
    path = tmp / "tools.yaml"
    path.write_text(stateless_config(*(f"http://127.0.0.1:{p}/mcp" for p in ports)))
    # Listening before the gateway picks its own free ports (which could be theirs).
    wait_until(lambda: all(listening(p) for p in ports), timeout=30)
    sp = start_server(path, tmp / "server.log")
    try:
        wait_until(lambda: serving(sp, ["both", "only"]), timeout=30)
        yield sp
    finally:
        stop(sp.proc, *ups)
        log.close()
        print((tmp / "server.log").read_text()[-4000:])
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_2026_upstreams_serve_clients_of_either_revision(stateless_gateway, mode):
    status = {u["name"]: u for u in stateless_gateway.status()["upstreams"]}
    assert {n: u["protocolVersion"] for n, u in status.items()} == {"both": "2026-07-28", "only": "2026-07-28"}

    async def run():
        async with Client(stateless_gateway.url, mode=mode) as c:
            for name in ["both", "only"]:
                assert await text_of(c, f"{name}+file:///guide.md") == f"# {name} guide, edition 1"
                assert await text_of(c, f"{name}+book://dune/chapter/2") == f"{name}: dune, chapter 2"
                r = await c.get_prompt(f"{name}_summarize", {"text": "t"})
                assert r.messages[0].content.text == f"[{name}] Summarize (short): t"
                r = await c.call_tool(f"{name}_new_edition", {})
                assert not r.is_error and r.content[0].text.startswith("edition "), r

    asyncio.run(run())


def test_2026_upstreams_changes_and_updates_reach_clients(stateless_gateway):
    async def run():
        notes = Notifications()
        seen, on_message, wait_for = notes.seen, notes.on_message, notes.wait_for

        async with Client(stateless_gateway.url, mode="legacy", message_handler=on_message) as c:
            await c.subscribe_resource("only+file:///guide.md")
            # The upstream is told by its listen being opened again with the URI: a few
            # editions may pass before it is; each one after is relayed.
            for _ in range(50):
                r = await c.call_tool("only_new_edition", {})
                assert not r.is_error, r
                try:
                    await asyncio.wait_for(wait_for("notifications/resources/updated", "only+file:///guide.md"), 0.5)
                    break
                except (asyncio.TimeoutError, TimeoutError):
                    continue
            else:
                raise AssertionError(f"no update relayed: {seen}")
            r = await c.call_tool("both_add_appendix", {})
            assert not r.is_error, r
            await wait_for("notifications/resources/list_changed")
            await wait_for("notifications/prompts/list_changed")
            uris = [str(x.uri) for x in (await c.list_resources(cache_mode="bypass")).resources]
            assert "both+file:///appendix.md" in uris
            names = [p.name for p in (await c.list_prompts(cache_mode="bypass")).prompts]
            assert "both_translate" in names

    asyncio.run(run())


def test_an_upstreams_limits_count_its_reads_and_prompts():
    assert BIN.exists(), f"build the server first: {BIN} (cargo build -p quiver-server)"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-offers-limits-"))
    path = tmp / "tools.yaml"
    path.write_text(f"""
server: {{name: gateway}}
upstreams:
  - name: alpha
    stdio: {{command: [{sys.executable}, {UPSTREAM}, alpha, stdio]}}
    tools: {{limits: [{{rate: 1/h, burst: 3, per: all}}]}}
    resources: {{}}
    prompts: {{}}
""")
    sp = start_server(path, tmp / "server.log")
    try:
        wait_until(lambda: serving(sp, ["alpha"]), timeout=30)

        async def run():
            async with Client(sp.url, mode="legacy") as c:
                assert await text_of(c, "alpha+file:///guide.md") == "# alpha guide, edition 1"
                r = await c.get_prompt("summarize", {"text": "t"})
                assert r.messages[0].content.text == "[alpha] Summarize (short): t"
                r = await c.call_tool("new_edition", {})
                assert not r.is_error, r
                # The burst of 3 is spent by one read, one get and one call, together.
                with pytest.raises(MCPError, match="Rate limited: upstream alpha's rate limit refused this call of resources/read"):
                    await c.read_resource("alpha+file:///guide.md")
                with pytest.raises(MCPError, match="Rate limited: .* prompts/get"):
                    await c.get_prompt("summarize", {"text": "t"})

        asyncio.run(run())
    finally:
        stop(sp.proc)
        print((tmp / "server.log").read_text()[-3000:])
        shutil.rmtree(tmp, ignore_errors=True)


async def on_elicit(context, params):
    assert params.message == "What is your name?"
    return types.ElicitResult(action="accept", content={"name": "Ada"})


async def on_sample(context, params):
    assert getattr(params.messages[0].content, "text", "") == "Greet Ada"
    return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="Good morning"), model="test-model")


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_an_upstreams_questions_reach_the_client_of_the_call(gateway, mode):
    """beta (Streamable HTTP) asks the user and the model mid-call: the questions reach this
    call's client, in a session (legacy) or as input rounds (2026-07-28, the call made again
    with the answers), and the answers reach the upstream."""

    async def run():
        async with Client(gateway.url, mode=mode, elicitation_callback=on_elicit, sampling_callback=on_sample) as c:
            r = await c.call_tool("b_greet_user", {})
            assert (r.is_error, r.content[0].text) == (False, "Ada: Good morning"), r
        # A client that did not declare elicitation: refused cleanly, never hanging (a tool
        # error naming the capability in a session; 2026-07-28 answers the request with its
        # missing-capability error).
        async with Client(gateway.url, mode=mode) as bare:
            if mode == "legacy":
                r = await bare.call_tool("b_greet_user", {})
                assert r.is_error and "elicitation" in r.content[0].text, r
            else:
                with pytest.raises(MCPError, match="elicitation"):
                    await bare.call_tool("b_greet_user", {})

    asyncio.run(run())


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_2026_upstreams_input_rounds_reach_the_client_of_the_call(stateless_gateway, mode):
    """Upstreams spoken to in 2026-07-28 ask the user and the model as input rounds (an
    `input_required` result): each question reaches the call's client (as a request in its
    session, or as the client's own input round), and the call is made again with the
    answers and the upstream's requestState until it completes; the same tool reached over
    2025-11-25 asks mid-call. A client that cannot answer gets a clean refusal."""

    async def run():
        async with Client(stateless_gateway.url, mode=mode, elicitation_callback=on_elicit, sampling_callback=on_sample) as c:
            for name in ["both", "only"]:
                r = await c.call_tool(f"{name}_greet_in_rounds", {})
                assert (r.is_error, r.content[0].text) == (False, "Ada: Good morning"), r
        # Not declared by the client, so not declared to the upstream, which refuses the
        # call naming the capability: a tool error, never a hang.
        async with Client(stateless_gateway.url, mode=mode) as bare:
            r = await bare.call_tool("only_greet_in_rounds", {})
            assert r.is_error and "elicitation capability" in r.content[0].text, r

    asyncio.run(run())


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_legacy_upstreams_resolved_questions_reach_the_client_of_the_call(gateway, mode):
    """The same tool over 2025-11-25 (beta) asks its questions mid-call; either client
    revision answers them."""

    async def run():
        async with Client(gateway.url, mode=mode, elicitation_callback=on_elicit, sampling_callback=on_sample) as c:
            r = await c.call_tool("b_greet_in_rounds", {})
            assert (r.is_error, r.content[0].text) == (False, "Ada: Good morning"), r

    asyncio.run(run())


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_completions_of_an_upstreams_prompts_and_templates(gateway, mode):
    """`completion/complete` of an upstream's prompt argument or template variable goes to
    that upstream (in its own names, with the arguments already chosen); its values come
    back redacted; a template the caller may not read completes nothing."""

    async def run():
        async with Client(gateway.url, mode=mode) as c:
            r = await c.complete(types.PromptReference(type="ref/prompt", name="beta_summarize"), {"name": "style", "value": ""})
            assert r.completion.values == ["short", "long", "as [redacted]"], r
            r = await c.complete(types.PromptReference(type="ref/prompt", name="summarize"), {"name": "style", "value": ""})
            assert r.completion.values == ["short", "long", "as [redacted]"], r
            chapter = types.ResourceTemplateReference(type="ref/resource", uri="alpha+book://{title}/chapter/{n}")
            r = await c.complete(chapter, {"name": "title", "value": "d"})
            assert (r.completion.values, r.completion.total) == (["dune", "dracula"], 5), r
            r = await c.complete(chapter, {"name": "n", "value": ""}, {"title": "dune"})
            assert r.completion.values == ["dune-1", "dune-2"], r
            # The policy no-forbidden-titles (args.title != 'forbidden'): a value a read
            # would refuse is never offered (and the count of what was left out not told),
            # and typing it is refused, whatever the client claims it chose.
            r = await c.complete(chapter, {"name": "title", "value": ""}, {"title": "dune"})
            assert (r.completion.values, r.completion.total) == (["dune", "dracula", "emma", "middlemarch"], None), r
            with pytest.raises(MCPError, match="no-forbidden-titles"):
                await c.complete(chapter, {"name": "title", "value": "forbidden"}, {"title": "dune"})
            with pytest.raises(MCPError, match="not an argument"):
                await c.complete(chapter, {"name": "chapter", "value": ""})
            # The policy no-beta-chapters refuses reading beta's chapters: completing them too.
            with pytest.raises(MCPError):
                await c.complete(types.ResourceTemplateReference(type="ref/resource", uri="beta+book://{title}/chapter/{n}"), {"name": "title", "value": ""})
            # A local prompt still completes from its configured values (none here).
            r = await c.complete(types.PromptReference(type="ref/prompt", name="local-prompt"), {"name": "x", "value": ""})
            assert r.completion.values == [], r

    asyncio.run(run())


def test_resources_a_tool_result_links_are_served_by_the_gateway(gateway):
    """A tool of an upstream whose resources are imported links and embeds its resources: the
    result names them as the gateway serves them, so the client reads the link through it."""

    async def run():
        async with Client(gateway.url, mode="legacy") as c:
            for name, tool in [("alpha", "a_find_guide"), ("beta", "b_find_guide")]:
                r = await c.call_tool(tool, {})
                link, embedded = r.content
                assert (link.type, str(link.uri)) == ("resource_link", f"{name}+file:///guide.md"), r
                assert str(embedded.resource.uri) == f"{name}+book://dune/chapter/1", r
                assert (await text_of(c, str(link.uri))).startswith(f"# {name} guide"), r

    asyncio.run(run())


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_2026_upstreams_prompt_and_resource_that_ask(stateless_gateway, mode):
    """A prompt get and a resource read the 2026-07-28 upstream answers with
    `input_required`: a 2026-07-28 client answers the question in its own input round; a
    client of an earlier revision gets an error saying what it would need."""

    async def run():
        async with Client(stateless_gateway.url, mode=mode, elicitation_callback=on_elicit) as c:
            if mode == "auto":
                r = await c.get_prompt("only_greeting", {})
                assert r.messages[0].content.text == "Greet Ada", r
                assert await text_of(c, "only+welcome://en") == "Welcome (en), Ada"
            else:
                with pytest.raises(MCPError, match="2026-07-28"):
                    await c.get_prompt("only_greeting", {})
                with pytest.raises(MCPError, match="2026-07-28"):
                    await text_of(c, "only+welcome://en")

    asyncio.run(run())


# A 2026-07-28 upstream whose tool routes by an argument: `x-mcp-header` on `city` and
# `days` asks every caller to repeat them in `Mcp-Param-City` and `Mcp-Param-Days`, and
# the upstream (quiver-server itself here, which checks them) refuses a call without them.
ROUTED = """
server: {name: regions}
tools:
  - name: forecast
    description: The forecast of a city, routed by the city
    inputSchema:
      type: object
      properties:
        city: {type: string, x-mcp-header: City}
        days: {type: integer, x-mcp-header: Days}
      required: [city]
    handler: {template: "{{city}}: sunny for {{days}} days"}
"""


def raw_2026_call(url: str, args: dict, headers: dict) -> dict:
    import json
    import urllib.error
    import urllib.request

    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "forecast", "arguments": args,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}}}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "forecast", **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)


def test_a_2026_upstream_gets_the_arguments_its_tool_declares_as_headers():
    assert BIN.exists(), f"build the server first: {BIN} (cargo build -p quiver-server)"
    tmp = Path(tempfile.mkdtemp(prefix="quiver-param-headers-"))
    procs = []
    try:
        (tmp / "upstream.yaml").write_text(ROUTED)
        up = start_server(tmp / "upstream.yaml", tmp / "upstream.log")
        procs.append(up.proc)
        wait_until(lambda: up.status()["ready"], timeout=30)
        # The upstream holds callers to it: without the header, no forecast.
        args = {"city": "Oslo", "days": 2}
        refused = raw_2026_call(up.url, args, {})
        assert "Header mismatch" in str(refused.get("error")), refused
        ok = raw_2026_call(up.url, args, {"Mcp-Param-City": "Oslo", "Mcp-Param-Days": "2"})
        assert ok.get("result", {}).get("content", [{}])[0].get("text") == "Oslo: sunny for 2 days", ok

        (tmp / "gateway.yaml").write_text(f"""
server: {{name: gateway}}
upstreams:
  - name: regions
    http: {{url: {up.url}}}
    revision: "2026-07-28"
    tools: {{prefix: r_}}
""")
        gw = start_server(tmp / "gateway.yaml", tmp / "gateway.log")
        procs.append(gw.proc)
        wait_until(lambda: gw.status()["tools"] == 1, timeout=30)

        async def run():
            async with Client(gw.url, mode="legacy") as c:
                # Not ASCII, an integer, and a value with blanks at its ends: each mirrored as
                # the upstream compares it (base64 where plain text would not carry it).
                for city, days in [("Zürich", 3), ("Oslo", 1), (" São Paulo ", 10)]:
                    r = await c.call_tool("r_forecast", {"city": city, "days": days})
                    assert not r.is_error, r
                    assert r.content[0].text == f"{city}: sunny for {days} days", r

        asyncio.run(run())
    finally:
        stop(*procs)
        for log in ("upstream.log", "gateway.log"):
            if (tmp / log).exists():
                print(f"--- {log}\n" + (tmp / log).read_text()[-3000:])
        shutil.rmtree(tmp, ignore_errors=True)
