//! Exposure outside the cluster: an Ingress, or a Gateway API HTTPRoute (whose CRD may be
//! absent, so it is a `DynamicObject` like the ServiceMonitor), routing `/mcp`, the
//! protected-resource metadata and, with `auth.upstreamSignIn`, the sign-in routes `/oauth`
//! to the Service's MCP port.

use k8s_openapi::api::networking::v1::{
    HTTPIngressPath, HTTPIngressRuleValue, Ingress, IngressBackend, IngressRule, IngressServiceBackend,
    IngressSpec, IngressTLS, ServiceBackendPort,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

use super::MCP_PORT;
use super::sign_in::{OAUTH_PATH, sign_in};
use crate::crd::McpServer;

/// Paths routed to the server: the MCP endpoint and the OAuth protected-resource metadata,
/// and the sign-in routes (where browsers come back from upstreams) when users sign in to
/// upstreams.
fn paths(mcp: &McpServer) -> impl Iterator<Item = &'static str> {
    ["/mcp", "/.well-known/oauth-protected-resource"]
        .into_iter()
        .chain(sign_in(mcp).map(|_| OAUTH_PATH))
}

/// `gateway.networking.k8s.io/v1` `HTTPRoute`.
pub fn http_route_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute"),
        "httproutes",
    )
}

fn service_port(mcp: &McpServer) -> i32 {
    mcp.spec.service.as_ref().and_then(|s| s.port).unwrap_or(MCP_PORT)
}

/// The Ingress, when `spec.ingress` is set.
pub(super) fn ingress(mcp: &McpServer, name: &str, mut metadata: ObjectMeta) -> Option<Ingress> {
    let spec = mcp.spec.ingress.as_ref()?;
    if !spec.annotations.is_empty() {
        metadata.annotations = Some(spec.annotations.clone());
    }
    let backend = IngressBackend {
        service: Some(IngressServiceBackend {
            name: name.to_owned(),
            port: Some(ServiceBackendPort {
                number: Some(service_port(mcp)),
                name: None,
            }),
        }),
        resource: None,
    };
    Some(Ingress {
        metadata,
        spec: Some(IngressSpec {
            ingress_class_name: spec.class_name.clone(),
            rules: Some(vec![IngressRule {
                host: Some(spec.host.clone()),
                http: Some(HTTPIngressRuleValue {
                    paths: paths(mcp)
                        .map(|p| HTTPIngressPath {
                            path: Some(p.to_owned()),
                            path_type: "Prefix".to_owned(),
                            backend: backend.clone(),
                        })
                        .collect(),
                }),
            }]),
            tls: spec.tls_secret_name.as_ref().map(|secret| {
                vec![IngressTLS {
                    hosts: Some(vec![spec.host.clone()]),
                    secret_name: Some(secret.clone()),
                }]
            }),
            default_backend: None,
        }),
        status: None,
    })
}

/// The HTTPRoute, when `spec.httpRoute` is set.
pub(super) fn http_route(mcp: &McpServer, name: &str, metadata: ObjectMeta) -> Option<DynamicObject> {
    let spec = mcp.spec.http_route.as_ref()?;
    let matches: Vec<_> = paths(mcp)
        .map(|p| json!({"path": {"type": "PathPrefix", "value": p}}))
        .collect();
    let mut route = DynamicObject::new(name, &http_route_resource()).data(json!({
        "spec": {
            "parentRefs": spec.parent_refs,
            "hostnames": spec.hostnames,
            "rules": [{
                "matches": matches,
                "backendRefs": [{"name": name, "port": service_port(mcp)}],
            }],
        }
    }));
    route.metadata = metadata;
    Some(route)
}
