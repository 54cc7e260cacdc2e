//! The run step against a loopback API.

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use super::Outbound;
use crate::config::{CompiledHandler, ToolSet, compile};
use crate::net::http::HttpClient;

/// An API on a loopback port: `/token` issues `tok-secret-1`; any other path answers the
/// request head it received (as a debug page or an error quoting the request would).
async fn echo_api() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Some(head) = crate::net::read_head(&mut conn).await else {
                    return;
                };
                let body = if head.starts_with("POST /token") {
                    json!({"access_token": "tok-secret-1", "token_type": "Bearer", "expires_in": 60})
                } else {
                    json!({"received": head})
                }
                .to_string();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

/// A credential built for a call (HTTP basic, an OAuth2 token) is redacted from the answer as
/// the Secrets it is made of are: an API that echoes the request does not hand the caller the
/// author's password (base64 is no secret) or the API's token.
#[tokio::test]
async fn an_api_echoing_the_request_does_not_hand_the_caller_a_built_credential() {
    let port = echo_api().await;
    let document = json!({
        "openapi": "3.0.3", "info": {"title": "echo", "version": "1"},
        "servers": [{"url": format!("http://127.0.0.1:{port}")}],
        "paths": {
            "/basic": {"get": {"operationId": "basic", "security": [{"basic": []}], "responses": {"200": {"description": "ok"}}}},
            "/oauth": {"get": {"operationId": "oauth", "security": [{"cc": []}], "responses": {"200": {"description": "ok"}}}}
        },
        "components": {"securitySchemes": {
            "basic": {"type": "http", "scheme": "basic"},
            "cc": {"type": "oauth2", "flows": {"clientCredentials": {"tokenUrl": format!("http://127.0.0.1:{port}/token"), "scopes": {}}}}
        }}
    });
    let ts: ToolSet = serde_json::from_value(json!({"openapi": [{
        "name": "echo", "document": document.to_string(),
        "security": {
            "basic": {"secret": "api", "usernameKey": "user", "passwordKey": "password"},
            "cc": {"secret": "api", "clientIdKey": "user", "clientSecretKey": "password", "allowHttp": true}
        }
    }]}))
    .unwrap();
    let compiled = compile(&ts).unwrap_or_else(|e| panic!("{e}"));
    let secrets = json!({"api": {"user": "alice", "password": "p@ss w"}});
    let client = HttpClient::new();
    let outbound = Outbound {
        authorization: None,
        caller: &Value::Null,
    };
    for (tool, sent) in [("basic", "YWxpY2U6cEBzcyB3"), ("oauth", "tok-secret-1")] {
        let t = compiled.tools.iter().find(|t| t.name == tool).unwrap();
        let CompiledHandler::Http(call) = &t.handler else {
            panic!("an http tool")
        };
        let out = super::call(&client, call, &json!({}), &secrets, &outbound).await;
        assert!(!out.is_error, "{tool}: {}", out.text);
        assert!(
            out.text.to_ascii_lowercase().contains("authorization"),
            "{tool}: {}",
            out.text
        );
        let shown = format!("{} {:?}", out.text, out.structured);
        assert!(!shown.contains(sent), "{tool}: the caller reads {sent}: {shown}");
    }
}

/// A server a fetched document chose is refused when it is this host in any spelling the
/// system's resolver reads as an address (decimal, hex, octal, short forms, a trailing dot):
/// the resolver's answer is checked, so no connection is made.
#[tokio::test]
async fn a_fetched_documents_server_is_never_this_host_in_any_spelling() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let client = HttpClient::new();
    let outbound = Outbound {
        authorization: None,
        caller: &Value::Null,
    };
    for host in [
        "2130706433",
        "0x7f000001",
        "017700000001",
        "127.1",
        "127.0.0.1.",
        "localhost6",
    ] {
        let document = json!({
            "openapi": "3.0.3", "info": {"title": "t", "version": "1"},
            "servers": [{"url": format!("http://{host}:{port}")}],
            "paths": {"/x": {"get": {"operationId": "x", "responses": {"200": {"description": "ok"}}}}}
        });
        let mut ts: ToolSet =
            serde_json::from_value(json!({"openapi": [{"name": "t", "document": document.to_string()}]}))
                .unwrap();
        ts.openapi[0].fetched = true;
        let Ok(compiled) = compile(&ts) else {
            continue; // refused when compiled: no call at all
        };
        let CompiledHandler::Http(call) = &compiled.tools[0].handler else {
            panic!("an http tool")
        };
        assert!(call.guarded, "{host}");
        let out = super::call(&client, call, &json!({}), &Value::Null, &outbound).await;
        assert!(out.is_error, "{host}: {}", out.text);
    }
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a call reached this host"
    );
}
