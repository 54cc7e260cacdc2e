"""The catalog on a real kind cluster: three McpServers in two namespaces, read through the
chart's `quiver-catalog` Service with ServiceAccount tokens the cluster mints. A reader of one
namespace sees exactly that namespace's servers, never the other's (not by list, not by name,
not through the other namespace's path), and an entry's in-cluster remote is a working MCP
endpoint."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest
from conftest import Namespace, eventually, kubectl
from mcp import Client

PREFIX = "dev.quiver"  # the chart's catalog.namePrefix


def server(name: str, tool: str) -> dict:
    return {
        "apiVersion": "quiver.dev/v1alpha1",
        "kind": "McpServer",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "server": {"title": name.capitalize(), "version": "1.0.0"},
            "catalog": {"description": f"The {name} tools"},
            "tools": [{"name": tool, "description": f"{tool} of {name}", "input": {"x": "string"},
                       "handler": {"template": f"{name}:{{{{x}}}}"}}],
        },
    }


def reader(ns: Namespace) -> str:
    """A ServiceAccount of `ns` that may list McpServers there (and nowhere else); its token."""
    ns.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "catalog-reader"}})
    ns.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "mcp-list"},
              "rules": [{"apiGroups": ["quiver.dev"], "resources": ["mcpservers"], "verbs": ["list"]}]})
    ns.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
              "metadata": {"name": "catalog-reader"},
              "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mcp-list"},
              "subjects": [{"kind": "ServiceAccount", "name": "catalog-reader", "namespace": ns.name}]})
    return ns.k("create", "token", "catalog-reader", "--duration=10m").strip()


@pytest.fixture
def other_ns() -> Iterator[Namespace]:
    name = f"e2e-catalog-b-{uuid.uuid4().hex[:5]}"
    kubectl("create", "namespace", name)
    namespace = Namespace(name)
    try:
        yield namespace
    finally:
        kubectl("delete", "namespace", name, "--wait=false", check=False)


def get(port: int, path: str, token: str | None) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, {}


def names(port: int, path: str, token: str) -> list[str]:
    code, body = get(port, path, token)
    assert code == 200, (path, code)
    return sorted(s["server"]["name"] for s in body["servers"])


def test_each_namespace_reader_sees_only_its_namespace_servers(ns: Namespace, other_ns: Namespace):
    a, b = ns, other_ns
    a.apply(server("weather", "forecast"))
    a.apply(server("news", "headlines"))
    b.apply(server("billing", "invoice"))
    token_a, token_b = reader(a), reader(b)
    want_a = [f"{PREFIX}.{a.name}/news", f"{PREFIX}.{a.name}/weather"]
    want_b = [f"{PREFIX}.{b.name}/billing"]

    system = Namespace("quiver-system")
    with system.port_forward("svc/quiver-catalog", 8082) as port:
        assert get(port, "/v0.1/servers", None)[0] == 401
        assert get(port, "/v0.1/servers", "not-a-token")[0] == 401

        # The operator's watch delivers the new McpServers within moments.
        eventually("A's two servers in A's catalog", lambda: names(port, "/v0.1/servers", token_a) == want_a)
        eventually("B's server in B's catalog", lambda: names(port, "/v0.1/servers", token_b) == want_b)
        # The cluster holds other tests' McpServers too: each reader's whole catalog is its own
        # namespace's, and a search that would match elsewhere finds nothing more.
        assert names(port, "/v0.1/servers?search=e", token_a) == want_a
        assert names(port, "/v0.1/servers?search=billing", token_a) == []

        # By name and by the other namespace's path: as if it did not exist.
        billing = urllib.parse.quote(want_b[0], safe="")
        assert get(port, f"/v0.1/servers/{billing}/versions/latest", token_a)[0] == 404
        assert get(port, f"/v0.1/servers/{billing}/versions/latest", token_b)[0] == 200
        code, body = get(port, f"/namespaces/{b.name}/v0.1/servers", token_a)
        assert code == 404 or body.get("servers") == [], (code, body)
        assert names(port, f"/namespaces/{a.name}/v0.1/servers", token_a) == want_a

        # A's entry, read by name: what the McpServer says, and its Service as a remote.
        weather = urllib.parse.quote(want_a[1], safe="")
        code, entry = get(port, f"/v0.1/servers/{weather}/versions/latest", token_a)
        assert code == 200, code
        assert entry["server"]["description"] == "The weather tools"
        assert entry["server"]["version"] == "1.0.0"
        remotes = [r["url"] for r in entry["server"]["remotes"]]
        in_cluster = [u for u in remotes if urlparse(u).hostname == f"weather.{a.name}.svc"]
        assert in_cluster, remotes

    # That remote serves the tools the entry describes.
    url = urlparse(in_cluster[0])
    a.wait_condition("weather", "Ready", "True")

    async def call(port: int) -> None:
        async with Client(f"http://127.0.0.1:{port}{url.path}") as c:
            tools = await c.list_tools(cache_mode="bypass")
            assert [t.name for t in tools.tools] == ["forecast"]
            r = await c.call_tool("forecast", {"x": "sunny"})
            assert r.content[0].text == "weather:sunny"

    with a.port_forward("svc/weather", url.port or 80) as port:
        asyncio.run(call(port))

    # A deleted server leaves A's catalog; asked for deletions, B's reader still sees only B's.
    a.k("delete", "mcpserver", "news")
    with system.port_forward("svc/quiver-catalog", 8082) as port:
        eventually("news gone from A's catalog", lambda: names(port, "/v0.1/servers", token_a) == want_a[1:])
        code, body = get(port, "/v0.1/servers?include_deleted=true", token_a)
        assert code == 200
        status = {s["server"]["name"]: s["_meta"]["io.modelcontextprotocol.registry/official"]["status"]
                  for s in body["servers"]}
        assert status == {want_a[0]: "deleted", want_a[1]: "active"}, status
        assert names(port, "/v0.1/servers?include_deleted=true", token_b) == want_b
