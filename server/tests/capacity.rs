//! The real binary's connection cap: derived from the open-file limit with headroom, and a
//! saturated MCP port leaves the admin port answering (with readiness failing).

mod real_binary;

use std::net::TcpStream;
use std::process::{Command, Stdio};

use real_binary::{Proc, http, start_http, wait_for};
use serde_json::Value;

fn status(p: &Proc) -> Value {
    let r = http(p.admin, "GET", "/status", "").expect("/status answers");
    let body = r.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {r}"))
}

#[test]
fn the_connection_cap_leaves_file_descriptors_for_the_admin_port() {
    // Under `ulimit -n 1024` the default 10,000 is lowered to 1024 - 256 - 102 = 666.
    let can_lower = Command::new("sh")
        .args(["-c", "ulimit -n 1024"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(can_lower, "sh can lower its open-file limit");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tools.yaml");
    std::fs::write(&config, real_binary::TOOLS).unwrap();
    let (mcp, admin) = (real_binary::free_port(), real_binary::free_port());
    let script = format!(
        "ulimit -n 1024 && exec {} --config=file:{} --listen=127.0.0.1:{mcp} --admin-listen=127.0.0.1:{admin}",
        env!("CARGO_BIN_EXE_quiver-server"),
        config.display()
    );
    let child = Command::new("sh")
        .args(["-c", &script])
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let p = Proc {
        child,
        mcp,
        admin,
        _dir: dir,
    };
    wait_for("ready", || {
        http(p.admin, "GET", "/readyz", "").is_some_and(|r| r.starts_with("HTTP/1.1 200"))
    });
    assert_eq!(status(&p)["load"]["maxConnections"], 666);
}

#[test]
fn a_saturated_mcp_port_leaves_the_admin_port_answering() {
    saturates(&[]);
}

/// Per-core listeners share one cap: eight connections spread over three sockets
/// saturate the port as eight on one do.
#[test]
fn per_core_listeners_share_the_connection_cap() {
    let p = saturates(&["--per-core-listeners", "--worker-threads=3"]);
    assert_eq!(status(&p)["tuning"]["perCoreListeners"], true);
    assert_eq!(status(&p)["tuning"]["workerThreads"], 3);
}

fn saturates(mode: &[&str]) -> Proc {
    let mut args = vec!["--max-connections=8", "--header-read-timeout=60s"];
    args.extend_from_slice(mode);
    let p = start_http(&args);
    assert_eq!(status(&p)["load"]["maxConnections"], 8);
    let held: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(("127.0.0.1", p.mcp)).unwrap())
        .collect();
    wait_for("all eight accepted", || status(&p)["load"]["connections"] == 8);
    let ready = http(p.admin, "GET", "/readyz", "").unwrap();
    assert!(
        ready.starts_with("HTTP/1.1 503") && ready.ends_with("connection limit reached"),
        "{ready}"
    );
    let health = http(p.admin, "GET", "/healthz", "").unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let metrics = http(p.admin, "GET", "/metrics", "").unwrap();
    assert!(metrics.contains("quiver_open_connections 8"), "{metrics}");
    drop(held);
    wait_for("readiness back once they close", || {
        http(p.admin, "GET", "/readyz", "").is_some_and(|r| r.starts_with("HTTP/1.1 200"))
    });
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add","arguments":{"a":40,"b":2}}}"#;
    // Each of many new connections is answered, whichever socket the kernel gives it to.
    for _ in 0..16 {
        let r = http(p.mcp, "POST", "/mcp", call).unwrap();
        assert!(r.contains(r#""text":"42""#), "{r}");
    }
    p
}
