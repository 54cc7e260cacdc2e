//! Tasks that wait for the client's input, end to end through the router: `input_required`
//! with `inputRequests`, `tasks/update` (partial, ignored, refused answers), resuming, and a
//! pipeline whose questions come as input rounds before it becomes a task.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::dispatch::*;
use crate::metrics::Metrics;
use crate::protocol::{INVALID_PARAMS, MISSING_CAPABILITY};
use crate::registry::Registry;
use crate::reload::Reloader;

const CONFIG: &str = r#"
tools:
  - name: confirm_delete
    input: {filename: string}
    task: required
    handler:
      elicit:
        key: confirm
        message: "Delete {{filename}}?"
        schema: {type: object, properties: {confirm: {type: boolean}}, required: [confirm]}
  - name: multi_input
    task: required
    handler:
      ask:
        name: {elicit: {message: "Name?", schema: {type: object, properties: {name: {type: string}}, required: [name]}}}
        confirm: {elicit: {message: "Proceed?", schema: {type: object, properties: {confirm: {type: boolean}}, required: [confirm]}}}
  - name: confirm_once
    task: required
    limits: [{concurrency: 1, per: all}]
    handler:
      elicit:
        key: ok
        message: "Go?"
        schema: {type: object, properties: {ok: {type: boolean}}, required: [ok]}
  - name: ask_user_name
    handler:
      elicit:
        key: user_name
        message: "What is your name?"
        schema: {type: object, properties: {name: {type: string}}, required: [name]}
  - name: greet
    input: {name: string}
    handler: {exec: {command: [/bin/echo, "Hello, {{name}}!"]}}
  - name: long_first
    task: required
    handler:
      pipeline:
        - {tool: nested_long, input: {name: first}}
        - {tool: ask_user_name}
  - name: ask_then_nested
    task: required
    handler:
      pipeline:
        - {tool: ask_user_name}
        - {tool: nested_long, input: {name: "{{steps.0.structured.content.name}}"}}
  - name: nested_long
    input: {name: string}
    handler:
      pipeline:
        - {tool: greet}
  - name: with_task
    task: required
    handler:
      pipeline:
        - {tool: ask_user_name}
        - {tool: greet, input: {name: "{{steps.0.structured.content.name}}"}}
"#;

const STATELESS_CX: Ctx<'static> = Ctx {
    session: "",
    version: "2026-07-28",
    stream: false,
    era: Era::Stateless("2026-07-28"),
    caller: None,
    opens: Opens::Minted,
    client: None,
};

fn server() -> Arc<Server> {
    let metrics = Metrics::new("test", "system");
    let server = Server::new(Registry::new(&metrics), metrics);
    Reloader::new(server.clone())
        .apply(&[("t.yaml".into(), CONFIG.into())])
        .unwrap_or_else(|e| panic!("{e}"));
    server
}

fn caps() -> Value {
    json!({"elicitation": {}, "extensions": {"io.modelcontextprotocol/tasks": {}}})
}

/// A request, with the 2026-07-28 `_meta` when `caps` is given.
fn body(method: &str, mut params: Value, caps: Option<&Value>) -> String {
    if let Some(c) = caps {
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": c,
        });
    }
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string()
}

async fn send(s: &Arc<Server>, body: &str, ctx: Ctx<'_>) -> Value {
    match s.handle(body.as_bytes(), ctx, false).await {
        Outcome::Reply(r) => serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}: {body}")),
        other => panic!("{body}: {other:?}"),
    }
}

async fn stateless(s: &Arc<Server>, method: &str, params: Value) -> Value {
    send(s, &body(method, params, Some(&caps())), STATELESS_CX).await
}

fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error: {v}"))
}

/// Polls `tasks/get` until the status is `status` (at most 10 s).
async fn until(s: &Arc<Server>, id: &str, status: &str, ctx: Ctx<'_>, caps: Option<&Value>) -> Value {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let v = send(s, &body("tasks/get", json!({"taskId": id}), caps), ctx).await;
        if v["result"]["status"] == status {
            return v["result"].clone();
        }
        assert!(Instant::now() < end, "task never {status}: {v}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn created(s: &Arc<Server>, tool: &str, args: Value) -> String {
    let v = stateless(s, "tools/call", json!({"name": tool, "arguments": args})).await;
    assert_eq!(v["result"]["resultType"], "task", "{v}");
    v["result"]["taskId"].as_str().unwrap().to_owned()
}

fn accept(content: Value) -> Value {
    json!({"action": "accept", "content": content})
}

#[tokio::test]
async fn a_task_waits_for_its_answer_and_completes_with_it() {
    let s = server();
    let id = created(&s, "confirm_delete", json!({"filename": "a.txt"})).await;
    let t = until(&s, &id, "input_required", STATELESS_CX, Some(&caps())).await;
    let q = &t["inputRequests"]["confirm"];
    assert_eq!(q["method"], "elicitation/create", "{t}");
    assert_eq!(q["params"]["message"], "Delete a.txt?");
    assert!(
        t.get("requestState").is_none() && t.get("result").is_none(),
        "{t}"
    );
    // Not pending: ignored with an acknowledgement.
    let ignored = json!({"taskId": id, "inputResponses": {"unknown-key": {"ignored": true}}});
    let v = stateless(&s, "tasks/update", ignored).await;
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    // Malformed answers to the pending key, and malformed params: -32602, nothing changes.
    for params in [
        json!({"taskId": id, "inputResponses": {"confirm": {"nope": 1}}}),
        json!({"taskId": id, "inputResponses": {"confirm": "yes"}}),
        json!({"taskId": id, "inputResponses": ["confirm"]}),
        json!({"taskId": id, "inputResponses": "x".repeat(1 << 16)}),
        json!({"taskId": id}),
        json!({"taskId": 7, "inputResponses": {}}),
    ] {
        let v = stateless(&s, "tasks/update", params.clone()).await;
        assert_eq!(code(&v), i64::from(INVALID_PARAMS), "{params}: {v}");
    }
    // Another caller's update is an unknown task, and reaches nothing.
    let other = Ctx {
        session: "other",
        ..STATELESS_CX
    };
    let answer = json!({"taskId": id, "inputResponses": {"confirm": accept(json!({"confirm": true}))}});
    let v = send(&s, &body("tasks/update", answer.clone(), Some(&caps())), other).await;
    assert_eq!(code(&v), i64::from(INVALID_PARAMS), "{v}");
    assert_eq!(
        until(&s, &id, "input_required", STATELESS_CX, Some(&caps())).await["inputRequests"],
        t["inputRequests"]
    );
    // Many unknown keys cost nothing and change nothing.
    let many: serde_json::Map<String, Value> = (0..10_000).map(|i| (format!("k{i}"), json!({}))).collect();
    let v = stateless(&s, "tasks/update", json!({"taskId": id, "inputResponses": many})).await;
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    let v = stateless(&s, "tasks/update", answer).await;
    let ack = v["result"].as_object().unwrap();
    assert!(ack.keys().all(|k| k == "resultType" || k == "_meta"), "{v}");
    let done = until(&s, &id, "completed", STATELESS_CX, Some(&caps())).await;
    assert_eq!(
        done["result"]["structuredContent"],
        accept(json!({"confirm": true})),
        "{done}"
    );
}

#[tokio::test]
async fn partial_answers_keep_the_task_waiting_for_the_rest() {
    let s = server();
    let id = created(&s, "multi_input", json!({})).await;
    let t = until(&s, &id, "input_required", STATELESS_CX, Some(&caps())).await;
    let keys: Vec<&String> = t["inputRequests"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["confirm", "name"]);
    let one =
        json!({"taskId": id, "inputResponses": {"name": accept(json!({"name": "p1", "confirm": true}))}});
    assert_eq!(
        stateless(&s, "tasks/update", one).await["result"]["resultType"],
        "complete"
    );
    // At once: the next get shows the answered key gone.
    let v = stateless(&s, "tasks/get", json!({"taskId": id})).await;
    assert_eq!(v["result"]["status"], "input_required", "{v}");
    assert!(v["result"]["inputRequests"].get("name").is_none(), "{v}");
    assert!(v["result"]["inputRequests"].get("confirm").is_some(), "{v}");
    let two =
        json!({"taskId": id, "inputResponses": {"confirm": accept(json!({"name": "p2", "confirm": true}))}});
    stateless(&s, "tasks/update", two).await;
    let done = until(&s, &id, "completed", STATELESS_CX, Some(&caps())).await;
    assert_eq!(
        done["result"]["structuredContent"]["name"]["content"]["name"], "p1",
        "{done}"
    );
}

#[tokio::test]
async fn a_declined_form_completes_the_task_with_a_tool_error() {
    let s = server();
    let id = created(&s, "confirm_delete", json!({"filename": "b"})).await;
    until(&s, &id, "input_required", STATELESS_CX, Some(&caps())).await;
    let no = json!({"taskId": id, "inputResponses": {"confirm": {"action": "decline"}}});
    stateless(&s, "tasks/update", no).await;
    let done = until(&s, &id, "completed", STATELESS_CX, Some(&caps())).await;
    assert_eq!(done["result"]["isError"], true, "{done}");
}

#[tokio::test]
async fn a_parked_task_can_be_cancelled() {
    let s = server();
    let id = created(&s, "confirm_delete", json!({"filename": "c"})).await;
    until(&s, &id, "input_required", STATELESS_CX, Some(&caps())).await;
    stateless(&s, "tasks/cancel", json!({"taskId": id})).await;
    until(&s, &id, "cancelled", STATELESS_CX, Some(&caps())).await;
    let late = json!({"taskId": id, "inputResponses": {"confirm": accept(json!({"confirm": true}))}});
    assert_eq!(
        stateless(&s, "tasks/update", late).await["result"]["resultType"],
        "complete"
    );
    assert_eq!(
        until(&s, &id, "cancelled", STATELESS_CX, Some(&caps())).await["status"],
        "cancelled"
    );
}

#[tokio::test]
async fn a_task_asking_without_the_capability_fails_with_32021() {
    let s = server();
    let no_elicitation = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let call = body(
        "tools/call",
        json!({"name": "confirm_delete", "arguments": {"filename": "d"}}),
        Some(&no_elicitation),
    );
    let v = send(&s, &call, STATELESS_CX).await;
    let id = v["result"]["taskId"].as_str().unwrap();
    let t = until(&s, id, "failed", STATELESS_CX, Some(&no_elicitation)).await;
    assert_eq!(t["error"]["code"], i64::from(MISSING_CAPABILITY), "{t}");
    assert!(
        t["error"]["message"].as_str().unwrap().contains("elicitation"),
        "{t}"
    );
}

#[tokio::test]
async fn a_pipeline_asks_in_input_rounds_then_becomes_a_task() {
    let s = server();
    let round1 = stateless(&s, "tools/call", json!({"name": "with_task", "arguments": {}})).await;
    let r = &round1["result"];
    assert_eq!(r["resultType"], "input_required", "{round1}");
    assert!(r.get("taskId").is_none());
    assert_eq!(r["inputRequests"]["user_name"]["method"], "elicitation/create");
    let state = r["requestState"].clone();
    let answer = json!({"user_name": accept(json!({"name": "Alice"}))});
    let retry =
        json!({"name": "with_task", "arguments": {}, "inputResponses": answer, "requestState": state});
    let round2 = stateless(&s, "tools/call", retry).await;
    let r = &round2["result"];
    assert_eq!(r["resultType"], "task", "{round2}");
    assert!(
        r.get("requestState").is_none() && r.get("inputRequests").is_none(),
        "{round2}"
    );
    let id = r["taskId"].as_str().unwrap();
    let done = until(&s, id, "completed", STATELESS_CX, Some(&caps())).await;
    assert!(
        done["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Hello, Alice!"),
        "{done}"
    );
    // A forged requestState is refused as in any round; a declined form answers at once.
    let forged =
        json!({"name": "with_task", "arguments": {}, "inputResponses": answer, "requestState": "forged"});
    assert_eq!(
        code(&stateless(&s, "tools/call", forged).await),
        i64::from(INVALID_PARAMS)
    );
    let declined =
        json!({"name": "with_task", "arguments": {}, "inputResponses": {"user_name": {"action": "decline"}}});
    let v = stateless(&s, "tools/call", declined).await;
    assert_eq!(
        (v["result"]["isError"].clone(), v["result"]["resultType"].clone()),
        (json!(true), json!("complete")),
        "{v}"
    );
    assert!(v["result"].get("taskId").is_none(), "{v}");
}

#[tokio::test]
async fn in_the_handshake_era_a_pipeline_is_a_task_at_once_and_asks_through_it() {
    let s = server();
    let ctx = Ctx {
        session: "stdio",
        version: "2025-11-25",
        era: Era::Handshake,
        opens: Opens::Given,
        client: None,
        ..STATELESS_CX
    };
    let init = body(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": caps()}),
        None,
    );
    send(&s, &init, ctx).await;
    let v = send(
        &s,
        &body("tools/call", json!({"name": "with_task", "arguments": {}}), None),
        ctx,
    )
    .await;
    let id = v["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_owned();
    let t = until(&s, &id, "input_required", ctx, None).await;
    assert_eq!(
        t["inputRequests"]["user_name"]["method"], "elicitation/create",
        "{t}"
    );
    let answer = json!({"taskId": id, "inputResponses": {"user_name": accept(json!({"name": "Bob"}))}});
    let v = send(&s, &body("tasks/update", answer, None), ctx).await;
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    let done = until(&s, &id, "completed", ctx, None).await;
    assert!(
        done["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Hello, Bob!"),
        "{done}"
    );
}

#[tokio::test]
async fn a_waiting_task_frees_its_concurrency_place_and_takes_it_again_to_run_on() {
    let s = server();
    // The limit allows one call in flight: the second task exists only because the first
    // one, waiting for its answer, holds no place.
    let first = created(&s, "confirm_once", json!({})).await;
    until(&s, &first, "input_required", STATELESS_CX, Some(&caps())).await;
    let second = created(&s, "confirm_once", json!({})).await;
    until(&s, &second, "input_required", STATELESS_CX, Some(&caps())).await;
    // Someone else holds the place: the answered task waits for it, working.
    let snap = s.registry.load();
    let index = snap.tool_index("confirm_once").unwrap();
    let limits = snap.tools[index].def.governance.limits.clone();
    let held = s
        .limiter
        .admit(&limits, crate::limits::Who::Anonymous)
        .await
        .unwrap();
    let answer = json!({"taskId": first, "inputResponses": {"ok": accept(json!({"ok": true}))}});
    stateless(&s, "tasks/update", answer).await;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let v = stateless(&s, "tasks/get", json!({"taskId": first})).await;
        assert_eq!(v["result"]["status"], "working", "ran without its place: {v}");
    }
    drop(held);
    until(&s, &first, "completed", STATELESS_CX, Some(&caps())).await;
    // Its place is free again once it ended.
    drop(
        s.limiter
            .admit(&limits, crate::limits::Who::Anonymous)
            .await
            .unwrap(),
    );
}

#[tokio::test]
async fn a_task_may_wait_for_input_32_times_and_fails_on_the_33rd() {
    // Pipelines of 32 and 33 questions, each its own round (a pipeline stops at its first
    // unanswered step).
    let mut config = String::from("tools:\n");
    let mut steps = Vec::new();
    for i in 0..33 {
        config.push_str(&format!(
            "  - {{name: q{i}, handler: {{elicit: {{key: k{i}, message: m, schema: {{type: object, properties: {{x: {{type: string}}}}}}}}}}}}\n"
        ));
        steps.push(format!("{{tool: q{i}}}"));
    }
    config.push_str(&format!(
        "  - {{name: many, task: required, handler: {{pipeline: [{}]}}}}\n",
        steps.join(", ")
    ));
    config.push_str(&format!(
        "  - {{name: enough, task: required, handler: {{pipeline: [{}]}}}}\n",
        steps[..32].join(", ")
    ));
    let metrics = Metrics::new("test", "system");
    let s = Server::new(Registry::new(&metrics), metrics);
    Reloader::new(s.clone())
        .apply(&[("t.yaml".into(), config)])
        .unwrap_or_else(|e| panic!("{e}"));
    let answer_all = |id: String| {
        let s = s.clone();
        async move {
            for i in 0..32 {
                let t = until(&s, &id, "input_required", STATELESS_CX, Some(&caps())).await;
                let key = format!("k{i}");
                assert!(t["inputRequests"].get(&key).is_some(), "{t}");
                let answer = json!({"taskId": id, "inputResponses": {key: accept(json!({"x": "y"}))}});
                stateless(&s, "tasks/update", answer).await;
            }
        }
    };
    let id = created(&s, "enough", json!({})).await;
    answer_all(id.clone()).await;
    until(&s, &id, "completed", STATELESS_CX, Some(&caps())).await;
    let id = created(&s, "many", json!({})).await;
    answer_all(id.clone()).await;
    let t = until(&s, &id, "failed", STATELESS_CX, Some(&caps())).await;
    assert_eq!(t["error"]["code"], -32603, "{t}");
    assert!(
        t["error"]["message"]
            .as_str()
            .unwrap()
            .contains("more than 32 times"),
        "{t}"
    );
}

#[tokio::test]
async fn a_pipeline_whose_first_step_may_run_long_is_a_task_at_once() {
    let s = server();
    // The first step is a pipeline with a process in it: nothing runs in the request.
    let id = created(&s, "long_first", json!({})).await;
    let t = until(&s, &id, "input_required", STATELESS_CX, Some(&caps())).await;
    assert_eq!(
        t["inputRequests"]["user_name"]["method"], "elicitation/create",
        "{t}"
    );
    let answer = json!({"taskId": id, "inputResponses": {"user_name": accept(json!({"name": "Eve"}))}});
    stateless(&s, "tasks/update", answer).await;
    let done = until(&s, &id, "completed", STATELESS_CX, Some(&caps())).await;
    assert_eq!(
        done["result"]["structuredContent"]["content"]["name"], "Eve",
        "{done}"
    );
}

#[tokio::test]
async fn a_nested_pipeline_with_a_process_is_a_long_step() {
    let s = server();
    let v = stateless(
        &s,
        "tools/call",
        json!({"name": "ask_then_nested", "arguments": {}}),
    )
    .await;
    assert_eq!(v["result"]["resultType"], "input_required", "{v}");
    let retry = json!({"name": "ask_then_nested", "arguments": {},
        "inputResponses": {"user_name": accept(json!({"name": "Zed"}))},
        "requestState": v["result"]["requestState"]});
    let v = stateless(&s, "tools/call", retry).await;
    let id = v["result"]["taskId"].as_str().unwrap_or_else(|| panic!("{v}"));
    let done = until(&s, id, "completed", STATELESS_CX, Some(&caps())).await;
    assert!(
        done["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Hello, Zed!"),
        "{done}"
    );
}
