"""The cluster's own API server as tools, on a real kind cluster: an McpServer whose `openapi`
sources are URLs of the API server's OpenAPI v3 documents (core/v1 and apps/v1), fetched by
the pods with their own ServiceAccount token and the cluster CA. The official Python SDK client
lists and gets objects through it (the calls carry a ServiceAccount token from a Secret, so
the API server's RBAC applies), and `find_tools` finds the operations from the plain-language
queries of tests/search/kube-queries.yaml with recall@5 >= 0.9. A second McpServer reads its
document from a ConfigMap and serves an edit of it without a restart."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import mcp_types as types
import yaml
from conftest import Namespace, eventually
from mcp import Client

QUERIES = yaml.safe_load((Path(__file__).parents[2] / "tests" / "search" / "kube-queries.yaml").read_text())
SA = "/var/run/secrets/kubernetes.io/serviceaccount"
API = "https://kubernetes.default.svc"


# The operations the importer refuses, excluded (see docs/openapi.md): the writes whose body is
# a pod template (its schema expands past 10,000 subschemas), the persistent volume writes
# (descriptor over 64 KiB) and the proxy operations that declare `path` twice.
EXCLUDED = {
    "core": ['connectCoreV1*ProxyWithPath', 'createCoreV1NamespacedPod', 'replaceCoreV1NamespacedPod', 'replaceCoreV1NamespacedPodEphemeralcontainers', 'replaceCoreV1NamespacedPodResize', 'replaceCoreV1NamespacedPodStatus', 'createCoreV1NamespacedPodTemplate', 'replaceCoreV1NamespacedPodTemplate', 'createCoreV1NamespacedReplicationController', 'replaceCoreV1NamespacedReplicationController', 'replaceCoreV1NamespacedReplicationControllerStatus', 'createCoreV1PersistentVolume', 'replaceCoreV1PersistentVolume', 'replaceCoreV1PersistentVolumeStatus'],
    "apps": ['createAppsV1NamespacedDaemonSet', 'replaceAppsV1NamespacedDaemonSet', 'replaceAppsV1NamespacedDaemonSetStatus', 'createAppsV1NamespacedDeployment', 'replaceAppsV1NamespacedDeployment', 'replaceAppsV1NamespacedDeploymentStatus', 'createAppsV1NamespacedReplicaSet', 'replaceAppsV1NamespacedReplicaSet', 'replaceAppsV1NamespacedReplicaSetStatus', 'createAppsV1NamespacedStatefulSet', 'replaceAppsV1NamespacedStatefulSet', 'replaceAppsV1NamespacedStatefulSetStatus'],
}


def source(name: str, path: str) -> dict:
    return {
        "name": name,
        "url": f"{API}{path}",
        "fetch": {"caFile": f"{SA}/ca.crt", "tokenFile": f"{SA}/token", "refresh": "10m"},
        "server": API,
        "headers": {"Authorization": "Bearer {{secret.kube-caller.token}}"},
        "tls": {"caConfigMap": "kube-root-ca.crt"},
        "tools": {"exclude": EXCLUDED[name]},
    }


def mcp_server() -> dict:
    return {
        "apiVersion": "quiver.dev/v1alpha1",
        "kind": "McpServer",
        "metadata": {"name": "kube"},
        "spec": {
            "openapi": [source("core", "/openapi/v3/api/v1"), source("apps", "/openapi/v3/apis/apps/v1")],
            "toolSearch": {"coreTools": ["listCoreV1NamespacedConfigMap"], "maxLimit": 50},
        },
    }


def text(result: types.CallToolResult) -> str:
    return "".join(b.text for b in result.content if isinstance(b, types.TextContent))


async def session(url: str, ns: str) -> dict:
    async with Client(url) as c:
        listed = sorted(t.name for t in (await c.list_tools()).tools)
        config_maps = await c.call_tool("listCoreV1NamespacedConfigMap", {"namespace": ns, "labelSelector": "made-by=e2e"})
        # Found, not listed: callable by name all the same.
        one = await c.call_tool("readCoreV1NamespacedConfigMap", {"namespace": ns, "name": "seen"})
        deployments = await c.call_tool("listAppsV1NamespacedDeployment", {"namespace": ns})
        forbidden = await c.call_tool("listCoreV1NamespacedSecret", {"namespace": "kube-system"})
        found = []
        for q in QUERIES:
            r = await c.call_tool("find_tools", {"query": q["query"], "limit": 5})
            found.append([t["name"] for t in (r.structured_content or {}).get("tools", [])])
        return {"listed": listed, "config_maps": config_maps, "one": one, "deployments": deployments, "forbidden": forbidden, "found": found}


def test_the_api_server_served_as_tools_and_found_by_search(ns: Namespace):
    ns.k("create", "serviceaccount", "caller")
    ns.k("create", "rolebinding", "caller-view", "--clusterrole=view", f"--serviceaccount={ns.name}:caller")
    token = ns.k("create", "token", "caller", "--duration=1h").strip()
    ns.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kube-caller"}, "stringData": {"token": token}})
    ns.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "seen", "labels": {"made-by": "e2e"}}, "data": {"k": "v"}})
    ns.apply(mcp_server())
    ns.wait_condition("kube", "Ready", "True", 240)
    with ns.port_forward("svc/kube", 8080) as port:
        url = f"http://127.0.0.1:{port}/mcp"
        out = eventually("the imported tools to answer", lambda: (o := asyncio.run(session(url, ns.name))) and not o["one"].is_error and o, 120, 2)
    assert out["listed"] == ["find_tools", "listCoreV1NamespacedConfigMap"]
    cms = out["config_maps"]
    assert not cms.is_error, text(cms)
    assert [i["metadata"]["name"] for i in cms.structured_content["items"]] == ["seen"]
    assert out["one"].structured_content["data"] == {"k": "v"}
    assert out["deployments"].structured_content["kind"] == "DeploymentList", text(out["deployments"])
    # The caller's token, not the pod's, reaches the API server: RBAC refuses what it may not.
    assert out["forbidden"].is_error and "403" in text(out["forbidden"]), text(out["forbidden"])
    hits = sum(any(n in q["expect"] for n in names) for q, names in zip(QUERIES, out["found"], strict=True))
    recall = hits / len(QUERIES)
    print(f"find_tools on kind: {len(QUERIES)} queries, recall@5 {recall:.3f}")
    assert len(QUERIES) >= 50 and recall >= 0.9, recall


def configmaps_doc(with_list: bool) -> str:
    """A small OpenAPI document written for this test: reading (and, in its second version,
    listing) the ConfigMaps of a namespace on the cluster's API server."""
    ns_param = {"name": "namespace", "in": "path", "required": True, "schema": {"type": "string"}}
    answer = {"200": {"description": "ok", "content": {"application/json": {"schema": {"type": "object"}}}}}
    paths = {
        "/api/v1/namespaces/{namespace}/configmaps/{name}": {
            "get": {
                "operationId": "readConfigMap",
                "parameters": [ns_param, {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": answer,
            }
        }
    }
    if with_list:
        paths["/api/v1/namespaces/{namespace}/configmaps"] = {"get": {"operationId": "listConfigMaps", "parameters": [ns_param], "responses": answer}}
    return json.dumps({"openapi": "3.0.3", "info": {"title": "configmaps", "version": "1"}, "paths": paths})


def test_a_document_in_a_config_map_is_served_and_follows_its_edits(ns: Namespace):
    ns.k("create", "serviceaccount", "caller")
    ns.k("create", "rolebinding", "caller-view", "--clusterrole=view", f"--serviceaccount={ns.name}:caller")
    token = ns.k("create", "token", "caller", "--duration=1h").strip()
    ns.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kube-caller"}, "stringData": {"token": token}})
    ns.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "seen"}, "data": {"k": "v"}})

    def doc(with_list: bool) -> dict:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "api-doc"}, "data": {"openapi.json": configmaps_doc(with_list)}}

    ns.apply(doc(False))
    ns.apply({
        "apiVersion": "quiver.dev/v1alpha1",
        "kind": "McpServer",
        "metadata": {"name": "cmdoc"},
        "spec": {"openapi": [{
            "name": "configmaps",
            "configMap": {"name": "api-doc", "key": "openapi.json"},
            "server": API,
            "headers": {"Authorization": "Bearer {{secret.kube-caller.token}}"},
            "tls": {"caConfigMap": "kube-root-ca.crt"},
        }]},
    })
    ns.wait_condition("cmdoc", "Ready", "True", 240)

    async def listed_and_read(url: str) -> tuple[list[str], types.CallToolResult]:
        async with Client(url) as c:
            names = sorted(t.name for t in (await c.list_tools(cache_mode="bypass")).tools)
            return names, await c.call_tool("readConfigMap", {"namespace": ns.name, "name": "seen"})

    with ns.port_forward("svc/cmdoc", 8080) as port:
        url = f"http://127.0.0.1:{port}/mcp"
        names, read = eventually("the ConfigMap's operation to answer", lambda: (o := asyncio.run(listed_and_read(url))) and not o[1].is_error and o, 120, 2)
        assert names == ["readConfigMap"]
        assert read.structured_content["data"] == {"k": "v"}
        # An edit of the ConfigMap reaches the running pods: the new operation is served.
        ns.apply(doc(True))
        eventually("the edited document's tools", lambda: (o := asyncio.run(listed_and_read(url))) and o[0] == ["listConfigMaps", "readConfigMap"] and o, 90, 1)
