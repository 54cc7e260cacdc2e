//! The metrics of users' upstream authorization: sign-ins, refreshes and revocations by
//! upstream and result, the tokens the vault holds on this replica and what it refused or
//! could not read.
//! No series carries a caller or a token; the upstream is a name from the ToolSet.

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    upstream: String,
    result: &'static str,
}

/// How a sign-in ended: `ok`; the user's browser was not the caller's (`wrong_user`); the
/// link, state or cookie was refused (`state`); the vault did not keep the tokens (`vault`);
/// or the step of the OAuth flow that failed (`denied`, `issuer`, `token`, `unreachable`,
/// `discovery`, `registration`, `redirect`, `config`).
pub const SIGN_IN_RESULTS: [&str; 12] = [
    "ok",
    "wrong_user",
    "state",
    "vault",
    "denied",
    "issuer",
    "token",
    "unreachable",
    "discovery",
    "registration",
    "redirect",
    "config",
];

/// How a refresh ended: `ok`; the authorization server refused the refresh token
/// (`revoked`: the user signs in again); there was nothing to refresh with (`sign_in`); it
/// failed and is tried again later (`failed`, `busy`); or the vault failed (`vault`).
pub const REFRESH_RESULTS: [&str; 6] = ["ok", "revoked", "sign_in", "failed", "busy", "vault"];

/// How revoking a user's tokens at the authorization server (RFC 7009) ended, at sign-out or
/// an administrator's revocation: `ok`; the server names no revocation endpoint (`none`: the
/// tokens are only forgotten here); it refused, did not answer in time or could not be
/// reached (`failed`).
pub const REVOCATION_RESULTS: [&str; 3] = ["ok", "none", "failed"];

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
    sign_ins: Family<UpstreamLabels, Counter>,
    refreshes: Family<UpstreamLabels, Counter>,
    revocations: Family<UpstreamLabels, Counter>,
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
        root.register(
            "oauth_sign_ins",
            "Users' sign-ins to upstreams (identity.mode user) that ended, by upstream and result",
            m.sign_ins.clone(),
        );
        root.register(
            "oauth_refreshes",
            "Refreshes of users' upstream tokens, by upstream and result",
            m.refreshes.clone(),
        );
        root.register(
            "oauth_revocations",
            "Users' upstream tokens revoked at the authorization server (RFC 7009) at sign-out or an administrator's revocation, by upstream and result (ok, none, failed)",
            m.revocations.clone(),
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

    /// Counts a sign-in to `upstream` that ended with `result` (one of [`SIGN_IN_RESULTS`]).
    pub fn sign_in(&self, upstream: &str, result: &'static str) {
        self.sign_ins
            .get_or_create(&UpstreamLabels {
                upstream: upstream.to_owned(),
                result,
            })
            .inc();
    }

    /// Sign-ins to `upstream` that ended with `result` so far.
    pub fn sign_ins(&self, upstream: &str, result: &'static str) -> u64 {
        self.sign_ins
            .get_or_create(&UpstreamLabels {
                upstream: upstream.to_owned(),
                result,
            })
            .get()
    }

    /// Counts a refresh of a token for `upstream` that ended with `result` (one of
    /// [`REFRESH_RESULTS`]).
    pub fn refresh(&self, upstream: &str, result: &'static str) {
        self.refreshes
            .get_or_create(&UpstreamLabels {
                upstream: upstream.to_owned(),
                result,
            })
            .inc();
    }

    /// Refreshes for `upstream` that ended with `result` so far.
    pub fn refreshes(&self, upstream: &str, result: &'static str) -> u64 {
        self.refreshes
            .get_or_create(&UpstreamLabels {
                upstream: upstream.to_owned(),
                result,
            })
            .get()
    }

    /// Counts a revocation at the authorization server of a token for `upstream` that ended
    /// with `result` (one of [`REVOCATION_RESULTS`]).
    pub fn revocation(&self, upstream: &str, result: &'static str) {
        self.revocations
            .get_or_create(&UpstreamLabels {
                upstream: upstream.to_owned(),
                result,
            })
            .inc();
    }

    /// Revocations for `upstream` that ended with `result` so far.
    pub fn revocations(&self, upstream: &str, result: &'static str) -> u64 {
        self.revocations
            .get_or_create(&UpstreamLabels {
                upstream: upstream.to_owned(),
                result,
            })
            .get()
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
