//! MCP Streamable HTTP at `/mcp`: POST answers with `application/json`, or with an SSE stream
//! when a tool call sends the client something before its result (progress, log messages,
//! sampling and elicitation requests); GET opens the server-to-client SSE stream
//! (`notifications/*/list_changed`, `notifications/resources/updated`); DELETE ends a session.
//!
//! Stateless by default: a session id is issued on `initialize` (clients need one to open
//! the GET stream) but no request depends on server-side session state, so any replica can
//! answer any request. A session id is the server's and bound to the caller it was issued to
//! ([`crate::session::mint`]): one this replica never saw is accepted from that caller, any
//! other (another caller's, or made up) is a 404 like an unknown session; a malformed one,
//! empty or not visible ASCII, is a 400. Request bodies are read against a size cap and a deadline; the
//! accept loop in [`super::listen`] bounds connections and header time.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::stream::{self, Stream, StreamExt};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use rustc_hash::FxHashMap;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::limits::Load;
use super::resume::{Buffer, Next, Resumable, ResumeOptions};
use super::sessions::EndedSessions;
use crate::config::access::Principal;
use crate::dispatch::{Ctx, Deferred, Era, Listen, Opens, Outcome, Reply, Server};
use crate::metrics::Refusal;
use crate::peer::Peer;
use crate::protocol::{self, INVALID_REQUEST};

/// Session id header.
pub const SESSION_HEADER: &str = "mcp-session-id";
/// Protocol version header.
pub const VERSION_HEADER: &str = "mcp-protocol-version";

/// Options of the HTTP transport.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Origins allowed besides loopback ones (`http://localhost[:port]`, `http://127.0.0.1[:port]`,
    /// `http://[::1][:port]`). `*` allows every origin.
    pub allowed_origins: Vec<String>,
    /// `Host` header values accepted (`host` or `host:port`, `*` for any) besides loopback
    /// names; `None` accepts every host. A browser page on an attacker's domain that resolves
    /// to 127.0.0.1 (DNS rebinding) sends its own domain as `Host`, which this refuses.
    pub allowed_hosts: Option<Vec<String>>,
    /// POST requests dispatched at once; excess requests get 503 immediately.
    pub max_concurrency: usize,
    /// Open GET (SSE) streams; excess streams get 503.
    pub max_streams: usize,
    /// Connections to the MCP port (the accept loop's cap; see [`super::listen`]).
    pub max_connections: usize,
    /// Time for a whole request body to arrive once the headers are in; then 408.
    pub body_read_timeout: Duration,
    /// Client authentication; `None` serves every caller that passes the Origin and Host checks.
    pub auth: Option<Arc<super::auth::Auth>>,
    /// Resumable answer streams (2025-11-25 polling with `Last-Event-ID`); `None`: off.
    pub resume: Option<ResumeOptions>,
    /// Proxies whose `X-Forwarded-For` names the client a caller without credentials is
    /// counted by; from any other peer the header is ignored.
    pub trusted_proxies: super::forwarded::TrustedProxies,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 << 20,
            allowed_origins: Vec::new(),
            allowed_hosts: None,
            max_concurrency: 4096,
            max_streams: 1024,
            max_connections: 10_000,
            body_read_timeout: Duration::from_secs(30),
            auth: None,
            resume: None,
            trusted_proxies: super::forwarded::TrustedProxies::default(),
        }
    }
}

/// Shared state of the HTTP transport.
#[derive(Debug)]
pub struct HttpState {
    server: Arc<Server>,
    options: HttpOptions,
    load: Arc<Load>,
    streams: Mutex<FxHashMap<String, Vec<(u64, CancellationToken)>>>,
    next_stream: AtomicU64,
    ended: EndedSessions,
    shutdown: CancellationToken,
    resume: Option<Resumable>,
}

impl HttpState {
    /// State for `app`. Cancelling `shutdown` ends every GET stream.
    pub fn new(server: Arc<Server>, options: HttpOptions, shutdown: CancellationToken) -> Arc<Self> {
        let load = Load::new(
            options.max_connections,
            options.max_concurrency,
            options.max_streams,
        );
        let resume = options.resume.map(Resumable::new);
        Arc::new(Self {
            server,
            options,
            load,
            streams: Mutex::new(FxHashMap::default()),
            next_stream: AtomicU64::new(0),
            ended: EndedSessions::default(),
            shutdown,
            resume,
        })
    }

    /// The capacity of this transport (for the accept loop and `/readyz`).
    pub fn load(&self) -> Arc<Load> {
        self.load.clone()
    }
}

/// The `/mcp` router.
pub fn app(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/mcp", post(post_mcp).get(get_mcp).delete(delete_mcp))
        .route("/.well-known/oauth-protected-resource", get(protected_resource))
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            get(protected_resource),
        )
        .layer(axum::middleware::map_response_with_state(
            state.clone(),
            close_when_draining,
        ))
        .with_state(state)
}

/// While the server drains (after SIGTERM, during `--shutdown-delay`), every response tells
/// the client to close its connection: each keep-alive connection moves to a new one, which
/// the Service sends to a pod that is not stopping, before this pod closes its idle
/// connections (a request racing such a close is the one a client could lose).
async fn close_when_draining(State(state): State<Arc<HttpState>>, mut resp: Response) -> Response {
    if state.load.draining() {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// A request refused before dispatch: an HTTP status and a JSON-RPC error body.
#[derive(Clone)]
struct Reject(StatusCode, String);

impl IntoResponse for Reject {
    fn into_response(self) -> Response {
        http_error(self.0, &self.1)
    }
}

impl Reject {
    /// The refusal naming the request's id when the body shows it.
    fn for_body(self, body: &[u8]) -> Response {
        http_error_for(protocol::peek_id(body), self.0, &self.1)
    }
}

fn http_error(status: StatusCode, message: &str) -> Response {
    http_error_for(None, status, message)
}

fn http_error_for(id: Option<&serde_json::value::RawValue>, status: StatusCode, message: &str) -> Response {
    json_response(status, protocol::error_response(id, INVALID_REQUEST, message))
}

/// An error after which the connection is closed (the rest of the body is not read).
fn http_error_close(status: StatusCode, message: &str) -> Response {
    let mut resp = http_error(status, message);
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// The `Mcp-Session-Id` header: absent is `""`; present, it must be 1 to 128 visible ASCII
/// characters.
fn session_id(headers: &HeaderMap) -> Result<&str, Reject> {
    let Some(v) = headers.get(SESSION_HEADER) else {
        return Ok("");
    };
    if !protocol::valid_session_id(v.as_bytes()) {
        return Err(Reject(
            StatusCode::BAD_REQUEST,
            format!(
                "Invalid Mcp-Session-Id: it must be 1 to {} visible ASCII characters",
                protocol::MAX_SESSION_ID_LEN
            ),
        ));
    }
    // Visible ASCII is valid UTF-8.
    Ok(v.to_str().unwrap_or(""))
}

enum BodyError {
    TooLarge,
    Timeout,
    Broken,
}

/// Reads the whole body within `deadline`, refusing more than `max` bytes.
async fn read_body(body: Body, max: usize, deadline: Duration) -> Result<Bytes, BodyError> {
    match tokio::time::timeout(deadline, Limited::new(body, max).collect()).await {
        Err(_) => Err(BodyError::Timeout),
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(BodyError::TooLarge),
        Ok(Err(_)) => Err(BodyError::Broken),
    }
}

fn is_loopback_origin(origin: &str) -> bool {
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .unwrap_or("");
    let host = if rest.starts_with('[') {
        rest.split(']')
            .next()
            .map(|h| format!("{h}]"))
            .unwrap_or_default()
    } else {
        rest.split(':').next().unwrap_or("").to_owned()
    };
    matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]")
}

fn check_origin(state: &HttpState, headers: &HeaderMap) -> Result<(), Reject> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    let allowed = is_loopback_origin(origin)
        || state
            .options
            .allowed_origins
            .iter()
            .any(|a| a == "*" || a == origin);
    if allowed {
        Ok(())
    } else {
        Err(Reject(
            StatusCode::FORBIDDEN,
            format!("Origin {origin} is not allowed"),
        ))
    }
}

/// The host part of a `Host` value (`[::1]` keeps its brackets), without the port.
/// The name part of a Host value, `uri-host [":" port]` (RFC 9110 section 7.2), or `None`
/// when the value is not one: userinfo (`localhost:1@evil.example`), a path, a space, a
/// port that is not digits. A reg-name keeps its case; callers compare without case.
fn host_name(host: &str) -> Option<&str> {
    let (name, port) = if let Some(inside) = host.strip_prefix('[') {
        let end = inside.find(']')?;
        let literal = &inside[..end];
        if literal.is_empty()
            || !literal
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return None;
        }
        host.split_at(end + 2)
    } else {
        host.split_at(host.find(':').unwrap_or(host.len()))
    };
    let port_ok = port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    let name_ok = name.starts_with('[')
        || (!name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=".contains(&b)));
    (port_ok && name_ok).then_some(name)
}

fn check_host(state: &HttpState, headers: &HeaderMap) -> Result<(), Reject> {
    let Some(allowed) = &state.options.allowed_hosts else {
        return Ok(());
    };
    // Over HTTP/2 the listener copies `:authority` into Host when the header is absent, so
    // one check covers both versions. hyper serves an HTTP/1.x request without Host; with an
    // allow-list in force such a request names no host that could be allowed.
    let Some(host) = headers.get(header::HOST) else {
        return Err(Reject(
            StatusCode::BAD_REQUEST,
            "a Host header is required (this listener checks it, see --allowed-host)".into(),
        ));
    };
    let host = host.to_str().unwrap_or("");
    let Some(name) = host_name(host) else {
        return Err(Reject(
            StatusCode::BAD_REQUEST,
            format!(
                "malformed Host header {:?}: expected host[:port]",
                host.chars().take(64).collect::<String>()
            ),
        ));
    };
    // Compared without case, in place (no lowercase copy per request).
    let ok = ["localhost", "127.0.0.1", "[::1]"]
        .iter()
        .any(|l| name.eq_ignore_ascii_case(l))
        || allowed
            .iter()
            .any(|a| a == "*" || a.eq_ignore_ascii_case(host) || a.eq_ignore_ascii_case(name));
    if ok {
        Ok(())
    } else {
        Err(Reject(
            StatusCode::FORBIDDEN,
            format!("Host {host} is not allowed (see --allowed-host)"),
        ))
    }
}

/// A request whose Origin and Host this listener allows (a page on another site, a
/// rebinding DNS name: refused before anything else is read).
struct Allowed;

impl FromRequestParts<Arc<HttpState>> for Allowed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<HttpState>) -> Result<Self, Response> {
        check_origin(state, &parts.headers)
            .and_then(|()| check_host(state, &parts.headers))
            .map(|()| Allowed)
            .map_err(IntoResponse::into_response)
    }
}

/// The caller of an `/mcp` request, checked before anything else is read: its Origin and
/// Host are allowed ([`Allowed`]) and its credentials accepted. Carries who it is and what
/// its credentials grant, and the protocol revision its `MCP-Protocol-Version` names (each
/// route answers a version it does not speak in its own way and order).
pub(crate) struct Caller {
    /// What the caller's credentials grant; `None` when the server does not authenticate
    /// clients.
    principal: Option<Arc<Principal>>,
    /// The revision the request names, and whether it is the stateless one (2026-07-28).
    version: Result<(&'static str, bool), Reject>,
    /// The address a caller without credentials is counted by (`None` for one with
    /// credentials, whose subject counts, and without a socket).
    client: Option<crate::limits::ClientAddr>,
}

impl Caller {
    fn principal(&self) -> Option<&Principal> {
        self.principal.as_deref()
    }
}

impl FromRequestParts<Arc<HttpState>> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<HttpState>) -> Result<Self, Response> {
        Allowed::from_request_parts(parts, state).await?;
        let headers = &parts.headers;
        let principal = match &state.options.auth {
            None => None,
            Some(auth) => match crate::otel::spans::auth(headers, auth.check(headers)).await {
                Ok(p) => Some(p),
                Err(denied) => {
                    state.server.metrics.refused(Refusal::Unauthenticated);
                    state.server.audit_unauthenticated(denied.message());
                    let mut resp = http_error(StatusCode::UNAUTHORIZED, denied.message());
                    let metadata = auth.metadata_url(state.options.allowed_hosts.as_deref());
                    resp.headers_mut()
                        .insert(header::WWW_AUTHENTICATE, denied.challenge(metadata.as_deref()));
                    return Err(resp);
                }
            },
        };
        // Only a caller without credentials is counted by its address.
        let client = match principal {
            Some(_) => None,
            None => super::listen::peer().map(|peer| {
                crate::limits::ClientAddr::of(state.options.trusted_proxies.client(peer, headers))
            }),
        };
        Ok(Self {
            principal,
            version: version(headers),
            client,
        })
    }
}

/// `/.well-known/oauth-protected-resource[/mcp]`: where clients learn which authorization
/// server issues tokens for this endpoint (RFC 9728). 404 unless an issuer is configured.
/// The Origin and Host checks of `/mcp` apply (it is the first thing a client reads), and the
/// document names the resource from configuration, never from the request's Host.
async fn protected_resource(State(state): State<Arc<HttpState>>, _: Allowed) -> Response {
    let snap = state.server.registry.load();
    let scopes: Vec<&str> = snap.scopes.iter().map(AsRef::as_ref).collect();
    match state
        .options
        .auth
        .as_ref()
        .and_then(|a| a.metadata(state.options.allowed_hosts.as_deref(), &scopes))
    {
        Some(doc) => {
            let mut resp = axum::Json(doc).into_response();
            // Browser-based clients read it from another origin.
            resp.headers_mut()
                .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
            resp
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// 404 for a session that is not the caller's (another caller's, or an id no server issued)
/// and for one this server ended (DELETE): to a caller, both are unknown sessions.
fn check_session(state: &HttpState, session: &str, caller: Option<&Principal>) -> Result<(), Reject> {
    if session.is_empty() {
        return Ok(());
    }
    if !crate::session::owned_by(session, caller.map_or("", |c| &c.subject)) {
        return Err(Reject(
            StatusCode::NOT_FOUND,
            "Session not found; initialize a new one".to_owned(),
        ));
    }
    if state.ended.ended(session) {
        Err(Reject(
            StatusCode::NOT_FOUND,
            "Session not found: it was ended; initialize a new one".to_owned(),
        ))
    } else {
        Ok(())
    }
}

fn accepts(headers: &HeaderMap, wanted: &str) -> bool {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let family = wanted.split('/').next().unwrap_or("");
    accept
        .split(',')
        .map(|part| part.split(';').next().unwrap_or("").trim())
        .any(|t| t == wanted || t == "*/*" || t.strip_suffix("/*") == Some(family))
}

/// The revision a request names in `MCP-Protocol-Version`, and whether it is the stateless
/// one (2026-07-28). Absent: 2025-03-26 (clients before 2025-06-18 did not send it).
fn version(headers: &HeaderMap) -> Result<(&'static str, bool), Reject> {
    let Some(v) = headers.get(VERSION_HEADER) else {
        return Ok((protocol::DEFAULT_HTTP_VERSION, false));
    };
    let text = v.to_str().unwrap_or("");
    if let Some(m) = protocol::modern(text) {
        return Ok((m, true));
    }
    protocol::supported(text).map(|l| (l, false)).ok_or_else(|| {
        Reject(
            StatusCode::BAD_REQUEST,
            format!(
                "Unsupported MCP-Protocol-Version {v:?}; supported: {}",
                protocol::ALL_VERSIONS.join(", ")
            ),
        )
    })
}

/// The `UnsupportedProtocolVersionError` (-32022, with the supported list) for a request
/// whose `MCP-Protocol-Version` this server does not speak.
fn unsupported_version(headers: &HeaderMap, body: &[u8]) -> Response {
    let requested = headers
        .get(VERSION_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let mut out = Vec::with_capacity(192);
    crate::modern::unsupported(&requested).write(&mut out, protocol::peek_id(body));
    json_response(StatusCode::BAD_REQUEST, out)
}

/// The body fields 2026-07-28 mirrors into headers.
#[derive(serde::Deserialize)]
struct Mirrored<'a> {
    #[serde(borrow, default)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<MirroredParams<'a>>,
}

#[derive(serde::Deserialize)]
struct MirroredParams<'a> {
    #[serde(borrow, default)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    uri: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, rename = "taskId")]
    task_id: Option<std::borrow::Cow<'a, str>>,
    /// Read only when the tool declares `x-mcp-header` parameters.
    #[serde(borrow, default)]
    arguments: Option<&'a serde_json::value::RawValue>,
}

/// A header value in the 2026-07-28 encoding: plain visible ASCII, or `=?base64?...?=` for
/// anything else. `None` when it is neither.
fn header_text(v: &HeaderValue) -> Option<String> {
    let s = v.to_str().ok()?;
    if let Some(b64) = s.strip_prefix("=?base64?").and_then(|r| r.strip_suffix("?=")) {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        return String::from_utf8(bytes).ok();
    }
    s.bytes()
        .all(|b| b == b'\t' || (0x20..=0x7e).contains(&b))
        .then(|| s.to_owned())
}

/// 2026-07-28 request headers: `Mcp-Method` must repeat the body's method, and `Mcp-Name`
/// the tool or prompt name or resource URI of `tools/call`, `prompts/get`, `resources/read`
/// (and, when sent, the `taskId` of `tasks/get`, `tasks/cancel`, `tasks/update`).
/// A missing, malformed or different header is `-32020 HeaderMismatch` (HTTP 400), so that
/// a proxy routing by header and this server reading the body cannot disagree.
fn check_mirrored(state: &HttpState, headers: &HeaderMap, body: &[u8]) -> Result<(), Box<Response>> {
    let Ok(m) = serde_json::from_slice::<Mirrored<'_>>(body) else {
        // Not a readable request: dispatch answers it.
        return Ok(());
    };
    let Some(method) = m.method else {
        return Ok(());
    };
    let mismatch = |message: String| {
        let mut out = Vec::with_capacity(160);
        protocol::write_error(
            &mut out,
            protocol::peek_id(body),
            protocol::HEADER_MISMATCH,
            &message,
            None,
        );
        Box::new(json_response(StatusCode::BAD_REQUEST, out))
    };
    match headers.get("mcp-method").map(header_text) {
        None => {
            return Err(mismatch(
                "Header mismatch: the Mcp-Method header is required".to_owned(),
            ));
        }
        Some(None) => {
            return Err(mismatch(
                "Header mismatch: Mcp-Method is not a valid header value".to_owned(),
            ));
        }
        Some(Some(h)) if h != method => {
            return Err(mismatch(format!(
                "Header mismatch: Mcp-Method is {:?} but the body's method is {:?}",
                clip(&h),
                clip(&method)
            )));
        }
        Some(Some(_)) => {}
    }
    let named = match &*method {
        "tools/call" | "prompts/get" => m.params.as_ref().and_then(|p| p.name.as_deref()),
        "resources/read" => m.params.as_ref().and_then(|p| p.uri.as_deref()),
        // A task's id: checked when the client sends the header (not every client does yet).
        "tasks/get" | "tasks/cancel" | "tasks/update" if headers.contains_key("mcp-name") => {
            m.params.as_ref().and_then(|p| p.task_id.as_deref())
        }
        _ => return Ok(()),
    };
    let Some(named) = named else {
        // Missing in the body: dispatch reports the invalid params.
        return Ok(());
    };
    match headers.get("mcp-name").map(header_text) {
        None => Err(mismatch(
            "Header mismatch: the Mcp-Name header is required".to_owned(),
        )),
        Some(None) => Err(mismatch(
            "Header mismatch: Mcp-Name is not a valid header value".to_owned(),
        )),
        Some(Some(h)) if h != named => Err(mismatch(format!(
            "Header mismatch: Mcp-Name is {:?} but the body names {:?}",
            clip(&h),
            clip(named)
        ))),
        Some(Some(_)) if method == "tools/call" => {
            let args = m.params.as_ref().and_then(|p| p.arguments);
            check_param_headers(state, headers, named, args).map_err(mismatch)
        }
        Some(Some(_)) => Ok(()),
    }
}

/// Whether `text` is `n` written in decimal, without formatting it into a new string.
fn fmt_eq(text: &str, n: impl std::fmt::Display) -> bool {
    use std::fmt::Write;
    struct Cmp<'a>(&'a str, bool);
    impl Write for Cmp<'_> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            match self.0.strip_prefix(s) {
                Some(rest) => self.0 = rest,
                None => self.1 = false,
            }
            Ok(())
        }
    }
    let mut c = Cmp(text, true);
    let _ = write!(c, "{n}");
    c.1 && c.0.is_empty()
}

/// The `Mcp-Param-*` headers of a `tools/call` (2026-07-28): each argument the tool declares
/// with `x-mcp-header` must be mirrored, decoded, equal to the body's value, and a header
/// needs its argument. Tools without such parameters cost one lookup.
fn check_param_headers(
    state: &HttpState,
    headers: &HeaderMap,
    tool: &str,
    args: Option<&serde_json::value::RawValue>,
) -> Result<(), String> {
    let snap = state.server.registry.load();
    let Some(t) = snap.tool_index(tool).map(|i| &snap.tools[i]) else {
        // Unknown tool: dispatch answers it.
        return Ok(());
    };
    let declared = t.def.input.param_headers();
    if declared.is_empty() {
        return Ok(());
    }
    // Not an object: the arguments' validation reports it.
    let args: serde_json::Map<String, serde_json::Value> = args
        .and_then(|a| serde_json::from_str(a.get()).ok())
        .unwrap_or_default();
    for (param, name) in declared {
        let display = &name["mcp-param-".len()..];
        let body = args.get(&**param).filter(|v| !v.is_null());
        let mut values = headers.get_all(&**name).iter();
        let (header, extra) = (values.next(), values.next());
        if extra.is_some() {
            return Err(format!(
                "Header mismatch: Mcp-Param-{display} is sent more than once"
            ));
        }
        match (body, header) {
            (None, None) => {}
            (Some(_), None) => {
                return Err(format!(
                    "Header mismatch: the Mcp-Param-{display} header is required (the arguments carry `{param}`)"
                ));
            }
            (None, Some(_)) => {
                return Err(format!(
                    "Header mismatch: Mcp-Param-{display} is sent but the arguments carry no `{param}`"
                ));
            }
            (Some(v), Some(h)) => {
                let Some(text) = param_header_text(h) else {
                    return Err(format!(
                        "Header mismatch: Mcp-Param-{display} is not a valid header value \
                         (visible ASCII, or =?base64?...?= with canonical Base64 of UTF-8)"
                    ));
                };
                if !header_matches(&text, v) {
                    return Err(format!(
                        "Header mismatch: Mcp-Param-{display} does not match the argument `{param}`"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// An `Mcp-Param-*` value: `=?base64?...?=` decoded (canonical, padded Base64 of UTF-8),
/// anything else literal visible ASCII with surrounding blanks removed.
fn param_header_text(v: &HeaderValue) -> Option<std::borrow::Cow<'_, str>> {
    let s = v.to_str().ok()?;
    if let Some(b64) = s.strip_prefix("=?base64?").and_then(|r| r.strip_suffix("?=")) {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        return String::from_utf8(bytes).ok().map(Into::into);
    }
    let s = s.trim_matches([' ', '\t']);
    s.bytes().all(|b| (0x20..=0x7e).contains(&b)).then_some(s.into())
}

/// Whether a header's text is the argument's value: a string itself, an integer or a
/// boolean as JSON writes it.
fn header_matches(text: &str, v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::String(s) => s == text,
        Value::Bool(b) => text == if *b { "true" } else { "false" },
        // Compared as text: `03` or `+3` is not how the argument 3 is written.
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => fmt_eq(text, i),
            (_, Some(u)) => fmt_eq(text, u),
            _ => false,
        },
        _ => false,
    }
}

fn clip(s: &str) -> &str {
    let end = s.char_indices().nth(64).map_or(s.len(), |(i, _)| i);
    &s[..end]
}

/// The headers a POST must carry: JSON in, JSON accepted.
fn post_content(headers: &HeaderMap) -> Result<(), Reject> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
        });
    if !is_json {
        return Err(Reject(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json".to_owned(),
        ));
    }
    if !accepts(headers, "application/json") {
        return Err(Reject(
            StatusCode::NOT_ACCEPTABLE,
            "Accept must allow application/json".to_owned(),
        ));
    }
    Ok(())
}

async fn post_mcp(State(state): State<Arc<HttpState>>, caller: Caller, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let headers = &parts.headers;
    let body = match post_body(&state, headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (version, modern, session) = match post_target(&state, &caller, headers, &body) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    let pass = state.load.inflight.try_enter();
    // When every slot is taken, notifications and answers to server requests still get in:
    // they need no slot of their own, and they free others (a cancel, the answer a waiting
    // sampling call needs).
    if pass.is_none() && !protocol::is_answer_or_notification(&body) {
        state.server.metrics.refused(Refusal::Inflight);
        return Reject(
            StatusCode::SERVICE_UNAVAILABLE,
            "server overloaded, retry later".to_owned(),
        )
        .for_body(&body);
    }
    let ctx = Ctx {
        session,
        version,
        stream: true,
        era: if modern { Era::Modern(version) } else { Era::Legacy },
        caller: caller.principal(),
        opens: Opens::Minted,
        client: caller.client,
    };
    let handled = state.server.handle(&body, ctx, version == "2025-03-26");
    match crate::otel::spans::under_headers(headers, handled).await {
        Outcome::Listen(listen) => {
            drop(pass);
            listen_stream(&state, listen)
        }
        Outcome::Deferred(d) => {
            // The call holds its place in the in-flight gate until it ends, also when that is
            // after this handler returned (a streamed answer).
            // (Only requests are deferred, and requests always hold a pass; should that ever not
            // hold, the call runs without one rather than the process aborting.)
            let held = pass.map(|p| {
                std::mem::forget(p);
                HeldPass(state.load.clone())
            });
            // Answers in a session of the handshake era can be resumed (when enabled).
            let resume = state
                .resume
                .as_ref()
                .filter(|_| !modern && !session.is_empty())
                .map(|r| (r, session));
            answer_call(d, held, resume).await
        }
        Outcome::Accepted => StatusCode::ACCEPTED.into_response(),
        Outcome::Reply(r) => reply_response(&state, r),
    }
}

/// A POST's body, read whole against the size cap and the body deadline. No in-flight place
/// is held while it arrives: a slow body costs a connection slot for at most the body
/// timeout, never dispatch capacity. It is read before the header checks so that their
/// errors can name the request's id.
async fn post_body(state: &HttpState, headers: &HeaderMap, body: Body) -> Result<Bytes, Response> {
    let max = state.options.max_body_bytes;
    let too_large = || {
        state.server.metrics.refused(Refusal::BodyBytes);
        http_error_close(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body exceeds {max} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    match read_body(body, max, state.options.body_read_timeout).await {
        Ok(b) => Ok(b),
        Err(BodyError::TooLarge) => Err(too_large()),
        Err(BodyError::Timeout) => {
            state.server.metrics.refused(Refusal::BodyTimeout);
            Err(http_error_close(
                StatusCode::REQUEST_TIMEOUT,
                &format!(
                    "the request body did not arrive within {} s",
                    state.options.body_read_timeout.as_secs_f64()
                ),
            ))
        }
        Err(BodyError::Broken) => Err(http_error_close(
            StatusCode::BAD_REQUEST,
            "the request body could not be read",
        )),
    }
}

/// What a POST is addressed to: its content headers checked, the revision it speaks
/// (whether stateless) and its session, which must be the caller's (2026-07-28 has none:
/// its `Mcp-Session-Id` is ignored, and its mirrored headers must match the body).
fn post_target<'h>(
    state: &HttpState,
    caller: &Caller,
    headers: &'h HeaderMap,
    body: &[u8],
) -> Result<(&'static str, bool, &'h str), Box<Response>> {
    post_content(headers).map_err(|r| Box::new(r.for_body(body)))?;
    let Ok((version, modern)) = caller.version else {
        return Err(Box::new(unsupported_version(headers, body)));
    };
    let session = session_id(headers).map_err(|r| Box::new(r.for_body(body)))?;
    if modern {
        check_mirrored(state, headers, body)?;
        return Ok((version, modern, ""));
    }
    check_session(state, session, caller.principal()).map_err(|r| Box::new(r.for_body(body)))?;
    Ok((version, modern, session))
}

/// An answer as an HTTP response: its status, the scope challenge of a refused call, the id
/// of the session it opened.
fn reply_response(state: &HttpState, r: Reply) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::OK);
    let mut resp = json_response(status, r.body);
    if let Some(scopes) = r.challenge.filter(|s| !s.is_empty())
        && let Some(auth) = &state.options.auth
    {
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            auth.scope_challenge(state.options.allowed_hosts.as_deref(), &scopes),
        );
    }
    if let Some(secs) = r.retry_after {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if let Some(id) = r.session
        && let Ok(v) = HeaderValue::from_str(&id)
    {
        resp.headers_mut().insert(SESSION_HEADER, v);
    }
    resp
}

/// An `application/json` answer.
fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        body,
    )
        .into_response()
}

/// A place in the in-flight gate held by a call that may outlive its handler.
struct HeldPass(Arc<Load>);

impl Drop for HeldPass {
    fn drop(&mut self) {
        self.0.inflight.release();
    }
}

/// Runs a slow tool call. Its answer is `application/json` unless the call sends the client
/// something first; then it is an SSE stream of those messages ending with the response.
/// Dropping the stream (the client went away) drops the call. A call the client cancelled
/// gets no response: its stream just ends. With `resume` (a session, resumable streams on),
/// a call still running after the poll interval is answered too, by a stream of
/// [`super::resume`] that the server ends and the client resumes.
async fn answer_call(d: Deferred, held: Option<HeldPass>, resume: Option<(&Resumable, &str)>) -> Response {
    let started = std::time::Instant::now();
    let (peer, mut rx) = Peer::channel();
    let mut call = Box::pin(async move {
        let _held = held;
        d.run(Some(&peer)).await.map(|r| (r.body, r.status))
    });
    let poll = resume.map(|(r, _)| r.options().poll_after);
    let first = tokio::select! {
        biased;
        Some(m) = rx.recv() => Some(m),
        out = &mut call => match rx.try_recv() {
            Ok(m) => return sse_answer(stream::iter(std::iter::once(m)).chain(drain(rx, out.map(|(b, _)| b)))),
            Err(_) => {
                return match out {
                    Some((body, status)) => json_response(StatusCode::from_u16(status).unwrap_or(StatusCode::OK), body),
                    None => sse_answer(stream::empty()),
                };
            }
        },
        () = sleep_or_never(poll) => None,
    };
    if let Some((r, session)) = resume
        && let Some(buf) = r.open(session)
    {
        // The interval counts from the request: a call past it ends its stream at once.
        return resumable_answer(r, buf, first, call, rx, started + r.options().poll_after);
    }
    // No place for a resumable stream: the answer streams as without them.
    let first = match first {
        Some(m) => m,
        None => tokio::select! {
            biased;
            Some(m) = rx.recv() => m,
            out = &mut call => return sse_answer(drain(rx, out.map(|(b, _)| b))),
        },
    };
    let rest = stream::unfold(Some((call, rx)), |st| async move {
        let (mut call, mut rx) = st?;
        tokio::select! {
            biased;
            Some(m) = rx.recv() => Some((stream::iter(vec![m]).left_stream(), Some((call, rx)))),
            out = &mut call => Some((drain(rx, out.map(|(b, _)| b)).right_stream(), None)),
        }
    })
    .flatten();
    sse_answer(stream::iter(std::iter::once(first)).chain(rest))
}

async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// A resumable answer: the call runs on in a task that records what it sends in `buf`,
/// and the response reads `buf` from its start.
fn resumable_answer<F>(
    r: &Resumable,
    buf: Arc<Buffer>,
    first: Option<Vec<u8>>,
    mut call: std::pin::Pin<Box<F>>,
    mut rx: mpsc::Receiver<Vec<u8>>,
    deadline: std::time::Instant,
) -> Response
where
    F: std::future::Future<Output = Option<(Vec<u8>, u16)>> + Send + 'static,
{
    let options = *r.options();
    if let Some(m) = first {
        buf.push(m.into(), &options);
    }
    let recorder = buf.clone();
    tokio::spawn(async move {
        let b = recorder;
        loop {
            tokio::select! {
                biased;
                () = b.cancel.cancelled() => break,
                Some(m) = rx.recv() => b.push(m.into(), &options),
                out = &mut call => {
                    while let Ok(m) = rx.try_recv() {
                        b.push(m.into(), &options);
                    }
                    if let Some((body, _)) = out {
                        b.push(body.into(), &options);
                    }
                    break;
                }
            }
        }
        b.finish();
    });
    buffered_stream(buf, 0, options.retry, deadline, true, ())
}

/// An SSE response reading `buf` after event `after`, each event with its id, until the
/// stream ends or the poll interval has passed (then the client resumes from the last id).
/// `prime` opens it with the priming event (an id, the retry hint, empty data). A client that
/// closes it before either cancels the call. `hold` lives as long as the response.
fn buffered_stream(
    buf: Arc<Buffer>,
    after: u64,
    retry: Duration,
    deadline: std::time::Instant,
    prime: bool,
    hold: impl Send + 'static,
) -> Response {
    const KEEP_ALIVE: Duration = Duration::from_secs(15);
    buf.attach();
    let priming = prime.then(|| {
        Ok::<_, Infallible>(Bytes::from(format!(
            "id: {}\nretry: {}\ndata: \n\n",
            buf.event_id(0),
            retry.as_millis()
        )))
    });
    let reader = Reader {
        buf,
        seq: after,
        ended: false,
    };
    let events = stream::unfold((reader, hold), move |(mut r, hold)| async move {
        loop {
            match r.buf.next_after(r.seq) {
                Next::Event(seq, m) => {
                    r.seq = seq;
                    let e = sse_event(&r.buf.event_id(seq), &m);
                    return Some((Ok(e), (r, hold)));
                }
                Next::Wait => {
                    let now = std::time::Instant::now();
                    if now >= deadline {
                        // The interval passed: the server ends the stream, the client resumes.
                        r.close();
                        return None;
                    }
                    if !r.buf.changed(r.seq, deadline.min(now + KEEP_ALIVE)).await
                        && std::time::Instant::now() < deadline
                    {
                        return Some((Ok(Bytes::from_static(b": keep-alive\n\n")), (r, hold)));
                    }
                }
                // Ended, or the events sought were dropped (a resume then learns they are gone).
                Next::Done | Next::Dropped => {
                    r.close();
                    return None;
                }
            }
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(Body::from_stream(stream::iter(priming).chain(events)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// One SSE `message` event with its id (a line break in the message, which serialized JSON
/// never has, would continue the data on a new `data:` line).
fn sse_event(id: &str, m: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(m.len() + id.len() + 32);
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"\nevent: message\ndata: ");
    for (i, line) in m.split(|b| matches!(b, b'\n' | b'\r')).enumerate() {
        if i > 0 {
            out.extend_from_slice(b"\ndata: ");
        }
        out.extend_from_slice(line);
    }
    out.extend_from_slice(b"\n\n");
    out.into()
}

/// Reads a buffer; when its client goes away before the stream ends (not when the server
/// ends it), the call is cancelled.
struct Reader {
    buf: Arc<Buffer>,
    seq: u64,
    ended: bool,
}

impl Reader {
    /// The server ends the stream (its interval passed, or nothing more will come).
    fn close(&mut self) {
        self.ended = true;
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        if self.buf.detach() && !self.ended {
            self.buf.cancel.cancel();
        }
    }
}

/// What is still queued, then the response (if any).
fn drain(mut rx: mpsc::Receiver<Vec<u8>>, out: Option<Vec<u8>>) -> impl Stream<Item = Vec<u8>> {
    let mut queued = Vec::new();
    while let Ok(m) = rx.try_recv() {
        queued.push(m);
    }
    stream::iter(queued.into_iter().chain(out))
}

fn sse_answer(messages: impl Stream<Item = Vec<u8>> + Send + 'static) -> Response {
    let events = messages.map(|m| {
        Ok::<_, Infallible>(
            Event::default()
                .event("message")
                .data(String::from_utf8_lossy(&m)),
        )
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// 405 for the handshake era's GET stream and DELETE under 2026-07-28.
fn not_in_modern(method: &str) -> Response {
    let mut resp = http_error(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("{method} /mcp is not part of protocol 2026-07-28 (use subscriptions/listen)"),
    );
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    resp
}

/// A `subscriptions/listen` answer: an SSE stream that opens with the acknowledgement and
/// carries the notifications the listen asked for, until the client closes it or the server
/// shuts down (then the listen's response ends it). Counts against the stream cap.
fn listen_stream(state: &Arc<HttpState>, listen: Listen) -> Response {
    if !state.load.streams.try_enter_detached() {
        state.server.metrics.refused(Refusal::Streams);
        return http_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many open streams on this server, retry later",
        );
    }
    state.server.metrics.streams.inc();
    let rx = state.server.subscribe();
    let ack = listen.acknowledgement();
    let token = state.shutdown.child_token();
    let guard = ListenGuard(state.clone());
    let rest = stream::unfold(Some((rx, listen, token, guard)), |st| async move {
        let (mut rx, listen, token, guard) = st?;
        loop {
            tokio::select! {
                () = token.cancelled() => {
                    let last = listen.closing();
                    return Some((last, None));
                }
                msg = rx.recv() => match msg {
                    Ok(e) => {
                        if let Some(m) = listen.wants(&e) {
                            return Some((m, Some((rx, listen, token, guard))));
                        }
                    }
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return None,
                },
            }
        }
    });
    let mut resp = sse_answer(stream::iter(std::iter::once(ack)).chain(rest));
    resp.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// Releases a listen stream's place when it ends.
struct ListenGuard(Arc<HttpState>);

impl Drop for ListenGuard {
    fn drop(&mut self) {
        self.0.server.metrics.streams.dec();
        self.0.load.streams.release();
    }
}

async fn get_mcp(State(state): State<Arc<HttpState>>, caller: Caller, headers: HeaderMap) -> Response {
    if !headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"))
    {
        return http_error(
            StatusCode::NOT_ACCEPTABLE,
            "GET /mcp opens an SSE stream: Accept must include text/event-stream",
        );
    }
    match &caller.version {
        Err(r) => return r.clone().into_response(),
        Ok((_, true)) => return not_in_modern("GET"),
        Ok(_) => {}
    }
    let session =
        match session_id(&headers).and_then(|s| check_session(&state, s, caller.principal()).map(|()| s)) {
            Ok(s) => s.to_owned(),
            Err(r) => return r.into_response(),
        };
    if let (Some(r), Some(last)) = (&state.resume, headers.get("last-event-id")) {
        return resume_stream(&state, r, last.as_bytes(), &session);
    }
    if !state.load.streams.try_enter_detached() {
        state.server.metrics.refused(Refusal::Streams);
        return http_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many open streams on this server, retry later",
        );
    }
    let token = state.shutdown.child_token();
    let id = state.next_stream.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut s) = state.streams.lock() {
        s.entry(session.clone()).or_default().push((id, token.clone()));
    }
    Sse::new(event_stream(state, session, id, token))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// `GET /mcp` with `Last-Event-ID`: the rest of an answer stream of this session, from its
/// buffer, as a stream counted against the stream cap. 404 when the id names nothing this
/// session can resume (unknown, expired, or its events dropped), 400 when it is no id of
/// this server's.
fn resume_stream(state: &Arc<HttpState>, r: &Resumable, last: &[u8], session: &str) -> Response {
    let (buf, after) = match r.resume(last, session) {
        Ok(x) => x,
        Err(e) => {
            let status = if e == super::resume::ResumeError::Malformed {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::NOT_FOUND
            };
            return http_error(status, &e.to_string());
        }
    };
    if !state.load.streams.try_enter_detached() {
        state.server.metrics.refused(Refusal::Streams);
        return http_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many open streams on this server, retry later",
        );
    }
    state.server.metrics.streams.inc();
    let o = r.options();
    let deadline = std::time::Instant::now() + o.poll_after;
    buffered_stream(buf, after, o.retry, deadline, false, ListenGuard(state.clone()))
}

/// Unregisters a GET stream when the client goes away or the stream is ended.
struct StreamGuard {
    state: Arc<HttpState>,
    session: String,
    id: u64,
    token: CancellationToken,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.state.server.metrics.streams.dec();
        self.state.load.streams.release();
        if let Ok(mut s) = self.state.streams.lock()
            && let Some(list) = s.get_mut(&self.session)
        {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                s.remove(&self.session);
            }
        }
    }
}

fn event_stream(
    state: Arc<HttpState>,
    session: String,
    id: u64,
    token: CancellationToken,
) -> impl Stream<Item = Result<Event, Infallible>> {
    state.server.metrics.streams.inc();
    let rx = state.server.subscribe();
    let guard = StreamGuard {
        state,
        session,
        id,
        token,
    };
    stream::unfold((rx, guard), move |(mut rx, guard)| {
        let token = guard.token.clone();
        async move {
            loop {
                tokio::select! {
                    () = token.cancelled() => return None,
                    msg = rx.recv() => match msg {
                        Ok(m) if m.is_for(&guard.session) => {
                            return Some((Ok(Event::default().event("message").data(&*m.message)), (rx, guard)));
                        }
                        Ok(_) => {}
                        Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => return None,
                    },
                }
            }
        }
    })
}

async fn delete_mcp(State(state): State<Arc<HttpState>>, caller: Caller, headers: HeaderMap) -> Response {
    if matches!(caller.version, Ok((_, true))) {
        return not_in_modern("DELETE");
    }
    let session = match session_id(&headers) {
        Ok("") => {
            return http_error(
                StatusCode::BAD_REQUEST,
                "DELETE /mcp ends a session: Mcp-Session-Id is required",
            );
        }
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    // Another caller's session is unknown to this one: it can neither end nor touch it.
    if let Err(r) = check_session(&state, session, caller.principal()) {
        return r.into_response();
    }
    if !state.ended.end(session) {
        return StatusCode::NO_CONTENT.into_response();
    }
    let tokens = state
        .streams
        .lock()
        .ok()
        .and_then(|mut s| s.remove(session))
        .unwrap_or_default();
    for (_, t) in tokens {
        t.cancel();
    }
    state.server.sessions.close(session);
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn every_mcp_route_checks_origin_and_host_before_anything_else() {
        let metrics = crate::metrics::Metrics::new("test", "system");
        let server = Server::new(crate::registry::Registry::new(&metrics), metrics);
        let options = HttpOptions {
            allowed_hosts: Some(vec!["mcp.example".into()]),
            ..HttpOptions::default()
        };
        let app = app(HttpState::new(server, options, CancellationToken::new()));
        let routes = [
            ("POST", "/mcp"),
            ("GET", "/mcp"),
            ("DELETE", "/mcp"),
            ("GET", "/.well-known/oauth-protected-resource"),
        ];
        for (method, path) in routes {
            let req = |host: &str, origin: Option<&str>| {
                let mut b = axum::http::Request::builder()
                    .method(method)
                    .uri(path)
                    .header(header::HOST, host);
                if let Some(o) = origin {
                    b = b.header(header::ORIGIN, o);
                }
                // Nothing else about the request is right: the checks answer first.
                b.body(Body::from("not json")).unwrap()
            };
            for (host, origin, want) in [
                ("evil.example", None, StatusCode::FORBIDDEN),
                ("localhost:1@evil.example", None, StatusCode::BAD_REQUEST),
                ("mcp.example", Some("http://evil.example"), StatusCode::FORBIDDEN),
            ] {
                let resp = app.clone().oneshot(req(host, origin)).await.unwrap();
                assert_eq!(
                    resp.status(),
                    want,
                    "{method} {path} host {host} origin {origin:?}"
                );
            }
            let allowed = app
                .clone()
                .oneshot(req("mcp.example", Some("http://localhost:3000")))
                .await
                .unwrap();
            assert_ne!(allowed.status(), StatusCode::FORBIDDEN, "{method} {path}");
        }
    }

    #[test]
    fn loopback_origins() {
        assert!(is_loopback_origin("http://localhost:3000"));
        assert!(is_loopback_origin("http://127.0.0.1"));
        assert!(is_loopback_origin("http://[::1]:8080"));
        assert!(!is_loopback_origin("http://evil.example"));
        assert!(!is_loopback_origin("http://localhost.evil.example"));
    }

    #[test]
    fn host_names() {
        for (host, name) in [
            ("localhost:8080", "localhost"),
            ("[::1]:8080", "[::1]"),
            ("[::1]", "[::1]"),
            ("mcp.example", "mcp.example"),
            ("MCP.Example:", "MCP.Example"),
            ("[::ffff:127.0.0.1]:1", "[::ffff:127.0.0.1]"),
        ] {
            assert_eq!(host_name(host), Some(name), "{host}");
        }
        // Everything that is not `host[:port]` is refused rather than guessed at: userinfo
        // (which once read as `localhost`), paths, spaces, odd ports, broken literals.
        for bad in [
            "",
            ":80",
            "localhost:1@evil.example",
            "user@localhost",
            "localhost/evil",
            "localhost evil",
            "localhost:80:80",
            "localhost:x",
            "localhost:123456",
            "[::1",
            "[]",
            "[::1]x",
            "[::1]:8o",
            "[evil.example]",
            "local\\host",
        ] {
            assert_eq!(host_name(bad), None, "{bad:?}");
        }
    }
}
