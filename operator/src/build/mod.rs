//! Build: the desired child objects of an McpServer, as pure functions of the spec, the
//! rendered ToolSet and the operator's defaults, written as typed k8s-openapi structs (a field
//! of the wrong type is a compile error). No API client here; this is where most unit tests live.

mod confine;
mod expose;
mod governance;
mod monitor;
mod netpol;
mod pod;
mod serving;
mod sidecar;
mod sign_in;
mod tracing;
mod tuning;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec, MetricSpec,
    MetricTarget, ResourceMetricSource,
};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use kube::api::DynamicObject;

use crate::crd::McpServer;

pub use confine::{check as check_pod, consent as service_account_consent, named_service_account};
pub use expose::http_route_resource;
pub use governance::problems as redis_problems;
pub use monitor::{
    label_pair_problem as service_monitor_label_problem, label_problems as service_monitor_label_problems,
    service_monitor_resource,
};
pub use netpol::ApiServer;
pub use pod::server_args_problems;
pub use serving::{
    STATE_KEY_ANNOTATION, STATE_KEY_BYTES, STATE_KEY_ENV, log_level_problems, state_key_secret,
    state_key_secret_name, trusted_proxy_problems, wants_service_monitor, with_state_key,
};
pub use sidecar::{check as check_sidecars, served as served_upstream};
pub use sign_in::problems as sign_in_problems;
pub use tuning::{SAFE_SYSCTLS, pinned, sysctls, unsafe_in_safe_list};

/// Key of the ToolSet in the tools ConfigMap.
pub const TOOLS_KEY: &str = "tools.yaml";
/// MCP port of the container.
pub const MCP_PORT: i32 = 8080;
/// Admin port of the container (metrics, probes, status).
pub const ADMIN_PORT: i32 = 9090;
/// Label on every child (and the selector of the operator's owned-object watches).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "quiver-operator");
/// Target CPU utilization of the HPA when the spec names none.
const DEFAULT_CPU_UTILIZATION: i32 = 70;

/// Operator-wide defaults.
#[derive(Debug, Clone)]
pub struct Defaults {
    /// Server image when the spec names none.
    pub server_image: String,
    /// Pull policy when the spec names none.
    pub image_pull_policy: String,
    /// Whether an McpServer whose `monitoring.serviceMonitor` is unset gets a ServiceMonitor.
    pub service_monitors: bool,
    /// Labels of every ServiceMonitor (an McpServer's own `monitoring.serviceMonitorLabels`
    /// add to them).
    pub service_monitor_labels: std::collections::BTreeMap<String, String>,
    /// The first half of catalog names (`--catalog-prefix`), also the names of server cards.
    pub catalog_prefix: String,
}

/// The rendered, validated ToolSet (made by `crate::render::render`): what the children
/// are built from.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The document written to the ConfigMap (key `tools.yaml`): JSON, one tool per line.
    pub yaml: String,
    /// Content hash, as the server reports it on `/status`.
    pub hash: String,
    /// Tools served.
    pub tool_count: usize,
    /// Secrets the tools read (`{{secret.NAME.KEY}}`): the pods' Role grants exactly these.
    pub secrets: BTreeSet<String>,
    /// Upstream MCP servers the ToolSet imports tools from.
    pub upstream_count: usize,
    /// Whether some upstream or OpenAPI source pins its tool definitions (`pin: warn | enforce`).
    pub pinned: bool,
}

/// Every child object of one McpServer.
#[derive(Debug, Clone)]
pub struct Children {
    /// The rendered ToolSet.
    pub config_map: ConfigMap,
    /// Identity of the pods.
    pub service_account: ServiceAccount,
    /// get/list/watch of the tools ConfigMap only.
    pub role: Role,
    /// Binds the Role to the ServiceAccount.
    pub role_binding: RoleBinding,
    /// The ConfigMap the pods keep pinned tool definitions in, when an upstream pins them:
    /// metadata only (its data is the server's and `kubectl quiver approve`'s).
    pub pins: Option<ConfigMap>,
    /// The server pods.
    pub deployment: Deployment,
    /// MCP and metrics ports.
    pub service: Service,
    /// When autoscaling is set.
    pub hpa: Option<HorizontalPodAutoscaler>,
    /// When more than one replica may run.
    pub pdb: Option<PodDisruptionBudget>,
    /// When `monitoring.serviceMonitor` is set (applied only if its CRD exists).
    pub service_monitor: Option<DynamicObject>,
    /// When `networkPolicy` is set.
    pub network_policy: Option<k8s_openapi::api::networking::v1::NetworkPolicy>,
    /// When `ingress` is set.
    pub ingress: Option<k8s_openapi::api::networking::v1::Ingress>,
    /// When `httpRoute` is set (applied only if its CRD exists).
    pub http_route: Option<DynamicObject>,
}

/// The McpServer has no name or uid, so its children cannot carry an owner reference (an
/// object read from the API server always has both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("McpServer without a name or uid")]
pub struct Unowned;

/// A name the API server accepts for a Secret that a template can also spell (no `.`).
pub fn is_dns_label(n: &str) -> bool {
    (1..=253).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !n.starts_with('-')
        && !n.ends_with('-')
}

/// Names of the children.
pub fn tools_config_map_name(server: &str) -> String {
    format!("{server}-tools")
}

/// The ConfigMap of an McpServer's pinned tool definitions.
pub fn pins_config_map_name(server: &str) -> String {
    format!("{server}-pins")
}

/// Labels on every child; the first two select the pods.
pub fn labels(name: &str) -> BTreeMap<String, String> {
    let mut l = selector(name);
    l.insert(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned());
    l
}

/// The pod selector.
pub fn selector(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "quiver-server".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), name.to_owned()),
    ])
}

/// The selector as a string (status.selector, for the scale subresource).
pub fn selector_string(name: &str) -> String {
    selector(name)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn meta(mcp: &McpServer, name: String, owner: &OwnerReference) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: mcp.metadata.namespace.clone(),
        labels: Some(labels(mcp.metadata.name.as_deref().unwrap_or_default())),
        owner_references: Some(vec![owner.clone()]),
        ..ObjectMeta::default()
    }
}

fn strings(items: &[&str]) -> Option<Vec<String>> {
    Some(items.iter().map(|s| (*s).to_owned()).collect())
}

fn pod_selector(name: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(selector(name)),
        match_expressions: None,
    }
}

/// Builds every child.
///
/// # Errors
/// [`Unowned`] when the McpServer has no name or uid.
pub fn build(
    mcp: &McpServer,
    rendered: &Rendered,
    defaults: &Defaults,
    api_server: &ApiServer,
) -> Result<Children, Unowned> {
    let owner = mcp.controller_owner_ref(&()).ok_or(Unowned)?;
    let name = mcp.metadata.name.clone().ok_or(Unowned)?;
    let ns = mcp.metadata.namespace.clone().unwrap_or_default();
    let cm_name = tools_config_map_name(&name);
    let reader = format!("{name}-config-reader");

    let config_map = ConfigMap {
        metadata: meta(mcp, cm_name.clone(), &owner),
        data: Some(BTreeMap::from([(TOOLS_KEY.to_owned(), rendered.yaml.clone())])),
        ..ConfigMap::default()
    };
    let service_account = ServiceAccount {
        metadata: meta(mcp, name.clone(), &owner),
        // The server container mounts a projected token itself; other containers get none.
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    };
    let pins_name = rendered.pinned.then(|| pins_config_map_name(&name));
    let mut rules = reader_rules(mcp, rendered, &cm_name);
    if let Some(p) = &pins_name {
        rules.push(PolicyRule {
            api_groups: strings(&[""]),
            resources: strings(&["configmaps"]),
            resource_names: Some(vec![p.clone()]),
            verbs: vec!["get".into(), "list".into(), "watch".into(), "update".into()],
            non_resource_urls: None,
        });
    }
    let role = Role {
        metadata: meta(mcp, reader.clone(), &owner),
        rules: Some(rules),
    };
    let pins = pins_name.as_ref().map(|p| ConfigMap {
        metadata: meta(mcp, p.clone(), &owner),
        ..ConfigMap::default()
    });
    let role_binding = RoleBinding {
        metadata: meta(mcp, reader.clone(), &owner),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "Role".to_owned(),
            name: reader,
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: pod::service_account(mcp, &name).to_owned(),
            namespace: Some(ns.clone()),
            api_group: None,
        }]),
    };
    let mut deployment = pod::deployment(mcp, &name, &ns, &cm_name, defaults);
    if let Some(p) = &pins_name {
        pod::add_arg(&mut deployment, format!("--pins=configmap:{ns}/{p}"));
    }
    for arg in server_card_args(mcp, &defaults.catalog_prefix) {
        pod::add_arg(&mut deployment, arg);
    }
    deployment.metadata = meta(mcp, name.clone(), &owner);
    let service = Service {
        metadata: meta(mcp, name.clone(), &owner),
        spec: Some(service_spec(mcp, &name, defaults)),
        status: None,
    };
    let hpa = hpa(mcp, &name, meta(mcp, name.clone(), &owner));
    let pdb = pdb(mcp, &name, meta(mcp, name.clone(), &owner));
    let service_monitor = wants_service_monitor(mcp, defaults).then(|| {
        let mut m = meta(mcp, name.clone(), &owner);
        monitor::add_labels(&mut m, mcp, defaults);
        monitor::service_monitor(&name, m)
    });
    let network_policy = netpol::network_policy(mcp, &name, api_server, meta(mcp, name.clone(), &owner));
    let ingress = expose::ingress(mcp, &name, meta(mcp, name.clone(), &owner));
    let http_route = expose::http_route(mcp, &name, meta(mcp, name.clone(), &owner));
    Ok(Children {
        ingress,
        http_route,
        network_policy,
        config_map,
        service_account,
        role,
        role_binding,
        pins,
        deployment,
        service,
        hpa,
        pdb,
        service_monitor,
    })
}

/// The server's flags of `catalog.serverCard`: the card's name (`PREFIX.NAMESPACE/NAME`, as
/// in the catalog), description, website and the public URLs only (the card must not name
/// in-cluster addresses). None when the card is off or the name does not fit.
pub fn server_card_args(mcp: &McpServer, prefix: &str) -> Vec<String> {
    let Some(c) = mcp.spec.catalog.as_ref().filter(|c| c.server_card == Some(true)) else {
        return Vec::new();
    };
    let (Some(name), Some(ns)) = (mcp.metadata.name.as_deref(), mcp.metadata.namespace.as_deref()) else {
        return Vec::new();
    };
    let card = crate::catalog::entry::registry_name(prefix, ns, name);
    if !crate::catalog::entry::valid_name(&card) {
        return Vec::new();
    }
    let mut args = vec![format!("--server-card-name={card}")];
    if let Some(d) = c
        .description
        .as_deref()
        .filter(|d| !d.chars().any(char::is_control))
    {
        args.push(format!("--server-card-description={d}"));
    }
    if let Some(w) = c
        .website_url
        .as_deref()
        .filter(|w| !w.chars().any(char::is_control))
    {
        args.push(format!("--server-card-website-url={w}"));
    }
    args.extend(
        crate::catalog::entry::public_urls(mcp)
            .into_iter()
            .map(|u| format!("--server-card-url={u}")),
    );
    args
}

/// The rules of the pods' Role: reading the tools ConfigMap and the ConfigMaps of CA bundles
/// (`tls.caConfigMap`), and exactly the Secrets the tools, client auth and upstream sign-in
/// read.
fn reader_rules(mcp: &McpServer, rendered: &Rendered, cm_name: &str) -> Vec<PolicyRule> {
    let read = |resource: &str, names: Vec<String>| PolicyRule {
        api_groups: strings(&[""]),
        resources: strings(&[resource]),
        resource_names: Some(names),
        verbs: vec!["get".to_owned(), "list".to_owned(), "watch".to_owned()],
        non_resource_urls: None,
    };
    let (maps, mut secrets): (BTreeSet<String>, BTreeSet<String>) = rendered
        .secrets
        .iter()
        .cloned()
        .partition(|n| n.starts_with(quiver_model::config::CONFIG_MAP_PREFIX));
    let mut config_maps = vec![cm_name.to_owned()];
    config_maps.extend(
        maps.iter()
            .filter_map(|n| n.strip_prefix(quiver_model::config::CONFIG_MAP_PREFIX))
            .chain(pod::issuer_ca(mcp))
            .filter(|n| *n != cm_name)
            .map(str::to_owned),
    );
    config_maps.sort();
    config_maps.dedup();
    let mut rules = vec![read("configmaps", config_maps)];
    // An empty resourceNames list would grant every Secret of the namespace, so no rule is
    // written when there are none.
    secrets.extend(pod::bearer_secret(mcp).map(|r| r.name.clone()));
    secrets.extend(pod::token_exchange(mcp).map(|x| x.client_secret_ref.name.clone()));
    secrets.extend(sign_in::secret_names(mcp).map(str::to_owned));
    if !secrets.is_empty() {
        rules.push(read("secrets", secrets.into_iter().collect()));
    }
    rules
}

/// The HorizontalPodAutoscaler, when autoscaling is set.
fn hpa(mcp: &McpServer, name: &str, metadata: ObjectMeta) -> Option<HorizontalPodAutoscaler> {
    let a = mcp.spec.autoscaling.as_ref()?;
    Some(HorizontalPodAutoscaler {
        metadata,
        spec: Some(HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".to_owned()),
                kind: "Deployment".to_owned(),
                name: name.to_owned(),
            },
            min_replicas: Some(a.min_replicas),
            max_replicas: a.max_replicas,
            metrics: Some(vec![MetricSpec {
                type_: "Resource".to_owned(),
                resource: Some(ResourceMetricSource {
                    name: "cpu".to_owned(),
                    target: MetricTarget {
                        type_: "Utilization".to_owned(),
                        average_utilization: Some(
                            a.target_cpu_utilization.unwrap_or(DEFAULT_CPU_UTILIZATION),
                        ),
                        ..MetricTarget::default()
                    },
                }),
                ..MetricSpec::default()
            }]),
            behavior: None,
        }),
        status: None,
    })
}

/// The PodDisruptionBudget, when more than one replica may run.
fn pdb(mcp: &McpServer, name: &str, metadata: ObjectMeta) -> Option<PodDisruptionBudget> {
    let may_have_many = mcp.spec.autoscaling.is_some() || mcp.spec.replicas.unwrap_or(1) > 1;
    may_have_many.then(|| PodDisruptionBudget {
        metadata,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(pod_selector(name)),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    })
}

fn service_spec(mcp: &McpServer, name: &str, defaults: &Defaults) -> ServiceSpec {
    let options = mcp.spec.service.clone().unwrap_or_default();
    let expose_admin = options.expose_admin || wants_service_monitor(mcp, defaults);
    let port = |name: &str, port: i32, app_protocol: Option<&str>| ServicePort {
        name: Some(name.to_owned()),
        port,
        target_port: Some(IntOrString::String(name.to_owned())),
        protocol: Some("TCP".to_owned()),
        app_protocol: app_protocol.map(str::to_owned),
        node_port: None,
    };
    let mut spec = ServiceSpec {
        type_: Some(options.type_.unwrap_or_else(|| "ClusterIP".to_owned())),
        selector: Some(selector(name)),
        ports: Some(if expose_admin {
            vec![
                port("mcp", options.port.unwrap_or(MCP_PORT), Some("http")),
                port("admin", ADMIN_PORT, None),
            ]
        } else {
            vec![port("mcp", options.port.unwrap_or(MCP_PORT), Some("http"))]
        }),
        ..ServiceSpec::default()
    };
    serving::affinity(mcp, &mut spec);
    spec
}

#[cfg(test)]
mod tests;
