//! A watch of one ConfigMap through the Kubernetes API, as the config source and the pin
//! records use it: its content each time it appears or changes, its deletion, and that it
//! did not exist when the watch began. Watch errors are logged and retried with backoff.

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

/// What a watch of one ConfigMap reports.
#[derive(Debug)]
pub enum Watched {
    /// Its content, when first read or changed.
    Changed(Box<ConfigMap>),
    /// It was deleted.
    Deleted,
    /// It did not exist when the watch began.
    Missing,
}

/// The ConfigMaps of `namespace`, with the client of the pod (in-cluster) or KUBECONFIG.
///
/// # Errors
/// No Kubernetes client configuration was found.
pub async fn api(namespace: &str) -> anyhow::Result<Api<ConfigMap>> {
    Ok(Api::namespaced(kube::Client::try_default().await?, namespace))
}

/// Watches the ConfigMap `name` (`origin` names it in logs), for as long as the stream is
/// read.
pub fn watch(api: Api<ConfigMap>, name: &str, origin: String) -> impl Stream<Item = Watched> + Send {
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut seen = false;
    watcher::watcher(api, cfg)
        .default_backoff()
        .filter_map(move |ev| {
            let out = match ev {
                Ok(Event::Apply(cm) | Event::InitApply(cm)) => {
                    seen = true;
                    Some(Watched::Changed(Box::new(cm)))
                }
                Ok(Event::Delete(_)) => Some(Watched::Deleted),
                Ok(Event::InitDone) if !seen => Some(Watched::Missing),
                Ok(_) => None,
                Err(e) => {
                    tracing::warn!(source = %origin, error = %e, "watch error; retrying with backoff");
                    None
                }
            };
            std::future::ready(out)
        })
}
