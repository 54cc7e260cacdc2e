//! Signing in to the console: OpenID Connect's authorization code flow with PKCE (S256),
//! completed by the console itself (a backend for its pages): the browser holds a random
//! session id in an `HttpOnly` cookie, never a token. The ID token comes straight from the
//! token endpoint over the console's own connection, so its issuer, audience, expiry and
//! nonce are checked (OpenID Connect Core 3.1.3.7) without a key set: that connection must
//! be https (or to this machine's loopback address). A sign-in in progress keeps nothing on
//! the console: its state, PKCE verifier and nonce ride in the browser's `HttpOnly` sign-in
//! cookie, so no number of begun sign-ins can push out another's.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::Full;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::client::Http;

/// How long a begun sign-in may take (the sign-in cookie's lifetime).
pub const SIGN_IN_TTL: Duration = Duration::from_secs(600);
/// Sessions kept at most; beyond, the expired go, then new sign-ins wait.
const SESSIONS_MAX: usize = 10_000;
/// Sessions one user holds at most (browsers, devices); a new one ends their oldest.
const SESSIONS_PER_USER: usize = 16;
/// The longest session, whatever the token says.
const SESSION_MAX_AGE: Duration = Duration::from_secs(8 * 3600);
/// How long before its access token expires a session with a refresh token renews it.
const REFRESH_BEFORE: Duration = Duration::from_secs(60);
/// Longest token kept (access or refresh).
const MAX_TOKEN: usize = 16 << 10;
/// Largest discovery document or token answer read.
const MAX_DOCUMENT: usize = 256 << 10;
/// The longest wait for the provider.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest claim value kept (user names, groups).
const MAX_CLAIM: usize = 256;
/// Most groups kept.
const MAX_GROUPS: usize = 256;

/// How the console signs users in, and how they are named to the Kubernetes API server.
#[derive(Debug, Clone)]
pub struct OidcConfig {
    /// The issuer (its discovery document is at `/.well-known/openid-configuration`).
    pub issuer: String,
    /// The console's client id there (a public client; PKCE S256).
    pub client_id: String,
    /// Scopes asked for, `openid` among them.
    pub scopes: String,
    /// The claim whose value names the user.
    pub username_claim: String,
    /// Put before the user name, as the API server's own OpenID settings do.
    pub username_prefix: String,
    /// The claim listing the user's groups (a dotted path is followed).
    pub groups_claim: String,
    /// Put before each group.
    pub groups_prefix: String,
}

/// The endpoints of the provider's discovery document.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// Where the browser signs in.
    pub authorization: String,
    /// Where the code is exchanged.
    pub token: String,
}

/// A signed-in user.
#[derive(Debug, Clone)]
pub struct Session {
    /// The name shown (the username claim, without prefix).
    pub shown: String,
    /// The name the API server knows (prefixed).
    pub username: String,
    /// Groups, prefixed.
    pub groups: Vec<String>,
    /// The access token the user's calls carry.
    pub access_token: String,
    /// The audiences the access token names, when it is a JWT (none known: an opaque token).
    pub audiences: Option<Vec<String>>,
    /// When the access token expires.
    pub expires: Instant,
    /// The token the session's forms carry back (against cross-site requests).
    pub csrf: String,
    /// The refresh token, while the provider gave one and it has worked.
    refresh: Option<String>,
    /// When the session ends, refreshed or not.
    ends: Instant,
    /// A refresh is under way (meanwhile the other requests use the current token).
    refreshing: bool,
}

impl Session {
    /// Whether it can still be used at `now`: its access token is valid, or it can renew it.
    fn usable(&self, now: Instant) -> bool {
        self.expires > now || (self.refresh.is_some() && self.ends > now)
    }
}

/// What a refresh gave.
struct Renewed {
    access_token: String,
    lifetime: Duration,
    refresh: Option<String>,
}

/// A sign-in in progress, as the browser's sign-in cookie carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The `state` sent to the provider.
    pub state: String,
    /// The PKCE verifier.
    pub verifier: String,
    /// The nonce the ID token must carry.
    pub nonce: String,
}

impl Pending {
    /// A new sign-in, or `None` without the system's randomness.
    pub fn new() -> Option<Self> {
        Some(Self {
            state: random(32)?,
            verifier: random(48)?,
            nonce: random(24)?,
        })
    }

    /// The cookie value: the three, base64url, joined by dots.
    pub fn cookie(&self) -> String {
        format!("{}.{}.{}", self.state, self.verifier, self.nonce)
    }

    /// The sign-in a cookie value carries.
    pub fn from_cookie(v: &str) -> Option<Self> {
        let mut parts = v.split('.');
        let mut part = || {
            parts
                .next()
                .filter(|p| {
                    (16..=128).contains(&p.len())
                        && p.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                })
                .map(str::to_owned)
        };
        let (state, verifier, nonce) = (part()?, part()?, part()?);
        parts.next().is_none().then_some(Self {
            state,
            verifier,
            nonce,
        })
    }
}

/// Why a sign-in did not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failed {
    /// The provider, the ID token or the browser's state said no.
    Refused(String),
    /// The provider could not be read or reached.
    Unavailable(String),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(w) | Self::Unavailable(w) => f.write_str(w),
        }
    }
}

/// Sign-ins in progress and sessions.
#[derive(Debug)]
pub struct SignIn {
    /// Settings.
    pub config: OidcConfig,
    /// The redirect URI (the console's `/callback`).
    pub redirect: String,
    http: Http,
    endpoints: tokio::sync::Mutex<Option<Endpoints>>,
    sessions: Mutex<HashMap<[u8; 32], Session>>,
}

/// `n` random bytes, base64url; `None` without the system's randomness (there is then
/// nothing safe to hand out).
pub fn random(n: usize) -> Option<String> {
    let mut b = vec![0u8; n];
    getrandom::getrandom(&mut b).ok()?;
    Some(URL_SAFE_NO_PAD.encode(b))
}

/// Whether tokens may travel to `url`: https, or http to this machine's loopback address
/// (a provider beside the console, as in development).
pub fn secure_or_loopback(url: &str) -> bool {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return false;
    };
    // User information (`http://127.0.0.1@evil.example/`) would name one host and reach another.
    if uri.authority().is_none_or(|a| a.as_str().contains('@')) {
        return false;
    }
    let host = uri.host().unwrap_or_default().to_ascii_lowercase();
    match uri.scheme_str() {
        Some("https") => !host.is_empty(),
        Some("http") => {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
        _ => false,
    }
}

/// The PKCE S256 challenge of `verifier`.
pub fn challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

fn key(session_id: &str) -> [u8; 32] {
    Sha256::digest(session_id.as_bytes()).into()
}

impl SignIn {
    /// Sign-ins at `config.issuer`, returning to `redirect`.
    pub fn new(config: OidcConfig, redirect: String, http: Http) -> Self {
        Self {
            config,
            redirect,
            http,
            endpoints: tokio::sync::Mutex::new(None),
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// The provider's endpoints, read once from its discovery document (again after a failure).
    ///
    /// # Errors
    /// A sentence when the document cannot be read or does not fit.
    pub async fn endpoints(&self) -> Result<Endpoints, String> {
        let mut held = self.endpoints.lock().await;
        if let Some(e) = &*held {
            return Ok(e.clone());
        }
        if !secure_or_loopback(&self.config.issuer) {
            return Err(format!(
                "the issuer {} is not https: the console trusts ID tokens for the connection they come over",
                self.config.issuer
            ));
        }
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.config.issuer.trim_end_matches('/')
        );
        let req = Request::get(&url)
            .header(header::ACCEPT, "application/json")
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("{url}: {e}"))?;
        let r = self.http.send(req, MAX_DOCUMENT, PROVIDER_TIMEOUT).await?;
        if r.status != 200 {
            return Err(format!("{url} answered HTTP {}", r.status));
        }
        let doc: Value = serde_json::from_slice(&r.body).map_err(|_| format!("{url} is not JSON"))?;
        let e = discovered(&doc, &self.config.issuer)?;
        *held = Some(e.clone());
        Ok(e)
    }

    /// Begins a sign-in: the value of the browser's sign-in cookie and the provider URL to
    /// send the browser to.
    ///
    /// # Errors
    /// A sentence when the provider cannot be read.
    pub async fn begin(&self) -> Result<(String, String), String> {
        let endpoints = self.endpoints().await?;
        let p = Pending::new().ok_or("the system gave no randomness")?;
        let url = authorization_url(
            &endpoints.authorization,
            &self.config,
            &self.redirect,
            &p.state,
            &challenge(&p.verifier),
            &p.nonce,
        );
        Ok((p.cookie(), url))
    }

    /// Completes a sign-in: `state` must be the one the browser's sign-in `cookie` holds;
    /// the code is exchanged with its verifier and the ID token checked against its nonce.
    /// Returns the new session's id.
    ///
    /// # Errors
    /// [`Failed`]: what did not hold, or that the provider could not be reached.
    pub async fn complete(&self, state: &str, cookie: Option<&str>, code: &str) -> Result<String, Failed> {
        let pending = began_here(state, cookie).map_err(Failed::Refused)?;
        let endpoints = self.endpoints().await.map_err(Failed::Unavailable)?;
        let answer = self.exchange(&endpoints, &pending, code).await?;
        self.open(&answer, &pending.nonce).map_err(Failed::Refused)
    }

    /// The token endpoint's answer for `code`, with the verifier of the sign-in.
    async fn exchange(&self, endpoints: &Endpoints, pending: &Pending, code: &str) -> Result<Value, Failed> {
        let form: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "authorization_code")
            .append_pair("code", code)
            .append_pair("redirect_uri", &self.redirect)
            .append_pair("client_id", &self.config.client_id)
            .append_pair("code_verifier", &pending.verifier)
            .finish();
        self.token_endpoint(&endpoints.token, form, "code").await
    }

    /// Posts `form` to the token endpoint `url`; its answer when it is 200, else why not
    /// (the provider refusing `what`, or not answering).
    async fn token_endpoint(&self, url: &str, form: String, what: &str) -> Result<Value, Failed> {
        let req = Request::builder()
            .method(Method::POST)
            .uri(url)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(form)))
            .map_err(|e| Failed::Refused(e.to_string()))?;
        let r = self
            .http
            .send(req, MAX_DOCUMENT, PROVIDER_TIMEOUT)
            .await
            .map_err(Failed::Unavailable)?;
        let answer: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        if r.status != 200 {
            let why = answer["error"].as_str().unwrap_or("an error");
            let why = format!(
                "the provider refused the {what} (HTTP {}: {})",
                r.status,
                super::short(why, 80)
            );
            return Err(if r.status >= 500 {
                Failed::Unavailable(why)
            } else {
                Failed::Refused(why)
            });
        }
        Ok(answer)
    }

    /// A new session for a token endpoint's `answer` to the sign-in of `nonce`.
    pub(super) fn open(&self, answer: &Value, nonce: &str) -> Result<String, String> {
        let session = session_of(answer, &self.config, nonce, now_secs())?;
        let id = random(32).ok_or("the system gave no randomness")?;
        let mut s = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        // Ended sessions go first (their tokens with them).
        let now = Instant::now();
        s.retain(|_, v| v.usable(now));
        if s.len() >= SESSIONS_MAX {
            return Err("too many people are signed in to this console: try again later".into());
        }
        // One user's sign-ins beyond their share end that user's oldest session, not others'.
        let theirs = s.values().filter(|v| v.username == session.username).count();
        if theirs >= SESSIONS_PER_USER {
            let oldest = s
                .iter()
                .filter(|(_, v)| v.username == session.username)
                .min_by_key(|(_, v)| v.expires)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                s.remove(&k);
            }
        }
        s.insert(key(&id), session);
        Ok(id)
    }

    /// The live session of `id`, its access token valid now.
    pub fn session(&self, id: &str) -> Option<Session> {
        let s = self.sessions.lock().ok()?;
        s.get(&key(id)).filter(|v| v.expires > Instant::now()).cloned()
    }

    /// The live session of `id`, its access token renewed with the refresh token first when
    /// it expires within [`REFRESH_BEFORE`] (one refresh at a time per session; the others
    /// go on with the current token). A refresh that fails is not tried again: the session
    /// ends with its access token, and the user signs in again.
    pub async fn live(&self, id: &str) -> Option<Session> {
        let k = key(id);
        let now = Instant::now();
        let token = {
            let mut s = self.sessions.lock().ok()?;
            let v = s.get_mut(&k)?;
            match &v.refresh {
                Some(t) if v.expires <= now + REFRESH_BEFORE && !v.refreshing && v.ends > now => {
                    v.refreshing = true;
                    t.clone()
                }
                _ => return (v.expires > now).then(|| v.clone()),
            }
        };
        let renewed = self.renew(&token).await;
        let mut s = self.sessions.lock().ok()?;
        // Signed out meanwhile: nothing to renew.
        let v = s.get_mut(&k)?;
        v.refreshing = false;
        match renewed {
            Ok(r) => {
                v.audiences = audiences(&r.access_token);
                v.access_token = r.access_token;
                v.expires = (Instant::now() + r.lifetime).min(v.ends);
                if r.refresh.is_some() {
                    v.refresh = r.refresh;
                }
            }
            Err(why) => {
                tracing::info!(user = %v.shown, %why, "console: the access token was not renewed; the session ends with it");
                v.refresh = None;
            }
        }
        (v.expires > Instant::now()).then(|| v.clone())
    }

    /// The token endpoint's new tokens for `refresh_token`.
    async fn renew(&self, refresh_token: &str) -> Result<Renewed, String> {
        let endpoints = self.endpoints().await?;
        let form: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "refresh_token")
            .append_pair("refresh_token", refresh_token)
            .append_pair("client_id", &self.config.client_id)
            .finish();
        let answer = self
            .token_endpoint(&endpoints.token, form, "refresh")
            .await
            .map_err(|e| e.to_string())?;
        Ok(Renewed {
            access_token: token(&answer["access_token"]).ok_or("the provider gave no access token")?,
            lifetime: lifetime(&answer),
            refresh: token(&answer["refresh_token"]),
        })
    }

    /// Ends the session of `id`.
    pub fn end(&self, id: &str) {
        if let Ok(mut s) = self.sessions.lock() {
            s.remove(&key(id));
        }
    }
}

/// The sign-in the browser's `cookie` carries, if `state` (the provider's answer) is its.
///
/// # Errors
/// A sentence for the user when the sign-in was begun elsewhere or has expired.
pub fn began_here(state: &str, cookie: Option<&str>) -> Result<Pending, String> {
    cookie
        .and_then(Pending::from_cookie)
        .filter(|p| p.state.len() == state.len() && super::constant_eq(p.state.as_bytes(), state.as_bytes()))
        .ok_or_else(|| "this sign-in was not begun in this browser, or took too long: start again".to_owned())
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The endpoints of a discovery document, which must name `issuer` exactly.
///
/// # Errors
/// A sentence when it names another issuer or lacks an endpoint.
pub fn discovered(doc: &Value, issuer: &str) -> Result<Endpoints, String> {
    if doc["issuer"].as_str() != Some(issuer) {
        return Err(format!("the discovery document of {issuer} names another issuer"));
    }
    let url = |k: &str| {
        doc[k]
            .as_str()
            .filter(|u| secure_or_loopback(u))
            .map(str::to_owned)
            .ok_or_else(|| format!("the discovery document of {issuer} has no {k}"))
    };
    Ok(Endpoints {
        authorization: url("authorization_endpoint")?,
        token: url("token_endpoint")?,
    })
}

/// Where the browser signs in.
pub fn authorization_url(
    endpoint: &str,
    c: &OidcConfig,
    redirect: &str,
    state: &str,
    challenge: &str,
    nonce: &str,
) -> String {
    let q = form_urlencoded::Serializer::new(String::new())
        .append_pair("response_type", "code")
        .append_pair("client_id", &c.client_id)
        .append_pair("redirect_uri", redirect)
        .append_pair("scope", &c.scopes)
        .append_pair("state", state)
        .append_pair("nonce", nonce)
        .append_pair("code_challenge", challenge)
        .append_pair("code_challenge_method", "S256")
        .finish();
    let sep = if endpoint.contains('?') { '&' } else { '?' };
    format!("{endpoint}{sep}{q}")
}

/// The claims of a JWT, unverified (the caller knows where it came from).
fn claims(jwt: &str) -> Option<Value> {
    let payload = jwt.split('.').nth(1)?;
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?).ok()
}

/// A claim by name, or by dotted path when no claim has the whole name.
fn claim<'a>(c: &'a Value, name: &str) -> Option<&'a Value> {
    c.get(name)
        .or_else(|| name.split('.').try_fold(c, |v, k| v.get(k)))
}

fn clean(s: &str) -> Option<String> {
    (!s.is_empty() && s.chars().count() <= MAX_CLAIM && !s.chars().any(char::is_control))
        .then(|| s.to_owned())
}

/// The session a token endpoint's answer opens, checked against what was asked for.
///
/// # Errors
/// A sentence when the ID token does not hold.
pub fn session_of(answer: &Value, c: &OidcConfig, nonce: &str, now: i64) -> Result<Session, String> {
    let access_token = token(&answer["access_token"]).ok_or("the provider gave no access token")?;
    let id = answer["id_token"]
        .as_str()
        .and_then(claims)
        .ok_or("the provider gave no ID token (is `openid` among the scopes?)")?;
    if id["iss"].as_str() != Some(&c.issuer) {
        return Err("the ID token names another issuer".into());
    }
    let aud_ok = match &id["aud"] {
        Value::String(a) => *a == c.client_id,
        Value::Array(a) => a.iter().any(|v| v.as_str() == Some(&c.client_id)),
        _ => false,
    };
    // Several audiences: the party it was issued to must be the console (Core 3.1.3.7).
    let several = id["aud"].as_array().is_some_and(|a| a.len() > 1);
    if !aud_ok || ((several || !id["azp"].is_null()) && id["azp"].as_str() != Some(&c.client_id)) {
        return Err("the ID token is not addressed to the console".into());
    }
    let exp = id["exp"].as_i64().ok_or("the ID token has no expiry")?;
    if exp <= now {
        return Err("the ID token has expired".into());
    }
    if id["nonce"].as_str() != Some(nonce) {
        return Err("the ID token is not the answer to this sign-in".into());
    }
    // As the API server does: an address names nobody until the provider has verified it.
    if c.username_claim == "email" && id["email_verified"].as_bool() != Some(true) {
        return Err("the ID token's email is not verified".into());
    }
    let shown = claim(&id, &c.username_claim)
        .and_then(Value::as_str)
        .and_then(clean)
        .ok_or_else(|| format!("the ID token has no usable `{}` claim", c.username_claim))?;
    let groups: Vec<String> = match claim(&id, &c.groups_claim) {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .filter_map(clean)
            .take(MAX_GROUPS)
            .collect(),
        Some(Value::String(g)) => clean(g).into_iter().collect(),
        _ => Vec::new(),
    };
    let now = Instant::now();
    Ok(Session {
        username: format!("{}{shown}", c.username_prefix),
        groups: groups.iter().map(|g| format!("{}{g}", c.groups_prefix)).collect(),
        shown,
        audiences: audiences(&access_token),
        access_token,
        expires: now + lifetime(answer),
        csrf: random(24).ok_or("the system gave no randomness")?,
        refresh: token(&answer["refresh_token"]),
        ends: now + SESSION_MAX_AGE,
        refreshing: false,
    })
}

/// A token of a token endpoint's answer: a non-empty string of at most [`MAX_TOKEN`] bytes.
fn token(v: &Value) -> Option<String> {
    v.as_str()
        .filter(|t| !t.is_empty() && t.len() <= MAX_TOKEN)
        .map(str::to_owned)
}

/// How long an access token of a token endpoint's answer lasts (`expires_in`; 5 minutes
/// when it does not say), at most [`SESSION_MAX_AGE`].
fn lifetime(answer: &Value) -> Duration {
    answer["expires_in"]
        .as_u64()
        .map_or(Duration::from_secs(300), Duration::from_secs)
        .min(SESSION_MAX_AGE)
}

/// The audiences an access token names, when it is a JWT (none known: an opaque token).
fn audiences(access_token: &str) -> Option<Vec<String>> {
    claims(access_token).map(|t| match &t["aud"] {
        Value::String(a) => vec![a.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_str)
            .take(64)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    })
}
