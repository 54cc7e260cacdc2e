//! The run step of an http tool's per-call credentials (an imported OpenAPI operation's
//! security scheme): HTTP basic from Secret values, and the OAuth2 client credentials grant
//! whose token is fetched once, kept until shortly before it expires, and fetched again on
//! expiry, on a 401 or when the client credentials rotate.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, header};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::Value;

use quiver_model::handlers::http::auth::{Auth, OAuth2};
use quiver_model::spec::context::SecretRef;

use super::{HttpClient, USER_AGENT};

/// Largest token endpoint answer read.
pub const MAX_TOKEN_RESPONSE_BYTES: usize = 64 * 1024;
/// A token without `expires_in` is kept this long (or until a 401).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);
/// A token is fetched again this long before it expires (at most a quarter of its life).
const EARLY: Duration = Duration::from_secs(30);

/// A token and until when it is used.
#[derive(Debug)]
pub(crate) struct Token {
    value: HeaderValue,
    until: Instant,
    /// A hash of the client credentials it was fetched with: a rotated Secret refetches.
    client: u64,
}

fn value<'a>(secrets: &'a Value, r: &SecretRef) -> Result<&'a str, String> {
    secrets
        .get(&r.name)
        .and_then(|s| s.get(&r.key))
        .and_then(Value::as_str)
        .map(str::trim)
        .ok_or_else(|| format!("{r} is not available"))
}

/// Form-encodes (`application/x-www-form-urlencoded`) one value.
fn form(s: &str, out: &mut String) {
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
}

/// The run step of a compiled [`Auth`].
pub(crate) trait AuthRun {
    /// The `Authorization` value of a call.
    ///
    /// # Errors
    /// A Secret value is missing, or the token could not be fetched.
    async fn authorization(
        &self,
        client: &HttpClient,
        secrets: &Value,
        timeout: Duration,
    ) -> Result<HeaderValue, String>;

    /// Drops a token the API refused (401); whether there was one to fetch again.
    async fn refused(&self) -> bool;
}

/// The token cache of a grant, kept in the compiled grant's runtime slot.
type TokenCell = tokio::sync::Mutex<Option<Token>>;

fn cell(o: &OAuth2) -> Result<&TokenCell, String> {
    o.token
        .get_or_init(|| TokenCell::new(None))
        .ok_or_else(|| "the OAuth2 grant's token cache holds another type".to_owned())
}

impl AuthRun for Auth {
    async fn authorization(
        &self,
        client: &HttpClient,
        secrets: &Value,
        timeout: Duration,
    ) -> Result<HeaderValue, String> {
        match self {
            Self::Basic { user, password } => {
                let pair = format!("{}:{}", value(secrets, user)?, value(secrets, password)?);
                let encoded = quiver_model::handlers::content::to_base64(pair.as_bytes());
                HeaderValue::from_str(&format!("Basic {encoded}"))
                    .map_err(|_| "the basic credential is not a valid header value".to_owned())
            }
            Self::OAuth2(o) => bearer(o, client, secrets, timeout).await,
        }
    }

    async fn refused(&self) -> bool {
        match self {
            Self::Basic { .. } => false,
            Self::OAuth2(o) => match cell(o) {
                Ok(c) => {
                    *c.lock().await = None;
                    true
                }
                Err(_) => false,
            },
        }
    }
}

/// The current token, fetched when there is none, it is about to expire, or the
/// client credentials changed. Concurrent calls wait for one fetch.
async fn bearer(
    o: &OAuth2,
    client: &HttpClient,
    secrets: &Value,
    timeout: Duration,
) -> Result<HeaderValue, String> {
    use std::hash::{Hash, Hasher};
    let id = value(secrets, &o.client_id)?;
    let secret = value(secrets, &o.client_secret)?;
    let mut h = rustc_hash::FxHasher::default();
    (id, secret).hash(&mut h);
    let hash = h.finish();
    let mut slot = cell(o)?.lock().await;
    if let Some(t) = slot.as_ref()
        && t.client == hash
        && Instant::now() < t.until
    {
        return Ok(t.value.clone());
    }
    *slot = None;
    let (value, lifetime) = tokio::time::timeout(timeout, fetch(o, client, id, secret))
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "the OAuth2 token endpoint {} did not answer within {timeout:?}",
                shown(o)
            ))
        })?;
    let early = EARLY.min(lifetime / 4);
    *slot = Some(Token {
        value: value.clone(),
        until: Instant::now() + lifetime - early,
        client: hash,
    });
    Ok(value)
}

/// The token URL without its query.
fn shown(o: &OAuth2) -> &str {
    o.token_url.split('?').next().unwrap_or_default()
}

/// One client credentials grant (RFC 6749 4.4, client authenticated by HTTP basic).
async fn fetch(
    o: &OAuth2,
    client: &HttpClient,
    id: &str,
    secret: &str,
) -> Result<(HeaderValue, Duration), String> {
    let url = shown(o);
    let mut pair = String::new();
    form(id, &mut pair);
    pair.push(':');
    form(secret, &mut pair);
    let basic = format!(
        "Basic {}",
        quiver_model::handlers::content::to_base64(pair.as_bytes())
    );
    let mut body = String::from("grant_type=client_credentials");
    if !o.scope.is_empty() {
        body.push_str("&scope=");
        form(&o.scope, &mut body);
    }
    let req = Request::builder()
        .method(Method::POST)
        .uri(&o.token_url)
        .header(header::AUTHORIZATION, basic)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::ACCEPT, "application/json")
        .header(header::USER_AGENT, USER_AGENT)
        .body(Full::new(Bytes::from(body)))
        .map_err(|_| format!("the OAuth2 token request to {url} is invalid (check the client id)"))?;
    let resp = client
        .send(req, None, &Value::Null)
        .await
        .map_err(|e| format!("the OAuth2 token endpoint: {e}"))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("the OAuth2 token endpoint {url} answered {status}"));
    }
    let bytes = Limited::new(resp.into_body(), MAX_TOKEN_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|_| {
            format!("the OAuth2 token endpoint {url} answered more than {MAX_TOKEN_RESPONSE_BYTES} bytes, or broke off")
        })?
        .to_bytes();
    parse(&bytes).map_err(|e| format!("the OAuth2 token endpoint {url} {e}"))
}

/// The `Authorization` value and lifetime of a token answer.
pub(crate) fn parse(bytes: &[u8]) -> Result<(HeaderValue, Duration), String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|_| "answered no JSON".to_owned())?;
    let token = v
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or("answered no `access_token`")?;
    if let Some(kind) = v.get("token_type").and_then(Value::as_str)
        && !kind.eq_ignore_ascii_case("bearer")
    {
        return Err(format!(
            "answered a `{}` token; only bearer tokens are supported",
            kind.chars().take(32).collect::<String>()
        ));
    }
    let lifetime = v
        .get("expires_in")
        .and_then(Value::as_f64)
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(DEFAULT_LIFETIME, |s| Duration::from_secs_f64(s.min(86_400.0)));
    let header = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| "answered an access_token that is not a valid header value".to_owned())?;
    Ok((header, lifetime))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_token_answer_gives_the_bearer_value_and_its_lifetime() {
        let (h, life) = parse(br#"{"access_token":"abc","token_type":"Bearer","expires_in":60}"#).unwrap();
        assert_eq!(h.to_str().unwrap(), "Bearer abc");
        assert_eq!(life.as_secs(), 60);
        let (_, life) = parse(br#"{"access_token":"abc"}"#).unwrap();
        assert_eq!(life.as_secs(), 300);
    }

    #[test]
    fn a_bad_token_answer_is_an_error_naming_what_is_wrong() {
        for (body, want) in [
            (&b"<html>"[..], "no JSON"),
            (br#"{"token_type":"bearer"}"#, "no `access_token`"),
            (br#"{"access_token":""}"#, "no `access_token`"),
            (br#"{"access_token":"a","token_type":"mac"}"#, "`mac` token"),
            (b"{\"access_token\":\"a\\nb\"}", "not a valid header value"),
        ] {
            let e = parse(body).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }
}
