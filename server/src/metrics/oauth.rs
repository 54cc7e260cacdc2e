//! The metrics of users' upstream authorization: the tokens the vault holds on this replica
//! and what it refused or could not read. No series carries a caller, an upstream or a token.

use std::sync::Arc;
use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Why the vault refused to keep a token or dropped one it read: it did not open (`forged`),
/// it was sealed under a key no longer in the ring (`unknown_key`), Redis failed (`redis`),
/// it was over a size bound (`too_large`), or keeping it would pass the bound of users or
/// of upstreams per user (`over_bound`).
pub const VAULT_ERROR_REASONS: [&str; 5] = ["forged", "unknown_key", "redis", "too_large", "over_bound"];

/// Metrics of the token vault.
#[derive(Debug, Default)]
pub struct OAuthMetrics {
    vault_tokens: Gauge<i64, AtomicI64>,
    vault_errors: Family<ReasonLabels, Counter>,
}

impl OAuthMetrics {
    /// Registers the metrics in `root` (the `quiver_` registry).
    pub fn register(root: &mut Registry) -> Arc<Self> {
        let m = Self::default();
        root.register(
            "oauth_vault_tokens",
            "Upstream tokens users hold in this replica's memory vault (a Redis vault is not counted here)",
            m.vault_tokens.clone(),
        );
        root.register(
            "oauth_vault_errors",
            "Upstream tokens the vault refused to keep or dropped on read, by reason (forged, unknown_key, redis, too_large, over_bound)",
            m.vault_errors.clone(),
        );
        // Every reason at 0 from the start, so a rate over it is 0, not absent.
        for reason in VAULT_ERROR_REASONS {
            let _ = m.vault_errors.get_or_create(&ReasonLabels { reason });
        }
        Arc::new(m)
    }

    /// Metrics not exposed anywhere (tests).
    pub fn unregistered() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Counts one vault error of `reason` (one of [`VAULT_ERROR_REASONS`]).
    pub fn vault_error(&self, reason: &'static str) {
        self.vault_errors.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Vault errors of `reason` so far.
    pub fn vault_errors(&self, reason: &'static str) -> u64 {
        self.vault_errors.get_or_create(&ReasonLabels { reason }).get()
    }

    /// Moves the count of tokens held in memory by `delta`.
    pub fn vault_tokens_add(&self, delta: i64) {
        self.vault_tokens.inc_by(delta);
    }

    /// Tokens held in memory now.
    pub fn vault_tokens(&self) -> i64 {
        self.vault_tokens.get()
    }
}
