//! Streamable HTTP behaviour: framing, headers, errors, pagination, sessions.

mod common;

use axum::body::Body;
use common::{assert_text_contains, harness, harness_with, post};
use http::Request;
use quiver_server::transport::http::HttpOptions;
use serde_json::json;

const TOOLS: &str = r#"
server: {name: t, pageSize: 2}
tools:
  - {name: add, handler: {builtin: add}}
  - {name: greet, input: {name: string}, handler: {template: "Hello {{name}}!"}}
  - {name: sleep, handler: {builtin: sleep}}
  - {name: upper, handler: {builtin: upper}}
  - {name: typed, inputSchema: {type: object, properties: {n: {type: integer, minimum: 1}}, required: [n]}, outputSchema: {type: object, properties: {result: {type: string}}}, handler: {builtin: add}}
"#;

#[tokio::test]
async fn initialize_negotiates_versions_and_opens_a_session() {
    let h = harness(TOOLS);
    let init = |v: &str| {
        post(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": v, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).to_string())
    };
    for (asked, got) in [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2024-01-01", "2025-11-25"),
    ] {
        let (status, resp) = h.send(init(asked)).await;
        assert_eq!(status, 200);
        let session = resp
            .headers()
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_owned())
            .expect("a session id is issued");
        assert!(quiver_server::session::owned_by(&session, ""), "{session}");
        let (_, v) = h.raw(init(asked)).await;
        assert_eq!(v["result"]["protocolVersion"], got);
        assert_eq!(v["result"]["capabilities"]["tools"]["listChanged"], true);
        assert_eq!(v["result"]["serverInfo"]["name"], "t");
    }
}

#[tokio::test]
async fn tools_list_pages_through_every_tool() {
    let h = harness(TOOLS);
    let mut names = Vec::new();
    let mut cursor = None;
    for _ in 0..10 {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let page = h.rpc("tools/list", params).await;
        let tools = page["result"]["tools"].as_array().unwrap().clone();
        assert!(tools.len() <= 2);
        names.extend(tools.iter().map(|t| t["name"].as_str().unwrap().to_owned()));
        cursor = page["result"]["nextCursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(names, ["add", "greet", "sleep", "upper", "typed"]);
    let bad = h.rpc("tools/list", json!({"cursor": "nonsense-1"})).await;
    assert_eq!(bad["error"]["code"], -32602);
}

#[tokio::test]
async fn tools_call_results_errors_and_validation() {
    let h = harness(TOOLS);
    let r = h.call("add", json!({"a": 2, "b": 40})).await;
    assert_eq!(r["content"][0]["text"], "42");
    assert_eq!(r["structuredContent"]["result"], 42);
    assert_eq!(r["isError"], false);

    // Invalid arguments are a tool execution error the model can read (SEP-1303), not a protocol error.
    let r = h.call("greet", json!({"nmae": "x"})).await;
    assert_eq!(r["isError"], true);
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("missing required property `name`")
            && text.contains("arguments.nmae: unknown property"),
        "{text}"
    );

    // An output schema the handler does not satisfy is reported, not passed through.
    let r = h.call("typed", json!({"n": 3})).await;
    assert_eq!(r["isError"], true, "{r}");

    let unknown = h
        .rpc("tools/call", json!({"name": "nope", "arguments": {}}))
        .await;
    assert_eq!(unknown["error"]["code"], -32602);
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Unknown tool: nope")
    );

    let not_object = h
        .rpc("tools/call", json!({"name": "add", "arguments": [1, 2]}))
        .await;
    assert_eq!(not_object["error"]["code"], -32602);
    let no_params = h.rpc("tools/call", serde_json::Value::Null).await;
    assert_eq!(no_params["error"]["code"], -32602);
}

#[tokio::test]
async fn malformed_messages_get_json_rpc_errors() {
    let h = harness(TOOLS);
    let cases = [
        ("{not json", 400, -32700),
        ("[1, 2", 400, -32700),
        ("42", 400, -32600),
        (r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#, 200, -32600),
        (r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#, 400, -32600),
        (r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#, 400, -32600),
        (r#"{"jsonrpc":"2.0","id":1}"#, 200, -32600),
        (r#"{"jsonrpc":"2.0","id":1,"method":"no/such"}"#, 200, -32601),
        (r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, 400, -32600),
    ];
    for (body, status, code) in cases {
        let (s, v) = h.raw(post(body)).await;
        assert_eq!(
            (s, v["error"]["code"].as_i64()),
            (status, Some(code)),
            "{body} -> {v}"
        );
    }
    // ping and notifications
    assert_eq!(h.rpc("ping", json!({})).await["result"], json!({}));
    let (s, v) = h
        .raw(post(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#))
        .await;
    assert_eq!((s, v), (202, serde_json::Value::Null));
    let (s, _) = h.raw(post(r#"{"jsonrpc":"2.0","id":5,"result":{}}"#)).await;
    assert_eq!(s, 202, "a client response is accepted");
}

#[tokio::test]
async fn batches_only_under_2025_03_26() {
    let h = harness(TOOLS);
    let batch = r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":1}}}]"#;
    let req = Request::post("/mcp")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2025-03-26")
        .body(Body::from(batch))
        .unwrap();
    let (s, v) = h.raw(req).await;
    assert_eq!(s, 200);
    let arr = v.as_array().unwrap();
    assert_eq!(arr.len(), 2, "notifications get no response: {v}");
    assert_eq!(arr[1]["result"]["content"][0]["text"], "2");
}

#[tokio::test]
async fn transport_rules_give_http_errors() {
    let h = harness_with(
        TOOLS,
        HttpOptions {
            max_body_bytes: 1024,
            allowed_origins: vec!["https://app.example".into()],
            max_concurrency: 16,
            ..HttpOptions::default()
        },
    );
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let with = |k: &str, v: &str| {
        let mut r = post(ping);
        r.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
        r
    };
    assert_eq!(h.raw(with("content-type", "text/plain")).await.0, 415);
    assert_eq!(h.raw(with("accept", "text/html")).await.0, 406);
    assert_eq!(h.raw(with("mcp-protocol-version", "1999-01-01")).await.0, 400);
    assert_eq!(h.raw(with("origin", "http://evil.example")).await.0, 403);
    assert_eq!(h.raw(with("origin", "https://app.example")).await.0, 200);
    assert_eq!(h.raw(with("origin", "http://localhost:6274")).await.0, 200);
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(2000)
    );
    let (s, v) = h.raw(post(&big)).await;
    assert_eq!(s, 413);
    assert!(v["error"]["message"].as_str().unwrap().contains("1024"));
    // GET needs an event-stream Accept; DELETE needs a session.
    let get = Request::get("/mcp")
        .header("accept", "application/json")
        .body(Body::empty())
        .unwrap();
    assert_eq!(h.raw(get).await.0, 406);
    let del = Request::delete("/mcp").body(Body::empty()).unwrap();
    assert_eq!(h.raw(del).await.0, 400);
    let del = Request::delete("/mcp")
        .header("mcp-session-id", common::sid("abc"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(h.raw(del).await.0, 204);
}

#[tokio::test]
async fn resources_and_prompts() {
    let h = harness(
        r#"
resources:
  - {uri: "doc://a", name: a, text: "A text"}
  - {uriTemplate: "greet://{who}/x", name: g, mimeType: text/markdown, text: "Hi {{who}}"}
prompts:
  - {name: p, description: d, arguments: [{name: topic, required: true}, {name: tone}], messages: [{role: user, text: "{{tone}} about {{topic}}"}, {role: assistant, text: ok}]}
"#,
    );
    assert_eq!(
        h.rpc("resources/list", json!({})).await["result"]["resources"][0]["uri"],
        "doc://a"
    );
    assert_eq!(
        h.rpc("resources/templates/list", json!({})).await["result"]["resourceTemplates"][0]["uriTemplate"],
        "greet://{who}/x"
    );
    let r = h.rpc("resources/read", json!({"uri": "greet://Ada%20L/x"})).await;
    assert_eq!(r["result"]["contents"][0]["text"], "Hi Ada L");
    assert_eq!(r["result"]["contents"][0]["mimeType"], "text/markdown");
    assert_eq!(
        h.rpc("resources/read", json!({"uri": "doc://a"})).await["result"]["contents"][0]["text"],
        "A text"
    );
    assert_eq!(
        h.rpc("resources/read", json!({"uri": "doc://zz"})).await["error"]["code"],
        -32002
    );
    let p = h
        .rpc(
            "prompts/get",
            json!({"name": "p", "arguments": {"topic": "rust", "tone": "Briefly"}}),
        )
        .await;
    assert_eq!(
        p["result"]["messages"][0]["content"]["text"],
        "Briefly about rust"
    );
    assert_eq!(p["result"]["messages"][1]["role"], "assistant");
    let missing = h.rpc("prompts/get", json!({"name": "p", "arguments": {}})).await;
    assert!(missing["error"]["message"].as_str().unwrap().contains("topic"));
    assert_eq!(
        h.rpc("prompts/list", json!({})).await["result"]["prompts"][0]["arguments"][0]["required"],
        true
    );
}

#[tokio::test]
async fn rich_content_in_results_resources_and_prompts() {
    let h = harness(
        r#"
tools:
  - name: show
    input: {who: string, png: string}
    handler:
      content:
        - {text: "for {{who}}"}
        - {image: {data: "{{png}}", mimeType: image/png}}
        - {audio: {data: "UklGRg==", mimeType: audio/wav}}
        - {resource: {uri: "note://{{who}}", mimeType: text/plain, text: "about {{who}}"}}
        - {resource: {uri: "bin://x", blob: "AAEC"}}
        - {resourceLink: {uri: "doc://{{who}}", name: doc, mimeType: text/markdown}}
        - {text: "end"}
  - name: then
    input: {who: string, png: string}
    handler: {pipeline: [{tool: show}, {tool: echo, input: {s: "{{steps.0.text}}"}}]}
  - name: echo
    input: {s: string}
    handler: {template: "got {{s}}"}
resources:
  - {uri: "bin://static", name: b, blob: "AAECAw=="}
  - {uriTemplate: "bin://t/{b64}", name: t, mimeType: image/png, blob: "{{b64}}"}
prompts:
  - name: look
    arguments: [{name: img, required: true}]
    messages:
      - {role: user, text: "look at this"}
      - {role: user, content: {image: {data: "{{img}}", mimeType: image/gif}}}
      - {role: assistant, content: {resource: {uri: "x://y", text: "seen"}}}
"#,
    );
    let r = h.call("show", json!({"who": "ada", "png": "iVBORw0KGgo="})).await;
    let c = &r["content"];
    assert_eq!(c.as_array().map(Vec::len), Some(7), "{r}");
    assert_eq!(c[0], json!({"type": "text", "text": "for ada"}));
    assert_eq!(
        c[1],
        json!({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"})
    );
    assert_eq!(c[2]["type"], "audio");
    assert_eq!(
        c[3],
        json!({"type": "resource", "resource": {"uri": "note://ada", "mimeType": "text/plain", "text": "about ada"}})
    );
    assert_eq!(c[4]["resource"]["blob"], "AAEC");
    assert_eq!(
        c[5],
        json!({"type": "resource_link", "uri": "doc://ada", "name": "doc", "mimeType": "text/markdown"})
    );
    assert_eq!(r["isError"], false);
    // A later pipeline step sees the text blocks.
    assert_text_contains(
        &h.call("then", json!({"who": "bo", "png": ""})).await,
        "got for bo\nend",
    );
    // Base64 that only exists after rendering is checked then: a tool error, not bad bytes.
    let bad = h.call("show", json!({"who": "ada", "png": "@@@"})).await;
    assert_eq!(bad["isError"], true, "{bad}");
    assert_text_contains(&bad, "content[1]: `data` is not valid base64");

    let b = h.rpc("resources/read", json!({"uri": "bin://static"})).await;
    assert_eq!(
        b["result"]["contents"][0],
        json!({"uri": "bin://static", "mimeType": "application/octet-stream", "blob": "AAECAw=="})
    );
    let t = h.rpc("resources/read", json!({"uri": "bin://t/AAEC"})).await;
    assert_eq!(t["result"]["contents"][0]["blob"], "AAEC");
    assert_eq!(t["result"]["contents"][0]["mimeType"], "image/png");
    assert!(t["result"]["contents"][0].get("text").is_none());
    let t = h.rpc("resources/read", json!({"uri": "bin://t/abc"})).await;
    assert!(t["error"]["message"].as_str().unwrap().contains("base64"), "{t}");

    let p = h
        .rpc(
            "prompts/get",
            json!({"name": "look", "arguments": {"img": "R0lGOA=="}}),
        )
        .await;
    let m = &p["result"]["messages"];
    assert_eq!(m[0]["content"], json!({"type": "text", "text": "look at this"}));
    assert_eq!(
        m[1]["content"],
        json!({"type": "image", "data": "R0lGOA==", "mimeType": "image/gif"})
    );
    assert_eq!(m[2]["content"]["resource"]["text"], "seen");
    let p = h
        .rpc("prompts/get", json!({"name": "look", "arguments": {"img": "no"}}))
        .await;
    assert!(p["error"]["message"].as_str().unwrap().contains("base64"), "{p}");
}

#[tokio::test]
async fn metrics_count_requests_and_dispatch() {
    let h = harness(TOOLS);
    h.call("add", json!({"a": 1, "b": 2})).await;
    h.call("add", json!({"a": "x"})).await;
    h.raw(post("{oops")).await;
    let text = h.server.metrics.encode();
    assert!(
        text.contains(r#"quiver_dispatch_duration_seconds_count{tool="add",outcome="ok"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"quiver_dispatch_duration_seconds_count{tool="add",outcome="invalid_arguments"} 1"#)
    );
    assert!(text.contains(r#"quiver_requests_total{method="tools/call",outcome="ok"} 2"#));
    assert!(text.contains(r#"quiver_requests_total{method="invalid",outcome="parse_error"} 1"#));
    assert!(text.contains("quiver_registry_tools 5"));
}

mod net;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use quiver_server::admin::{self, AdminState};
use quiver_server::dispatch::{Ctx, Era, Limits, Opens, Server};
use quiver_server::metrics::Refusal;
use quiver_server::transport::http::{HttpState, app};
use quiver_server::transport::limits::Load;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

struct Limited {
    server: Arc<Server>,
    load: Arc<Load>,
    router: Router,
    admin: Router,
}

fn limited(options: HttpOptions, limits: Limits) -> Limited {
    let server = net::server_with(TOOLS, limits);
    let state = HttpState::new(server.clone(), options, CancellationToken::new());
    let load = state.load();
    let admin = admin::app(Arc::new(AdminState {
        server: server.clone(),
        source: "test".into(),
        tuning: quiver_server::tuning::plan(1, false),
        started: std::time::Instant::now(),
        load: load.clone(),
        auth: "none",
    }));
    Limited {
        server,
        load,
        router: app(state),
        admin,
    }
}

async fn status_of(router: &Router, req: Request<Body>) -> u16 {
    router.clone().oneshot(req).await.unwrap().status().as_u16()
}

async fn json_of(router: &Router, req: Request<Body>) -> serde_json::Value {
    let resp = router.clone().oneshot(req).await.unwrap();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

fn readyz() -> Request<Body> {
    Request::get("/readyz").body(Body::empty()).unwrap()
}

fn sleep_call(id: &str, ms: u64, session: Option<&str>) -> Request<Body> {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "sleep", "arguments": {"ms": ms}}});
    let mut req = post(&body.to_string());
    if let Some(s) = session {
        req.headers_mut()
            .insert("mcp-session-id", common::sid(s).parse().unwrap());
    }
    req
}

fn cancel(id: &str, session: Option<&str>) -> Request<Body> {
    let body = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": id}});
    let mut req = post(&body.to_string());
    if let Some(s) = session {
        req.headers_mut()
            .insert("mcp-session-id", common::sid(s).parse().unwrap());
    }
    req
}

/// Item 15: a request future dropped mid-call (client gone) leaves no in-flight count and no
/// cancellation entry behind.
#[tokio::test]
async fn dropping_a_request_mid_call_releases_its_state() {
    let server = net::server_with(TOOLS, Limits::default());
    let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":30000}}}"#;
    for session in ["s1", ""] {
        let ctx = Ctx {
            session,
            version: "2025-11-25",
            stream: false,
            era: Era::Handshake,
            caller: None,
            opens: Opens::Minted,
            client: None,
        };
        let mut call = Box::pin(server.handle(body, ctx, false));
        let registered = usize::from(!session.is_empty());
        tokio::select! {
            _ = &mut call => panic!("a 30 s sleep finished"),
            () = net::wait_for("the call is running", || {
                server.metrics.inflight.get() == 1 && server.cancellable_calls() == registered
            }) => {}
        }
        // The same through a timeout, as a transport would drop it.
        drop(call);
        assert_eq!(server.metrics.inflight.get(), 0, "session {session:?}");
        assert_eq!(server.cancellable_calls(), 0, "session {session:?}");
    }
    let timed_out = tokio::time::timeout(
        Duration::from_millis(50),
        server.handle(
            body,
            Ctx {
                session: "s2",
                version: "2025-11-25",
                stream: false,
                era: Era::Handshake,
                caller: None,
                opens: Opens::Minted,
                client: None,
            },
            false,
        ),
    )
    .await;
    assert!(timed_out.is_err());
    assert_eq!(server.metrics.inflight.get(), 0);
    assert_eq!(server.cancellable_calls(), 0);
}

/// Item 14: a cancel reaches only the call of the same session; sessionless calls cannot be
/// cancelled by anyone's notification.
#[tokio::test]
async fn cancellation_is_scoped_to_the_session() {
    let l = limited(HttpOptions::default(), Limits::default());
    let run = |req| {
        let router = l.router.clone();
        tokio::spawn(async move { json_of(&router, req).await })
    };
    let sessionless = run(sleep_call("c1", 600, None));
    let other_session = run(sleep_call("c2", 600, Some("s1")));
    let target = {
        let router = l.router.clone();
        tokio::spawn(async move {
            let resp = router
                .oneshot(sleep_call("c3", 30_000, Some("s1")))
                .await
                .unwrap();
            let ct = resp.headers()[http::header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .to_owned();
            let body = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .unwrap()
                .to_bytes();
            (ct, body)
        })
    };
    net::wait_for("three calls in flight", || l.server.metrics.inflight.get() == 3).await;
    // Another sessionless client, and another session, try to cancel.
    assert_eq!(status_of(&l.router, cancel("c1", None)).await, 202);
    assert_eq!(status_of(&l.router, cancel("c2", Some("s2"))).await, 202);
    assert_eq!(status_of(&l.router, cancel("c3", Some("s2"))).await, 202);
    // The owner cancels.
    assert_eq!(status_of(&l.router, cancel("c3", Some("s1"))).await, 202);
    let out = tokio::time::timeout(net::PATIENCE, target)
        .await
        .unwrap()
        .unwrap();
    // A cancelled request gets no response (spec: the receiver should not answer it): its
    // stream ends without a message.
    assert_eq!(out.0, "text/event-stream");
    assert!(out.1.is_empty(), "{:?}", out.1);
    for call in [sessionless, other_session] {
        let out = tokio::time::timeout(net::PATIENCE, call).await.unwrap().unwrap();
        assert_eq!(out["result"]["content"][0]["text"], "slept 600 ms", "{out}");
    }
    assert_eq!(l.server.cancellable_calls(), 0);
}

#[tokio::test]
async fn a_call_past_the_request_timeout_ends_with_a_tool_error() {
    let l = limited(
        HttpOptions::default(),
        Limits {
            request_timeout: Duration::from_millis(200),
            ..Limits::default()
        },
    );
    let out = tokio::time::timeout(net::PATIENCE, json_of(&l.router, sleep_call("t", 30_000, None)))
        .await
        .expect("the request timeout ends the call");
    assert_eq!(out["result"]["isError"], true, "{out}");
    common::assert_text_contains(&out["result"], "request timeout (200ms)");
    assert_eq!(l.server.metrics.refusals(Refusal::RequestTimeout), 1);
    assert_eq!(l.server.metrics.inflight.get(), 0);
}

/// Items 4 and 7: the in-flight cap sheds with 503 and fails readiness; the GET stream cap
/// sheds with 503 and is counted.
#[tokio::test]
async fn inflight_and_stream_caps_shed_and_show_in_readiness() {
    let l = limited(
        HttpOptions {
            max_concurrency: 1,
            max_streams: 1,
            ..HttpOptions::default()
        },
        Limits::default(),
    );
    assert_eq!(status_of(&l.admin, readyz()).await, 200);
    let router = l.router.clone();
    let slow = tokio::spawn(async move { json_of(&router, sleep_call("s", 30_000, None)).await });
    net::wait_for("the slow call holds the only place", || {
        l.load.inflight.current() == 1
    })
    .await;
    let busy = json_of(&l.router, post(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)).await;
    assert_eq!(busy["error"]["code"], -32600);
    assert_eq!(
        status_of(&l.router, post(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)).await,
        503
    );
    assert_eq!(l.server.metrics.refusals(Refusal::Inflight), 2);
    let resp = l.admin.clone().oneshot(readyz()).await.unwrap();
    assert_eq!(resp.status(), 503);
    let why = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&why[..], b"in-flight request limit reached");
    // The client goes away: its place comes back.
    slow.abort();
    net::wait_for("the place is released", || l.load.inflight.current() == 0).await;
    assert_eq!(l.server.metrics.inflight.get(), 0);
    assert_eq!(status_of(&l.admin, readyz()).await, 200);

    let stream = || {
        Request::get("/mcp")
            .header("accept", "text/event-stream")
            .body(Body::empty())
            .unwrap()
    };
    let first = l.router.clone().oneshot(stream()).await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(l.server.metrics.streams.get(), 1);
    assert_eq!(status_of(&l.router, stream()).await, 503);
    assert_eq!(l.server.metrics.refusals(Refusal::Streams), 1);
    assert!(
        l.server
            .metrics
            .encode()
            .contains(r#"quiver_refusals_total{limit="streams"} 1"#)
    );
    drop(first);
    assert_eq!(l.load.streams.current(), 0);
    assert_eq!(l.server.metrics.streams.get(), 0);
    let again = l.router.clone().oneshot(stream()).await.unwrap();
    assert_eq!(again.status(), 200);
}

/// Item 14: an empty or invalid session id never ends other clients' streams.
#[tokio::test]
async fn delete_needs_a_valid_session_id() {
    let l = limited(HttpOptions::default(), Limits::default());
    let open = l
        .router
        .clone()
        .oneshot(
            Request::get("/mcp")
                .header("accept", "text/event-stream")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(open.status(), 200);
    for bad in ["", "a b", "a\tb"] {
        let del = Request::delete("/mcp")
            .header(
                "mcp-session-id",
                http::HeaderValue::from_bytes(bad.as_bytes()).unwrap(),
            )
            .body(Body::empty())
            .unwrap();
        assert_eq!(status_of(&l.router, del).await, 400, "{bad:?}");
    }
    assert_eq!(
        l.load.streams.current(),
        1,
        "the sessionless stream is still open"
    );
    let mut body = open.into_body().into_data_stream();
    let del = Request::delete("/mcp")
        .header("mcp-session-id", common::sid("someone-else"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(status_of(&l.router, del).await, 204);
    l.server.notify("notifications/tools/list_changed");
    let event = tokio::time::timeout(net::PATIENCE, futures_util::StreamExt::next(&mut body))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&event).contains("list_changed"));
}

#[tokio::test]
async fn the_server_card_follows_reloads_is_public_and_answers_unchanged_with_304() {
    let card = |auth: bool| HttpOptions {
        card: Some(Arc::new(quiver_server::transport::http::card::CardOptions {
            name: "com.example.team-a/weather".into(),
            description: Some("Forecasts".into()),
            urls: vec!["https://weather.example.com/mcp".into()],
            website_url: None,
        })),
        auth: auth.then(|| {
            Arc::new(quiver_server::transport::auth::Auth {
                bearer: None,
                oidc: None,
            })
        }),
        ..HttpOptions::default()
    };
    let h = harness_with(
        "server: {name: w, version: 1.2.0, title: Weather}\ntools: [{name: add, handler: {builtin: add}}]",
        card(true),
    );
    let get = |path: &str, etag: Option<&str>| {
        let mut r = Request::get(path).header("origin", "https://elsewhere.example");
        if let Some(e) = etag {
            r = r.header("if-none-match", e);
        }
        r.body(Body::empty()).unwrap()
    };
    let (code, resp) = h.send(get("/mcp/server-card", None)).await;
    assert_eq!(code, 200, "public: no Origin check, and the card needs no token");
    let headers = resp.headers().clone();
    assert_eq!(headers["content-type"], "application/mcp-server-card+json");
    assert_eq!(headers["access-control-allow-origin"], "*");
    let etag = headers["etag"].to_str().unwrap().to_owned();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["name"], "com.example.team-a/weather");
    assert_eq!(
        (v["version"].as_str(), v["title"].as_str()),
        (Some("1.2.0"), Some("Weather"))
    );
    assert_eq!(v["remotes"][0]["headers"][0]["name"], "Authorization");
    assert!(
        v["remotes"][0]["supportedProtocolVersions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "2026-07-28")
    );
    assert_eq!(h.send(get("/mcp/server-card", Some(&etag))).await.0, 304);
    // A reload changes the card's version, and so its ETag.
    h.reloader
        .apply(&[(
            "test.yaml".into(),
            "server: {name: w, version: 1.3.0}\ntools: [{name: add, handler: {builtin: add}}]".into(),
        )])
        .unwrap_or_else(|e| panic!("{e}"));
    let (code, v) = h.raw(get("/mcp/server-card", Some(&etag))).await;
    assert_eq!((code, v["version"].as_str()), (200, Some("1.3.0")));
    let (code, v) = h.raw(get("/.well-known/ai-catalog.json", None)).await;
    assert_eq!(code, 200);
    assert_eq!(
        v["entries"][0]["url"],
        "https://weather.example.com/mcp/server-card"
    );
    let pre = Request::options("/mcp/server-card").body(Body::empty()).unwrap();
    let (code, resp) = h.send(pre).await;
    assert_eq!(code, 204);
    assert_eq!(
        resp.headers()["access-control-allow-headers"],
        "Content-Type, If-None-Match"
    );
    // Off unless asked for.
    let off = harness(TOOLS);
    assert_eq!(off.send(get("/mcp/server-card", None)).await.0, 404);
    assert_eq!(off.send(get("/.well-known/ai-catalog.json", None)).await.0, 404);
}
