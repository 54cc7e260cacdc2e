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

/// A ping on a kept-alive connection: the response head (lower case), and whether the server
/// closed the connection right after the response.
fn keep_alive_ping(s: &mut TcpStream) -> (String, bool) {
    let body = r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#;
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        assert_eq!(std::io::Read::read(s, &mut byte).unwrap(), 1, "response head");
        buf.push(byte[0]);
    }
    let head = String::from_utf8(buf).unwrap().to_ascii_lowercase();
    let len: usize = head
        .split("content-length: ")
        .nth(1)
        .and_then(|r| r.split("\r\n").next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    let mut rest = vec![0u8; len];
    std::io::Read::read_exact(s, &mut rest).unwrap();
    // Closed now (read 0), or left open (the read times out)?
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let closed = matches!(std::io::Read::read(s, &mut byte), Ok(0));
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    (head, closed)
}

#[test]
fn sigterm_fails_readiness_first_then_drains_in_flight_calls() {
    drains_in_flight_calls(&[]);
}

/// The same with the MCP port on per-core runtimes, two sockets sharing it: each
/// thread's connections are drained and closed alike.
#[test]
fn per_core_listeners_drain_the_same_way() {
    drains_in_flight_calls(&["--per-core-listeners", "--worker-threads=2"]);
}

fn drains_in_flight_calls(mode: &[&str]) {
    let mut args = vec!["--shutdown-delay=5s", "--shutdown-grace=20s"];
    args.extend_from_slice(mode);
    let mut p = start_http(&args);
    // A keep-alive client: before SIGTERM its connection stays open.
    let mut kept = TcpStream::connect(("127.0.0.1", p.mcp)).unwrap();
    kept.set_read_timeout(Some(PATIENCE)).unwrap();
    let (head, _) = keep_alive_ping(&mut kept);
    assert!(
        head.starts_with("http/1.1 200") && !head.contains("connection: close"),
        "{head}"
    );
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
    // ...and asks each keep-alive client to close its connection, so it reconnects (to pods
    // that are not stopping) before idle connections are closed.
    let (head, closed) = keep_alive_ping(&mut kept);
    assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
    assert!(closed, "the server closed the connection after the response");
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
