//! Who may see which servers of the catalog. With Kubernetes authentication (the default)
//! a caller presents a bearer token the API server accepts (a ServiceAccount token, or an
//! OIDC token when the API server trusts that issuer); a TokenReview says who it is, and a
//! SubjectAccessReview per namespace says whether that identity may `list` McpServers
//! there. The catalog shows exactly the McpServers of those namespaces: the same grant that
//! lets a user run `kubectl get mcpservers -n NS` lets them find its servers.
//!
//! Answers are cached for [`TTL`] (denials too), keyed by a SHA-256 of the token, so a burst
//! of requests costs one review; at most [`REVIEWS`] reviews run at once and each times out,
//! so a flood of invented tokens cannot queue unbounded work at the API server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::PostParams;
use kube::{Api, Client};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use crate::metrics::Metrics;

/// How long a review's answer is reused.
pub const TTL: Duration = Duration::from_secs(30);
/// Reviews running at once.
const REVIEWS: usize = 16;
/// The longest a review may take.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Cached answers kept at most (then the expired are dropped, and if none was, all).
const CACHE_MAX: usize = 16_384;
/// The longest token looked at (longer ones are refused unread).
const MAX_TOKEN: usize = 16_384;

/// Why a caller is not let in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// No token, or one the API server does not accept: 401.
    #[error("a bearer token the Kubernetes API server accepts is required")]
    Unauthenticated,
    /// A review could not be made (the API server did not answer, or refused the
    /// operator's review): 503.
    #[error("the Kubernetes API server did not answer the review: {0}")]
    Unavailable(&'static str),
}

/// A caller the API server vouched for (the key of its cached grants).
#[derive(Debug, Clone)]
pub struct Caller {
    key: [u8; 32],
    user: Option<UserInfo>,
}

impl Caller {
    /// The caller of an open catalog (no authentication).
    fn open() -> Self {
        Self {
            key: [0; 32],
            user: None,
        }
    }

    /// A user known by other means than a token review (the console's OpenID sign-in),
    /// reviewed by name and groups as the API server would name them.
    pub fn user(username: String, groups: Vec<String>) -> Self {
        let user = UserInfo {
            username: Some(username),
            groups: (!groups.is_empty()).then_some(groups),
            ..UserInfo::default()
        };
        Self {
            key: identity(&user),
            user: Some(user),
        }
    }

    /// The user name the API server gave, if any.
    pub fn username(&self) -> Option<&str> {
        self.user.as_ref().and_then(|u| u.username.as_deref())
    }
}

/// A cache of answers with a time to live and a bound.
#[derive(Debug, Default)]
struct Cache<K, V>(Mutex<HashMap<K, (Instant, V)>>);

impl<K: std::hash::Hash + Eq, V: Clone> Cache<K, V> {
    fn get(&self, k: &K) -> Option<V> {
        let m = self.0.lock().ok()?;
        m.get(k)
            .filter(|(t, _)| t.elapsed() < TTL)
            .map(|(_, v)| v.clone())
    }

    fn put(&self, k: K, v: V) {
        let Ok(mut m) = self.0.lock() else { return };
        if m.len() >= CACHE_MAX {
            m.retain(|_, (t, _)| t.elapsed() < TTL);
            if m.len() >= CACHE_MAX {
                m.clear();
            }
        }
        m.insert(k, (Instant::now(), v));
    }
}

/// The kind of a review, as counted in the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Review {
    /// TokenReview.
    Token,
    /// SubjectAccessReview.
    Access,
}

impl Review {
    /// Its metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Token => "token",
            Self::Access => "access",
        }
    }
}

/// The catalog's access control.
#[derive(Debug)]
pub enum Access {
    /// Everyone sees every listed server (for a catalog behind its own authentication, or a
    /// cluster where the list is not a secret).
    Open,
    /// Kubernetes TokenReview and SubjectAccessReview.
    Kubernetes(Box<Kube>),
}

/// The state of Kubernetes reviews.
pub struct Kube {
    client: Client,
    audiences: Vec<String>,
    tokens: Cache<[u8; 32], Option<UserInfo>>,
    grants: Cache<([u8; 32], String), bool>,
    permits: Semaphore,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Kube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kube")
            .field("audiences", &self.audiences)
            .finish_non_exhaustive()
    }
}

impl Access {
    /// Kubernetes reviews through `client`; tokens must name one of `audiences` (empty: the
    /// API server's own).
    pub fn kubernetes(client: Client, audiences: Vec<String>, metrics: Arc<Metrics>) -> Self {
        Self::Kubernetes(Box::new(Kube {
            client,
            audiences,
            tokens: Cache::default(),
            grants: Cache::default(),
            permits: Semaphore::new(REVIEWS),
            metrics,
        }))
    }

    /// Who the caller with `authorization` (the header's value) is.
    ///
    /// # Errors
    /// [`Denied`] when it cannot be let in.
    pub async fn caller(&self, authorization: Option<&[u8]>) -> Result<Caller, Denied> {
        let Self::Kubernetes(k) = self else {
            return Ok(Caller::open());
        };
        let token = authorization
            .filter(|h| h.len() <= MAX_TOKEN)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(bearer)
            .ok_or(Denied::Unauthenticated)?;
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let user = match k.tokens.get(&key) {
            Some(u) => u,
            None => {
                let u = k.review_token(token).await?;
                k.tokens.put(key, u.clone());
                u
            }
        };
        // Grants are cached per identity, not per token: a caller minting fresh tokens costs
        // one TokenReview each, not a SubjectAccessReview per namespace again.
        user.map(|user| Caller {
            key: identity(&user),
            user: Some(user),
        })
        .ok_or(Denied::Unauthenticated)
    }

    /// Whether `caller` may list McpServers in `namespace` (`None`: in every namespace).
    ///
    /// # Errors
    /// [`Denied::Unavailable`] when the review could not be made.
    pub async fn may_list(&self, caller: &Caller, namespace: Option<&str>) -> Result<bool, Denied> {
        let Self::Kubernetes(k) = self else {
            return Ok(true);
        };
        let Some(user) = &caller.user else {
            return Ok(false);
        };
        let cache_key = (caller.key, namespace.unwrap_or_default().to_owned());
        if let Some(allowed) = k.grants.get(&cache_key) {
            return Ok(allowed);
        }
        let allowed = k.review_access(user, namespace).await?;
        k.grants.put(cache_key, allowed);
        Ok(allowed)
    }
}

/// A digest of who a reviewed caller is (name, uid, groups, extra): the key of its grants.
fn identity(u: &UserInfo) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut field = |s: &str| {
        h.update((s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    };
    field(u.username.as_deref().unwrap_or_default());
    field(u.uid.as_deref().unwrap_or_default());
    for g in u.groups.iter().flatten() {
        field(g);
    }
    for (k, vs) in u.extra.iter().flatten() {
        field(k);
        for v in vs {
            field(v);
        }
    }
    h.finalize().into()
}

/// The token of an `Authorization: Bearer TOKEN` value.
fn bearer(h: &str) -> Option<&str> {
    let (scheme, token) = h.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(char::is_whitespace))
        .then_some(token)
}

impl Kube {
    async fn review<K>(&self, kind: Review, object: &K) -> Result<K, Denied>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        // The deadline covers the wait for a permit too: a flood of invented tokens makes
        // callers wait at most this long, never in an unbounded queue.
        let api: Api<K> = Api::all(self.client.clone());
        let answer = tokio::time::timeout(REVIEW_TIMEOUT, async {
            let _permit = self.permits.acquire().await.ok()?;
            Some(api.create(&PostParams::default(), object).await)
        })
        .await;
        match answer {
            Ok(Some(Ok(k))) => Ok(k),
            Ok(None) => Err(Denied::Unavailable("closed")),
            Ok(Some(Err(e))) => {
                self.metrics.catalog_review(kind.as_str(), "error");
                tracing::warn!(error = %e, ?kind, "catalog: review failed");
                Err(Denied::Unavailable(match e {
                    kube::Error::Api(s) if s.code == 403 => "the operator may not create reviews",
                    _ => "the review failed",
                }))
            }
            Err(_) => {
                self.metrics.catalog_review(kind.as_str(), "error");
                Err(Denied::Unavailable("the review timed out"))
            }
        }
    }

    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, Denied> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
            },
            ..TokenReview::default()
        };
        let status = self
            .review(Review::Token, &review)
            .await?
            .status
            .unwrap_or_default();
        // With audiences asked for, the API server must say the token names one of them.
        let audience_ok = self.audiences.is_empty()
            || status
                .audiences
                .iter()
                .flatten()
                .any(|a| self.audiences.contains(a));
        let user = (status.authenticated.unwrap_or(false) && audience_ok)
            .then_some(status.user)
            .flatten();
        self.metrics.catalog_review(
            Review::Token.as_str(),
            if user.is_some() { "ok" } else { "denied" },
        );
        Ok(user)
    }

    async fn review_access(&self, user: &UserInfo, namespace: Option<&str>) -> Result<bool, Denied> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    namespace: namespace.map(str::to_owned),
                    verb: Some("list".to_owned()),
                    group: Some("quiver.dev".to_owned()),
                    resource: Some("mcpservers".to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let status = self
            .review(Review::Access, &review)
            .await?
            .status
            .unwrap_or_default();
        self.metrics.catalog_review(
            Review::Access.as_str(),
            if status.allowed { "ok" } else { "denied" },
        );
        Ok(status.allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_takes_one_token_of_the_bearer_scheme() {
        assert_eq!(bearer("Bearer abc.def"), Some("abc.def"));
        assert_eq!(bearer("bearer abc"), Some("abc"));
        assert_eq!(bearer("Bearer   abc  "), Some("abc"));
        for bad in [
            "Basic abc",
            "Bearer",
            "Bearer ",
            "Bearer a b",
            "Bearerabc",
            "",
            "Bearer \t",
        ] {
            assert_eq!(bearer(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_cache_forgets_what_it_cannot_keep() {
        let c: Cache<u32, bool> = Cache::default();
        for i in 0..(CACHE_MAX as u32 + 10) {
            c.put(i, true);
        }
        assert!(c.0.lock().unwrap().len() <= CACHE_MAX);
        assert_eq!(c.get(&(CACHE_MAX as u32 + 9)), Some(true));
    }

    #[tokio::test]
    async fn an_open_catalog_lets_everyone_list_everything() {
        let a = Access::Open;
        let c = a.caller(None).await.unwrap();
        assert!(a.may_list(&c, Some("any")).await.unwrap());
        assert!(a.may_list(&c, None).await.unwrap());
    }
}
