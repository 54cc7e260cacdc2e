//! `--pins configmap:NAMESPACE/NAME`: the pin records kept in a ConfigMap, one key per
//! upstream (`upstream.NAME`, compact JSON within a byte budget per source), so every
//! replica and every restart holds the same approvals and `kubectl quiver approve` can edit
//! them. The pod needs get, watch and update on that one ConfigMap; the operator creates it
//! and grants exactly that.
//!
//! Writes are compare-and-set (the `resourceVersion` read): a write that lost a race is
//! merged again on top of what won, so replicas and approvals never undo each other.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;

use super::Hub;
use super::pins::Held;
use crate::config::upstream::pin::{read_records, record_key, source_budget, source_of_key};
use crate::net::configmap::{self, Watched};

/// Write attempts per flush before waiting for the next change.
const ATTEMPTS: usize = 5;
/// Wait after a failed write before trying again.
const RETRY: Duration = Duration::from_secs(2);
/// Shortest time between two writes of one server: an upstream that changes its tools
/// every second (or replicas that see different definitions) costs the API server one
/// write per this interval per pod, at most.
const MIN_WRITE_INTERVAL: Duration = Duration::from_secs(5);
/// Largest ConfigMap this server writes (the API server refuses over 1 MiB).
const MAX_CONFIGMAP_BYTES: usize = 1_000_000;

/// The records a ConfigMap holds (keys that are not records are ignored).
fn records(cm: &ConfigMap) -> BTreeMap<String, Held> {
    read_records(cm.data.as_ref())
        .into_iter()
        .map(|(k, r)| (k, r.map_or(Held::Unreadable, Held::Record)))
        .collect()
}

/// Keeps `hub`'s pin records in the ConfigMap: watches it (a change of what is approved
/// rebuilds the registry: an approval serves the tool within milliseconds) and writes the records
/// this server changed, until the process ends.
///
/// # Errors
/// No Kubernetes client configuration (in-cluster or KUBECONFIG) was found.
pub async fn keep_in_configmap(hub: Arc<Hub>, namespace: String, name: String) -> anyhow::Result<()> {
    let api = configmap::api(&namespace).await?;
    let origin = format!("configmap:{namespace}/{name}");
    tokio::spawn(write_changes(Arc::clone(&hub), api.clone(), name.clone()));
    tracing::info!(store = %origin, "keeping pinned tool definitions");
    let mut events = std::pin::pin!(configmap::watch(api, &name, origin.clone()));
    while let Some(ev) = events.next().await {
        match ev {
            Watched::Changed(cm) => {
                // Rebuilt only when what is approved changed: a rebuild reads the OpenAPI
                // documents again, and this server's own writes must not start another.
                if hub.pins.loaded(records(&cm)) {
                    hub.changed.notify_one();
                }
            }
            // What this server holds keeps deciding; once the ConfigMap exists again (empty),
            // each upstream is pinned afresh.
            Watched::Deleted => {
                tracing::warn!(store = %origin, "pin ConfigMap deleted; its records are written again once it exists")
            }
            Watched::Missing => {
                tracing::warn!(store = %origin, "pin ConfigMap not found; enforced upstreams serve nothing until it exists")
            }
        }
    }
    Ok(())
}

/// Writes the records this server changed, each merged over what the ConfigMap holds.
async fn write_changes(hub: Arc<Hub>, api: Api<ConfigMap>, name: String) {
    loop {
        hub.pins.flush.notified().await;
        if !hub.pins.take_dirty() {
            continue;
        }
        match write(&hub, &api, &name).await {
            Ok(()) => tokio::time::sleep(MIN_WRITE_INTERVAL).await,
            Err(e) => {
                tracing::warn!(configmap = %name, error = %e, "writing pinned tool definitions failed; trying again");
                hub.pins.redirty();
                tokio::time::sleep(RETRY.max(MIN_WRITE_INTERVAL)).await;
                hub.pins.flush.notify_one();
            }
        }
    }
}

/// One compare-and-set write of every record, read again after a lost race: the sources
/// this server saw listed merged with what it saw, and every record (other sources', those
/// of upstreams no longer configured) kept within an equal share of the budget, so the
/// ConfigMap stays under 1 MiB however many upstreams come and go.
async fn write(hub: &Hub, api: &Api<ConfigMap>, name: &str) -> anyhow::Result<()> {
    for _ in 0..ATTEMPTS {
        let mut cm = api.get(name).await?;
        let data = cm.data.get_or_insert_with(BTreeMap::new);
        let sources: BTreeSet<String> = data
            .keys()
            .filter_map(|k| source_of_key(k).map(str::to_owned))
            .chain(hub.pins.sources())
            .collect();
        let budget = source_budget(sources.len());
        let mut changed = false;
        for source in &sources {
            let key = record_key(source);
            if let Some(text) = hub
                .pins
                .merged(source, data.get(&key).map(String::as_str), budget)
            {
                data.insert(key, text);
                changed = true;
            }
        }
        if !changed {
            return Ok(());
        }
        let size: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum();
        if size > MAX_CONFIGMAP_BYTES {
            anyhow::bail!(
                "the records would take {size} bytes (unreadable records are not shrunk): fix or delete them"
            );
        }
        match api.replace(name, &PostParams::default(), &cm).await {
            Ok(_) => {
                hub.pins.written(sources);
                return Ok(());
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("{ATTEMPTS} writes in a row lost a race with other writers")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_record_keys_are_read_and_bad_text_is_unreadable() {
        let cm = ConfigMap {
            data: Some(BTreeMap::from([
                (
                    "upstream.gh".to_owned(),
                    r#"{"approved":{},"pending":{}}"#.to_owned(),
                ),
                ("upstream.bad".to_owned(), "{".to_owned()),
                ("notes".to_owned(), "anything".to_owned()),
            ])),
            ..ConfigMap::default()
        };
        let r = records(&cm);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r["gh"],
            Held::Record(crate::config::upstream::pin::SourceRecord::default())
        );
        assert_eq!(r["bad"], Held::Unreadable);
    }
}
