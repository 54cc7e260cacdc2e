//! The server Deployment: pod template, container, probes and security settings.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, HTTPGetAction, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    SELinuxOptions, SeccompProfile, Sysctl, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::confine::restricted;
use super::governance::termination_grace;
use super::tuning::{pinned, resources, sysctls};
use super::{ADMIN_PORT, Defaults, MCP_PORT, labels, selector};
use crate::crd::{Allocator, McpServer, PodVolume, SecretKey};

/// How long a stopping server keeps serving with readiness off: endpoint removal reaches
/// kube-proxy on every node within a second or two; 5 s leaves room for a loaded node.
const SHUTDOWN_DELAY: &str = "5s";
/// The server's whole shutdown after SIGTERM (delay included), and the pod's grace period
/// above it: in-flight calls get 15 s after the delay before the kubelet would kill.
const SHUTDOWN_GRACE: &str = "20s";
const TERMINATION_GRACE_SECONDS: i64 = 30;

/// The server's scratch space (its `TMPDIR`), where each program it starts (exec tools,
/// stdio upstreams) gets a private `HOME` of its own; the root filesystem is read-only.
const SCRATCH_DIR: &str = "/quiver/tmp";
const SCRATCH_VOLUME: &str = "quiver-tmp";
const SCRATCH_SIZE: &str = "256Mi";

/// UID and GID of the server process (the distroless "nonroot" user).
const NONROOT: i64 = 65532;

fn some_unless_empty<T: Default + PartialEq>(v: T) -> Option<T> {
    (v != T::default()).then_some(v)
}

fn probe(path: &str, period: i32, failures: i32, timeout: Option<i32>) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String("admin".to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: timeout,
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

fn port(name: &str, number: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: number,
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        value_from: None,
    }
}

/// Adds `arg` to the server container's arguments.
pub(super) fn add_arg(d: &mut Deployment, arg: String) {
    let containers = d
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .map(|p| p.containers.iter_mut());
    if let Some(c) = containers.into_iter().flatten().find(|c| c.name == "server") {
        c.args.get_or_insert_with(Vec::new).push(arg);
    }
}

fn args(mcp: &McpServer, ns: &str, cm_name: &str, cpus: Option<u32>) -> Vec<String> {
    let workers = mcp
        .spec
        .tuning
        .as_ref()
        .and_then(|t| t.worker_threads)
        .filter(|w| *w > 0)
        .or(cpus);
    let mut args = vec![
        format!("--config=configmap:{ns}/{cm_name}"),
        format!("--listen=0.0.0.0:{MCP_PORT}"),
        format!("--admin-listen=0.0.0.0:{ADMIN_PORT}"),
        "--log-format=json".to_owned(),
    ];
    if pinned(mcp) {
        args.push("--pin-workers".into());
    }
    if let Some(w) = workers {
        args.push(format!("--worker-threads={w}"));
    }
    if mcp.spec.tuning.as_ref().and_then(|t| t.per_core_listeners) == Some(true) {
        args.push("--per-core-listeners".into());
    }
    if !mcp.spec.allowed_origins.is_empty() {
        args.push(format!("--allowed-origin={}", mcp.spec.allowed_origins.join(",")));
    }
    if !mcp.spec.trusted_proxies.is_empty() {
        args.push(format!(
            "--trusted-proxies={}",
            mcp.spec.trusted_proxies.join(",")
        ));
    }
    // Secrets are fetched by name as the served ToolSet references them; the Role lists the names.
    args.push(format!("--secrets=kube:{ns}"));
    if let Some(r) = bearer_secret(mcp) {
        args.push(format!("--auth-tokens-secret={}.{}", r.name, r.key));
    }
    if let Some(o) = mcp.spec.auth.as_ref().and_then(|a| a.oidc.as_ref()) {
        args.push(format!("--auth-issuer={}", o.issuer));
        args.push(format!("--auth-audience={}", o.audience));
        args.extend(o.jwks_uri.as_ref().map(|u| format!("--auth-jwks-url={u}")));
        args.extend(o.resource.as_ref().map(|u| format!("--auth-resource={u}")));
        args.extend(
            o.groups_claim
                .as_ref()
                .map(|c| format!("--auth-groups-claim={c}")),
        );
        args.extend(
            o.ca_config_map
                .as_ref()
                .map(|c| format!("--auth-issuer-ca-configmap={c}")),
        );
    }
    if let Some(x) = token_exchange(mcp) {
        args.push(format!("--token-exchange-client-id={}", x.client_id));
        args.push(format!(
            "--token-exchange-client-secret={}.{}",
            x.client_secret_ref.name, x.client_secret_ref.key
        ));
        args.extend(
            x.token_endpoint
                .as_ref()
                .map(|u| format!("--token-exchange-endpoint={u}")),
        );
    }
    args.extend(super::sign_in::args(mcp));
    args.extend(super::confine::token_mounts(mcp).map(|path| format!("--hide-from-children={path}")));
    args.extend(super::governance::args(mcp));
    args
}

/// The ConfigMap of the issuer's CAs, when OIDC auth names one.
pub(super) fn issuer_ca(mcp: &McpServer) -> Option<&str> {
    mcp.spec.auth.as_ref()?.oidc.as_ref()?.ca_config_map.as_deref()
}

/// The token-exchange client of `identity.mode: exchange`, when set.
pub(super) fn token_exchange(mcp: &McpServer) -> Option<&crate::crd::TokenExchange> {
    mcp.spec.auth.as_ref()?.token_exchange.as_ref()
}

/// The Secret key holding client tokens, when bearer auth is on.
pub(super) fn bearer_secret(mcp: &McpServer) -> Option<&SecretKey> {
    mcp.spec.auth.as_ref()?.bearer_token_secret_ref.as_ref()
}

/// The ServiceAccount the pods run as: the spec's, or the one Quiver creates (named after
/// the McpServer).
pub(super) fn service_account<'a>(mcp: &'a McpServer, name: &'a str) -> &'a str {
    mcp.spec
        .pod_template
        .as_ref()
        .and_then(|o| o.service_account_name.as_deref())
        .unwrap_or(name)
}

fn server_image(mcp: &McpServer, defaults: &Defaults) -> (String, String) {
    (
        mcp.spec
            .image
            .clone()
            .unwrap_or_else(|| defaults.server_image.clone()),
        mcp.spec
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| defaults.image_pull_policy.clone()),
    )
}

fn container(
    mcp: &McpServer,
    ns: &str,
    cm_name: &str,
    defaults: &Defaults,
    extra_mounts: Vec<VolumeMount>,
) -> Container {
    let spec = &mcp.spec;
    let overrides = spec.pod_template.clone().unwrap_or_default();
    let (resources, cpus) = resources(mcp);
    // The server binary carries both allocators and picks one from this variable at start.
    let allocator = match spec.tuning.as_ref().map(|t| t.allocator).unwrap_or_default() {
        Allocator::Jemalloc => "jemalloc",
        Allocator::System => "system",
    };
    let (image, pull_policy) = server_image(mcp, defaults);
    // Named in every audit record (`mcpServer`), so records of many servers in one log
    // pipeline tell where they come from.
    let instance = format!("{ns}/{}", mcp.metadata.name.as_deref().unwrap_or_default());
    Container {
        name: "server".to_owned(),
        image: Some(image),
        image_pull_policy: Some(pull_policy),
        command: Some(vec!["/usr/local/bin/quiver-server".to_owned()]),
        args: Some(args(mcp, ns, cm_name, cpus)),
        ports: Some(vec![port("mcp", MCP_PORT), port("admin", ADMIN_PORT)]),
        // The spec's variables first: where a name repeats, the last one (Quiver's) wins.
        // RUST_LOG is `spec.logLevel`, else the spec's own, else `info`.
        env: Some(
            overrides
                .env
                .iter()
                .cloned()
                .chain(super::serving::rust_log(mcp))
                .chain([
                    env("QUIVER_ALLOCATOR", allocator),
                    // After SIGTERM: keep serving, with readiness off and every response asking its
                    // client to reconnect, until the pod has left the Service's endpoints.
                    env("QUIVER_SHUTDOWN_DELAY", SHUTDOWN_DELAY),
                    env("QUIVER_SHUTDOWN_GRACE", SHUTDOWN_GRACE),
                    env("TMPDIR", SCRATCH_DIR),
                    env("QUIVER_INSTANCE", &instance),
                ])
                .chain(super::governance::env(mcp))
                .chain(super::tracing::env(mcp, ns))
                .collect(),
        ),
        env_from: some_unless_empty(overrides.env_from.clone()),
        volume_mounts: some_unless_empty(
            overrides
                .volume_mounts
                .iter()
                .cloned()
                .chain(extra_mounts)
                .chain(super::governance::volumes(mcp).into_iter().map(|(_, m)| m))
                .chain([VolumeMount {
                    name: SCRATCH_VOLUME.to_owned(),
                    mount_path: SCRATCH_DIR.to_owned(),
                    ..VolumeMount::default()
                }])
                // The ServiceAccount token: in this container only, not in sidecars.
                .chain([super::confine::token_mount()])
                .collect::<Vec<_>>(),
        ),
        resources: Some(resources),
        readiness_probe: Some(probe("/readyz", 2, 3, Some(2))),
        liveness_probe: Some(probe("/healthz", 10, 3, Some(2))),
        startup_probe: Some(probe("/healthz", 1, 30, None)),
        security_context: Some(restricted()),
        ..Container::default()
    }
}

/// What the server would refuse at start in the arguments and literal environment rendered
/// for its container (`deployment`'s first), parsed by the server's own command line: a value
/// the McpServer accepts but the server does not is reported on the McpServer, instead of
/// crashing its pods.
pub fn server_args_problems(deployment: &Deployment) -> Vec<String> {
    let Some(server) = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
    else {
        return vec!["the Deployment has no server container".to_owned()];
    };
    let args = server.args.clone().unwrap_or_default();
    let env = server
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?)));
    match quiver_flags::parse_serve(&args, env) {
        Ok(_) => Vec::new(),
        Err(e) => vec![format!("the server would refuse to start: {e}")],
    }
}

/// The pod's volumes: the spec's, the upstreams', the Redis TLS files', the scratch space
/// and the server container's API access.
fn pod_volumes(mcp: &McpServer, spec: &[PodVolume], upstreams: Vec<Volume>) -> Vec<Volume> {
    spec.iter()
        .map(super::confine::volume)
        .chain(upstreams)
        .chain(super::governance::volumes(mcp).into_iter().map(|(v, _)| v))
        .chain([super::sidecar::sized_empty_dir(SCRATCH_VOLUME, SCRATCH_SIZE)])
        .chain([super::confine::token_volume()])
        .collect()
}

/// The Deployment of quiver-server pods serving the ConfigMap `cm_name`.
pub(super) fn deployment(
    mcp: &McpServer,
    name: &str,
    ns: &str,
    cm_name: &str,
    defaults: &Defaults,
) -> Deployment {
    let spec = &mcp.spec;
    let overrides = spec.pod_template.clone().unwrap_or_default();
    let security = overrides.security.clone().unwrap_or_default();
    let mut pod_labels = overrides.labels.clone();
    pod_labels.extend(labels(name));
    let (image, pull_policy) = server_image(mcp, defaults);
    let upstreams = super::sidecar::pod_parts(mcp, &image, &pull_policy);
    let mut containers = vec![container(mcp, ns, cm_name, defaults, upstreams.server_mounts)];
    containers.extend(upstreams.sidecars);
    let sysctls: Vec<Sysctl> = sysctls(mcp)
        .into_iter()
        .map(|(name, value)| Sysctl { name, value })
        .collect();
    let pod_spec = PodSpec {
        termination_grace_period_seconds: Some(termination_grace(mcp, TERMINATION_GRACE_SECONDS)),
        service_account_name: Some(service_account(mcp, name).to_owned()),
        // No token in every container: the server container mounts its own (confine::token_volume).
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(security.run_as_user.unwrap_or(NONROOT)),
            run_as_group: Some(security.run_as_group.unwrap_or(NONROOT)),
            fs_group: Some(security.fs_group.unwrap_or(NONROOT)),
            supplemental_groups: some_unless_empty(security.supplemental_groups.clone()),
            seccomp_profile: Some(match &security.seccomp_localhost_profile {
                Some(p) => SeccompProfile {
                    type_: "Localhost".to_owned(),
                    localhost_profile: Some(p.clone()),
                },
                None => SeccompProfile {
                    type_: "RuntimeDefault".to_owned(),
                    localhost_profile: None,
                },
            }),
            se_linux_options: security.se_linux_options.as_ref().map(|s| SELinuxOptions {
                type_: s.type_.clone(),
                level: s.level.clone(),
                role: None,
                user: None,
            }),
            sysctls: some_unless_empty(sysctls),
            ..PodSecurityContext::default()
        }),
        init_containers: upstreams.init.map(|c| vec![c]),
        containers,
        node_selector: some_unless_empty(overrides.node_selector),
        tolerations: some_unless_empty(overrides.tolerations),
        affinity: overrides.affinity,
        image_pull_secrets: some_unless_empty(overrides.image_pull_secrets),
        priority_class_name: overrides.priority_class_name,
        topology_spread_constraints: some_unless_empty(overrides.topology_spread_constraints),
        volumes: some_unless_empty(pod_volumes(mcp, &overrides.volumes, upstreams.volumes)),
        ..PodSpec::default()
    };
    Deployment {
        metadata: ObjectMeta::default(),
        spec: Some(DeploymentSpec {
            // The HPA owns the replica count when autoscaling is on.
            replicas: spec.autoscaling.is_none().then(|| spec.replicas.unwrap_or(1)),
            selector: LabelSelector {
                match_labels: Some(selector(name)),
                match_expressions: None,
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: some_unless_empty(overrides.annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}
