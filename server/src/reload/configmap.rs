//! `--config configmap:NS/NAME`: a watch on one ConfigMap through the Kubernetes API.
//! Updates arrive within milliseconds of the write, unlike kubelet volume sync (up to a
//! minute). The pod's ServiceAccount needs get/list/watch on that ConfigMap.

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;

use crate::net::configmap::{self, Watched};

use super::reloader::Reloader;

fn sources(cm: &ConfigMap) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = cm
        .data
        .iter()
        .flatten()
        .filter(|(k, _)| k.ends_with(".yaml") || k.ends_with(".yml"))
        .map(|(k, v)| (format!("configmap key {k}"), v.clone()))
        .collect();
    out.sort();
    out
}

/// Watches the ConfigMap and reloads on every change, until the process ends.
///
/// # Errors
/// No Kubernetes client configuration (in-cluster or KUBECONFIG) was found.
pub async fn watch_configmap(namespace: String, name: String, reloader: Arc<Reloader>) -> anyhow::Result<()> {
    let api = configmap::api(&namespace).await?;
    let origin = format!("configmap:{namespace}/{name}");
    tracing::info!(source = %origin, "watching config");
    let mut events = std::pin::pin!(configmap::watch(api, &name, origin.clone()));
    while let Some(ev) = events.next().await {
        match ev {
            Watched::Changed(cm) => reloader.apply_off_workers(origin.clone(), sources(&cm)).await,
            Watched::Deleted => {
                tracing::warn!(source = %origin, "ConfigMap deleted; still serving the previous tools")
            }
            Watched::Missing => {
                tracing::warn!(source = %origin, "ConfigMap not found yet; not ready until it exists")
            }
        }
    }
    Ok(())
}
