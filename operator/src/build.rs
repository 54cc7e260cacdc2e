//! Build: the desired child objects of an McpServer, as pure functions of the spec, the
//! rendered ToolSet and the operator's defaults. No API client here; this is where most
//! unit tests live.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::crd::{Allocator, McpServer, Profile};
use crate::render::Rendered;

/// Key of the ToolSet in the tools ConfigMap.
pub const TOOLS_KEY: &str = "tools.yaml";
/// MCP port of the container.
pub const MCP_PORT: i32 = 8080;
/// Admin port of the container (metrics, probes, status).
pub const ADMIN_PORT: i32 = 9090;
/// Safe sysctls (the kubelet allows them without configuration, Kubernetes 1.29+).
pub const SAFE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// Operator-wide defaults.
#[derive(Debug, Clone)]
pub struct Defaults {
    /// Server image when the spec names none.
    pub server_image: String,
    /// Pull policy when the spec names none.
    pub image_pull_policy: String,
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
    /// The server pods.
    pub deployment: Deployment,
    /// MCP and metrics ports.
    pub service: Service,
    /// When autoscaling is set.
    pub hpa: Option<HorizontalPodAutoscaler>,
    /// When more than one replica may run.
    pub pdb: Option<PodDisruptionBudget>,
}

/// Names of the children.
pub fn tools_config_map_name(server: &str) -> String {
    format!("{server}-tools")
}

fn typed<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("built object must match its type: {e}"))
}

/// Labels on every child; the first two select the pods.
pub fn labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "quiver-server".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), name.to_owned()),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "quiver-operator".to_owned(),
        ),
    ])
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

/// The sysctls of a profile, overridden by the spec's.
pub fn sysctls(mcp: &McpServer) -> BTreeMap<String, String> {
    let Some(t) = &mcp.spec.tuning else {
        return BTreeMap::new();
    };
    let mut out: BTreeMap<String, String> = match t.profile {
        Profile::Balanced => BTreeMap::new(),
        Profile::Latency => BTreeMap::from([
            ("net.ipv4.tcp_keepalive_time".into(), "60".into()),
            ("net.ipv4.tcp_keepalive_intvl".into(), "10".into()),
            ("net.ipv4.tcp_keepalive_probes".into(), "3".into()),
        ]),
        Profile::Throughput => BTreeMap::from([
            ("net.ipv4.ip_local_port_range".into(), "1024 65000".into()),
            ("net.ipv4.tcp_fin_timeout".into(), "15".into()),
        ]),
    };
    out.extend(t.sysctls.clone());
    out.extend(t.unsafe_sysctls.clone());
    out
}

/// Sysctls under `tuning.sysctls` that are not in the kubelet's safe set.
pub fn unsafe_in_safe_list(mcp: &McpServer) -> Vec<String> {
    mcp.spec
        .tuning
        .iter()
        .flat_map(|t| t.sysctls.keys())
        .filter(|k| !SAFE_SYSCTLS.contains(&k.as_str()))
        .cloned()
        .collect()
}

/// Whether the pods run with exclusive CPUs.
pub fn pinned(mcp: &McpServer) -> bool {
    mcp.spec
        .tuning
        .as_ref()
        .and_then(|t| t.cpu_pinning)
        .unwrap_or(false)
}

/// Builds every child.
pub fn build(mcp: &McpServer, rendered: &Rendered, defaults: &Defaults) -> Children {
    let name = mcp.metadata.name.clone().unwrap_or_default();
    let ns = mcp.metadata.namespace.clone().unwrap_or_default();
    let owner = mcp
        .controller_owner_ref(&())
        .unwrap_or_else(|| panic!("an McpServer from the API has a name and uid"));
    let cm_name = tools_config_map_name(&name);
    let reader = format!("{name}-config-reader");

    let config_map = ConfigMap {
        metadata: meta(mcp, cm_name.clone(), &owner),
        data: Some(BTreeMap::from([(TOOLS_KEY.to_owned(), rendered.yaml.clone())])),
        ..ConfigMap::default()
    };
    let service_account = ServiceAccount {
        metadata: meta(mcp, name.clone(), &owner),
        automount_service_account_token: Some(true),
        ..ServiceAccount::default()
    };
    let mut role: Role = typed(json!({
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [cm_name], "verbs": ["get", "list", "watch"]}]
    }));
    role.metadata = meta(mcp, reader.clone(), &owner);
    let mut role_binding: RoleBinding = typed(json!({
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": reader},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
    }));
    role_binding.metadata = meta(mcp, reader, &owner);

    let deployment = deployment(mcp, &name, &cm_name, &ns, defaults, &owner);
    let port = mcp.spec.service.as_ref().and_then(|s| s.port).unwrap_or(MCP_PORT);
    let mut service: Service = typed(json!({
        "spec": {
            "type": mcp.spec.service.as_ref().and_then(|s| s.type_.clone()).unwrap_or_else(|| "ClusterIP".into()),
            "selector": selector(&name),
            "ports": [
                {"name": "mcp", "port": port, "targetPort": "mcp", "protocol": "TCP", "appProtocol": "http"},
                {"name": "admin", "port": ADMIN_PORT, "targetPort": "admin", "protocol": "TCP"},
            ],
        }
    }));
    service.metadata = meta(mcp, name.clone(), &owner);

    let hpa = mcp.spec.autoscaling.as_ref().map(|a| {
        let mut h: HorizontalPodAutoscaler = typed(json!({
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                "minReplicas": a.min_replicas,
                "maxReplicas": a.max_replicas,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": a.target_cpu_utilization.unwrap_or(70)}}}],
            }
        }));
        h.metadata = meta(mcp, name.clone(), &owner);
        h
    });
    let may_have_many = mcp.spec.autoscaling.is_some() || mcp.spec.replicas.unwrap_or(1) > 1;
    let pdb = may_have_many.then(|| {
        let mut p: PodDisruptionBudget =
            typed(json!({"spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(&name)}}}));
        p.metadata = meta(mcp, name.clone(), &owner);
        p
    });
    Children {
        config_map,
        service_account,
        role,
        role_binding,
        deployment,
        service,
        hpa,
        pdb,
    }
}

fn deployment(
    mcp: &McpServer,
    name: &str,
    cm_name: &str,
    ns: &str,
    defaults: &Defaults,
    owner: &OwnerReference,
) -> Deployment {
    let spec = &mcp.spec;
    let tuning = spec.tuning.clone().unwrap_or_default();
    let pin = pinned(mcp);
    let mut resources = spec
        .resources
        .clone()
        .map(|r| serde_json::to_value(r).unwrap_or_default())
        .unwrap_or_else(
            || json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}),
        );
    let mut cpus = None;
    if pin {
        // Guaranteed QoS: requests = limits for every resource, whole CPUs.
        let limits = resources.get("limits").cloned().unwrap_or_else(|| json!({}));
        let mut limits = limits.as_object().cloned().unwrap_or_default();
        limits.entry("memory").or_insert_with(|| json!("256Mi"));
        cpus = tuning.cpus.or_else(|| {
            limits
                .get("cpu")
                .and_then(Value::as_str)
                .and_then(|c| c.parse::<u32>().ok())
        });
        if let Some(n) = cpus {
            limits.insert("cpu".into(), json!(n.to_string()));
        }
        resources = json!({"requests": limits.clone(), "limits": limits});
    }
    let workers = tuning.worker_threads.filter(|w| *w > 0).or(cpus);
    let mut args = vec![
        format!("--config=configmap:{ns}/{cm_name}"),
        format!("--listen=0.0.0.0:{MCP_PORT}"),
        format!("--admin-listen=0.0.0.0:{ADMIN_PORT}"),
        "--log-format=json".to_owned(),
    ];
    if pin {
        args.push("--pin-workers".into());
    }
    if let Some(w) = workers {
        args.push(format!("--worker-threads={w}"));
    }
    if !spec.allowed_origins.is_empty() {
        args.push(format!("--allowed-origin={}", spec.allowed_origins.join(",")));
    }
    // The server binary carries both allocators and picks one from this variable at start.
    let allocator = match tuning.allocator {
        Allocator::Jemalloc => "jemalloc",
        Allocator::System => "system",
    };
    let sysctls: Vec<Value> = sysctls(mcp)
        .into_iter()
        .map(|(name, value)| json!({"name": name, "value": value}))
        .collect();
    let overrides = spec.pod_template.clone().unwrap_or_default();
    let mut pod_labels = overrides.labels.clone();
    pod_labels.extend(labels(name));
    let probe = |path: &str, period: i32| json!({"httpGet": {"path": path, "port": "admin"}, "periodSeconds": period, "timeoutSeconds": 2, "failureThreshold": 3});
    let mut pod_spec = json!({
        "serviceAccountName": name,
        "automountServiceAccountToken": true,
        "enableServiceLinks": false,
        "securityContext": {
            "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
            "sysctls": sysctls,
        },
        "containers": [{
            "name": "server",
            "image": spec.image.clone().unwrap_or_else(|| defaults.server_image.clone()),
            "imagePullPolicy": spec.image_pull_policy.clone().unwrap_or_else(|| defaults.image_pull_policy.clone()),
            "command": ["/usr/local/bin/quiver-server"],
            "args": args,
            "ports": [
                {"name": "mcp", "containerPort": MCP_PORT, "protocol": "TCP"},
                {"name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP"},
            ],
            "env": [{"name": "RUST_LOG", "value": "info"}, {"name": "QUIVER_ALLOCATOR", "value": allocator}],
            "resources": resources,
            "readinessProbe": probe("/readyz", 2),
            "livenessProbe": probe("/healthz", 10),
            "startupProbe": {"httpGet": {"path": "/healthz", "port": "admin"}, "periodSeconds": 1, "failureThreshold": 30},
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "runAsNonRoot": true,
                "capabilities": {"drop": ["ALL"]},
            },
        }],
    });
    if !overrides.node_selector.is_empty() {
        pod_spec["nodeSelector"] = json!(overrides.node_selector);
    }
    if !overrides.tolerations.is_empty() {
        pod_spec["tolerations"] = serde_json::to_value(&overrides.tolerations).unwrap_or_default();
    }
    if let Some(a) = &overrides.affinity {
        pod_spec["affinity"] = serde_json::to_value(a).unwrap_or_default();
    }
    let mut d = json!({
        "spec": {
            "selector": {"matchLabels": selector(name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": overrides.annotations},
                "spec": pod_spec,
            },
        }
    });
    if spec.autoscaling.is_none() {
        d["spec"]["replicas"] = json!(spec.replicas.unwrap_or(1));
    }
    let mut deployment: Deployment = typed(d);
    deployment.metadata = meta(mcp, name.to_owned(), owner);
    deployment
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::render;

    pub(crate) fn mcp(yaml: &str) -> McpServer {
        let mut m: McpServer = serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("{e}"));
        m.metadata.namespace = Some("ns".into());
        m.metadata.uid = Some("uid-1".into());
        m
    }

    fn children(yaml: &str) -> Children {
        let m = mcp(yaml);
        let r = render(&m, &vec![None; m.spec.tools_from.len()]).unwrap_or_else(|e| panic!("{e:?}"));
        build(
            &m,
            &r,
            &Defaults {
                server_image: "quiver-server:test".into(),
                image_pull_policy: "IfNotPresent".into(),
            },
        )
    }

    const BASIC: &str = r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: calc}
spec:
  tools:
    - {name: add, handler: {builtin: add}}
"#;

    #[test]
    fn basic_children_are_owned_and_restricted() {
        let c = children(BASIC);
        let d = serde_json::to_value(&c.deployment).unwrap();
        assert_eq!(d["metadata"]["ownerReferences"][0]["kind"], "McpServer");
        assert_eq!(d["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(d["spec"]["replicas"], 1);
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], "calc");
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
        let ctr = &pod["containers"][0];
        assert_eq!(ctr["image"], "quiver-server:test");
        assert_eq!(ctr["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(ctr["securityContext"]["capabilities"]["drop"][0], "ALL");
        assert!(
            ctr["args"]
                .as_array()
                .unwrap()
                .contains(&json!("--config=configmap:ns/calc-tools"))
        );
        assert_eq!(ctr["readinessProbe"]["httpGet"]["path"], "/readyz");
        let role = serde_json::to_value(&c.role).unwrap();
        assert_eq!(role["rules"][0]["resourceNames"], json!(["calc-tools"]));
        assert_eq!(role["rules"][0]["verbs"], json!(["get", "list", "watch"]));
        assert!(c.hpa.is_none() && c.pdb.is_none());
        let tools = &c.config_map.data.as_ref().unwrap()[TOOLS_KEY];
        assert!(tools.contains("builtin: add"), "{tools}");
    }

    #[test]
    fn cpu_pinning_makes_guaranteed_pods_with_pinned_workers() {
        let c = children(
            r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: fast}
spec:
  replicas: 3
  resources: {limits: {cpu: "4", memory: 512Mi}, requests: {cpu: 500m}}
  tuning: {profile: throughput, cpuPinning: true, cpus: 2, allocator: system, sysctls: {net.ipv4.tcp_fin_timeout: "10"}, unsafeSysctls: {net.core.somaxconn: "4096"}}
  tools: [{name: add, handler: {builtin: add}}]
"#,
        );
        let d = serde_json::to_value(&c.deployment).unwrap();
        let ctr = &d["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            ctr["resources"]["requests"],
            json!({"cpu": "2", "memory": "512Mi"})
        );
        assert_eq!(ctr["resources"]["limits"], ctr["resources"]["requests"]);
        let args = ctr["args"].as_array().unwrap();
        assert!(
            args.contains(&json!("--pin-workers")) && args.contains(&json!("--worker-threads=2")),
            "{args:?}"
        );
        assert_eq!(
            ctr["env"][1],
            json!({"name": "QUIVER_ALLOCATOR", "value": "system"})
        );
        let sysctls = &d["spec"]["template"]["spec"]["securityContext"]["sysctls"];
        assert_eq!(
            sysctls,
            &json!([
                {"name": "net.core.somaxconn", "value": "4096"},
                {"name": "net.ipv4.ip_local_port_range", "value": "1024 65000"},
                {"name": "net.ipv4.tcp_fin_timeout", "value": "10"},
            ])
        );
        assert!(c.pdb.is_some(), "several replicas get a PodDisruptionBudget");
    }

    #[test]
    fn autoscaling_leaves_replicas_to_the_hpa() {
        let c = children(
            r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: auto}
spec:
  autoscaling: {minReplicas: 2, maxReplicas: 5}
  tools: [{name: add, handler: {builtin: add}}]
"#,
        );
        let d = serde_json::to_value(&c.deployment).unwrap();
        assert!(
            d["spec"].get("replicas").is_none(),
            "the HPA owns the replica count"
        );
        let h = serde_json::to_value(c.hpa.unwrap()).unwrap();
        assert_eq!(h["spec"]["scaleTargetRef"]["name"], "auto");
        assert_eq!(
            h["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            70
        );
    }

    #[test]
    fn a_tools_only_change_changes_only_the_config_map() {
        let a = children(BASIC);
        let b = children(&BASIC.replace(
            "{name: add, handler: {builtin: add}}",
            "{name: add, handler: {builtin: add}}\n    - {name: up, handler: {builtin: upper}}",
        ));
        assert_ne!(a.config_map, b.config_map);
        assert_eq!(
            a.deployment, b.deployment,
            "the pod template must not change, so nothing rolls"
        );
        assert_eq!(a.service, b.service);
    }

    #[test]
    fn unsafe_sysctls_under_sysctls_are_flagged() {
        let m = mcp(&BASIC.replace(
            "spec:\n",
            "spec:\n  tuning: {sysctls: {net.core.somaxconn: \"1024\"}}\n",
        ));
        assert_eq!(unsafe_in_safe_list(&m), vec!["net.core.somaxconn".to_owned()]);
    }
}
