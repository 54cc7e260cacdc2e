//! Composite pipelines through dispatch: independent steps at the same time, `forEach`
//! with `maxParallel`, `when`, `retry` and `result` steps, against a loopback API that
//! counts the requests in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

use super::Server;
use super::guard_tests::server_with;
use super::tests::HANDSHAKE_CX as CX;

/// What the API saw.
#[derive(Default)]
struct Seen {
    started: AtomicUsize,
    in_flight: AtomicUsize,
    most: AtomicUsize,
    failures_left: AtomicUsize,
    release: Notify,
}

/// A loopback API. `/hold/N?of=T` answers `{"n": N}` once `hold` requests are in flight
/// together or all `T` requests of the test started (whichever comes first), so requests
/// the caller sends together are answered together and one sent alone waits for a bound
/// that the test states; `/flaky` answers 503 while `failures_left` lasts, then 200.
async fn api(hold: usize, seen: Arc<Seen>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let Some(head) = crate::net::read_head(&mut conn).await else {
                    return;
                };
                let path = head.split(' ').nth(1).unwrap_or("").to_owned();
                let (status, body) = if let Some(rest) = path.strip_prefix("/hold/") {
                    let (n, of) = rest.split_once("?of=").unwrap();
                    let of: usize = of.parse().unwrap();
                    let started = seen.started.fetch_add(1, Ordering::SeqCst) + 1;
                    let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    seen.most.fetch_max(now, Ordering::SeqCst);
                    // Waits for the others of its batch (or the end of the test's requests),
                    // bounded: a pipeline that sends them one by one still finishes.
                    let wait = seen.release.notified();
                    if now >= hold || started >= of {
                        seen.release.notify_waiters();
                    } else {
                        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), wait).await;
                    }
                    seen.in_flight.fetch_sub(1, Ordering::SeqCst);
                    (200, json!({"n": n.parse::<u64>().unwrap()}))
                } else if seen
                    .failures_left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    (503, json!({"error": "busy"}))
                } else {
                    (200, json!({"ok": true}))
                };
                let body = body.to_string();
                let answer = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

async fn call(s: &Arc<Server>, tool: &str, args: Value) -> Value {
    super::guard_tests::call_with(s, tool, args, CX).await
}

fn tools(port: u16, pipelines: &str) -> String {
    format!(
        r#"
tools:
  - name: hold
    input: {{n: integer, of: integer}}
    outputSchema: {{type: object, properties: {{n: {{type: integer}}}}}}
    handler: {{http: {{url: "http://127.0.0.1:{port}/hold/{{{{n}}}}?of={{{{of}}}}", timeout: 10s}}}}
  - name: flaky
    handler: {{http: {{url: "http://127.0.0.1:{port}/flaky", timeout: 10s}}}}
{pipelines}"#
    )
}

#[tokio::test]
async fn independent_steps_run_together_and_a_result_step_joins_them() {
    let seen = Arc::new(Seen::default());
    let port = api(2, Arc::clone(&seen)).await;
    let s = server_with(
        &tools(
            port,
            r#"  - name: both
    handler:
      pipeline:
        - {id: a, tool: hold, input: {n: 1, of: 2}}
        - {id: b, tool: hold, input: {n: 2, of: 2}}
        - {id: sum, needs: [a, b], result: {a: "{{steps.a.structured.n}}", b: "{{steps.b.structured.n}}"}}
"#,
        ),
        None,
    );
    let r = call(&s, "both", json!({})).await;
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(r["structuredContent"], json!({"a": 1, "b": 2}));
    assert_eq!(
        seen.most.load(Ordering::SeqCst),
        2,
        "a and b were in flight together"
    );
}

#[tokio::test]
async fn for_each_keeps_max_parallel_runs_in_flight_and_the_results_in_order() {
    let seen = Arc::new(Seen::default());
    let port = api(8, Arc::clone(&seen)).await;
    let s = server_with(
        &tools(
            port,
            r#"  - name: fan
    input: {ids: {type: array, items: {type: integer}}}
    handler:
      pipeline:
        - tool: hold
          forEach: {items: "{{ids}}", maxParallel: 8}
          input: {n: "{{item}}", of: 20}
  - name: fan_open
    handler:
      pipeline:
        - {tool: hold, forEach: {items: "{{ids}}"}, input: {n: "{{item}}", of: 1}}
"#,
        ),
        None,
    );
    let ids: Vec<u64> = (100..120).collect();
    let r = call(&s, "fan", json!({"ids": ids})).await;
    assert_eq!(r["isError"], false, "{r}");
    let got: Vec<u64> = r["structuredContent"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["n"].as_u64().unwrap())
        .collect();
    assert_eq!(got, ids, "one result per element, in the array's order");
    assert_eq!(seen.started.load(Ordering::SeqCst), 20);
    assert_eq!(
        seen.most.load(Ordering::SeqCst),
        8,
        "never more than maxParallel, and that many"
    );
    // More elements than maxItems (default 100) fail the step before any request.
    let r = call(&s, "fan", json!({"ids": (0..101).collect::<Vec<u64>>()})).await;
    assert_eq!(r["isError"], true);
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("101 elements; at most 100"),
        "{r}"
    );
    assert_eq!(seen.started.load(Ordering::SeqCst), 20);
    let r = call(&s, "fan_open", json!({"ids": 7})).await;
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("an array is needed, not a number"),
        "{r}"
    );
}

#[tokio::test]
async fn when_skips_and_retry_tries_again() {
    let seen = Arc::new(Seen::default());
    let port = api(1, Arc::clone(&seen)).await;
    let s = server_with(
        &tools(
            port,
            r#"  - name: maybe
    input: {go: boolean}
    handler:
      pipeline:
        - {id: first, tool: hold, input: {n: 5, of: 1}, when: "args.go"}
        - {id: after, needs: [first], result: {skipped: "{{steps.first.skipped}}", n: "{{steps.first.structured.n}}"}}
  - name: patient
    handler:
      pipeline:
        - {tool: flaky, retry: {attempts: 3, backoff: 1ms}}
  - name: impatient
    handler:
      pipeline:
        - {tool: flaky, retry: {attempts: 2, backoff: 1ms}}
"#,
        ),
        None,
    );
    let r = call(&s, "maybe", json!({"go": false})).await;
    assert_eq!(r["structuredContent"], json!({"skipped": true, "n": null}), "{r}");
    assert_eq!(
        seen.started.load(Ordering::SeqCst),
        0,
        "a skipped step sends nothing"
    );
    let r = call(&s, "maybe", json!({"go": true})).await;
    assert_eq!(r["structuredContent"], json!({"skipped": false, "n": 5}), "{r}");

    seen.failures_left.store(2, Ordering::SeqCst);
    let r = call(&s, "patient", json!({})).await;
    assert_eq!(r["isError"], false, "the third attempt answers: {r}");
    seen.failures_left.store(2, Ordering::SeqCst);
    let r = call(&s, "impatient", json!({})).await;
    assert_eq!(r["isError"], true, "{r}");
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("step 0 (flaky) failed"),
        "{r}"
    );
    assert_eq!(
        seen.failures_left.load(Ordering::SeqCst),
        0,
        "both attempts were made"
    );
}
