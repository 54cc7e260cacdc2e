//! What the processes this server starts (stdio upstreams, exec tools, bridged programs) can
//! reach of the server: nothing of its secrets.
//!
//! Pods run under the "restricted" Pod Security profile: same uid for server and children,
//! no capabilities, `no_new_privs`, so no separate user and no namespaces. What works
//! unprivileged, and is used here:
//!
//! - [`deny_dumping`]: `PR_SET_DUMPABLE` 0 on the server at start. Other processes of its uid
//!   can no longer open its `/proc/PID/environ`, `mem`, `maps`, `fd/`, nor ptrace it (the
//!   server itself still reads its own `/proc/self`). This keeps `QUIVER_SECRET_*` variables
//!   and every value the server holds in memory from a non-root child.
//! - Landlock, applied in each child between fork and exec ([`confine`]): each child gets a
//!   domain of its own, so it cannot ptrace or open the memory of the server or another
//!   child, whatever its capabilities, nor signal them (Landlock ABI 6+); and it may read
//!   every file except the hidden paths: the pod's credentials under `/run/secrets` (the
//!   ServiceAccount token, projected tokens), the `dir:` secrets tree (which holds the client
//!   token list), any `--hide-from-children` path, and every other process's `/proc/PID`
//!   (another child's environment holds that child's secrets, and Landlock's ptrace rule
//!   does not cover reading `/proc/PID/environ`); the child's own `/proc/PID` is granted in
//!   the child before exec. Landlock grants access to path hierarchies, so hiding a path
//!   means granting full access to every entry next to each directory on the way to it, and
//!   only listing (`READ_DIR`) on those directories. Consequences: a child cannot create
//!   files directly in a directory on the way to a hidden path (e.g. `/`, `/run`); it may
//!   list names in the hidden tree but not read a file there; a process the child starts
//!   cannot read its own `/proc/PID` files (only the child can).
//! - Children start with a cleared environment holding only their own configured values
//!   (done where the command is built: stdio.rs, exec/run.rs, bridge.rs).
//! - The server's children are kept from each other too ([`child_dir`]): each gets a
//!   directory of its own (mode 0700, under a directory of the server in `TMPDIR`) as `HOME`
//!   and `TMPDIR`, removed when it ends; the server's directory is hidden, and the child may
//!   write only in its own directory, its working directory and to the devices of `/dev`
//!   (everything else it may read is read-only), so no child leaves a file another reads.
//!   Upstream sockets (`/quiver/run`) are hidden from them: a bridge serves only who reads its
//!   token there (see [`crate::upstream::bridge`]). A bridge's children (processes of one
//!   program, in its own container) keep their container as it is.
//!
//! Without Landlock (an old kernel, or one booted without it) the server's children are
//! refused (each other's environments are always to hide), and a bridge's children when there
//! is a path to hide, unless the operator of the server chose `--child-isolation=best-effort`;
//! `/status` shows which it is.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{Value, json};

/// Where a pod's credentials are mounted (the ServiceAccount token, projected tokens, cloud
/// workload identity tokens). Both spellings: `/var/run` is a link to `/run` in most images,
/// but in an image without it (Quiver's own, `FROM scratch`) the kubelet's mount at
/// `/var/run/secrets/...` makes a real `/var/run` directory.
pub const POD_CREDENTIALS: [&str; 2] = ["/run/secrets", "/var/run/secrets"];

/// Where the operator mounts the socket directories of upstream sidecars (read-only, in the
/// server container): hidden from the server's children, so they cannot read a bridge's
/// token (see [`crate::upstream::bridge`]) and talk to another upstream.
pub const UPSTREAM_SOCKETS: &str = "/quiver/run";

/// Where processes' directories are.
const PROC: &str = "/proc";

pub use quiver_flags::ChildIsolation as Mode;

/// Whose children these are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Children {
    /// The server's: programs of different tools and upstreams, each holding its own values,
    /// so each is kept from the others too (a private `HOME`, writes only there).
    Tenants,
    /// A bridge's: processes of one program with the same values (its sidecar's).
    OneProgram,
}

/// What children are confined from, decided once at start.
#[derive(Debug)]
pub struct Policy {
    mode: Mode,
    children: Children,
    /// Canonical, existing paths children may not read.
    hidden: Vec<PathBuf>,
    /// The Landlock ABI version, or why there is none.
    landlock: Result<i32, String>,
}

static POLICY: OnceLock<Policy> = OnceLock::new();

// Landlock's uapi (linux/landlock.h).
const CREATE_RULESET_VERSION: libc::c_uint = 1;
const RULE_PATH_BENEATH: libc::c_int = 1;
const FS_EXECUTE: u64 = 1 << 0;
const FS_WRITE_FILE: u64 = 1 << 1;
const FS_READ_FILE: u64 = 1 << 2;
const FS_READ_DIR: u64 = 1 << 3;
const FS_TRUNCATE: u64 = 1 << 14;
const FS_IOCTL_DEV: u64 = 1 << 15;
const SCOPE_SIGNAL: u64 = 1 << 1;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// The filesystem rights an ABI version knows (all of them are handled).
fn fs_rights(abi: i32) -> u64 {
    match abi {
        ..=0 => 0,
        1 => (1 << 13) - 1,
        2 => (1 << 14) - 1,
        3 | 4 => (1 << 15) - 1,
        _ => (1 << 16) - 1,
    }
}

/// Rights that apply to a file that is not a directory.
const FILE_RIGHTS: u64 = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV;

/// The Landlock ABI version of the running kernel, or why it has none.
fn landlock_abi() -> Result<i32, String> {
    // SAFETY: with a null attribute, size 0 and the VERSION flag the call reads no memory
    // and only returns a number.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if r >= 1 {
        return Ok(i32::try_from(r).unwrap_or(i32::MAX));
    }
    let e = io::Error::last_os_error();
    Err(match e.raw_os_error() {
        Some(libc::ENOSYS) => "this kernel has no Landlock (Linux 5.13 or later has it)".to_owned(),
        Some(libc::EOPNOTSUPP) => "Landlock is disabled on this kernel (boot option lsm=)".to_owned(),
        Some(libc::EPERM) => "the seccomp profile forbids Landlock".to_owned(),
        _ => format!("Landlock is not usable: {e}"),
    })
}

/// Makes this process undumpable: other processes of its uid can no longer read its
/// environment or memory through `/proc`, nor ptrace it. Call first thing in `main`.
pub fn deny_dumping() {
    // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers and changes only this process.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_DUMPABLE,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r != 0 {
        eprintln!(
            "warning: cannot make the server undumpable: {}",
            io::Error::last_os_error()
        );
    }
}

/// Whether this process is dumpable (for `/status`).
fn dumpable() -> bool {
    // SAFETY: PR_GET_DUMPABLE reads one flag of this process.
    unsafe {
        libc::prctl(
            libc::PR_GET_DUMPABLE,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        ) != 0
    }
}

impl Policy {
    /// The server's policy for `mode`, hiding the pod's credentials, the upstream sockets and
    /// `extra` (each that exists).
    pub fn new(mode: Mode, extra: &[PathBuf]) -> Self {
        Self::hiding(mode, Children::Tenants, extra)
    }

    /// The policy of `quiver-server bridge`: strict, hiding the pod's credentials; its
    /// children are processes of one program, which share their container.
    pub fn for_bridge() -> Self {
        Self::hiding(Mode::Strict, Children::OneProgram, &[])
    }

    /// The paths to hide from `children`, existing or not.
    fn to_hide(children: Children, extra: &[PathBuf]) -> Vec<PathBuf> {
        let sockets = (children == Children::Tenants).then_some(UPSTREAM_SOCKETS);
        POD_CREDENTIALS
            .iter()
            .chain(sockets.as_ref())
            .map(PathBuf::from)
            .chain(extra.iter().cloned())
            .collect()
    }

    fn hiding(mode: Mode, children: Children, extra: &[PathBuf]) -> Self {
        let all: BTreeSet<PathBuf> = Self::to_hide(children, extra)
            .iter()
            .map(|p| swapped_volume(p).unwrap_or(p))
            .filter_map(|p| p.canonicalize().ok())
            .collect();
        // A path inside another hidden one is hidden with it (and must not be treated as a
        // way through it).
        let hidden = all
            .iter()
            .filter(|p| !p.ancestors().skip(1).any(|a| all.contains(a)))
            .cloned()
            .collect();
        Self {
            mode,
            children,
            hidden,
            landlock: landlock_abi(),
        }
    }

    /// Why a child may not start, if it may not. The server's children always have something
    /// to hide: each other's environment (`/proc/PID/environ` of a process of the same user)
    /// and private directories.
    fn refusal(&self) -> Option<String> {
        match (&self.landlock, self.mode) {
            (Ok(_), _) | (Err(_), Mode::BestEffort) => None,
            (Err(_), Mode::Strict) if self.hidden.is_empty() && self.children == Children::OneProgram => None,
            (Err(why), Mode::Strict) if self.hidden.is_empty() => Some(format!(
                "{why}, and without it the program could read the environment (the secret values) and \
                 files of every other program the server starts: run it in a container of its own \
                 (an upstream's `stdio.image` on Kubernetes), or start the server with \
                 --child-isolation=best-effort to accept that"
            )),
            (Err(why), Mode::Strict) => Some(format!(
                "{why}, and without it the program could read the server's secrets ({}): run it in a \
                 container of its own (an upstream's `stdio.image` on Kubernetes), or start the server \
                 with --child-isolation=best-effort to accept that",
                self.hidden
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// The ruleset a child restricts itself with (`None`: no Landlock, allowed unconfined).
    ///
    /// # Errors
    /// The child may not start (see [`Mode`]), or the ruleset could not be built.
    fn ruleset(&self, private: Option<&Path>, cwd: Option<&Path>) -> io::Result<Option<OwnedFd>> {
        if let Some(why) = self.refusal() {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
        }
        let Ok(abi) = self.landlock else {
            return Ok(None);
        };
        let Some(home) = private else {
            return build_ruleset(abi, &self.hidden, None).map(Some);
        };
        // Every child's directory is hidden (and so is the others'); its own is granted below.
        let inside_hidden = |p: &Path, hidden: &[PathBuf]| hidden.iter().any(|h| p.starts_with(h));
        let mut hidden = self.hidden.clone();
        if let Ok(root) = runtime_root()
            && !inside_hidden(root, &hidden)
        {
            hidden.push(root.to_owned());
            // And the children's directories of every other server, or of an earlier run of
            // this one that ended without removing them (a restarted container keeps its
            // scratch volume): what an earlier child left in its HOME stays its own.
            if let Some(Ok(siblings)) = root.parent().map(std::fs::read_dir) {
                hidden.extend(
                    siblings
                        .filter_map(Result::ok)
                        .filter(|e| e.file_name().to_string_lossy().starts_with(RUNTIME_PREFIX))
                        .map(|e| e.path())
                        .filter(|p| p != root),
                );
            }
        }
        let mut writable = vec![home.to_owned()];
        // Its working directory, unless that would open a hidden path or /proc.
        writable.extend(cwd.filter(|c| cwd_grantable(c, &hidden)).map(Path::to_owned));
        build_ruleset(abi, &hidden, Some(&writable)).map(Some)
    }

    /// What `/status` shows.
    pub fn status(&self) -> Value {
        let children = match (&self.landlock, self.refusal()) {
            (Ok(_), _) => "confined",
            (Err(_), Some(_)) => "refused",
            (Err(_), None) => "unconfined",
        };
        json!({
            "mode": match self.mode { Mode::Strict => "strict", Mode::BestEffort => "best-effort" },
            "children": children,
            "landlockAbi": self.landlock.as_ref().ok(),
            "landlockError": self.landlock.as_ref().err(),
            "hidden": self.hidden,
            "serverDumpable": dumpable(),
        })
    }
}

/// Sets the policy of this process (once; later calls change nothing) and logs what it means.
pub fn init(policy: Policy) {
    match (&policy.landlock, policy.refusal()) {
        (Ok(abi), _) => {
            tracing::info!(landlock_abi = abi, hidden = ?policy.hidden, "child processes are confined")
        }
        (Err(why), Some(_)) => {
            tracing::warn!(why, hidden = ?policy.hidden, "stdio upstreams and exec tools will not start (see --child-isolation)")
        }
        (Err(why), None) => tracing::warn!(why, hidden = ?policy.hidden, "child processes are not confined"),
    }
    let _ = POLICY.set(policy);
}

/// The policy of this process ([`init`]'s, or the default: strict, the pod's credentials).
pub fn policy() -> &'static Policy {
    POLICY.get_or_init(|| Policy::new(Mode::Strict, &[]))
}

/// Whether a child may write in its (canonical) working directory: not inside a hidden path,
/// not above one, and neither /proc, above it, nor in it.
fn cwd_grantable(c: &Path, hidden: &[PathBuf]) -> bool {
    !hidden.iter().any(|h| c.starts_with(h) || h.starts_with(c))
        && !Path::new(PROC).starts_with(c)
        && !c.starts_with(PROC)
}

/// The Secret, ConfigMap, projected or downward-API volume a path lies in, if any: the
/// kubelet writes such a volume into a new timestamped directory and swaps its `..data` link
/// to it, so a file in it resolves elsewhere after each rotation. Hiding the file's target
/// would leave the next version readable (and the ruleset would name a directory that is
/// gone); the whole volume is hidden instead.
fn swapped_volume(path: &Path) -> Option<&Path> {
    path.ancestors()
        .skip(1)
        .find(|dir| std::fs::symlink_metadata(dir.join("..data")).is_ok_and(|m| m.file_type().is_symlink()))
}

/// The server's children's directories: `$TMPDIR/quiver-children-PID-RANDOM` (mode 0700),
/// made when the first child starts.
static RUNTIME: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// How the children's directories of a server are named (then its PID and a random suffix).
const RUNTIME_PREFIX: &str = "quiver-children-";

fn runtime_root() -> io::Result<&'static Path> {
    RUNTIME
        .get_or_init(|| {
            let mut r = [0u8; 8];
            getrandom::getrandom(&mut r).map_err(|e| format!("no random bytes: {e}"))?;
            let suffix: String = r.iter().map(|b| format!("{b:02x}")).collect();
            let pid = std::process::id();
            let dir = std::env::temp_dir().join(format!("{RUNTIME_PREFIX}{pid}-{suffix}"));
            // An earlier run with this PID (a restarted container: PID 1 again) is over: its
            // children's directories go, in the background.
            if let Ok(old) = std::fs::read_dir(std::env::temp_dir()) {
                let mine = format!("{RUNTIME_PREFIX}{pid}-");
                old.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
                    .for_each(|e| remove_later(e.path()));
            }
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .and_then(|()| dir.canonicalize())
                .map_err(|e| {
                    format!(
                        "creating {}, where each program the server starts gets its own HOME: {e} (give the server a writable TMPDIR)",
                        dir.display()
                    )
                })
        })
        .as_ref()
        .map(PathBuf::as_path)
        .map_err(|e| io::Error::other(e.clone()))
}

/// The directory of one child of the server, its `HOME` and `TMPDIR`: no other child can
/// read or write it (Landlock), and it is removed with everything in it when dropped.
#[derive(Debug)]
pub struct ChildDir(PathBuf);

impl ChildDir {
    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ChildDir {
    fn drop(&mut self) {
        remove_later(std::mem::take(&mut self.0));
    }
}

/// Removes a directory tree on a thread of its own, never on the runtime's workers: a child
/// may leave a tree so deep or wide that removing it takes long or needs a deep stack (the
/// removal recurses once per level, without following links). A tree that cannot be removed
/// is left; its contents stay hidden from other children.
fn remove_later(dir: PathBuf) {
    static QUEUE: OnceLock<Option<std::sync::mpsc::SyncSender<PathBuf>>> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<PathBuf>(4096);
        std::thread::Builder::new()
            .name("quiver-rmdir".to_owned())
            // Virtual: only the pages a deep tree touches are used.
            .stack_size(256 << 20)
            .spawn(move || {
                for dir in rx {
                    if let Err(e) = std::fs::remove_dir_all(&dir)
                        && e.kind() != io::ErrorKind::NotFound
                    {
                        tracing::warn!(dir = %dir.display(), error = %e, "a child's directory could not be removed");
                    }
                }
            })
            .ok()
            .map(|_| tx)
    });
    match queue {
        // A full queue: this tree is left, hidden like the others.
        Some(tx) => {
            let _ = tx.try_send(dir);
        }
        None => tracing::warn!(dir = %dir.display(), "no thread to remove a child's directory"),
    }
}

/// A new directory for a child (`None` for a bridge's children, which share their container).
///
/// # Errors
/// The directory cannot be made (no writable `TMPDIR`).
pub fn child_dir() -> io::Result<Option<ChildDir>> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if policy().children == Children::OneProgram {
        return Ok(None);
    }
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = runtime_root()?.join(format!("child-{n}"));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(Some(ChildDir(dir)))
}

/// Makes `cmd` confine its process before it runs the program: with `private` (a
/// [`ChildDir`]), it may write only there, in its working directory and to devices of
/// `/dev`. Keep the returned ruleset until the process is spawned.
///
/// # Errors
/// The process may not start (no Landlock and strict mode; the message says why and what to
/// do), or its ruleset could not be built.
pub fn confine(cmd: &mut tokio::process::Command, private: Option<&Path>) -> io::Result<Option<OwnedFd>> {
    let cwd = cmd.as_std().get_current_dir().and_then(|d| {
        std::env::current_dir()
            .map(|here| here.join(d))
            .ok()?
            .canonicalize()
            .ok()
    });
    let Some(ruleset) = policy().ruleset(private, cwd.as_deref())? else {
        return Ok(None);
    };
    let fd = ruleset.as_raw_fd();
    let own_rights = policy().landlock.as_ref().map_or(0, |abi| fs_rights(*abi));
    // SAFETY: the closure runs in the forked child before exec and makes only raw system
    // calls (open, landlock_add_rule, close, prctl, landlock_restrict_self), which are
    // async-signal-safe; it allocates nothing (the path is a static C string, `attr` lives on
    // the stack, `last_os_error` holds the errno). `fd` stays open in the child: the parent
    // keeps `ruleset` until the spawn returns, and builds a new one for every spawn, so the
    // rule added here (on the shared ruleset) concerns this child alone.
    unsafe {
        cmd.pre_exec(move || {
            // Its own /proc/PID, where /proc/self leads (other processes' stay hidden).
            let own = libc::open(
                c"/proc/self".as_ptr(),
                libc::O_PATH | libc::O_CLOEXEC | libc::O_DIRECTORY,
            );
            if own >= 0 {
                let attr = PathBeneathAttr {
                    allowed_access: own_rights,
                    parent_fd: own,
                };
                libc::syscall(
                    libc::SYS_landlock_add_rule,
                    fd,
                    RULE_PATH_BENEATH,
                    std::ptr::from_ref(&attr),
                    0 as libc::c_uint,
                );
                libc::close(own);
            }
            if libc::prctl(
                libc::PR_SET_NO_NEW_PRIVS,
                1 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            ) != 0
                || libc::syscall(libc::SYS_landlock_restrict_self, fd, 0 as libc::c_uint) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(Some(ruleset))
}

fn add_rule(ruleset: &OwnedFd, path: &Path, rights: u64) -> io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let attr = PathBeneathAttr {
        allowed_access: rights,
        parent_fd: file.as_raw_fd(),
    };
    // SAFETY: `attr` is a live landlock_path_beneath_attr for the duration of the call, and
    // both descriptors are open.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            RULE_PATH_BENEATH,
            std::ptr::from_ref(&attr),
            0 as libc::c_uint,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `path` is a process's directory in `/proc` (`/proc/PID`).
fn is_process_dir(path: &Path) -> bool {
    path.parent() == Some(Path::new(PROC))
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A ruleset handling every filesystem right of `abi` that grants all of them except under
/// `hidden` and other processes' `/proc/PID` (their environment holds their secrets), where
/// only listing names remains. With `writable`, everywhere else only reading and executing
/// is granted, and every right under `writable`, on the devices of `/dev` and its terminals
/// (`/dev/shm` and `/dev/mqueue`, places every child could share, stay read-only). The
/// child's own `/proc/PID` is granted when it starts.
fn build_ruleset(abi: i32, hidden: &[PathBuf], writable: Option<&[PathBuf]>) -> io::Result<OwnedFd> {
    let all = fs_rights(abi);
    let elsewhere = if writable.is_some() {
        all & (FS_EXECUTE | FS_READ_FILE | FS_READ_DIR)
    } else {
        all
    };
    let attr = RulesetAttr {
        handled_access_fs: all,
        handled_access_net: 0,
        scoped: if abi >= 6 { SCOPE_SIGNAL } else { 0 },
    };
    // SAFETY: `attr` is a live landlock_ruleset_attr of the size passed; fields the kernel
    // does not know are zero (`scoped` only from ABI 6).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::from_ref(&attr),
            std::mem::size_of::<RulesetAttr>(),
            0 as libc::c_uint,
        )
    };
    let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::other("a ruleset descriptor out of range"))?;
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor and nothing else owns it.
    let ruleset = unsafe { OwnedFd::from_raw_fd(fd) };
    add_rule(&ruleset, Path::new("/"), FS_READ_DIR)?;
    let proc = Path::new(PROC);
    let ancestors: BTreeSet<&Path> = hidden
        .iter()
        .flat_map(|h| h.ancestors().skip(1))
        .chain(
            proc.is_dir()
                .then_some(proc)
                .into_iter()
                .flat_map(Path::ancestors),
        )
        .collect();
    for dir in &ancestors {
        // A directory that vanished, or an entry that cannot be read, gets no rule: what is
        // in it stays unreadable (the safe side), and the child still starts.
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries {
            let Ok(entry) = entry else {
                continue;
            };
            let path = entry.path();
            if hidden.contains(&path) || ancestors.contains(path.as_path()) || is_process_dir(&path) {
                continue;
            }
            // A link is followed when used, and the rights of its target apply.
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let rights = if meta.is_dir() {
                elsewhere
            } else if meta.file_type().is_symlink() {
                continue;
            } else {
                elsewhere & FILE_RIGHTS
            };
            // An entry that vanished or cannot take a rule stays unreadable: the safe side.
            let _ = add_rule(&ruleset, &path, rights);
        }
    }
    if let Some(writable) = writable {
        grant_devices(&ruleset, all);
        for dir in writable {
            add_rule(&ruleset, dir, all)?;
        }
    }
    Ok(ruleset)
}

/// Grants every right on the device files of `/dev` and on `/dev/pts` (terminals).
fn grant_devices(ruleset: &OwnedFd, all: u64) {
    let Ok(entries) = std::fs::read_dir("/dev") else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let ft = meta.file_type();
        let rights = if ft.is_char_device() {
            all & FILE_RIGHTS
        } else if ft.is_dir() && path.file_name() == Some("pts".as_ref()) {
            all
        } else {
            continue;
        };
        let _ = add_rule(ruleset, &path, rights);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(mode: Mode, hidden: &[&str], landlock: Result<i32, String>) -> Policy {
        Policy {
            mode,
            children: Children::Tenants,
            hidden: hidden.iter().map(PathBuf::from).collect(),
            landlock,
        }
    }

    #[test]
    fn without_landlock_children_are_refused_only_when_strict_and_something_is_hidden() {
        let none = || Err::<i32, _>("this kernel has no Landlock".to_owned());
        let why = policy(Mode::Strict, &["/run/secrets"], none()).refusal().unwrap();
        assert!(
            why.contains("no Landlock")
                && why.contains("/run/secrets")
                && why.contains("stdio.image")
                && why.contains("--child-isolation=best-effort"),
            "{why}"
        );
        assert_eq!(
            policy(Mode::BestEffort, &["/run/secrets"], none()).refusal(),
            None
        );
        // Nothing hidden, the server's children still have each other's environment and
        // files to keep from each other; a bridge's processes (one program) do not.
        let why = policy(Mode::Strict, &[], none()).refusal().unwrap();
        assert!(
            why.contains("every other program") && why.contains("best-effort"),
            "{why}"
        );
        let bridge = Policy {
            children: Children::OneProgram,
            ..policy(Mode::Strict, &[], none())
        };
        assert_eq!(bridge.refusal(), None);
        assert_eq!(policy(Mode::BestEffort, &[], none()).refusal(), None);
        assert_eq!(policy(Mode::Strict, &["/run/secrets"], Ok(1)).refusal(), None);
        assert_eq!(
            policy(Mode::Strict, &["/x"], none()).status()["children"],
            "refused"
        );
        assert_eq!(
            policy(Mode::BestEffort, &["/x"], none()).status()["children"],
            "unconfined"
        );
        assert_eq!(
            policy(Mode::Strict, &["/x"], Ok(3)).status()["children"],
            "confined"
        );
    }

    #[test]
    fn the_servers_children_never_see_the_upstream_sockets_a_bridges_may() {
        let server = Policy::to_hide(Children::Tenants, &[PathBuf::from("/x")]);
        for p in ["/run/secrets", "/var/run/secrets", UPSTREAM_SOCKETS, "/x"] {
            assert!(server.contains(&PathBuf::from(p)), "{p}: {server:?}");
        }
        let bridge = Policy::to_hide(Children::OneProgram, &[]);
        assert!(!bridge.contains(&PathBuf::from(UPSTREAM_SOCKETS)), "{bridge:?}");
        assert!(bridge.contains(&PathBuf::from("/run/secrets")));
    }

    #[test]
    fn only_process_directories_of_proc_are_hidden() {
        assert!(is_process_dir(Path::new("/proc/1")));
        assert!(is_process_dir(Path::new("/proc/40213")));
        for other in [
            "/proc/self",
            "/proc/sys",
            "/proc/cpuinfo",
            "/proc",
            "/x/12",
            "/proc/1/task",
        ] {
            assert!(!is_process_dir(Path::new(other)), "{other}");
        }
    }

    #[test]
    fn modes_parse() {
        assert_eq!("strict".parse(), Ok(Mode::Strict));
        assert_eq!("best-effort".parse(), Ok(Mode::BestEffort));
        assert!("off".parse::<Mode>().is_err());
    }

    #[test]
    fn rights_grow_with_the_abi() {
        assert_eq!(fs_rights(0), 0);
        assert_eq!(fs_rights(1) & FS_READ_FILE, FS_READ_FILE);
        assert!(fs_rights(1) < fs_rights(2) && fs_rights(2) < fs_rights(3) && fs_rights(3) < fs_rights(5));
        assert_eq!(fs_rights(7), fs_rights(5));
    }
    /// A volume as the kubelet writes it: `root/..TIMESTAMP/FILE`, `root/..data` linking to
    /// the timestamped directory and `root/FILE` linking into `..data`.
    fn swapped(root: &Path, version: &str, value: &str) {
        let dir = root.join(format!("..{version}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("token"), value).unwrap();
        let tmp = root.join("..data_tmp");
        std::os::unix::fs::symlink(format!("..{version}"), &tmp).unwrap();
        std::fs::rename(&tmp, root.join("..data")).unwrap();
        if std::fs::symlink_metadata(root.join("token")).is_err() {
            std::os::unix::fs::symlink("..data/token", root.join("token")).unwrap();
        }
    }

    #[test]
    fn a_file_in_a_rotated_volume_hides_the_whole_volume() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("vault");
        swapped(&root, "2026_11_26_one", "first");
        let p = Policy::hiding(Mode::Strict, Children::Tenants, &[root.join("token")]);
        let canonical_root = root.canonicalize().unwrap();
        assert!(p.hidden.contains(&canonical_root), "{:?}", p.hidden);
        // After a rotation the old directory is gone: the new value is inside what is hidden,
        // and a ruleset can still be built (a child still starts).
        swapped(&root, "2026_11_26_two", "second");
        std::fs::remove_dir_all(root.join("..2026_11_26_one")).unwrap();
        assert!(
            root.join("token")
                .canonicalize()
                .unwrap()
                .starts_with(&canonical_root)
        );
        if let Ok(abi) = landlock_abi() {
            build_ruleset(abi, &p.hidden, None).expect("a ruleset after the rotation");
        }
        // A plain file is hidden as itself.
        std::fs::write(base.path().join("plain"), "x").unwrap();
        let plain = Policy::hiding(Mode::Strict, Children::Tenants, &[base.path().join("plain")]);
        assert!(
            plain
                .hidden
                .contains(&base.path().join("plain").canonicalize().unwrap())
        );
    }

    #[test]
    fn a_directory_that_vanishes_does_not_stop_children() {
        let Ok(abi) = landlock_abi() else {
            // Building a ruleset needs the kernel's Landlock; the hidden-set logic is tested above.
            eprintln!("skipped: this kernel has no Landlock");
            return;
        };
        let base = tempfile::tempdir().unwrap();
        let gone = base.path().join("a/b/secret");
        std::fs::create_dir_all(&gone).unwrap();
        let hidden = vec![gone.canonicalize().unwrap()];
        std::fs::remove_dir_all(base.path().join("a")).unwrap();
        build_ruleset(abi, &hidden, None).expect("a ruleset although a hidden path's parent vanished");
    }

    #[test]
    fn a_working_directory_opens_nothing_hidden_and_nothing_of_proc() {
        let hidden = [PathBuf::from("/run/secrets"), PathBuf::from("/quiver/run")];
        for ok in ["/data", "/srv/app", "/quiver/tmp/x"] {
            assert!(cwd_grantable(Path::new(ok), &hidden), "{ok}");
        }
        for no in [
            "/",
            "/run",
            "/run/secrets",
            "/run/secrets/x",
            "/quiver",
            "/proc",
            "/proc/1",
            "/proc/self/cwd",
        ] {
            assert!(!cwd_grantable(Path::new(no), &hidden), "{no}");
        }
    }
}
