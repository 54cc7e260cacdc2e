//! The metrics of rate and concurrency limits and of the audit trail. No series carries a
//! caller: limited calls are counted by tool, the place of the limit and why.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitedLabels {
    tool: String,
    scope: &'static str,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// Why a shared limit check was not decided by Redis: it answered an error, it did not
/// answer in time, or the limiter was backing off after one of those.
pub const SHARED_FAILURE_KINDS: [&str; 3] = ["error", "timeout", "backoff"];

/// Counters of limits and the audit trail.
#[derive(Debug, Default)]
pub struct GovMetrics {
    limited: Family<LimitedLabels, Counter>,
    evicted: Counter,
    shared_failures: Family<KindLabels, Counter>,
    /// Audit records written to the sink.
    pub audit_records: Counter,
    /// Audit records dropped (queue full, or the sink failed).
    pub audit_dropped: Counter,
    /// Calls refused because their audit record could not be queued (`--audit-on-full
    /// refuse`).
    pub audit_refused: Counter,
    /// Tools a listing left unjudged because its policy evaluation budget was spent.
    pub policy_unjudged: Counter,
}

impl GovMetrics {
    /// Registers the counters in `root` (the `quiver_` registry).
    pub fn register(root: &mut Registry) -> Arc<Self> {
        let m = Self::default();
        root.register(
            "limited",
            "Tool calls refused by a rate or concurrency limit, by tool, scope of the limit and kind",
            m.limited.clone(),
        );
        root.register(
            "limit_keys_evicted",
            "Limit budgets forgotten before they were idle, to keep the key map within its bound",
            m.evicted.clone(),
        );
        root.register(
            "limits_shared_failures",
            "Shared (Redis) limit checks Redis did not decide, by kind (error, timeout, backoff)",
            m.shared_failures.clone(),
        );
        // Every kind at 0 from the start: a rate over it is 0, not absent, until Redis fails.
        for kind in SHARED_FAILURE_KINDS {
            let _ = m.shared_failures.get_or_create(&KindLabels { kind });
        }
        root.register("audit_records", "Audit records written", m.audit_records.clone());
        root.register(
            "audit_dropped",
            "Audit records dropped because the queue was full or the sink failed",
            m.audit_dropped.clone(),
        );
        root.register(
            "audit_refused",
            "Calls refused before they ran because their audit record could not be queued (--audit-on-full refuse)",
            m.audit_refused.clone(),
        );
        root.register(
            "policy_list_unjudged",
            "Tools left out of a tools/list page or a find_tools search because the request's policy evaluation budget was spent",
            m.policy_unjudged.clone(),
        );
        Arc::new(m)
    }

    /// Counters not exposed anywhere (tests).
    pub fn unregistered() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Counts a refused call.
    pub fn limited(&self, tool: &str, scope: &'static str, kind: &'static str) {
        self.limited
            .get_or_create(&LimitedLabels {
                tool: tool.to_owned(),
                scope,
                kind,
            })
            .inc();
    }

    /// Refused calls so far of `tool` by limits of `scope` for `kind`.
    pub fn limited_count(&self, tool: &str, scope: &'static str, kind: &'static str) -> u64 {
        self.limited
            .get_or_create(&LimitedLabels {
                tool: tool.to_owned(),
                scope,
                kind,
            })
            .get()
    }

    /// Counts a budget forgotten early.
    pub fn limit_key_evicted(&self) {
        self.evicted.inc();
    }

    /// Counts a shared limit check Redis did not decide.
    pub fn shared_failure(&self, kind: &'static str) {
        self.shared_failures.get_or_create(&KindLabels { kind }).inc();
    }

    /// Shared limit checks of `kind` Redis did not decide.
    pub fn shared_failures(&self, kind: &'static str) -> u64 {
        self.shared_failures.get_or_create(&KindLabels { kind }).get()
    }
}
