//! `quiver-server bridge`: serves a stdio MCP server program on a Unix socket, one process
//! per connection, its stdin and stdout joined to the connection (stderr stays the
//! container's). It runs in a sidecar container of the program's image, from a copy of this
//! binary on a volume shared with the server container (`quiver-server install`), whose
//! stdio upstream connects with `socket:`; a new connection is a fresh process, so the
//! server's supervision (restart with backoff, a pool of N) works the same as for programs
//! it starts itself.
//!
//! A connection is served only after it presents the bridge's token: a random value the
//! bridge writes next to the socket ([`token_path`]) when it starts, and that the server
//! reads and sends as the connection's first line. Landlock does not govern connecting to a
//! socket by its path, so the socket alone would let any process that knows the path (the
//! server's own children included) talk to the program; the token file is readable only
//! by who may read the socket's directory, which the server hides from its children.

use std::io::Write as _;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::UnixListener;
use tokio::process::Command;
use tokio::sync::Semaphore;

use crate::sys::process;

/// Longest first line of a connection (the token and its newline).
const MAX_TOKEN_LINE: u64 = 256;
/// How long a connection has to present the token (the server sends it as it connects).
const HANDSHAKE: Duration = Duration::from_secs(2);
/// Connections presenting their token at once: a new one beyond these closes the oldest, so
/// connections that never speak cannot keep the server out.
const MAX_PENDING: usize = 64;

/// The connections still presenting their token, oldest first.
#[derive(Default)]
struct Pending {
    queue: std::sync::Mutex<std::collections::VecDeque<(u64, tokio_util::sync::CancellationToken)>>,
    next: std::sync::atomic::AtomicU64,
}

impl Pending {
    /// A new connection's place: its id and what cancels its handshake (when
    /// [`MAX_PENDING`] newer ones arrive before it is done).
    fn admit(&self) -> (u64, tokio_util::sync::CancellationToken) {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cancel = tokio_util::sync::CancellationToken::new();
        let mut q = self
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while q.len() >= MAX_PENDING {
            if let Some((_, oldest)) = q.pop_front() {
                oldest.cancel();
            }
        }
        q.push_back((id, cancel.clone()));
        (id, cancel)
    }

    /// The connection `id` is done presenting.
    fn done(&self, id: u64) {
        let mut q = self
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        q.retain(|(i, _)| *i != id);
    }
}

/// The file holding the token of the bridge listening on `socket`.
pub fn token_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".token");
    PathBuf::from(p)
}

/// A fresh token: 32 random bytes, hex.
fn new_token() -> anyhow::Result<String> {
    let mut b = [0u8; 32];
    getrandom::getrandom(&mut b).map_err(|e| anyhow::anyhow!("no random bytes: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Writes `token` to `path` whole or not at all (a reader never sees half of it), readable by
/// this user and group only.
fn write_token(path: &Path, token: &str) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    // Whatever the umask: the server may run in the group only.
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o640))?;
    f.write_all(token.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads the connection's first line and checks it is `token`; the reader keeps what
/// followed it.
async fn admitted<R: tokio::io::AsyncRead + Unpin>(conn: &mut BufReader<R>, token: &str) -> bool {
    let mut line = Vec::new();
    let read = async {
        let mut limited = (&mut *conn).take(MAX_TOKEN_LINE);
        limited.read_until(b'\n', &mut line).await
    };
    match tokio::time::timeout(HANDSHAKE, read).await {
        Ok(Ok(_)) if line.last() == Some(&b'\n') => {
            line.pop();
            constant_time_eq(&line, token.as_bytes())
        }
        _ => false,
    }
}

/// Serves `command` on `socket` until SIGTERM or SIGINT, at most `max` processes at once,
/// to connections that present the token written to [`token_path`].
///
/// # Errors
/// The socket cannot be bound, or the token not written.
pub async fn serve(socket: &Path, command: &[String], max: usize) -> anyhow::Result<()> {
    let (program, args) = command
        .split_first()
        .context("bridge needs a program after `--`")?;
    // Before the socket exists: whoever sees the socket can read the current token.
    let token: Arc<str> = new_token()?.into();
    write_token(&token_path(socket), &token)?;
    // A socket left by an earlier run of this container (the volume outlives it); anything
    // else at that path is not ours to delete.
    match std::fs::symlink_metadata(socket) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(socket)
                .with_context(|| format!("removing the stale {}", socket.display()))?;
        }
        Ok(_) => anyhow::bail!("{} exists and is not a socket", socket.display()),
        Err(_) => {}
    }
    let listener = UnixListener::bind(socket).with_context(|| format!("binding {}", socket.display()))?;
    tracing::info!(socket = %socket.display(), program, "bridge listening");
    let slots = Arc::new(Semaphore::new(max));
    let pending = Arc::new(Pending::default());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        };
        let Ok((conn, _)) = conn else {
            // E.g. out of file descriptors: do not spin.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let (id, evicted) = pending.admit();
        let (program, args) = (program.clone(), args.to_vec());
        let (slots, token, pending) = (Arc::clone(&slots), Arc::clone(&token), Arc::clone(&pending));
        tokio::spawn(async move {
            let (read, write) = conn.into_split();
            let mut read = BufReader::new(read);
            let ok = tokio::select! {
                ok = admitted(&mut read, &token) => ok,
                () = evicted.cancelled() => false,
            };
            pending.done(id);
            if !ok {
                tracing::warn!("bridge: connection refused, it did not present the token");
                return;
            }
            let Ok(permit) = slots.try_acquire_owned() else {
                tracing::warn!(max, "bridge: connection refused, every process slot is taken");
                return;
            };
            let why = run(read, write, &program, &args).await;
            tracing::info!(program, why, "bridge: process ended");
            drop(permit);
        });
    }
    let _ = std::fs::remove_file(socket);
    let _ = std::fs::remove_file(token_path(socket));
    Ok(())
}

/// Runs one process for one connection until either ends.
async fn run(
    mut from_conn: BufReader<tokio::net::unix::OwnedReadHalf>,
    mut to_conn: tokio::net::unix::OwnedWriteHalf,
    program: &str,
    args: &[String],
) -> String {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    // Declared after `child`: the group is killed before tokio reaps the leader.
    let (mut child, group) = match process::spawn(&mut cmd) {
        Ok(c) => c,
        Err(e) => return format!("could not start {program}: {e}"),
    };
    let (Some(mut stdin), Some(mut stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return "no stdio pipes".into();
    };
    let why = tokio::select! {
        s = child.wait() => format!("exited ({})", s.map_or_else(|e| e.to_string(), |s| s.to_string())),
        r = tokio::io::copy(&mut from_conn, &mut stdin) => format!("the connection closed ({r:?})"),
        r = tokio::io::copy(&mut stdout, &mut to_conn) => format!("its stdout closed ({r:?})"),
    };
    drop(group);
    let _ = child.start_kill();
    why
}

/// `quiver-server install DIR`: copies this binary into `DIR` (an init container's way of
/// putting it on a volume, in an image that has no shell or `cp`).
///
/// # Errors
/// The binary cannot be read or the copy written.
pub fn install(dir: &Path) -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("finding this binary")?;
    let to = dir.join("quiver-server");
    let tmp = dir.join(".quiver-server.tmp");
    std::fs::copy(&me, &tmp).with_context(|| format!("copying {} to {}", me.display(), tmp.display()))?;
    std::fs::rename(&tmp, &to).with_context(|| format!("renaming to {}", to.display()))?;
    Ok(to)
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt as _;

    use super::*;

    #[test]
    fn connections_that_never_speak_make_room_for_the_next_one() {
        let p = Pending::default();
        let first: Vec<_> = (0..MAX_PENDING).map(|_| p.admit()).collect();
        assert!(first.iter().all(|(_, c)| !c.is_cancelled()));
        // One more: the oldest gives way, the others keep presenting.
        let (_, newest) = p.admit();
        assert!(first[0].1.is_cancelled());
        assert!(first[1..].iter().all(|(_, c)| !c.is_cancelled()));
        assert!(!newest.is_cancelled());
        // One that finished leaves the queue: the next arrival evicts nobody.
        p.done(first[5].0);
        let _ = p.admit();
        assert!(!first[1].1.is_cancelled());
        assert_eq!(p.queue.lock().unwrap().len(), MAX_PENDING);
    }

    #[tokio::test]
    async fn only_the_token_line_admits_and_what_follows_it_is_kept() {
        let token = new_token().unwrap();
        assert_eq!(token.len(), 64);
        assert_ne!(token, new_token().unwrap());
        let ok = format!("{token}\n{{\"jsonrpc\":\"2.0\"}}\n");
        let mut r = BufReader::new(ok.as_bytes());
        assert!(admitted(&mut r, &token).await);
        let mut rest = String::new();
        r.read_to_string(&mut rest).await.unwrap();
        assert_eq!(
            rest, "{\"jsonrpc\":\"2.0\"}\n",
            "the program gets the bytes after the token"
        );
        let long = format!("{token}{}\n", "0".repeat(300));
        for bad in [
            String::new(),
            token.clone(),
            format!("{}\n", &token[..63]),
            format!("{token}0\n"),
            format!(" {token}\n"),
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}\n".to_owned(),
            long,
        ] {
            let mut r = BufReader::new(bad.as_bytes());
            assert!(!admitted(&mut r, &token).await, "{bad:?}");
        }
    }

    #[test]
    fn the_token_file_is_replaced_whole_and_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = token_path(&dir.path().join("b.sock"));
        assert!(path.ends_with("b.sock.token"));
        write_token(&path, "first").unwrap();
        write_token(&path, "second").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "second");
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o640
        );
    }
}
