//! The 2025-11-25 core tasks, end to end through the router over a real registry: the
//! handshake, `tools/list`, task-augmented calls and every `tasks/*` method, with the
//! refusals and the hostile inputs of each.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::dispatch::*;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::reload::Reloader;

const CONFIG: &str = r#"
tools:
  - {name: echo, handler: {exec: {command: [/bin/echo, done]}}}
  - {name: nap, handler: {exec: {command: [/bin/sleep, "30"]}}}
  - {name: fails, handler: {exec: {command: [/bin/sh, -c, "echo broken >&2; exit 3"]}}}
  - {name: job, task: required, handler: {exec: {command: [/bin/echo, job]}}}
  - {name: quick, task: forbidden, handler: {exec: {command: [/bin/echo, quick]}}}
  - {name: hello, handler: {template: "hi"}}
"#;

fn served(config: &str, limits: Limits) -> Arc<Server> {
    served_by(config, |b| b.limits(limits))
}

/// A server of `config`, with the settings `set` gives.
fn served_by(
    config: &str,
    set: impl FnOnce(crate::dispatch::ServerBuilder) -> crate::dispatch::ServerBuilder,
) -> Arc<Server> {
    let metrics = Metrics::new("test", "system");
    let server = set(Server::builder(Registry::new(&metrics), metrics)).build();
    Reloader::new(server.clone())
        .apply(&[("t.yaml".into(), config.into())])
        .unwrap_or_else(|e| panic!("{e}"));
    server
}

fn server() -> Arc<Server> {
    served(CONFIG, Limits::default())
}

/// A 2025-11-25 request of the session `session` (its owner, without authentication).
fn at(session: &'static str) -> Ctx<'static> {
    Ctx {
        session,
        version: "2025-11-25",
        stream: false,
        era: Era::Handshake,
        caller: None,
        opens: Opens::Given,
        client: None,
    }
}

const ALICE: &str = "alice-session";
const BOB: &str = "bob-session";

async fn rpc(s: &Arc<Server>, ctx: Ctx<'_>, method: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).to_string();
    match s.handle(body.as_bytes(), ctx, false).await {
        Outcome::Reply(r) => serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}")),
        other => panic!("{method}: {other:?}"),
    }
}

fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error: {v}"))
}

/// Creates a task of `tool` for `ctx` and returns its id, checking the `CreateTaskResult`.
async fn create(s: &Arc<Server>, ctx: Ctx<'_>, tool: &str, task: Value) -> String {
    let v = rpc(
        s,
        ctx,
        "tools/call",
        json!({"name": tool, "arguments": {}, "task": task}),
    )
    .await;
    let t = &v["result"]["task"];
    assert_eq!(t["status"], "working", "{v}");
    for k in ["createdAt", "lastUpdatedAt"] {
        assert!(t[k].as_str().is_some_and(|s| s.ends_with('Z')), "{k}: {v}");
    }
    assert!(
        t["ttl"].as_u64().is_some() && t["pollInterval"].as_u64().is_some(),
        "{v}"
    );
    assert!(v["result"].get("content").is_none(), "{v}");
    t["taskId"].as_str().unwrap_or_else(|| panic!("{v}")).to_owned()
}

#[tokio::test]
async fn initialize_declares_tasks_in_2025_11_25_only() {
    let s = server();
    for (version, declared) in [("2025-11-25", true), ("2025-06-18", false), ("2025-03-26", false)] {
        let params = json!({"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}});
        let v = rpc(&s, at(ALICE), "initialize", params).await;
        let tasks = &v["result"]["capabilities"]["tasks"];
        if declared {
            assert_eq!(
                *tasks,
                json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
            );
        } else {
            assert!(tasks.is_null(), "{version}: {v}");
        }
    }
}

fn support(list: &Value) -> Vec<(String, Value)> {
    list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap_or("").to_owned(),
                t["execution"].clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn tools_list_tells_task_support_in_2025_11_25_only() {
    let want = |name: &str| match name {
        "echo" | "nap" | "fails" => json!({"taskSupport": "optional"}),
        "job" => json!({"taskSupport": "required"}),
        _ => Value::Null,
    };
    // Shared pages, and pages rendered per caller (a tool with `access`).
    let guarded =
        format!("{CONFIG}  - {{name: secret, access: {{scopes: [x]}}, handler: {{template: s}}}}\n");
    for s in [server(), served(&guarded, Limits::default())] {
        let v = rpc(&s, at(ALICE), "tools/list", json!({})).await;
        let got = support(&v);
        assert_eq!(got.len(), 6, "{v}");
        for (name, execution) in got {
            assert_eq!(execution, want(&name), "{name}");
        }
        for ctx in [Ctx {
            version: "2025-06-18",
            ..at(ALICE)
        }] {
            let v = rpc(&s, ctx, "tools/list", json!({})).await;
            assert!(support(&v).iter().all(|(_, e)| e.is_null()), "{v}");
        }
        let stateless = json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}});
        let ctx = Ctx {
            era: Era::Stateless("2026-07-28"),
            version: "2026-07-28",
            session: "",
            ..at(ALICE)
        };
        let v = rpc(&s, ctx, "tools/list", stateless).await;
        assert!(support(&v).iter().all(|(_, e)| e.is_null()), "{v}");
    }
}

#[tokio::test]
async fn a_task_runs_is_polled_and_answers_its_result_with_the_related_task() {
    let s = server();
    let id = create(&s, at(ALICE), "echo", json!({"ttl": 5000})).await;
    let got = rpc(
        &s,
        at(ALICE),
        "tasks/get",
        json!({"taskId": id, "task": {"ttl": 1}}),
    )
    .await;
    assert_eq!(got["result"]["taskId"], id.as_str());
    assert_eq!(got["result"]["ttl"], 5000);
    // Blocks until the task ends, then answers the call's own result.
    let r = rpc(&s, at(ALICE), "tasks/result", json!({"taskId": id})).await;
    assert_eq!(r["result"]["content"][0]["text"], "done\n", "{r}");
    assert_eq!(r["result"]["isError"], false, "{r}");
    assert_eq!(
        r["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        id.as_str()
    );
    let got = rpc(&s, at(ALICE), "tasks/get", json!({"taskId": id})).await;
    assert_eq!(got["result"]["status"], "completed", "{got}");
    assert!(got["result"].get("result").is_none() && got["result"].get("resultType").is_none());
    // A TTL over the server's is shortened to it; none asked is the server's.
    let long = create(&s, at(ALICE), "echo", json!({"ttl": 1_000_000_000_000u64})).await;
    let none = create(&s, at(ALICE), "echo", json!({})).await;
    for id in [long, none] {
        let got = rpc(&s, at(ALICE), "tasks/get", json!({"taskId": id})).await;
        assert_eq!(got["result"]["ttl"], 600_000, "{got}");
    }
    // Without `task` the same tool answers at once, as before.
    let v = rpc(
        &s,
        at(ALICE),
        "tools/call",
        json!({"name": "echo", "arguments": {}}),
    )
    .await;
    assert_eq!(v["result"]["content"][0]["text"], "done\n", "{v}");
}

#[tokio::test]
async fn a_failing_tool_is_a_failed_task_whose_result_is_the_tool_error() {
    let s = server();
    let id = create(&s, at(ALICE), "fails", json!({})).await;
    let r = rpc(&s, at(ALICE), "tasks/result", json!({"taskId": id})).await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert_eq!(
        r["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        id.as_str()
    );
    let got = rpc(&s, at(ALICE), "tasks/get", json!({"taskId": id})).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    assert!(got["result"]["statusMessage"].is_string(), "{got}");
}

#[tokio::test]
async fn task_support_is_enforced_with_method_not_found() {
    let s = server();
    for tool in ["quick", "hello"] {
        let v = rpc(
            &s,
            at(ALICE),
            "tools/call",
            json!({"name": tool, "arguments": {}, "task": {}}),
        )
        .await;
        assert_eq!(code(&v), -32601, "{tool}: {v}");
    }
    let v = rpc(
        &s,
        at(ALICE),
        "tools/call",
        json!({"name": "job", "arguments": {}}),
    )
    .await;
    assert_eq!(code(&v), -32601, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("Task augmentation required")
    );
    create(&s, at(ALICE), "job", json!({})).await;
    // Before 2025-11-25 there are no such tasks: the extension's rule refuses the call.
    let older = Ctx {
        version: "2025-06-18",
        ..at(ALICE)
    };
    let v = rpc(&s, older, "tools/call", json!({"name": "job", "arguments": {}})).await;
    assert_eq!(code(&v), i64::from(crate::protocol::MISSING_CAPABILITY), "{v}");
    for task in [
        json!(5),
        json!("x"),
        json!({"ttl": -1}),
        json!({"ttl": "9"}),
        json!({"ttl": 1.5}),
        json!({"other": 1}),
    ] {
        let v = rpc(
            &s,
            at(ALICE),
            "tools/call",
            json!({"name": "echo", "arguments": {}, "task": task}),
        )
        .await;
        assert_eq!(code(&v), -32602, "{task}: {v}");
    }
}

#[tokio::test]
async fn cancel_answers_the_cancelled_task_once_and_refuses_ended_ones() {
    let s = server();
    let id = create(&s, at(ALICE), "nap", json!({})).await;
    let v = rpc(&s, at(ALICE), "tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    assert_eq!(v["result"]["taskId"], id.as_str());
    let again = rpc(&s, at(ALICE), "tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(code(&again), -32602, "{again}");
    assert!(
        again["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("'cancelled'")
    );
    let r = rpc(&s, at(ALICE), "tasks/result", json!({"taskId": id})).await;
    assert_eq!(code(&r), -32602, "{r}");
    let done = create(&s, at(ALICE), "echo", json!({})).await;
    rpc(&s, at(ALICE), "tasks/result", json!({"taskId": done})).await;
    let v = rpc(&s, at(ALICE), "tasks/cancel", json!({"taskId": done})).await;
    assert_eq!(code(&v), -32602, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("'completed'")
    );
}

#[tokio::test]
async fn tasks_are_their_owners_alone_and_foreign_ids_answer_like_unknown_ones() {
    let s = server();
    let mine = create(&s, at(ALICE), "nap", json!({})).await;
    let theirs = create(&s, at(BOB), "nap", json!({})).await;
    let unknown = rpc(&s, at(BOB), "tasks/get", json!({"taskId": "0".repeat(32)})).await;
    for method in ["tasks/get", "tasks/cancel", "tasks/result"] {
        let v = rpc(&s, at(BOB), method, json!({"taskId": mine})).await;
        assert_eq!(v["error"], unknown["error"], "{method}: {v}");
    }
    let got = rpc(&s, at(ALICE), "tasks/get", json!({"taskId": mine})).await;
    assert_eq!(
        got["result"]["status"], "working",
        "a foreign cancel must not reach it"
    );
    let list = rpc(&s, at(BOB), "tasks/list", Value::Null).await;
    let ids: Vec<&str> = list["result"]["tasks"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .filter_map(|t| t["taskId"].as_str())
        .collect();
    assert_eq!(ids, [theirs.as_str()], "{list}");
    assert!(list["result"].get("nextCursor").is_none());
    for id in [&mine, &theirs] {
        let owner = if *id == mine { ALICE } else { BOB };
        rpc(&s, at(owner), "tasks/cancel", json!({"taskId": id})).await;
    }
}

#[tokio::test]
async fn tasks_list_pages_and_refuses_cursors_it_did_not_give() {
    let s = server();
    let n = super::LIST_PAGE + 3;
    let mut made = Vec::new();
    for _ in 0..n {
        made.push(create(&s, at(ALICE), "echo", json!({})).await);
    }
    let first = rpc(&s, at(ALICE), "tasks/list", json!({})).await;
    let cursor = first["result"]["nextCursor"]
        .as_str()
        .unwrap_or_else(|| panic!("{first}"));
    let second = rpc(&s, at(ALICE), "tasks/list", json!({"cursor": cursor})).await;
    assert!(second["result"].get("nextCursor").is_none(), "{second}");
    let listed: Vec<String> = [&first, &second]
        .iter()
        .flat_map(|p| p["result"]["tasks"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["taskId"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(listed, made, "every task once, in creation order");
    let huge = "tasks-".to_owned() + &"9".repeat(1 << 16);
    for bad in [
        json!("x"),
        json!("tasks-"),
        json!("tasks--1"),
        json!("tasks-999999999"),
        json!(huge),
        json!(7),
        json!({}),
    ] {
        let v = rpc(&s, at(ALICE), "tasks/list", json!({"cursor": bad})).await;
        assert_eq!(code(&v), -32602, "{bad}: {v}");
    }
}

#[tokio::test]
async fn malformed_task_requests_are_invalid_params() {
    let s = server();
    let huge = "a".repeat(1 << 20);
    for method in ["tasks/get", "tasks/cancel", "tasks/result"] {
        for params in [
            Value::Null,
            json!({}),
            json!({"taskId": 5}),
            json!({"taskId": null}),
            json!({"taskId": ["x"]}),
            json!({"taskId": huge}),
            json!({"taskId": "\u{0}\u{ffff}"}),
            json!([1, 2]),
        ] {
            let v = rpc(&s, at(ALICE), method, params).await;
            assert_eq!(code(&v), -32602, "{method}: {v}");
        }
    }
}

#[tokio::test]
async fn a_wait_for_a_result_ends_at_the_request_timeout() {
    let limits = Limits {
        request_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let s = served(CONFIG, limits);
    let id = create(&s, at(ALICE), "nap", json!({})).await;
    let start = Instant::now();
    let r = rpc(&s, at(ALICE), "tasks/result", json!({"taskId": id})).await;
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(code(&r), -32603, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("still working"),
        "{r}"
    );
    let got = rpc(&s, at(ALICE), "tasks/get", json!({"taskId": id})).await;
    assert_eq!(got["result"]["status"], "working", "the task runs on");
    rpc(&s, at(ALICE), "tasks/cancel", json!({"taskId": id})).await;
}

#[tokio::test]
async fn a_waiting_result_ends_when_the_task_is_cancelled() {
    let s = server();
    let id = create(&s, at(ALICE), "nap", json!({})).await;
    let waiting = {
        let (s, id) = (s.clone(), id.clone());
        tokio::spawn(async move { rpc(&s, at(ALICE), "tasks/result", json!({"taskId": id})).await })
    };
    // The wait is parked on the task's end, not polling: cancel it from elsewhere.
    tokio::task::yield_now().await;
    let v = rpc(&s, at(ALICE), "tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(v["result"]["status"], "cancelled");
    let r = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap_or_else(|_| panic!("tasks/result did not end with its task"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(code(&r), -32602, "{r}");
}

#[tokio::test]
async fn a_client_with_the_extension_keeps_the_extension_wire() {
    let s = server();
    let caps = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let params = json!({"protocolVersion": "2025-11-25", "capabilities": caps, "clientInfo": {"name": "t", "version": "0"}});
    let ctx = at("ext-session");
    assert!(matches!(
        s.handle(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})
                .to_string()
                .as_bytes(),
            ctx,
            false
        )
        .await,
        Outcome::Reply(_)
    ));
    let v = rpc(
        &s,
        ctx,
        "tools/call",
        json!({"name": "echo", "arguments": {}, "task": {}}),
    )
    .await;
    assert_eq!(v["result"]["resultType"], "task", "{v}");
    let v = rpc(&s, ctx, "tasks/list", json!({})).await;
    assert_eq!(code(&v), -32601, "{v}");
}

#[tokio::test]
async fn a_caller_polling_in_a_tight_loop_is_told_when_to_retry() {
    let s = server();
    let id = create(&s, at(ALICE), "nap", json!({})).await;
    let mut limited = None;
    for _ in 0..200 {
        let v = rpc(&s, at(ALICE), "tasks/get", json!({"taskId": id})).await;
        if v.get("error").is_some() {
            limited = Some(v);
            break;
        }
    }
    let v = limited.unwrap_or_else(|| panic!("200 polls at once were never limited"));
    assert_eq!(code(&v), i64::from(crate::protocol::RATE_LIMITED), "{v}");
    let ms = v["error"]["data"]["retryAfterMs"].as_u64().unwrap_or(0);
    assert!((1..=1000).contains(&ms), "{v}");
    assert_eq!(v["error"]["data"]["retryAfter"], 1);
    // Another caller is not held back by it, and after the wait told the caller is served.
    let other = rpc(&s, at(BOB), "tasks/list", json!({})).await;
    assert!(other.get("result").is_some(), "{other}");
    tokio::time::sleep(Duration::from_millis(ms)).await;
    let v = rpc(&s, at(ALICE), "tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
}

#[tokio::test]
async fn a_wait_ends_when_the_task_s_ttl_does() {
    let s = served_by(CONFIG, |b| {
        b.tasks(
            crate::dispatch::TaskBounds {
                ttl: Duration::from_millis(300),
                ..crate::dispatch::TaskBounds::default()
            },
            None,
        )
    });
    let id = create(&s, at(ALICE), "nap", json!({})).await;
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        rpc(&s, at(ALICE), "tasks/result", json!({"taskId": id})),
    )
    .await
    .unwrap_or_else(|_| panic!("tasks/result outlived the task's TTL"));
    assert_eq!(code(&r), -32602, "{r}");
}

#[tokio::test]
async fn every_page_of_the_2025_11_25_list_carries_task_support() {
    let s = served(
        &format!("server: {{name: t, pageSize: 2}}{CONFIG}"),
        Limits::default(),
    );
    let mut seen: Vec<(String, Value)> = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let params = cursor.as_ref().map_or(json!({}), |c| json!({"cursor": c}));
        let v = rpc(&s, at(ALICE), "tools/list", params).await;
        let page = support(&v);
        assert!(page.len() <= 2, "{v}");
        seen.extend(page);
        cursor = v["result"]["nextCursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    let names: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["echo", "nap", "fails", "job", "quick", "hello"]);
    let support: Vec<Value> = seen.into_iter().map(|(_, e)| e).collect();
    let optional = json!({"taskSupport": "optional"});
    assert_eq!(
        support,
        [
            optional.clone(),
            optional.clone(),
            optional,
            json!({"taskSupport": "required"}),
            Value::Null,
            Value::Null
        ]
    );
    let v = rpc(&s, at(ALICE), "tools/list", json!({"cursor": "nope-1"})).await;
    assert_eq!(code(&v), -32602, "{v}");
}

#[tokio::test]
async fn a_session_that_negotiated_an_older_revision_has_no_core_tasks() {
    // Over stdio every message is read at the newest handshake revision: the session's
    // `initialize` decides.
    let s = server();
    let ctx = at("older-session");
    for (session, version) in [("older-session", "2025-06-18"), ("newer-session", "2025-11-25")] {
        let params = json!({"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}});
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}).to_string();
        assert!(matches!(
            s.handle(body.as_bytes(), at(session), false).await,
            Outcome::Reply(_)
        ));
    }
    let v = rpc(&s, ctx, "tools/list", json!({})).await;
    assert!(support(&v).iter().all(|(_, e)| e.is_null()), "{v}");
    let v = rpc(&s, ctx, "tools/call", json!({"name": "job", "arguments": {}})).await;
    assert_eq!(code(&v), i64::from(crate::protocol::MISSING_CAPABILITY), "{v}");
    let v = rpc(&s, ctx, "tasks/list", json!({})).await;
    assert_eq!(code(&v), -32601, "{v}");
    let v = rpc(&s, at("newer-session"), "tasks/list", json!({})).await;
    assert_eq!(v["result"]["tasks"], json!([]), "{v}");
}

#[tokio::test]
async fn refused_arguments_of_a_task_call_are_the_outcome_of_a_task() {
    let s = served(
        "tools:\n  - {name: typed, input: {n: integer}, handler: {exec: {command: [/bin/echo, ok]}}}\n",
        Limits::default(),
    );
    let id = create(&s, at(ALICE), "typed", json!({})).await;
    let r = rpc(&s, at(ALICE), "tasks/result", json!({"taskId": id})).await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(
        r["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .contains("Invalid arguments"),
        "{r}"
    );
    let got = rpc(&s, at(ALICE), "tasks/get", json!({"taskId": id})).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
}

#[tokio::test]
async fn the_creating_session_is_told_when_its_task_ends() {
    let s = server();
    let mut events = s.subscribe();
    let id = create(&s, at(ALICE), "echo", json!({})).await;
    let e = tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .unwrap_or_else(|_| panic!("no notification"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(e.is_for(ALICE) && !e.is_for(BOB));
    let n: Value = serde_json::from_str(&e.message).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n["method"], "notifications/tasks/status");
    assert_eq!(n["params"]["taskId"], id.as_str());
    assert_eq!(n["params"]["status"], "completed");
    assert!(n["params"].get("_meta").is_none());
}

#[tokio::test]
async fn a_pipeline_runs_as_a_task_by_default_only_when_a_step_may_run_long() {
    let s = served(
        r#"
tools:
  - {name: run, handler: {exec: {command: [/bin/echo, hi]}}}
  - {name: ask, handler: {elicit: {key: k, message: m, schema: {type: object, properties: {ok: {type: boolean}}}}}}
  - {name: hello, handler: {template: hello}}
  - {name: builds, handler: {pipeline: [{tool: hello}, {tool: run}]}}
  - {name: nested, handler: {pipeline: [{tool: builds}]}}
  - {name: talks, handler: {pipeline: [{tool: hello}, {tool: ask}]}}
  - {name: held, task: forbidden, handler: {pipeline: [{tool: run}]}}
"#,
        Limits::default(),
    );
    let v = rpc(&s, at(ALICE), "tools/list", json!({})).await;
    let support: std::collections::BTreeMap<String, Value> = support(&v).into_iter().collect();
    let optional = json!({"taskSupport": "optional"});
    for (name, want) in [
        ("builds", &optional),
        ("nested", &optional),
        ("run", &optional),
        ("talks", &Value::Null),
        ("held", &Value::Null),
        ("hello", &Value::Null),
    ] {
        assert_eq!(&support[name], want, "{name}: {v}");
    }
}
