//! JSON Web Tokens as OAuth 2.1 / OIDC access tokens: signature (RS256, ES256) against a JWK
//! set, then issuer, audience and validity period. Pure functions; the key set is fetched and
//! cached by [`super::auth`].

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::Value;

/// Longest token looked at.
pub const MAX_TOKEN_LEN: usize = 16 << 10;
/// Most keys kept from a JWK set.
pub const MAX_KEYS: usize = 64;

/// A verification key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jwk {
    /// Its `kid`, if any.
    pub kid: Option<String>,
    /// The key.
    pub key: KeyKind,
}

/// The kinds of keys accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    /// RSA (RS256): modulus and exponent, big-endian.
    Rsa {
        /// Modulus.
        n: Vec<u8>,
        /// Public exponent.
        e: Vec<u8>,
    },
    /// P-256 (ES256): the uncompressed point `04 || x || y`.
    P256(Vec<u8>),
}

impl KeyKind {
    fn alg(&self) -> &'static str {
        match self {
            Self::Rsa { .. } => "RS256",
            Self::P256(_) => "ES256",
        }
    }
}

fn b64(v: Option<&Value>) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD
        .decode(v?.as_str()?.trim_end_matches('=').as_bytes())
        .ok()
}

/// The signing keys of a JWK set document (`{"keys": [...]}`); others (encryption keys,
/// unsupported types or curves) are skipped.
pub fn parse_jwks(doc: &Value) -> Vec<Jwk> {
    let Some(keys) = doc.get("keys").and_then(Value::as_array) else {
        return Vec::new();
    };
    keys.iter()
        .filter(|k| k.get("use").and_then(Value::as_str).is_none_or(|u| u == "sig"))
        .filter_map(|k| {
            let kid = k.get("kid").and_then(Value::as_str).map(str::to_owned);
            let key = match (k.get("kty")?.as_str()?, k.get("crv").and_then(Value::as_str)) {
                ("RSA", _) => KeyKind::Rsa {
                    n: b64(k.get("n"))?,
                    e: b64(k.get("e"))?,
                },
                ("EC", Some("P-256")) => {
                    let (x, y) = (b64(k.get("x"))?, b64(k.get("y"))?);
                    if x.len() != 32 || y.len() != 32 {
                        return None;
                    }
                    let mut point = Vec::with_capacity(65);
                    point.push(4);
                    point.extend_from_slice(&x);
                    point.extend_from_slice(&y);
                    KeyKind::P256(point)
                }
                _ => return None,
            };
            // A key that names its algorithm is used only with it.
            if let Some(alg) = k.get("alg").and_then(Value::as_str)
                && alg != key.alg()
            {
                return None;
            }
            Some(Jwk { kid, key })
        })
        .take(MAX_KEYS)
        .collect()
}

/// What a token must satisfy besides its signature.
#[derive(Debug, Clone)]
pub struct Expect<'a> {
    /// `iss`, exactly.
    pub issuer: &'a str,
    /// One of `aud`.
    pub audience: &'a str,
    /// Now, in seconds since the epoch.
    pub now: i64,
    /// Tolerated clock difference, in seconds.
    pub leeway: i64,
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// Not three base64url parts of JSON.
    #[error("not a JWT")]
    Malformed,
    /// An algorithm other than RS256 or ES256 (`none` and HMAC included).
    #[error("algorithm `{0}` is not accepted")]
    Algorithm(String),
    /// No key of the set has the token's `kid` (and type).
    #[error("no key for this token")]
    UnknownKey,
    /// The signature does not verify.
    #[error("bad signature")]
    Signature,
    /// `iss` differs.
    #[error("wrong issuer")]
    Issuer,
    /// `aud` does not name this resource.
    #[error("wrong audience")]
    Audience,
    /// `exp` is missing or past.
    #[error("expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("not valid yet")]
    NotYetValid,
}

fn json_part(s: &str) -> Result<Value, Invalid> {
    let bytes = URL_SAFE_NO_PAD
        .decode(s.as_bytes())
        .map_err(|_| Invalid::Malformed)?;
    serde_json::from_slice(&bytes).map_err(|_| Invalid::Malformed)
}

/// The `kid` of a token's header (to decide whether the key set needs a refresh).
pub fn kid(token: &str) -> Option<String> {
    let header = json_part(token.split('.').next()?).ok()?;
    header.get("kid")?.as_str().map(str::to_owned)
}

fn verify_signature(key: &KeyKind, message: &[u8], sig: &[u8]) -> bool {
    match key {
        KeyKind::Rsa { n, e } => RsaPublicKeyComponents { n, e }
            .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, sig)
            .is_ok(),
        KeyKind::P256(point) => UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
            .verify(message, sig)
            .is_ok(),
    }
}

fn number(claims: &Value, name: &str) -> Option<i64> {
    let v = claims.get(name)?;
    v.as_i64().or_else(|| v.as_f64().map(|f| f as i64))
}

/// Verifies `token` against `keys` and `expect`; its claims when it is valid.
///
/// # Errors
/// Why it is not.
pub fn verify(token: &str, keys: &[Jwk], expect: &Expect<'_>) -> Result<Value, Invalid> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(Invalid::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(Invalid::Malformed);
    };
    let header = json_part(h)?;
    let alg = header.get("alg").and_then(Value::as_str).unwrap_or("");
    if alg != "RS256" && alg != "ES256" {
        return Err(Invalid::Algorithm(alg.chars().take(16).collect()));
    }
    let sig = URL_SAFE_NO_PAD
        .decode(s.as_bytes())
        .map_err(|_| Invalid::Malformed)?;
    let message = &token.as_bytes()[..h.len() + 1 + p.len()];
    let kid = header.get("kid").and_then(Value::as_str);
    let mut candidates = keys
        .iter()
        .filter(|k| k.key.alg() == alg && (kid.is_none() || k.kid.as_deref() == kid))
        .peekable();
    if candidates.peek().is_none() {
        return Err(Invalid::UnknownKey);
    }
    if !candidates.any(|k| verify_signature(&k.key, message, &sig)) {
        return Err(Invalid::Signature);
    }
    let claims = json_part(p)?;
    if claims.get("iss").and_then(Value::as_str) != Some(expect.issuer) {
        return Err(Invalid::Issuer);
    }
    let aud_ok = match claims.get("aud") {
        Some(Value::String(a)) => a == expect.audience,
        Some(Value::Array(a)) => a.iter().any(|x| x.as_str() == Some(expect.audience)),
        _ => false,
    };
    if !aud_ok {
        return Err(Invalid::Audience);
    }
    match number(&claims, "exp") {
        Some(exp) if exp.saturating_add(expect.leeway) > expect.now => {}
        _ => return Err(Invalid::Expired),
    }
    if number(&claims, "nbf").is_some_and(|nbf| nbf.saturating_sub(expect.leeway) > expect.now) {
        return Err(Invalid::NotYetValid);
    }
    Ok(claims)
}

#[cfg(test)]
pub(crate) mod tests {
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    use serde_json::json;

    use super::*;

    /// A P-256 key pair and its JWK.
    pub(crate) fn es256_key(kid: &str) -> (EcdsaKeyPair, Value) {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        let point = pair.public_key().as_ref();
        let jwk = json!({
            "kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..]),
        });
        (pair, jwk)
    }

    pub(crate) fn sign(pair: &EcdsaKeyPair, header: &Value, claims: &Value) -> String {
        let h = URL_SAFE_NO_PAD.encode(header.to_string());
        let p = URL_SAFE_NO_PAD.encode(claims.to_string());
        let msg = format!("{h}.{p}");
        let sig = pair.sign(&SystemRandom::new(), msg.as_bytes()).unwrap();
        format!("{msg}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }

    const NOW: i64 = 1_800_000_000;

    fn expect() -> Expect<'static> {
        Expect {
            issuer: "https://issuer.example",
            audience: "https://mcp.example/mcp",
            now: NOW,
            leeway: 60,
        }
    }

    fn claims() -> Value {
        json!({"iss": "https://issuer.example", "aud": ["other", "https://mcp.example/mcp"], "exp": NOW + 300, "sub": "alice"})
    }

    #[test]
    fn a_good_token_verifies_and_yields_its_claims() {
        let (pair, jwk) = es256_key("k1");
        let keys = parse_jwks(&json!({"keys": [jwk]}));
        let t = sign(&pair, &json!({"alg": "ES256", "kid": "k1"}), &claims());
        assert_eq!(verify(&t, &keys, &expect()).unwrap()["sub"], "alice");
        assert_eq!(kid(&t).as_deref(), Some("k1"));
        // Without a kid, every key of the right type is tried.
        let t = sign(&pair, &json!({"alg": "ES256"}), &claims());
        assert!(verify(&t, &keys, &expect()).is_ok());
    }

    #[test]
    fn every_claim_and_signature_failure_is_refused() {
        let (pair, jwk) = es256_key("k1");
        let (other, _) = es256_key("k1");
        let keys = parse_jwks(&json!({"keys": [jwk]}));
        let h = json!({"alg": "ES256", "kid": "k1"});
        let with = |f: &dyn Fn(&mut Value)| {
            let mut c = claims();
            f(&mut c);
            sign(&pair, &h, &c)
        };
        let e = expect();
        assert_eq!(
            verify(&sign(&other, &h, &claims()), &keys, &e),
            Err(Invalid::Signature)
        );
        assert_eq!(
            verify(&with(&|c| c["iss"] = json!("https://evil")), &keys, &e),
            Err(Invalid::Issuer)
        );
        assert_eq!(
            verify(&with(&|c| c["aud"] = json!("other")), &keys, &e),
            Err(Invalid::Audience)
        );
        assert_eq!(
            verify(
                &with(&|c| drop(c.as_object_mut().unwrap().remove("aud"))),
                &keys,
                &e
            ),
            Err(Invalid::Audience)
        );
        assert_eq!(
            verify(&with(&|c| c["exp"] = json!(NOW - 61)), &keys, &e),
            Err(Invalid::Expired)
        );
        assert!(
            verify(&with(&|c| c["exp"] = json!(NOW - 59)), &keys, &e).is_ok(),
            "within the leeway"
        );
        assert_eq!(
            verify(
                &with(&|c| drop(c.as_object_mut().unwrap().remove("exp"))),
                &keys,
                &e
            ),
            Err(Invalid::Expired)
        );
        assert_eq!(
            verify(&with(&|c| c["nbf"] = json!(NOW + 120)), &keys, &e),
            Err(Invalid::NotYetValid)
        );
        assert_eq!(
            verify(
                &sign(&pair, &json!({"alg": "ES256", "kid": "k2"}), &claims()),
                &keys,
                &e
            ),
            Err(Invalid::UnknownKey)
        );
        // `none`, HMAC (which would use a public key as a shared secret) and junk.
        for alg in ["none", "HS256", "RS512"] {
            let t = sign(&pair, &json!({"alg": alg, "kid": "k1"}), &claims());
            assert!(
                matches!(verify(&t, &keys, &e), Err(Invalid::Algorithm(_))),
                "{alg}"
            );
        }
        let good = sign(&pair, &h, &claims());
        let (msg, _) = good.rsplit_once('.').unwrap();
        for bad in [
            String::new(),
            "a.b".into(),
            "a.b.c.d".into(),
            format!("{msg}."),
            format!("{msg}.!!!"),
            "x".repeat(MAX_TOKEN_LEN + 1),
        ] {
            assert!(verify(&bad, &keys, &e).is_err(), "{bad}");
        }
        // A tampered payload fails the signature.
        let (h64, rest) = good.split_once('.').unwrap();
        let (_, s64) = rest.split_once('.').unwrap();
        let forged = URL_SAFE_NO_PAD.encode(json!({"iss": "https://issuer.example", "aud": "https://mcp.example/mcp", "exp": NOW + 999, "sub": "root"}).to_string());
        assert_eq!(
            verify(&format!("{h64}.{forged}.{s64}"), &keys, &e),
            Err(Invalid::Signature)
        );
    }

    #[test]
    fn jwks_keep_signing_keys_of_known_types_only() {
        let (_, ec) = es256_key("ec");
        let keys = parse_jwks(&json!({"keys": [
            ec,
            {"kty": "RSA", "kid": "rsa", "n": "AQAB", "e": "AQAB"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": "AQAB", "e": "AQAB"},
            {"kty": "RSA", "kid": "ps", "alg": "PS256", "n": "AQAB", "e": "AQAB"},
            {"kty": "EC", "crv": "P-384", "x": "AA", "y": "AA"},
            {"kty": "oct", "k": "c2VjcmV0"},
            {"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"},
            "junk",
        ]}));
        let kids: Vec<_> = keys.iter().map(|k| k.kid.as_deref()).collect();
        assert_eq!(kids, [Some("ec"), Some("rsa")]);
        assert!(parse_jwks(&json!({"nokeys": 1})).is_empty());
    }
}
