//! Token budgets through dispatch (`resultGuards.tokens`): a result over its tool's
//! `maxResultTokens` is cut at a token boundary with a note, within the budget, or withheld
//! (`refuse`, and any tool with an output schema); content blocks past the cut are dropped;
//! metered results count per tool and per caller and in the audit record; a result within
//! its budget is untouched.

use std::sync::Arc;

use serde_json::{Value, json};

use super::guard_tests::{call_as, server_with, texts};
use super::tests::HANDSHAKE_CX as CX;
use super::*;
use crate::spec::access::Principal;
use crate::tokens::{Encoding, count};

const TOOLS: &str = r#"
resultGuards: {tokens: {meter: true}}
tools:
  - {name: echo, input: {text: string}, handler: {template: '{{text}}'}}
  - name: short
    input: {text: string}
    resultGuards: {tokens: {maxResultTokens: 100}}
    handler: {template: '{{text}}'}
  - name: strict
    input: {text: string}
    resultGuards: {tokens: {maxResultTokens: 100, onExceed: refuse}}
    handler: {template: '{{text}}'}
  - name: blocks
    input: {text: string}
    resultGuards: {tokens: {maxResultTokens: 100, encoding: cl100k_base}}
    handler: {content: [{text: 'a {{text}}'}, {text: 'b {{text}}'}, {text: 'c {{text}}'}]}
  - name: typed
    inputSchema: {type: object, properties: {text: {type: string}}}
    outputSchema: {type: object}
    resultGuards: {tokens: {maxResultTokens: 100}}
    handler: {builtin: json}
  - name: loose
    inputSchema: {type: object, properties: {text: {type: string}}}
    resultGuards: {tokens: {maxResultTokens: 100}}
    handler: {builtin: json}
  - name: quiet
    input: {text: string}
    resultGuards: {tokens: {meter: false}}
    handler: {template: '{{text}}'}
"#;

fn server(audit: Option<&std::path::Path>) -> Arc<Server> {
    server_with(TOOLS, audit)
}

async fn call(s: &Arc<Server>, tool: &str, text: &str) -> Value {
    call_as(s, tool, text, CX).await
}

/// Prose of `words` words, about one token each.
fn prose(words: usize) -> String {
    (0..words)
        .map(|i| ["alpha", "beta", "gamma", "delta"][i % 4])
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn a_result_over_its_budget_is_cut_within_it_with_a_note() {
    let s = server(None);
    let long = prose(500);
    let r = call(&s, "short", &long).await;
    assert_eq!(r["isError"], false);
    let text = texts(&r)[0];
    let tokens = count(Encoding::O200kBase, text);
    assert!(tokens <= 100, "{tokens} tokens: {text}");
    let (kept, note) = text.split_once("\n\n").expect("the cut text, then the note");
    assert!(long.starts_with(kept) && kept.len() > 20, "{kept}");
    assert!(
        note.contains(&format!("{} tokens", count(Encoding::O200kBase, &long)))
            && note.contains("limit of 100"),
        "{note}"
    );
    // Within the budget: untouched.
    let short = call(&s, "short", "alpha beta").await;
    assert_eq!(texts(&short), ["alpha beta"]);
    // Text whose bytes exceed the budget but whose tokens do not passes whole.
    let dense = "x".repeat(300);
    assert_eq!(texts(&call(&s, "short", &dense).await), [dense.as_str()]);
}

#[tokio::test]
async fn refuse_and_an_output_schema_withhold_the_result() {
    let s = server(None);
    let long = prose(300);
    for tool in ["strict", "typed"] {
        let r = call(&s, tool, &long).await;
        assert_eq!(r["isError"], true, "{tool}: {r}");
        let message = texts(&r)[0];
        assert!(
            message.contains("withheld") && message.contains("limit of 100"),
            "{message}"
        );
        assert!(!message.contains("alpha"), "{message}");
        assert!(r.get("structuredContent").is_none(), "{r}");
    }
    // Without a schema, structured content is dropped with the cut (it is whole).
    let loose = call(&s, "loose", &long).await;
    assert_eq!(loose["isError"], false);
    assert!(loose.get("structuredContent").is_none(), "{loose}");
    let metrics = s.metrics.encode();
    for line in [
        r#"quiver_results_over_token_budget_total{tool="strict",action="refuse"} 1"#,
        r#"quiver_results_over_token_budget_total{tool="typed",action="refuse"} 1"#,
        r#"quiver_results_over_token_budget_total{tool="loose",action="truncate"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
}

#[tokio::test]
async fn blocks_past_the_cut_are_dropped() {
    let s = server(None);
    let r = call(&s, "blocks", &prose(40)).await;
    let t = texts(&r);
    // The note takes about 40 of the 100 tokens: `a ...` fits (41 tokens), `b ...` is cut,
    // `c ...` is dropped; the note ends the result.
    assert_eq!(t.len(), 3, "{t:?}");
    assert!(
        t[0].starts_with("a ") && t[1].starts_with("b ") && t[2].starts_with("[The server cut"),
        "{t:?}"
    );
    let total: u64 = t.iter().map(|x| count(Encoding::Cl100kBase, x)).sum();
    assert!(total <= 100 && t[1].len() < t[0].len(), "{total} {t:?}");
}

#[tokio::test]
async fn metered_tokens_count_per_tool_and_caller_and_in_the_audit_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let s = server(Some(&path));
    let mut alice = Principal::new(["read"], []);
    alice.identity.sub = "alice".into();
    let cx = Ctx {
        caller: Some(&alice),
        ..CX
    };
    let text = prose(200);
    let n = count(Encoding::O200kBase, &text);
    call_as(&s, "echo", &text, cx).await;
    call_as(&s, "echo", "alpha beta", cx).await;
    call(&s, "echo", "gamma").await;
    call(&s, "quiet", &text).await;
    let metrics = s.metrics.encode();
    let echo = n + 2 + 1;
    for line in [
        format!(r#"quiver_result_tokens_total{{tool="echo"}} {echo}"#),
        format!(r#"quiver_caller_result_tokens_total{{caller="alice"}} {}"#, n + 2),
        r#"quiver_caller_result_tokens_total{caller="_anonymous"} 1"#.to_owned(),
    ] {
        assert!(metrics.contains(&line), "{line} not in\n{metrics}");
    }
    assert!(
        !metrics.contains(r#"result_tokens_total{tool="quiet""#),
        "{metrics}"
    );
    let gov = s.metrics.gov.clone();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while gov.audit_records.get() < 4 {
        assert!(std::time::Instant::now() < end, "records not written in 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let records: Vec<Value> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records[0]["resultTokens"], json!(n), "{}", records[0]);
    let quiet = records
        .iter()
        .find(|r| r["tool"] == "quiet")
        .expect("quiet's record");
    assert!(quiet.get("resultTokens").is_none(), "{quiet}");
}
