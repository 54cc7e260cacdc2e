//! `kube:NAMESPACE`: a watch on each Secret (and ConfigMap: CA bundles) the serving ToolSet
//! references, and the one holding client tokens, by name. The set follows reloads; the
//! pod's Role grants exactly those names.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use super::store::{Presence, Secrets};
use crate::spec::context::CONFIG_MAP_PREFIX;

/// The keys and values of a watched object.
trait Keyed: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static {
    fn keys(&self) -> Vec<(String, Vec<u8>)>;
}

impl Keyed for Secret {
    fn keys(&self) -> Vec<(String, Vec<u8>)> {
        // stringData is write-only: the API server folds it into data.
        let mut out: Vec<(String, Vec<u8>)> = self
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        out.sort();
        out
    }
}

impl Keyed for ConfigMap {
    fn keys(&self) -> Vec<(String, Vec<u8>)> {
        let text = self
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()));
        let binary = self
            .binary_data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()));
        let mut out: Vec<(String, Vec<u8>)> = text.chain(binary).collect();
        out.sort();
        out
    }
}

/// Keeps the store's entry `name` (the object's name, prefixed for a ConfigMap) equal to
/// the object `object` of `api`.
async fn watch_one<K: Keyed>(api: Api<K>, name: String, object: String, secrets: Arc<Secrets>) {
    let cfg = watcher::Config::default().fields(&format!("metadata.name={object}"));
    let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
    let mut seen = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Apply(s) | Event::InitApply(s)) => {
                seen = true;
                secrets.set(&name, Some(s.keys()), Presence::Loaded);
                tracing::info!(secret = %name, "secret loaded");
            }
            Ok(Event::Delete(_)) => {
                seen = false;
                secrets.set(&name, None, Presence::Missing);
                tracing::warn!(secret = %name, "secret deleted; tools that use it fail until it exists");
            }
            Ok(Event::Init) => seen = false,
            Ok(Event::InitDone) if !seen => {
                secrets.set(&name, None, Presence::Missing);
                tracing::warn!(secret = %name, "secret not found; tools that use it fail until it exists");
            }
            Ok(Event::InitDone) => {}
            Err(e) => {
                if !seen {
                    secrets.set(&name, None, Presence::Unreadable);
                }
                tracing::warn!(secret = %name, error = %e, "secret watch error; retrying with backoff");
            }
        }
    }
}

/// `kube:NAMESPACE`: one watch per wanted Secret, started and stopped as the wanted set
/// changes, until the process ends.
///
/// # Errors
/// No Kubernetes client configuration (in-cluster or KUBECONFIG) was found.
pub async fn watch_kube(namespace: String, secrets: Arc<Secrets>) -> anyhow::Result<()> {
    secrets.set_has_source();
    let client = kube::Client::try_default().await?;
    let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let maps: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let mut wanted = secrets.wanted();
    let mut running: BTreeMap<String, tokio::task::JoinHandle<()>> = BTreeMap::new();
    loop {
        let now = wanted.borrow_and_update().clone();
        running.retain(|name, task| {
            let keep = now.contains(name);
            if !keep {
                task.abort();
                secrets.set(name, None, Presence::Pending);
            }
            keep
        });
        for name in now {
            running.entry(name.clone()).or_insert_with(|| {
                let store = Arc::clone(&secrets);
                match name.strip_prefix(CONFIG_MAP_PREFIX) {
                    Some(map) => tokio::spawn(watch_one(maps.clone(), name.clone(), map.to_owned(), store)),
                    None => tokio::spawn(watch_one(api.clone(), name.clone(), name, store)),
                }
            });
        }
        if wanted.changed().await.is_err() {
            return Ok(());
        }
    }
}
