//! Identity to upstreams and http tools: the `Authorization` a call carries when its tool
//! (or upstream) sets `identity`. `forward` passes on the caller's own validated token, only
//! when that token is addressed to the target (RFC 8707: the audience is in its `aud`);
//! `exchange` asks the issuer for a token addressed to the target, on behalf of the caller
//! (RFC 8693), cached per subject token, audience and scopes, never past that token's expiry. Either way a call that cannot have the
//! credential it needs fails with a tool error: it never goes out with the server's own
//! credential instead, and no token is ever logged.

pub mod cache;
pub mod exchange;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::HeaderValue;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::oauth::sign_in::SignIn;
use crate::protocol::output::ToolOutput;
use crate::spec::caller::Credential;
use crate::spec::identity::{Identity, IdentityMode};
pub use exchange::{ExchangeConfig, Exchanger};

/// Most exchanged tokens kept at once.
pub const MAX_CACHED_TOKENS: usize = 4096;

/// Why a call without an access token cannot act as its caller.
const NO_TOKEN: &str = "acts as its caller, who presented no OAuth/OIDC access token (a static token or no authentication cannot be passed on); refused";

/// Resolves the `Authorization` of calls with `identity`.
#[derive(Debug)]
pub struct Broker {
    exchanger: OnceLock<Exchanger>,
    cache: cache::Cache,
    /// Each user's own sign-in to upstreams (`user`), when configured.
    sign_in: OnceLock<Arc<SignIn>>,
}

impl Default for Broker {
    fn default() -> Self {
        Self {
            exchanger: OnceLock::new(),
            cache: cache::Cache::new(MAX_CACHED_TOKENS),
            sign_in: OnceLock::new(),
        }
    }
}

/// The cache key of an exchange: the subject token itself (its SHA-256 digest), the audience
/// and the scopes. Bound to the token, not to who it names: another token of the same user
/// (with fewer scopes or roles, through another client, or expiring sooner) is exchanged
/// on its own and never gets what a stronger or longer-lived one obtained.
fn key(c: &Credential, audience: &str, scopes: &str) -> cache::Key {
    let mut h = Sha256::new();
    h.update(b"subject-token\0");
    h.update(c.token().as_bytes());
    h.update([0]);
    h.update(audience.as_bytes());
    h.update([0]);
    h.update(scopes.as_bytes());
    h.finalize().into()
}

/// Seconds since the epoch now (0 when the clock is before it).
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Broker {
    /// Sets the token-exchange client (once, at start).
    ///
    /// # Errors
    /// One was set already.
    pub fn set_exchanger(&self, e: Exchanger) -> Result<(), &'static str> {
        self.exchanger
            .set(e)
            .map_err(|_| "the token-exchange client is set once")
    }

    /// Sets each user's own sign-in to upstreams (once, at start).
    ///
    /// # Errors
    /// One was set already.
    pub fn set_sign_in(&self, s: Arc<SignIn>) -> Result<(), &'static str> {
        self.sign_in
            .set(s)
            .map_err(|_| "the upstream sign-in is set once")
    }

    /// Each user's own sign-in to upstreams, when configured.
    pub fn sign_in(&self) -> Option<&Arc<SignIn>> {
        self.sign_in.get()
    }

    /// Whether token exchange is configured.
    pub fn can_exchange(&self) -> bool {
        self.exchanger.get().is_some()
    }

    /// Exchanged tokens cached now.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// The exchanged token of the caller of `c` for `audience` and `scopes` at `now` (seconds
    /// since the epoch): from the cache, or what `fetch` gets, cached.
    async fn exchanged<F, Fut>(
        &self,
        c: &Credential,
        audience: &str,
        scopes: &str,
        now: u64,
        fetch: F,
    ) -> Result<HeaderValue, String>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(HeaderValue, Duration), String>>,
    {
        // Never served, nor kept, past the caller's own token (accepted within the clock
        // leeway of authentication, it may have expired already).
        let left = match c.expires() {
            None => Duration::MAX,
            Some(exp) => match u64::try_from(exp).unwrap_or(0).checked_sub(now) {
                Some(s) if s > 0 => Duration::from_secs(s),
                _ => return Err("the caller's access token has expired".to_owned()),
            },
        };
        let k = key(c, audience, scopes);
        let fetch = async { fetch().await.map(|(h, valid)| (h, valid.min(left))) };
        self.cache.get_or_fetch(&k, fetch).await
    }

    /// The `Authorization` value of a call to `what` (e.g. "upstream `notes`") with `id`, by
    /// the caller of `credential`.
    ///
    /// # Errors
    /// A message for the caller: why the call cannot carry the credential it needs.
    pub async fn authorization(
        &self,
        id: &Identity,
        credential: Option<&Credential>,
        what: &str,
    ) -> Result<HeaderValue, String> {
        let Some(c) = credential else {
            return Err(format!("{what} {NO_TOKEN}"));
        };
        match id.mode {
            IdentityMode::Server => Err(format!("{what} sends the server's own credential")),
            // Upstream calls of mode `user` go through `SignIn` (exec/user.rs); no other
            // target compiles with it.
            IdentityMode::User => Err(format!(
                "{what} uses each user's own sign-in, which only upstreams have"
            )),
            IdentityMode::Forward => {
                if !c.addressed_to(&id.audience) {
                    return Err(format!(
                        "{what} receives the caller's own access token only when that token is addressed to it, and the caller's token does not list `{}` in `aud`; refused (ask the issuer for a token with that audience, or use `identity.mode: exchange`)",
                        id.audience
                    ));
                }
                HeaderValue::from_str(&format!("Bearer {}", c.token()))
                    .map_err(|_| format!("{what}: the caller's token cannot be sent in a header"))
            }
            IdentityMode::Exchange => {
                let Some(ex) = self.exchanger.get() else {
                    return Err(format!(
                        "{what} needs a token exchanged for the caller's, and this server has no token-exchange client (--token-exchange-client-id, McpServer spec.auth.tokenExchange)"
                    ));
                };
                let fetch = || ex.exchange(c, &id.audience, &id.scopes);
                self.exchanged(c, &id.audience, &id.scopes, unix_now(), fetch)
                    .await
                    .map_err(|e| {
                        format!(
                            "{what}: token exchange for audience `{}` failed: {e}",
                            id.audience
                        )
                    })
            }
        }
    }
}

/// Replaces each of `values` (at least [`crate::redact::MIN_KNOWN_LEN`] bytes) in a result:
/// a token or claim a call sent is not echoed back to the caller's model.
pub fn redact(out: &mut ToolOutput, values: &[&str]) {
    let known = crate::redact::known_values(values.iter().copied());
    if known.is_empty() {
        return;
    }
    crate::redact::replace_known(&mut out.text, &known);
    let mut stack: Vec<&mut Value> = out.structured.iter_mut().collect();
    stack.extend(out.content.iter_mut().flatten());
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => crate::redact::replace_known(s, &known),
            Value::Array(a) => stack.extend(a.iter_mut()),
            Value::Object(o) => stack.extend(o.values_mut()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn id(mode: IdentityMode, audience: &str) -> Identity {
        Identity {
            mode,
            audience: audience.into(),
            scopes: "".into(),
            issuer: None,
            client: None,
        }
    }

    #[tokio::test]
    async fn forward_sends_a_token_only_to_its_audience() {
        let b = Broker::default();
        let c = Credential::new("aaa.bbb.ccc", json!({"aud": ["quiver", "notes"], "sub": "alice"}));
        let ok = b
            .authorization(&id(IdentityMode::Forward, "notes"), Some(&c), "tool `t`")
            .await;
        assert_eq!(ok.unwrap(), "Bearer aaa.bbb.ccc");
        let other = b
            .authorization(&id(IdentityMode::Forward, "billing"), Some(&c), "tool `t`")
            .await
            .unwrap_err();
        assert!(other.contains("does not list `billing`"), "{other}");
        assert!(!other.contains("aaa.bbb"), "{other}");
        let none = b
            .authorization(&id(IdentityMode::Forward, "notes"), None, "tool `t`")
            .await
            .unwrap_err();
        assert!(none.contains("presented no OAuth/OIDC access token"), "{none}");
    }

    #[tokio::test]
    async fn exchange_without_a_client_fails_and_never_sends_the_callers_token() {
        let b = Broker::default();
        let c = Credential::new("aaa.bbb.ccc", json!({"aud": "notes", "sub": "alice"}));
        let e = b
            .authorization(&id(IdentityMode::Exchange, "notes"), Some(&c), "upstream `n`")
            .await
            .unwrap_err();
        assert!(e.contains("no token-exchange client"), "{e}");
    }

    #[test]
    fn cache_keys_tell_subject_tokens_audiences_and_scopes_apart() {
        let alice = Credential::new("t1", json!({"iss": "i", "sub": "alice"}));
        let alice_again = Credential::new("t1", json!({"iss": "i", "sub": "alice"}));
        let alice2 = Credential::new("t2", json!({"iss": "i", "sub": "alice"}));
        assert_eq!(key(&alice, "a", ""), key(&alice_again, "a", ""));
        assert_ne!(key(&alice, "a", ""), key(&alice2, "a", ""));
        assert_ne!(key(&alice, "a", ""), key(&alice, "b", ""));
        assert_ne!(key(&alice, "a", ""), key(&alice, "a", "x"));
        // The separators keep the parts apart.
        assert_ne!(key(&alice, "ab", ""), key(&alice, "a", "b"));
    }

    /// A fake issuer: counts exchanges and answers `Bearer exchanged-N`, valid an hour.
    struct FakeIssuer(std::sync::atomic::AtomicUsize);

    impl FakeIssuer {
        fn new() -> Self {
            Self(std::sync::atomic::AtomicUsize::new(0))
        }

        async fn fetch(&self) -> Result<(HeaderValue, Duration), String> {
            let n = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            let h = HeaderValue::from_str(&format!("Bearer exchanged-{n}")).unwrap();
            Ok((h, Duration::from_secs(3600)))
        }

        fn count(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    const NOW: u64 = 1_800_000_000;

    #[tokio::test]
    async fn two_subject_tokens_of_one_caller_get_separate_exchanges() {
        let b = Broker::default();
        let issuer = FakeIssuer::new();
        let claims = json!({"iss": "i", "sub": "alice", "azp": "app", "scope": "read", "exp": NOW + 600});
        let first = Credential::new("token-one", claims.clone());
        let second = Credential::new("token-two", claims);
        let a = b.exchanged(&first, "notes", "read", NOW, || issuer.fetch()).await;
        let again = b.exchanged(&first, "notes", "read", NOW, || issuer.fetch()).await;
        assert_eq!(a.as_ref().unwrap(), "Bearer exchanged-1");
        assert_eq!(again, a, "the same subject token reuses its exchange");
        let other = b
            .exchanged(&second, "notes", "read", NOW, || issuer.fetch())
            .await;
        assert_eq!(other.unwrap(), "Bearer exchanged-2");
        assert_eq!(issuer.count(), 2);
    }

    #[tokio::test]
    async fn an_exchange_is_not_served_once_its_subject_token_expired() {
        let b = Broker::default();
        let issuer = FakeIssuer::new();
        let c = Credential::new("token-one", json!({"iss": "i", "sub": "alice", "exp": NOW + 100}));
        let got = b.exchanged(&c, "notes", "", NOW, || issuer.fetch()).await;
        assert_eq!(got.unwrap(), "Bearer exchanged-1");
        // The exchanged token is good for an hour; the subject token is not.
        let late = b.exchanged(&c, "notes", "", NOW + 101, || issuer.fetch()).await;
        assert!(late.is_err_and(|e| e.contains("expired")));
        assert_eq!(issuer.count(), 1, "an expired subject token is not exchanged");
        // A fractional `exp` bounds the exchange as well.
        let f = Credential::new(
            "token-float",
            json!({"iss": "i", "sub": "bob", "exp": (NOW + 100) as f64 + 0.5}),
        );
        b.exchanged(&f, "notes", "", NOW, || issuer.fetch())
            .await
            .unwrap();
        let late = b.exchanged(&f, "notes", "", NOW + 101, || issuer.fetch()).await;
        assert!(late.is_err_and(|e| e.contains("expired")));
    }

    #[tokio::test]
    async fn a_later_token_with_fewer_scopes_does_not_get_the_stronger_exchange() {
        let b = Broker::default();
        let issuer = FakeIssuer::new();
        let strong = Credential::new(
            "token-strong",
            json!({"iss": "i", "sub": "alice", "scp": ["read", "write"], "exp": NOW + 3600}),
        );
        let weak = Credential::new(
            "token-weak",
            json!({"iss": "i", "sub": "alice", "scp": ["read"], "exp": NOW + 60}),
        );
        let s = b
            .exchanged(&strong, "notes", "", NOW, || issuer.fetch())
            .await
            .unwrap();
        let w = b
            .exchanged(&weak, "notes", "", NOW, || issuer.fetch())
            .await
            .unwrap();
        assert_ne!(s, w, "the weaker token got the stronger token's exchange");
        assert_eq!(issuer.count(), 2);
    }

    #[test]
    fn redaction_reaches_text_structured_and_content() {
        let mut out = ToolOutput {
            text: "saw Bearer tok-secret-1 for alice".into(),
            structured: Some(json!({"h": {"auth": "tok-secret-1"}, "list": ["alice-x"]})),
            content: Some(vec![json!({"type": "text", "text": "tok-secret-1"})]),
            is_error: false,
        };
        redact(&mut out, &["tok-secret-1", "ab"]);
        assert_eq!(out.text, "saw Bearer [redacted] for alice");
        assert_eq!(out.structured.unwrap()["h"]["auth"], "[redacted]");
        assert_eq!(out.content.unwrap()[0]["text"], "[redacted]");
    }
}
