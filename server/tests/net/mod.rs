//! Socket-level helpers: the real `/mcp` app and admin app served by the real accept loop on
//! 127.0.0.1, with limits chosen by the test, and a raw HTTP/1.1 client that can send
//! anything (broken framing, partial requests, silence).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_server::admin::{self, AdminState};
use quiver_server::dispatch::{Limits, Server};
use quiver_server::metrics::Metrics;
use quiver_server::registry::Registry;
use quiver_server::reload::Reloader;
use quiver_server::transport::http::{HttpOptions, HttpState, Mcp};
use quiver_server::transport::limits::{Connections, Load};
use quiver_server::transport::listen::{ConnOptions, serve};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Bound on any single wait in these tests ("it did finish"), never a pass/fail timing.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub struct Served {
    pub mcp: SocketAddr,
    pub admin: SocketAddr,
    pub server: Arc<Server>,
    pub load: Arc<Load>,
    pub stop: CancellationToken,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A server over `yaml` with dispatch `limits`.
pub fn server_with(yaml: &str, limits: Limits) -> Arc<Server> {
    let metrics = Metrics::new("test", "system");
    let registry = Registry::new(&metrics);
    let server = Server::with_limits(registry, metrics, limits);
    Reloader::new(server.clone())
        .apply(&[("test.yaml".into(), yaml.into())])
        .unwrap_or_else(|e| panic!("{e}"));
    server
}

/// Serves the MCP app and the admin app on two 127.0.0.1 ports through the real accept loop.
pub async fn serve_app(yaml: &str, options: HttpOptions, conn: ConnOptions, limits: Limits) -> Served {
    let server = server_with(yaml, limits);
    let stop = CancellationToken::new();
    let state = HttpState::new(server.clone(), options, stop.clone());
    let load = state.load();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mcp = listener.local_addr().unwrap();
    tokio::spawn(serve(
        listener,
        Mcp::new(state),
        load.connections.clone(),
        conn,
        stop.clone(),
        Some(server.metrics.clone()),
    ));
    let admin_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_addr = admin_listener.local_addr().unwrap();
    let admin_state = Arc::new(AdminState {
        server: server.clone(),
        source: "test".into(),
        tuning: quiver_server::tuning::plan(1, false),
        started: Instant::now(),
        load: load.clone(),
        auth: "none",
    });
    tokio::spawn(serve(
        admin_listener,
        admin::app(admin_state),
        Connections::new(admin::MAX_CONNECTIONS),
        admin::CONN_OPTIONS,
        stop.clone(),
        None,
    ));
    Served {
        mcp,
        admin: admin_addr,
        server,
        load,
        stop,
    }
}

/// A parsed response: status, lowercase header lines, body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    /// `(status, error.code)`.
    pub fn code(&self) -> (u16, Option<i64>) {
        (self.status, self.json()["error"]["code"].as_i64())
    }
}

/// A POST /mcp head with the headers a conforming client sends, for a body of `len` bytes.
pub fn post_head(len: usize, extra: &str) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n\
         Connection: close\r\n{extra}Content-Length: {len}\r\n\r\n"
    )
}

/// Sends raw bytes on a new connection and reads until the server closes it. The server may
/// answer and close before reading everything (413, 408), so a failed write is not an error.
pub async fn exchange(addr: SocketAddr, raw: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(raw).await;
    read_reply(&mut s).await
}

/// Reads one whole response, to EOF (requests here say `Connection: close`). A reset after
/// the response (the server closed with request bytes unread) still yields what came before.
pub async fn read_reply(s: &mut TcpStream) -> Reply {
    let mut out = Vec::new();
    let read = tokio::time::timeout(PATIENCE, s.read_to_end(&mut out))
        .await
        .expect("the server answered and closed the connection");
    if let Err(e) = read {
        assert!(!out.is_empty(), "no response before the error: {e}");
    }
    parse(&out)
}

pub fn parse(raw: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(raw);
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        panic!("no complete response head in {text:?}");
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    Reply {
        status,
        headers: head,
        body: raw[split + 4..].to_vec(),
    }
}

/// POSTs a JSON body to /mcp.
pub async fn post(addr: SocketAddr, body: &[u8]) -> Reply {
    post_with(addr, body, "").await
}

/// POSTs a JSON body to /mcp with extra header lines (each ending in `\r\n`).
pub async fn post_with(addr: SocketAddr, body: &[u8], extra: &str) -> Reply {
    let mut raw = post_head(body.len(), extra).into_bytes();
    raw.extend_from_slice(body);
    exchange(addr, &raw).await
}

/// GETs a path (admin port).
pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    let raw = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    exchange(addr, raw.as_bytes()).await
}

/// `tools/call` of `add` answers 42: the server still works.
pub async fn assert_still_serves(addr: SocketAddr) {
    let call = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"add","arguments":{"a":40,"b":2}}}"#;
    let r = post(addr, call).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["result"]["content"][0]["text"], "42");
}

/// Polls `cond` every 10 ms until it holds, failing after [`PATIENCE`].
pub async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether the peer has closed `s` (EOF or reset), waiting at most [`PATIENCE`]; any bytes
/// the server sends first are returned.
pub async fn closed_by_server(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => panic!("the server kept the connection open"),
            Ok(Ok(0) | Err(_)) => return got,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A session id as the server issues them to callers without credentials, the same for the
/// same `label` (tests name their sessions).
pub fn sid(label: &str) -> String {
    let minted = quiver_server::session::mint("");
    let owner = minted.split_once('.').map(|(_, o)| o).unwrap_or_default();
    let nonce: String = label.bytes().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{nonce:0>32}.{owner}")
}
