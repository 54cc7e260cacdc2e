//! RFC 8693 token exchange at the issuer's token endpoint: the caller's access token as the
//! subject token, the upstream's audience and scopes requested, the server's client
//! credentials (a Secret) as HTTP Basic authentication. Bounded in time and size; what the
//! issuer answers is checked before it is used; no token or secret reaches an error message.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, header};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::Value;

use crate::config::SecretRef;
use crate::net::http::{HttpClient, USER_AGENT};
use crate::secrets::Secrets;
use crate::spec::caller::Credential;

/// The whole exchange (connect, send, read) must finish within this.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read from the token endpoint (and from the discovery document).
pub const MAX_ANSWER_BYTES: usize = 64 << 10;
/// Longest token accepted from the issuer.
pub const MAX_TOKEN_BYTES: usize = 8192;
/// A token is used until this long before it expires (at most a tenth of its lifetime).
pub const EXPIRY_MARGIN: Duration = Duration::from_secs(30);
/// An answer without `expires_in` is cached this long.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(60);
/// Longest an exchanged token is kept, whatever its `expires_in`.
const MAX_LIFETIME: Duration = Duration::from_secs(86_400);
/// An error description of the issuer is cut to this many characters.
const MAX_DESCRIPTION: usize = 200;

const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

/// The server's token-exchange client.
#[derive(Debug, Clone)]
pub struct ExchangeConfig {
    /// The token endpoint; `None`: discovered from the issuer's metadata.
    pub endpoint: Option<String>,
    /// The issuer whose metadata names the token endpoint (the one client tokens come from).
    pub issuer: Option<String>,
    /// The client id.
    pub client_id: String,
    /// Where the client secret is.
    pub client_secret: SecretRef,
    /// PEM CAs to trust for the issuer instead of the public roots (a ConfigMap in the store).
    pub ca: Option<SecretRef>,
}

/// Exchanges tokens with one issuer.
#[derive(Debug)]
pub struct Exchanger {
    cfg: ExchangeConfig,
    http: HttpClient,
    secrets: Arc<Secrets>,
    endpoint: tokio::sync::Mutex<Option<String>>,
}

/// `application/x-www-form-urlencoded` of one value (RFC 6749 appendix B).
fn form(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The issuer's words in an error answer, cut short, with nothing of `known` left in them.
fn issuer_error(body: &[u8], known: &[&str]) -> String {
    let doc: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    // Redacted whole, then cut: a value cut first would no longer match.
    let word = |k: &str| {
        doc.get(k).and_then(Value::as_str).map(|s| {
            let mut s = s.to_owned();
            crate::redact::replace_known(&mut s, known);
            s.chars().take(MAX_DESCRIPTION).collect::<String>()
        })
    };
    let text = match (word("error"), word("error_description")) {
        (Some(e), Some(d)) => format!("{e}: {d}"),
        (Some(e), None) => e,
        _ => "no OAuth error in the answer".to_owned(),
    };
    crate::redact::untrusted(&text, &[], MAX_DESCRIPTION * 2)
}

/// The access token and how long to use it, from a successful answer.
fn parse_answer(body: &[u8]) -> Result<(HeaderValue, Duration), String> {
    let doc: Value = serde_json::from_slice(body)
        .map_err(|_| "the token endpoint answered something that is not JSON".to_owned())?;
    let token = doc
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| (1..=MAX_TOKEN_BYTES).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or("the token endpoint's answer has no usable `access_token`")?;
    match doc.get("token_type").and_then(Value::as_str) {
        None => {}
        Some(t) if t.eq_ignore_ascii_case("bearer") || t.eq_ignore_ascii_case("N_A") => {}
        Some(_) => return Err("the token endpoint issued a token that is not a bearer token".to_owned()),
    }
    if let Some(t) = doc.get("issued_token_type").and_then(Value::as_str)
        && t != ACCESS_TOKEN_TYPE
    {
        return Err("the token endpoint issued a token that is not an access token".to_owned());
    }
    let lifetime = match doc.get("expires_in") {
        None => DEFAULT_LIFETIME,
        // Kept at most a day, whatever the issuer says (and never past the caller's token).
        Some(v) => Duration::from_secs(
            v.as_u64()
                .ok_or("the token endpoint's `expires_in` is not a number of seconds")?
                .min(MAX_LIFETIME.as_secs()),
        ),
    };
    let margin = EXPIRY_MARGIN.min(lifetime / 10);
    let header = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| "the token endpoint issued an unusable token".to_owned())?;
    Ok((header, lifetime.saturating_sub(margin)))
}

/// The `token_endpoint` of an issuer's metadata: an http(s) URL, and `https` when the
/// issuer's is (callers' tokens and the client secret go there; the metadata does not
/// downgrade them to clear text).
fn discovered<'a>(issuer: &str, meta: &'a Value) -> Option<&'a str> {
    let plain_ok = issuer.starts_with("http://");
    meta.get("token_endpoint")
        .and_then(Value::as_str)
        .filter(|u| u.starts_with("https://") || (plain_ok && u.starts_with("http://")))
}

impl Exchanger {
    /// An exchanger; the client secret is pinned in `secrets` (fetched and kept current).
    pub fn new(cfg: ExchangeConfig, http: HttpClient, secrets: Arc<Secrets>) -> Self {
        secrets.pin(cfg.client_secret.clone());
        if let Some(ca) = &cfg.ca {
            secrets.pin(ca.clone());
        }
        Self {
            endpoint: tokio::sync::Mutex::new(cfg.endpoint.clone()),
            cfg,
            http,
            secrets,
        }
    }

    fn tls(&self) -> Option<crate::config::TlsRefs> {
        self.cfg.ca.as_ref().map(|ca| crate::config::TlsRefs {
            ca: Some(ca.clone()),
            client: None,
        })
    }

    /// The token endpoint: configured, or from the issuer's metadata (fetched until once
    /// found).
    async fn endpoint(&self) -> Result<String, String> {
        let mut known = self.endpoint.lock().await;
        if let Some(e) = &*known {
            return Ok(e.clone());
        }
        let Some(issuer) = &self.cfg.issuer else {
            return Err("no token endpoint is configured".to_owned());
        };
        let url = format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        );
        let secrets = self.secrets.snapshot();
        let tls = self.tls();
        let meta = self
            .http
            .get_json(
                &url,
                TIMEOUT,
                MAX_ANSWER_BYTES,
                tls.as_ref().map(|t| (t, &*secrets)),
            )
            .await?;
        let found = discovered(issuer, &meta).ok_or_else(|| format!("{url} names no token_endpoint"))?;
        *known = Some(found.to_owned());
        Ok(found.to_owned())
    }

    /// Exchanges `subject` for a token addressed to `audience` with `scopes` (space-separated,
    /// may be empty): the `Authorization` value and how long it may be used.
    ///
    /// # Errors
    /// The secret is missing, the endpoint cannot be reached in time, refused, or answered
    /// something unusable. The message names neither token nor secret.
    pub async fn exchange(
        &self,
        subject: &Credential,
        audience: &str,
        scopes: &str,
    ) -> Result<(HeaderValue, Duration), String> {
        let secrets = self.secrets.snapshot();
        let r = &self.cfg.client_secret;
        let client_secret = secrets
            .get(&r.name)
            .and_then(|s| s.get(&r.key))
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("the token-exchange client secret ({r}) is not available"))?;
        let endpoint = self.endpoint().await?;
        let mut body = format!(
            "grant_type={}&subject_token={}&subject_token_type={}&requested_token_type={}&audience={}",
            form(GRANT_TYPE),
            form(subject.token()),
            form(ACCESS_TOKEN_TYPE),
            form(ACCESS_TOKEN_TYPE),
            form(audience),
        );
        if !scopes.is_empty() {
            body.push_str("&scope=");
            body.push_str(&form(scopes));
        }
        // RFC 6749 section 2.3.1: id and secret form-encoded, then Basic.
        let basic = STANDARD.encode(format!("{}:{}", form(&self.cfg.client_id), form(client_secret)));
        let req = Request::builder()
            .method(Method::POST)
            .uri(&endpoint)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, USER_AGENT)
            .header(header::AUTHORIZATION, format!("Basic {basic}"))
            .body(Full::new(Bytes::from(body)))
            .map_err(|_| "the token endpoint is not a usable URL".to_owned())?;
        let tls = self.tls();
        let post = async {
            let resp = self.http.send(req, tls.as_ref(), &secrets).await?;
            let status = resp.status();
            let bytes = Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|_| {
                    format!(
                        "the token endpoint's answer is not readable or larger than {MAX_ANSWER_BYTES} bytes"
                    )
                })?
                .to_bytes();
            Ok::<_, String>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(TIMEOUT, post)
            .await
            .map_err(|_| format!("the token endpoint did not answer within {TIMEOUT:?}"))??;
        if !status.is_success() {
            let why = issuer_error(&bytes, &[subject.token(), client_secret]);
            return Err(format!("the issuer refused (HTTP {}; {why})", status.as_u16()));
        }
        parse_answer(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_discovered_token_endpoint_is_https_when_the_issuer_is() {
        let meta = |e: &str| serde_json::json!({"token_endpoint": e});
        let https = meta("https://oauth2.example/token");
        assert_eq!(
            discovered("https://id.example", &https),
            Some("https://oauth2.example/token")
        );
        for downgraded in ["http://id.example/token", "ftp://id.example/t"] {
            assert_eq!(discovered("https://id.example", &meta(downgraded)), None);
        }
        let plain = meta("http://127.0.0.1:8080/token");
        assert_eq!(
            discovered("http://127.0.0.1:8080", &plain),
            Some("http://127.0.0.1:8080/token")
        );
    }

    #[test]
    fn form_encoding_keeps_unreserved_characters_only() {
        assert_eq!(form("a-b.c_d~e"), "a-b.c_d~e");
        assert_eq!(form("urn:x y+z/="), "urn%3Ax%20y%2Bz%2F%3D");
        assert_eq!(form("ü"), "%C3%BC");
    }

    #[test]
    fn answers_are_checked_and_lifetimes_keep_a_margin() {
        let (h, valid) = parse_answer(
            br#"{"access_token":"abc.def.ghi","token_type":"Bearer","expires_in":600,
            "issued_token_type":"urn:ietf:params:oauth:token-type:access_token"}"#,
        )
        .unwrap();
        assert_eq!(h, "Bearer abc.def.ghi");
        assert_eq!(valid, Duration::from_secs(570));
        let (_, short) = parse_answer(br#"{"access_token":"t","expires_in":10}"#).unwrap();
        assert_eq!(short, Duration::from_secs(9));
        for bad in [
            &br#"not json"#[..],
            br#"{"token_type":"Bearer"}"#,
            br#"{"access_token":""}"#,
            br#"{"access_token":"a b"}"#,
            br#"{"access_token":"a\r\nX-Evil: 1"}"#,
            br#"{"access_token":"t","token_type":"DPoP"}"#,
            br#"{"access_token":"t","issued_token_type":"urn:ietf:params:oauth:token-type:refresh_token"}"#,
            br#"{"access_token":"t","expires_in":-5}"#,
            br#"{"access_token":"t","expires_in":"600"}"#,
        ] {
            assert!(parse_answer(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let long = format!(r#"{{"access_token":"{}"}}"#, "a".repeat(MAX_TOKEN_BYTES + 1));
        assert!(parse_answer(long.as_bytes()).is_err());
    }

    #[test]
    fn issuer_errors_never_echo_the_subject_token_or_the_secret() {
        let body = br#"{"error":"invalid_grant","error_description":"token eyJhbGciOi.subject.sig with secret s3cr3t-value is bad"}"#;
        let text = issuer_error(body, &["eyJhbGciOi.subject.sig", "s3cr3t-value"]);
        assert!(text.starts_with("invalid_grant: "), "{text}");
        assert!(
            !text.contains("subject.sig") && !text.contains("s3cr3t"),
            "{text}"
        );
        let long = format!(r#"{{"error":"x","error_description":"{}"}}"#, "d".repeat(5000));
        assert!(issuer_error(long.as_bytes(), &[]).len() < 500);
        // A long token near the cut is redacted before the cut, not left in part.
        let token = format!("eyJ{}", "t".repeat(400));
        let body = format!(r#"{{"error":"x","error_description":"subject {token} refused"}}"#);
        let text = issuer_error(body.as_bytes(), &[&token]);
        assert!(!text.contains("eyJ") && text.contains("[redacted]"), "{text}");
        assert_eq!(issuer_error(b"<html>", &[]), "no OAuth error in the answer");
    }
}
