//! Token budgets through the real server binary in front of a real upstream (another
//! quiver-server over HTTP): the upstream's long answer is cut at the budget with a note
//! saying how long it was, a short one passes whole, and `/metrics` carries the exact tokens
//! (as tiktoken counts them) per tool and per caller, and the cut.

mod real_binary;

use quiver_server::tokens::{Encoding, count};
use real_binary::{Proc, http, http_with, start_http_env, tool_text, wait_for};

/// The texts of the content blocks `tool` answers with.
fn texts(p: &Proc, tool: &str, args: &serde_json::Value) -> Vec<String> {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": tool, "arguments": args}})
    .to_string();
    let resp = http_with(p.mcp, "POST", "/mcp", "", &body).expect("an answer");
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: serde_json::Value = serde_json::from_str(body).expect("a JSON answer");
    v["result"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|b| b["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn an_upstreams_long_answer_is_cut_at_the_budget_and_metered() {
    let inner = start_http_env(
        "tools:\n  - {name: echo, input: {text: string}, handler: {template: '{{text}}'}}\n",
        &[],
        &[],
    );
    let front = start_http_env(
        &format!(
            "upstreams:
  - name: inner
    http: {{url: 'http://127.0.0.1:{port}/mcp'}}
    tools: {{resultGuards: {{tokens: {{maxResultTokens: 120, meter: true}}}}}}
",
            port = inner.mcp
        ),
        &[],
        &[],
    );
    wait_for("the upstream's tool imported", || {
        tool_text(&front, "", "echo", r#"{"text":"hi"}"#) == "hi"
    });
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(60);
    let whole = count(Encoding::O200kBase, &long);
    // The upstream's answer is content blocks: the cut one, then the note.
    let cut = texts(&front, "echo", &serde_json::json!({"text": long}));
    let [kept, note] = &cut[..] else { panic!("{cut:?}") };
    assert!(long.starts_with(kept.as_str()) && !kept.is_empty(), "{cut:?}");
    assert!(
        note.contains(&format!("it has {whole} tokens")) && note.contains("limit of 120"),
        "{note}"
    );
    let sent: u64 = cut.iter().map(|t| count(Encoding::O200kBase, t)).sum();
    assert!(sent <= 120, "{sent}: {cut:?}");
    let metrics = http(front.admin, "GET", "/metrics", "").expect("metrics");
    let value = |prefix: &str| -> Option<u64> {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok())
    };
    // "hi" (1 token) at least once while waiting for the import, then the long answer.
    let tool = value(r#"quiver_result_tokens_total{tool="echo"} "#).expect("the tool's tokens");
    let caller = value(r#"quiver_caller_result_tokens_total{caller="_anonymous"} "#).expect("the caller's");
    assert!(
        tool > whole && tool < whole + 100 && caller == tool,
        "{tool} {caller} {whole}"
    );
    assert_eq!(
        value(r#"quiver_results_over_token_budget_total{tool="echo",action="truncate"} "#),
        Some(1)
    );
}
