//! Client authentication on `/mcp`: static bearer tokens read from the secret store, so a
//! rotated Secret takes effect on the next request without a restart.
//!
//! The token secret's value holds one token per line (blank lines and `#` comments are
//! skipped), so a rotation can keep the old and the new token valid for a while. Tokens are
//! compared as SHA-256 digests in constant time: neither a token's length nor the place where
//! a guess first differs shows in the time a refusal takes.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use http::{HeaderMap, HeaderValue, header};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::config::SecretRef;
use crate::secrets::Secrets;

/// Tokens shorter than this are ignored (and logged): a guessable token is no protection.
pub const MIN_TOKEN_LEN: usize = 16;
/// Most tokens kept from the secret.
pub const MAX_TOKENS: usize = 64;
/// Longest `Authorization` header value looked at.
const MAX_HEADER_LEN: usize = 8192;

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No bearer token in the request.
    Missing,
    /// A token that is not (or no longer) valid.
    Invalid,
    /// The server has no valid token to compare with (the secret is missing or empty).
    Unconfigured,
}

impl Denied {
    /// The message of the 401 response.
    pub fn message(self) -> &'static str {
        match self {
            Self::Missing => "Unauthorized: this server requires a bearer token (Authorization: Bearer ...)",
            Self::Invalid => "Unauthorized: the bearer token is not valid",
            Self::Unconfigured => "Unauthorized: the server's token secret is not available yet",
        }
    }

    /// The `WWW-Authenticate` challenge (RFC 6750 section 3).
    pub fn challenge(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Self::Missing => "Bearer realm=\"mcp\"",
            Self::Invalid | Self::Unconfigured => {
                "Bearer realm=\"mcp\", error=\"invalid_token\", error_description=\"the token is not valid\""
            }
        })
    }
}

/// Digests of the tokens of one secret snapshot.
#[derive(Debug)]
struct Tokens {
    /// The snapshot they were read from (compared by pointer: a rotation swaps it).
    from: Arc<Value>,
    digests: Vec<[u8; 32]>,
}

/// Bearer-token authentication.
#[derive(Debug)]
pub struct BearerAuth {
    secret: SecretRef,
    secrets: Arc<Secrets>,
    cache: ArcSwapOption<Tokens>,
}

fn digest(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

/// Equal without an early exit.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The tokens of a secret value: one per line, `#` comments and blanks skipped.
pub fn parse_tokens(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .take(MAX_TOKENS)
        .collect()
}

impl BearerAuth {
    /// Tokens from `secret` (which the store is told to keep fetching).
    pub fn new(secret: SecretRef, secrets: Arc<Secrets>) -> Self {
        secrets.pin(secret.clone());
        Self {
            secret,
            secrets,
            cache: ArcSwapOption::empty(),
        }
    }

    fn tokens(&self) -> Arc<Tokens> {
        let now = self.secrets.snapshot();
        if let Some(t) = self.cache.load_full()
            && Arc::ptr_eq(&t.from, &now)
        {
            return t;
        }
        let text = now
            .get(&self.secret.name)
            .and_then(|s| s.get(&self.secret.key))
            .and_then(Value::as_str)
            .unwrap_or("");
        let tokens = parse_tokens(text);
        let short = tokens.iter().filter(|t| t.len() < MIN_TOKEN_LEN).count();
        if short > 0 {
            tracing::warn!(secret = %self.secret, ignored = short, "client tokens shorter than {MIN_TOKEN_LEN} characters are ignored");
        }
        let digests = tokens
            .into_iter()
            .filter(|t| t.len() >= MIN_TOKEN_LEN)
            .map(|t| digest(t.as_bytes()))
            .collect();
        let fresh = Arc::new(Tokens { from: now, digests });
        self.cache.store(Some(Arc::clone(&fresh)));
        fresh
    }

    /// Checks the request's `Authorization` header.
    ///
    /// # Errors
    /// Why the request may not proceed.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Denied> {
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Err(Denied::Missing);
        };
        let value = value.as_bytes();
        if value.len() > MAX_HEADER_LEN || value.len() < 7 || !value[..7].eq_ignore_ascii_case(b"bearer ") {
            return Err(Denied::Missing);
        }
        let presented = value[7..].trim_ascii();
        let tokens = self.tokens();
        if tokens.digests.is_empty() {
            return Err(Denied::Unconfigured);
        }
        let d = digest(presented);
        // Every digest is compared, whichever matches.
        let ok = tokens.digests.iter().fold(false, |acc, t| acc | same(t, &d));
        if ok { Ok(()) } else { Err(Denied::Invalid) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::Presence;

    fn auth(value: &str) -> (BearerAuth, Arc<Secrets>) {
        let secrets = Secrets::new();
        secrets.set_has_source();
        secrets.set(
            "clients",
            Some(vec![("tokens".into(), value.as_bytes().to_vec())]),
            Presence::Loaded,
        );
        let r = SecretRef {
            name: "clients".into(),
            key: "tokens".into(),
        };
        (BearerAuth::new(r, Arc::clone(&secrets)), secrets)
    }

    fn with(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn tokens_are_lines_without_comments() {
        assert_eq!(parse_tokens("# old\n a \n\nb\r\n"), ["a", "b"]);
    }

    #[test]
    fn accepts_each_listed_token_and_refuses_the_rest() {
        let (a, _) = auth("first-token-0123456789\nsecond-token-0123456789\nshort\n");
        assert_eq!(a.check(&with("Bearer first-token-0123456789")), Ok(()));
        assert_eq!(a.check(&with("bearer   second-token-0123456789  ")), Ok(()));
        assert_eq!(
            a.check(&with("Bearer short")),
            Err(Denied::Invalid),
            "too short to count"
        );
        assert_eq!(
            a.check(&with("Bearer first-token-012345678")),
            Err(Denied::Invalid)
        );
        assert_eq!(a.check(&with("Bearer ")), Err(Denied::Invalid));
        assert_eq!(a.check(&with("Basic Zmlyc3Q=")), Err(Denied::Missing));
        assert_eq!(a.check(&HeaderMap::new()), Err(Denied::Missing));
        assert_eq!(
            a.check(&with(&format!("Bearer {}", "x".repeat(9000)))),
            Err(Denied::Missing)
        );
    }

    #[test]
    fn a_rotation_applies_to_the_next_request() {
        let (a, secrets) = auth("old-token-0123456789");
        assert_eq!(a.check(&with("Bearer old-token-0123456789")), Ok(()));
        secrets.set(
            "clients",
            Some(vec![("tokens".into(), b"new-token-0123456789".to_vec())]),
            Presence::Loaded,
        );
        assert_eq!(
            a.check(&with("Bearer old-token-0123456789")),
            Err(Denied::Invalid)
        );
        assert_eq!(a.check(&with("Bearer new-token-0123456789")), Ok(()));
        secrets.set("clients", None, Presence::Missing);
        assert_eq!(
            a.check(&with("Bearer new-token-0123456789")),
            Err(Denied::Unconfigured)
        );
    }
}
