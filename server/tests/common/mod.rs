//! Helpers shared by the integration tests: a server built from inline YAML, and requests
//! driven through the router with `oneshot` (no socket).

#![allow(dead_code)]

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use http::{Request, Response};
use http_body_util::BodyExt;
use quiver_server::dispatch::Server;
use quiver_server::metrics::Metrics;
use quiver_server::registry::Registry;
use quiver_server::reload::Reloader;
use quiver_server::transport::http::{HttpOptions, HttpState, app};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

pub struct Harness {
    pub server: Arc<Server>,
    pub reloader: Arc<Reloader>,
    pub router: Router,
}

pub fn harness(yaml: &str) -> Harness {
    harness_with(yaml, HttpOptions::default())
}

pub fn harness_with(yaml: &str, options: HttpOptions) -> Harness {
    let metrics = Metrics::new("test", "system");
    let registry = Registry::new(&metrics);
    let server = Server::new(registry, metrics);
    let reloader = Reloader::new(server.clone());
    reloader
        .apply(&[("test.yaml".into(), yaml.into())])
        .unwrap_or_else(|e| panic!("{e}"));
    let router = app(HttpState::new(server.clone(), options, CancellationToken::new()));
    Harness {
        server,
        reloader,
        router,
    }
}

pub fn post(body: &str) -> Request<Body> {
    Request::post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(Body::from(body.to_owned()))
        .unwrap_or_else(|e| panic!("{e}"))
}

impl Harness {
    pub async fn send(&self, req: Request<Body>) -> (u16, Response<Body>) {
        let resp = self
            .router
            .clone()
            .oneshot(req)
            .await
            .unwrap_or_else(|e| match e {});
        (resp.status().as_u16(), resp)
    }

    pub async fn raw(&self, req: Request<Body>) -> (u16, Value) {
        let (status, resp) = self.send(req).await;
        let bytes = resp
            .into_body()
            .collect()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .to_bytes();
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}: {bytes:?}"))
        };
        (status, v)
    }

    pub async fn rpc(&self, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
        let (status, v) = self.raw(post(&body)).await;
        assert_eq!(status, 200, "{v}");
        v
    }

    pub async fn call(&self, tool: &str, args: Value) -> Value {
        self.rpc("tools/call", json!({"name": tool, "arguments": args}))
            .await["result"]
            .clone()
    }
}

/// The text of a tool result's first content block.
pub fn text(result: &Value) -> &str {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text content in {result}"))
}

/// Asserts that a tool result's text contains `needle`.
#[track_caller]
pub fn assert_text_contains(result: &Value, needle: &str) {
    assert!(text(result).contains(needle), "{needle:?} not in {result}");
}

/// A session id as the server issues them to callers without credentials, the same for the
/// same `label` (tests name their sessions).
pub fn sid(label: &str) -> String {
    let minted = quiver_server::session::mint("");
    let owner = minted.split_once('.').map(|(_, o)| o).unwrap_or_default();
    let nonce: String = label.bytes().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{nonce:0>32}.{owner}")
}
