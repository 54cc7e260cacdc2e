//! The controller: watches McpServers, their children and the ConfigMaps they reference,
//! and runs reconciles with bounded concurrency. Also the operator's admin endpoints.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use crate::build::Defaults;
use crate::crd::McpServer;
use crate::metrics::Metrics;
use crate::reconcile::{Context, error_policy, reconcile};

/// Shared with the admin endpoints.
#[derive(Default)]
pub struct Health {
    /// Set once the McpServer watch has listed.
    pub ready: AtomicBool,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The controller's cache of McpServers, for per-condition counts at scrape time.
    pub store: std::sync::OnceLock<kube::runtime::reflector::Store<McpServer>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

fn metrics_text(h: &Health) -> String {
    if let Some(store) = h.store.get() {
        let all = store.state();
        h.metrics.set_conditions(all.iter().flat_map(|m| {
            m.status
                .iter()
                .flat_map(|s| s.conditions.iter().map(|c| (c.type_.as_str(), c.status.as_str())))
        }));
    }
    h.metrics.encode()
}

/// The admin router: /metrics, /healthz, /readyz.
pub fn admin(health: Arc<Health>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(h): State<Arc<Health>>| async move { metrics_text(&h) }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(h): State<Arc<Health>>| async move {
                if h.ready.load(Ordering::Acquire) {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting")
                }
            }),
        )
        .with_state(health)
}

/// Runs the controller until SIGTERM/SIGINT.
pub async fn run(
    client: Client,
    defaults: Defaults,
    concurrency: u16,
    probe_pods: bool,
    health: Arc<Health>,
) {
    let mcps: Api<McpServer> = Api::all(client.clone());
    let managed = watcher::Config::default().labels("app.kubernetes.io/managed-by=quiver-operator");
    let controller = Controller::new(mcps, watcher::Config::default());
    let store = controller.store();
    let _ = health.store.set(store.clone());
    // Ready once the McpServer watch has listed (also with zero McpServers). The store's
    // readiness is a oneshot that wakes only one of several concurrent waiters (the controller
    // waits on it too), so re-poll it instead of awaiting it once.
    let (listed, flag) = (store.clone(), health.clone());
    tokio::spawn(async move {
        loop {
            match tokio::time::timeout(std::time::Duration::from_millis(250), listed.wait_until_ready()).await
            {
                Ok(Ok(())) => break flag.ready.store(true, Ordering::Release),
                Ok(Err(_)) => break,
                Err(_) => {}
            }
        }
    });
    let ctx = Arc::new(Context {
        client: client.clone(),
        defaults,
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "quiver-operator".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        metrics: health.metrics.clone(),
        probe_pods,
    });
    controller
        .owns(Api::<Deployment>::all(client.clone()), managed.clone())
        .owns(Api::<Service>::all(client.clone()), managed)
        // ConfigMaps: the tools ConfigMap each McpServer owns (drift repair), and any ConfigMap
        // an McpServer references in toolsFrom (its edits propagate).
        .watches(
            Api::<ConfigMap>::all(client.clone()),
            watcher::Config::default(),
            move |cm: ConfigMap| {
                let ns = cm.namespace().unwrap_or_default();
                let name = cm.name_any();
                let owners: Vec<ObjectRef<McpServer>> = cm
                    .owner_references()
                    .iter()
                    .filter(|o| o.kind == "McpServer" && o.api_version.starts_with("quiver.dev/"))
                    .map(|o| ObjectRef::new(&o.name).within(&ns))
                    .collect();
                let referencing = store
                    .state()
                    .into_iter()
                    .filter(|m| {
                        m.namespace().as_deref() == Some(ns.as_str())
                            && m.spec
                                .tools_from
                                .iter()
                                .any(|t| t.config_map_key_ref.name == name)
                    })
                    .map(|m| ObjectRef::from_obj(&*m))
                    .collect::<Vec<_>>();
                owners.into_iter().chain(referencing)
            },
        )
        .with_config(controller::Config::default().concurrency(concurrency))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile result");
            }
            async {}
        })
        .await;
}
