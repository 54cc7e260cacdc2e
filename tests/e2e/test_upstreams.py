"""Upstream MCP servers on a real kind cluster, with tests/e2e/go-gateway.yaml:
one McpServer serves local YAML tools, the tools of a stdio MCP server image built here (go-mcp,
on the official Go SDK) run as a sidecar, and the tools of a remote go-mcp over Streamable HTTP,
through one endpoint, driven by the official Python SDK client. A tools filter change
hot-reloads without a restart; a remote that goes away is reported on the McpServer.

Besides, an McpServer fronts the resources and prompts of two go-mcp sidecars that list the
same URIs and the same prompt name: a client of its Service reads each upstream's own."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import yaml
from conftest import Namespace, eventually
from mcp import Client

# scripts/e2e.sh pushes the go-mcp image to the cluster's registry and names it here.
GO_MCP = os.environ.get("QUIVER_E2E_GO_MCP_IMAGE", "quiver-e2e/go-mcp:dev")
SAMPLE = (Path(__file__).parent / "go-gateway.yaml").read_text().replace("quiver-e2e/go-mcp:dev", GO_MCP)


async def tools_and_calls(url: str, calls: list[tuple[str, dict]]) -> tuple[dict[str, str], list]:
    async with Client(url, mode="legacy") as c:
        tools = {t.name: t.description or "" for t in (await c.list_tools(cache_mode="bypass")).tools}
        results = [await c.call_tool(name, args) for name, args in calls]
        return tools, results


def text(r) -> str:
    return r.content[0].text if r.content else ""


def test_one_endpoint_fronts_a_sidecar_image_and_a_remote_server(ns: Namespace):
    ns.apply(SAMPLE)
    ns.wait_condition("gateway", "Ready", "True", 240)
    ns.wait_condition("gateway", "UpstreamsReady", "True", 180)
    pod = ns.pods("gateway")[0]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["server", "upstream-go-stdio"]
    with ns.port_forward("svc/gateway", 8080) as port:
        url = f"http://127.0.0.1:{port}/mcp"
        wanted = {"hello"} | {f"local_go_{t}" for t in ["echo", "add", "whoami", "slow", "new_edition"]} | {
            f"remote_{t}" for t in ["echo", "add", "whoami", "new_edition"]}

        def served():
            tools, results = asyncio.run(
                tools_and_calls(url, [("hello", {"name": "k8s"}), ("local_go_add", {"a": 2, "b": 3}), ("local_go_whoami", {}), ("remote_whoami", {})])
            )
            return (tools, results) if set(tools) == wanted else None

        tools, (hello, add, local_who, remote_who) = eventually("the gateway to list every upstream tool", served, 120, 1)
        assert tools["remote_echo"] == "Echoes the text back (served by the remote go-mcp)."
        assert text(hello) == "Hello k8s!"
        assert (add.is_error, text(add)) == (False, "5")
        # The stdio server runs in the gateway's own pod (a sidecar shares its hostname); the
        # remote one in another pod.
        assert "transport=stdio" in text(local_who) and f"host={pod['metadata']['name']}" in text(local_who), text(local_who)
        assert "transport=http" in text(remote_who) and pod["metadata"]["name"] not in text(remote_who), text(remote_who)

        # A filter change reaches the running pod through the ConfigMap: no restart, and
        # the upstream's processes are the same (same pid).
        generation = ns.get("deploy", "gateway")["metadata"]["generation"]

        def pids(tool: str) -> set[str]:
            _, results = asyncio.run(tools_and_calls(url, [(tool, {})] * 6))
            return {text(r).split()[0] for r in results}

        before = pids("local_go_whoami")
        assert len(before) == 2, f"calls spread over the two processes: {before}"
        mcps = yaml.safe_load_all(SAMPLE)
        spec = next(d for d in mcps if d["kind"] == "McpServer")["spec"]
        spec["upstreams"][0]["tools"] = {"prefix": "go_", "include": ["echo", "whoami"]}
        ns.patch_mcps("gateway", {"spec": {"upstreams": spec["upstreams"]}})

        def reloaded():
            tools, results = asyncio.run(tools_and_calls(url, [("go_whoami", {})]))
            return (tools, results) if "go_echo" in tools else None

        tools, (who,) = eventually("the filter change to be served", reloaded, 60, 0.5)
        assert set(tools) == {"hello", "go_echo", "go_whoami"} | {f"remote_{t}" for t in ["echo", "add", "whoami", "new_edition"]}
        assert text(who).split()[0] in before and pids("go_whoami") == before, "the upstream processes were restarted"
        after = ns.pods("gateway")
        assert [p["metadata"]["uid"] for p in after] == [pod["metadata"]["uid"]], "the pod was replaced"
        assert all(s["restartCount"] == 0 for s in after[0]["status"]["containerStatuses"])
        assert ns.get("deploy", "gateway")["metadata"]["generation"] == generation

        # The remote goes away: its calls fail with a clear error and the McpServer says which
        # upstream is down; it comes back by itself.
        ns.k("scale", "deploy/go-remote", "--replicas=0")
        down = ns.wait_condition("gateway", "UpstreamsReady", "False", 150)
        assert "upstream `go-remote` is down" in down["message"], down
        _, (failed,) = asyncio.run(tools_and_calls(url, [("remote_echo", {"text": "x"})]))
        assert failed.is_error and "upstream `go-remote`" in text(failed), text(failed)
        events = ns.get("events", "--field-selector", "reason=UpstreamDown")["items"]
        assert any("go-remote" in e["message"] for e in events), events
        ns.k("scale", "deploy/go-remote", "--replicas=1")
        ns.wait_condition("gateway", "UpstreamsReady", "True", 150)
        _, (back,) = asyncio.run(tools_and_calls(url, [("remote_echo", {"text": "back"})]))
        assert (back.is_error, text(back)) == (False, "back")


def library(name: str, prompts: dict) -> dict:
    """An upstream entry of a go-mcp sidecar run as `go-mcp -name NAME`: its guide
    (file:///guide.md), chapters (book://{title}/chapter/{n}) and prompt summarize say NAME.
    Its tools are not what the test is about: one, prefixed, so that no name collides."""
    return {
        "name": name,
        "stdio": {"image": GO_MCP, "command": ["/usr/local/bin/go-mcp", "-name", name]},
        "tools": {"prefix": f"{name}_", "include": ["whoami"]},
        "resources": {},
        "prompts": prompts,
    }


# Two go-mcp upstreams with the same resource URIs and the same prompt name: the URIs are
# served under each upstream's name, and one upstream's prompt takes a prefix.
LIBRARY = {
    "apiVersion": "quiver.dev/v1alpha1",
    "kind": "McpServer",
    "metadata": {"name": "library"},
    "spec": {"upstreams": [library("north", {}), library("south", {"prefix": "south_"})]},
}
GUIDES = ["north+file:///guide.md", "south+file:///guide.md"]
PROMPTS = ["south_summarize", "summarize"]


async def offers(url: str) -> tuple[list[str], list[str]]:
    """The served resource URIs and prompt names, sorted."""
    async with Client(url, mode="legacy") as c:
        uris = sorted(str(r.uri) for r in (await c.list_resources(cache_mode="bypass")).resources)
        prompts = sorted(p.name for p in (await c.list_prompts(cache_mode="bypass")).prompts)
        return uris, prompts


async def reads(url: str, mode: str) -> dict:
    """Each guide's text, a chapter of each, and each prompt's messages, in one session."""
    async with Client(url, mode=mode) as c:
        out: dict = {}
        for uri in [*GUIDES, "north+book://dune/chapter/3", "south+book://dune/chapter/3"]:
            r = await c.read_resource(uri)
            out[uri] = [(str(x.uri), x.text) for x in r.contents]
        for name in PROMPTS:
            r = await c.get_prompt(name, {"text": "the cluster"})
            out[name] = [(m.role, m.content.type, said(m.content)) for m in r.messages]
        return out


def said(content) -> str:
    """A prompt message's text, or the URI it links to."""
    return content.text if content.type == "text" else str(content.uri)


def test_two_upstreams_with_the_same_uris_and_prompt_name_are_read_apart(ns: Namespace):
    ns.apply(LIBRARY)
    ns.wait_condition("library", "Ready", "True", 240)
    ns.wait_condition("library", "UpstreamsReady", "True", 180)
    pod = ns.pods("library")[0]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["server", "upstream-north", "upstream-south"]
    with ns.port_forward("svc/library", 8080) as port:
        url = f"http://127.0.0.1:{port}/mcp"

        # Connected is not yet listed: the upstreams' lists are read after their handshakes.
        def listed():
            got = asyncio.run(offers(url))
            return got if got == (GUIDES, PROMPTS) else None

        eventually("both upstreams' guides and prompts to be listed", listed, 120, 1)
        for mode in ["legacy", "auto"]:
            got = asyncio.run(reads(url, mode))
            for up in ["north", "south"]:
                # Each read reached its own upstream (the text names it) and came back under
                # the URI it was asked by.
                assert got[f"{up}+file:///guide.md"] == [(f"{up}+file:///guide.md", f"# {up} guide, edition 1")], (mode, got)
                assert got[f"{up}+book://dune/chapter/3"] == [(f"{up}+book://dune/chapter/3", f"{up}: dune, chapter 3")], (mode, got)
            for name, up in [("summarize", "north"), ("south_summarize", "south")]:
                assert got[name] == [
                    ("user", "text", f"[{up}] Summarize: the cluster"),
                    ("assistant", "resource_link", f"{up}+file:///guide.md"),
                ], (mode, got)
