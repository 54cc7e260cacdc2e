//! The value types of the server's flags: each parses its text and nothing more, so the
//! operator can check what it renders with exactly the server's rules.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;

use quiver_model::spec::context::{SecretRef, valid_config_map_name};

/// Records the audit queue holds by default (`--audit-queue`).
pub const DEFAULT_AUDIT_QUEUE: u32 = 8192;
/// Most records the audit queue may hold: its places are allocated at start (about 350
/// bytes each, so 23 MB at this bound; a million would not fit the pod's default memory
/// limit).
pub const MAX_AUDIT_QUEUE: u32 = 65_536;
/// (limit, caller) budgets kept in memory by default (`--limits-max-keys`; about 64 bytes
/// each).
pub const DEFAULT_MAX_LIMIT_KEYS: usize = 100_000;

/// Where the tool config comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A YAML file, or a directory of `*.yaml`/`*.yml` files (e.g. a mounted ConfigMap).
    File(PathBuf),
    /// A ConfigMap watched through the Kubernetes API; its `*.yaml`/`*.yml` keys are merged.
    ConfigMap {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

impl FromStr for Source {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("file:") {
            if p.is_empty() {
                return Err("file: needs a path".into());
            }
            return Ok(Self::File(PathBuf::from(p)));
        }
        if let Some(r) = s.strip_prefix("configmap:") {
            return match r.split_once('/') {
                Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                    Ok(Self::ConfigMap {
                        namespace: ns.to_owned(),
                        name: name.to_owned(),
                    })
                }
                _ => Err(format!("`{s}`: expected configmap:NAMESPACE/NAME")),
            };
        }
        Err(format!("`{s}`: expected file:PATH or configmap:NAMESPACE/NAME"))
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(p) => write!(f, "file:{}", p.display()),
            Self::ConfigMap { namespace, name } => write!(f, "configmap:{namespace}/{name}"),
        }
    }
}

/// Where secret values come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// Secrets of this namespace, watched through the Kubernetes API.
    Kube(String),
    /// `PATH/NAME/KEY` files.
    Dir(PathBuf),
    /// `QUIVER_SECRET_<NAME>_<KEY>` environment variables.
    Env,
}

impl FromStr for SecretSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            Some(("kube", ns)) if !ns.is_empty() => Ok(Self::Kube(ns.to_owned())),
            Some(("dir", p)) if !p.is_empty() => Ok(Self::Dir(PathBuf::from(p))),
            None if s == "env" => Ok(Self::Env),
            _ => Err(format!("`{s}`: expected kube:NAMESPACE, dir:PATH or env")),
        }
    }
}

/// A `NAME.KEY` flag value naming one secret value (e.g. `--auth-tokens-secret`).
pub fn parse_ref(s: &str) -> Result<SecretRef, String> {
    match s.split_once('.') {
        Some((name, key)) if !name.is_empty() && !key.is_empty() => Ok(SecretRef {
            name: name.to_owned(),
            key: key.to_owned(),
        }),
        _ => Err(format!("`{s}`: expected SECRET.KEY")),
    }
}

/// A network: an address and how many of its leading bits count (`10.0.0.0/8`,
/// `fd00::/8`; a bare address is the whole length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{}`: use an address or ADDRESS/BITS, e.g. 10.0.0.0/8", clip(s));
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let net: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) => b
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(bad)?,
        };
        Ok(Self {
            net: masked(net, bits),
            bits,
        })
    }
}

/// At most 64 characters of `s`, for an error message.
fn clip(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// `ip` with all but its first `bits` bits cleared.
fn masked(ip: IpAddr, bits: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let keep = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & keep).into())
        }
        IpAddr::V6(v6) => {
            let keep = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & keep).into())
        }
    }
}

impl Cidr {
    /// Whether `ip` is in this network (an IPv4 client seen on an IPv6 socket as
    /// `::ffff:a.b.c.d` is in the IPv4 networks).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.net.is_ipv4() && masked(ip, self.bits) == self.net
    }
}

/// `--child-isolation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChildIsolation {
    /// Refuse to start a child that cannot be confined while there is something to hide.
    #[default]
    Strict,
    /// Start it anyway (with a warning at start and on `/status`).
    BestEffort,
}

impl FromStr for ChildIsolation {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "strict" => Ok(Self::Strict),
            "best-effort" => Ok(Self::BestEffort),
            _ => Err(format!("`{s}`: expected strict or best-effort")),
        }
    }
}

/// What a call gets when its record cannot be queued.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OnFull {
    /// The call runs; its record is dropped (counted in `quiver_audit_dropped_total`).
    #[default]
    Drop,
    /// The call is refused before it runs (`-32004`, counted in
    /// `quiver_audit_refused_total`): every call that ran has its record.
    Refuse,
}

/// Where audit records go (`--audit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditSink {
    /// The process's standard output (the logs are on standard error).
    Stdout,
    /// A file, appended to.
    File(PathBuf),
}

impl FromStr for AuditSink {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "stdout" => Ok(Self::Stdout),
            _ => match s.strip_prefix("file:") {
                Some(p) if !p.is_empty() => Ok(Self::File(p.into())),
                _ => Err(format!("`{s}`: use stdout or file:PATH")),
            },
        }
    }
}

/// The McpServer a server runs for (`--instance NAMESPACE/NAME`), named in every audit
/// record so that records from many servers in one log pipeline tell where they come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The namespace.
    pub namespace: String,
    /// The McpServer's name.
    pub name: String,
}

impl FromStr for Instance {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (namespace, name) = s
            .split_once('/')
            .ok_or_else(|| "expected NAMESPACE/NAME".to_owned())?;
        // Kubernetes object names: a namespace is a DNS label, an McpServer's name a subdomain.
        let object_name = valid_config_map_name;
        if !(object_name(namespace) && namespace.len() <= 63 && !namespace.contains('.')) {
            return Err("the namespace must be a DNS label (a-z, 0-9, '-', at most 63)".into());
        }
        if !object_name(name) {
            return Err("the name must be a DNS subdomain (a-z, 0-9, '-', '.', at most 253)".into());
        }
        Ok(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

/// What Redis being unreachable (or slow) means for a shared limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailMode {
    /// Count the limit on this replica instead (each replica then allows the whole rate).
    Open,
    /// Refuse the call (a retry hint of one second).
    Closed,
}
