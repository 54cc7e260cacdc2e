//! Process groups and reaping, for the exec handler.
//!
//! Each exec run is the leader of a process group of its own. Whatever it starts in the
//! background stays in that group, so killing the group (on timeout, on output over the cap,
//! when the call is dropped, and after the leader exits) leaves nothing of the run behind.
//! A program can still leave the group on purpose (`setsid`): that is what reaping is for.
//!
//! quiver-server is PID 1 in its image, and a process whose parent exits is re-parented to
//! PID 1 (or to the nearest "child subreaper"): if nobody waits for such orphans they stay
//! zombies, and enough of them exhaust the PID space. [`start_reaper`] makes the server a
//! child subreaper (so the same holds when it is not PID 1, e.g. in tests or under a shell)
//! and waits for every zombie child that is not one of the exec runs tokio is waiting for.
//!
//! Telling the two apart: tokio's `Child::wait` must reap its own children (reaping one of
//! them here would take its exit status away). [`spawn`] registers the pid of every run under
//! a lock while spawning, so no exit can be seen before its registration, and unregisters
//! it when the run is over; the reaper holds the same lock while it scans `/proc` for zombie
//! children and waits only for the unregistered ones. The lock is taken once per exec run
//! and once per SIGCHLD, never on the path of other tools.
//!
//! A pid number is only signalled while it is known to be ours: the group is killed before
//! tokio reaps its leader, or right after (a process group's id stays reserved while any
//! member lives, and a freed number comes back only after the kernel's pid counter wraps).

use std::io;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::process::{Child, Command};

/// Pids of exec runs whose `Child` tokio may still wait for.
static OWNED: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn owned() -> MutexGuard<'static, Vec<u32>> {
    OWNED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An exec run's process group: killed whole when dropped (and on [`Group::kill`]), and
/// then its private directory removed.
#[derive(Debug)]
pub struct Group {
    pgid: Option<u32>,
    /// Dropped after the group is killed.
    _home: Option<crate::sys::sandbox::ChildDir>,
}

impl Group {
    /// Sends SIGKILL to every process of the group (nothing when there is none left).
    pub fn kill(&self) {
        let Some(pgid) = self.pgid.and_then(|p| libc::pid_t::try_from(p).ok()) else {
            return;
        };
        // kill(-1) would signal every process we may signal: only real group ids.
        if pgid > 1 {
            // SAFETY: kill(2) has no memory-safety preconditions; a negative pid names the
            // process group, which is this run's (see the module docs on pid reuse).
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
        if let Some(pid) = self.pgid {
            owned().retain(|&p| p != pid);
        }
    }
}

/// Spawns `cmd` as the leader of a new process group and registers it as tokio's to reap.
/// A child of the server gets a directory of its own as `HOME` and `TMPDIR` (unless its
/// configuration sets them), removed when the group is dropped.
///
/// # Errors
/// The program could not be started, or may not be (see [`crate::sys::sandbox`]).
pub fn spawn(cmd: &mut Command) -> io::Result<(Child, Group)> {
    cmd.process_group(0);
    let home = crate::sys::sandbox::child_dir()?;
    if let Some(h) = &home {
        for var in ["HOME", "TMPDIR"] {
            if !cmd.as_std().get_envs().any(|(k, v)| k == var && v.is_some()) {
                cmd.env(var, h.path());
            }
        }
    }
    // Every child of the server starts here, confined from the server's secrets and from
    // the other children.
    let _ruleset = crate::sys::sandbox::confine(cmd, home.as_ref().map(crate::sys::sandbox::ChildDir::path))?;
    let mut owned = owned();
    let child = cmd.spawn()?;
    let pgid = child.id();
    owned.extend(pgid);
    Ok((child, Group { pgid, _home: home }))
}

/// Becomes a child subreaper and reaps orphaned children for as long as the runtime runs.
pub fn start_reaper() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) takes plain integers and changes only this
        // process's own attribute.
        let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
        if r != 0 {
            tracing::warn!(error = %io::Error::last_os_error(), "cannot become a child subreaper; orphans of exec tools are reaped only as PID 1");
        }
    }
    let mut sigchld = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGCHLD; orphans of exec tools are not reaped");
            return;
        }
    };
    tokio::spawn(async move {
        // SIGCHLD deliveries coalesce; the periodic sweep catches anything in between.
        let mut sweep = tokio::time::interval(Duration::from_secs(30));
        loop {
            tokio::select! {
                s = sigchld.recv() => if s.is_none() { break },
                _ = sweep.tick() => {}
            }
            let reaped = tokio::task::spawn_blocking(reap_orphans).await.unwrap_or(0);
            if reaped > 0 {
                tracing::debug!(reaped, "reaped orphaned processes");
            }
        }
    });
}

/// Waits for every zombie child of this process that tokio does not own; returns how many.
fn reap_orphans() -> usize {
    let me = std::process::id();
    let owned = owned();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut reaped = 0;
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if owned.contains(&pid) || zombie_child_of(pid) != Some(me) {
            continue;
        }
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            continue;
        };
        // SAFETY: waitpid with a null status pointer writes nothing; the pid is a zombie
        // child of ours that nothing else waits for (checked under the lock above).
        if unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) } == pid {
            reaped += 1;
        }
    }
    reaped
}

/// The parent of `pid` when `pid` is a zombie (state `Z` in `/proc/PID/stat`).
fn zombie_child_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses: split at the last ')'.
    let mut rest = stat.get(stat.rfind(')')? + 1..)?.split_ascii_whitespace();
    let state = rest.next()?;
    let ppid = rest.next()?.parse().ok()?;
    (state == "Z").then_some(ppid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        // Our own entry: not a zombie.
        assert_eq!(zombie_child_of(std::process::id()), None);
        assert_eq!(zombie_child_of(u32::MAX), None);
    }

    #[test]
    fn a_group_of_nothing_kills_nothing() {
        // pgid 0 and 1 must never become kill(0)/kill(-1).
        for pgid in [Some(1), Some(0), None] {
            Group { pgid, _home: None }.kill();
        }
    }
}
