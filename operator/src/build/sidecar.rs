//! Upstream MCP servers run from an image (`spec.upstreams[].stdio.image`): each becomes a
//! sidecar container of that image running `quiver-server bridge` (copied from the server
//! image by an init container onto a volume every sidecar mounts read-only) in front of its
//! `command`, and the served ToolSet reaches it through a Unix socket on a volume of that
//! upstream alone. The server's supervision (a pool of processes, restarts with backoff)
//! works through the socket: each connection is a fresh process of the program.
//!
//! Isolation between upstreams: each sidecar writes only to volumes of its own (its socket
//! directory and its `/tmp`); the socket volume is mounted in that sidecar and, read-only, in
//! the server container, so no other sidecar can reach the socket and nothing in the server
//! container can replace it. The bridge serves only a client that presents the token it
//! writes next to the socket (which the server's children cannot read: see the server's
//! sandbox).

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, ResourceRequirements, SecretKeySelector, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use quiver_model::config::upstream::{StdioSpec, UpstreamSpec};

use super::confine::restricted;
use crate::crd::McpServer;

/// Where the copy of quiver-server goes (mounted read-only in the sidecars).
const BIN_DIR: &str = "/quiver/bin";
/// Under which each upstream's socket directory is mounted (`RUN_DIR/NAME`, in the server
/// and that upstream's sidecar).
const RUN_DIR: &str = "/quiver/run";
const BIN_VOLUME: &str = "quiver-bin";
/// Prefix of an upstream's socket volume; the rest is the upstream's name.
const RUN_VOLUME_PREFIX: &str = "quiver-s-";
/// Prefix of an upstream's `/tmp` volume; the rest is the upstream's name.
const TMP_VOLUME_PREFIX: &str = "quiver-t-";
/// The socket's file name in an upstream's socket directory.
const SOCKET_FILE: &str = "bridge.sock";
/// Prefix of a sidecar's container name; the rest is the upstream's name.
const CONTAINER_PREFIX: &str = "upstream-";
/// Longest upstream name that still makes a container name and volume names (63 characters).
const MAX_NAME: usize = 63 - CONTAINER_PREFIX.len();
const _: () = assert!(
    RUN_VOLUME_PREFIX.len() <= CONTAINER_PREFIX.len() && TMP_VOLUME_PREFIX.len() <= CONTAINER_PREFIX.len()
);

fn imaged(mcp: &McpServer) -> impl Iterator<Item = (&UpstreamSpec, &StdioSpec, &str)> {
    mcp.spec.upstreams.iter().filter_map(|u| {
        let s = u.stdio.as_ref()?;
        Some((u, s, s.image.as_deref()?))
    })
}

/// The socket directory of an image upstream (its name is a DNS label: see [`check`]).
fn run_dir(name: &str) -> String {
    format!("{RUN_DIR}/{name}")
}

/// The socket of an image upstream.
fn socket(name: &str) -> String {
    format!("{}/{SOCKET_FILE}", run_dir(name))
}

/// Whether an upstream name can name a directory, a container and volumes as it is (the
/// server's compiler refuses other names too; these are never rewritten, so two upstreams
/// can never share a directory or a volume).
fn safe_name(n: &str) -> bool {
    n.len() <= MAX_NAME && super::is_dns_label(n)
}

/// Problems of the image upstreams of `mcp` that the server's compiler cannot see (it only
/// sees their socket form).
pub fn check(mcp: &McpServer) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, u) in mcp.spec.upstreams.iter().enumerate() {
        let Some(s) = u.stdio.as_ref().filter(|s| s.image.is_some()) else {
            continue;
        };
        let at = format!("spec.upstreams[{i}].stdio");
        if s.image
            .as_deref()
            .is_some_and(|img| img.trim().is_empty() || img.len() > 512)
        {
            problems.push(format!("{at}.image: must name an image (at most 512 characters)"));
        }
        if !safe_name(&u.name) {
            problems.push(format!(
                "spec.upstreams[{i}].name: at most {MAX_NAME} characters of a-z 0-9 - for an upstream with an image (it names a container, volumes and a directory)"
            ));
        }
        if s.command.is_empty() {
            problems.push(format!("{at}.command: the program to run in the image"));
        }
        if s.command.iter().any(|a| a.contains('\0')) {
            problems.push(format!("{at}.command: arguments cannot hold NUL"));
        }
        if s.cwd
            .as_ref()
            .is_some_and(|c| !c.starts_with('/') || c.contains('\0'))
        {
            problems.push(format!("{at}.cwd: an absolute directory path"));
        }
        if s.socket.is_some() {
            problems.push(format!(
                "{at}.socket: set by the operator for an upstream with an image"
            ));
        }
        for (k, v) in &s.env {
            if !valid_env_name(k) {
                problems.push(format!(
                    "{at}.env.{k}: not an environment variable name Kubernetes accepts (letters, digits, `_`, `-`, `.`; not starting with a digit)"
                ));
            }
            if env_value(v).is_err() {
                problems.push(format!(
                    "{at}.env.{k}: in a sidecar a value is literal text or exactly one `{{{{secret.NAME.KEY}}}}`"
                ));
            }
        }
    }
    // The pod template's own volumes and mounts are kept off Quiver's by confine::check.
    problems
}

fn valid_env_name(k: &str) -> bool {
    !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Kubernetes expands `$(VAR)` in a container's args and env values: `$$` keeps a `$`.
fn literal(s: &str) -> String {
    s.replace('$', "$$")
}

/// An env value of a sidecar: literal text, or one Secret key (`Err` for anything else).
fn env_value(v: &str) -> Result<EnvVar, ()> {
    let mut var = EnvVar::default();
    if !v.contains("{{") {
        var.value = Some(literal(v));
        return Ok(var);
    }
    let inner = v
        .trim()
        .strip_prefix("{{")
        .and_then(|r| r.strip_suffix("}}"))
        .ok_or(())?
        .trim();
    match inner.split('.').collect::<Vec<_>>().as_slice() {
        ["secret", name, key]
            if super::is_dns_label(name)
                && !key.is_empty()
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) =>
        {
            var.value_from = Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: (*name).to_owned(),
                    key: (*key).to_owned(),
                    // A missing key leaves the variable unset: the upstream reports what it
                    // lacks, and the rest of the pod (the server) still starts.
                    optional: Some(true),
                }),
                ..EnvVarSource::default()
            });
            Ok(var)
        }
        _ => Err(()),
    }
}

/// The upstream as the served ToolSet declares it: an image upstream connects to its
/// sidecar's socket; the others are unchanged.
pub fn served(u: &UpstreamSpec) -> UpstreamSpec {
    let Some(s) = u.stdio.as_ref().filter(|s| s.image.is_some()) else {
        return u.clone();
    };
    UpstreamSpec {
        stdio: Some(StdioSpec {
            command: Vec::new(),
            env: Default::default(),
            cwd: None,
            socket: Some(socket(&u.name)),
            processes: s.processes,
            image: None,
        }),
        ..u.clone()
    }
}

fn mount(volume: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: volume.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    sized_empty_dir(name, "64Mi")
}

/// An `emptyDir` volume of at most `size`.
pub(super) fn sized_empty_dir(name: &str, size: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: None,
            size_limit: Some(Quantity(size.to_owned())),
        }),
        ..Volume::default()
    }
}

/// Requests and limits of a sidecar: equal when the pod's CPUs are pinned (a Guaranteed
/// pod needs every container so), small requests and a memory cap otherwise.
fn resources(pinned: bool) -> ResourceRequirements {
    let q = |cpu: &str, mem: &str| {
        [("cpu", cpu), ("memory", mem)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())))
            .collect()
    };
    if pinned {
        ResourceRequirements {
            requests: Some(q("250m", "256Mi")),
            limits: Some(q("250m", "256Mi")),
            ..ResourceRequirements::default()
        }
    } else {
        ResourceRequirements {
            requests: Some(q("50m", "64Mi")),
            limits: Some(
                [("memory".to_owned(), Quantity("512Mi".to_owned()))]
                    .into_iter()
                    .collect(),
            ),
            ..ResourceRequirements::default()
        }
    }
}

/// What the image upstreams add to the pod.
#[derive(Debug, Default)]
pub struct PodParts {
    /// Copies quiver-server onto the binary volume.
    pub init: Option<Container>,
    /// One per image upstream.
    pub sidecars: Vec<Container>,
    /// The binary volume, and each upstream's socket and `/tmp` volumes.
    pub volumes: Vec<Volume>,
    /// Mounted in the server container: each upstream's socket directory, read-only.
    pub server_mounts: Vec<VolumeMount>,
}

/// The containers and volumes of `mcp`'s image upstreams; `server_image` runs the init
/// container (it carries the quiver-server binary).
pub fn pod_parts(mcp: &McpServer, server_image: &str, pull_policy: &str) -> PodParts {
    let pinned = super::tuning::pinned(mcp);
    let mut volumes = vec![empty_dir(BIN_VOLUME)];
    let mut server_mounts = Vec::new();
    let sidecars: Vec<Container> = imaged(mcp)
        .map(|(u, s, image)| {
            let run = format!("{RUN_VOLUME_PREFIX}{}", u.name);
            let tmp = format!("{TMP_VOLUME_PREFIX}{}", u.name);
            volumes.extend([empty_dir(&run), empty_dir(&tmp)]);
            // The server only connects: read-only, so nothing in its container (its own
            // children included) can put another socket or token there.
            server_mounts.push(mount(&run, &run_dir(&u.name), true));
            let mut args = vec![
                "bridge".to_owned(),
                "--socket".to_owned(),
                socket(&u.name),
                "--max-processes".to_owned(),
                s.processes.unwrap_or(1).max(1).to_string(),
                "--".to_owned(),
            ];
            args.extend(s.command.iter().map(|a| literal(a)));
            let env: Vec<EnvVar> = s
                .env
                .iter()
                .filter_map(|(k, v)| {
                    let mut e = env_value(v).ok()?;
                    e.name.clone_from(k);
                    Some(e)
                })
                .collect();
            Container {
                name: format!("{CONTAINER_PREFIX}{}", u.name),
                image: Some(image.to_owned()),
                command: Some(vec![format!("{BIN_DIR}/quiver-server")]),
                args: Some(args),
                env: (!env.is_empty()).then_some(env),
                working_dir: s.cwd.clone(),
                volume_mounts: Some(vec![
                    mount(BIN_VOLUME, BIN_DIR, true),
                    mount(&run, &run_dir(&u.name), false),
                    mount(&tmp, "/tmp", false),
                ]),
                resources: Some(resources(pinned)),
                security_context: Some(restricted()),
                ..Container::default()
            }
        })
        .collect();
    if sidecars.is_empty() {
        return PodParts::default();
    }
    PodParts {
        init: Some(Container {
            name: "install-quiver".to_owned(),
            image: Some(server_image.to_owned()),
            image_pull_policy: Some(pull_policy.to_owned()),
            command: Some(vec!["/usr/local/bin/quiver-server".to_owned()]),
            args: Some(vec!["install".to_owned(), BIN_DIR.to_owned()]),
            volume_mounts: Some(vec![mount(BIN_VOLUME, BIN_DIR, false)]),
            resources: Some(resources(pinned)),
            security_context: Some(restricted()),
            ..Container::default()
        }),
        sidecars,
        volumes,
        server_mounts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_env_is_literal_or_one_secret_key() {
        assert_eq!(env_value("plain").unwrap().value.as_deref(), Some("plain"));
        assert_eq!(
            env_value("cost $(HOME)").unwrap().value.as_deref(),
            Some("cost $$(HOME)")
        );
        assert!(env_value("{{secret.a.b/c}}").is_err());
        assert!(valid_env_name("GITHUB_TOKEN") && !valid_env_name("9LIVES") && !valid_env_name("A=B"));
        let s = env_value("{{ secret.db-creds.dsn }}").unwrap();
        let r = s.value_from.unwrap().secret_key_ref.unwrap();
        assert_eq!((r.name.as_str(), r.key.as_str()), ("db-creds", "dsn"));
        for bad in [
            "Bearer {{secret.a.b}}",
            "{{name}}",
            "{{secret.Not_Dns.k}}",
            "{{secret.a}}",
            "{{secret.a.b}}{{secret.c.d}}",
        ] {
            assert!(env_value(bad).is_err(), "{bad}");
        }
    }
}
