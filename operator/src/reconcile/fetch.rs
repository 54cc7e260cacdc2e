//! Dereference: what an McpServer names, read from the API (its `toolsFrom` ConfigMaps, the
//! ServiceAccount it runs as, and where the API server listens, for its egress rule).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::{Client, ResourceExt};

use super::Error;
use crate::build;
use crate::crd::{McpServer, TOOLS_LABEL};
use crate::render::{self, Fetched};

/// The `toolsFrom` sources of an McpServer, read from the API.
pub struct Dereferenced {
    /// The content of each `toolsFrom` entry.
    pub fetched: Fetched,
    /// Referenced ConfigMaps without [`TOOLS_LABEL`] (sorted, unique).
    pub unwatched: Vec<String>,
}

/// Reads the ConfigMaps `mcp`'s `toolsFrom` names (each once).
///
/// # Errors
/// [`Error::Fetch`] naming the ConfigMap whose GET failed (other than 404).
pub async fn tools_from(client: &Client, ns: &str, mcp: &McpServer) -> Result<Dereferenced, Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let mut read: BTreeMap<&str, Option<ConfigMap>> = BTreeMap::new();
    for t in &mcp.spec.tools_from {
        let name = t.config_map_key_ref.name.as_str();
        if !read.contains_key(name) {
            let cm = api.get_opt(name).await.map_err(|source| Error::Fetch {
                kind: "ConfigMap",
                name: name.to_owned(),
                source,
            })?;
            read.insert(name, cm);
        }
    }
    let fetched = mcp
        .spec
        .tools_from
        .iter()
        .map(|t| {
            let cm = read
                .get(t.config_map_key_ref.name.as_str())
                .and_then(Option::as_ref);
            cm.and_then(|c| render::key_of(c.data.as_ref(), &t.config_map_key_ref.key))
        })
        .collect();
    let unwatched = read
        .iter()
        .filter_map(|(name, cm)| cm.as_ref().map(|c| (name, c)))
        .filter(|(_, c)| c.labels().get(TOOLS_LABEL.0).map(String::as_str) != Some(TOOLS_LABEL.1))
        .map(|(name, _)| (*name).to_owned())
        .collect();
    Ok(Dereferenced { fetched, unwatched })
}

/// The ServiceAccount `podTemplate.serviceAccountName` names, read for its owner's consent
/// (`None` when the spec names none or it does not exist).
///
/// # Errors
/// [`Error::Fetch`] when the GET failed (other than 404).
pub async fn named_service_account(
    client: &Client,
    ns: &str,
    mcp: &McpServer,
) -> Result<Option<ServiceAccount>, Error> {
    match build::named_service_account(mcp) {
        Some(name) => Api::<ServiceAccount>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(|source| Error::Fetch {
                kind: "ServiceAccount",
                name: name.to_owned(),
                source,
            }),
        None => Ok(None),
    }
}

/// Where the API server listens (the `default/kubernetes` EndpointSlice), for the pods'
/// egress rule. Unreadable, the rule falls back to TCP 443 and 6443 to any address.
pub async fn api_server(client: &Client) -> build::ApiServer {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    match api.get_opt("kubernetes").await {
        Ok(Some(slice)) => {
            let ports: Vec<i32> = slice.ports.iter().flatten().filter_map(|p| p.port).collect();
            build::ApiServer {
                endpoints: slice
                    .endpoints
                    .iter()
                    .flat_map(|e| e.addresses.iter())
                    .flat_map(|a| ports.iter().map(move |p| (a.clone(), *p)))
                    .collect(),
            }
        }
        Ok(None) => build::ApiServer::default(),
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the API server's EndpointSlice; egress to it falls back to ports 443/6443");
            build::ApiServer::default()
        }
    }
}

/// The records of an McpServer's pins ConfigMap (written by its pods), by upstream; `None`
/// when it cannot be read (the condition is left as it was; the next reconcile reads again).
pub async fn pins(
    client: &Client,
    ns: &str,
    name: &str,
) -> Option<BTreeMap<String, quiver_model::config::upstream::pin::SourceRecord>> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = match api.get_opt(&build::pins_config_map_name(name)).await {
        Ok(cm) => cm?,
        Err(e) => {
            tracing::warn!(namespace = ns, name, error = %e, "reading the pins ConfigMap failed");
            return None;
        }
    };
    Some(quiver_model::config::upstream::pin::readable_records(
        cm.data.as_ref(),
    ))
}
