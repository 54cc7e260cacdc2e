//! `quiver-server bridge`: serves a stdio MCP server program on a Unix socket, one process
//! per connection, its stdin and stdout joined to the connection (stderr stays the
//! container's). It runs in a sidecar container of the program's image, from a copy of this
//! binary on a volume shared with the server container (`quiver-server install`), whose
//! stdio upstream connects with `socket:`; a new connection is a fresh process, so the
//! server's supervision (restart with backoff, a pool of N) works the same as for programs
//! it starts itself.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::UnixListener;
use tokio::process::Command;
use tokio::sync::Semaphore;

use crate::handlers::process;

/// Serves `command` on `socket` until SIGTERM or SIGINT, at most `max` processes at once.
///
/// # Errors
/// The socket cannot be bound.
pub async fn serve(socket: &Path, command: &[String], max: usize) -> anyhow::Result<()> {
    let (program, args) = command
        .split_first()
        .context("bridge needs a program after `--`")?;
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
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::warn!(max, "bridge: connection refused, every process slot is taken");
            continue;
        };
        let (program, args) = (program.clone(), args.to_vec());
        tokio::spawn(async move {
            let why = run(conn, &program, &args).await;
            tracing::info!(program, why, "bridge: process ended");
            drop(permit);
        });
    }
    let _ = std::fs::remove_file(socket);
    Ok(())
}

/// Runs one process for one connection until either ends.
async fn run(conn: tokio::net::UnixStream, program: &str, args: &[String]) -> String {
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
    let (mut from_conn, mut to_conn) = conn.into_split();
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
