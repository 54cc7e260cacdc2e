//! The echo tool on rmcp, the official Rust MCP SDK, served the way its Streamable HTTP
//! documentation describes for a server without sessions: `StreamableHttpService` nested
//! in an axum router, legacy session mode off (stateless) and JSON responses on.

use axum::routing::get;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{schemars, tool, tool_router};
use serde::Deserialize;

#[derive(Deserialize, schemars::JsonSchema)]
struct EchoIn {
    /// The text to send back.
    text: String,
}

#[derive(Clone)]
struct Echo;

#[tool_router(server_handler)]
impl Echo {
    #[tool(description = "Returns the text it is given.")]
    fn echo(&self, Parameters(EchoIn { text }): Parameters<EchoIn>) -> String {
        text
    }
}

#[tokio::main]
async fn main() {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None);
    let service: StreamableHttpService<Echo, LocalSessionManager> =
        StreamableHttpService::new(|| Ok(Echo), Default::default(), config);
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .route("/healthz", get(|| async { "ok\n" }));
    quiver_bench_peers::serve(app).await
}
