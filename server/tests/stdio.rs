//! The real binary over pipes (`--stdio`): over-long lines, invalid UTF-8 and broken JSON get
//! JSON-RPC errors and serving continues; `--max-concurrency` bounds requests in flight
//! (reading pauses); SIGTERM lets the running call finish.

mod real_binary;

use std::io::Write;
use std::sync::mpsc::Receiver;

use real_binary::{PATIENCE, listening_ports, start_stdio, terminate, wait_exit};
use serde_json::{Value, json};

fn next(rx: &Receiver<String>) -> Value {
    let line = rx.recv_timeout(PATIENCE).expect("a line on stdout");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
fn hostile_lines_get_errors_and_serving_continues() {
    let (mut p, mut stdin, rx) = start_stdio(&["--max-body-bytes=1024", "--max-concurrency=1"]);
    let long = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"p":"{}"}}}}"#,
        "x".repeat(5000)
    );
    stdin.write_all(long.as_bytes()).unwrap();
    stdin.write_all(b"\n").unwrap();
    let err = next(&rx);
    assert_eq!(err["error"]["code"], -32600, "{err}");
    assert!(err["id"].is_null());
    assert!(
        err["error"]["message"].as_str().unwrap().contains("1024"),
        "{err}"
    );

    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"pi\xffng\"}\n")
        .unwrap();
    assert_eq!(next(&rx)["error"]["code"], -32700);
    stdin.write_all(b"{not json\n\n   \n").unwrap();
    assert_eq!(next(&rx)["error"]["code"], -32700);
    let deep = format!("{}\n", "[".repeat(1000));
    stdin.write_all(deep.as_bytes()).unwrap();
    assert_eq!(
        next(&rx)["error"]["code"],
        -32700,
        "deep unclosed nesting is a parse error"
    );

    // With one request in flight at most, a ping sent after a slow call is answered after it.
    let slow = json!({"jsonrpc": "2.0", "id": "slow", "method": "tools/call", "params": {"name": "sleep", "arguments": {"ms": 500}}});
    let ping = json!({"jsonrpc": "2.0", "id": "ping", "method": "ping"});
    writeln!(stdin, "{slow}\n{ping}").unwrap();
    let first = next(&rx);
    assert_eq!(first["id"], "slow", "{first}");
    assert_eq!(first["result"]["content"][0]["text"], "slept 500 ms");
    assert_eq!(next(&rx)["id"], "ping");

    let add = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "add", "arguments": {"a": 40, "b": 2}}});
    writeln!(stdin, "{add}").unwrap();
    assert_eq!(next(&rx)["result"]["content"][0]["text"], "42");
    drop(stdin);
    let status = wait_exit(&mut p, PATIENCE).expect("exit when stdin closes");
    assert!(status.success(), "{status}");
}

#[test]
fn sigterm_lets_the_running_stdio_call_finish() {
    let (mut p, mut stdin, rx) = start_stdio(&["--shutdown-grace=20s"]);
    let ping = json!({"jsonrpc": "2.0", "id": 0, "method": "ping"});
    writeln!(stdin, "{ping}").unwrap();
    assert_eq!(next(&rx)["id"], 0, "serving");
    let slow = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "sleep", "arguments": {"ms": 1500}}});
    writeln!(stdin, "{slow}").unwrap();
    // The call is read and running once a later ping is answered (reads are in order).
    writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})).unwrap();
    assert_eq!(next(&rx)["id"], 2);
    terminate(&p);
    let done = next(&rx);
    assert_eq!(done["result"]["content"][0]["text"], "slept 1500 ms", "{done}");
    let status = wait_exit(&mut p, PATIENCE).expect("exit after the drain");
    assert!(status.success(), "{status}");
}

/// A sampling request goes out on stdout and its answer comes back on stdin, also when the
/// call waiting for it holds the only request slot (answers need no slot).
#[test]
fn sampling_over_stdio_with_every_slot_taken() {
    let (mut p, mut stdin, rx) = start_stdio(&["--max-concurrency=1"]);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"sampling": {}},
        "clientInfo": {"name": "t", "version": "1"}}});
    writeln!(stdin, "{init}").unwrap();
    assert_eq!(next(&rx)["id"], 0);
    let call = json!({"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {"name": "ask", "arguments": {}, "_meta": {"progressToken": 1}}});
    writeln!(stdin, "{call}").unwrap();
    let req = next(&rx);
    assert_eq!(req["method"], "sampling/createMessage", "{req}");
    // The call holds the one slot; a request now waits, the answer does not.
    let answer = json!({"jsonrpc": "2.0", "id": req["id"], "result": {"role": "assistant",
        "content": {"type": "text", "text": "hello back"}, "model": "m"}});
    writeln!(stdin, "{answer}").unwrap();
    let out = next(&rx);
    assert_eq!(out["id"], "c", "{out}");
    assert_eq!(out["result"]["content"][0]["text"], "hello back");
    drop(stdin);
    let status = wait_exit(&mut p, PATIENCE).expect("exit when stdin closes");
    assert!(status.success(), "{status}");
}

#[test]
fn stdio_opens_no_port_unless_asked() {
    let (p, mut stdin, rx) = start_stdio(&["--admin-listen=off"]);
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")
        .unwrap();
    assert_eq!(next(&rx)["result"], json!({}));
    assert_eq!(listening_ports(p.child.id()), Vec::<u16>::new());
    // The default with --stdio is the same: no admin listener.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tools.yaml");
    std::fs::write(&config, "tools: []\n").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_quiver-server"))
        .arg(format!("--config=file:{}", config.display()))
        .arg("--stdio")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut input = child.stdin.take().unwrap();
    input
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert!(line.contains("\"result\":{}"), "{line}");
    let ports = listening_ports(child.id());
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(ports, Vec::<u16>::new());
    // With an address it listens there.
    let (p, _stdin, _rx) = start_stdio(&[]);
    let deadline = std::time::Instant::now() + PATIENCE;
    while listening_ports(p.child.id()).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no admin listener with --admin-listen=127.0.0.1:0"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
