//! The prometheus-operator ServiceMonitor of an McpServer. Its CRD may be absent, so there is
//! no Rust type for it: the object is a `DynamicObject` whose metadata is typed and whose spec
//! is a literal JSON value (built in place; nothing is converted or can fail).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

use super::{Defaults, selector};
use crate::crd::McpServer;

/// Most labels an McpServer adds to its ServiceMonitor.
pub const MAX_LABELS: usize = 16;
/// Label key prefixes the operator's own labels use: not settable.
const RESERVED: [&str; 2] = ["app.kubernetes.io/", "quiver.dev/"];

/// Adds the default labels, then the McpServer's own, to the ServiceMonitor's metadata;
/// the operator's labels (already there) stay.
pub(super) fn add_labels(meta: &mut ObjectMeta, mcp: &McpServer, defaults: &Defaults) {
    let own = mcp.spec.monitoring.as_ref().map(|m| &m.service_monitor_labels);
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in defaults
        .service_monitor_labels
        .iter()
        .chain(own.into_iter().flatten())
    {
        if !reserved(k) {
            labels.insert(k.clone(), v.clone());
        }
    }
}

fn reserved(key: &str) -> bool {
    RESERVED.iter().any(|p| key.starts_with(p))
}

/// Problems with `monitoring.serviceMonitorLabels`: too many, a key or value that is not a
/// Kubernetes label's, or a key of the operator's own.
pub fn label_problems(mcp: &McpServer) -> Vec<String> {
    let Some(labels) = mcp.spec.monitoring.as_ref().map(|m| &m.service_monitor_labels) else {
        return Vec::new();
    };
    if labels.len() > MAX_LABELS {
        return vec![format!(
            "spec.monitoring.serviceMonitorLabels: at most {MAX_LABELS} labels"
        )];
    }
    labels
        .iter()
        .filter_map(|(k, v)| {
            let shown: String = k.chars().take(64).collect();
            let why = label_pair_problem(k, v)?;
            Some(format!("spec.monitoring.serviceMonitorLabels[{shown:?}]: {why}"))
        })
        .collect()
}

/// Why `key: value` is not a label the operator may set, if it is not.
pub fn label_pair_problem(key: &str, value: &str) -> Option<String> {
    if reserved(key) {
        return Some(format!(
            "keys under {} are the operator's",
            RESERVED.join(" and ")
        ));
    }
    if !label_key(key) {
        return Some("not a label key (an optional DNS subdomain and '/', then at most 63 letters, digits, '-', '_', '.', starting and ending alphanumeric)".into());
    }
    if !(value.is_empty() || label_name(value)) {
        return Some(
            "not a label value (at most 63 letters, digits, '-', '_', '.', starting and ending alphanumeric)"
                .into(),
        );
    }
    None
}

/// A label's name part, or a value: 1..=63 of `[A-Za-z0-9-_.]`, alphanumeric at both ends.
fn label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn label_key(key: &str) -> bool {
    match key.rsplit_once('/') {
        None => label_name(key),
        Some((prefix, name)) => {
            label_name(name)
                && !prefix.is_empty()
                && prefix.len() <= 253
                && prefix
                    .split('.')
                    .all(|part| part.len() <= 63 && super::is_dns_label(part))
        }
    }
}

/// `monitoring.coreos.com/v1` `ServiceMonitor`.
pub fn service_monitor_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
        "servicemonitors",
    )
}

/// A ServiceMonitor scraping the admin port of the pods of `name`.
pub(super) fn service_monitor(name: &str, metadata: ObjectMeta) -> DynamicObject {
    let mut sm = DynamicObject::new(name, &service_monitor_resource()).data(json!({
        "spec": {
            "selector": {"matchLabels": selector(name)},
            "endpoints": [{"port": "admin", "path": "/metrics", "interval": "15s"}],
        }
    }));
    sm.metadata = metadata;
    sm
}
