"""The kind cluster's own network, as the rest of the suite relies on it.

A pod's connection to a Service IP that kube-proxy has no rule for (a Service created a moment
ago while kube-proxy is behind, as on a brand-new cluster of a loaded machine) is not
translated to an endpoint. Unguarded, the node masquerades it and routes it off the cluster
like Internet traffic; the CI machines' egress gateway answers every such HTTP request itself
(`404 Not Found`, empty body, `server: keryx`) and keeps the connection alive, so an http
tool's pooled connection kept reaching the gateway after kube-proxy caught up: that was
test_credentials.py's 120 s of `answered 404 Not Found` on a cold run. The cluster's network
daemon (deploy/kind/images/kindnet/kindnetd, guard_services) refuses such traffic on the node:
the client sees "connection refused", and its next connection is translated.
"""

from __future__ import annotations

import asyncio
import ipaddress

import mcp_types as types
import yaml
from conftest import Namespace, kget, kubectl
from mcp import Client


def service_subnet() -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    cfg = yaml.safe_load(kget("configmap", "-n", "kube-system", "kubeadm-config")["data"]["ClusterConfiguration"])
    return ipaddress.ip_network(cfg["networking"]["serviceSubnet"].split(",")[0])


def unallocated_service_ip() -> str:
    """An address of the Service range that no Service holds (from the top of the range,
    which the allocator fills last)."""
    used = set(kubectl("get", "svc", "-A", "-o", "jsonpath={.items[*].spec.clusterIP}").split())
    net = service_subnet()
    for k in range(2, 200):
        ip = str(net.broadcast_address - k)
        if ip not in used:
            return ip
    raise AssertionError(f"no free address at the top of {net}")


def test_a_service_ip_without_kube_proxy_rules_is_refused_inside_the_cluster(ns: Namespace):
    ip = unallocated_service_ip()
    ns.apply(
        {
            "apiVersion": "quiver.dev/v1alpha1",
            "kind": "McpServer",
            "metadata": {"name": "prober"},
            "spec": {
                "tools": [
                    {
                        "name": "probe",
                        "description": "POST to a Service IP that no Service holds",
                        "handler": {
                            "http": {
                                "method": "POST",
                                "url": f"http://{ip}:8080/mcp",
                                "body": {"jsonrpc": "2.0", "id": 1, "method": "ping"},
                                "timeout": "5s",
                            }
                        },
                    }
                ]
            },
        }
    )
    ns.wait_condition("prober", "Ready", "True")

    async def probe(port: int) -> str:
        async with Client(f"http://127.0.0.1:{port}/mcp") as c:
            r = await c.call_tool("probe", {})
            assert r.is_error
            return "".join(b.text for b in r.content if isinstance(b, types.TextContent))

    with ns.port_forward("svc/prober", 8080) as port:
        text = asyncio.run(probe(port))
    # Before the guard: "answered 404 Not Found: " (the CI machines' egress gateway), or a
    # timeout where nothing outside answers. Either way the connection left the cluster.
    assert "answered" not in text and "refused" in text.lower(), (
        f"a connection to {ip}, a Service IP kube-proxy has no rule for, left the cluster: {text}"
    )
