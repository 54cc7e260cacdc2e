//! Client authentication on `/mcp`: static bearer tokens read from the secret store (a
//! rotated Secret takes effect on the next request, without a restart), and OAuth 2.1 / OIDC
//! access tokens (JWTs) checked against the issuer's published keys, as the MCP authorization
//! specification describes, with the protected-resource metadata document (RFC 9728).
//!
//! The token secret's value holds one token per line (blank lines and `#` comments are
//! skipped), so a rotation can keep the old and the new token valid for a while. A token may
//! be followed by what it grants, for tools with `access`: `TOKEN scope=deploy:write
//! group=sre`. Tokens are compared as SHA-256 digests in constant time: neither a token's
//! length nor the place where a guess first differs shows in the time a refusal takes.
//!
//! What a caller was granted (a [`Principal`]) comes from those words, or from an access
//! token's `scope`/`scp` claims and its groups claim.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::{ArcSwap, ArcSwapOption};
use http::{HeaderMap, HeaderValue, header};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::jwt::{self, Jwk};
use crate::config::SecretRef;
use crate::net::http::HttpClient;
use crate::secrets::Secrets;
use crate::spec::access::Principal;

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

    /// The `WWW-Authenticate` challenge (RFC 6750 section 3), pointing at the
    /// protected-resource metadata when there is some (RFC 9728 section 5.1).
    pub fn challenge(self, resource_metadata: Option<&str>) -> HeaderValue {
        let mut v = String::from("Bearer realm=\"mcp\"");
        if let Some(url) = resource_metadata {
            v.push_str(", resource_metadata=\"");
            v.push_str(url);
            v.push('"');
        }
        if self != Self::Missing {
            v.push_str(", error=\"invalid_token\", error_description=\"the token is not valid\"");
        }
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static("Bearer realm=\"mcp\""))
    }
}

/// Digests of the tokens of one secret snapshot, with what each grants.
#[derive(Debug)]
struct Tokens {
    /// The snapshot they were read from (compared by pointer: a rotation swaps it).
    from: Arc<Value>,
    digests: Vec<([u8; 32], Arc<Principal>)>,
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

/// A caller's [`Principal::subject`]: 128 bits of a digest of what identifies it (`kind`
/// keeps a token from ever meaning the same as an issuer's `sub`).
fn subject(kind: &str, identity: &[u8]) -> Box<str> {
    let d = Sha256::new()
        .chain_update(kind.as_bytes())
        .chain_update([0])
        .chain_update(identity)
        .finalize();
    d[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
        .into()
}

/// Equal without an early exit.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The token lines of a secret value: one per line, `#` comments and blanks skipped.
pub fn parse_tokens(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .take(MAX_TOKENS)
        .collect()
}

/// A token line: the token, then what it grants (`scope=NAME`, `group=NAME`, any number).
///
/// # Errors
/// A word after the token that is neither (the line is then not used at all: a typo must
/// not turn into a token with fewer grants than meant, nor into one with a space in it).
pub fn parse_token_line(line: &str) -> Result<(&str, Principal), String> {
    let mut words = line.split_ascii_whitespace();
    let token = words.next().unwrap_or("");
    let (mut scopes, mut groups) = (Vec::new(), Vec::new());
    for w in words {
        match w.split_once('=') {
            Some(("scope", s)) if !s.is_empty() => scopes.push(s),
            Some(("group", g)) if !g.is_empty() => groups.push(g),
            _ => {
                return Err(
                    "after the token, only `scope=NAME` and `group=NAME` words are understood".to_owned(),
                );
            }
        }
    }
    Ok((token, Principal::new(scopes, groups)))
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
        let mut digests: Vec<([u8; 32], Arc<Principal>)> = Vec::new();
        let mut repeated: Vec<[u8; 32]> = Vec::new();
        let mut short = 0;
        for (n, line) in parse_tokens(text).into_iter().enumerate() {
            match parse_token_line(line) {
                Ok((t, _)) if t.len() < MIN_TOKEN_LEN => short += 1,
                Ok((t, mut grants)) => {
                    let d = digest(t.as_bytes());
                    grants.subject = subject("token", t.as_bytes());
                    if digests.iter().any(|(x, _)| *x == d) {
                        // Which line's grants were meant? Neither is used.
                        tracing::warn!(secret = %self.secret, token = n + 1, "client token listed twice; not accepted until it is listed once");
                        repeated.push(d);
                    } else {
                        digests.push((d, Arc::new(grants)));
                    }
                }
                Err(e) => {
                    // The line number only: the line holds a token.
                    tracing::warn!(secret = %self.secret, token = n + 1, "client token ignored: {e}");
                }
            }
        }
        if short > 0 {
            tracing::warn!(secret = %self.secret, ignored = short, "client tokens shorter than {MIN_TOKEN_LEN} characters are ignored");
        }
        digests.retain(|(d, _)| !repeated.contains(d));
        let fresh = Arc::new(Tokens { from: now, digests });
        self.cache.store(Some(Arc::clone(&fresh)));
        fresh
    }

    /// Checks the request's `Authorization` header.
    ///
    /// # Errors
    /// Why the request may not proceed.
    pub fn check(&self, headers: &HeaderMap) -> Result<Arc<Principal>, Denied> {
        self.accepts(bearer_token(headers).ok_or(Denied::Missing)?)
    }

    /// Whether `presented` is one of the tokens; what it grants if so.
    ///
    /// # Errors
    /// It is not, or there are no tokens to compare with.
    pub fn accepts(&self, presented: &[u8]) -> Result<Arc<Principal>, Denied> {
        let tokens = self.tokens();
        if tokens.digests.is_empty() {
            return Err(Denied::Unconfigured);
        }
        let d = digest(presented);
        // Every digest is compared, whichever matches.
        let mut found = None;
        for (t, grants) in &tokens.digests {
            if same(t, &d) {
                found = Some(grants);
            }
        }
        found.map(Arc::clone).ok_or(Denied::Invalid)
    }
}

/// The token of an `Authorization: Bearer TOKEN` header.
pub fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    if value.len() > MAX_HEADER_LEN || value.len() < 7 || !value[..7].eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    Some(value[7..].trim_ascii())
}

/// An OAuth 2.1 / OIDC issuer whose access tokens the server accepts.
#[derive(Debug, Clone)]
pub struct OidcConfig {
    /// `iss` of accepted tokens; its `/.well-known/openid-configuration` (or
    /// `oauth-authorization-server`) names the key set unless `jwks_url` does.
    pub issuer: String,
    /// A value that `aud` must contain (the MCP server's canonical URL, RFC 8707).
    pub audience: String,
    /// Where the key set is, when discovery should not be used.
    pub jwks_url: Option<String>,
    /// The MCP endpoint's canonical URL for the protected-resource metadata; `None` derives
    /// it from each request's `Host` (`http://HOST/mcp`).
    pub resource: Option<String>,
    /// Tolerated clock difference.
    pub leeway: Duration,
    /// The claim listing the caller's groups (a name, or a dotted path into nested
    /// objects such as `realm_access.roles`), for tools with `access.groups`.
    pub groups_claim: String,
    /// The CAs trusted for the issuer's documents instead of the public roots (an issuer
    /// inside the organisation), read from the secret store like an http tool's `tls`.
    pub ca: Option<(SecretRef, Arc<Secrets>)>,
}

/// How often the key set is re-fetched, and the least time between fetches that an unknown
/// `kid` may cause.
const JWKS_REFRESH: Duration = Duration::from_secs(600);
const JWKS_MIN_INTERVAL: Duration = Duration::from_secs(30);
/// The first wait after a failed fetch (doubling up to [`JWKS_REFRESH`]).
const JWKS_RETRY: Duration = Duration::from_secs(1);
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_DOCUMENT_BYTES: usize = 256 << 10;

/// Verifies access tokens of one issuer, keeping its key set fresh.
#[derive(Debug)]
pub struct Oidc {
    cfg: OidcConfig,
    http: HttpClient,
    keys: ArcSwap<Vec<Jwk>>,
    /// When an unknown `kid` last caused a fetch (the lock also serialises fetches).
    kid_fetched: tokio::sync::Mutex<Option<Instant>>,
    /// Tokens verified before.
    verified: Verified,
}

/// A verified access token is trusted again without a signature check for at most this
/// long (and never past its `exp`).
const VERIFIED_SECS: i64 = 300;
/// Verified tokens kept (a client presents the same token on every call until it expires).
const MAX_VERIFIED: usize = 2048;

/// Access tokens verified before, by their exact bytes: one presented again within its
/// lifetime (at most [`VERIFIED_SECS`]) and under the same key set is not verified again, and
/// its caller is the same `Principal` (no allocation). A token that did not verify is never
/// kept; a key set fetched since makes every entry verify again (a key the issuer dropped
/// stops working at once).
#[derive(Debug, Default)]
struct Verified(std::sync::RwLock<rustc_hash::FxHashMap<Box<[u8]>, Trusted>>);

#[derive(Debug)]
struct Trusted {
    principal: Arc<Principal>,
    keys: Arc<Vec<Jwk>>,
    until: i64,
}

impl Verified {
    fn get(&self, token: &[u8], keys: &Arc<Vec<Jwk>>, now: i64) -> Option<Arc<Principal>> {
        let map = self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let t = map.get(token)?;
        (now < t.until && Arc::ptr_eq(&t.keys, keys)).then(|| Arc::clone(&t.principal))
    }

    fn put(&self, token: &[u8], trusted: Trusted) {
        let mut map = self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= MAX_VERIFIED {
            let now = now_unix();
            map.retain(|_, t| now < t.until && Arc::ptr_eq(&t.keys, &trusted.keys));
            if map.len() >= MAX_VERIFIED {
                // Full of live tokens: any one goes (its caller is verified again).
                let k = map.keys().next().cloned();
                k.map(|k| map.remove(&k));
            }
        }
        map.insert(token.into(), trusted);
    }
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl Oidc {
    /// A verifier; call [`Oidc::start`] to fetch the keys.
    pub fn new(cfg: OidcConfig, http: HttpClient) -> Arc<Self> {
        Arc::new(Self {
            cfg,
            http,
            keys: ArcSwap::from_pointee(Vec::new()),
            kid_fetched: tokio::sync::Mutex::new(None),
            verified: Verified::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &OidcConfig {
        &self.cfg
    }

    /// Fetches the key set now and every 10 minutes, until the process ends.
    ///
    /// A failed fetch is tried again after 1 s, doubling up to the 10 minutes: an issuer (or
    /// its CA bundle, read from the API) not reachable yet at start must not leave the server
    /// without keys for long.
    pub fn start(self: &Arc<Self>) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut retry = JWKS_RETRY;
            loop {
                if this.refresh(false).await {
                    retry = JWKS_RETRY;
                    tokio::time::sleep(JWKS_REFRESH).await;
                } else {
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(JWKS_REFRESH);
                }
            }
        });
    }

    /// One of the issuer's documents, through its CAs when it has some.
    async fn get_json(&self, url: &str) -> Result<Value, String> {
        match &self.cfg.ca {
            None => {
                self.http
                    .get_json(url, FETCH_TIMEOUT, MAX_DOCUMENT_BYTES, None)
                    .await
            }
            Some((ca, secrets)) => {
                let tls = crate::config::TlsRefs {
                    ca: Some(ca.clone()),
                    client: None,
                };
                let now = secrets.snapshot();
                self.http
                    .get_json(url, FETCH_TIMEOUT, MAX_DOCUMENT_BYTES, Some((&tls, &now)))
                    .await
            }
        }
    }

    async fn jwks_url(&self) -> Result<String, String> {
        if let Some(u) = &self.cfg.jwks_url {
            return Ok(u.clone());
        }
        let base = self.cfg.issuer.trim_end_matches('/');
        let mut last = String::new();
        for doc in ["openid-configuration", "oauth-authorization-server"] {
            let url = format!("{base}/.well-known/{doc}");
            match self.get_json(&url).await {
                Ok(meta) => match meta.get("jwks_uri").and_then(Value::as_str) {
                    Some(u) => return Ok(u.to_owned()),
                    None => last = format!("{url} names no jwks_uri"),
                },
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Re-fetches the key set; for an unknown `kid`, at most once per [`JWKS_MIN_INTERVAL`]
    /// (tokens naming made-up keys must not make the server hammer the issuer). Whether
    /// keys were loaded.
    async fn refresh(&self, for_unknown_kid: bool) -> bool {
        let mut kid_fetched = self.kid_fetched.lock().await;
        if for_unknown_kid {
            if kid_fetched.is_some_and(|t| t.elapsed() < JWKS_MIN_INTERVAL) {
                return false;
            }
            *kid_fetched = Some(Instant::now());
        }
        let result = match self.jwks_url().await {
            Ok(url) => self.get_json(&url).await.map(|doc| jwt::parse_jwks(&doc)),
            Err(e) => Err(e),
        };
        match result {
            Ok(keys) if !keys.is_empty() => {
                tracing::info!(issuer = %self.cfg.issuer, keys = keys.len(), "issuer keys loaded");
                self.keys.store(Arc::new(keys));
                true
            }
            Ok(_) => {
                tracing::warn!(issuer = %self.cfg.issuer, "the issuer's key set has no usable signing key (RS256, ES256); keeping the previous keys");
                false
            }
            Err(e) => {
                tracing::warn!(issuer = %self.cfg.issuer, error = %e, "cannot fetch the issuer's keys; keeping the previous keys");
                false
            }
        }
    }

    /// Verifies an access token; a token signed by a key not seen yet makes one refresh of
    /// the key set (at most every 30 s). A token verified before is found in [`Verified`].
    ///
    /// # Errors
    /// [`Denied::Invalid`] when it does not verify.
    pub async fn check(&self, token: &[u8]) -> Result<Arc<Principal>, Denied> {
        let now = now_unix();
        let keys = self.keys.load_full();
        if let Some(p) = self.verified.get(token, &keys, now) {
            return Ok(p);
        }
        let token = std::str::from_utf8(token).map_err(|_| Denied::Invalid)?;
        let expect = jwt::Expect {
            issuer: &self.cfg.issuer,
            audience: &self.cfg.audience,
            now,
            leeway: i64::try_from(self.cfg.leeway.as_secs()).unwrap_or(60),
        };
        let (claims, keys) = match jwt::verify(token, &keys, &expect) {
            Err(jwt::Invalid::UnknownKey) => {
                self.refresh(true).await;
                let keys = self.keys.load_full();
                (jwt::verify(token, &keys, &expect), keys)
            }
            other => (other, keys),
        };
        let claims = claims.map_err(|e| {
            tracing::debug!(reason = %e, "access token refused");
            Denied::Invalid
        })?;
        let exp = claims.get("exp").and_then(Value::as_i64);
        let principal = Arc::new(self.principal_of(token, claims));
        if let Some(exp) = exp {
            let trusted = Trusted {
                principal: Arc::clone(&principal),
                keys,
                until: exp.min(now.saturating_add(VERIFIED_SECS)),
            };
            self.verified.put(token.as_bytes(), trusted);
        }
        Ok(principal)
    }

    /// The caller a verified token names.
    fn principal_of(&self, token: &str, claims: Value) -> Principal {
        let mut p = principal(&claims, &self.cfg.groups_claim);
        // The same person across token refreshes; a token without `sub` is its own caller.
        p.subject = match claims.get("sub").and_then(Value::as_str) {
            Some(sub) => subject("sub", format!("{}\0{sub}", self.cfg.issuer).as_bytes()),
            None => subject("jwt", token.as_bytes()),
        };
        p.identity = identity(&claims);
        // Kept for identity to upstreams and `{{caller.CLAIM}}`; never logged.
        p.credential = Some(Arc::new(crate::spec::caller::Credential::new(token, claims)));
        p
    }
}

impl Oidc {
    /// Verifies an ID token of the issuer addressed to `client_id` (a browser's sign-in, to
    /// bind a sign-in link to its caller): signature, `iss`, `aud`, expiry; its claims.
    ///
    /// # Errors
    /// Why it does not verify (never the token).
    pub async fn check_id_token(&self, token: &str, client_id: &str) -> Result<Value, String> {
        let expect = jwt::Expect {
            issuer: &self.cfg.issuer,
            audience: client_id,
            now: now_unix(),
            leeway: i64::try_from(self.cfg.leeway.as_secs()).unwrap_or(60),
        };
        match jwt::verify(token, &self.keys.load(), &expect) {
            Err(jwt::Invalid::UnknownKey) => {
                self.refresh(true).await;
                jwt::verify(token, &self.keys.load(), &expect)
            }
            other => other,
        }
        .map_err(|e| e.to_string())
    }
}

impl crate::oauth::sign_in::IdTokens for Oidc {
    fn issuer(&self) -> &str {
        &self.cfg.issuer
    }

    fn verify<'a>(&'a self, token: &'a str, audience: &'a str) -> crate::oauth::sign_in::Verified<'a> {
        Box::pin(self.check_id_token(token, audience))
    }
}

/// The claims that name a caller in the audit trail, each cut to a bounded length.
fn identity(claims: &Value) -> crate::spec::access::Identity {
    let claim = |name: &str| -> Box<str> {
        let v = claims.get(name).and_then(Value::as_str).unwrap_or("");
        let mut end = v.len().min(crate::spec::access::MAX_ACCESS_NAME);
        while !v.is_char_boundary(end) {
            end -= 1;
        }
        v[..end].into()
    };
    let azp = claim("azp");
    crate::spec::access::Identity {
        sub: claim("sub"),
        issuer: claim("iss"),
        client_id: if azp.is_empty() { claim("client_id") } else { azp },
    }
}

/// Names from a claim that is an array of strings, or a string: split on spaces when
/// `split` (a `scope` claim is space-separated, RFC 9068), one name otherwise (a group such as
/// `Domain Admins` is not the groups `Domain` and `Admins`).
fn names(v: Option<&Value>, split: bool) -> Vec<&str> {
    match v {
        Some(Value::String(s)) if split => s.split_ascii_whitespace().collect(),
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// What an access token grants: scopes from `scope` (RFC 9068) or `scp`, groups from
/// `groups_claim` (tried as a name first, then as a dotted path).
pub fn principal(claims: &Value, groups_claim: &str) -> Principal {
    let scopes = names(claims.get("scope").or_else(|| claims.get("scp")), true);
    let groups = claims
        .get(groups_claim)
        .or_else(|| groups_claim.split('.').try_fold(claims, |v, part| v.get(part)));
    Principal::new(scopes, names(groups, false))
}

/// Every way a client may authenticate; a request passes with any one of them.
#[derive(Debug)]
pub struct Auth {
    /// Static tokens from a Secret.
    pub bearer: Option<BearerAuth>,
    /// Access tokens of an issuer.
    pub oidc: Option<Arc<Oidc>>,
}

/// Whether `s` can stand as a URL in a header value and a JSON document: `http(s)://` and
/// visible ASCII without quotes, at most 2 KiB.
fn plain_url(s: &str) -> bool {
    (s.starts_with("https://") || s.starts_with("http://"))
        && s.len() <= 2048
        && s.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
}

impl Auth {
    /// Checks the request's credentials.
    ///
    /// # Errors
    /// Why the request may not proceed.
    pub async fn check(&self, headers: &HeaderMap) -> Result<Arc<Principal>, Denied> {
        let token = bearer_token(headers).ok_or(Denied::Missing)?;
        let mut denied = Denied::Unconfigured;
        if let Some(b) = &self.bearer {
            match b.accepts(token) {
                Ok(p) => return Ok(p),
                Err(d) => denied = d,
            }
        }
        // A JWT has three parts; anything else is not worth a signature check.
        if let Some(o) = &self.oidc
            && token.iter().filter(|b| **b == b'.').count() == 2
        {
            return o.check(token).await;
        }
        Err(if self.oidc.is_some() {
            Denied::Invalid
        } else {
            denied
        })
    }

    /// The MCP endpoint's canonical URL (OIDC only), from configuration alone, never from a
    /// request: `--auth-resource`, else the audience when it is a URL (what tokens must be
    /// issued for), else `http://HOST/mcp` for the first host of the Host allow-list
    /// (`allowed_hosts`). `None` when none is configured.
    pub fn resource(&self, allowed_hosts: Option<&[String]>) -> Option<String> {
        let o = self.oidc.as_ref()?;
        if let Some(r) = &o.cfg.resource {
            return Some(r.clone());
        }
        if plain_url(&o.cfg.audience) {
            return Some(o.cfg.audience.clone());
        }
        allowed_hosts?
            .iter()
            .find(|h| {
                *h != "*"
                    && h.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
            })
            .map(|h| format!("http://{h}/mcp"))
            .filter(|u| plain_url(u))
    }

    /// Where the protected-resource metadata is, for `WWW-Authenticate`.
    pub fn metadata_url(&self, allowed_hosts: Option<&[String]>) -> Option<String> {
        let resource = self.resource(allowed_hosts)?;
        let (scheme, rest) = resource.split_once("://")?;
        let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        let mut url = format!("{scheme}://{authority}/.well-known/oauth-protected-resource");
        if !path.is_empty() {
            url.push('/');
            url.push_str(path);
        }
        Some(url)
    }

    /// The protected-resource metadata document (RFC 9728), when an issuer is configured;
    /// `scopes` are those the served tools require (`scopes_supported`, left out when none).
    pub fn metadata(&self, allowed_hosts: Option<&[String]>, scopes: &[&str]) -> Option<Value> {
        let o = self.oidc.as_ref()?;
        let mut doc = serde_json::json!({
            "resource": self.resource(allowed_hosts)?,
            "authorization_servers": [o.cfg.issuer],
            "bearer_methods_supported": ["header"],
        });
        if !scopes.is_empty() {
            doc["scopes_supported"] = scopes.into();
        }
        Some(doc)
    }

    /// The challenge of a call refused for lack of scopes (RFC 6750 section 3.1), naming
    /// them so that a client can ask for them (the MCP step-up flow).
    pub fn scope_challenge(&self, allowed_hosts: Option<&[String]>, scopes: &str) -> HeaderValue {
        let mut v = format!("Bearer realm=\"mcp\", error=\"insufficient_scope\", scope=\"{scopes}\"");
        if let Some(url) = self.metadata_url(allowed_hosts) {
            v.push_str(", resource_metadata=\"");
            v.push_str(&url);
            v.push('"');
        }
        HeaderValue::from_str(&v).unwrap_or_else(|_| {
            HeaderValue::from_static("Bearer realm=\"mcp\", error=\"insufficient_scope\"")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::Presence;

    #[test]
    fn a_verified_token_is_trusted_again_only_within_its_life_and_key_set() {
        let v = Verified::default();
        let keys = Arc::new(Vec::new());
        let p = Arc::new(Principal {
            scopes: vec!["read".into()],
            ..Principal::default()
        });
        v.put(
            b"tok",
            Trusted {
                principal: Arc::clone(&p),
                keys: Arc::clone(&keys),
                until: 100,
            },
        );
        assert!(Arc::ptr_eq(&v.get(b"tok", &keys, 99).expect("trusted"), &p));
        assert!(v.get(b"tok", &keys, 100).is_none(), "expired");
        assert!(v.get(b"tok2", &keys, 50).is_none(), "another token");
        assert!(v.get(b"to", &keys, 50).is_none(), "a prefix");
        let fetched = Arc::new(Vec::new());
        assert!(v.get(b"tok", &fetched, 50).is_none(), "a key set fetched since");
        // Bounded: live tokens beyond the bound push one out, never grow the table.
        for i in 0..MAX_VERIFIED + 10 {
            let t = Trusted {
                principal: Arc::clone(&p),
                keys: Arc::clone(&keys),
                until: i64::MAX,
            };
            v.put(format!("t{i}").as_bytes(), t);
        }
        assert!(v.0.read().unwrap().len() <= MAX_VERIFIED);
    }

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
        assert_eq!(a.check(&with("Bearer first-token-0123456789")).map(drop), Ok(()));
        assert_eq!(
            a.check(&with("bearer   second-token-0123456789  ")).map(drop),
            Ok(())
        );
        assert_eq!(
            a.check(&with("Bearer short")).map(drop),
            Err(Denied::Invalid),
            "too short to count"
        );
        assert_eq!(
            a.check(&with("Bearer first-token-012345678")).map(drop),
            Err(Denied::Invalid)
        );
        assert_eq!(a.check(&with("Bearer ")).map(drop), Err(Denied::Invalid));
        assert_eq!(a.check(&with("Basic Zmlyc3Q=")).map(drop), Err(Denied::Missing));
        assert_eq!(a.check(&HeaderMap::new()).map(drop), Err(Denied::Missing));
        assert_eq!(
            a.check(&with(&format!("Bearer {}", "x".repeat(9000)))),
            Err(Denied::Missing)
        );
    }

    #[test]
    fn a_token_line_may_grant_scopes_and_groups() {
        let (a, _) = auth(
            "grants-token-0123456789 scope=deploy:write group=sre scope=read\n\
             typo-token-0123456789 scopes=read\n",
        );
        let p = a.check(&with("Bearer grants-token-0123456789")).unwrap();
        assert_eq!(
            (&p.scopes, &p.groups),
            (
                &Principal::new(["deploy:write", "read"], ["sre"]).scopes,
                &vec![Box::from("sre")]
            )
        );
        // Each token is its own caller, and its subject does not show the token.
        let other = auth("other-token-0123456789\ngrants-token-0123456789\n").0;
        let again = other.check(&with("Bearer grants-token-0123456789")).unwrap();
        let third = other.check(&with("Bearer other-token-0123456789")).unwrap();
        assert_eq!(p.subject, again.subject);
        assert_ne!(p.subject, third.subject);
        assert_eq!(p.subject.len(), 32);
        assert!(!p.subject.contains("grants"));
        // A token listed twice is not used at all, whichever line was meant.
        let (twice, _) =
            auth("dup-token-0123456789 scope=admin\nother-token-0123456789\ndup-token-0123456789\n");
        assert_eq!(
            twice.check(&with("Bearer dup-token-0123456789")).map(drop),
            Err(Denied::Invalid)
        );
        assert!(twice.check(&with("Bearer other-token-0123456789")).is_ok());
        // A line that cannot be read whole is not used at all.
        assert_eq!(
            a.check(&with("Bearer typo-token-0123456789")).map(drop),
            Err(Denied::Invalid)
        );
        assert_eq!(
            a.check(&with("Bearer typo-token-0123456789 scopes=read"))
                .map(drop),
            Err(Denied::Invalid)
        );
    }

    #[test]
    fn an_access_token_grants_its_scope_and_groups_claims() {
        let claims = serde_json::json!({
            "scope": "read  deploy:write",
            "groups": ["sre", 7, "dev"],
            "realm_access": {"roles": "Domain Admins"},
            "https://example.com/groups": ["namespaced"],
        });
        assert_eq!(
            principal(&claims, "groups"),
            Principal::new(["read", "deploy:write"], ["sre", "dev"])
        );
        assert_eq!(
            principal(&claims, "realm_access.roles").groups,
            vec![Box::from("Domain Admins")],
            "one group, not two"
        );
        assert_eq!(
            principal(&claims, "https://example.com/groups").groups,
            vec![Box::from("namespaced")]
        );
        let scp = serde_json::json!({"scp": ["a", "b"]});
        assert_eq!(principal(&scp, "groups"), Principal::new(["a", "b"], []));
        assert_eq!(
            principal(&serde_json::json!({"scope": 5}), "nope.deeper"),
            Principal::default()
        );
    }

    #[test]
    fn a_rotation_applies_to_the_next_request() {
        let (a, secrets) = auth("old-token-0123456789");
        assert_eq!(a.check(&with("Bearer old-token-0123456789")).map(drop), Ok(()));
        secrets.set(
            "clients",
            Some(vec![("tokens".into(), b"new-token-0123456789".to_vec())]),
            Presence::Loaded,
        );
        assert_eq!(
            a.check(&with("Bearer old-token-0123456789")).map(drop),
            Err(Denied::Invalid)
        );
        assert_eq!(a.check(&with("Bearer new-token-0123456789")).map(drop), Ok(()));
        secrets.set("clients", None, Presence::Missing);
        assert_eq!(
            a.check(&with("Bearer new-token-0123456789")).map(drop),
            Err(Denied::Unconfigured)
        );
    }
}
