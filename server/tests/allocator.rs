//! The shipped binary's allocator choice: jemalloc by default, the system allocator with
//! `QUIVER_ALLOCATOR=system`, each serving real requests over a socket.
#![cfg(feature = "jemalloc")]

mod real_binary;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server {
    child: Child,
    mcp: u16,
    admin: u16,
    _dir: TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start(allocator: Option<&str>) -> Server {
    let dir = std::env::temp_dir().join(format!(
        "quiver-alloc-{}-{}",
        std::process::id(),
        allocator.unwrap_or("default")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("tools.yaml");
    std::fs::write(&config, "tools:\n  - {name: add, handler: {builtin: add}}\n").unwrap();
    let (mcp, admin) = (real_binary::free_port(), real_binary::free_port());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quiver-server"));
    cmd.arg(format!("--config=file:{}", config.display()))
        .arg(format!("--listen=127.0.0.1:{mcp}"))
        .arg(format!("--admin-listen=127.0.0.1:{admin}"))
        .env_remove("QUIVER_ALLOCATOR")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(a) = allocator {
        cmd.env("QUIVER_ALLOCATOR", a);
    }
    let server = Server {
        child: cmd.spawn().unwrap(),
        mcp,
        admin,
        _dir: TempDir(dir),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while http(server.admin, "GET", "/readyz", "").is_none_or(|r| !r.starts_with("HTTP/1.1 200")) {
        assert!(Instant::now() < deadline, "quiver-server did not become ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

/// One HTTP/1.1 exchange with `Connection: close`; the whole response as text.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn check(allocator: Option<&str>, expected: &str) {
    let server = start(allocator);
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add","arguments":{"a":40,"b":2}}}"#;
    for _ in 0..200 {
        let r = http(server.mcp, "POST", "/mcp", call).unwrap();
        assert!(r.contains(r#""text":"42""#), "{r}");
    }
    let metrics = http(server.admin, "GET", "/metrics", "").unwrap();
    let info = metrics
        .lines()
        .find(|l| l.starts_with("quiver_build_info"))
        .expect("quiver_build_info");
    assert!(info.contains(&format!("allocator=\"{expected}\"")), "{info}");
}

#[test]
fn jemalloc_by_default() {
    check(None, "jemalloc");
}

#[test]
fn system_allocator_when_asked() {
    check(Some("system"), "system");
}

#[test]
fn unknown_values_keep_jemalloc() {
    check(Some("tcmalloc"), "jemalloc");
}
