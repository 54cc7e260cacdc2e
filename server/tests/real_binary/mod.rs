//! Starts the real `quiver-server` binary on 127.0.0.1 (or over pipes) with a ToolSet in a
//! temporary directory, and talks to it with blocking sockets.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bound on any single wait ("it did finish"), never a pass/fail timing.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub const TOOLS: &str = "tools:\n  - {name: add, handler: {builtin: add}}\n  - {name: sleep, handler: {builtin: sleep}}\n  - {name: ask, handler: {sample: {prompt: hi, maxTokens: 5}}}\n";

pub struct Proc {
    pub child: Child,
    pub mcp: u16,
    pub admin: u16,
    pub _dir: tempfile::TempDir,
}

impl Proc {
    /// The server `child` started on these ports, once its `/readyz` answers 200; `dir` is
    /// removed with it.
    pub fn ready(child: Child, mcp: u16, admin: u16, dir: tempfile::TempDir) -> Proc {
        let p = Proc {
            child,
            mcp,
            admin,
            _dir: dir,
        };
        wait_for("quiver-server ready", || {
            http(p.admin, "GET", "/readyz", "").is_some_and(|r| r.starts_with("HTTP/1.1 200"))
        });
        p
    }
}

/// The text of the first content block `tool` answers with (`args`: its JSON arguments;
/// `headers`: extra request header lines), empty when there is none.
pub fn tool_text(p: &Proc, headers: &str, tool: &str, args: &str) -> String {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
    );
    let resp = http_with(p.mcp, "POST", "/mcp", headers, &body).expect("an answer");
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["result"]["content"][0]["text"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port nobody listens on, never one handed out before in this test binary:
/// a port picked for a server that has not bound it yet is still free, and a test running
/// beside it must not be given it too.
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed = HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..1000 {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !handed.contains(&port) {
            handed.push(port);
            return port;
        }
    }
    panic!("no loopback port left that was not handed out already")
}

fn command(dir: &tempfile::TempDir, tools: &str, args: &[&str]) -> Command {
    let config = dir.path().join("tools.yaml");
    std::fs::write(&config, tools).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quiver-server"));
    cmd.arg(format!("--config=file:{}", config.display()))
        .args(args)
        .env("RUST_LOG", "warn");
    cmd
}

/// Starts the HTTP server with `envs` set and waits until `/readyz` answers 200.
pub fn start_http_env(tools: &str, args: &[&str], envs: &[(&str, &str)]) -> Proc {
    let dir = tempfile::tempdir().unwrap();
    let (mcp, admin) = (free_port(), free_port());
    let mut cmd = command(&dir, tools, args);
    cmd.arg(format!("--listen=127.0.0.1:{mcp}"))
        .arg(format!("--admin-listen=127.0.0.1:{admin}"))
        .envs(envs.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    Proc::ready(cmd.spawn().unwrap(), mcp, admin, dir)
}

/// Starts the HTTP server and waits until `/readyz` answers 200.
pub fn start_http(args: &[&str]) -> Proc {
    start_http_with(TOOLS, args)
}

/// [`start_http`] serving `tools`.
pub fn start_http_with(tools: &str, args: &[&str]) -> Proc {
    start_http_env(tools, args, &[])
}

/// Starts `--stdio` with piped stdin/stdout; stdout lines arrive on the receiver. The admin
/// listener is on 127.0.0.1 unless `args` sets `--admin-listen`.
pub fn start_stdio(args: &[&str]) -> (Proc, ChildStdin, mpsc::Receiver<String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = command(&dir, TOOLS, args);
    if !args.iter().any(|a| a.starts_with("--admin-listen")) {
        cmd.arg("--admin-listen=127.0.0.1:0");
    }
    cmd.arg("--stdio")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let p = Proc {
        child,
        mcp: 0,
        admin: 0,
        _dir: dir,
    };
    (p, stdin, rx)
}

/// One HTTP/1.1 exchange with `Connection: close`; the whole response as text.
pub fn http(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    http_with(port, method, path, "", body)
}

/// [`http`] with extra header lines (each ending in `\r\n`).
pub fn http_with(port: u16, method: &str, path: &str, headers: &str, body: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(PATIENCE)).ok()?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Polls `cond` every 20 ms until it holds, failing after [`PATIENCE`].
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends SIGTERM.
pub fn terminate(p: &Proc) {
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(p.child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits for the process to exit, at most `bound`.
pub fn wait_exit(p: &mut Proc, bound: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(s) = p.child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The value of an unlabelled metric on `/metrics`.
pub fn metric(admin: u16, name: &str) -> Option<f64> {
    let text = http(admin, "GET", "/metrics", "")?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// TCP ports the process listens on, from /proc (its socket inodes in LISTEN state).
pub fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    l.strip_prefix("socket:[")
                        .and_then(|r| r.strip_suffix(']'))
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEX_IP:HEX_PORT, st 0A is LISTEN, inode is field 9.
            let port = f[1]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
                ports.extend(port);
            }
        }
    }
    ports
}

/// A command for the server binary as a pod runs it: not root. When this process is root,
/// the binary is copied into `dir` (which the test opens to every user: Cargo's target
/// directory may be under root's private home) and runs as `nobody` (65534); otherwise the
/// binary runs as built, as this user. Commands for one `dir` share one copy.
pub fn server_as_nobody(dir: &std::path::Path) -> Command {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    let built = std::path::Path::new(env!("CARGO_BIN_EXE_quiver-server"));
    if !std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        return Command::new(built);
    }
    let copy = dir.join("quiver-server");
    if !copy.exists() {
        // Copied by `cp`, not here: a file this process held open for writing could be
        // inherited by a process another test thread forks at that moment, and executing
        // it would then fail with ETXTBSY ("Text file busy") until that child execs.
        let status = Command::new("cp").arg(built).arg(&copy).status().unwrap();
        assert!(status.success(), "cp {} {}", built.display(), copy.display());
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut cmd = Command::new(copy);
    cmd.uid(65534).gid(65534);
    cmd
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Throwaway certificates in `dir`: `ca.crt`, `other-ca.crt`, and signed by the first,
/// `server.crt` for localhost and `client.crt` (EC P-256, one day).
pub fn make_pki(dir: &std::path::Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-days",
        "1",
    ];
    for ca in ["ca", "other-ca"] {
        let (key, crt, subj) = (format!("{ca}.key"), format!("{ca}.crt"), format!("/CN=it {ca}"));
        let mut args = vec!["req", "-x509", "-subj", &subj, "-keyout", &key, "-out", &crt];
        args.extend(ec);
        openssl(dir, &args);
    }
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    for (leaf, serial) in [("server", "11"), ("client", "12")] {
        let (key, csr, crt, ext, subj) = (
            format!("{leaf}.key"),
            format!("{leaf}.csr"),
            format!("{leaf}.crt"),
            format!("{leaf}.ext"),
            format!("/CN=it-{leaf}"),
        );
        let mut args = vec!["req", "-new", "-subj", &subj, "-keyout", &key, "-out", &csr];
        args.extend(&ec[..5]);
        openssl(dir, &args);
        let sign = [
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            serial,
            "-days",
            "1",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ];
        openssl(dir, &sign);
    }
}

/// A helper process of a test (a Redis, an Open Policy Agent) listening on `port`, killed
/// when dropped.
pub struct Service {
    pub child: Child,
    pub port: u16,
    /// Its working directory, removed after it.
    pub dir: tempfile::TempDir,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The path of a program the test command provides in the variable `env`; without it,
/// what `scripts/SCRIPT` prints last (the script downloads or builds it into the cache).
pub fn provided(env: &str, script: &str) -> String {
    std::env::var(env).unwrap_or_else(|_| {
        let path = format!("{}/../scripts/{script}", env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(&path)
            .output()
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_owned()
    })
}
