//! What one authenticated caller can reach of another's: sessions (ids are the server's and
//! bound to the caller they were issued to), 2026-07-28 `requestState` (bound likewise), and
//! what the protected-resource metadata tells anyone (from configuration, behind the same
//! Origin and Host checks as `/mcp`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use common::{Harness, harness_with, post};
use http::Request;
use quiver_server::config::SecretRef;
use quiver_server::net::http::HttpClient;
use quiver_server::secrets::{Presence, Secrets};
use quiver_server::transport::auth::{Auth, BearerAuth, Oidc, OidcConfig};
use quiver_server::transport::http::HttpOptions;
use serde_json::{Value, json};

const TOOLS: &str = r#"
tools:
  - {name: add, handler: {builtin: add}}
  - name: form
    handler:
      elicit:
        message: "Your name?"
        schema: {type: object, properties: {name: {type: string}}, required: [name]}
"#;

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789";

fn with_tokens() -> Harness {
    let secrets = Secrets::new();
    secrets.set_has_source();
    secrets.set(
        "clients",
        Some(vec![("tokens".into(), format!("{ALICE}\n{BOB}\n").into_bytes())]),
        Presence::Loaded,
    );
    let bearer = BearerAuth::new(
        SecretRef {
            name: "clients".into(),
            key: "tokens".into(),
        },
        secrets,
    );
    let auth = Auth {
        bearer: Some(bearer),
        oidc: None,
    };
    harness_with(
        TOOLS,
        HttpOptions {
            auth: Some(Arc::new(auth)),
            ..HttpOptions::default()
        },
    )
}

fn as_caller(mut req: Request<Body>, token: &str, session: Option<&str>) -> Request<Body> {
    let h = req.headers_mut();
    h.insert("authorization", format!("Bearer {token}").parse().unwrap());
    if let Some(s) = session {
        h.insert("mcp-session-id", s.parse().unwrap());
    }
    req
}

fn rpc(method: &str) -> Request<Body> {
    post(&json!({"jsonrpc": "2.0", "id": 1, "method": method}).to_string())
}

async fn initialize(h: &Harness, token: &str, session: Option<&str>) -> String {
    let init = post(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {"sampling": {}}, "clientInfo": {"name": "t", "version": "1"}}})
            .to_string(),
    );
    let (status, resp) = h.send(as_caller(init, token, session)).await;
    assert_eq!(status, 200);
    resp.headers()["mcp-session-id"].to_str().unwrap().to_owned()
}

fn get_stream(token: &str, session: &str) -> Request<Body> {
    as_caller(
        Request::get("/mcp")
            .header("accept", "text/event-stream")
            .body(Body::empty())
            .unwrap(),
        token,
        Some(session),
    )
}

fn delete(token: &str, session: &str) -> Request<Body> {
    as_caller(
        Request::delete("/mcp").body(Body::empty()).unwrap(),
        token,
        Some(session),
    )
}

#[tokio::test]
async fn a_session_is_its_callers_alone() {
    let h = with_tokens();
    let alice = initialize(&h, ALICE, None).await;
    assert!(h.server.sessions.caps(&alice).is_some_and(|c| c.sampling));
    // Bob presenting Alice's id: an unknown session, whatever he asks.
    let (status, v) = h.raw(as_caller(rpc("ping"), BOB, Some(&alice))).await;
    assert_eq!((status, v["error"]["code"].as_i64()), (404, Some(-32600)), "{v}");
    assert_eq!(v["id"], 1);
    let set = post(
        &json!({"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel", "params": {"level": "emergency"}})
            .to_string(),
    );
    assert_eq!(h.send(as_caller(set, BOB, Some(&alice))).await.0, 404);
    assert_eq!(h.send(get_stream(BOB, &alice)).await.0, 404);
    assert_eq!(h.send(delete(BOB, &alice)).await.0, 404);
    // ... so Alice's session is untouched: still hers, not ended, level unchanged.
    assert_eq!(
        h.server.sessions.level(&alice),
        quiver_server::session::LogLevel::Info
    );
    assert!(h.server.sessions.caps(&alice).is_some());
    assert_eq!(h.send(as_caller(rpc("ping"), ALICE, Some(&alice))).await.0, 200);
    assert_eq!(h.send(delete(ALICE, &alice)).await.0, 204);
    assert_eq!(h.send(as_caller(rpc("ping"), ALICE, Some(&alice))).await.0, 404);
}

#[tokio::test]
async fn session_ids_are_the_servers_and_bound_to_the_caller() {
    let h = with_tokens();
    let first = initialize(&h, ALICE, None).await;
    // Initializing again (with her id, as some clients do) gives a fresh id of the server's.
    let second = initialize(&h, ALICE, Some(&first)).await;
    assert_ne!(first, second);
    let bobs = initialize(&h, BOB, None).await;
    // Same shape, different owner: the part after the nonce names the caller, not a token.
    let owner = |id: &str| id.split_once('.').unwrap().1.to_owned();
    assert_eq!(owner(&first), owner(&second));
    assert_ne!(owner(&first), owner(&bobs));
    assert!(!first.contains("alice") && first.len() <= 128);
    // Ids a client makes up are unknown sessions, also when shaped like the server's.
    let made_up = format!("{}.{}", "0".repeat(32), owner(&first).replace('a', "b"));
    for id in [
        "my-own-session",
        "0123456789abcdef0123456789abcdef",
        made_up.as_str(),
    ] {
        assert_eq!(
            h.send(as_caller(rpc("ping"), ALICE, Some(id))).await.0,
            404,
            "{id}"
        );
    }
    // Stateless: an id the server issued to Alice that this replica never saw still serves her
    // (another replica initialized it).
    let elsewhere = format!("{}.{}", "f".repeat(32), owner(&first));
    assert_eq!(
        h.send(as_caller(rpc("ping"), ALICE, Some(&elsewhere))).await.0,
        200
    );
    assert_eq!(h.send(as_caller(rpc("ping"), BOB, Some(&elsewhere))).await.0, 404);
}

fn stateless_call(tool: &str, extra: Value) -> Request<Body> {
    let mut params = json!({
        "name": tool,
        "arguments": {},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
        },
    });
    if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    let body = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": params});
    let mut req = post(&body.to_string());
    let h = req.headers_mut();
    h.insert("mcp-protocol-version", "2026-07-28".parse().unwrap());
    h.insert("mcp-method", "tools/call".parse().unwrap());
    h.insert("mcp-name", tool.parse().unwrap());
    req
}

#[tokio::test]
async fn request_state_is_refused_to_another_caller() {
    let h = with_tokens();
    let (status, asked) = h
        .raw(as_caller(stateless_call("form", json!({})), ALICE, None))
        .await;
    assert_eq!(status, 200, "{asked}");
    let r = &asked["result"];
    assert_eq!(r["resultType"], "input_required", "{asked}");
    let state = r["requestState"].as_str().unwrap().to_owned();
    let key = r["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let answer = |name: &str| json!({"requestState": state, "inputResponses": {key.clone(): {"action": "accept", "content": {"name": name}}}});
    // Bob retries Alice's call with her state: a JSON-RPC error saying why.
    let (_, v) = h
        .raw(as_caller(stateless_call("form", answer("bob")), BOB, None))
        .await;
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("issued to another caller"),
        "{v}"
    );
    // Alice's own retry completes.
    let (_, v) = h
        .raw(as_caller(stateless_call("form", answer("alice")), ALICE, None))
        .await;
    assert_eq!(
        v["result"]["structuredContent"]["content"]["name"], "alice",
        "{v}"
    );
}

fn with_issuer(audience: &str, allowed_hosts: Option<Vec<String>>) -> Harness {
    let oidc = Oidc::new(
        OidcConfig {
            issuer: "https://issuer.example".into(),
            audience: audience.into(),
            jwks_url: Some("https://issuer.example/jwks".into()),
            resource: None,
            leeway: Duration::from_secs(60),
            groups_claim: "groups".into(),
            ca: None,
        },
        HttpClient::new(),
    );
    let auth = Auth {
        bearer: None,
        oidc: Some(oidc),
    };
    harness_with(
        TOOLS,
        HttpOptions {
            auth: Some(Arc::new(auth)),
            allowed_hosts,
            ..HttpOptions::default()
        },
    )
}

fn metadata(host: &str, origin: Option<&str>) -> Request<Body> {
    let mut b = Request::get("/.well-known/oauth-protected-resource/mcp").header("host", host);
    if let Some(o) = origin {
        b = b.header("origin", o);
    }
    b.body(Body::empty()).unwrap()
}

#[tokio::test]
async fn protected_resource_metadata_names_the_configured_resource_only() {
    // The resource is the audience tokens are issued for, whatever Host a request names.
    let h = with_issuer("https://mcp.example/mcp", None);
    let (status, doc) = h.raw(metadata("attacker.example", None)).await;
    assert_eq!(status, 200);
    assert_eq!(doc["resource"], "https://mcp.example/mcp");
    let mut refused = post(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string());
    refused
        .headers_mut()
        .insert("host", "attacker.example".parse().unwrap());
    let (status, resp) = h.send(refused).await;
    assert_eq!(status, 401);
    assert_eq!(
        resp.headers()["www-authenticate"],
        "Bearer realm=\"mcp\", resource_metadata=\"https://mcp.example/.well-known/oauth-protected-resource/mcp\""
    );

    // An audience that is not a URL: the first allowed host names the endpoint.
    let h = with_issuer("quiver", Some(vec!["*".into(), "mcp.internal:8080".into()]));
    let (status, doc) = h.raw(metadata("mcp.internal:8080", None)).await;
    assert_eq!(status, 200);
    assert_eq!(doc["resource"], "http://mcp.internal:8080/mcp");
    // The Host and Origin checks of /mcp apply.
    let h = with_issuer("https://mcp.example/mcp", Some(vec!["mcp.example".into()]));
    assert_eq!(h.send(metadata("attacker.example", None)).await.0, 403);
    assert_eq!(
        h.send(metadata("mcp.example", Some("https://attacker.example")))
            .await
            .0,
        403
    );
    assert_eq!(h.send(metadata("mcp.example", None)).await.0, 200);

    // Nothing configured to name it: no document (rather than one naming the caller's Host).
    let h = with_issuer("quiver", None);
    assert_eq!(h.send(metadata("attacker.example", None)).await.0, 404);
}
