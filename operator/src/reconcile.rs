//! Reconcile an McpServer: dereference → validate → build → apply (server-side apply, one
//! field manager) → status computed from what was applied.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::build::{self, Defaults};
use crate::crd::{McpServer, McpServerStatus};
use crate::metrics::Metrics;
use crate::render::{self, Fetched, Invalid};

/// Field manager of every server-side apply.
pub const MANAGER: &str = "quiver-operator";

/// Reconcile errors. Invalid specs are not errors: they become a condition and an event.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed (transient: retried with backoff).
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The object has no namespace or name.
    #[error("McpServer without namespace or name")]
    Unnamed,
}

impl Error {
    /// Bounded label value for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Kube(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Self::Kube(kube::Error::Api(s)) if s.code == 403 => "forbidden",
            Self::Kube(kube::Error::Api(s)) if s.code == 422 => "rejected",
            Self::Kube(kube::Error::Api(_)) => "api",
            Self::Kube(_) => "transport",
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
}

async fn fetch(client: &Client, ns: &str, mcp: &McpServer) -> Result<Fetched, Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let mut out = Vec::with_capacity(mcp.spec.tools_from.len());
    for t in &mcp.spec.tools_from {
        let cm = api.get_opt(&t.config_map_key_ref.name).await?;
        out.push(cm.and_then(|c| render::key_of(c.data.as_ref(), &t.config_map_key_ref.key)));
    }
    Ok(out)
}

async fn apply<K>(client: &Client, ns: &str, obj: &K) -> Result<K, Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let name = obj.meta().name.clone().unwrap_or_default();
    Ok(api
        .patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(obj))
        .await?)
}

async fn delete_if_present<K>(client: &Client, ns: &str, name: &str) -> Result<(), Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// One reconcile.
///
/// # Errors
/// Transient API failures; the controller retries them with backoff.
pub async fn reconcile(mcp: Arc<McpServer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let start = Instant::now();
    let _running = ctx.metrics.start();
    let result = reconcile_inner(&mcp, &ctx).await;
    ctx.metrics
        .observe(start.elapsed(), result.as_ref().err().map(Error::category));
    result
}

async fn reconcile_inner(mcp: &McpServer, ctx: &Context) -> Result<Action, Error> {
    let (Some(ns), Some(name)) = (mcp.metadata.namespace.clone(), mcp.metadata.name.clone()) else {
        return Err(Error::Unnamed);
    };
    let client = &ctx.client;
    let fetched = fetch(client, &ns, mcp).await?;
    let rendered = match render::render(mcp, &fetched) {
        Ok(r) => r,
        Err(invalid) => {
            report_invalid(mcp, ctx, &ns, &name, &invalid).await?;
            // Nothing to retry until the spec or a referenced ConfigMap changes (both are watched).
            return Ok(Action::await_change());
        }
    };
    let children = build::build(mcp, &rendered, &ctx.defaults);
    apply(client, &ns, &children.config_map).await?;
    apply(client, &ns, &children.service_account).await?;
    apply(client, &ns, &children.role).await?;
    apply(client, &ns, &children.role_binding).await?;
    let deployment = apply(client, &ns, &children.deployment).await?;
    apply(client, &ns, &children.service).await?;
    match &children.hpa {
        Some(h) => drop(apply(client, &ns, h).await?),
        None => delete_if_present::<HorizontalPodAutoscaler>(client, &ns, &name).await?,
    }
    match &children.pdb {
        Some(p) => drop(apply(client, &ns, p).await?),
        None => delete_if_present::<PodDisruptionBudget>(client, &ns, &name).await?,
    }
    if mcp.spec.monitoring.as_ref().is_some_and(|m| m.service_monitor) {
        apply_service_monitor(ctx, mcp, &ns, &name).await?;
    }
    let mut status = status_from(mcp, &rendered, &deployment, &ns, &name);
    if ctx.probe_pods {
        let loaded = crate::probe::config_loaded(client, &ns, &name, &rendered.hash).await?;
        status.config_loaded_replicas = Some(loaded);
    }
    // Unchanged status: no write (transition times only move when a condition changes).
    if mcp.status.as_ref() != Some(&status) {
        patch_status(client, &ns, &name, &status).await?;
    }
    let unsafe_sysctls = build::unsafe_in_safe_list(mcp);
    if !unsafe_sysctls.is_empty() {
        publish(ctx, mcp, EventType::Warning, "UnsafeSysctls", format!("{} are not in the kubelet's safe set; move them to tuning.unsafeSysctls and allow them on the nodes", unsafe_sysctls.join(", "))).await;
    }
    // Deployment status changes arrive through the owned-Deployment watch, so an unready
    // object needs no fast polling (1,000 of them at 5 s flooded the API server in the scale
    // test). Pods loading a new config are not watched: poll those briefly.
    let converged = !ctx.probe_pods || status.config_loaded_replicas >= Some(status.ready_replicas);
    Ok(Action::requeue(if converged {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(10)
    }))
}

/// A prometheus-operator ServiceMonitor for the admin port, when that CRD is installed.
async fn apply_service_monitor(ctx: &Context, mcp: &McpServer, ns: &str, name: &str) -> Result<(), Error> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
        "servicemonitors",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &ar);
    let owner = mcp.controller_owner_ref(&()).map(|o| vec![o]).unwrap_or_default();
    let sm = json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": name, "namespace": ns, "labels": build::labels(name), "ownerReferences": owner},
        "spec": {"selector": {"matchLabels": build::selector(name)}, "endpoints": [{"port": "admin", "path": "/metrics", "interval": "15s"}]},
    });
    match api
        .patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&sm))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            publish(ctx, mcp, EventType::Warning, "ServiceMonitorUnavailable", "monitoring.serviceMonitor is set but the monitoring.coreos.com/v1 ServiceMonitor CRD is not installed".into()).await;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

async fn report_invalid(
    mcp: &McpServer,
    ctx: &Context,
    ns: &str,
    name: &str,
    invalid: &Invalid,
) -> Result<(), Error> {
    let message = invalid.message();
    ctx.metrics.invalid();
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
    patch_status(&ctx.client, ns, name, &status).await?;
    publish(ctx, mcp, EventType::Warning, invalid.reason, message).await;
    Ok(())
}

async fn publish(ctx: &Context, mcp: &McpServer, type_: EventType, reason: &str, note: String) {
    let note: String = note.chars().take(1000).collect();
    let ev = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &mcp.object_ref(&())).await {
        tracing::warn!(error = %e, "could not publish event");
    }
}

async fn patch_status(client: &Client, ns: &str, name: &str, status: &McpServerStatus) -> Result<(), Error> {
    let api: Api<McpServer> = Api::namespaced(client.clone(), ns);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await?;
    Ok(())
}

/// Sets a condition, keeping its transition time when its status did not change.
pub fn set_condition(
    conds: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" }.to_owned();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    match conds.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now;
            }
            c.status = status;
            c.reason = reason.to_owned();
            c.message = message.to_owned();
            c.observed_generation = generation;
        }
        None => conds.push(Condition {
            type_: type_.to_owned(),
            status,
            reason: reason.to_owned(),
            message: message.to_owned(),
            observed_generation: generation,
            last_transition_time: now,
        }),
    }
}

/// Status from the applied Deployment (pure).
pub fn status_from(
    mcp: &McpServer,
    rendered: &render::Rendered,
    d: &Deployment,
    ns: &str,
    name: &str,
) -> McpServerStatus {
    let generation = mcp.metadata.generation;
    let mut s = mcp.status.clone().unwrap_or_default();
    let ds = d.status.clone().unwrap_or_default();
    let desired = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let ready = ds.ready_replicas.unwrap_or(0);
    let updated = ds.updated_replicas.unwrap_or(0);
    let rolled = ds.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
        && updated >= desired
        && ds.replicas.unwrap_or(0) <= desired;
    let deadline = ds
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Progressing" && c.reason.as_deref() == Some("ProgressDeadlineExceeded"));
    let replica_failure = ds
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "ReplicaFailure" && c.status == "True");
    s.observed_generation = generation;
    s.replicas = ds.replicas.unwrap_or(0);
    s.ready_replicas = ready;
    s.replicas_summary = Some(format!("{ready}/{desired}"));
    s.selector = Some(build::selector_string(name));
    s.tool_count = Some(rendered.tool_count as i32);
    s.config_hash = Some(rendered.hash.clone());
    let port = mcp
        .spec
        .service
        .as_ref()
        .and_then(|p| p.port)
        .unwrap_or(build::MCP_PORT);
    s.endpoint = Some(format!("http://{name}.{ns}.svc:{port}/mcp"));
    let msg = format!("{} tools, config {}", rendered.tool_count, rendered.hash);
    set_condition(&mut s.conditions, "ConfigValid", true, "Valid", &msg, generation);
    if rolled {
        set_condition(
            &mut s.conditions,
            "Progressing",
            false,
            "RolloutComplete",
            "the Deployment is up to date",
            generation,
        );
    } else {
        set_condition(
            &mut s.conditions,
            "Progressing",
            true,
            "RollingOut",
            &format!("{updated}/{desired} pods updated"),
            generation,
        );
    }
    let is_ready = ready >= desired && rolled;
    let ready_msg = if desired == 0 {
        "scaled to zero".to_owned()
    } else {
        format!("{ready}/{desired} pods ready")
    };
    set_condition(
        &mut s.conditions,
        "Ready",
        is_ready,
        if is_ready { "PodsReady" } else { "PodsNotReady" },
        &ready_msg,
        generation,
    );
    match (replica_failure, deadline) {
        (Some(f), _) => set_condition(
            &mut s.conditions,
            "Degraded",
            true,
            "ReplicaFailure",
            f.message.as_deref().unwrap_or("pods cannot be created"),
            generation,
        ),
        (None, true) => set_condition(
            &mut s.conditions,
            "Degraded",
            true,
            "ProgressDeadlineExceeded",
            "the rollout is not making progress; check the pods' events",
            generation,
        ),
        (None, false) => set_condition(&mut s.conditions, "Degraded", false, "AsExpected", "", generation),
    }
    s
}

/// Error policy: transient errors retry with a short delay (the controller adds backoff).
pub fn error_policy(mcp: Arc<McpServer>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(mcpserver = %mcp.name_any(), error = %err, category = err.category(), "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}
