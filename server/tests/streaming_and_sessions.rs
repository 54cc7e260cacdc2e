//! Streamed answers (progress, log messages, sampling and elicitation requests on the SSE
//! answer to a POST), and the session state behind logging/setLevel, resource
//! subscriptions and completion, through the real HTTP transport.

mod common;
mod real_binary;

use std::time::Duration;

use axum::body::Body;
use common::{harness, post};
use http::Response;
use http_body_util::BodyExt;
use serde_json::{Value, json};

const TOOLS: &str = r#"
tools:
  - {name: pause, handler: {builtin: sleep}}
  - {name: quick, handler: {template: done}}
  - name: steps
    handler:
      pipeline:
        - {tool: pause, input: {ms: 20}, log: "starting"}
        - {tool: pause, input: {ms: 20}, log: "detail", logLevel: debug}
        - {tool: quick, log: "finishing", logLevel: warning}
  - name: ask
    input: {q: string}
    handler: {sample: {prompt: "Answer: {{q}}", systemPrompt: "Be brief", maxTokens: 50}}
  - name: form
    handler:
      elicit:
        message: "Who are you?"
        schema: {type: object, properties: {name: {type: string}, age: {type: integer, minimum: 0}}, required: [name]}
resources:
  - {uri: "doc://a", name: a, text: "first"}
  - {uri: "doc://b", name: b, text: "stays"}
  - {uriTemplate: "city://{name}", name: city, text: "{{name}}", values: {name: [Oslo, Osaka, Paris]}}
prompts:
  - name: trip
    arguments: [{name: to, required: true, values: [Rome, Rotterdam, Lima]}]
    messages: [{role: user, text: "Plan {{to}}"}]
"#;

/// A POST in `session`: an id the server issued, or a label for one (`common::sid`).
fn with_session(body: &str, session: &str) -> http::Request<Body> {
    let mut req = post(body);
    let session = if quiver_server::session::owned_by(session, "") {
        session.to_owned()
    } else {
        common::sid(session)
    };
    req.headers_mut()
        .insert("mcp-session-id", session.parse().unwrap());
    req
}

fn call(id: u64, tool: &str, args: Value, token: Option<&str>) -> String {
    let mut params = json!({"name": tool, "arguments": args});
    if let Some(t) = token {
        params["_meta"] = json!({"progressToken": t});
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string()
}

fn content_type(resp: &Response<Body>) -> String {
    resp.headers()[http::header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_owned()
}

/// Reads an SSE body event by event.
struct Events {
    body: Body,
    buf: String,
}

impl Events {
    fn new(resp: Response<Body>) -> Self {
        Self {
            body: resp.into_body(),
            buf: String::new(),
        }
    }

    /// The next event's JSON, or `None` when the stream ended.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let event: String = self.buf.drain(..end + 2).collect();
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect();
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some(serde_json::from_str(&data.join("\n")).unwrap());
            }
            let frame = tokio::time::timeout(Duration::from_secs(10), self.body.frame())
                .await
                .expect("an event within 10 s")?
                .unwrap();
            if let Ok(data) = frame.into_data() {
                self.buf.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
    }

    async fn all(mut self) -> Vec<Value> {
        let mut v = Vec::new();
        while let Some(e) = self.next().await {
            v.push(e);
        }
        v
    }
}

async fn json_body(resp: Response<Body>) -> Value {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

async fn initialize(h: &common::Harness, caps: Value) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": caps,
        "clientInfo": {"name": "t", "version": "1"}}});
    let (status, resp) = h.send(post(&body.to_string())).await;
    assert_eq!(status, 200);
    let session = resp.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let init = json_body(resp).await;
    let caps = &init["result"]["capabilities"];
    assert_eq!(caps["logging"], json!({}));
    assert_eq!(caps["completions"], json!({}));
    assert_eq!(caps["resources"]["subscribe"], true);
    session
}

#[tokio::test]
async fn progress_and_log_messages_stream_before_the_result() {
    let h = harness(TOOLS);
    let s = initialize(&h, json!({})).await;
    let (status, resp) = h
        .send(with_session(&call(7, "steps", json!({}), Some("tok")), &s))
        .await;
    assert_eq!(status, 200);
    assert_eq!(content_type(&resp), "text/event-stream");
    let events = Events::new(resp).all().await;
    let methods: Vec<&str> = events
        .iter()
        .map(|e| e["method"].as_str().unwrap_or("response"))
        .collect();
    // Default level info: the debug step's message is not sent.
    assert_eq!(
        methods,
        [
            "notifications/progress",
            "notifications/message",
            "notifications/progress",
            "notifications/progress",
            "notifications/message",
            "notifications/progress",
            "response"
        ],
        "{events:#?}"
    );
    let progress: Vec<(u64, u64)> = events
        .iter()
        .filter(|e| e["method"] == "notifications/progress")
        .map(|e| {
            assert_eq!(e["params"]["progressToken"], "tok");
            (
                e["params"]["progress"].as_u64().unwrap(),
                e["params"]["total"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(progress, [(0, 3), (1, 3), (2, 3), (3, 3)]);
    assert_eq!(
        events[1]["params"],
        json!({"level": "info", "logger": "pause", "data": "starting"})
    );
    assert_eq!(events[4]["params"]["level"], "warning");
    assert_eq!(events[6]["id"], 7);
    assert_eq!(events[6]["result"]["content"][0]["text"], "done");

    // logging/setLevel is per session: debug here, error for another session.
    let set = |level: &str| {
        json!({"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel", "params": {"level": level}})
            .to_string()
    };
    let (_, r) = h.send(with_session(&set("debug"), &s)).await;
    assert_eq!(json_body(r).await["result"], json!({}));
    let (_, r) = h.send(with_session(&set("error"), "other")).await;
    assert_eq!(json_body(r).await["result"], json!({}));
    let (_, r) = h.send(with_session(&set("loud"), &s)).await;
    assert_eq!(json_body(r).await["error"]["code"], -32602);
    let logs = |events: Vec<Value>| -> Vec<String> {
        events
            .iter()
            .filter(|e| e["method"] == "notifications/message")
            .map(|e| e["params"]["data"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, r) = h.send(with_session(&call(8, "steps", json!({}), None), &s)).await;
    assert_eq!(
        logs(Events::new(r).all().await),
        ["starting", "detail", "finishing"]
    );
    // Nothing at error level or above: no message, so a plain JSON answer.
    let (_, r) = h
        .send(with_session(&call(9, "steps", json!({}), None), "other"))
        .await;
    assert_eq!(content_type(&r), "application/json");
    assert_eq!(json_body(r).await["result"]["content"][0]["text"], "done");
}

#[tokio::test]
async fn calls_that_send_nothing_keep_json_answers() {
    let h = harness(TOOLS);
    // A fast tool never streams, even when the client asks for progress.
    let (_, r) = h.send(post(&call(1, "quick", json!({}), Some("t")))).await;
    assert_eq!(content_type(&r), "application/json");
    // A slow one without a token or log messages answers JSON too.
    let (_, r) = h.send(post(&call(2, "pause", json!({"ms": 5}), None))).await;
    assert_eq!(content_type(&r), "application/json");
    assert_eq!(json_body(r).await["id"], 2);
}

#[tokio::test]
async fn sampling_round_trip_answers_only_from_the_same_session() {
    let h = harness(TOOLS);
    let s = initialize(&h, json!({"sampling": {}})).await;
    let (_, r) = h
        .send(with_session(&call(3, "ask", json!({"q": "why?"}), None), &s))
        .await;
    assert_eq!(content_type(&r), "text/event-stream");
    let mut events = Events::new(r);
    let req = events.next().await.unwrap();
    assert_eq!(req["method"], "sampling/createMessage");
    assert_eq!(
        req["params"],
        json!({"messages": [{"role": "user", "content": {"type": "text", "text": "Answer: why?"}}],
               "maxTokens": 50, "systemPrompt": "Be brief"})
    );
    let answer = |text: &str| {
        json!({"jsonrpc": "2.0", "id": req["id"], "result": {
            "role": "assistant", "content": {"type": "text", "text": text},
            "model": "m-1", "stopReason": "endTurn"}})
        .to_string()
    };
    // Another session's answer to the same id is not taken.
    assert_eq!(h.send(with_session(&answer("forged"), "intruder")).await.0, 202);
    assert_eq!(h.server.pending.len(), 1);
    assert_eq!(h.send(with_session(&answer("because"), &s)).await.0, 202);
    let result = events.next().await.unwrap();
    assert_eq!(result["id"], 3);
    assert_eq!(result["result"]["content"][0]["text"], "because");
    assert_eq!(result["result"]["structuredContent"]["model"], "m-1");
    assert!(events.next().await.is_none());
    assert!(h.server.pending.is_empty());

    // A client that did not declare sampling gets a tool error, not a request.
    let plain = initialize(&h, json!({})).await;
    let (_, r) = h
        .send(with_session(&call(4, "ask", json!({"q": "x"}), None), &plain))
        .await;
    let out = json_body(r).await;
    assert_eq!(out["result"]["isError"], true);
    assert!(
        out["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("sampling capability")
    );
    // Without a session there is no way to route the answer back.
    let (_, r) = h.send(post(&call(5, "ask", json!({"q": "x"}), None))).await;
    let out = json_body(r).await;
    assert!(
        out["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("needs a session"),
        "{out}"
    );
}

#[tokio::test]
async fn answers_get_in_when_every_request_slot_is_taken() {
    let h = common::harness_with(
        TOOLS,
        quiver_server::transport::http::HttpOptions {
            max_concurrency: 1,
            ..Default::default()
        },
    );
    let s = initialize(&h, json!({"sampling": {}})).await;
    let (_, r) = h
        .send(with_session(&call(3, "ask", json!({"q": "?"}), None), &s))
        .await;
    let mut events = Events::new(r);
    let req = events.next().await.unwrap();
    // The waiting call holds the only slot: a request is shed, the answer is not.
    let ping = json!({"jsonrpc": "2.0", "id": 9, "method": "ping"}).to_string();
    assert_eq!(h.send(with_session(&ping, &s)).await.0, 503);
    let answer = json!({"jsonrpc": "2.0", "id": req["id"], "result": {
        "role": "assistant", "content": {"type": "text", "text": "ok"}, "model": "m"}});
    assert_eq!(h.send(with_session(&answer.to_string(), &s)).await.0, 202);
    assert_eq!(events.next().await.unwrap()["result"]["content"][0]["text"], "ok");
    assert!(events.next().await.is_none());
    assert_eq!(h.send(with_session(&ping, &s)).await.0, 200);
}

#[tokio::test]
async fn elicitation_checks_the_answer_against_the_form() {
    let h = harness(TOOLS);
    let s = initialize(&h, json!({"elicitation": {}})).await;
    let mut outcomes = Vec::new();
    for answer in [
        json!({"action": "accept", "content": {"name": "Ada", "age": 36}}),
        json!({"action": "accept", "content": {"age": -1}}),
        json!({"action": "decline"}),
    ] {
        let (_, r) = h.send(with_session(&call(6, "form", json!({}), None), &s)).await;
        let mut events = Events::new(r);
        let req = events.next().await.unwrap();
        assert_eq!(req["method"], "elicitation/create");
        assert_eq!(req["params"]["message"], "Who are you?");
        assert_eq!(req["params"]["requestedSchema"]["required"], json!(["name"]));
        let reply = json!({"jsonrpc": "2.0", "id": req["id"], "result": answer}).to_string();
        assert_eq!(h.send(with_session(&reply, &s)).await.0, 202);
        outcomes.push(events.next().await.unwrap()["result"].clone());
    }
    assert_eq!(outcomes[0]["isError"], false);
    assert_eq!(
        outcomes[0]["structuredContent"],
        json!({"action": "accept", "content": {"name": "Ada", "age": 36}})
    );
    assert_eq!(outcomes[1]["isError"], true);
    let why = outcomes[1]["content"][0]["text"].as_str().unwrap();
    assert!(
        why.contains("missing required property `name`") && why.contains("must be >= 0"),
        "{why}"
    );
    assert_eq!(outcomes[2]["isError"], true);
    assert!(
        outcomes[2]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("action=decline")
    );
}

#[tokio::test]
async fn subscriptions_get_updates_on_reload_for_their_session_only() {
    let h = harness(TOOLS);
    let rpc = |method: &str, uri: &str| {
        json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"uri": uri}}).to_string()
    };
    for uri in ["doc://a", "doc://b", "city://Oslo"] {
        let (_, r) = h.send(with_session(&rpc("resources/subscribe", uri), "s1")).await;
        assert_eq!(json_body(r).await["result"], json!({}));
    }
    let (_, r) = h
        .send(with_session(&rpc("resources/subscribe", "doc://a"), "s2"))
        .await;
    assert_eq!(json_body(r).await["result"], json!({}));
    let (_, r) = h
        .send(with_session(&rpc("resources/unsubscribe", "doc://a"), "s2"))
        .await;
    assert_eq!(json_body(r).await["result"], json!({}));
    let (_, r) = h
        .send(with_session(&rpc("resources/subscribe", "doc://nope"), "s1"))
        .await;
    assert_eq!(json_body(r).await["error"]["code"], -32002);
    let (_, r) = h.send(post(&rpc("resources/subscribe", "doc://a"))).await;
    assert!(
        json_body(r).await["error"]["message"]
            .as_str()
            .unwrap()
            .contains("need a session")
    );

    let mut events = h.server.subscribe();
    let next = TOOLS
        .replace(r#"text: "first""#, r#"text: "second""#)
        .replace(r#"text: "{{name}}""#, r#"text: "City {{name}}""#);
    h.reloader.apply(&[("test.yaml".into(), next)]).unwrap();
    let mut updated = Vec::new();
    while let Ok(e) = events.try_recv() {
        if e.message.contains("resources/updated") {
            let v: Value = serde_json::from_str(&e.message).unwrap();
            updated.push((
                e.session.as_deref().unwrap().to_owned(),
                v["params"]["uri"].as_str().unwrap().to_owned(),
            ));
        }
    }
    updated.sort();
    // doc://b did not change; s2 unsubscribed.
    assert_eq!(
        updated,
        [
            (common::sid("s1"), "city://Oslo".to_owned()),
            (common::sid("s1"), "doc://a".to_owned())
        ]
    );
}

#[tokio::test]
async fn completion_offers_declared_values_by_prefix() {
    let h = harness(TOOLS);
    let complete = |reference: Value, name: &str, value: &str| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "completion/complete",
               "params": {"ref": reference, "argument": {"name": name, "value": value}}})
        .to_string()
    };
    let (_, r) = h
        .send(post(&complete(
            json!({"type": "ref/prompt", "name": "trip"}),
            "to",
            "ro",
        )))
        .await;
    assert_eq!(
        json_body(r).await["result"]["completion"],
        json!({"values": ["Rome", "Rotterdam"], "total": 2, "hasMore": false})
    );
    let (_, r) = h
        .send(post(&complete(
            json!({"type": "ref/resource", "uri": "city://{name}"}),
            "name",
            "O",
        )))
        .await;
    assert_eq!(
        json_body(r).await["result"]["completion"]["values"],
        json!(["Oslo", "Osaka"])
    );
    // An argument without values completes to nothing.
    let (_, r) = h
        .send(post(&complete(
            json!({"type": "ref/resource", "uri": "doc://a"}),
            "x",
            "",
        )))
        .await;
    assert_eq!(json_body(r).await["result"]["completion"]["total"], 0);
    let (_, r) = h
        .send(post(&complete(
            json!({"type": "ref/prompt", "name": "nope"}),
            "to",
            "",
        )))
        .await;
    assert_eq!(json_body(r).await["error"]["code"], -32602);
    let (_, r) = h
        .send(post(&complete(json!({"type": "ref/tool"}), "to", "")))
        .await;
    assert_eq!(json_body(r).await["error"]["code"], -32602);
    // Completion values are not part of the prompt listing.
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "prompts/list"}).to_string();
    let (_, r) = h.send(post(&list)).await;
    assert_eq!(
        json_body(r).await["result"]["prompts"][0]["arguments"][0],
        json!({"name": "to", "required": true})
    );
}

/// What an upstream sends during a call passes its result guard as its result does: a log
/// line with a key is redacted, one with what the guard refuses is dropped, and the result
/// that carries it is withheld. (The upstream is a real quiver-server over HTTP: log lines
/// reach the client on the call's own answer stream.)
#[tokio::test]
async fn an_upstreams_log_lines_and_result_pass_its_result_guard() {
    let inner = real_binary::start_http_env(
        r#"
tools:
  - {name: pause, handler: {builtin: sleep}}
  - {name: answer, handler: {template: "reach jane@acme.io"}}
  - name: leak
    handler:
      pipeline:
        - {tool: pause, input: {ms: 1}, log: "key AKIAZ2QXLMN7ORP4VWTY in use"}
        - {tool: pause, input: {ms: 1}, log: "mail jane@acme.io"}
        - {tool: answer, log: "done"}
"#,
        &[],
        &[],
    );
    let tools = format!(
        "upstreams:
  - name: inner
    http: {{url: 'http://127.0.0.1:{port}/mcp'}}
    tools: {{include: [leak], resultGuards: {{secrets: redact, personalData: refuse}}}}
",
        port = inner.mcp,
    );
    let h = harness(&tools);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    // The in-process harness rebuilds with the upstream's tools when asked (the binary
    // follows its upstreams).
    while h.server.registry.load().tool_index("leak").is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the upstream's tool was not imported in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = h.reloader.refresh();
    }
    let s = initialize(&h, json!({})).await;
    let (_, resp) = h.send(with_session(&call(3, "leak", json!({}), None), &s)).await;
    let events = Events::new(resp).all().await;
    let logs: Vec<&Value> = events
        .iter()
        .filter(|e| e["method"] == "notifications/message")
        .map(|e| &e["params"]["data"])
        .collect();
    assert_eq!(
        logs,
        [&json!("key [redacted:aws_access_key_id] in use"), &json!("done")],
        "{events:#?}"
    );
    let result = &events.last().unwrap()["result"];
    assert_eq!(result["isError"], true, "{result}");
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("withheld") && !text.contains("jane"), "{text}");
}
