//! Identity to upstreams and http tools: the `Authorization` a call carries when its tool
//! (or upstream) sets `identity`. `forward` passes on the caller's own validated token, only
//! when that token is addressed to the target (RFC 8707: the audience is in its `aud`);
//! `exchange` asks the issuer for a token addressed to the target, on behalf of the caller
//! (RFC 8693), cached per caller, audience and scopes. Either way a call that cannot have the
//! credential it needs fails with a tool error: it never goes out with the server's own
//! credential instead, and no token is ever logged.

pub mod cache;
pub mod exchange;

use std::sync::OnceLock;
use std::time::Duration;

use http::HeaderValue;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::config::caller::Credential;
use crate::config::identity::{Identity, IdentityMode};
use crate::handlers::ToolOutput;
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
}

impl Default for Broker {
    fn default() -> Self {
        Self {
            exchanger: OnceLock::new(),
            cache: cache::Cache::new(MAX_CACHED_TOKENS),
        }
    }
}

/// The cache key of a caller's exchange: who (issuer and subject with the client and scopes
/// the token was issued for, or the token itself when it names no subject), for which
/// audience and scopes.
fn key(c: &Credential, audience: &str, scopes: &str) -> cache::Key {
    let claims = c.claims();
    let text = |k: &str| claims.get(k).and_then(Value::as_str);
    let mut h = Sha256::new();
    match (text("iss"), text("sub")) {
        (Some(iss), Some(sub)) => {
            h.update(b"sub\0");
            h.update(iss.as_bytes());
            h.update([0]);
            h.update(sub.as_bytes());
            // The same user through another client, or with other scopes, is another
            // subject token: it must not reuse what a broader one obtained.
            for k in ["azp", "client_id", "scope"] {
                h.update([0]);
                h.update(text(k).unwrap_or_default().as_bytes());
            }
        }
        _ => {
            h.update(b"token\0");
            h.update(c.token().as_bytes());
        }
    }
    h.update([0]);
    h.update(audience.as_bytes());
    h.update([0]);
    h.update(scopes.as_bytes());
    h.finalize().into()
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

    /// Whether token exchange is configured.
    pub fn can_exchange(&self) -> bool {
        self.exchanger.get().is_some()
    }

    /// Exchanged tokens cached now.
    pub fn cached(&self) -> usize {
        self.cache.len()
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
                let k = key(c, &id.audience, &id.scopes);
                // Never kept past the caller's own token.
                let left = c.expires().map_or(Duration::MAX, |exp| {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs());
                    Duration::from_secs(u64::try_from(exp).unwrap_or(0).saturating_sub(now))
                });
                let fetch = async {
                    ex.exchange(c, &id.audience, &id.scopes)
                        .await
                        .map(|(h, valid)| (h, valid.min(left)))
                };
                self.cache.get_or_fetch(&k, fetch).await.map_err(|e| {
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
    fn cache_keys_tell_callers_audiences_and_scopes_apart() {
        let alice = Credential::new("t1", json!({"iss": "i", "sub": "alice"}));
        let alice2 = Credential::new("t2", json!({"iss": "i", "sub": "alice"}));
        let bob = Credential::new("t3", json!({"iss": "i", "sub": "bob"}));
        let other_issuer = Credential::new("t4", json!({"iss": "j", "sub": "alice"}));
        assert_eq!(key(&alice, "a", ""), key(&alice2, "a", ""));
        assert_ne!(key(&alice, "a", ""), key(&bob, "a", ""));
        assert_ne!(key(&alice, "a", ""), key(&other_issuer, "a", ""));
        assert_ne!(key(&alice, "a", ""), key(&alice, "b", ""));
        assert_ne!(key(&alice, "a", ""), key(&alice, "a", "x"));
        // No subject: the token is the caller.
        let anon1 = Credential::new("t5", json!({"iss": "i"}));
        let anon2 = Credential::new("t6", json!({"iss": "i"}));
        assert_ne!(key(&anon1, "a", ""), key(&anon2, "a", ""));
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
