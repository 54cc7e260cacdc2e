//! Ceiling 2: an axum handler that parses the JSON-RPC request with serde into typed
//! structs, checks the method and tool name, and serializes a typed reply echoing the
//! text. The least a handler that really reads the request can do, without MCP's schema
//! validation, capabilities or error model.

use axum::Json;
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Request {
    jsonrpc: String,
    id: u64,
    method: String,
    params: Params,
}

#[derive(Deserialize)]
struct Params {
    name: String,
    arguments: Arguments,
}

#[derive(Deserialize)]
struct Arguments {
    text: String,
}

#[derive(Serialize)]
struct Reply {
    jsonrpc: &'static str,
    id: u64,
    result: CallResult,
}

#[derive(Serialize)]
struct CallResult {
    content: [Text; 1],
}

#[derive(Serialize)]
struct Text {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
}

async fn call(Json(req): Json<Request>) -> Result<Json<Reply>, StatusCode> {
    if req.jsonrpc != "2.0" || req.method != "tools/call" || req.params.name != "echo" {
        return Err(StatusCode::BAD_REQUEST);
    }
    let text = Text { kind: "text", text: req.params.arguments.text };
    Ok(Json(Reply { jsonrpc: "2.0", id: req.id, result: CallResult { content: [text] } }))
}

#[tokio::main]
async fn main() {
    let app = axum::Router::new()
        .route("/mcp", post(call))
        .route("/healthz", get(|| async { "ok\n" }));
    quiver_bench_peers::serve(app).await
}
