//! The catalog (MCP Registry API) over 1,000 McpServers in 50 namespaces: one request through
//! the router as a client sends it (routing, the caller's entries built from the watch store,
//! sorting, paging, the JSON and its ETag). `Access::Open`: with Kubernetes access, a
//! caller's reviews are answered from the cache after the first request, a map lookup per
//! namespace. Each entry is built once per version of its McpServer;
//! `first_page_limit_100_entries_built` measures a request that builds all 1,000.
//! Run: `cargo bench -p quiver-operator --bench catalog`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::BodyExt;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use quiver_operator::catalog::{self, Access, Catalog};
use quiver_operator::crd::McpServer;
use quiver_operator::metrics::Metrics;
use serde_json::json;
use tower::ServiceExt;

const SERVERS: usize = 1000;

fn catalog() -> Arc<Catalog> {
    Arc::new(Catalog::new(
        "com.example.mcp".into(),
        Access::Open,
        vec![store()],
        Arc::new(Metrics::default()),
    ))
}

fn store() -> reflector::Store<McpServer> {
    let (store, mut writer) = reflector::store();
    for i in 0..SERVERS {
        let m: McpServer = serde_json::from_value(json!({
            "apiVersion": "quiver.dev/v1alpha1",
            "kind": "McpServer",
            "metadata": {"name": format!("server-{i:04}"), "namespace": format!("team-{:02}", i % 50),
                         "uid": format!("u{i}"), "resourceVersion": "1", "creationTimestamp": "2026-11-01T10:00:00Z",
                         "managedFields": [{"manager": "kubectl", "operation": "Update", "time": "2026-11-02T10:00:00Z"}]},
            "spec": {
                "server": {"version": "1.2.3", "title": format!("Server {i}")},
                "catalog": {"description": "Tools of a team, found through the catalog"},
                "auth": {"oidc": {"issuer": "https://id.example.com/realms/a", "audience": "tools"}},
                "ingress": {"host": format!("s{i}.example.com"), "tlsSecretName": "tls"},
                "tools": [{"name": "echo", "handler": {"builtin": "echo"}}],
            },
            "status": {"toolCount": 1, "conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                       "message": "", "lastTransitionTime": "2026-11-02T10:00:00Z"}]},
        }))
        .unwrap();
        writer.apply_watcher_event(&Event::Apply(m));
    }
    store
}

async fn get(c: &Arc<Catalog>, uri: &str, etag: Option<&str>) -> (StatusCode, String, Option<String>) {
    let mut req = Request::get(uri);
    if let Some(e) = etag {
        req = req.header("if-none-match", e);
    }
    let r = catalog::router(c.clone())
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let code = r.status();
    let tag = r.headers().get("etag").map(|v| v.to_str().unwrap().to_owned());
    let body = r.into_body().collect().await.unwrap().to_bytes();
    (code, String::from_utf8(body.to_vec()).unwrap(), tag)
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cat = catalog();
    let mut g = c.benchmark_group("catalog_1000_servers");
    // Every entry built for the request (a catalog whose cache is empty, as after a start or
    // when every McpServer changed), beside the same request with the entries built.
    let shared = store();
    g.bench_function("first_page_limit_100_entries_built", |b| {
        b.iter(|| {
            let fresh = Arc::new(Catalog::new(
                "com.example.mcp".into(),
                Access::Open,
                vec![shared.clone()],
                Arc::new(Metrics::default()),
            ));
            rt.block_on(get(&fresh, "/v0.1/servers?limit=100", None))
        });
    });
    g.bench_function("first_page_limit_100", |b| {
        b.iter(|| rt.block_on(get(&cat, "/v0.1/servers?limit=100", None)));
    });
    g.bench_function("every_page_limit_100", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut uri = "/v0.1/servers?limit=100".to_owned();
                let mut n = 0;
                loop {
                    let (_, body, _) = get(&cat, &uri, None).await;
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                    n += v["servers"].as_array().unwrap().len();
                    match v["metadata"]["nextCursor"].as_str() {
                        Some(c) => uri = format!("/v0.1/servers?limit=100&cursor={c}"),
                        None => break,
                    }
                }
                assert_eq!(n, SERVERS);
            });
        });
    });
    let (_, _, tag) = rt.block_on(get(&cat, "/v0.1/servers?limit=100", None));
    g.bench_function("first_page_unchanged_304", |b| {
        b.iter(|| {
            let (code, _, _) = rt.block_on(get(&cat, "/v0.1/servers?limit=100", tag.as_deref()));
            assert_eq!(code, StatusCode::NOT_MODIFIED);
        });
    });
    g.bench_function("one_server_latest", |b| {
        b.iter(|| {
            let (code, _, _) = rt.block_on(get(
                &cat,
                "/v0.1/servers/com.example.mcp.team-07%2Fserver-0507/versions/latest",
                None,
            ));
            assert_eq!(code, StatusCode::OK);
        });
    });
    g.bench_function("one_namespace_20_servers", |b| {
        b.iter(|| rt.block_on(get(&cat, "/namespaces/team-07/v0.1/servers?limit=100", None)));
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
