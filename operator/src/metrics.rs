//! Operator metrics (prefix `quiver_operator_`). Error labels are static categories, never
//! formatted errors, so the series count stays bounded.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    category: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The operator's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    duration: Histogram,
    reconciles: Family<ResultLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("quiver_operator");
        let duration = Histogram::new([
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ]);
        registry.register_with_unit(
            "reconcile_duration",
            "Time of one reconcile",
            Unit::Seconds,
            duration.clone(),
        );
        let reconciles = Family::<ResultLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles by result (ok, invalid_spec, error)",
            reconciles.clone(),
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Failed reconciles by error category",
            errors.clone(),
        );
        Self {
            registry,
            duration,
            reconciles,
            errors,
        }
    }
}

impl Metrics {
    /// Records a reconcile.
    pub fn observe(&self, d: Duration, error: Option<&'static str>) {
        self.duration.observe(d.as_secs_f64());
        match error {
            None => self
                .reconciles
                .get_or_create(&ResultLabels { result: "ok" })
                .inc(),
            Some(category) => {
                self.reconciles
                    .get_or_create(&ResultLabels { result: "error" })
                    .inc();
                self.errors.get_or_create(&ErrorLabels { category }).inc()
            }
        };
    }

    /// Counts a reconcile that found an invalid spec.
    pub fn invalid(&self) {
        self.reconciles
            .get_or_create(&ResultLabels {
                result: "invalid_spec",
            })
            .inc();
    }

    /// Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
