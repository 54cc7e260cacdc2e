//! The prometheus-operator ServiceMonitor of an McpServer. Its CRD may be absent, so there is
//! no Rust type for it: the object is a `DynamicObject` whose metadata is typed and whose spec
//! is a literal JSON value (built in place; nothing is converted or can fail).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

use super::selector;

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
