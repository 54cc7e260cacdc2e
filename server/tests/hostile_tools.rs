//! Tools turned against their host by their arguments: URLs that would change server or
//! climb their path, secrets in error messages, renderings that multiply a value, and
//! pipelines that would monopolise a worker.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::State;
use common::harness;
use serde_json::json;

/// A local server that answers every request and counts them (so a test can see that a
/// refused call never left the process).
async fn counting_upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .fallback(
            |State(hits): State<Arc<AtomicUsize>>, uri: http::Uri| async move {
                hits.fetch_add(1, Ordering::SeqCst);
                if uri.path().starts_with("/fail") {
                    (http::StatusCode::BAD_GATEWAY, "down".to_owned())
                } else {
                    (http::StatusCode::OK, uri.to_string())
                }
            },
        )
        .with_state(hits.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, hits)
}

#[tokio::test]
async fn http_arguments_shape_the_path_never_the_server_or_a_parent_path() {
    let (addr, hits) = counting_upstream().await;
    let h = harness(&format!(
        r#"
tools:
  - {{name: item, input: {{id: string}}, handler: {{http: {{url: "http://{addr}/api/items/{{{{id}}}}"}}}}}}
  - {{name: rawpath, input: {{p: string}}, handler: {{http: {{url: "http://{addr}/api/{{{{p | raw}}}}"}}}}}}
"#
    ));
    // Ordinary values reach the declared path, percent-encoded.
    let r = h.call("item", json!({"id": "a b/c"})).await;
    assert_eq!(common::text(&r), "/api/items/a%20b%2Fc", "{r}");
    let r = h.call("rawpath", json!({"p": "v1/x?y=1"})).await;
    assert_eq!(common::text(&r), "/api/v1/x?y=1", "{r}");
    assert_eq!(hits.load(Ordering::SeqCst), 2);

    // Values that would climb out of /api/items, encoded or not, or move the authority:
    // refused before any request is sent.
    for (tool, value) in [
        ("item", ".."),
        ("item", "."),
        ("item", "a/../../admin"),
        ("rawpath", "../admin"),
        ("rawpath", "x/%2e%2e/admin"),
        ("rawpath", "x\\..\\admin"),
    ] {
        let arg = if tool == "item" { "id" } else { "p" };
        let r = h.call(tool, json!({ arg: value })).await;
        assert_eq!(r["isError"], true, "{tool}({value}) -> {r}");
        common::assert_text_contains(&r, "`.` or `..` URL path segment");
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "no refused call reached the upstream"
    );
}

#[tokio::test]
async fn http_errors_do_not_show_query_strings_or_userinfo() {
    let (addr, _) = counting_upstream().await;
    let h = harness(&format!(
        r#"
tools:
  - {{name: fail, input: {{key: string}}, handler: {{http: {{url: "http://{addr}/fail?api_key={{{{key}}}}"}}}}}}
  - {{name: creds, handler: {{http: {{url: "http://user:hunter2@127.0.0.1:1/x?token=s3cr3t", timeout: 2s}}}}}}
  - {{name: slow, input: {{key: string}}, handler: {{http: {{url: "http://10.255.255.1/x?k={{{{key}}}}", timeout: 100ms}}}}}}
"#
    ));
    let r = h.call("fail", json!({"key": "sk-LIVE-123"})).await;
    assert_eq!(r["isError"], true);
    common::assert_text_contains(
        &r,
        &format!("GET http://{addr}/fail?… answered 502 Bad Gateway: down"),
    );
    assert!(!common::text(&r).contains("sk-LIVE-123"), "{r}");
    let r = h.call("creds", json!({})).await;
    assert_eq!(r["isError"], true);
    common::assert_text_contains(&r, "request to http://127.0.0.1:1/x?… failed");
    assert!(
        !common::text(&r).contains("hunter2") && !common::text(&r).contains("s3cr3t"),
        "{r}"
    );
    let r = h.call("slow", json!({"key": "sk-LIVE-456"})).await;
    assert_eq!(r["isError"], true);
    assert!(!common::text(&r).contains("sk-LIVE-456"), "{r}");
}

#[tokio::test]
async fn a_template_that_repeats_a_value_is_refused_not_rendered() {
    let refs = "{{x}}".repeat(10);
    let h = harness(&format!(
        "tools:\n  - {{name: t, input: {{x: string}}, handler: {{template: \"{refs}\"}}}}\n  - {{name: body, input: {{x: string}}, handler: {{http: {{method: POST, url: \"http://127.0.0.1:1/\", body: [{}]}}}}}}\n",
        ["\"{{x}}\""; 10].join(", ")
    ));
    let x = "y".repeat(2 << 20);
    for tool in ["t", "body"] {
        let r = h.call(tool, json!({ "x": x })).await;
        assert_eq!(r["isError"], true, "{tool}");
        common::assert_text_contains(&r, "would exceed 16 MiB");
    }
    // The same template with a small value renders.
    assert_eq!(
        common::text(&h.call("t", json!({"x": "ab"})).await),
        "ab".repeat(10)
    );
}

#[tokio::test]
async fn pipelines_run_to_the_nesting_limit_and_share_the_worker() {
    // 16 nested pipelines: the deepest the compiler accepts, and it runs.
    let mut yaml = String::from("tools:\n  - {name: leaf, handler: {template: bottom}}\n");
    for i in 0..16 {
        let next = if i == 15 {
            "leaf".to_owned()
        } else {
            format!("p{}", i + 1)
        };
        yaml.push_str(&format!(
            "  - {{name: p{i}, handler: {{pipeline: [{{tool: {next}}}]}}}}\n"
        ));
    }
    // 99 steps that each run a 100-step pipeline: 9,999 steps, just under the limit.
    let hundred = vec!["{tool: now}"; 100].join(", ");
    let ninety_nine = vec!["{tool: wide}"; 99].join(", ");
    yaml.push_str(&format!(
        "  - {{name: now, handler: {{builtin: now}}}}\n  - {{name: wide, handler: {{pipeline: [{hundred}]}}}}\n  - {{name: huge, handler: {{pipeline: [{ninety_nine}]}}}}\n"
    ));
    let h = harness(&yaml);
    assert_eq!(common::text(&h.call("p0", json!({})).await), "bottom");

    // On this single-threaded runtime a pipeline that never yielded would run all its
    // steps before any other task; it yields between steps, so a call made after it
    // starts finishes while it is still running.
    let router = h.router.clone();
    let long = tokio::spawn(async move {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "huge", "arguments": {}}}).to_string();
        tower::ServiceExt::oneshot(router, common::post(&body))
            .await
            .unwrap()
            .status()
    });
    while h.server.metrics.inflight.get() == 0 && !long.is_finished() {
        tokio::task::yield_now().await;
    }
    let quick = h.call("leaf", json!({})).await;
    assert_eq!(common::text(&quick), "bottom");
    assert!(
        !long.is_finished(),
        "the short call waited for the whole pipeline"
    );
    // Dropping the call (a client disconnect) stops it and releases its place.
    long.abort();
    assert!(long.await.unwrap_err().is_cancelled());
    assert_eq!(h.server.metrics.inflight.get(), 0);
}

#[tokio::test]
async fn sleep_takes_integral_floats_at_their_value() {
    let h = harness("tools:\n  - {name: sleep, handler: {builtin: sleep}}\n");
    let start = std::time::Instant::now();
    let r = h.call("sleep", json!({"ms": 2e2})).await;
    assert_eq!(common::text(&r), "slept 200 ms");
    assert!(start.elapsed() >= std::time::Duration::from_millis(200));
}

/// Processes whose command line holds `marker` and that are still running (not zombies).
fn running(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if !zombie && cmdline.split(|&b| b == 0).any(|arg| arg == marker.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

/// Waits (bounded) until no process with `marker` runs.
async fn until_gone(marker: &str) -> Vec<u32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let left = running(marker);
        if left.is_empty() || std::time::Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn exec_values_cannot_become_options() {
    let h = harness(
        r#"
tools:
  - {name: wc, input: {path: string}, handler: {exec: {command: [/usr/bin/wc, -c, "{{path}}"]}}}
  - {name: safe, input: {path: string}, handler: {exec: {command: [/usr/bin/wc, -c, --, "{{path}}"]}}}
  - {name: echo, input: {word: string}, handler: {exec: {command: [/bin/echo, "x{{word}}", "{{word}}"], allowOptionArguments: true}}}
  - {name: named, input: {n: string}, handler: {exec: {command: [/bin/echo, "--name={{n}}"]}}}
"#,
    );
    // The documented attack: the value would be read as an option and leak the file.
    for value in ["--files0-from=/etc/passwd", "-", "-c"] {
        let r = h.call("wc", json!({ "path": value })).await;
        assert_eq!(r["isError"], true, "{value}: {r}");
        common::assert_text_contains(&r, "argument 2 would start with `-`");
        assert!(
            !common::text(&r).contains("passwd"),
            "the value is not echoed: {r}"
        );
    }
    // After a literal `--` the same value is an operand: wc reports a missing file.
    let r = h.call("safe", json!({"path": "--files0-from=/etc/passwd"})).await;
    assert_eq!(r["isError"], true);
    common::assert_text_contains(&r, "'--files0-from=/etc/passwd': No such file");
    // An explicit opt-in, and templates that start with literal text, pass values through.
    let r = h.call("echo", json!({"word": "-n"})).await;
    assert_eq!(common::text(&r), "x-n -n\n", "{r}");
    let r = h.call("named", json!({"n": "-x"})).await;
    assert_eq!(common::text(&r), "--name=-x\n", "{r}");
    // NUL bytes cannot be passed in an argument.
    let r = h.call("named", json!({"n": "a\u{0}b"})).await;
    common::assert_text_contains(&r, "contains a NUL byte");
}

#[tokio::test]
async fn exec_runs_leave_no_process_behind() {
    let h = harness(
        r#"
tools:
  - {name: bg, handler: {exec: {command: [/bin/sh, -c, "/bin/sleep 318.25 & echo started"], timeout: 20s}}}
  - {name: slow, handler: {exec: {command: [/bin/sh, -c, "/bin/sleep 319.25 & /bin/sleep 319.5"], timeout: 300ms}}}
  - {name: long, handler: {exec: {command: [/bin/sh, -c, "/bin/sleep 320.25 & /bin/sleep 320.5"], timeout: 60s}}}
"#,
    );
    // The program exits at once but leaves a child holding its stdout: the run ends when the
    // program does (not at the timeout), and the child is killed with its group.
    let r = h.call("bg", json!({})).await;
    assert_eq!(common::text(&r), "started\n", "{r}");
    assert_eq!(until_gone("318.25").await, Vec::<u32>::new());

    // A timeout kills the whole group, not only the direct child.
    let r = h.call("slow", json!({})).await;
    common::assert_text_contains(&r, "timed out after 300ms and was killed");
    assert_eq!(until_gone("319.25").await, Vec::<u32>::new());
    assert_eq!(until_gone("319.5").await, Vec::<u32>::new());

    // A dropped call (client gone) kills the group too.
    let router = h.router.clone();
    let call = tokio::spawn(async move {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "long", "arguments": {}}}).to_string();
        tower::ServiceExt::oneshot(router, common::post(&body))
            .await
            .unwrap()
            .status()
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while running("320.25").is_empty() || running("320.5").is_empty() {
        assert!(std::time::Instant::now() < deadline, "the run never started");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert_eq!(until_gone("320.25").await, Vec::<u32>::new());
    assert_eq!(until_gone("320.5").await, Vec::<u32>::new());
}
