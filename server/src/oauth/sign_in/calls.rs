//! What a call of an upstream with `identity.mode: user` gets: the caller's token (refreshed
//! first when it is about to expire, or when the upstream refused it), or a sign-in link;
//! and the caller's sign-out, and an administrator's revocation.

use std::sync::Arc;

use http::HeaderValue;

use super::ticket::{self, TICKET_AAD, Ticket};
pub use super::warm::Bearer;
use super::{SignIn, flow};
use crate::oauth::vault::{Held, RefreshError, RefreshFailure, TokenSet};
use crate::spec::identity::Identity;

/// The longest a sign-out or a revocation waits for an authorization server to revoke a
/// token.
const REVOKE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);
/// Revocations run off the caller's path at once, at most (tokens a refresh could not keep,
/// tokens of an upstream that moved); past it, a token is forgotten without one (counted
/// `failed`).
pub(super) const MAX_BACKGROUND_REVOCATIONS: usize = 16;

/// Why a token held is not sent to the upstream as configured now.
const MOVED: &str = "the upstream's URL or authorization server changed since the user signed in";

/// Whether `t` may go to the upstream `id` describes now: it was asked for the upstream's
/// URL (RFC 8707 `resource`), from the server `issuer` names when it names one.
fn bound(t: &TokenSet, id: &Identity) -> bool {
    id.issuer.as_deref().is_none_or(|i| i == t.issuer)
        && flow::parse_url(&id.audience).is_ok_and(|u| flow::canonical(&u) == t.resource)
}

/// A link the user opens to sign in to an upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignInLink {
    /// The upstream.
    pub upstream: String,
    /// `URL/oauth/start?t=TICKET`.
    pub url: String,
    /// An id for the client (the URL-mode elicitation's `elicitationId`): the link's nonce,
    /// which names nothing.
    pub id: String,
}

/// How a call authenticates to the upstream.
#[derive(Debug)]
pub enum CallAuth {
    /// `Authorization: Bearer ...` with the caller's token.
    Bearer(Bearer),
    /// The caller has no usable token: it signs in first.
    SignIn(SignInLink),
    /// The call cannot go out now (the vault or the authorization server failed, no key
    /// ring): why, for the caller.
    Refused(String),
}

impl SignIn {
    /// The `Authorization` of `t` (checked against `id`), kept warm while it is usable.
    fn bearer(&self, subject: &str, t: &TokenSet, upstream: &str, id: &Identity) -> CallAuth {
        match HeaderValue::try_from(format!("Bearer {}", t.access_token)) {
            Ok(header) => {
                let until = t.refresh_at(self.vault.options().skew);
                let max = self.shared.then_some(super::warm::SHARED_TTL);
                let b = Bearer {
                    header,
                    account: t.account.as_deref().map(Arc::from),
                };
                self.warm
                    .put((subject, upstream), (&id.audience, &t.issuer), &b, until, max);
                CallAuth::Bearer(b)
            }
            Err(_) => CallAuth::Refused(format!(
                "upstream `{upstream}`: the token its authorization server issued cannot be sent in a header"
            )),
        }
    }

    /// The authorization of a call by `subject` (`iss|sub`) to upstream `name` with `id`.
    pub async fn authorize(&self, subject: &str, name: &str, id: &Identity) -> CallAuth {
        if let Err(e) = self.ring() {
            return CallAuth::Refused(e);
        }
        if let Some(h) = self.warm.get(subject, name, &id.audience, id.issuer.as_deref()) {
            return CallAuth::Bearer(h);
        }
        match self.vault.held(subject, name).await {
            Err(e) => CallAuth::Refused(e.to_string()),
            Ok(Some(h)) if !bound(&h.tokens, id) => self.moved(subject, name, id, &h).await,
            Ok(Some(h)) if self.vault.usable(&h.tokens) => self.bearer(subject, &h.tokens, name, id),
            Ok(Some(h)) if h.tokens.refresh_token.is_some() => self.refreshed(subject, name, id, None).await,
            Ok(_) => self.link(subject, name),
        }
    }

    /// A token of an upstream that moved (another URL, another pinned authorization
    /// server, as `id` says now): forgotten unless a sign-in replaced it meanwhile, revoked
    /// off the caller's path, and a sign-in link.
    async fn moved(&self, subject: &str, name: &str, id: &Identity, held: &Held) -> CallAuth {
        self.warm.forget(subject, Some(name));
        match self.vault.discard(subject, name, held).await {
            Ok(forgotten) => {
                tracing::info!(
                    upstream = name,
                    "upstream sign-in: {MOVED}; the user's token was forgotten"
                );
                if forgotten {
                    let (_, up) =
                        self.upstream_of(&held.tokens, Some(name), &[(name.to_owned(), id.clone())]);
                    self.revoke_later(held.tokens.clone(), name, up);
                }
                self.audit("oauth.sign_out", subject, name, "moved", Some(MOVED.into()));
                self.link(subject, name)
            }
            Err(e) => CallAuth::Refused(e.to_string()),
        }
    }

    /// The authorization after the upstream answered `401` to `sent` (the `Authorization`
    /// value): the token refreshed once (whoever refreshes first, the others share it), or a
    /// sign-in link.
    pub async fn rejected(&self, subject: &str, name: &str, id: &Identity, sent: &HeaderValue) -> CallAuth {
        self.warm.forget(subject, Some(name));
        if let Err(e) = self.ring() {
            return CallAuth::Refused(e);
        }
        let token = sent
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        self.refreshed(subject, name, id, Some(token)).await
    }

    /// The upstream refused the token `sent` (the `Authorization` value) again right after it
    /// was refreshed: it is forgotten if the vault still holds it (a sign-in or a refresh
    /// meanwhile is kept), and the caller signs in again.
    pub async fn refused_again(&self, subject: &str, name: &str, sent: &HeaderValue) -> CallAuth {
        self.warm.forget(subject, Some(name));
        let token = sent
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        let held = match self.vault.held(subject, name).await {
            Ok(Some(h)) => h,
            Ok(None) => return self.link(subject, name),
            Err(e) => return CallAuth::Refused(e.to_string()),
        };
        if held.tokens.access_token != token {
            return CallAuth::Refused(format!(
                "upstream `{name}` refused the token, and a newer one is held now: retry the call"
            ));
        }
        match self.vault.discard(subject, name, &held).await {
            Ok(_) => {
                self.audit(
                    "oauth.sign_out",
                    subject,
                    name,
                    "refused_by_upstream",
                    Some("the upstream refused the token after a refresh; forgotten".into()),
                );
                self.link(subject, name)
            }
            Err(e) => CallAuth::Refused(e.to_string()),
        }
    }

    async fn refreshed(&self, subject: &str, name: &str, id: &Identity, rejected: Option<&str>) -> CallAuth {
        let up = match self.upstream(name, id) {
            Ok(u) => u,
            Err(e) => return CallAuth::Refused(e),
        };
        let flow = &self.flow;
        let up = &up;
        // Tokens the refresh obtained after a sign-out, a revocation or another sign-in are
        // held by no one: revoked off the caller's path.
        let dropped = |t: TokenSet| self.revoke_later(t, name, up.clone());
        let r = self
            .vault
            .refresh_once_dropping(
                subject,
                name,
                rejected,
                |t| async move {
                    if !bound(&t, id) {
                        return Err(RefreshFailure::InvalidGrant(MOVED.into()));
                    }
                    // A refused grant or client forgets the tokens (no refresh will ever work:
                    // the user signs in again, registering again if the server forgot the
                    // client); a refused scope, a malformed request, an outage leave them for
                    // the next try.
                    flow.refresh(&t, up).await.map_err(|e| match e {
                        flow::Error::InvalidGrant(_) | flow::Error::InvalidClient(_) => {
                            RefreshFailure::InvalidGrant(e.to_string())
                        }
                        other => RefreshFailure::Other(other.to_string()),
                    })
                },
                dropped,
            )
            .await;
        let (result, reason) = match &r {
            Ok(_) => ("ok", None),
            Err(RefreshError::SignIn { .. }) => ("sign_in", None),
            Err(e @ RefreshError::Revoked { .. }) => ("revoked", Some(e.to_string())),
            Err(e @ RefreshError::Failed { .. }) => ("failed", Some(e.to_string())),
            Err(e @ RefreshError::Busy { .. }) => ("busy", Some(e.to_string())),
            Err(e @ RefreshError::Vault(_)) => ("vault", Some(e.to_string())),
        };
        self.metrics.refresh(name, result);
        if result != "sign_in" {
            self.audit("oauth.refresh", subject, name, result, reason);
        }
        match r {
            // Usable without a refresh: checked here too.
            Ok(t) if !bound(&t, id) => match self.vault.held(subject, name).await {
                Ok(Some(h)) => self.moved(subject, name, id, &h).await,
                Ok(None) => self.link(subject, name),
                Err(e) => CallAuth::Refused(e.to_string()),
            },
            Ok(t) => self.bearer(subject, &t, name, id),
            Err(RefreshError::SignIn { .. } | RefreshError::Revoked { .. }) => self.link(subject, name),
            Err(e) => CallAuth::Refused(e.to_string()),
        }
    }

    /// A sign-in link for `subject` and upstream `name`, good for ten minutes.
    pub fn link(&self, subject: &str, name: &str) -> CallAuth {
        let made = self.ring().and_then(|ring| {
            let nonce = flow::random(16).map_err(|e| e.to_string())?;
            let t = Ticket::new(subject, name, nonce);
            Ok((ticket::seal(&ring, TICKET_AAD, &t)?, t.n))
        });
        match made {
            Ok((sealed, nonce)) => CallAuth::SignIn(SignInLink {
                upstream: name.to_owned(),
                url: format!("{}/oauth/start?t={sealed}", self.base),
                id: nonce,
            }),
            Err(e) => CallAuth::Refused(e),
        }
    }

    /// Forgets what `subject` holds for upstream `name` (the user signs out), and revokes it
    /// at the authorization server (RFC 7009, best effort); whether it held something.
    /// `upstreams`: the upstreams of mode `user` as configured now.
    ///
    /// # Errors
    /// The vault failed.
    pub async fn sign_out(
        &self,
        subject: &str,
        name: &str,
        upstreams: &[(String, Identity)],
    ) -> Result<bool, String> {
        self.warm.forget(subject, Some(name));
        let gone = self
            .vault
            .remove(subject, name)
            .await
            .map_err(|e| e.to_string())?;
        let reason = match &gone {
            Some(t) => Some(said_of(self.revoke_at_server(t, Some(name), upstreams).await).to_owned()),
            None => None,
        };
        self.audit("oauth.sign_out", subject, name, "ok", reason);
        Ok(gone.is_some())
    }

    /// Forgets what `subject` holds for `upstream`, or for every upstream (an administrator
    /// revoking a user), and revokes it at the authorization servers (best effort, at most
    /// [`REVOKE_LIMIT`]); how many tokens were forgotten.
    ///
    /// # Errors
    /// The vault failed.
    pub async fn revoke(
        &self,
        subject: &str,
        upstream: Option<&str>,
        upstreams: &[(String, Identity)],
    ) -> Result<usize, String> {
        self.warm.forget(subject, upstream);
        let (n, removed) = match upstream {
            Some(u) => {
                let gone = self.vault.remove(subject, u).await.map_err(|e| e.to_string())?;
                (usize::from(gone.is_some()), gone.into_iter().collect())
            }
            None => {
                // Tokens that no longer open are forgotten too: counted by how many there were.
                let held = self.vault.count(subject).await.map_err(|e| e.to_string())?;
                let opened = self
                    .vault
                    .remove_subject(subject)
                    .await
                    .map_err(|e| e.to_string())?;
                (held.max(opened.len()), opened)
            }
        };
        let each = removed
            .iter()
            .map(|t| self.revoke_at_server(t, upstream, upstreams));
        let results = futures_util::future::join_all(each).await;
        let revoked = results.iter().filter(|r| **r == "ok").count();
        self.audit(
            "oauth.revoke",
            subject,
            upstream.unwrap_or("*"),
            "ok",
            Some(format!(
                "{n} token(s) forgotten by an administrator, {revoked} of them revoked at the authorization server"
            )),
        );
        Ok(n)
    }

    /// The upstream `t` is for, by `name` or else by what it is bound to, among `upstreams`
    /// as configured now; else one made of the tokens alone (no server pinned, no client
    /// configured: a configured client's secret goes nowhere it was not configured for).
    fn upstream_of(
        &self,
        t: &TokenSet,
        name: Option<&str>,
        upstreams: &[(String, Identity)],
    ) -> (String, flow::Upstream) {
        let found = upstreams
            .iter()
            .filter(|(n, _)| name.is_none_or(|want| want == n))
            .find(|(_, id)| bound(t, id))
            .and_then(|(n, id)| Some((n.clone(), self.upstream(n, id).ok()?)));
        found.unwrap_or_else(|| {
            let name = name.unwrap_or("unknown").to_owned();
            // The server still pinned for this upstream issued them: its configured client
            // (when it is theirs) revokes them there.
            let pinned = upstreams
                .iter()
                .find(|(n, id)| *n == name && id.issuer.as_deref() == Some(t.issuer.as_str()))
                .and_then(|(n, id)| self.upstream(n, id).ok());
            let (issuer, client) = pinned.map_or((None, None), |p| (p.issuer, p.client));
            let up = flow::Upstream {
                name: name.clone(),
                url: t.resource.clone(),
                issuer,
                client,
                scope: None,
            };
            (name, up)
        })
    }

    /// Revokes `t` (held by no one any longer) at its authorization server as `up` says,
    /// off the caller's path: best effort, within [`REVOKE_LIMIT`], at most
    /// [`MAX_BACKGROUND_REVOCATIONS`] at once (past that, not revoked), counted.
    fn revoke_later(&self, t: TokenSet, name: &str, up: flow::Upstream) {
        let Ok(permit) = self.revoking.clone().try_acquire_owned() else {
            tracing::info!(upstream = %name, "upstream sign-in: too many revocations under way; a token nothing holds is forgotten without one");
            self.metrics.revocation(name, "failed");
            return;
        };
        let (flow, metrics, name) = (self.flow.clone(), self.metrics.clone(), name.to_owned());
        tokio::spawn(async move {
            let result = revoke_within(&flow, &t, &up, &name).await;
            metrics.revocation(&name, result);
            drop(permit);
        });
    }

    /// Resolves when no revocation runs off a caller's path (tests).
    #[cfg(test)]
    pub(super) async fn revocations_done(&self) {
        let all = u32::try_from(MAX_BACKGROUND_REVOCATIONS).unwrap_or(u32::MAX);
        drop(self.revoking.acquire_many(all).await);
    }

    /// Revokes `t` at its authorization server (RFC 7009), best effort and within
    /// [`REVOKE_LIMIT`]: counted, and how it ended ([`REVOCATION_RESULTS`]).
    ///
    /// [`REVOCATION_RESULTS`]: crate::metrics::oauth::REVOCATION_RESULTS
    async fn revoke_at_server(
        &self,
        t: &TokenSet,
        name: Option<&str>,
        upstreams: &[(String, Identity)],
    ) -> &'static str {
        let (name, up) = self.upstream_of(t, name, upstreams);
        let result = revoke_within(&self.flow, t, &up, &name).await;
        self.metrics.revocation(&name, result);
        result
    }
}

/// Revokes `t` at its authorization server as `up` says, within [`REVOKE_LIMIT`]: how it
/// ended ([`REVOCATION_RESULTS`]), logged when it failed.
///
/// [`REVOCATION_RESULTS`]: crate::metrics::oauth::REVOCATION_RESULTS
async fn revoke_within(flow: &flow::Flow, t: &TokenSet, up: &flow::Upstream, name: &str) -> &'static str {
    match tokio::time::timeout(REVOKE_LIMIT, flow.revoke(t, up)).await {
        Ok(Ok(true)) => "ok",
        Ok(Ok(false)) => "none",
        Ok(Err(e)) => {
            tracing::info!(upstream = %name, reason = e.kind(), error = %e, "upstream sign-in: a user's token could not be revoked at the authorization server; it is forgotten here");
            "failed"
        }
        Err(_) => {
            tracing::info!(upstream = %name, "upstream sign-in: the authorization server did not revoke a user's token in time; it is forgotten here");
            "failed"
        }
    }
}

/// The audit reason of a revocation that ended with `result`.
fn said_of(result: &str) -> &'static str {
    match result {
        "ok" => "revoked at the authorization server",
        "none" => "the authorization server names no revocation endpoint: forgotten here only",
        _ => "not revoked at the authorization server (it failed): forgotten here",
    }
}
