//! Confinement of the server pods: what an McpServer author may put into them stays within the
//! Pod Security "restricted" profile and away from Quiver's own mounts, and the pods run as a
//! ServiceAccount other than their own only with its owner's consent. The CRD schema refuses
//! the same things at admission; these checks hold for objects stored before it did.

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, KeyToPath,
    ObjectFieldSelector, ProjectedVolumeSource, SecurityContext, ServiceAccount,
    ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};

use crate::crd::{ALLOWED_MCPSERVERS, McpServer, PROFILE_ANNOTATIONS, PodVolume, SELINUX_TYPES};

/// Where the server container finds its ServiceAccount token, CA and namespace (where
/// in-cluster clients read them).
pub const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The projected volume holding them.
pub const TOKEN_VOLUME: &str = "quiver-api-access";
/// Lifetime of the projected token; the kubelet renews it at 80% of that, and the server's
/// client re-reads the file every minute.
pub const TOKEN_SECONDS: i64 = 3600;
/// Directories no author mount may cover (the token, and `/var/run` as `/run` in images
/// where one links to the other; Quiver's upstream binaries and sockets).
const RESERVED_DIRS: [&str; 3] = [
    "/var/run/secrets/kubernetes.io",
    "/run/secrets/kubernetes.io",
    "/quiver",
];
/// Volume names Quiver adds itself start with this (the token, the upstreams' binary,
/// socket and `/tmp` volumes).
const RESERVED_VOLUME_PREFIX: &str = "quiver-";

/// A container of the restricted Pod Security profile: non-root, no privilege escalation,
/// no capabilities, a read-only root filesystem.
pub fn restricted() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: None,
        }),
        ..SecurityContext::default()
    }
}

/// The projected volume of the server container's API access: a bounded token of the pod's
/// ServiceAccount, the cluster's CA bundle and the namespace.
pub fn token_volume() -> Volume {
    Volume {
        name: TOKEN_VOLUME.to_owned(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o444),
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".to_owned(),
                        expiration_seconds: Some(TOKEN_SECONDS),
                        audience: None,
                    }),
                    ..VolumeProjection::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".to_owned(),
                        items: Some(vec![KeyToPath {
                            key: "ca.crt".to_owned(),
                            path: "ca.crt".to_owned(),
                            mode: None,
                        }]),
                        optional: None,
                    }),
                    ..VolumeProjection::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".to_owned(),
                            field_ref: Some(ObjectFieldSelector {
                                api_version: Some("v1".to_owned()),
                                field_path: "metadata.namespace".to_owned(),
                            }),
                            ..DownwardAPIVolumeFile::default()
                        }]),
                    }),
                    ..VolumeProjection::default()
                },
            ]),
        }),
        ..Volume::default()
    }
}

/// The mount of [`token_volume`], in the server container only.
pub fn token_mount() -> VolumeMount {
    VolumeMount {
        name: TOKEN_VOLUME.to_owned(),
        mount_path: TOKEN_DIR.to_owned(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

/// The pod volume of a spec volume: only the kinds [`PodVolume`] can hold are copied.
pub fn volume(v: &PodVolume) -> Volume {
    Volume {
        name: v.name.clone(),
        config_map: v.config_map.clone(),
        secret: v.secret.clone(),
        empty_dir: v.empty_dir.clone(),
        projected: v.projected.clone(),
        downward_api: v.downward_api.clone(),
        persistent_volume_claim: v.persistent_volume_claim.clone(),
        ephemeral: v.ephemeral.clone(),
        csi: v.csi.clone(),
        ..Volume::default()
    }
}

fn sources(v: &PodVolume) -> usize {
    [
        v.config_map.is_some(),
        v.secret.is_some(),
        v.empty_dir.is_some(),
        v.projected.is_some(),
        v.downward_api.is_some(),
        v.persistent_volume_claim.is_some(),
        v.ephemeral.is_some(),
        v.csi.is_some(),
    ]
    .into_iter()
    .filter(|s| *s)
    .count()
}

/// `path` without `.` components, repeated or trailing `/`; `None` when it is not absolute or
/// climbs with `..`.
fn normalized(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            p => parts.push(p),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

fn covers(mount: &str, dir: &str) -> bool {
    // A mount at a parent of `dir` hides it too.
    mount == dir
        || mount.starts_with(&format!("{dir}/"))
        || dir.starts_with(&format!("{mount}/"))
        || mount == "/"
}

/// The podTemplate's volume mounts: absolute, clear of Quiver's own directories, of a
/// declared volume, with no propagation.
fn check_mounts(mcp: &McpServer, names: &std::collections::BTreeSet<&str>, problems: &mut Vec<String>) {
    let Some(o) = &mcp.spec.pod_template else {
        return;
    };
    for (i, m) in o.volume_mounts.iter().enumerate() {
        let at = format!("spec.podTemplate.volumeMounts[{i}]");
        match normalized(&m.mount_path) {
            None => problems.push(format!("{at}.mountPath: an absolute path without `..`")),
            Some(p) => {
                if let Some(dir) = RESERVED_DIRS.iter().find(|d| covers(&p, d)) {
                    problems.push(format!(
                        "{at}.mountPath: {p} would cover {dir}, where Quiver mounts the server's own files"
                    ));
                }
            }
        }
        if m.mount_path.contains(',') && token_mounts(mcp).any(|p| p == m.mount_path) {
            // The server reads its hidden paths as one comma-separated list.
            problems.push(format!(
                "{at}.mountPath: a ServiceAccount token is mounted at a path without `,`"
            ));
        }
        for (field, sub) in [("subPath", &m.sub_path), ("subPathExpr", &m.sub_path_expr)] {
            if sub
                .as_deref()
                .is_some_and(|p| p.starts_with('/') || p.split('/').any(|c| c == ".."))
            {
                problems.push(format!(
                    "{at}.{field}: a relative path inside the volume, without `..`"
                ));
            }
        }
        if m.mount_propagation.as_deref().is_some_and(|p| p != "None") {
            problems.push(format!(
                "{at}.mountPropagation: only None (other modes need a privileged container)"
            ));
        }
        if !names.contains(m.name.as_str()) {
            problems.push(format!(
                "{at}.name: no volume `{}` in spec.podTemplate.volumes",
                m.name
            ));
        }
    }
}

/// Problems of what the spec puts into the pod beyond the restricted profile or over Quiver's
/// own mounts, each located at its field.
pub fn check(mcp: &McpServer) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(o) = &mcp.spec.pod_template {
        let mut names = std::collections::BTreeSet::new();
        for (i, v) in o.volumes.iter().enumerate() {
            let at = format!("spec.podTemplate.volumes[{i}]");
            if sources(v) != 1 {
                problems.push(format!(
                    "{at}: set exactly one of configMap, secret, emptyDir, projected, downwardAPI, persistentVolumeClaim, ephemeral, csi (the kinds the restricted Pod Security profile allows)"
                ));
            }
            if v.name.starts_with(RESERVED_VOLUME_PREFIX) {
                problems.push(format!(
                    "{at}.name: `{}` is a volume Quiver adds (names starting with {RESERVED_VOLUME_PREFIX} are Quiver's)",
                    v.name
                ));
            } else if !names.insert(v.name.as_str()) {
                problems.push(format!("{at}.name: `{}` is used twice", v.name));
            }
        }
        check_mounts(mcp, &names, &mut problems);
        for (k, v) in &o.annotations {
            if PROFILE_ANNOTATIONS.iter().any(|p| k.starts_with(p))
                && v != "runtime/default"
                && !v.starts_with("localhost/")
            {
                problems.push(format!(
                    "spec.podTemplate.annotations.{k}: only runtime/default or a localhost/ profile (the restricted Pod Security profile)"
                ));
            }
        }
        if o.priority_class_name
            .as_deref()
            .is_some_and(|p| p.starts_with("system-"))
        {
            problems.push(
                "spec.podTemplate.priorityClassName: the system- PriorityClasses are for cluster components"
                    .to_owned(),
            );
        }
        if let Some(t) = o
            .security
            .as_ref()
            .and_then(|s| s.se_linux_options.as_ref())
            .and_then(|s| s.type_.as_deref())
            .filter(|t| !SELINUX_TYPES.contains(t))
        {
            problems.push(format!(
                "spec.podTemplate.security.seLinuxOptions.type: `{t}` is outside the restricted Pod Security profile (one of {})",
                SELINUX_TYPES.join(", ")
            ));
        }
    }
    for k in mcp
        .spec
        .ingress
        .iter()
        .flat_map(|i| i.annotations.keys())
        .filter(|k| raw_config_annotation(k))
    {
        problems.push(format!(
            "spec.ingress.annotations.{k}: snippet and raw configuration annotations inject configuration into the shared ingress controller and are refused"
        ));
    }
    problems
}

/// Where the server container mounts a ServiceAccount token of the author's own (a projected
/// volume with a `serviceAccountToken` source): the pod's identity, which the server's
/// children (exec tools, stdio upstreams) must not read, like the token Quiver mounts.
pub fn token_mounts(mcp: &McpServer) -> impl Iterator<Item = &str> {
    let template = mcp.spec.pod_template.as_ref();
    let volumes = template.map_or(&[][..], |t| t.volumes.as_slice());
    let mounts = template.map_or(&[][..], |t| t.volume_mounts.as_slice());
    mounts
        .iter()
        .filter(move |m| {
            volumes.iter().any(|v| {
                v.name == m.name
                    && v.projected.as_ref().is_some_and(|p| {
                        p.sources
                            .iter()
                            .flatten()
                            .any(|s| s.service_account_token.is_some())
                    })
            })
        })
        .map(|m| m.mount_path.as_str())
}

/// Whether an Ingress annotation key puts raw configuration into the ingress controller,
/// whatever the vendor: a key holding `snippet` (ingress-nginx `*-snippet`, nginx.org
/// `*-snippets`, HAProxy `*-config-snippet`) or naming a raw configuration section
/// (`config-*` as haproxy-ingress's `config-backend`, `*-config-*`, `*-config`), in any case.
/// The CRD's rule ([`crate::crd::RAW_CONFIG_ANNOTATIONS`]) is the same class.
pub fn raw_config_annotation(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("snippet")
        || k.starts_with("config-")
        || k.contains("/config-")
        || k.contains("-config-")
        || k.ends_with("-config")
}

/// The ServiceAccount the spec names, if any (read in the dereference step).
pub fn named_service_account(mcp: &McpServer) -> Option<&str> {
    mcp.spec.pod_template.as_ref()?.service_account_name.as_deref()
}

/// Whether the ServiceAccount `sa` (as read, `None` when it does not exist) lets `mcp` run as
/// it: `Err` names what is missing.
///
/// # Errors
/// The problem to report when the spec names a ServiceAccount without its owner's consent.
pub fn consent(mcp: &McpServer, sa: Option<&ServiceAccount>) -> Result<(), String> {
    let Some(wanted) = named_service_account(mcp) else {
        return Ok(());
    };
    let name = mcp.metadata.name.as_deref().unwrap_or_default();
    let Some(sa) = sa else {
        return Err(format!(
            "spec.podTemplate.serviceAccountName: ServiceAccount {wanted} does not exist"
        ));
    };
    let allowed = sa
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ALLOWED_MCPSERVERS))
        .is_some_and(|list| list.split(',').map(str::trim).any(|n| n == "*" || n == name));
    if allowed {
        Ok(())
    } else {
        Err(format!(
            "spec.podTemplate.serviceAccountName: ServiceAccount {wanted} does not let this McpServer run as it (its owner annotates it {ALLOWED_MCPSERVERS}: \"{name}\" or \"*\")"
        ))
    }
}
