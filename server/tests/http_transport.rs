//! Streamable HTTP behaviour: framing, headers, errors, pagination, sessions.

mod common;

use axum::body::Body;
use common::{harness, harness_with, post};
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
            .map(|v| v.to_str().unwrap().len());
        assert_eq!(session, Some(32), "a session id is issued");
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
        (r#"{"jsonrpc":"2.0","id":1}"#, 400, -32600),
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
        .header("mcp-session-id", "abc")
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
