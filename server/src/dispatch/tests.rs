//! The router, end to end over a real registry: envelope refusals, unknown methods in each
//! era, and each family's answers and refusals.

use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::metrics::Metrics;
use crate::protocol::{FORBIDDEN, INVALID_PARAMS, MISSING_CAPABILITY, RESOURCE_NOT_FOUND};
use crate::registry::Registry;
use crate::reload::Reloader;
use crate::spec::access::Principal;

const CONFIG: &str = r#"
tools:
  - {name: add, handler: {builtin: add}}
  - {name: sleep, handler: {builtin: sleep}}
  - name: deploy
    input: {service: string}
    access: {scopes: [deploy:write]}
    handler: {template: 'deployed {{service}}'}
  - name: ask
    input: {q: string}
    handler: {sample: {prompt: "Answer: {{q}}", maxTokens: 50}}
resources:
  - {uri: "doc://a", name: a, text: "first"}
  - {uriTemplate: "city://{name}", name: city, text: "{{name}}", values: {name: [Oslo, Osaka, Paris]}}
prompts:
  - name: trip
    arguments: [{name: to, required: true, values: [Rome, Rotterdam, Lima]}]
    messages: [{role: user, text: "Plan {{to}}"}]
"#;

fn server() -> Arc<Server> {
    let metrics = Metrics::new("test", "system");
    let server = Server::new(Registry::new(&metrics), metrics);
    Reloader::new(server.clone())
        .apply(&[("t.yaml".into(), CONFIG.into())])
        .unwrap_or_else(|e| panic!("{e}"));
    server
}

pub(super) const HANDSHAKE_CX: Ctx<'static> = Ctx {
    session: "",
    version: "2025-11-25",
    stream: false,
    era: Era::Handshake,
    caller: None,
    opens: Opens::Minted,
    client: None,
};

/// The handshake era before 2025-11-25 (no core tasks).
const OLDER: Ctx<'static> = Ctx {
    version: "2025-06-18",
    ..HANDSHAKE_CX
};

const STATELESS_CX: Ctx<'static> = Ctx {
    era: Era::Stateless("2026-07-28"),
    version: "2026-07-28",
    ..HANDSHAKE_CX
};

fn run(s: &Arc<Server>, body: &str, ctx: Ctx<'_>) -> Outcome {
    futures_util::FutureExt::now_or_never(s.handle(body.as_bytes(), ctx, false))
        .unwrap_or_else(|| panic!("did not answer at once: {body}"))
}

fn reply(s: &Arc<Server>, body: &str, ctx: Ctx<'_>) -> (u16, Value, Reply) {
    match run(s, body, ctx) {
        Outcome::Reply(r) => (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}: {body}")),
            r,
        ),
        other => panic!("{body}: {other:?}"),
    }
}

fn request(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string()
}

/// A 2026-07-28 request: `params` with the `_meta` that revision requires.
fn stateless(method: &str, mut params: Value, caps: Value) -> String {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
    });
    request(method, params)
}

/// Polls `cond` until it holds (at most 10 s).
async fn wait_for(cond: impl Fn() -> bool) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < end, "condition not reached in 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error: {v}"))
}

fn counted(s: &Server, method: &str, outcome: &str) -> bool {
    s.metrics.encode().lines().any(|l| {
        l.starts_with(&format!(
            "quiver_requests_total{{method=\"{method}\",outcome=\"{outcome}\"}} 1"
        ))
    })
}

#[test]
fn envelope_refusals_name_the_id_when_they_can() {
    let s = server();
    let (status, v, _) = reply(&s, "{nope", HANDSHAKE_CX);
    assert_eq!((status, code(&v)), (400, -32700));
    assert!(v["id"].is_null());
    let (status, v, _) = reply(&s, r#"{"jsonrpc":"1.0","id":9,"method":"ping"}"#, HANDSHAKE_CX);
    assert_eq!((status, code(&v), v["id"].clone()), (200, -32600, json!(9)));
    let (status, v, _) = reply(&s, r#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#, HANDSHAKE_CX);
    assert_eq!((status, code(&v)), (400, -32600));
    assert!(counted(&s, "invalid", "parse_error"));
    // Notifications and answers are accepted, not answered.
    assert!(matches!(
        run(
            &s,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            HANDSHAKE_CX
        ),
        Outcome::Accepted
    ));
    assert!(matches!(
        run(&s, r#"{"jsonrpc":"2.0","id":"x","result":{}}"#, HANDSHAKE_CX),
        Outcome::Accepted
    ));
}

#[test]
fn unknown_methods_per_era() {
    let s = server();
    let (status, v, _) = reply(&s, &request("nope", json!({})), HANDSHAKE_CX);
    assert_eq!((status, code(&v)), (200, -32601));
    assert_eq!(v["error"]["message"], "Method not found: nope");
    // A 2026-07-28 method is unknown to the handshake era, and the other way round.
    let (_, v, _) = reply(&s, &request("server/discover", json!({})), HANDSHAKE_CX);
    assert_eq!(v["error"]["message"], "Method not found: server/discover");
    let (status, v, _) = reply(&s, &stateless("ping", json!({}), json!({})), STATELESS_CX);
    assert_eq!((status, code(&v)), (404, -32601));
    assert_eq!(
        v["error"]["message"],
        "Method not found: ping is not part of protocol 2026-07-28"
    );
    let (status, v, _) = reply(&s, &stateless("nope", json!({}), json!({})), STATELESS_CX);
    assert_eq!(
        (status, v["error"]["message"].clone()),
        (404, json!("Method not found: nope"))
    );
    // `_meta` is checked before the method is looked up.
    let (status, v, _) = reply(&s, &request("nope", json!({})), STATELESS_CX);
    assert_eq!((status, code(&v)), (400, i64::from(INVALID_PARAMS)));
}

#[test]
fn tools_answer_and_refuse() {
    let s = server();
    let call = |name: &str, args: Value| json!({"name": name, "arguments": args});
    let (status, v, _) = reply(
        &s,
        &request("tools/call", call("add", json!({"a": 1, "b": 2}))),
        HANDSHAKE_CX,
    );
    assert_eq!(status, 200);
    assert_eq!(v["result"]["content"][0]["text"], "3");
    assert!(v["result"].get("resultType").is_none());
    let (_, v, _) = reply(
        &s,
        &stateless("tools/call", call("add", json!({"a": 1, "b": 2})), json!({})),
        STATELESS_CX,
    );
    assert_eq!(v["result"]["resultType"], "complete");
    // `deploy` needs a scope an anonymous caller cannot have: not listed for it.
    let (_, v, _) = reply(&s, &request("tools/list", json!({})), HANDSHAKE_CX);
    assert!(
        v["result"]["tools"].as_array().is_some_and(|t| t.len() == 3),
        "{v}"
    );
    let deployer = Principal::new(["deploy:write"], []);
    let ctx = Ctx {
        caller: Some(&deployer),
        ..HANDSHAKE_CX
    };
    let (_, v, _) = reply(&s, &request("tools/list", json!({})), ctx);
    assert!(
        v["result"]["tools"].as_array().is_some_and(|t| t.len() == 4),
        "{v}"
    );
    let (_, v, _) = reply(&s, &stateless("tools/list", json!({}), json!({})), STATELESS_CX);
    assert!(v["result"]["ttlMs"].is_number(), "cache hints: {v}");
    // Rendered for its caller: no shared cache may keep it.
    assert_eq!(v["result"]["cacheScope"], "private", "{v}");
    let (_, v, _) = reply(&s, &request("tools/call", call("none", json!({}))), HANDSHAKE_CX);
    assert_eq!(code(&v), i64::from(INVALID_PARAMS));
    let (_, v, _) = reply(
        &s,
        &request("tools/list", json!({"cursor": "forged"})),
        HANDSHAKE_CX,
    );
    assert_eq!(code(&v), i64::from(INVALID_PARAMS));
}

/// A 2026-07-28 retry's `requestState` and `inputResponses` are checked before the tool
/// runs, also for a tool that answers at once (whose first round is opened only if needed).
#[test]
fn a_retry_of_a_tool_that_answers_at_once_is_checked_before_it_runs() {
    let s = server();
    let call = |extra: Value| {
        let mut params = json!({"name": "add", "arguments": {"a": 1, "b": 2}});
        if let (Some(p), Value::Object(e)) = (params.as_object_mut(), extra) {
            p.extend(e);
        }
        stateless("tools/call", params, json!({}))
    };
    for (extra, refusal) in [
        (json!({"requestState": "forged.state"}), "integrity check"),
        (
            json!({"inputResponses": ["not", "an", "object"]}),
            "`inputResponses` must be an object",
        ),
    ] {
        let (status, v, _) = reply(&s, &call(extra.clone()), STATELESS_CX);
        assert_eq!(
            (status, code(&v)),
            (400, i64::from(INVALID_PARAMS)),
            "{extra}: {v}"
        );
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(refusal), "{extra}: {v}");
    }
    // An empty answer set is a retry too, and a valid one: the call runs.
    for extra in [json!({}), json!({"inputResponses": {}})] {
        let (status, v, _) = reply(&s, &call(extra.clone()), STATELESS_CX);
        assert_eq!(status, 200, "{extra}: {v}");
        assert_eq!(v["result"]["content"][0]["text"], "3", "{extra}: {v}");
        assert_eq!(v["result"]["resultType"], "complete", "{extra}: {v}");
    }
}

#[test]
fn a_call_the_caller_may_not_make_is_forbidden_in_both_eras() {
    let s = server();
    let reader = Principal::new(["read"], []);
    let args = json!({"name": "deploy", "arguments": {"service": "x"}});
    for (ctx, body) in [
        (HANDSHAKE_CX, request("tools/call", args.clone())),
        (STATELESS_CX, stateless("tools/call", args.clone(), json!({}))),
    ] {
        let ctx = Ctx {
            caller: Some(&reader),
            ..ctx
        };
        let (status, v, r) = reply(&s, &body, ctx);
        assert_eq!((status, code(&v)), (403, i64::from(FORBIDDEN)));
        assert_eq!(v["error"]["data"]["missingScopes"], json!(["deploy:write"]));
        let Some(ErrorData::Forbidden(f)) = &r.error else {
            panic!("no typed refusal: {:?}", r.error)
        };
        assert_eq!(f.scope_challenge().as_deref(), Some("deploy:write"));
    }
    assert!(!counted(&s, "tools/call", "internal_error"));
    assert!(
        s.metrics
            .encode()
            .contains(r#"quiver_requests_total{method="tools/call",outcome="forbidden"} 2"#)
    );
}

#[tokio::test]
async fn a_missing_client_capability_is_its_own_outcome() {
    let s = server();
    let body = stateless(
        "tools/call",
        json!({"name": "ask", "arguments": {"q": "?"}}),
        json!({}),
    );
    let out = s.handle(body.as_bytes(), STATELESS_CX, false).await;
    let Outcome::Reply(r) = out else { panic!("{out:?}") };
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!((r.status, code(&v)), (400, i64::from(MISSING_CAPABILITY)));
    assert!(
        counted(&s, "tools/call", "missing_capability"),
        "{}",
        s.metrics.encode()
    );
}

#[tokio::test]
async fn a_slow_call_is_deferred_when_the_transport_streams_and_cancellable_in_its_session() {
    let s = server();
    let body = request("tools/call", json!({"name": "sleep", "arguments": {"ms": 30000}}));
    let ctx = Ctx {
        session: "s1",
        stream: true,
        ..HANDSHAKE_CX
    };
    let Outcome::Deferred(d) = s.handle(body.as_bytes(), ctx, false).await else {
        panic!("not deferred")
    };
    let call = tokio::spawn(d.run(None));
    wait_for(|| s.cancellable_calls() == 1).await;
    let cancel = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#;
    assert!(matches!(
        s.handle(cancel.as_bytes(), ctx, false).await,
        Outcome::Accepted
    ));
    assert!(call.await.unwrap().is_none(), "a cancelled call gets no answer");
    assert!(counted(&s, "tools/call", "cancelled"));
}

#[test]
fn resources_answer_and_refuse_per_era() {
    let s = server();
    let (_, v, _) = reply(
        &s,
        &request("resources/read", json!({"uri": "doc://a"})),
        HANDSHAKE_CX,
    );
    assert_eq!(v["result"]["contents"][0]["text"], "first");
    let (_, v, _) = reply(
        &s,
        &request("resources/read", json!({"uri": "city://Oslo"})),
        HANDSHAKE_CX,
    );
    assert_eq!(v["result"]["contents"][0]["text"], "Oslo");
    let (status, v, _) = reply(
        &s,
        &request("resources/read", json!({"uri": "doc://z"})),
        HANDSHAKE_CX,
    );
    assert_eq!((status, code(&v)), (200, i64::from(RESOURCE_NOT_FOUND)));
    assert!(v["error"].get("data").is_none());
    let (status, v, _) = reply(
        &s,
        &stateless("resources/read", json!({"uri": "doc://z"}), json!({})),
        STATELESS_CX,
    );
    assert_eq!((status, code(&v)), (400, i64::from(INVALID_PARAMS)));
    assert_eq!(v["error"]["data"], json!({"uri": "doc://z"}));
    let (_, v, _) = reply(&s, &request("resources/templates/list", json!({})), HANDSHAKE_CX);
    assert_eq!(
        v["result"]["resourceTemplates"][0]["uriTemplate"],
        "city://{name}"
    );
    let session = Ctx {
        session: "s1",
        ..HANDSHAKE_CX
    };
    let (_, v, _) = reply(
        &s,
        &request("resources/subscribe", json!({"uri": "doc://a"})),
        session,
    );
    assert_eq!(v["result"], json!({}));
    assert_eq!(s.sessions.subscriptions().len(), 1);
    let (_, v, _) = reply(
        &s,
        &request("resources/subscribe", json!({"uri": "doc://z"})),
        session,
    );
    assert_eq!(code(&v), i64::from(RESOURCE_NOT_FOUND));
    reply(
        &s,
        &request("resources/unsubscribe", json!({"uri": "doc://a"})),
        session,
    );
    assert!(s.sessions.subscriptions().is_empty());
}

#[test]
fn prompts_answer_and_refuse() {
    let s = server();
    let (_, v, _) = reply(
        &s,
        &request(
            "prompts/get",
            json!({"name": "trip", "arguments": {"to": "Rome"}}),
        ),
        HANDSHAKE_CX,
    );
    assert_eq!(v["result"]["messages"][0]["content"]["text"], "Plan Rome");
    let (_, v, _) = reply(&s, &request("prompts/get", json!({"name": "trip"})), HANDSHAKE_CX);
    assert_eq!(code(&v), i64::from(INVALID_PARAMS));
    let (_, v, _) = reply(
        &s,
        &stateless(
            "prompts/get",
            json!({"name": "trip", "arguments": {"to": "Lima"}}),
            json!({}),
        ),
        STATELESS_CX,
    );
    assert_eq!(v["result"]["resultType"], "complete");
    let (_, v, _) = reply(&s, &request("prompts/list", json!({})), HANDSHAKE_CX);
    assert_eq!(v["result"]["prompts"][0]["name"], "trip");
}

#[test]
fn completion_and_logging_answer_and_refuse() {
    let s = server();
    let complete =
        json!({"ref": {"type": "ref/prompt", "name": "trip"}, "argument": {"name": "to", "value": "ro"}});
    let (_, v, _) = reply(
        &s,
        &request("completion/complete", complete.clone()),
        HANDSHAKE_CX,
    );
    assert_eq!(v["result"]["completion"]["values"], json!(["Rome", "Rotterdam"]));
    let (_, v, _) = reply(
        &s,
        &stateless("completion/complete", complete, json!({})),
        STATELESS_CX,
    );
    assert_eq!(v["result"]["resultType"], "complete");
    let unknown =
        json!({"ref": {"type": "ref/resource", "uri": "nope://"}, "argument": {"name": "x", "value": ""}});
    let (_, v, _) = reply(
        &s,
        &stateless("completion/complete", unknown, json!({})),
        STATELESS_CX,
    );
    assert_eq!(code(&v), i64::from(INVALID_PARAMS));
    assert!(v["error"].get("data").is_none());
    let session = Ctx {
        session: "s1",
        ..HANDSHAKE_CX
    };
    let (_, v, _) = reply(
        &s,
        &request("logging/setLevel", json!({"level": "warning"})),
        session,
    );
    assert_eq!(v["result"], json!({}));
    let (_, v, _) = reply(
        &s,
        &request("logging/setLevel", json!({"level": "loud"})),
        session,
    );
    assert_eq!(code(&v), i64::from(INVALID_PARAMS));
}

#[test]
fn initialize_opens_its_session_in_dispatch() {
    let s = server();
    let init = request(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {"sampling": {}}}),
    );
    let (_, v, r) = reply(&s, &init, HANDSHAKE_CX);
    assert_eq!(v["result"]["protocolVersion"], "2025-06-18");
    let id = r.session.expect("a minted session id");
    assert!(crate::session::owned_by(&id, ""));
    assert!(s.sessions.caps(&id).is_some_and(|c| c.sampling));
    let given = Ctx {
        session: "stdio",
        opens: Opens::Given,
        client: None,
        ..HANDSHAKE_CX
    };
    let (_, _, r) = reply(&s, &init, given);
    assert!(r.session.is_none());
    assert!(s.sessions.caps("stdio").is_some_and(|c| c.sampling));
    // A failed initialize opens nothing; a batch's does.
    let before = s.sessions.len();
    let (_, v, r) = reply(&s, &request("initialize", json!({})), HANDSHAKE_CX);
    assert_eq!(
        (code(&v), r.session, s.sessions.len()),
        (i64::from(INVALID_PARAMS), None, before)
    );
    let batch = format!("[{init}]");
    let Outcome::Reply(r) =
        futures_util::FutureExt::now_or_never(s.handle(batch.as_bytes(), HANDSHAKE_CX, true)).unwrap()
    else {
        panic!()
    };
    assert!(r.session.is_some_and(|id| s.sessions.caps(&id).is_some()));
}

#[test]
fn ping_discover_and_listen() {
    let s = server();
    let (_, v, _) = reply(&s, &request("ping", json!({})), HANDSHAKE_CX);
    assert_eq!(v["result"], json!({}));
    let (_, v, _) = reply(
        &s,
        &stateless("server/discover", json!({}), json!({})),
        STATELESS_CX,
    );
    assert!(v["result"]["ttlMs"].is_number(), "{v}");
    let listen = stateless(
        "subscriptions/listen",
        json!({"notifications": {"toolsListChanged": true}}),
        json!({}),
    );
    let in_session = Ctx {
        session: "stdio",
        era: Era::Detect,
        opens: Opens::Given,
        client: None,
        ..HANDSHAKE_CX
    };
    let Outcome::Listen(l) = run(&s, &listen, in_session) else {
        panic!("not a listen")
    };
    assert!(l.filter.tools_list_changed);
    let token = l.cancellation();
    let cancel = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#;
    run(&s, cancel, in_session);
    assert!(token.is_cancelled());
    let too_many: Vec<String> = (0..=MAX_LISTEN_URIS).map(|i| format!("doc://{i}")).collect();
    let (status, v, _) = reply(
        &s,
        &stateless(
            "subscriptions/listen",
            json!({"notifications": {"resourceSubscriptions": too_many}}),
            json!({}),
        ),
        STATELESS_CX,
    );
    assert_eq!((status, code(&v)), (400, i64::from(INVALID_PARAMS)));
}

/// A ToolSet of `tools` plain tools and one pipeline running the first `steps` of them,
/// under `policies` policies that apply to every tool and that a reader meets.
fn governed(tools: usize, policies: usize, steps: usize) -> Arc<Server> {
    let mut y = String::from("policies:\n");
    for i in 0..policies {
        y.push_str(&format!(
            "  - {{name: p{i}, expression: \"'read' in caller.scopes\"}}\n"
        ));
    }
    y.push_str("tools:\n");
    for i in 0..tools {
        y.push_str(&format!("  - {{name: t{i}, handler: {{template: ok}}}}\n"));
    }
    let run: Vec<String> = (0..steps).map(|i| format!("{{tool: t{i}}}")).collect();
    y.push_str(&format!(
        "  - {{name: pipe, handler: {{pipeline: [{}]}}}}\n",
        run.join(", ")
    ));
    let metrics = Metrics::new("test", "system");
    let server = Server::new(Registry::new(&metrics), metrics);
    Reloader::new(server.clone())
        .apply(&[("t.yaml".into(), y)])
        .unwrap_or_else(|e| panic!("{e}"));
    server
}

fn unjudged(s: &Server) -> u64 {
    s.metrics.gov.policy_unjudged.get()
}

/// Every page of `tools/list` for `caller`: the names on each.
fn pages(s: &Arc<Server>, caller: &Principal) -> Vec<Vec<String>> {
    let ctx = Ctx {
        caller: Some(caller),
        ..HANDSHAKE_CX
    };
    let mut out = Vec::new();
    let mut params = json!({});
    loop {
        let (_, v, _) = reply(s, &request("tools/list", params), ctx);
        let names = v["result"]["tools"].as_array().unwrap_or_else(|| panic!("{v}"));
        out.push(
            names
                .iter()
                .map(|t| t["name"].as_str().unwrap_or("").to_owned())
                .collect(),
        );
        match v["result"]["nextCursor"].as_str() {
            Some(c) => params = json!({"cursor": c}),
            None => return out,
        }
        assert!(out.len() < 100, "pages never end");
    }
}

#[test]
fn a_listing_spends_a_bounded_number_of_policy_evaluations() {
    use super::visible::MAX_LIST_EVALUATIONS;
    let reader = Principal::new(["read"], []);
    // 90 tools (and the pipeline) under 20 policies: 1820 evaluations for one page of 100,
    // more than one request may spend. The page ends where the budget does, with a cursor;
    // the next page goes on from there, and every tool the caller may call is listed once.
    let s = governed(90, 20, 1);
    let got = pages(&s, &reader);
    assert_eq!(got[0].len(), MAX_LIST_EVALUATIONS / 20, "{got:?}");
    assert_eq!(got.len(), 2, "{got:?}");
    let all: Vec<String> = got.concat();
    let want: Vec<String> = (0..90)
        .map(|i| format!("t{i}"))
        .chain(["pipe".to_owned()])
        .collect();
    assert_eq!(all, want);
    assert_eq!(unjudged(&s), 1);
    // A caller the policies refuse sees nothing, and the budget holds the same way.
    let nobody = Principal::new(["write"], []);
    assert!(pages(&s, &nobody).concat().is_empty());
    // A pipeline whose decision alone costs more than the budget (its own 20 policies and
    // its 60 steps' 20 each) is never judged, so never shown; everything else is.
    let s = governed(60, 20, 60);
    let all = pages(&s, &reader).concat();
    assert_eq!(all.len(), 60, "{all:?}");
    assert!(!all.iter().any(|t| t == "pipe"));
    assert!(unjudged(&s) >= 1);
    // Under the budget, nothing is counted.
    let s = governed(10, 2, 3);
    assert_eq!(pages(&s, &reader).concat().len(), 11);
    assert_eq!(unjudged(&s), 0);
}

#[test]
fn tasks_methods_are_gated_unknown_ids_refused_and_removed_methods_absent() {
    let s = server();
    let tasks = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
        let body = stateless(method, json!({"taskId": "x", "inputResponses": {}}), json!({}));
        let (_, v, _) = reply(&s, &body, STATELESS_CX);
        assert_eq!(code(&v), i64::from(MISSING_CAPABILITY), "{method}");
        assert!(
            v["error"]["data"]["requiredCapabilities"]["extensions"]["io.modelcontextprotocol/tasks"]
                .is_object()
        );
        let huge = "f".repeat(1 << 16);
        for id in [
            "tasks-conformance-nonexistent",
            "00000000000000000000000000000000",
            huge.as_str(),
        ] {
            let body = stateless(method, json!({"taskId": id, "inputResponses": {}}), tasks.clone());
            let (_, v, _) = reply(&s, &body, STATELESS_CX);
            assert_eq!(code(&v), i64::from(INVALID_PARAMS), "{method}");
        }
    }
    for method in ["tasks/result", "tasks/list"] {
        let (_, v, _) = reply(
            &s,
            &stateless(method, json!({"taskId": "x"}), tasks.clone()),
            STATELESS_CX,
        );
        assert_eq!(code(&v), -32601, "{method}");
        let (_, v, _) = reply(&s, &request(method, json!({"taskId": "x"})), OLDER);
        assert_eq!(code(&v), -32601, "{method}");
    }
    // A fast kind answers at once even to a client that polls tasks.
    let body = stateless(
        "tools/call",
        json!({"name": "add", "arguments": {"a": 1, "b": 2}}),
        tasks,
    );
    let (_, v, _) = reply(&s, &body, STATELESS_CX);
    assert_eq!(v["result"]["resultType"], "complete");
    assert!(v["result"].get("taskId").is_none());
}

#[test]
fn a_tool_that_runs_only_as_a_task_refuses_a_client_without_the_extension() {
    let metrics = Metrics::new("test", "system");
    let s = Server::new(Registry::new(&metrics), metrics);
    let config = "tools:\n  - {name: job, task: required, handler: {exec: {command: [/bin/echo, done]}}}\n";
    Reloader::new(s.clone())
        .apply(&[("t.yaml".into(), config.into())])
        .unwrap_or_else(|e| panic!("{e}"));
    let call = json!({"name": "job", "arguments": {}});
    for (body, ctx) in [
        (stateless("tools/call", call.clone(), json!({})), STATELESS_CX),
        (request("tools/call", call.clone()), OLDER),
    ] {
        let (_, v, _) = reply(&s, &body, ctx);
        assert_eq!(code(&v), i64::from(MISSING_CAPABILITY), "{v}");
        assert!(
            v["error"]["data"]["requiredCapabilities"]["extensions"]["io.modelcontextprotocol/tasks"]
                .is_object(),
            "{v}"
        );
    }
    // The check follows `access`: a caller who may not call the tool learns nothing of it.
    let refused = "tools:\n  - {name: job, task: required, access: {scopes: [x]}, handler: {exec: {command: [/bin/echo]}}}\n";
    Reloader::new(s.clone())
        .apply(&[("t.yaml".into(), refused.into())])
        .unwrap_or_else(|e| panic!("{e}"));
    let (_, v, _) = reply(&s, &request("tools/call", call), HANDSHAKE_CX);
    assert_ne!(code(&v), i64::from(MISSING_CAPABILITY), "{v}");
}

/// How many requests of `method` the request counter holds, whatever their outcome.
fn requests_of(s: &Server, method: &str) -> u64 {
    let prefix = format!("quiver_requests_total{{method=\"{method}\",");
    s.metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn every_method_of_the_table_is_counted_under_its_own_label() {
    let s = server();
    for name in table::NAMES {
        let era = table::lookup(name).map(|m| m.eras);
        let (body, ctx) = if era == Some(table::Eras::Stateless) {
            (stateless(name, json!({}), json!({})), STATELESS_CX)
        } else {
            (request(name, json!({})), HANDSHAKE_CX)
        };
        let _ = run(&s, &body, ctx);
        assert_eq!(requests_of(&s, name), 1, "{name}");
    }
    assert_eq!(requests_of(&s, "other"), 0);
    // A client cannot name a label of what is not a request: those are unknown methods.
    for name in ["nope", "other", "batch", "notification", "response", "invalid"] {
        let (_, v, _) = reply(&s, &request(name, json!({})), HANDSHAKE_CX);
        assert_eq!(code(&v), -32601, "{name}");
    }
    assert_eq!(requests_of(&s, "other"), 6);
    assert_eq!(requests_of(&s, "batch"), 0);
}

#[test]
fn each_method_is_served_in_its_eras_and_not_found_in_the_other() {
    let s = server();
    for name in table::NAMES {
        let eras = table::lookup(name).map(|m| m.eras);
        for in_stateless in [false, true] {
            let (body, ctx) = if in_stateless {
                (stateless(name, json!({}), json!({})), STATELESS_CX)
            } else {
                (request(name, json!({})), HANDSHAKE_CX)
            };
            let answer = match run(&s, &body, ctx) {
                Outcome::Reply(r) => Some((
                    r.status,
                    serde_json::from_slice::<Value>(&r.body).unwrap_or_default(),
                )),
                _ => None,
            };
            let not_found = answer
                .as_ref()
                .is_some_and(|(_, v)| v["error"]["code"] == json!(-32601));
            let served = match eras {
                Some(table::Eras::Both) => true,
                Some(table::Eras::Handshake) => !in_stateless,
                Some(table::Eras::Stateless) => in_stateless,
                None => false,
            };
            assert_eq!(
                not_found, !served,
                "{name}, 2026-07-28: {in_stateless}: {answer:?}"
            );
            // 2026-07-28 says which methods it removed (over HTTP, 404).
            if in_stateless && !served {
                let (status, v) = answer.unwrap_or_default();
                assert_eq!(status, 404, "{name}");
                assert_eq!(
                    v["error"]["message"],
                    format!("Method not found: {name} is not part of protocol 2026-07-28")
                );
            }
        }
    }
}
