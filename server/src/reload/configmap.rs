//! `--config configmap:NS/NAME`: a watch on one ConfigMap through the Kubernetes API.
//! Updates arrive within milliseconds of the write, unlike kubelet volume sync (up to a
//! minute). The pod's ServiceAccount needs get/list/watch on that ConfigMap.

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

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
    let client = kube::Client::try_default().await?;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let origin = format!("configmap:{namespace}/{name}");
    tracing::info!(source = %origin, "watching config");
    let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
    let mut seen = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Apply(cm) | Event::InitApply(cm)) => {
                seen = true;
                reloader.apply_off_workers(origin.clone(), sources(&cm)).await;
            }
            Ok(Event::Delete(_)) => {
                tracing::warn!(source = %origin, "ConfigMap deleted; still serving the previous tools")
            }
            Ok(Event::InitDone) if !seen => {
                tracing::warn!(source = %origin, "ConfigMap not found yet; not ready until it exists")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(source = %origin, error = %e, "watch error; retrying with backoff"),
        }
    }
    Ok(())
}
