//! Operator metrics (prefix `quiver_operator_`). Error labels are static categories, never
//! formatted errors, so the series count stays bounded. With tracing on, each bucket of the
//! reconcile duration keeps the trace id of the latest sampled reconcile that landed in it
//! (an OpenMetrics exemplar).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::TraceId;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    category: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    stage: &'static str,
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReviewLabels {
    review: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    condition: &'static str,
    status: &'static str,
}

/// Error categories, pre-created at zero so dashboards and alerts always have series.
pub const ERROR_CATEGORIES: [&str; 7] = [
    "api",
    "conflict",
    "forbidden",
    "not_owned",
    "rejected",
    "transport",
    "unnamed",
];
/// Conditions counted by `quiver_operator_mcpservers`.
pub const CONDITIONS: [&str; 5] = [
    "Ready",
    "ConfigValid",
    "Degraded",
    "Progressing",
    "UpstreamsReady",
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The label of an exemplar: the trace of the reconcile it measured.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TraceLabels {
    trace_id: String,
}

/// How one reconcile ended: exactly one of these is counted per reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Children applied, status written.
    Ok,
    /// The spec cannot be served: a condition and an event say why.
    InvalidSpec,
    /// The reconcile failed.
    Error {
        /// What the API answered (one of [`ERROR_CATEGORIES`]).
        category: &'static str,
        /// The step that failed (`fetch`, `render`, `owner`, `apply`, `delete`, `status`,
        /// `probe`).
        stage: &'static str,
        /// The kind of the object whose call failed.
        kind: &'static str,
    },
}

/// The operator's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    duration: HistogramWithExemplars<TraceLabels>,
    reconciles: Family<ResultLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    stage_errors: Family<StageLabels, Counter>,
    inflight: prometheus_client::metrics::gauge::Gauge,
    by_condition: Family<ConditionLabels, prometheus_client::metrics::gauge::Gauge>,
    leader: prometheus_client::metrics::gauge::Gauge,
    catalog_requests: Family<CodeLabels, Counter>,
    catalog_duration: prometheus_client::metrics::histogram::Histogram,
    catalog_reviews: Family<ReviewLabels, Counter>,
    console_sign_ins: Family<ResultLabels, Counter>,
    console_calls: Family<ResultLabels, Counter>,
}

/// A counter family by `result`, registered as `name` with each of `results` at zero.
fn by_result(
    registry: &mut Registry,
    name: &str,
    help: &str,
    results: &[&'static str],
) -> Family<ResultLabels, Counter> {
    let f = Family::<ResultLabels, Counter>::default();
    registry.register(name, help, f.clone());
    for &result in results {
        let _ = f.get_or_create(&ResultLabels { result });
    }
    f
}

/// Results of console sign-ins.
pub const SIGN_IN_RESULTS: [&str; 3] = ["ok", "refused", "unavailable"];
/// Results of tool calls made through the console.
pub const CONSOLE_CALL_RESULTS: [&str; 4] = ["ok", "tool_error", "refused", "invalid"];

/// HTTP status codes of the catalog, pre-created at zero.
const CATALOG_CODES: [u16; 6] = [200, 304, 400, 401, 404, 503];

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("quiver_operator");
        let duration = HistogramWithExemplars::new(
            [
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]
            .into_iter(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Time of one reconcile",
            Unit::Seconds,
            duration.clone(),
        );
        let reconciles = by_result(
            &mut registry,
            "reconciles",
            "Reconciles by result (ok, invalid_spec, error)",
            &["ok", "invalid_spec", "error"],
        );
        let console_sign_ins = by_result(
            &mut registry,
            "console_sign_ins",
            "Sign-ins to the console by result: ok, refused (the provider, the ID token or the browser's state said no), unavailable (the provider could not be read or reached)",
            &SIGN_IN_RESULTS,
        );
        let console_calls = by_result(
            &mut registry,
            "console_calls",
            "Tool calls made through the console's forms by result: ok, tool_error (the tool answered with isError), refused (the server refused the call or did not answer), invalid (a value did not fit its field; nothing was sent)",
            &CONSOLE_CALL_RESULTS,
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Failed reconciles by error category",
            errors.clone(),
        );
        let stage_errors = Family::<StageLabels, Counter>::default();
        registry.register(
            "reconcile_stage_errors",
            "Failed reconciles by the step that failed and the kind of the object it was about",
            stage_errors.clone(),
        );
        for category in ERROR_CATEGORIES {
            let _ = errors.get_or_create(&ErrorLabels { category });
        }
        let inflight = prometheus_client::metrics::gauge::Gauge::default();
        registry.register("reconciles_in_flight", "Reconciles running now", inflight.clone());
        let by_condition = Family::<ConditionLabels, prometheus_client::metrics::gauge::Gauge>::default();
        registry.register(
            "mcpservers",
            "McpServers by condition (Ready, ConfigValid, Degraded, Progressing, UpstreamsReady) and status, as of the last scrape",
            by_condition.clone(),
        );
        let leader = prometheus_client::metrics::gauge::Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader lease (or runs without leader election), 0 on standby",
            leader.clone(),
        );
        let (catalog_requests, catalog_duration, catalog_reviews) = catalog_metrics(&mut registry);
        Self {
            console_sign_ins,
            console_calls,
            catalog_requests,
            catalog_duration,
            catalog_reviews,
            leader,
            registry,
            duration,
            reconciles,
            errors,
            stage_errors,
            inflight,
            by_condition,
        }
    }
}

/// The catalog's requests (by code), their durations and its reviews, pre-created at zero.
fn catalog_metrics(
    registry: &mut Registry,
) -> (
    Family<CodeLabels, Counter>,
    prometheus_client::metrics::histogram::Histogram,
    Family<ReviewLabels, Counter>,
) {
    let catalog_requests = Family::<CodeLabels, Counter>::default();
    registry.register(
        "catalog_requests",
        "Requests of the catalog (the MCP Registry API) by HTTP status code",
        catalog_requests.clone(),
    );
    for code in CATALOG_CODES {
        let _ = catalog_requests.get_or_create(&CodeLabels { code });
    }
    let catalog_duration = prometheus_client::metrics::histogram::Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
    ]);
    registry.register_with_unit(
        "catalog_request_duration",
        "Time to answer one request of the catalog",
        Unit::Seconds,
        catalog_duration.clone(),
    );
    let catalog_reviews = Family::<ReviewLabels, Counter>::default();
    registry.register(
        "catalog_reviews",
        "TokenReviews (review=token) and SubjectAccessReviews (review=access) the catalog made, by result: ok, denied, error (the API server did not answer or refused the operator)",
        catalog_reviews.clone(),
    );
    for review in ["token", "access"] {
        for result in ["ok", "denied", "error"] {
            let _ = catalog_reviews.get_or_create(&ReviewLabels { review, result });
        }
    }
    (catalog_requests, catalog_duration, catalog_reviews)
}

impl Metrics {
    /// Records one reconcile with its one outcome; `trace` is the trace of its span when
    /// that was sampled (tracing on), kept as the exemplar of the bucket it lands in.
    pub fn observe(&self, d: Duration, outcome: Outcome, trace: Option<TraceId>) {
        let exemplar = trace.map(|t| TraceLabels {
            trace_id: t.to_string(),
        });
        // When (a clock before 1970 gives none: the encoder could not write it).
        let at = exemplar
            .as_ref()
            .map(|_| SystemTime::now())
            .filter(|t| t.duration_since(UNIX_EPOCH).is_ok());
        self.duration.observe(d.as_secs_f64(), exemplar, at);
        let result = match outcome {
            Outcome::Ok => "ok",
            Outcome::InvalidSpec => "invalid_spec",
            Outcome::Error {
                category,
                stage,
                kind,
            } => {
                self.errors.get_or_create(&ErrorLabels { category }).inc();
                self.stage_errors
                    .get_or_create(&StageLabels { stage, kind })
                    .inc();
                "error"
            }
        };
        self.reconciles.get_or_create(&ResultLabels { result }).inc();
    }

    /// Counts one request of the catalog with its status code and time.
    pub fn catalog_request(&self, code: u16, d: Duration) {
        self.catalog_requests.get_or_create(&CodeLabels { code }).inc();
        self.catalog_duration.observe(d.as_secs_f64());
    }

    /// Counts one review the catalog made.
    pub fn catalog_review(&self, review: &'static str, result: &'static str) {
        self.catalog_reviews
            .get_or_create(&ReviewLabels { review, result })
            .inc();
    }

    /// Counts one console sign-in (one of [`SIGN_IN_RESULTS`]).
    pub fn console_sign_in(&self, result: &'static str) {
        self.console_sign_ins
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counts one tool call made through the console (one of [`CONSOLE_CALL_RESULTS`]).
    pub fn console_call(&self, result: &'static str) {
        self.console_calls.get_or_create(&ResultLabels { result }).inc();
    }

    /// Sets whether this replica leads (reconciles); standbys report 0.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Marks a reconcile as started; the guard marks it finished.
    pub fn start(&self) -> InFlight<'_> {
        self.inflight.inc();
        InFlight(&self.inflight)
    }

    /// Sets the per-condition counts from the McpServers' current conditions.
    pub fn set_conditions<'a>(&self, conditions: impl Iterator<Item = (&'a str, &'a str)>) {
        let statuses = ["True", "False", "Unknown"];
        let mut counts = [[0i64; 3]; CONDITIONS.len()];
        for (c, s) in conditions {
            if let Some(ci) = CONDITIONS.iter().position(|k| *k == c) {
                let si = statuses.iter().position(|k| *k == s).unwrap_or(2);
                counts[ci][si] += 1;
            }
        }
        for (ci, condition) in CONDITIONS.iter().enumerate() {
            for (si, status) in statuses.iter().enumerate() {
                self.by_condition
                    .get_or_create(&ConditionLabels { condition, status })
                    .set(counts[ci][si]);
            }
        }
    }

    /// Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Decrements the in-flight gauge when dropped.
#[derive(Debug)]
pub struct InFlight<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}
