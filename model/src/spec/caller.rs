//! The caller's validated access token, as authentication left it for what runs the call:
//! identity to upstreams forwards or exchanges it, and `{{caller.CLAIM}}` of an http tool
//! reads its claims. Nothing here shows the token (its `Debug` prints neither it nor a claim).

use serde_json::Value;

/// A validated OAuth/OIDC access token (a JWT) and its claims.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    token: Box<str>,
    claims: Value,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential { token: <redacted>, claims: <redacted> }")
    }
}

impl Credential {
    /// A token whose signature, issuer, audience and lifetime were checked, with its claims.
    pub fn new(token: &str, claims: Value) -> Self {
        Self {
            token: token.into(),
            claims,
        }
    }

    /// The token, to forward or exchange; never to log.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The token's claims (an object).
    pub fn claims(&self) -> &Value {
        &self.claims
    }

    /// Whether `aud` (a string or an array of strings) lists `audience`.
    pub fn addressed_to(&self, audience: &str) -> bool {
        match self.claims.get("aud") {
            Some(Value::String(a)) => a == audience,
            Some(Value::Array(list)) => list.iter().any(|a| a.as_str() == Some(audience)),
            _ => false,
        }
    }

    /// `exp`, seconds since the epoch (a fractional one rounded down, as authentication
    /// reads it).
    pub fn expires(&self) -> Option<i64> {
        let v = self.claims.get("exp")?;
        // `as` saturates: a huge or negative value stays huge or negative.
        v.as_i64().or_else(|| v.as_f64().map(|f| f as i64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audiences_match_exactly_and_debug_shows_nothing() {
        let one = Credential::new(
            "tok-123",
            serde_json::json!({"aud": "a", "exp": 5, "sub": "alice"}),
        );
        let many = Credential::new("tok-456", serde_json::json!({"aud": ["x", "b"]}));
        assert!(one.addressed_to("a") && !one.addressed_to("ab") && !one.addressed_to(""));
        assert!(many.addressed_to("b") && !many.addressed_to("a"));
        assert!(!Credential::new("t", serde_json::json!({"aud": 3})).addressed_to("3"));
        assert_eq!(one.expires(), Some(5));
        let shown = format!("{one:?}");
        assert!(!shown.contains("tok-123") && !shown.contains("alice"), "{shown}");
    }
}
