//! Reconcile an McpServer: dereference → validate → build → apply (server-side apply, one
//! field manager) → status computed from what was applied.

mod apply;
mod children;
mod owned;
mod status;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};

use crate::backoff::Backoff;
use crate::build::{self, Defaults};
use crate::crd::{McpServer, TOOLS_LABEL};
use crate::metrics::{Metrics, Outcome};
use crate::render::{self, Fetched, Invalid};

use children::Applied;

pub use children::Conflict;
pub use owned::{Holder, MetaStore, MetaWriter, Owned, Stores, Writers, controlled_by, stores};
pub use status::{CHILD_CONFLICT, set_condition, status_from, warnings};

/// Field manager of every server-side apply.
pub const MANAGER: &str = "quiver-operator";
/// How often a settled McpServer is re-checked (drift of unwatched objects, unlabelled
/// `toolsFrom` ConfigMaps).
pub const RESYNC: Duration = Duration::from_secs(300);
/// How often an McpServer whose pods are still loading a new config is re-checked.
const CONVERGE_POLL: Duration = Duration::from_secs(10);
/// How often an McpServer with upstreams is looked at again (their health is polled).
const UPSTREAM_POLL: Duration = Duration::from_secs(30);

/// Reconcile errors. Invalid specs are not errors: they become a condition and an event.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed (transient: retried with backoff).
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A call about one child failed (transient: retried with backoff).
    #[error("{verb} {kind} {name}: {source}")]
    Child {
        /// `get`, `apply` or `delete`.
        verb: &'static str,
        /// Kind of the child.
        kind: &'static str,
        /// Name of the child.
        name: String,
        /// What the API answered.
        source: kube::Error,
    },
    /// An object of a child's kind and name exists and this McpServer is not its controller:
    /// it is left untouched, the McpServer reports it (condition and event) and is looked at
    /// again with backoff.
    #[error("{kind} {namespace}/{name} exists and is not owned by this McpServer; refusing to modify it")]
    NotOwned {
        /// Kind of the object.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The object has no namespace, name or uid.
    #[error("McpServer without namespace, name or uid")]
    Unnamed,
}

impl From<build::Unowned> for Error {
    fn from(_: build::Unowned) -> Self {
        Self::Unnamed
    }
}

impl Error {
    /// Bounded label value for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Kube(e) | Self::Child { source: e, .. } => match e {
                kube::Error::Api(s) if s.code == 409 => "conflict",
                kube::Error::Api(s) if s.code == 403 => "forbidden",
                kube::Error::Api(s) if s.code == 422 => "rejected",
                kube::Error::Api(_) => "api",
                _ => "transport",
            },
            Self::NotOwned { .. } => "not_owned",
            Self::Unnamed => "unnamed",
        }
    }
}

/// What the controller shares across reconciles.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Operator defaults.
    pub defaults: Defaults,
    /// Event recorder.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Ask ready pods which config they serve (needs pod-network access: in-cluster only).
    pub probe_pods: bool,
    /// Retry delays of failing McpServers.
    pub backoff: Backoff,
    /// The watch stores of owned children, checked before a child is applied.
    pub owned: Owned,
}

/// The `toolsFrom` sources of an McpServer, read from the API.
struct Dereferenced {
    fetched: Fetched,
    /// Referenced ConfigMaps without [`TOOLS_LABEL`] (sorted, unique).
    unwatched: Vec<String>,
}

async fn fetch(client: &Client, ns: &str, mcp: &McpServer) -> Result<Dereferenced, Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let mut read: BTreeMap<&str, Option<ConfigMap>> = BTreeMap::new();
    for t in &mcp.spec.tools_from {
        let name = t.config_map_key_ref.name.as_str();
        if !read.contains_key(name) {
            read.insert(name, api.get_opt(name).await?);
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
async fn named_service_account(
    client: &Client,
    ns: &str,
    mcp: &McpServer,
) -> Result<Option<ServiceAccount>, Error> {
    match build::named_service_account(mcp) {
        Some(name) => Ok(Api::<ServiceAccount>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await?),
        None => Ok(None),
    }
}

/// Where the API server listens (the `default/kubernetes` EndpointSlice), for the pods'
/// egress rule. Unreadable, the rule falls back to TCP 443 and 6443 to any address.
async fn api_server(client: &Client) -> build::ApiServer {
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

/// One reconcile.
///
/// # Errors
/// Transient API failures; [`error_policy`] retries them with per-object backoff.
pub async fn reconcile(mcp: Arc<McpServer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let start = Instant::now();
    let _running = ctx.metrics.start();
    let result = reconcile_inner(&mcp, &ctx).await;
    let outcome = match &result {
        Ok((outcome, _)) => *outcome,
        Err(e) => Outcome::Error(e.category()),
    };
    ctx.metrics.observe(start.elapsed(), outcome);
    if result.is_ok() {
        ctx.backoff.reset(&ObjectRef::from_obj(&*mcp));
    }
    result.map(|(_, action)| action)
}

async fn reconcile_inner(mcp: &McpServer, ctx: &Context) -> Result<(Outcome, Action), Error> {
    let (Some(ns), Some(name), Some(uid)) = (
        mcp.metadata.namespace.clone(),
        mcp.metadata.name.clone(),
        mcp.metadata.uid.clone(),
    ) else {
        return Err(Error::Unnamed);
    };
    let client = &ctx.client;
    let Dereferenced { fetched, unwatched } = fetch(client, &ns, mcp).await?;
    let named_sa = named_service_account(client, &ns, mcp).await?;
    let valid = render::render(mcp, &fetched)
        .and_then(|r| render::service_account(mcp, named_sa.as_ref()).map(|()| r));
    let rendered = match valid {
        Ok(r) => r,
        Err(invalid) => {
            report_invalid(mcp, ctx, &ns, &name, &invalid, unwatched).await?;
            // Nothing to retry until the spec or a watched ConfigMap changes; specs reading
            // ConfigMaps are re-read anyway, as those may be unlabelled (unwatched) or not exist yet;
            // so is a named ServiceAccount (not watched), whose owner may consent later.
            let action = if mcp.spec.tools_from.is_empty() && build::named_service_account(mcp).is_none() {
                Action::await_change()
            } else {
                Action::requeue(RESYNC)
            };
            return Ok((Outcome::InvalidSpec, action));
        }
    };
    let api_server = if mcp.spec.network_policy.is_some() {
        api_server(client).await
    } else {
        build::ApiServer::default()
    };
    let children = build::build(mcp, &rendered, &ctx.defaults, &api_server)?;
    let Applied {
        deployment,
        conflicts,
    } = children::apply_all(ctx, mcp, &ns, &name, &uid, &children).await?;
    let mut status = match &deployment {
        Some(d) => status_from(mcp, &rendered, d, &ns, &name),
        None => {
            let mut s = mcp.status.clone().unwrap_or_default();
            s.observed_generation = mcp.metadata.generation;
            s
        }
    };
    let mut upstream_down = false;
    if ctx.probe_pods && deployment.is_some() {
        let report = crate::probe::probe(client, &ns, &name, &rendered.hash).await?;
        status.config_loaded_replicas = Some(report.loaded);
        upstream_down = status::upstreams(
            &mut status,
            rendered.upstream_count,
            &report,
            mcp.metadata.generation,
        );
    }
    let mut events = warnings(mcp, unwatched, &mut status);
    events.extend(status::child_conflicts(mcp, &ns, &conflicts, &mut status));
    let was_down = mcp.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "UpstreamsReady" && c.status == "False")
    });
    if upstream_down && !was_down {
        let msg = status
            .conditions
            .iter()
            .find(|c| c.type_ == "UpstreamsReady")
            .map(|c| c.message.clone())
            .unwrap_or_default();
        events.push(("UpstreamDown", msg));
    }
    // Unchanged status: no write (transition times only move when a condition changes).
    if mcp.status.as_ref() != Some(&status) {
        apply::patch_status(client, &ns, &name, &status).await?;
    }
    for (reason, note) in events {
        apply::publish(ctx, mcp, EventType::Warning, reason, note).await;
    }
    // Nothing changes the other object's ownership in a way the watches would see (it may not
    // carry the label they select): look again with the per-object backoff.
    if let Some(c) = conflicts.into_iter().next() {
        return Err(Error::NotOwned {
            kind: c.kind,
            namespace: ns,
            name: c.name,
        });
    }
    // Deployment status changes arrive through the owned-Deployment watch, so an unready
    // object needs no fast polling (1,000 of them at 5 s flooded the API server in the scale
    // test). Pods loading a new config are not watched: poll those briefly.
    let converged = !ctx.probe_pods || status.config_loaded_replicas >= Some(status.ready_replicas);
    // A down upstream is not watched either: look again until it is back.
    let action = Action::requeue(match (converged, upstream_down) {
        (false, _) => CONVERGE_POLL,
        (true, true) => UPSTREAM_POLL,
        // Upstream health is not watched: look again within UPSTREAM_POLL.
        (true, false) if rendered.upstream_count > 0 => UPSTREAM_POLL,
        (true, false) => RESYNC,
    });
    Ok((Outcome::Ok, action))
}

async fn report_invalid(
    mcp: &McpServer,
    ctx: &Context,
    ns: &str,
    name: &str,
    invalid: &Invalid,
    unwatched: Vec<String>,
) -> Result<(), Error> {
    let message = invalid.message();
    let mut status = mcp.status.clone().unwrap_or_default();
    status.observed_generation = mcp.metadata.generation;
    set_condition(
        &mut status.conditions,
        "ConfigValid",
        false,
        invalid.reason,
        &format!("{message} (the last valid tools keep serving)"),
        mcp.metadata.generation,
    );
    set_condition(
        &mut status.conditions,
        "Degraded",
        true,
        invalid.reason,
        "the spec's tools are invalid; serving the last valid config, if any",
        mcp.metadata.generation,
    );
    let events = warnings(mcp, unwatched, &mut status);
    // The same problems as last time (a re-read of an unchanged spec): no write, no event.
    if mcp.status.as_ref() == Some(&status) {
        return Ok(());
    }
    apply::patch_status(&ctx.client, ns, name, &status).await?;
    apply::publish(ctx, mcp, EventType::Warning, invalid.reason, message).await;
    for (reason, note) in events {
        apply::publish(ctx, mcp, EventType::Warning, reason, note).await;
    }
    Ok(())
}

/// Error policy: retry the object after its next backoff delay (1 s doubling to 5 min; a
/// success resets it), so persistent failures of many objects do not flood the API server.
pub fn error_policy(mcp: Arc<McpServer>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.fail(ObjectRef::from_obj(&*mcp));
    tracing::warn!(mcpserver = %mcp.name_any(), error = %err, category = err.category(), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
