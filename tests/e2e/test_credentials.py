"""Credentials on a real kind cluster, both ways, with the sample deploy/samples/authenticated-api.yaml:
an McpServer serves a tool of another, token-protected McpServer (an upstream import) with a
token from a Secret, requires a bearer token
of its own clients (the official Python SDK client with and without it), and every rotation of
either Secret reaches the running pods on the next request, with no restart. Both servers get
a NetworkPolicy."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

import mcp_types as types
import pytest
from conftest import Namespace, eventually
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

SAMPLE = (Path(__file__).parents[2] / "deploy" / "samples" / "authenticated-api.yaml").read_text()
CLIENT_TOKEN = "assistant-example-token-0123456789"
UPSTREAM_TOKEN = "inventory-example-token-0123456789"


def secret(name: str, key: str, value: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {key: value}}


def raw_post(url: str, authorization: str | None, body: bytes = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}') -> tuple[int, Message, str]:
    """One JSON-RPC POST without any SDK, to see the status and headers as they are."""
    req = urllib.request.Request(url, data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json, text/event-stream")
    if authorization:
        req.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


async def check_stock(url: str, token: str | None, item: str = "widget") -> types.CallToolResult:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = streamable_http_client(url, http_client=create_mcp_http_client(headers=headers))
    async with Client(transport) as c:
        return await c.call_tool("check-stock", {"item": item})


LAST: dict[str, str] = {}


def call_or_none(token: str, url: str, item: str = "widget") -> types.CallToolResult | None:
    """A call whose failure to connect (e.g. 401 while the pods are still reading their token
    Secret) means "not yet" to `eventually`; the last outcome is kept for the failure message."""
    try:
        r = asyncio.run(check_stock(url, token, item))
        LAST["outcome"] = f"is_error={r.is_error}: {text(r)[:500]}"
        return r
    except Exception as e:  # noqa: BLE001 - any transport or protocol error: not there yet
        LAST["outcome"] = f"{type(e).__name__}: {e!r}"[:500]
        return None


def outcome() -> str:
    return LAST.get("outcome", "no call made")


def text(result: types.CallToolResult) -> str:
    return "".join(b.text for b in result.content if isinstance(b, types.TextContent))


def pods_and_restarts(ns: Namespace, *names: str) -> dict[str, int]:
    return {
        p["metadata"]["uid"]: sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses", []))
        for name in names
        for p in ns.pods(name)
    }


def test_credentials_both_ways_rotate_without_restart(ns: Namespace):
    ns.apply(SAMPLE)
    ns.wait_condition("inventory", "Ready", "True")
    ns.wait_condition("assistant", "Ready", "True")
    before = pods_and_restarts(ns, "inventory", "assistant")

    with ns.port_forward("svc/assistant", 8080) as port:
        url = f"http://127.0.0.1:{port}/mcp"

        status, headers, body = raw_post(url, None)
        assert status == 401, body
        assert headers.get("WWW-Authenticate") == 'Bearer realm="mcp"'
        status, headers, _ = raw_post(url, "Bearer not-the-token-0123456789")
        assert status == 401
        assert 'error="invalid_token"' in headers.get("WWW-Authenticate", "")

        # The token reaches the upstream (which refuses calls without it); the caller never sees it.
        try:
            result = eventually(
                "the pods read their Secrets",
                lambda: (r := call_or_none(CLIENT_TOKEN, url)) is not None and not r.is_error and r,
                120,
            )
        except AssertionError as e:
            raise AssertionError(f"{e}; last call: {outcome()}") from None
        assert "42 units of widget in stock" in text(result), text(result)
        assert UPSTREAM_TOKEN not in text(result) and CLIENT_TOKEN not in text(result)

        # Per-tool access: `restock` needs the scope only the ops token grants.
        restock = b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"restock","arguments":{"item":"nut"}}}'
        status, headers, body = raw_post(url, f"Bearer {CLIENT_TOKEN}", restock)
        assert status == 403, body
        assert headers.get("WWW-Authenticate") == 'Bearer realm="mcp", error="insufficient_scope", scope="inventory:write"'
        status, _, body = raw_post(url, "Bearer ops-example-token-0123456789", restock)
        assert status == 200 and "ordered more nut" in body, body

        # A CA bundle from a ConfigMap: the API server's certificate verifies with the
        # cluster CA of `kube-root-ca.crt` (anonymous /version is public on kind).
        version = b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"cluster-version","arguments":{}}}'
        status, _, body = raw_post(url, f"Bearer {CLIENT_TOKEN}", version)
        assert status == 200 and "gitVersion" in body and '"isError":true' not in body, body

        # Rotate the upstream credential to a token the upstream does not accept yet: the very
        # next calls send it (and fail upstream), then the upstream learns it and they pass.
        rotated = "rotated-inventory-token-0123456789"
        ns.apply(secret("inventory-credentials", "token", rotated))
        failed = eventually(
            "the assistant sends the rotated token",
            lambda: (r := call_or_none(CLIENT_TOKEN, url)) is not None and r.is_error and r,
            30,
        )
        assert "answered HTTP 401" in text(failed) and rotated not in text(failed), text(failed)
        ns.apply(secret("inventory-clients", "tokens", f"{UPSTREAM_TOKEN}\n{rotated}\n"))
        passed = eventually(
            "the upstream accepts the rotated token",
            lambda: (r := call_or_none(CLIENT_TOKEN, url, "bolt")) is not None and not r.is_error and r,
            30,
        )
        assert "42 units of bolt in stock" in text(passed)

        # Rotate the assistant's own client tokens: the old one is refused, the new one works.
        new_client = "new-assistant-token-0123456789"
        ns.apply(secret("assistant-clients", "tokens", new_client + "\n"))
        eventually("the old client token is refused", lambda: raw_post(url, f"Bearer {CLIENT_TOKEN}")[0] == 401, 30)
        assert raw_post(url, f"Bearer {new_client}")[0] == 200
        assert not asyncio.run(check_stock(url, new_client)).is_error
        # The SDK client without a token is refused too (last: it is the only client here
        # that sees its connection refused mid-session).
        with pytest.raises(Exception):  # noqa: B017 - the SDK surfaces the 401 as its own error type
            asyncio.run(check_stock(url, None))

    assert pods_and_restarts(ns, "inventory", "assistant") == before, "no pod was replaced or restarted"

    # The NetworkPolicies were accepted by the cluster as built. (This cluster's kindnet does
    # not enforce NetworkPolicies, so the traffic above says nothing about them.)
    inventory = ns.get("networkpolicy", "inventory")["spec"]
    assert inventory["ingress"][0]["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "assistant"}}}]
    egress = ns.get("networkpolicy", "assistant")["spec"]["egress"]
    assert egress[0] == {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            }
        ],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }, egress
    assert egress[1]["to"][0]["ipBlock"]["cidr"].endswith("/32"), egress
    assert egress[2]["to"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "inventory"}}}]
