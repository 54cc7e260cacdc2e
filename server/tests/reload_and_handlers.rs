//! Hot reload (snapshot swap, invalid configs, file watching) and the handlers that talk to
//! the outside world (http against a real local server, exec, cancellation).

mod common;

use std::time::Duration;

use axum::routing::{get, post};
use common::harness;
use quiver_server::reload::{Reloaded, read_path, watch_path};
use serde_json::{Value, json};

const BASE: &str =
    "tools:\n  - {name: a, handler: {template: first}}\n  - {name: sleep, handler: {builtin: sleep}}\n";

#[tokio::test]
async fn reload_swaps_generation_and_notifies_streams() {
    let h = harness(BASE);
    let mut events = h.server.subscribe();
    assert_eq!(h.server.registry.load().generation, 1);
    let next =
        "tools:\n  - {name: a, handler: {template: second}}\n  - {name: b, handler: {template: new}}\n";
    assert_eq!(
        h.reloader.apply(&[("t".into(), next.into())]).unwrap(),
        Reloaded::Swapped(2)
    );
    assert_eq!(h.call("a", json!({})).await["content"][0]["text"], "second");
    assert_eq!(h.call("b", json!({})).await["content"][0]["text"], "new");
    let msg = events.recv().await.unwrap();
    assert_eq!(
        &*msg.message,
        r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#
    );
    // Same content, different formatting: no new generation, no notification.
    let reformatted =
        "tools:\n- name: a\n  handler: {template: second}\n- {name: b, handler: {template: new}}\n";
    assert_eq!(
        h.reloader.apply(&[("t".into(), reformatted.into())]).unwrap(),
        Reloaded::Unchanged
    );
    assert!(events.try_recv().is_err());
}

#[tokio::test]
async fn an_invalid_config_never_replaces_a_working_one() {
    let h = harness(BASE);
    let bad = "tools:\n  - {name: a, handler: {builtin: nope}}\n  - {name: a, handler: {template: x}}\n";
    let err = h.reloader.apply(&[("t".into(), bad.into())]).unwrap_err();
    assert_eq!(err.problems.len(), 2, "{err}");
    assert_eq!(h.server.registry.load().generation, 1);
    assert_eq!(h.call("a", json!({})).await["content"][0]["text"], "first");
    let status = h.server.registry.last_reload();
    assert_eq!(status.result, "invalid");
    assert!(
        status.problems[0].starts_with("tools[0].handler.builtin"),
        "{:?}",
        status.problems
    );
    assert!(
        h.server
            .metrics
            .encode()
            .contains(r#"quiver_config_reloads_total{result="invalid"} 1"#)
    );
}

#[tokio::test]
async fn in_flight_calls_finish_on_their_snapshot_across_a_reload() {
    let h = harness(BASE);
    let call = {
        let router = h.router.clone();
        tokio::spawn(async move {
            let body = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "sleep", "arguments": {"ms": 300}}}).to_string();
            let resp = tower::ServiceExt::oneshot(router, common::post(&body))
                .await
                .unwrap();
            let bytes = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .unwrap()
                .to_bytes();
            serde_json::from_slice::<Value>(&bytes).unwrap()
        })
    };
    // Wait until the call is running, then remove the tool it uses.
    let metrics = h.server.metrics.clone();
    for _ in 0..200 {
        if metrics.inflight.get() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(metrics.inflight.get(), 1, "the call is in flight");
    h.reloader
        .apply(&[(
            "t".into(),
            "tools: [{name: other, handler: {template: x}}]".into(),
        )])
        .unwrap();
    let done = call.await.unwrap();
    assert_eq!(done["result"]["content"][0]["text"], "slept 300 ms", "{done}");
    assert_eq!(
        h.rpc("tools/call", json!({"name": "sleep", "arguments": {"ms": 1}}))
            .await["error"]["code"],
        -32602
    );
}

#[tokio::test]
async fn cancelled_notification_stops_a_running_call() {
    let h = harness(BASE);
    let router = h.router.clone();
    let call = tokio::spawn(async move {
        let body = json!({"jsonrpc": "2.0", "id": "c1", "method": "tools/call", "params": {"name": "sleep", "arguments": {"ms": 30000}}}).to_string();
        let mut req = common::post(&body);
        req.headers_mut()
            .insert("mcp-session-id", common::sid("s1").parse().unwrap());
        let resp = tower::ServiceExt::oneshot(router, req).await.unwrap();
        let ct = resp.headers()[http::header::CONTENT_TYPE].clone();
        let bytes = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        (ct, bytes)
    });
    for _ in 0..200 {
        if h.server.metrics.inflight.get() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut cancel = common::post(
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"c1","reason":"user"}}"#,
    );
    cancel
        .headers_mut()
        .insert("mcp-session-id", common::sid("s1").parse().unwrap());
    assert_eq!(h.send(cancel).await.0, 202);
    let out = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("cancelled call returns")
        .unwrap();
    // No response for a cancelled request: the stream ends empty.
    assert_eq!(out.0, "text/event-stream");
    assert!(out.1.is_empty(), "{:?}", out.1);
    assert_eq!(h.server.cancellable_calls(), 0);
}

#[tokio::test]
async fn file_source_reloads_on_edit_and_on_kubelet_symlink_swap() {
    let dir = tempfile::tempdir().unwrap();
    // kubelet layout: ..2024_x/tools.yaml, ..data -> ..2024_x, tools.yaml -> ..data/tools.yaml
    let v1 = dir.path().join("..v1");
    std::fs::create_dir(&v1).unwrap();
    std::fs::write(v1.join("tools.yaml"), BASE).unwrap();
    std::os::unix::fs::symlink("..v1", dir.path().join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/tools.yaml", dir.path().join("tools.yaml")).unwrap();
    let h = harness(BASE);
    assert_eq!(
        read_path(dir.path()).unwrap().len(),
        1,
        "hidden ..data entries are not read twice"
    );
    let mut events = h.server.subscribe();
    tokio::spawn(watch_path(dir.path().to_path_buf(), h.reloader.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await; // let the watch start
    // Atomic swap, exactly as the kubelet does it.
    let v2 = dir.path().join("..v2");
    std::fs::create_dir(&v2).unwrap();
    std::fs::write(
        v2.join("tools.yaml"),
        "tools: [{name: swapped, handler: {template: yes}}]",
    )
    .unwrap();
    std::os::unix::fs::symlink("..v2", dir.path().join("..data_tmp")).unwrap();
    std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .expect("list_changed after the swap")
        .unwrap();
    assert!(msg.message.contains("tools/list_changed"));
    assert_eq!(h.call("swapped", json!({})).await["content"][0]["text"], "yes");
}

/// An in-place edit (truncate, write, close) is read once closed: the truncated, empty file
/// in between is a valid empty ToolSet and must never be served, however slow the writer.
#[tokio::test]
async fn a_slow_in_place_write_is_read_only_once_the_file_is_closed() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.yaml");
    std::fs::write(&path, BASE).unwrap();
    let h = harness(BASE);
    let mut events = h.server.subscribe();
    tokio::spawn(watch_path(path.clone(), h.reloader.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await; // let the watch start
    let writer = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || {
            let mut f = std::fs::File::create(&path).unwrap(); // truncates
            std::thread::sleep(Duration::from_millis(300)); // far beyond the 15 ms coalescing
            f.write_all(b"tools: [{name: edited, ").unwrap();
            f.flush().unwrap();
            std::thread::sleep(Duration::from_millis(300));
            f.write_all(b"handler: {template: done}}]\n").unwrap();
        })
    };
    let msg = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .expect("list_changed after the edit")
        .unwrap();
    assert!(msg.message.contains("tools/list_changed"));
    writer.await.unwrap();
    assert_eq!(
        h.call("edited", json!({})).await["content"][0]["text"],
        "done",
        "the first reload after the edit served the finished file"
    );
}

/// A file created and then written slowly (`rm tools.yaml; slow > tools.yaml`) is read once
/// its writer closes it, not empty at creation (an empty file is a valid, empty ToolSet).
#[tokio::test]
async fn a_slowly_written_new_file_is_read_only_once_closed() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.yaml");
    std::fs::write(&path, BASE).unwrap();
    let h = harness(BASE);
    let mut events = h.server.subscribe();
    tokio::spawn(watch_path(path.clone(), h.reloader.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await; // let the watch start
    let writer = tokio::task::spawn_blocking(move || {
        std::fs::remove_file(&path).unwrap();
        let mut f = std::fs::File::create(&path).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        f.write_all(b"tools: [{name: added, handler: {template: whole}}]\n")
            .unwrap();
    });
    let msg = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .expect("list_changed after the new file")
        .unwrap();
    assert!(msg.message.contains("tools/list_changed"));
    writer.await.unwrap();
    assert_eq!(h.call("added", json!({})).await["content"][0]["text"], "whole");
}

async fn spawn_upstream() -> std::net::SocketAddr {
    let app = axum::Router::new()
        .route(
            "/weather",
            get(|q: axum::extract::RawQuery| async move { axum::Json(json!({"query": q.0, "tempC": 21})) }),
        )
        .route(
            "/echo",
            post(|headers: http::HeaderMap, body: String| async move {
                let auth = headers
                    .get("x-token")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                format!("{auth}|{body}")
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        )
        .route(
            "/fail",
            get(|| async { (http::StatusCode::BAD_GATEWAY, "upstream down") }),
        )
        .route("/big", get(|| async { "x".repeat(5000) }))
        .route(
            "/png",
            get(|| async {
                (
                    [(http::header::CONTENT_TYPE, "Image/PNG; q=1")],
                    vec![0x89u8, b'P', b'N', b'G', 0, 255],
                )
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test]
async fn http_handler_against_a_real_server() {
    let addr = spawn_upstream().await;
    let yaml = format!(
        r#"
tools:
  - {{name: weather, input: {{city: string}}, handler: {{http: {{url: "http://{addr}/weather?city={{{{city}}}}"}}}}}}
  - name: post
    input: {{n: integer, token: string}}
    handler: {{http: {{method: POST, url: "http://{addr}/echo", headers: {{x-token: "t-{{{{token}}}}"}}, body: {{n: "{{{{n}}}}", s: "n={{{{n}}}}"}}}}}}
  - {{name: slow, handler: {{http: {{url: "http://{addr}/slow", timeout: 200ms}}}}}}
  - {{name: fail, handler: {{http: {{url: "http://{addr}/fail"}}}}}}
  - {{name: big, handler: {{http: {{url: "http://{addr}/big", maxResponseBytes: 1000}}}}}}
  - {{name: refused, handler: {{http: {{url: "http://127.0.0.1:1/x"}}}}}}
  - {{name: png, handler: {{http: {{url: "http://{addr}/png"}}}}}}
"#
    );
    let h = harness(&yaml);
    let r = h.call("weather", json!({"city": "São Paulo"})).await;
    assert_eq!(
        r["structuredContent"],
        json!({"query": "city=S%C3%A3o%20Paulo", "tempC": 21}),
        "{r}"
    );
    let r = h.call("post", json!({"n": 7, "token": "abc"})).await;
    assert_eq!(r["content"][0]["text"], r#"t-abc|{"n":7,"s":"n=7"}"#);
    let r = h.call("slow", json!({})).await;
    assert_eq!(r["isError"], true);
    common::assert_text_contains(&r, "timed out after 200ms");
    let r = h.call("fail", json!({})).await;
    common::assert_text_contains(&r, "502 Bad Gateway: upstream down");
    let r = h.call("big", json!({})).await;
    assert_eq!(r["isError"], true, "{r}");
    let r = h.call("refused", json!({})).await;
    assert_eq!(r["isError"], true);
    common::assert_text_contains(&r, "request to http://127.0.0.1:1/x failed");
    // Binary media answers arrive as an image block, bytes intact.
    let r = h.call("png", json!({})).await;
    assert_eq!(
        r["content"],
        json!([{"type": "image", "data": "iVBORwD/", "mimeType": "image/png"}]),
        "{r}"
    );
}

#[tokio::test]
async fn exec_handler_runs_argv_without_a_shell() {
    let h = harness(
        r#"
tools:
  - {name: echo, input: {text: string}, handler: {exec: {command: [/bin/echo, "{{text}}"]}}}
  - {name: env, handler: {exec: {command: [/usr/bin/env], env: {ONLY: me}}}}
  - {name: cat, input: {text: string}, handler: {exec: {command: [/bin/cat], stdin: "{{text}}"}}}
  - {name: slow, handler: {exec: {command: [/bin/sleep, "10"], timeout: 200ms}}}
  - {name: yes, handler: {exec: {command: [/usr/bin/yes], maxOutputBytes: 1000}}}
  - {name: fail, handler: {exec: {command: [/bin/ls, /definitely/missing]}}}
"#,
    );
    // Shell metacharacters stay one literal argument.
    let r = h.call("echo", json!({"text": "a; rm -rf / $(id) | x"})).await;
    assert_eq!(r["content"][0]["text"], "a; rm -rf / $(id) | x\n");
    let env = h.call("env", json!({})).await["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut keys: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["HOME", "ONLY", "PATH", "TMPDIR"],
        "nothing else is inherited"
    );
    // HOME and TMPDIR are the run's own directory, not the server's.
    let var = |k: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(str::to_owned)
    };
    assert_eq!(var("HOME"), var("TMPDIR"));
    assert_ne!(var("HOME"), std::env::var("HOME").ok());
    assert_eq!(
        h.call("cat", json!({"text": "from stdin"})).await["content"][0]["text"],
        "from stdin"
    );
    let r = h.call("slow", json!({})).await;
    common::assert_text_contains(&r, "timed out after 200ms and was killed");
    let r = h.call("yes", json!({})).await;
    common::assert_text_contains(&r, "more than 1000 bytes");
    let r = h.call("fail", json!({})).await;
    assert_eq!(r["isError"], true);
    common::assert_text_contains(&r, "exited with status 2");
}

#[tokio::test]
async fn pipelines_chain_steps_and_stop_at_the_first_error() {
    let h = harness(
        r#"
tools:
  - {name: add, handler: {builtin: add}}
  - {name: greet, input: {name: string}, handler: {template: "Hello {{name}}!"}}
  - {name: shout, handler: {builtin: upper}}
  - name: add-greet-shout
    input: {a: number, b: number}
    handler: {pipeline: [{tool: add}, {tool: greet, input: {name: "{{steps.0.text}}"}}, {tool: shout, input: {text: "{{steps.1.text}}"}}]}
  - name: broken
    input: {a: number, b: number}
    handler: {pipeline: [{tool: add}, {tool: greet, input: {name: "{{steps.0.structured}}"}}]}
"#,
    );
    assert_eq!(
        h.call("add-greet-shout", json!({"a": 20, "b": 22})).await["content"][0]["text"],
        "HELLO 42!"
    );
    let r = h.call("broken", json!({"a": 1, "b": 2})).await;
    assert_eq!(r["isError"], true);
    assert!(
        common::text(&r).starts_with("step 1 (greet): invalid arguments"),
        "{r}"
    );
}
