//! Policies and the audit trail over `resources/read` and `prompts/get`: a policy can pick
//! a prompt or a resource and refuses it as it refuses a tool call, one without selectors
//! governs all three, one that names only tools leaves them alone, and each read or get is
//! recorded with its outcome and caller.

use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::metrics::Metrics;
use crate::protocol::FORBIDDEN;
use crate::registry::Registry;
use crate::reload::Reloader;
use crate::spec::access::Principal;

const BASE: &str = r#"
tools:
  - {name: add, handler: {builtin: add}}
  - {name: greet, input: {who: string}, handler: {template: 'hi {{who}}'}}
resources:
  - {uri: "doc://a", name: a, text: "first"}
  - {uriTemplate: "city://{name}", name: city, text: "{{name}}"}
prompts:
  - name: trip
    arguments: [{name: to, required: true}]
    messages: [{role: user, text: "Plan {{to}}"}]
  - name: open
    messages: [{role: user, text: "Hello"}]
"#;

fn server_with(policies: &str) -> Arc<Server> {
    server_by(policies, |b| b)
}

/// A server of `policies` and the base tools, with the settings `set` gives.
fn server_by(
    policies: &str,
    set: impl FnOnce(crate::dispatch::ServerBuilder) -> crate::dispatch::ServerBuilder,
) -> Arc<Server> {
    let metrics = Metrics::new("test", "system");
    let server = set(Server::builder(Registry::new(&metrics), metrics)).build();
    Reloader::new(server.clone())
        .apply(&[("t.yaml".into(), format!("policies:\n{policies}{BASE}"))])
        .unwrap_or_else(|e| panic!("{e}"));
    server
}

const HANDSHAKE_CX: Ctx<'static> = Ctx {
    session: "",
    version: "2025-11-25",
    stream: false,
    era: Era::Handshake,
    caller: None,
    opens: Opens::Minted,
    client: None,
};

const STATELESS_CX: Ctx<'static> = Ctx {
    era: Era::Stateless("2026-07-28"),
    version: "2026-07-28",
    ..HANDSHAKE_CX
};

fn body(method: &str, params: Value, stateless: bool) -> String {
    let mut params = params;
    if stateless {
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        });
    }
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string()
}

/// The HTTP status and the answer of one request by `caller`.
fn ask(
    s: &Arc<Server>,
    caller: Option<&Principal>,
    method: &str,
    params: Value,
    stateless: bool,
) -> (u16, Value) {
    let ctx = Ctx {
        caller,
        ..if stateless { STATELESS_CX } else { HANDSHAKE_CX }
    };
    let text = body(method, params, stateless);
    let out = futures_util::FutureExt::now_or_never(s.handle(text.as_bytes(), ctx, false))
        .unwrap_or_else(|| panic!("did not answer at once: {text}"));
    match out {
        Outcome::Reply(r) => (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}: {text}")),
        ),
        other => panic!("{text}: {other:?}"),
    }
}

fn read(s: &Arc<Server>, who: Option<&Principal>, uri: &str) -> (u16, Value) {
    ask(s, who, "resources/read", json!({"uri": uri}), false)
}

fn get(s: &Arc<Server>, who: Option<&Principal>, name: &str, args: Value) -> (u16, Value) {
    ask(
        s,
        who,
        "prompts/get",
        json!({"name": name, "arguments": args}),
        false,
    )
}

fn call(s: &Arc<Server>, who: Option<&Principal>, tool: &str, args: Value) -> (u16, Value) {
    ask(
        s,
        who,
        "tools/call",
        json!({"name": tool, "arguments": args}),
        false,
    )
}

fn ok(r: &(u16, Value)) -> bool {
    r.0 == 200 && r.1.get("result").is_some()
}

fn reader() -> Principal {
    Principal::new(["read"], [])
}

fn admin() -> Principal {
    Principal::new(["read"], ["admin"])
}

#[test]
fn a_policy_denying_a_prompt_refuses_prompts_get_like_a_denied_tool_call() {
    let s = server_with(
        "  - {name: admins-only, expression: \"'admin' in caller.groups\", tools: [add], prompts: [trip]}\n",
    );
    let (r, a) = (reader(), admin());
    let tool = call(&s, Some(&r), "add", json!({"a": 1, "b": 2}));
    assert_eq!(
        (tool.0, tool.1["error"]["code"].as_i64()),
        (403, Some(i64::from(FORBIDDEN)))
    );
    assert_eq!(
        tool.1["error"]["message"],
        "Forbidden: policy `admins-only` does not allow this call of tool add"
    );
    assert_eq!(
        tool.1["error"]["data"],
        json!({"tool": "add", "policy": "admins-only"})
    );
    for stateless in [false, true] {
        let (status, v) = ask(
            &s,
            Some(&r),
            "prompts/get",
            json!({"name": "trip", "arguments": {"to": "Rome"}}),
            stateless,
        );
        assert_eq!(
            (status, v["error"]["code"].as_i64()),
            (403, Some(i64::from(FORBIDDEN))),
            "{v}"
        );
        assert_eq!(
            v["error"]["message"],
            "Forbidden: policy `admins-only` does not allow this request of prompt trip"
        );
        assert_eq!(
            v["error"]["data"],
            json!({"prompt": "trip", "policy": "admins-only"})
        );
    }
    // Decided before the arguments are looked at: a refused caller learns nothing of them.
    let (status, v) = get(&s, Some(&r), "trip", json!({}));
    assert_eq!(
        (status, v["error"]["code"].as_i64()),
        (403, Some(i64::from(FORBIDDEN))),
        "{v}"
    );
    assert!(ok(&get(&s, Some(&a), "trip", json!({"to": "Rome"}))));
    // Another prompt, the resources and another tool are not picked.
    assert!(ok(&get(&s, Some(&r), "open", json!({}))));
    assert!(ok(&read(&s, Some(&r), "doc://a")));
    assert!(ok(&call(&s, Some(&r), "greet", json!({"who": "x"}))));
    assert!(
        s.metrics
            .encode()
            .contains(r#"quiver_requests_total{method="prompts/get",outcome="forbidden"} 3"#)
    );
}

#[test]
fn a_policy_that_names_only_tools_does_not_affect_resources_or_prompts() {
    let s = server_with(
        "  - {name: never, expression: \"false\", tools: [add, \"gr*\"]}\n  - {name: up, expression: \"false\", tools: [add]}\n",
    );
    let r = reader();
    for who in [None, Some(&r)] {
        assert!(ok(&read(&s, who, "doc://a")));
        assert!(ok(&read(&s, who, "city://Oslo")));
        assert!(ok(&get(&s, who, "trip", json!({"to": "Rome"}))));
        assert_eq!(call(&s, who, "add", json!({"a": 1, "b": 2})).0, 403);
        assert_eq!(call(&s, who, "greet", json!({"who": "x"})).0, 403);
    }
}

#[test]
fn a_policy_without_selectors_governs_tools_resources_and_prompts() {
    let s = server_with("  - {name: admins, expression: \"'admin' in caller.groups\"}\n");
    let (r, a) = (reader(), admin());
    for who in [None, Some(&r)] {
        assert_eq!(call(&s, who, "add", json!({"a": 1, "b": 2})).0, 403);
        let (status, v) = read(&s, who, "doc://a");
        assert_eq!(
            (status, v["error"]["code"].as_i64()),
            (403, Some(i64::from(FORBIDDEN))),
            "{v}"
        );
        assert_eq!(
            v["error"]["message"],
            "Forbidden: policy `admins` does not allow this request of resource doc://a"
        );
        assert_eq!(v["error"]["data"], json!({"uri": "doc://a", "policy": "admins"}));
        assert_eq!(read(&s, who, "city://Oslo").0, 403);
        assert_eq!(get(&s, who, "open", json!({})).0, 403);
    }
    assert!(ok(&call(&s, Some(&a), "add", json!({"a": 1, "b": 2}))));
    assert!(ok(&read(&s, Some(&a), "city://Oslo")));
    assert!(ok(&get(&s, Some(&a), "open", json!({}))));
    // A URI no resource has is still not found, not forbidden: nothing is revealed either way.
    assert_eq!(read(&s, Some(&r), "doc://zz").1["error"]["code"], -32002);
}

#[test]
fn policies_read_the_method_the_uri_the_prompt_and_its_arguments() {
    let s = server_with(concat!(
        "  - name: no-paris\n",
        "    expression: \"request.method == 'resources/read' && resource.uri.startsWith('city://') && args.name != 'Paris'\"\n",
        "    resources: [\"city://*\"]\n",
        "  - name: no-lima\n",
        "    expression: \"request.method == 'prompts/get' && prompt.name == 'trip' && args.to != 'Lima'\"\n",
        "    prompts: [trip]\n",
        "  - name: tools-see-their-method\n",
        "    expression: \"request.method == 'tools/call' && tool.name == 'add' && resource.uri == '' && prompt.name == ''\"\n",
        "    tools: [add]\n",
    ));
    let r = reader();
    assert!(ok(&read(&s, Some(&r), "city://Oslo")));
    assert_eq!(read(&s, Some(&r), "city://Paris").0, 403);
    assert!(ok(&read(&s, Some(&r), "doc://a")));
    assert!(ok(&get(&s, Some(&r), "trip", json!({"to": "Rome"}))));
    assert_eq!(get(&s, Some(&r), "trip", json!({"to": "Lima"})).0, 403);
    assert!(ok(&call(&s, Some(&r), "add", json!({"a": 1, "b": 2}))));
}

#[tokio::test]
async fn resource_reads_and_prompt_gets_are_audited_with_outcome_and_caller() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let policies = "  - {name: admins, expression: \"'admin' in caller.groups\", prompts: [trip]}\n";
    let s = server_by(policies, |b| {
        let log = crate::audit::AuditLog::start(
            &crate::audit::Sink::File(path.clone()),
            64,
            crate::audit::OnFull::Drop,
            crate::secrets::Secrets::new(),
            b.metrics().gov.clone(),
        )
        .unwrap();
        b.audit(Some(log))
    });
    let gov = s.metrics.gov.clone();
    let mut who = reader();
    who.subject = "reader-digest".into();
    assert!(ok(&read(&s, Some(&who), "city://Oslo")));
    assert_eq!(get(&s, Some(&who), "trip", json!({"to": "Rome"})).0, 403);
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while gov.audit_records.get() < 2 {
        assert!(std::time::Instant::now() < end, "records not written in 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let records: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let read = records
        .iter()
        .find(|r| r["event"] == "resources/read")
        .expect("the read");
    assert_eq!(read["uri"], "city://Oslo");
    assert_eq!(read["outcome"], "ok");
    assert_eq!(read["caller"]["subject"], "reader-digest");
    let got = records
        .iter()
        .find(|r| r["event"] == "prompts/get")
        .expect("the get");
    assert_eq!(got["prompt"], "trip");
    assert_eq!(got["outcome"], "forbidden");
    assert_eq!(got["caller"]["subject"], "reader-digest");
    assert!(
        got["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("policy `admins`"),
        "{got}"
    );
}
