//! Over real sockets: a caller without credentials is counted by the address its connection
//! comes from (loopback has a whole /8 of them), never by an `X-Forwarded-For` it writes
//! itself; behind a trusted proxy, by the client that proxy names.

use std::net::{IpAddr, SocketAddr};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::forwarded::TrustedProxies;
use super::http::{HttpOptions, HttpState, app};
use super::listen::{ConnOptions, serve};
use crate::dispatch::{Server, TaskBounds};
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::reload::Reloader;

/// A server holding one task per caller, listening on 127.0.0.1.
async fn started(trusted: TrustedProxies) -> (SocketAddr, CancellationToken) {
    let metrics = Metrics::new("test", "system");
    let bounds = TaskBounds {
        per_caller: 1,
        ..TaskBounds::default()
    };
    let server = Server::builder(Registry::new(&metrics), metrics)
        .tasks(bounds, None)
        .build();
    Reloader::new(server.clone())
        .apply(&[(
            "t.yaml".into(),
            "tools: [{name: job, task: required, handler: {exec: {command: [/bin/echo, job]}}}]".into(),
        )])
        .unwrap_or_else(|e| panic!("{e}"));
    let options = HttpOptions {
        trusted_proxies: trusted,
        ..HttpOptions::default()
    };
    let stop = CancellationToken::new();
    let state = HttpState::new(server, options, stop.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let at = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let conns = state.load().connections.clone();
    tokio::spawn(serve(
        listener,
        app(state),
        conns,
        ConnOptions::default(),
        stop.clone(),
        None,
    ));
    (at, stop)
}

/// A sessionless 2025-11-25 task request from the local address `from`, with
/// `X-Forwarded-For: forwarded` when given: the task's id, or the refusal's code.
async fn task(at: SocketAddr, from: &str, forwarded: Option<&str>) -> Result<String, i64> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap_or_else(|e| panic!("{e}"));
    socket
        .bind(SocketAddr::new(
            from.parse::<IpAddr>().unwrap_or_else(|e| panic!("{e}")),
            0,
        ))
        .unwrap_or_else(|e| panic!("{from}: {e}"));
    let mut conn = socket.connect(at).await.unwrap_or_else(|e| panic!("{e}"));
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "job", "arguments": {}, "task": {}}})
    .to_string();
    let xff = forwarded.map_or(String::new(), |f| format!("X-Forwarded-For: {f}\r\n"));
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n\
         {xff}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(format!("{head}{body}").as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&answer);
    let (_, json) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{text}"));
    let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {text}"));
    match v["result"]["task"]["taskId"].as_str() {
        Some(id) => Ok(id.to_owned()),
        None => Err(v["error"]["code"].as_i64().unwrap_or_else(|| panic!("{v}"))),
    }
}

#[tokio::test]
async fn anonymous_callers_are_counted_by_their_connection_not_by_what_they_claim() {
    let (at, stop) = started(TrustedProxies::default()).await;
    task(at, "127.0.0.2", None).await.unwrap();
    // The same connection address claiming to be someone else: still the same caller.
    for claim in ["198.51.100.1", "127.0.0.3", "garbage"] {
        assert_eq!(task(at, "127.0.0.2", Some(claim)).await, Err(-32004), "{claim}");
    }
    // Another address: a caller of its own.
    task(at, "127.0.0.3", None).await.unwrap();
    stop.cancel();
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_client_it_names_is_the_caller() {
    let proxies = TrustedProxies::new(vec!["127.0.0.4/32".parse().unwrap_or_else(|e| panic!("{e}"))])
        .unwrap_or_else(|e| panic!("{e}"));
    let (at, stop) = started(proxies).await;
    task(at, "127.0.0.4", Some("198.51.100.1")).await.unwrap();
    assert_eq!(task(at, "127.0.0.4", Some("198.51.100.1")).await, Err(-32004));
    // A client prepending a made-up address does not become someone else.
    assert_eq!(
        task(at, "127.0.0.4", Some("6.6.6.6, 198.51.100.1")).await,
        Err(-32004)
    );
    task(at, "127.0.0.4", Some("198.51.100.2")).await.unwrap();
    // Without a header the proxy itself is the caller; a peer that is not trusted is its own.
    task(at, "127.0.0.4", None).await.unwrap();
    task(at, "127.0.0.5", Some("198.51.100.3")).await.unwrap();
    assert_eq!(task(at, "127.0.0.5", Some("198.51.100.4")).await, Err(-32004));
    stop.cancel();
}
