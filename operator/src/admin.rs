//! The operator's admin endpoints: `/metrics`, `/healthz`, `/readyz`.
//!
//! Readiness means "this process is healthy and can do its part": the only replica (no
//! leader election) is ready once its McpServer cache has listed; with leader election a
//! replica is ready while its Lease requests are answered, whether it leads or stands by, so
//! a rolling update with `maxUnavailable: 0` can proceed. Leadership is the
//! `quiver_operator_leader` gauge (and the body of `/readyz`), not readiness.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kube::runtime::reflector::Store;

use crate::crd::McpServer;
use crate::metrics::Metrics;

/// Shared between the controller, the leader election and the admin endpoints.
#[derive(Default)]
pub struct Health {
    /// Set once the McpServer watch has listed.
    pub listed: AtomicBool,
    /// With leader election: set while this replica's Lease requests are answered.
    pub lease_ok: AtomicBool,
    /// Set while this replica reconciles (leads, or runs without leader election).
    pub leading: AtomicBool,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The controllers' caches of McpServers (one per watched namespace, or one for the
    /// cluster), for per-condition counts at scrape time.
    pub stores: std::sync::Mutex<Vec<Store<McpServer>>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("listed", &self.listed)
            .field("lease_ok", &self.lease_ok)
            .field("leading", &self.leading)
            .finish_non_exhaustive()
    }
}

impl Health {
    /// Whether `/readyz` answers 200.
    pub fn ready(&self) -> bool {
        self.listed.load(Ordering::Acquire) || self.lease_ok.load(Ordering::Acquire)
    }

    /// Records whether this replica reconciles (also the `quiver_operator_leader` gauge).
    pub fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::Release);
        self.metrics.set_leader(leading);
    }
}

/// `/metrics`: the OpenMetrics text (its exemplars are OpenMetrics only; Prometheus reads
/// them from this content type).
async fn metrics(State(h): State<Arc<Health>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics_text(&h),
    )
        .into_response()
}

fn metrics_text(h: &Health) -> String {
    let stores = h.stores.lock().map(|s| s.clone()).unwrap_or_default();
    if !stores.is_empty() {
        let all: Vec<_> = stores.iter().flat_map(Store::state).collect();
        h.metrics.set_conditions(all.iter().flat_map(|m| {
            m.status
                .iter()
                .flat_map(|s| s.conditions.iter().map(|c| (c.type_.as_str(), c.status.as_str())))
        }));
    }
    h.metrics.encode()
}

async fn readyz(State(h): State<Arc<Health>>) -> (StatusCode, &'static str) {
    match (h.ready(), h.leading.load(Ordering::Acquire)) {
        (true, true) => (StatusCode::OK, "ready (leader)"),
        (true, false) => (StatusCode::OK, "ready (standby)"),
        (false, _) => (StatusCode::SERVICE_UNAVAILABLE, "starting"),
    }
}

/// The admin router: /metrics, /healthz, /readyz.
pub fn router(health: Arc<Health>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(health)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn metrics_are_served_as_openmetrics_text() {
        let health = Arc::new(Health::default());
        let r = metrics(State(health)).await;
        assert_eq!(
            r.headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
        );
        let body = http_body_util::BodyExt::collect(r.into_body())
            .await
            .unwrap()
            .to_bytes();
        let text = std::str::from_utf8(&body).unwrap();
        assert!(
            text.contains("# TYPE quiver_operator_reconcile_duration_seconds histogram"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
