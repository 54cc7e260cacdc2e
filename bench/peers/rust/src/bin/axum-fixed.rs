//! Ceiling 1: an axum handler that answers every POST /mcp with the fixed bytes of the
//! echo tool's result, without reading the request body. No MCP server can do less work
//! per call over HTTP/1.1 with axum and hyper; Quiver's target is to cost no more.

use axum::http::header::CONTENT_TYPE;
use axum::routing::{get, post};

const REPLY: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hello"}]}}"#;

#[tokio::main]
async fn main() {
    let app = axum::Router::new()
        .route("/mcp", post(|| async { ([(CONTENT_TYPE, "application/json")], REPLY) }))
        .route("/healthz", get(|| async { "ok\n" }));
    quiver_bench_peers::serve(app).await
}
