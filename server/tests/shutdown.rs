//! SIGTERM on the real binary: readiness fails first, the port keeps serving for
//! `--shutdown-delay`, in-flight calls finish, and the process exits within
//! `--shutdown-grace` even when clients hold connections open.

mod real_binary;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use real_binary::{PATIENCE, http, metric, start_http, terminate, wait_exit, wait_for};

fn call(port: u16, ms: u64) -> std::thread::JoinHandle<Option<String>> {
    std::thread::spawn(move || {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"sleep","arguments":{{"ms":{ms}}}}}}}"#
        );
        http(port, "POST", "/mcp", &body)
    })
}

#[test]
fn sigterm_fails_readiness_first_then_drains_in_flight_calls() {
    let mut p = start_http(&["--shutdown-delay=5s", "--shutdown-grace=20s"]);
    let slow = call(p.mcp, 6000);
    wait_for("the slow call is in flight", || {
        metric(p.admin, "quiver_inflight_requests") == Some(1.0)
    });
    terminate(&p);
    wait_for("readiness fails", || {
        http(p.admin, "GET", "/readyz", "")
            .is_some_and(|r| r.starts_with("HTTP/1.1 503") && r.ends_with("shutting down"))
    });
    // During the delay the MCP port still answers new requests.
    let ping = http(
        p.mcp,
        "POST",
        "/mcp",
        r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#,
    )
    .unwrap();
    assert!(ping.starts_with("HTTP/1.1 200"), "{ping}");
    // The call that was running when SIGTERM came completes.
    let done = slow.join().unwrap().expect("the in-flight call got a response");
    assert!(done.contains("slept 6000 ms"), "{done}");
    let status = wait_exit(&mut p, PATIENCE).expect("the server exits once drained");
    assert!(status.success(), "{status}");
}

#[test]
fn the_grace_bounds_shutdown_when_clients_hold_connections() {
    let mut p = start_http(&["--shutdown-grace=2s", "--header-read-timeout=60s"]);
    // A call that would run for a minute, and a client that sent half a request head.
    let slow = call(p.mcp, 60_000);
    let mut half = TcpStream::connect(("127.0.0.1", p.mcp)).unwrap();
    half.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    wait_for("the slow call is in flight", || {
        metric(p.admin, "quiver_inflight_requests") == Some(1.0)
            && metric(p.admin, "quiver_open_connections") == Some(2.0)
    });
    terminate(&p);
    // Without the grace this would take a minute (the call) or forever (the half request).
    let status = wait_exit(&mut p, Duration::from_secs(20)).expect("the server exits after the grace");
    assert!(status.success(), "{status}");
    let answer = slow.join().unwrap().unwrap_or_default();
    assert!(
        !answer.contains("slept"),
        "the call was cut, not completed: {answer}"
    );
}
