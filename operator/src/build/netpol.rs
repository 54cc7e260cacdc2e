//! The NetworkPolicy of an McpServer (when `spec.networkPolicy` is set): who may reach the MCP
//! and admin ports, and where the pods may connect: the cluster DNS, the API server (their ConfigMap and
//! Secret watches) and the destinations the spec declares.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{ADMIN_PORT, MCP_PORT, pod_selector};
use crate::crd::McpServer;

/// Where the API server listens, as the `default/kubernetes` EndpointSlice says (read in the
/// dereference step). Empty when it could not be read: then TCP 443 and 6443 to any address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiServer {
    /// (IP address, port) pairs.
    pub endpoints: Vec<(String, i32)>,
}

fn port(protocol: &str, number: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(protocol.to_owned()),
        port: Some(IntOrString::Int(number)),
        end_port: None,
    }
}

fn some_unless_empty<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

fn host(ip: &str) -> String {
    if ip.contains(':') {
        format!("{ip}/128")
    } else {
        format!("{ip}/32")
    }
}

/// The cluster DNS: pods labelled `k8s-app: kube-dns` in namespace `kube-system` (CoreDNS
/// and kube-dns in kubeadm, kind, EKS, GKE and AKS clusters).
fn cluster_dns() -> NetworkPolicyPeer {
    let labels = |k: &str, v: &str| LabelSelector {
        match_labels: Some(BTreeMap::from([(k.to_owned(), v.to_owned())])),
        match_expressions: None,
    };
    NetworkPolicyPeer {
        namespace_selector: Some(labels("kubernetes.io/metadata.name", "kube-system")),
        pod_selector: Some(labels("k8s-app", "kube-dns")),
        ip_block: None,
    }
}

/// The NetworkPolicy, if the spec asks for one.
pub(super) fn network_policy(
    mcp: &McpServer,
    name: &str,
    api: &ApiServer,
    metadata: ObjectMeta,
) -> Option<NetworkPolicy> {
    let spec = mcp.spec.network_policy.as_ref()?;
    // The container's port: the Service's port may differ, the policy sees the pod's.
    let mcp_port = MCP_PORT;
    let ingress = vec![
        NetworkPolicyIngressRule {
            from: some_unless_empty(spec.mcp_from.clone()),
            ports: Some(vec![port("TCP", mcp_port)]),
        },
        NetworkPolicyIngressRule {
            from: some_unless_empty(spec.admin_from.clone()),
            ports: Some(vec![port("TCP", ADMIN_PORT)]),
        },
    ];
    // DNS to the cluster DNS only, unless the spec names its resolvers: port 53 to any
    // address would be a way out for anything that speaks over it.
    let dns = if spec.dns_peers.is_empty() {
        vec![cluster_dns()]
    } else {
        spec.dns_peers.clone()
    };
    let mut egress = vec![NetworkPolicyEgressRule {
        to: Some(dns),
        ports: Some(vec![port("UDP", 53), port("TCP", 53)]),
    }];
    egress.push(if api.endpoints.is_empty() {
        NetworkPolicyEgressRule {
            to: None,
            ports: Some(vec![port("TCP", 443), port("TCP", 6443)]),
        }
    } else {
        let mut ports: Vec<i32> = api.endpoints.iter().map(|(_, p)| *p).collect();
        ports.sort_unstable();
        ports.dedup();
        NetworkPolicyEgressRule {
            to: Some(
                api.endpoints
                    .iter()
                    .map(|(ip, _)| NetworkPolicyPeer {
                        ip_block: Some(IPBlock {
                            cidr: host(ip),
                            except: None,
                        }),
                        ..NetworkPolicyPeer::default()
                    })
                    .collect(),
            ),
            ports: Some(ports.into_iter().map(|p| port("TCP", p)).collect()),
        }
    });
    egress.extend(spec.egress.iter().cloned());
    Some(NetworkPolicy {
        metadata,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(pod_selector(name)),
            policy_types: Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
            ingress: Some(ingress),
            egress: Some(egress),
        }),
    })
}
