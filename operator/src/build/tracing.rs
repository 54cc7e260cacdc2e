//! `spec.tracing`: the server container's OpenTelemetry settings, as the standard
//! variables the server reads (the Deployment rolls when they change).

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, SecretKeySelector};

use crate::crd::{McpServer, TrustClientSampling};

fn var(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    }
}

/// The tracing variables of the server container (none when `spec.tracing` is unset).
pub(super) fn env(mcp: &McpServer, ns: &str) -> Vec<EnvVar> {
    let Some(t) = &mcp.spec.tracing else {
        return Vec::new();
    };
    let name = mcp.metadata.name.as_deref().unwrap_or_default();
    let mut out = vec![
        var("QUIVER_OTLP_ENDPOINT", t.endpoint.clone()),
        var(
            "OTEL_SERVICE_NAME",
            t.service_name.clone().unwrap_or_else(|| name.to_owned()),
        ),
        // Names and namespaces are DNS labels: no `,` or `=` to escape.
        var(
            "OTEL_RESOURCE_ATTRIBUTES",
            format!("k8s.namespace.name={ns},quiver.mcpserver={name}"),
        ),
    ];
    if let Some(r) = t.sampling_ratio {
        out.push(var("QUIVER_TRACE_SAMPLE_RATIO", r.to_string()));
    }
    if let Some(trust) = t.trust_client_sampling {
        let value = match trust {
            TrustClientSampling::Never => "never",
            TrustClientSampling::Authenticated => "authenticated",
            TrustClientSampling::Always => "always",
        };
        out.push(var("QUIVER_TRACE_TRUST_CLIENT_SAMPLING", value.to_owned()));
    }
    if let Some(forward) = t.forward_trace_state {
        out.push(var("QUIVER_TRACE_FORWARD_TRACESTATE", forward.to_string()));
    }
    if let Some(h) = &t.headers_secret_ref {
        out.push(EnvVar {
            name: "OTEL_EXPORTER_OTLP_HEADERS".to_owned(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: h.name.clone(),
                    key: h.key.clone(),
                    optional: Some(false),
                }),
                ..EnvVarSource::default()
            }),
        });
    }
    out
}
