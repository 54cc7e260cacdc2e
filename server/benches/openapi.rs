//! Criterion benchmark of importing an OpenAPI document: `openapi/import_1000` parses a
//! 3.1 JSON document of 1,000 operations (path, query and header parameters, JSON bodies and
//! answers referring to shared component schemas) and compiles them into http tools, as a
//! config load does. `project/pods_100` is the `project` of an http tool over a list of 100
//! pods shaped as the Kubernetes API returns them: parse the answer, keep the name, phase
//! and node of each pod, serialize (what a call does with the answer); it prints the bytes
//! of the answer and of what the model then reads.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use quiver_server::config::{CompiledHandler, ToolSet, compile};
use serde_json::{Map, json};

/// A document of `n` operations over `n / 4` resources (list, create, read, delete each).
fn document(n: usize) -> String {
    let mut paths = Map::new();
    for r in 0..n / 4 {
        let item = json!({"$ref": format!("#/components/schemas/Thing{}", r % 20)});
        paths.insert(
            format!("/v1/things{r}"),
            json!({
                "get": {"operationId": format!("listThings{r}"), "summary": "List things", "tags": ["things"],
                    "parameters": [
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                        {"name": "tag", "in": "query", "schema": {"type": "array", "items": {"type": "string"}}}
                    ],
                    "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": {"type": "object", "properties": {"items": {"type": "array", "items": item}}}}}}}},
                "post": {"operationId": format!("createThing{r}"), "summary": "Create a thing",
                    "requestBody": {"required": true, "content": {"application/json": {"schema": item}}},
                    "responses": {"201": {"description": "ok", "content": {"application/json": {"schema": item}}}}}
            }),
        );
        paths.insert(
            format!("/v1/things{r}/{{id}}"),
            json!({
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                "get": {"operationId": format!("getThing{r}"), "summary": "Read a thing",
                    "parameters": [{"name": "X-Request-Id", "in": "header", "schema": {"type": "string"}}],
                    "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": item}}}}},
                "delete": {"operationId": format!("deleteThing{r}"), "responses": {"204": {"description": "gone"}}}
            }),
        );
    }
    let mut schemas = Map::new();
    for s in 0..20 {
        schemas.insert(
            format!("Thing{s}"),
            json!({"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string", "maxLength": 64},
                "size": {"type": ["integer", "null"]},
                "owner": {"$ref": "#/components/schemas/Owner"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}}
            }}),
        );
    }
    schemas.insert(
        "Owner".into(),
        json!({"type": "object", "properties": {"id": {"type": "string"}}}),
    );
    json!({"openapi": "3.1.0", "info": {"title": "things", "version": "1"},
        "servers": [{"url": "http://127.0.0.1:8080"}], "paths": paths, "components": {"schemas": schemas}})
    .to_string()
}

fn bench(c: &mut Criterion) {
    let doc = document(1000);
    let ts: ToolSet = serde_json::from_value(json!({"openapi": [{"name": "things", "document": doc}]}))
        .unwrap_or_else(|e| panic!("{e}"));
    let n = compile(&ts).unwrap_or_else(|e| panic!("{e}")).tools.len();
    assert_eq!(n, 1000);
    c.bench_function("openapi/import_1000", |b| {
        b.iter(|| black_box(compile(black_box(&ts)).map(|c| c.tools.len())));
    });
}

/// A pod as `GET /api/v1/namespaces/NS/pods` lists it (a Deployment's replica, one container).
fn pod(i: usize) -> serde_json::Value {
    json!({
        "metadata": {
            "name": format!("web-7d4b9c6f5-{i:05}"), "generateName": "web-7d4b9c6f5-", "namespace": "shop",
            "uid": format!("5f0c2a4e-1b7d-4c39-9e0a-{i:012}"), "resourceVersion": format!("{}", 81_000 + i),
            "creationTimestamp": "2026-11-20T09:14:03Z",
            "labels": {"app.kubernetes.io/name": "web", "app.kubernetes.io/part-of": "shop", "pod-template-hash": "7d4b9c6f5"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-20T09:13:58Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c6f5",
                "uid": "0e6f3a1c-9b2d-4e57-8a41-3c5d7e9f1b2a", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1", "time": "2026-11-20T09:14:03Z",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app.kubernetes.io/name": {}, "f:pod-template-hash": {}},
                 "f:ownerReferences": {".": {}, "k:{\"uid\":\"0e6f3a1c\"}": {}}}, "f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {}, "f:ports": {}, "f:resources": {}}}}}},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2026-11-20T09:14:09Z", "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {}, "f:podIP": {}, "f:podIPs": {}, "f:startTime": {}}}}
            ]
        },
        "spec": {
            "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ], "defaultMode": 420}}],
            "containers": [{"name": "web", "image": "registry.example/shop/web:1.42.0", "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "resources": {"limits": {"memory": "256Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "nodeName": format!("node-{}", i % 7),
            "securityContext": {}, "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
            "priority": 0, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {
            "phase": if i.is_multiple_of(10) { "Pending" } else { "Running" },
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-20T09:14:05Z"},
                {"type": "Initialized", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-20T09:14:03Z"},
                {"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-20T09:14:09Z"},
                {"type": "ContainersReady", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-20T09:14:09Z"},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-20T09:14:03Z"}
            ],
            "hostIP": "172.18.0.3", "hostIPs": [{"ip": "172.18.0.3"}], "podIP": format!("10.244.1.{}", i % 250), "podIPs": [{"ip": format!("10.244.1.{}", i % 250)}],
            "startTime": "2026-11-20T09:14:03Z",
            "containerStatuses": [{"name": "web", "state": {"running": {"startedAt": "2026-11-20T09:14:08Z"}}, "lastState": {}, "ready": true,
                "restartCount": 0, "image": "registry.example/shop/web:1.42.0", "imageID": "registry.example/shop/web@sha256:3b1f8c2d9e7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c",
                "containerID": format!("containerd://{i:064}"), "started": true}],
            "qosClass": "Burstable"
        }
    })
}

fn bench_project(c: &mut Criterion) {
    let items: Vec<serde_json::Value> = (0..100).map(pod).collect();
    let answer = serde_json::to_vec(&json!({"kind": "PodList", "apiVersion": "v1",
        "metadata": {"resourceVersion": "81234"}, "items": items}))
    .unwrap_or_default();
    let ts: ToolSet = serde_json::from_value(json!({"tools": [{"name": "pods", "handler": {"http": {
        "url": "https://kubernetes.default.svc/api/v1/namespaces/shop/pods",
        "project": ["items[].metadata.name", "items[].status.phase", "items[].spec.nodeName"]}}}]}))
    .unwrap_or_else(|e| panic!("{e}"));
    let compiled = compile(&ts).unwrap_or_else(|e| panic!("{e}"));
    let CompiledHandler::Http(call) = &compiled.tools[0].handler else {
        panic!("an http tool")
    };
    let pj = call.project.clone().unwrap_or_else(|| panic!("a projection"));
    let run = |bytes: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(bytes)
            .ok()
            .and_then(|v| pj.apply(v))
            .map(|v| serde_json::to_string(&v).unwrap_or_default())
    };
    let kept = run(&answer).unwrap_or_default();
    eprintln!(
        "project/pods_100: the answer is {} bytes, the projection {} bytes ({:.1}% of it)",
        answer.len(),
        kept.len(),
        kept.len() as f64 * 100.0 / answer.len() as f64
    );
    c.bench_function("project/pods_100", |b| {
        b.iter(|| black_box(run(black_box(&answer))))
    });
}

criterion_group!(benches, bench, bench_project);
criterion_main!(benches);
