//! Tuning: the sysctls, CPU pinning and compute resources a spec asks for, as pure functions.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::crd::{McpServer, Profile};

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

/// Memory limit (and, when pinned, request) when the spec names none.
const DEFAULT_MEMORY_LIMIT: &str = "256Mi";

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

/// Sysctls under `tuning.sysctls` that are not in the kubelet's safe set, sorted.
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

fn quantity(s: &str) -> Quantity {
    Quantity(s.to_owned())
}

/// The container's resources and, when pinned, its whole CPUs.
///
/// Pinned pods get Guaranteed QoS: requests equal limits for every resource, the CPU a whole
/// number (`tuning.cpus`, else an integer CPU limit of the spec).
pub fn resources(mcp: &McpServer) -> (ResourceRequirements, Option<u32>) {
    let spec_resources = mcp.spec.resources.clone();
    if !pinned(mcp) {
        let r = spec_resources.unwrap_or_else(|| ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), quantity("100m")),
                ("memory".to_owned(), quantity("64Mi")),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                quantity(DEFAULT_MEMORY_LIMIT),
            )])),
            claims: None,
        });
        return (r, None);
    }
    let spec_resources = spec_resources.unwrap_or_default();
    let mut limits = spec_resources.limits.unwrap_or_default();
    limits
        .entry("memory".to_owned())
        .or_insert_with(|| quantity(DEFAULT_MEMORY_LIMIT));
    let cpus = mcp
        .spec
        .tuning
        .as_ref()
        .and_then(|t| t.cpus)
        .or_else(|| limits.get("cpu").and_then(|c| c.0.parse::<u32>().ok()));
    if let Some(n) = cpus {
        limits.insert("cpu".to_owned(), quantity(&n.to_string()));
    }
    let r = ResourceRequirements {
        requests: Some(limits.clone()),
        limits: Some(limits),
        claims: spec_resources.claims,
    };
    (r, cpus)
}
