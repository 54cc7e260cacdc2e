//! Result guards through dispatch: the nearest `resultGuards` applies (a tool's own, else
//! the ToolSet's), `redact` replaces what it finds, `refuse` withholds the result with an
//! error naming only the kinds, `flag` passes it on; each is counted by tool, kind and
//! action and noted in the call's audit record; a pipeline's step passes its result to the
//! next through its own tool's guard; a tool without a guard is untouched.

use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::reload::Reloader;

/// A key ID in AWS's format (not AWS's documented example, which guards let through).
const KEY_ID: &str = "AKIAZ2QXLMN7ORP4VWTY";

const TOOLS: &str = r#"
resultGuards: {secrets: redact}
tools:
  - {name: say, input: {text: string}, handler: {template: '{{text}}'}}
  - name: contact
    input: {text: string}
    resultGuards: {personalData: refuse}
    handler: {template: '{{text}}'}
  - name: blocks
    input: {text: string}
    resultGuards: {secrets: flag, personalData: flag}
    handler: {content: [{text: 'a {{text}}'}, {text: 'b {{text}}'}]}
  - name: exempt
    input: {text: string}
    resultGuards: {secrets: off}
    handler: {template: '{{text}}'}
  - name: chain
    input: {text: string}
    resultGuards: {secrets: off}
    handler:
      pipeline:
        - {tool: say}
        - {tool: exempt, input: {text: "step said: {{steps.0.text}}"}}
"#;

fn server(audit: Option<&std::path::Path>) -> Arc<Server> {
    server_with(TOOLS, audit)
}

/// A server of `tools`, writing its audit trail to `audit`.
pub(super) fn server_with(tools: &str, audit: Option<&std::path::Path>) -> Arc<Server> {
    let metrics = Metrics::new("test", "system");
    let mut b = Server::builder(Registry::new(&metrics), metrics);
    if let Some(path) = audit {
        let log = crate::audit::AuditLog::start(
            &crate::audit::Sink::File(path.to_owned()),
            64,
            crate::audit::OnFull::Drop,
            crate::secrets::Secrets::new(),
            b.metrics().gov.clone(),
        )
        .unwrap();
        b = b.audit(Some(log));
    }
    let server = b.build();
    Reloader::new(server.clone())
        .apply(&[("t.yaml".into(), tools.to_owned())])
        .unwrap_or_else(|e| panic!("{e}"));
    server
}

use super::tests::HANDSHAKE_CX as CX;

/// The `result` of calling `tool` with `text`.
async fn call(s: &Arc<Server>, tool: &str, text: &str) -> Value {
    call_as(s, tool, text, CX).await
}

/// The `result` of calling `tool` with `text` as the caller of `cx`.
pub(super) async fn call_as(s: &Arc<Server>, tool: &str, text: &str, cx: Ctx<'_>) -> Value {
    call_with(s, tool, json!({"text": text}), cx).await
}

/// The `result` of calling `tool` with `args` as the caller of `cx`.
pub(super) async fn call_with(s: &Arc<Server>, tool: &str, args: Value, cx: Ctx<'_>) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": tool, "arguments": args}})
    .to_string();
    match s.handle(body.as_bytes(), cx, false).await {
        Outcome::Reply(r) => {
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            v.get("result").cloned().unwrap_or_else(|| panic!("{v}"))
        }
        other => panic!("{other:?}"),
    }
}

pub(super) fn texts(result: &Value) -> Vec<&str> {
    result["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["text"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn the_nearest_guard_redacts_refuses_or_flags() {
    let s = server(None);
    let said = call(&s, "say", &format!("key {KEY_ID} for jane@acme.io")).await;
    assert_eq!(
        texts(&said),
        ["key [redacted:aws_access_key_id] for jane@acme.io"]
    );
    assert_eq!(said["isError"], false);

    // The tool's own guard sets personal data to refuse and keeps the ToolSet's secrets.
    let refused = call(&s, "contact", &format!("{KEY_ID} jane@acme.io")).await;
    assert_eq!(refused["isError"], true);
    let message = texts(&refused)[0];
    assert!(
        message.contains("withheld") && message.contains("email"),
        "{message}"
    );
    assert!(message.contains("aws_access_key_id"), "{message}");
    assert!(
        !message.contains("jane") && !message.contains(KEY_ID),
        "{message}"
    );
    let inherited = call(&s, "contact", KEY_ID).await;
    assert_eq!(texts(&inherited), ["[redacted:aws_access_key_id]"]);

    let flagged = call(&s, "blocks", "jane@acme.io").await;
    assert_eq!(texts(&flagged), ["a jane@acme.io", "b jane@acme.io"]);

    let exempt = call(&s, "exempt", KEY_ID).await;
    assert_eq!(texts(&exempt), [KEY_ID]);

    let metrics = s.metrics.encode();
    for line in [
        r#"quiver_result_guard_findings_total{tool="say",kind="aws_access_key_id",action="redact"} 1"#,
        r#"quiver_result_guard_findings_total{tool="contact",kind="email",action="refuse"} 1"#,
        r#"quiver_result_guard_findings_total{tool="blocks",kind="email",action="flag"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    assert!(
        !metrics.contains(r#"result_guard_findings_total{tool="exempt""#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_step_passes_its_result_on_through_its_tools_guard() {
    let s = server(None);
    let chained = call(&s, "chain", &format!("id {KEY_ID}")).await;
    assert_eq!(texts(&chained), ["step said: id [redacted:aws_access_key_id]"]);
}

#[tokio::test]
async fn the_audit_record_names_what_was_found_never_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let s = server(Some(&path));
    call(&s, "say", &format!("{KEY_ID} and {KEY_ID}")).await;
    call(&s, "exempt", KEY_ID).await;
    let gov = s.metrics.gov.clone();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while gov.audit_records.get() < 2 {
        assert!(std::time::Instant::now() < end, "records not written in 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains(KEY_ID), "{text}");
    let records: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let said = records.iter().find(|r| r["tool"] == "say").expect("say's record");
    assert_eq!(
        said["guard"],
        json!({"action": "redact", "findings": 2, "kinds": ["aws_access_key_id"]})
    );
    let exempt = records
        .iter()
        .find(|r| r["tool"] == "exempt")
        .expect("exempt's record");
    assert!(exempt.get("guard").is_none(), "{exempt}");
}
