//! [`TokenSet`]: what one user holds for one upstream, its bounds, when it is still usable
//! and how long the vault keeps it. Its `Debug` shows no token.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Tokens one user holds for one upstream. Debug prints no token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenSet {
    /// Sent to the upstream as `Authorization: Bearer`.
    pub access_token: String,
    /// Exchanged at `token_endpoint` for a new access token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// When the access token expires (`expires_in` at receipt); `None`: the authorization
    /// server did not say, and the token is used until the upstream refuses it.
    #[serde(default, with = "unix_seconds", skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<SystemTime>,
    /// When it was issued (received): with `expires_at`, its lifetime, which bounds how early
    /// it is refreshed.
    #[serde(default, with = "unix_seconds", skip_serializing_if = "Option::is_none")]
    pub obtained_at: Option<SystemTime>,
    /// The scope granted, as the authorization server wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The resource it was asked for (RFC 8707): the upstream's URL, canonical. It is sent
    /// to that URL only: a token whose upstream moved is forgotten.
    #[serde(default)]
    pub resource: String,
    /// The authorization server that issued it (its RFC 8414 `issuer`).
    pub issuer: String,
    /// Where to refresh it.
    pub token_endpoint: String,
    /// The client that obtained it (a refresh needs it).
    pub client_id: String,
    /// The secret of that client when the server registered it itself (RFC 7591): kept
    /// sealed with the tokens so that every replica refreshes as that client. `None` for a
    /// public client, and for one configured (its secret is read from its Secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// How that client authenticates (`client_secret_basic` or `client_secret_post`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<String>,
    /// The upstream account, when known (the id token's `sub`, userinfo), for the audit trail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

impl std::fmt::Debug for TokenSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const HIDDEN: &str = "<redacted>";
        f.debug_struct("TokenSet")
            .field("access_token", &HIDDEN)
            .field("refresh_token", &self.refresh_token.as_ref().map(|_| HIDDEN))
            .field("expires_at", &self.expires_at)
            .field("obtained_at", &self.obtained_at)
            .field("scope", &self.scope)
            .field("resource", &self.resource)
            .field("issuer", &self.issuer)
            .field("token_endpoint", &self.token_endpoint)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| HIDDEN))
            .field("client_auth", &self.client_auth)
            .field("account", &self.account)
            .finish()
    }
}

/// At most this share of a token's lifetime is cut off its end by the refresh margin: a token
/// living 30 s is refreshed 7.5 s before it expires, not on every use.
const MAX_SKEW_SHARE: u32 = 4;

/// Whether `t`'s access token can still be sent at `now`: before [`TokenSet::refresh_at`]
/// (a token without an expiry is usable until the upstream refuses it).
pub fn usable(t: &TokenSet, now: SystemTime, skew: Duration) -> bool {
    t.refresh_at(skew).is_none_or(|at| now < at)
}

/// Longest fields of a [`TokenSet`] the vault keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldBounds {
    /// The access and the refresh token, each, in bytes.
    pub max_token: usize,
    /// Every other field, each, in bytes.
    pub max_field: usize,
}

impl Default for FieldBounds {
    fn default() -> Self {
        Self {
            max_token: 8 * 1024,
            max_field: 2048,
        }
    }
}

/// A field over its bound or empty where it must not be: its name, its length, the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BadField {
    pub(super) field: &'static str,
    pub(super) len: usize,
    pub(super) max: usize,
}

impl TokenSet {
    /// When its access token is refreshed rather than sent: `skew` before it expires, but
    /// never more than a quarter of its lifetime before (`None`: no expiry).
    pub fn refresh_at(&self, skew: Duration) -> Option<SystemTime> {
        let at = self.expires_at?;
        let skew = match self.obtained_at.and_then(|o| at.duration_since(o).ok()) {
            Some(life) => skew.min(life / MAX_SKEW_SHARE),
            None => skew,
        };
        Some(at.checked_sub(skew).unwrap_or(at))
    }

    /// Checks every field against `b`: tokens within `max_token`, the others within
    /// `max_field`, an access token, resource, issuer, token endpoint and client id present.
    pub(super) fn check(&self, b: FieldBounds) -> Result<(), BadField> {
        let opt = |o: &Option<String>| o.as_deref().map_or(0, str::len);
        let fields: [(&'static str, usize, usize, bool); 10] = [
            ("access_token", self.access_token.len(), b.max_token, true),
            ("refresh_token", opt(&self.refresh_token), b.max_token, false),
            ("scope", opt(&self.scope), b.max_field, false),
            ("resource", self.resource.len(), b.max_field, true),
            ("issuer", self.issuer.len(), b.max_field, true),
            ("token_endpoint", self.token_endpoint.len(), b.max_field, true),
            ("client_id", self.client_id.len(), b.max_field, true),
            ("client_secret", opt(&self.client_secret), b.max_field, false),
            ("client_auth", opt(&self.client_auth), b.max_field, false),
            ("account", opt(&self.account), b.max_field, false),
        ];
        for (field, len, max, required) in fields {
            if len > max || (required && len == 0) {
                return Err(BadField { field, len, max });
            }
        }
        Ok(())
    }

    /// How long the vault keeps it from `now`, at most `max`: while it can be refreshed, the
    /// longest (the refresh token's lifetime is not told); without a refresh token, until
    /// its access token expires.
    pub(super) fn keep_for(&self, now: SystemTime, max: Duration) -> Duration {
        let keep = match (&self.refresh_token, self.expires_at) {
            (None, Some(at)) => at.duration_since(now).unwrap_or(Duration::ZERO),
            _ => max,
        };
        keep.clamp(Duration::from_millis(1), max.max(Duration::from_millis(1)))
    }

    /// The result of a refresh, completed from the tokens it replaces: an authorization
    /// server that issued no new refresh token (RFC 6749 section 6) keeps the old one valid;
    /// the account and scope stay what they were when the answer does not say.
    pub(super) fn refreshed_from(mut self, old: &TokenSet) -> Self {
        if self.refresh_token.is_none() {
            self.refresh_token.clone_from(&old.refresh_token);
        }
        if self.account.is_none() {
            self.account.clone_from(&old.account);
        }
        if self.scope.is_none() {
            self.scope.clone_from(&old.scope);
        }
        if self.client_secret.is_none() && self.client_id == old.client_id {
            self.client_secret.clone_from(&old.client_secret);
            self.client_auth.clone_from(&old.client_auth);
        }
        self
    }
}

/// `Option<SystemTime>` as whole seconds since the Unix epoch.
mod unix_seconds {
    use super::{Duration, SystemTime, UNIX_EPOCH};
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_u64(t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SystemTime>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.and_then(|s| UNIX_EPOCH.checked_add(Duration::from_secs(s))))
    }
}
