//! Stdio upstreams: a supervised pool of long-lived processes speaking newline-delimited
//! JSON-RPC, requests multiplexed over each by id.
//!
//! Each slot of the pool runs one process at a time: start, `initialize`, serve, and on exit
//! (or a broken message, or a hung handshake) kill its whole process group, fail what was
//! in flight on it, and start again after a backoff that doubles up to 30 s and starts over
//! once a process has lived a minute. Calls go round-robin to the processes that are ready.

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::{mpsc, watch};

use super::{
    BACKOFF, CallError, Message, Shared, Waiters, answer, back_off, check_initialized, classify, envelope,
    initialize_params,
};
use crate::config::upstream::Transport;
use crate::{secrets::WithSecrets, sys::process};

/// Lines queued towards one process's stdin.
const QUEUE: usize = 256;
/// Longest stderr line logged, in characters (the rest is cut, after redaction).
const MAX_STDERR_LINE: usize = 2048;
/// Bytes of a stderr line read before redaction: the logged characters (4 bytes at most
/// each) and room for a whole secret line starting among them, so a secret is redacted
/// before the cut could leave a part of it that no longer matches.
const MAX_STDERR_READ: usize = 4 * MAX_STDERR_LINE + 64 * 1024;
/// `PATH` of a process when the server has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One running, initialized process.
#[derive(Debug)]
pub(super) struct Proc {
    tx: mpsc::Sender<Vec<u8>>,
    waiters: Waiters,
}

impl Proc {
    fn send(&self, msg: &Value) -> bool {
        let mut line = serde_json::to_vec(msg).unwrap_or_default();
        line.push(b'\n');
        self.tx.try_send(line).is_ok()
    }

    async fn request<P: serde::Serialize + ?Sized>(
        &self,
        shared: &Shared,
        method: &str,
        params: &P,
    ) -> Result<Value, CallError> {
        let id = shared.id();
        let rx = self.waiters.add(id)?;
        // Forgets the request, and tells the process to stop working on it, unless answered.
        struct Pending<'a> {
            proc: &'a Proc,
            id: u64,
            answered: bool,
        }
        impl Drop for Pending<'_> {
            fn drop(&mut self) {
                if !self.answered {
                    self.proc.waiters.forget(self.id);
                    self.proc.send(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": self.id, "reason": "cancelled by quiver-server"}}));
                }
            }
        }
        let mut pending = Pending {
            proc: self,
            id,
            answered: false,
        };
        let mut line = envelope(id, method, params);
        line.push(b'\n');
        let exchange = async {
            self.tx
                .send(line)
                .await
                .map_err(|_| CallError::Down("the process exited".into()))?;
            rx.await
                .unwrap_or_else(|_| Err(CallError::Down("the process exited".into())))
        };
        let r = tokio::time::timeout(shared.timeout, exchange)
            .await
            .unwrap_or(Err(CallError::Timeout(shared.timeout)));
        pending.answered = !matches!(r, Err(CallError::Timeout(_)));
        r
    }
}

/// The processes of one stdio upstream.
#[derive(Debug)]
pub(super) struct Pool {
    shared: Arc<Shared>,
    slots: Vec<ArcSwapOption<Proc>>,
    ready: watch::Sender<usize>,
    next: AtomicUsize,
}

/// What starts a process.
#[derive(Debug, Clone)]
struct Launch {
    program: String,
    args: Vec<String>,
    env: Vec<(String, crate::template::Template)>,
    cwd: Option<String>,
    socket: Option<String>,
}

impl Pool {
    pub(super) fn start(shared: &Arc<Shared>, t: &Transport) -> Arc<Self> {
        let Transport::Stdio {
            program,
            args,
            env,
            cwd,
            processes,
            socket,
        } = t
        else {
            unreachable!("a stdio pool of a stdio upstream")
        };
        let pool = Arc::new(Self {
            shared: Arc::clone(shared),
            slots: (0..*processes).map(|_| ArcSwapOption::empty()).collect(),
            ready: watch::Sender::new(0),
            next: AtomicUsize::new(0),
        });
        let launch = Launch {
            program: program.clone(),
            args: args.clone(),
            env: env.clone(),
            cwd: cwd.clone(),
            socket: socket.clone(),
        };
        for slot in 0..*processes {
            tokio::spawn(supervise(Arc::clone(&pool), slot, launch.clone()));
        }
        pool
    }

    /// A ready process, round-robin; waits (within the timeout) while none is.
    async fn pick(&self, deadline: Instant) -> Result<Arc<Proc>, CallError> {
        let mut ready = self.ready.subscribe();
        loop {
            let n = self.slots.len();
            let start = self.next.fetch_add(1, Ordering::Relaxed);
            for i in 0..n {
                if let Some(p) = self.slots[(start + i) % n].load_full() {
                    return Ok(p);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let why = || {
                let h = self.shared.health.lock().unwrap_or_else(PoisonError::into_inner);
                CallError::Down(
                    h.error
                        .clone()
                        .unwrap_or_else(|| "the process is starting".into()),
                )
            };
            match tokio::time::timeout(left, ready.wait_for(|n| *n > 0)).await {
                Ok(Ok(_)) => {}
                _ => return Err(why()),
            }
        }
    }

    pub(super) async fn request<P: serde::Serialize + Sync + ?Sized>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<Value, CallError> {
        let proc = self.pin().await?;
        proc.request(&self.shared, method, params).await
    }

    /// A ready process (the next in turn), waited for within the upstream's timeout.
    pub(super) async fn pin(&self) -> Result<Arc<Proc>, CallError> {
        self.pick(Instant::now() + self.shared.timeout).await
    }

    /// A request to process `p` (one [`Self::pin`] gave): a process that has since exited
    /// fails it.
    pub(super) async fn request_on<P: serde::Serialize + Sync + ?Sized>(
        &self,
        p: &Proc,
        method: &str,
        params: &P,
    ) -> Result<Value, CallError> {
        p.request(&self.shared, method, params).await
    }

    fn publish(&self, slot: usize, p: Option<Arc<Proc>>) {
        self.slots[slot].store(p);
        let n = self.slots.iter().filter(|s| s.load().is_some()).count();
        self.ready.send_replace(n);
        self.shared.set_health(|h| {
            h.connections = n;
            if n > 0 {
                h.state = "ready";
                h.error = None;
            } else if h.state == "ready" {
                h.state = "down";
            }
        });
    }
}

/// Runs slot `slot` of the pool until the upstream is stopped.
async fn supervise(pool: Arc<Pool>, slot: usize, launch: Launch) {
    let shared = Arc::clone(&pool.shared);
    let mut backoff = BACKOFF.0;
    loop {
        let started = Instant::now();
        let why = tokio::select! {
            why = run_once(&pool, slot, &launch) => why,
            () = shared.stop.cancelled() => String::new(),
        };
        if shared.stop.is_cancelled() {
            // Removed by a reload: what was in flight on this process fails now.
            if let Some(p) = pool.slots[slot].swap(None) {
                p.waiters.fail_all("the upstream was removed from the config");
            }
            return;
        }
        pool.publish(slot, None);
        shared.metrics.restarts.inc();
        shared.set_health(|h| {
            h.restarts += 1;
            if h.connections == 0 {
                h.state = "down";
            }
            h.error = Some(why.clone());
        });
        if started.elapsed() > Duration::from_secs(60) {
            backoff = BACKOFF.0;
        }
        if !back_off(&shared.stop, &mut backoff).await {
            return;
        }
    }
}

/// A started process (or a connection to a socket serving one): its message streams.
struct Io {
    read: Box<dyn AsyncRead + Unpin + Send>,
    write: Box<dyn AsyncWrite + Unpin + Send>,
    stderr: Option<ChildStderr>,
    /// The process and its group (killed when dropped), when started here.
    child: Option<(Child, process::Group)>,
}

/// The token of the bridge listening on `socket`, `None` when there is no token file (a
/// socket served by something other than `quiver-server bridge`). The file is written by
/// whoever can write the socket's directory, so it is read only as what a bridge writes: a
/// regular file, not through a link (which would make the server read, and send, a file of
/// its own), holding 64 hex digits.
fn bridge_token(socket: &str) -> Result<Option<String>, String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = super::bridge::token_path(std::path::Path::new(socket));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path);
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let bad = || format!("{} holds no bridge token", path.display());
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err(bad());
    }
    let mut token = String::new();
    file.take(128).read_to_string(&mut token).map_err(|_| bad())?;
    let token = token.trim();
    if token.len() != 64 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    Ok(Some(token.to_owned()))
}

/// The socket must be one, not a link (which a sidecar could point at another socket the
/// server can reach).
fn is_socket(path: &str) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt as _;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => Ok(()),
        Ok(_) => Err(format!("{path} is not a socket (a link or another kind of file)")),
        Err(e) => Err(format!("connecting to {path}: {e}")),
    }
}

/// Starts the process (or connects to the socket).
async fn open(shared: &Shared, launch: &Launch) -> Result<Io, String> {
    if let Some(path) = &launch.socket {
        // Read before connecting: a bridge writes its token before it listens.
        let token = bridge_token(path)?;
        is_socket(path)?;
        let mut s = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|e| format!("connecting to {path}: {e}"))?;
        if let Some(t) = token {
            s.write_all(format!("{t}\n").as_bytes())
                .await
                .map_err(|e| format!("presenting the token to {path}: {e}"))?;
        }
        let (read, write) = s.into_split();
        return Ok(Io {
            read: Box::new(read),
            write: Box::new(write),
            stderr: None,
            child: None,
        });
    }
    shared.secrets_ready().map_err(|e| e.to_string())?;
    let secrets = shared.secrets.snapshot();
    let scope = WithSecrets {
        args: &Value::Null,
        secrets: &secrets,
    };
    let mut env = Vec::with_capacity(launch.env.len());
    for (k, t) in &launch.env {
        match t.render(&scope) {
            Ok(v) if !v.contains('\0') => env.push((k.clone(), v)),
            Ok(_) => return Err(format!("the value of {k} cannot be set")),
            Err(e) => return Err(format!("{k}: {e}")),
        }
    }
    let mut cmd = Command::new(&launch.program);
    cmd.args(&launch.args)
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()),
        )
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(d) = &launch.cwd {
        cmd.current_dir(d);
    }
    let (mut child, group) =
        process::spawn(&mut cmd).map_err(|e| format!("could not start {}: {e}", launch.program))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("the process has no stdio pipes".into());
    };
    Ok(Io {
        read: Box::new(stdout),
        write: Box::new(stdin),
        stderr: child.stderr.take(),
        child: Some((child, group)),
    })
}

/// Starts one process, initializes it and serves it until it ends; returns why it ended.
async fn run_once(pool: &Arc<Pool>, slot: usize, launch: &Launch) -> String {
    let shared = &pool.shared;
    let Io {
        read,
        mut write,
        stderr,
        child,
    } = match open(shared, launch).await {
        Ok(io) => io,
        Err(why) => return why,
    };
    // Dropped at the end of this function: the process group is killed before tokio
    // reaps the leader.
    let (mut child, group) = child.unzip();
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(QUEUE);
    let proc = Arc::new(Proc {
        tx,
        waiters: Waiters::default(),
    });
    let writer = async move {
        while let Some(line) = rx.recv().await {
            if write.write_all(&line).await.is_err() || write.flush().await.is_err() {
                return "its input closed".to_owned();
            }
        }
        "stopped".to_owned()
    };
    let name = shared.name.clone();
    let budget = Arc::clone(shared);
    let logger = async move {
        let Some(stderr) = stderr else {
            return std::future::pending().await;
        };
        let mut lines = BufReader::new(stderr);
        let mut buf = Vec::new();
        let wanted = || budget.log_budget.take();
        while let Some(line) = next_stderr_line(&mut lines, &mut buf, &budget.secrets, wanted).await {
            if let Some(line) = line {
                tracing::info!(upstream = %name, line, "upstream stderr");
            }
        }
        // Its stderr closed: keep serving until stdout closes or the process exits.
        std::future::pending::<()>().await;
    };
    let exited = async {
        match &mut child {
            Some(c) => match c.wait().await {
                Ok(s) => format!("the process exited ({s})"),
                Err(e) => format!("waiting for the process: {e}"),
            },
            None => std::future::pending().await,
        }
    };
    let reader = read_messages(shared, &proc, BufReader::new(read));
    let handshake = async {
        let r = proc
            .request(shared, "initialize", &initialize_params(false, false))
            .await;
        let (version, info, offered) = r
            .and_then(|r| check_initialized(&r))
            .map_err(|e| format!("initialize: {e}"))?;
        shared
            .offered
            .store(offered, std::sync::atomic::Ordering::Relaxed);
        shared.epoch.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        proc.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        shared.set_health(|h| {
            h.protocol_version = Some(version);
            h.server_info = info;
        });
        pool.publish(slot, Some(Arc::clone(&proc)));
        shared.relist.notify_one();
        std::future::pending::<Result<(), String>>().await
    };
    let why = tokio::select! {
        why = exited => why,
        why = reader => why,
        why = writer => why,
        Err(why) = handshake => why,
        () = logger => "its stderr logger ended".to_owned(),
    };
    drop(group);
    if let Some(c) = &mut child {
        let _ = c.start_kill();
    }
    proc.waiters.fail_all(&why);
    why
}

/// The next stderr line (`None` at the end) as logged, if the log wants it (`wanted`, asked
/// before any work on the line: lines beyond the log budget cost no redaction): redacted,
/// then cut to [`MAX_STDERR_LINE`] characters.
async fn next_stderr_line(
    r: &mut (impl AsyncBufRead + Unpin),
    buf: &mut Vec<u8>,
    secrets: &crate::secrets::Secrets,
    wanted: impl Fn() -> bool,
) -> Option<Option<String>> {
    read_line(r, buf, MAX_STDERR_READ, true).await.ok()??;
    Some(wanted().then(|| secrets.scrub(&String::from_utf8_lossy(buf), MAX_STDERR_LINE)))
}

/// Reads the process's messages until it breaks the protocol or closes stdout.
async fn read_messages(shared: &Shared, proc: &Proc, mut out: impl AsyncBufRead + Unpin) -> String {
    let mut buf = Vec::new();
    loop {
        match read_line(&mut out, &mut buf, shared.max_bytes, false).await {
            Ok(None) => return "its stdout closed".into(),
            Err(e) => return e,
            Ok(Some(())) => {}
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let msg = serde_json::from_slice::<Value>(&buf)
            .map_err(|_| "a line that is not JSON".to_owned())
            .and_then(classify);
        match msg {
            Ok(Message::Response(id, r)) => {
                proc.waiters.answer(id, r);
            }
            // A question to a client cannot be tied to one of the calls multiplexed on a
            // process: refused.
            Ok(Message::Request(id, method, _)) => {
                proc.send(&answer(id, &method));
            }
            Ok(Message::Notification(method, params)) => shared.notified(&method, &params),
            // Servers that print banners or logs to stdout are common: skipped, not fatal.
            Err(why) => tracing::debug!(upstream = %shared.name, why, "stdout line ignored"),
        }
    }
}

/// Reads one line into `buf` (without the newline). A line over `max` bytes is an error,
/// or with `cut` is cut to `max` and the rest skipped. `None` at the end of the stream.
async fn read_line(
    r: &mut (impl AsyncBufRead + Unpin),
    buf: &mut Vec<u8>,
    max: usize,
    cut: bool,
) -> Result<Option<()>, String> {
    buf.clear();
    let mut over = false;
    loop {
        let avail = r
            .fill_buf()
            .await
            .map_err(|e| format!("reading its output: {e}"))?;
        if avail.is_empty() {
            return Ok((!buf.is_empty() || over).then_some(()));
        }
        let (chunk, used, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (&avail[..i], i + 1, true),
            None => (avail, avail.len(), false),
        };
        let room = max.saturating_sub(buf.len());
        if chunk.len() > room {
            if !cut {
                return Err(format!("a message over {max} bytes"));
            }
            over = true;
        }
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        r.consume(used);
        if done {
            return Ok(Some(()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bridge_token_is_read_only_from_a_regular_file_of_the_bridges_form() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("bridge.sock");
        let sock_s = sock.to_str().unwrap();
        let token = dir.path().join("bridge.sock.token");
        assert_eq!(bridge_token(sock_s), Ok(None), "no file: no token");
        let good = "0123456789abcdef".repeat(4);
        std::fs::write(&token, format!("{good}\n")).unwrap();
        assert_eq!(bridge_token(sock_s), Ok(Some(good.clone())));
        // A file of the server's own, through a link, is never read (nor sent).
        let own = dir.path().join("server-secret");
        std::fs::write(&own, &good).unwrap();
        std::fs::remove_file(&token).unwrap();
        std::os::unix::fs::symlink(&own, &token).unwrap();
        assert!(bridge_token(sock_s).is_err());
        std::fs::remove_file(&token).unwrap();
        for bad in ["", "short", "zq-secret-value", &"g".repeat(64), &"a".repeat(65)] {
            std::fs::write(&token, bad).unwrap();
            assert!(bridge_token(sock_s).is_err(), "{bad}");
        }
        std::fs::remove_file(&token).unwrap();
        std::fs::create_dir(&token).unwrap();
        assert!(bridge_token(sock_s).is_err(), "a directory");
    }

    #[tokio::test]
    async fn a_secret_across_the_stderr_cut_is_redacted_whole() {
        let secrets = crate::secrets::Secrets::new();
        secrets.set_has_source();
        let secret = "zq-stderr-secret-value-0123456789";
        secrets.set(
            "up",
            Some(vec![("key".into(), secret.as_bytes().to_vec())]),
            crate::secrets::Presence::Loaded,
        );
        // The secret starts at every offset around the cut, so its head, tail or middle
        // would be at the boundary.
        for start in MAX_STDERR_LINE - secret.len()..=MAX_STDERR_LINE {
            let text = format!("{}{secret} tail\nnext\n", "x".repeat(start));
            let mut r = BufReader::new(text.as_bytes());
            let mut buf = Vec::new();
            let line = next_stderr_line(&mut r, &mut buf, &secrets, || true)
                .await
                .unwrap()
                .unwrap();
            assert!(line.chars().count() <= MAX_STDERR_LINE + 1, "{start}");
            // No piece of the secret (here: its first 6 characters) remains.
            assert!(
                !line.contains(&secret[..6]),
                "{start}: ...{}",
                &line[line.len().saturating_sub(40)..]
            );
        }
        // A line longer than what is read is still bounded.
        let long = format!("{}\nafter\n", "y".repeat(MAX_STDERR_READ * 2));
        let mut r = BufReader::new(long.as_bytes());
        let mut buf = Vec::new();
        let line = next_stderr_line(&mut r, &mut buf, &secrets, || true)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(buf.len(), MAX_STDERR_READ);
        assert_eq!(line.chars().count(), MAX_STDERR_LINE + 1);
        assert_eq!(
            next_stderr_line(&mut r, &mut buf, &secrets, || true)
                .await
                .flatten()
                .as_deref(),
            Some("after")
        );
        assert_eq!(next_stderr_line(&mut r, &mut buf, &secrets, || true).await, None);
    }

    #[tokio::test]
    async fn lines_are_bounded() {
        let mut buf = Vec::new();
        let mut r = BufReader::with_capacity(4, &b"abc\nlonger line\n\nend"[..]);
        assert_eq!(read_line(&mut r, &mut buf, 8, false).await, Ok(Some(())));
        assert_eq!(buf, b"abc");
        assert!(
            read_line(&mut r, &mut buf, 8, false)
                .await
                .unwrap_err()
                .contains("over 8 bytes")
        );
        let mut r = BufReader::with_capacity(4, &b"longer line\n\nend"[..]);
        assert_eq!(read_line(&mut r, &mut buf, 8, true).await, Ok(Some(())));
        assert_eq!(buf, b"longer l");
        assert_eq!(read_line(&mut r, &mut buf, 8, true).await, Ok(Some(())));
        assert!(buf.is_empty());
        assert_eq!(read_line(&mut r, &mut buf, 8, true).await, Ok(Some(())));
        assert_eq!(buf, b"end");
        assert_eq!(read_line(&mut r, &mut buf, 8, true).await, Ok(None));
    }

    #[test]
    fn only_a_socket_itself_is_connected_to() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("bridge.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let link = dir.path().join("link.sock");
        std::os::unix::fs::symlink(&sock, &link).unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(is_socket(sock.to_str().unwrap()), Ok(()));
        for no in [&link, &file, &dir.path().join("missing")] {
            assert!(is_socket(no.to_str().unwrap()).is_err(), "{}", no.display());
        }
    }
}
