//! Remote upstreams over Streamable HTTP: one MCP session on the pooled keep-alive HTTP
//! client, re-established when the upstream forgets it (404), and a GET stream for the
//! upstream's notifications where it offers one. Calls made as their callers (`identity`)
//! go in sessions of their own, one per credential.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::h1;
use super::sse::Events;
use super::{
    BACKOFF, CallError, LogSink, Message, ParamHeaders, Shared, answer, back_off, check_initialized,
    classify, envelope, initialize_params,
};
use crate::config::upstream::Transport;
use crate::config::upstream::UpstreamRevision;
use crate::handlers::http::TlsRefs;
use crate::net::http::{HttpClient, USER_AGENT};
use crate::secrets::WithSecrets;
use crate::template::Template;

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";

/// An established MCP session, or (`stateless`) the 2026-07-28 revision, which has none:
/// every request carries the revision in its `_meta` and header.
#[derive(Debug, Clone)]
struct Session {
    id: Option<HeaderValue>,
    version: HeaderValue,
    stateless: bool,
}

/// The stateless revision.
const STATELESS: &str = "2026-07-28";
/// `_meta` keys of a 2026-07-28 request.
const VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
const CAPS_KEY: &str = "io.modelcontextprotocol/clientCapabilities";

/// A 2026-07-28 request: `params` with the revision and (no) client capabilities in its
/// `_meta` (besides what `_meta` already holds: a progress token, a trace context).
fn stateless_envelope<P: serde::Serialize + ?Sized>(id: u64, method: &str, params: &P) -> Vec<u8> {
    declaring(id, method, params, json!({}))
}

/// [`stateless_envelope`] declaring the client capabilities `caps` (those of the client
/// the upstream's questions are relayed to).
fn declaring<P: serde::Serialize + ?Sized>(id: u64, method: &str, params: &P, caps: Value) -> Vec<u8> {
    let mut p = serde_json::to_value(params).unwrap_or(Value::Null);
    if !p.is_object() {
        p = json!({});
    }
    if let Some(obj) = p.as_object_mut() {
        let meta = obj.entry("_meta").or_insert_with(|| json!({}));
        if !meta.is_object() {
            *meta = json!({});
        }
        if let Some(m) = meta.as_object_mut() {
            m.insert(VERSION_KEY.into(), Value::String(STATELESS.into()));
            m.insert(CAPS_KEY.into(), caps);
        }
    }
    envelope(id, method, &p)
}

/// The headers a 2026-07-28 request repeats its body's method and name in (`Mcp-Method`,
/// and `Mcp-Name` for a tool call, a prompt or a read), and a tool call the arguments its
/// tool declares with `x-mcp-header` (`Mcp-Param-*`, as `declared` says the upstream lists
/// them): plain visible ASCII as it is, anything else as `=?base64?...?=`.
fn mirrored(body: &[u8], declared: &ParamHeaders) -> Vec<(Cow<'static, str>, HeaderValue)> {
    #[derive(serde::Deserialize)]
    struct Body<'a> {
        #[serde(borrow, default)]
        method: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        params: Option<Params<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Params<'a> {
        #[serde(borrow, default)]
        name: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        uri: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        arguments: Option<&'a serde_json::value::RawValue>,
    }
    let Ok(b) = serde_json::from_slice::<Body<'_>>(body) else {
        return Vec::new();
    };
    let Some(method) = b.method else {
        return Vec::new();
    };
    let mut out: Vec<(Cow<'static, str>, HeaderValue)> = header_text(&method)
        .map(|v| ("mcp-method".into(), v))
        .into_iter()
        .collect();
    let named = match (&*method, &b.params) {
        ("tools/call" | "prompts/get", Some(p)) => p.name.as_deref(),
        ("resources/read", Some(p)) => p.uri.as_deref(),
        _ => None,
    };
    out.extend(named.and_then(header_text).map(|v| ("mcp-name".into(), v)));
    if method == "tools/call" && !declared.is_empty() {
        let params = b.params.as_ref();
        let tool = params.and_then(|p| declared.get(p.name.as_deref()?));
        let args = params.and_then(|p| p.arguments);
        if let (Some(tool), Some(args)) = (tool, args) {
            out.extend(param_values(tool, args));
        }
    }
    out
}

/// The `Mcp-Param-*` headers of one call's arguments: each declared argument that is a
/// string, an integer or a boolean, as the upstream compares them.
fn param_values<'a>(
    tool: &'a [(Box<str>, Box<str>)],
    args: &serde_json::value::RawValue,
) -> impl Iterator<Item = (Cow<'static, str>, HeaderValue)> + 'a {
    let args: serde_json::Map<String, Value> = serde_json::from_str(args.get()).unwrap_or_default();
    tool.iter().filter_map(move |(param, header)| {
        let text = match args.get(&**param)? {
            Value::String(s) => Cow::Borrowed(s.as_str()),
            Value::Bool(b) => Cow::Borrowed(if *b { "true" } else { "false" }),
            Value::Number(n) if n.is_i64() || n.is_u64() => Cow::Owned(n.to_string()),
            _ => return None,
        };
        Some((Cow::Owned(header.to_string()), header_text(&text)?))
    })
}

/// A header value for `text`: plain visible ASCII as it is, anything else as
/// `=?base64?...?=`.
fn header_text(text: &str) -> Option<HeaderValue> {
    let plain = text.bytes().all(|b| (0x20..=0x7e).contains(&b)) && text.trim() == text;
    if plain {
        return HeaderValue::from_str(text).ok();
    }
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(text);
    HeaderValue::from_str(&format!("=?base64?{encoded}?=")).ok()
}

/// Whether a failed `initialize` may mean an upstream that speaks only 2026-07-28 (which
/// has no `initialize`): it answered, but not with a session.
fn refused_session(e: &CallError) -> bool {
    matches!(
        e,
        CallError::Rpc(..) | CallError::Protocol(_) | CallError::Down(_)
    )
}

/// One remote upstream.
#[derive(Debug)]
pub(super) struct Remote {
    shared: Arc<Shared>,
    url: http::Uri,
    headers: Vec<(String, Template)>,
    tls: Option<TlsRefs>,
    http: HttpClient,
    /// The lean client's pool (plain `http://` only), which sends every POST.
    lean: Option<h1::Pool>,
    session: Mutex<Option<Session>>,
    /// Sessions opened by calls made as their callers (`identity`), by credential: the
    /// `Authorization` value itself (a clone shares its bytes), compared exactly, so two
    /// credentials never share a session. It lives no longer than the warm credential that
    /// made it, and hashing it per call costs a few hundred instructions where a digest cost
    /// tens of thousands.
    caller_sessions: std::sync::Mutex<rustc_hash::FxHashMap<HeaderValue, Session>>,
    /// Signalled when a request found the connection gone.
    lost: tokio::sync::Notify,
    /// Requests in flight (more are refused as `busy`).
    inflight: Arc<tokio::sync::Semaphore>,
    /// Which revision it is spoken to in.
    revision: UpstreamRevision,
    /// Answers to the upstream's own requests being sent (more are not answered).
    replies: Arc<tokio::sync::Semaphore>,
}

/// Sessions of calls made as their callers kept per upstream (more: one is forgotten).
const MAX_CALLER_SESSIONS: usize = 256;

/// Answers to an upstream's requests in flight at once.
const MAX_REPLIES: usize = 8;

/// An answer's body, from either client.
enum Body<'a> {
    Hyper { body: Incoming, last: Bytes },
    Lean(h1::Response<'a>),
}

impl Body<'_> {
    /// The next piece of the body; `None` once it is complete.
    async fn next(&mut self) -> Result<Option<&[u8]>, String> {
        match self {
            Body::Hyper { body, last } => loop {
                match body.frame().await {
                    None => return Ok(None),
                    Some(Err(e)) => return Err(e.to_string()),
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            *last = data;
                            return Ok(Some(last));
                        }
                    }
                }
            },
            Body::Lean(r) => r.chunk().await,
        }
    }

    /// Reads the rest of the body if it is already here, so the connection can be reused.
    fn finish_now(&mut self) {
        if let Body::Lean(r) = self {
            r.finish_now();
        }
    }
}

/// How one POST went.
enum Posted {
    Answer(Result<Value, CallError>),
    /// The upstream no longer knows the session.
    SessionGone,
}

impl Remote {
    pub(super) fn start(
        shared: &Arc<Shared>,
        t: &Transport,
        revision: UpstreamRevision,
        http: HttpClient,
    ) -> Arc<Self> {
        let Transport::Http { url, headers, tls } = t else {
            unreachable!("a remote connection of an http upstream")
        };
        // Checked when compiled (a literal http(s) URL); an unusable one fails every request.
        let url: http::Uri = url.parse().unwrap_or_default();
        let remote = Arc::new(Self {
            shared: Arc::clone(shared),
            lean: tls
                .is_none()
                .then(|| h1::Pool::for_url(&url, USER_AGENT))
                .flatten(),
            url,
            headers: headers.clone(),
            tls: tls.clone(),
            http,
            session: Mutex::new(None),
            caller_sessions: std::sync::Mutex::default(),
            lost: tokio::sync::Notify::new(),
            inflight: Arc::new(tokio::sync::Semaphore::new(super::MAX_IN_FLIGHT)),
            revision,
            replies: Arc::new(tokio::sync::Semaphore::new(MAX_REPLIES)),
        });
        tokio::spawn(supervise(Arc::downgrade(&remote), shared.stop.clone()));
        remote
    }

    /// The session's and the upstream's own headers (Secret values read now), each checked
    /// (no value can carry a line break into the request).
    fn headers(
        &self,
        session: Option<&Session>,
        secrets: &Value,
        body: &[u8],
        auth: Option<&HeaderValue>,
        mut add: impl FnMut(&str, &HeaderValue),
    ) -> Result<(), CallError> {
        self.shared.secrets_ready()?;
        if let Some(s) = session {
            if let Some(id) = &s.id {
                add(SESSION_HEADER, id);
            }
            add(VERSION_HEADER, &s.version);
            if s.stateless {
                for (name, value) in mirrored(body, &self.shared.param_headers.load()) {
                    add(&name, &value);
                }
            }
        }
        let scope = WithSecrets {
            args: &Value::Null,
            secrets,
        };
        // A call as its caller carries the caller's credential, never the configured one too.
        if let Some(a) = auth {
            add(header::AUTHORIZATION.as_str(), a);
        }
        for (name, t) in &self.headers {
            if auth.is_some() && name.eq_ignore_ascii_case(header::AUTHORIZATION.as_str()) {
                continue;
            }
            let value = t
                .render(&scope)
                .map_err(|e| CallError::Down(format!("header `{name}`: {e}")))?;
            match (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                (Ok(n), Ok(v)) => add(n.as_str(), &v),
                _ => return Err(CallError::Down(format!("header `{name}` has an invalid value"))),
            }
        }
        // A traced call's context, for an upstream that reads it from the HTTP request
        // (as the MCP message's `_meta` carries it too).
        crate::otel::spans::headers(add);
        Ok(())
    }

    /// A request for the hyper client with the upstream's headers.
    fn build(
        &self,
        method: Method,
        session: Option<&Session>,
        body: Bytes,
        secrets: &Value,
        auth: Option<&HeaderValue>,
    ) -> Result<Request<Full<Bytes>>, CallError> {
        let mut req = Request::builder()
            .method(method)
            .uri(self.url.clone())
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header(header::USER_AGENT, USER_AGENT);
        if !body.is_empty() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        self.headers(session, secrets, &body, auth, |n, v| {
            req = std::mem::take(&mut req).header(n, v.clone());
        })?;
        req.body(Full::new(body))
            .map_err(|e| CallError::Down(format!("invalid request: {e}")))
    }

    /// Sends a request built with `secrets` (the same values: headers and TLS agree).
    async fn send(
        &self,
        req: Request<Full<Bytes>>,
        secrets: &Value,
    ) -> Result<http::Response<Incoming>, CallError> {
        self.http
            .send(req, self.tls.as_ref(), secrets)
            .await
            .map_err(|e| {
                self.lost.notify_one();
                CallError::Down(e)
            })
    }

    /// POSTs one message; with an id, reads the answer from a JSON or event-stream body
    /// (log messages on an event stream go to `log`).
    async fn post(
        &self,
        session: Option<&Session>,
        body: Vec<u8>,
        id: Option<u64>,
        log: LogSink<'_>,
        auth: Option<&HeaderValue>,
    ) -> Result<(Posted, Option<HeaderValue>), CallError> {
        let secrets = self.shared.secrets.snapshot();
        let (status, session_id, is_stream, body) = match &self.lean {
            Some(pool) => {
                let mut headers = Vec::with_capacity(128);
                self.headers(session, &secrets, &body, auth, |n, v| {
                    for part in [n.as_bytes(), b": ", v.as_bytes(), b"\r\n"] {
                        headers.extend_from_slice(part);
                    }
                })?;
                let mut resp = pool
                    .post(&headers, &body, self.shared.max_bytes)
                    .await
                    .map_err(|e| {
                        self.lost.notify_one();
                        CallError::Down(e)
                    })?;
                if resp.is_stream {
                    resp.unlimited();
                }
                let status = StatusCode::from_u16(resp.status).unwrap_or(StatusCode::BAD_GATEWAY);
                (status, resp.session.take(), resp.is_stream, Body::Lean(resp))
            }
            None => {
                let req = self.build(Method::POST, session, Bytes::from(body), &secrets, auth)?;
                let resp = self.send(req, &secrets).await?;
                let is_stream = resp
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
                let session_id = resp.headers().get(SESSION_HEADER).cloned();
                let status = resp.status();
                let body = Body::Hyper {
                    body: resp.into_body(),
                    last: Bytes::new(),
                };
                (status, session_id, is_stream, body)
            }
        };
        if status == StatusCode::NOT_FOUND && session.is_some_and(|s| s.id.is_some()) {
            return Ok((Posted::SessionGone, None));
        }
        if status == StatusCode::UNAUTHORIZED && auth.is_some() {
            return Err(CallError::Unauthorized);
        }
        let credentials = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
        if status.is_client_error()
            && !credentials
            && !is_stream
            && let Some(id) = id
        {
            // A JSON-RPC error may come with a 4xx status (2026-07-28 answers a request it
            // refuses, e.g. for a client capability not declared, with 400): it is the answer.
            if let Err(e @ (CallError::Rpc(..) | CallError::NeedsTask(_))) = self.read_json(body, id).await {
                return Ok((Posted::Answer(Err(e)), session_id));
            }
            return Err(CallError::Down(format!("answered HTTP {status}")));
        }
        if !status.is_success() {
            let hint = if credentials {
                " (check the upstream's credentials)"
            } else {
                ""
            };
            return Err(CallError::Down(format!("answered HTTP {status}{hint}")));
        }
        let Some(id) = id else {
            return Ok((Posted::Answer(Ok(Value::Null)), session_id));
        };
        let answer = if is_stream {
            self.read_stream(body, Some(id), log, session, auth).await
        } else {
            self.read_json(body, id).await
        };
        Ok((Posted::Answer(answer), session_id))
    }

    async fn read_json(&self, body: Body<'_>, id: u64) -> Result<Value, CallError> {
        let collected;
        let mut lean;
        let bytes: &[u8] = match body {
            Body::Hyper { body, .. } => {
                collected = http_body_util::Limited::new(body, self.shared.max_bytes)
                    .collect()
                    .await
                    .map_err(|e| CallError::Protocol(format!("reading the answer: {e}")))?
                    .to_bytes();
                &collected
            }
            Body::Lean(r) => {
                lean = r;
                lean.whole()
                    .await
                    .map_err(|e| CallError::Protocol(format!("reading the answer: {e}")))?
            }
        };
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|_| CallError::Protocol("an answer that is not JSON".into()))?;
        match classify(v).map_err(CallError::Protocol)? {
            Message::Response(got, r) if got == id => r,
            _ => Err(CallError::Protocol(
                "the answer is not the response to the request".into(),
            )),
        }
    }

    /// Reads an event stream; with `id`, until the response to it. Notifications on the
    /// way are handled (log messages passed to `log` when there is one), requests answered.
    async fn read_stream(
        &self,
        mut body: Body<'_>,
        id: Option<u64>,
        log: LogSink<'_>,
        session: Option<&Session>,
        auth: Option<&HeaderValue>,
    ) -> Result<Value, CallError> {
        let mut events = Events::new(self.shared.max_bytes);
        let mut out = Vec::new();
        loop {
            let chunk = body
                .next()
                .await
                .map_err(|e| CallError::Down(format!("reading the stream: {e}")))?;
            let Some(chunk) = chunk else {
                return Err(CallError::Down("the stream ended before the answer".into()));
            };
            events.feed(chunk, &mut out).map_err(CallError::Protocol)?;
            for data in out.drain(..) {
                let Ok(v) = serde_json::from_slice::<Value>(&data) else {
                    continue;
                };
                match classify(v) {
                    Ok(Message::Response(got, r)) if Some(got) == id => {
                        body.finish_now();
                        return r;
                    }
                    // A log message of this call goes to its client, if it is listening.
                    Ok(Message::Notification(m, p)) => match log.log {
                        Some(f) if m == "notifications/message" => f(&p),
                        _ => self.shared.notified(&m, &p),
                    },
                    // A question to this call's client is relayed, in its session.
                    Ok(Message::Request(rid, m, p)) => match log.ask {
                        Some(ask) if crate::peer::Need::from_method(&m).is_some() => {
                            let relayed = ask(m, p).await;
                            let stop = matches!(relayed, Err(super::relay::Refused::Stop));
                            self.reply(super::relay::answered(rid, relayed), session, auth)
                                .await;
                            if stop {
                                // 2026-07-28: the client is asked first; the call is made
                                // again with its answer.
                                body.finish_now();
                                return Err(CallError::Asked);
                            }
                        }
                        _ => self.reply(answer(rid, &m), session, auth).await,
                    },
                    _ => {}
                }
            }
        }
    }

    /// Answers a request of the upstream's in the background (at most [`MAX_REPLIES`] at a
    /// time: the rest are left unanswered), within its session.
    /// The answer goes with the credential of the call it belongs to (`auth`), in its session.
    async fn reply(&self, msg: Value, session: Option<&Session>, auth: Option<&HeaderValue>) {
        let Ok(permit) = Arc::clone(&self.replies).try_acquire_owned() else {
            return;
        };
        // Not waiting for the lock: an `initialize` in progress holds it.
        let session = match session {
            Some(s) => Some(s.clone()),
            None => self.session.try_lock().ok().and_then(|s| s.clone()),
        };
        let secrets = self.shared.secrets.snapshot();
        let Ok(req) = self.build(
            Method::POST,
            session.as_ref(),
            Bytes::from(msg.to_string()),
            &secrets,
            auth,
        ) else {
            return;
        };
        let (http, tls) = (self.http.clone(), self.tls.clone());
        let timeout = self.shared.timeout;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(timeout, http.send(req, tls.as_ref(), &secrets)).await;
            drop(permit);
        });
    }

    /// Opens a session, or finds the upstream speaks 2026-07-28, as its `revision` says,
    /// with `auth` as the credential (`None`: the configured headers): the session and what
    /// the upstream said about itself.
    async fn open(&self, auth: Option<&HeaderValue>) -> Result<(Session, String, Value), CallError> {
        match self.revision {
            UpstreamRevision::Handshake => self.initialize(auth).await,
            UpstreamRevision::Stateless => self.discover(auth).await,
            UpstreamRevision::Auto => match self.initialize(auth).await {
                Err(e) if refused_session(&e) => self.discover(auth).await.map_err(|_| e),
                r => r,
            },
        }
    }

    /// Asks a 2026-07-28 upstream what it is (`server/discover`): the revision holds no
    /// session, only what it said about itself.
    async fn discover(&self, auth: Option<&HeaderValue>) -> Result<(Session, String, Value), CallError> {
        let session = Session {
            id: None,
            version: HeaderValue::from_static(STATELESS),
            stateless: true,
        };
        let id = self.shared.id();
        let msg = stateless_envelope(id, "server/discover", &json!({}));
        let (posted, _) = self
            .post(Some(&session), msg, Some(id), LogSink::NONE, auth)
            .await?;
        let Posted::Answer(r) = posted else {
            return Err(CallError::Down("server/discover answered 404".into()));
        };
        let r = r?;
        let speaks = r
            .get("supportedVersions")
            .and_then(Value::as_array)
            .is_some_and(|v| v.iter().any(|x| x.as_str() == Some(STATELESS)));
        if !speaks {
            return Err(CallError::Protocol(format!(
                "server/discover does not list {STATELESS} among its supportedVersions"
            )));
        }
        let info = r
            .get("_meta")
            .and_then(|m| m.get("io.modelcontextprotocol/serverInfo"))
            .cloned()
            .unwrap_or(Value::Null);
        let info = super::bounded_info(info);
        self.shared
            .offered
            .store(super::offers::offered(&r), std::sync::atomic::Ordering::Relaxed);
        self.shared
            .stateless
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.shared
            .epoch
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok((session, STATELESS.to_owned(), info))
    }

    /// Opens a session: `initialize`, then `notifications/initialized`.
    async fn initialize(&self, auth: Option<&HeaderValue>) -> Result<(Session, String, Value), CallError> {
        let id = self.shared.id();
        // The server's session is every client's: roots (which an upstream may keep per
        // session, and use as what it may touch) are declared only in a caller's own.
        let msg = envelope(id, "initialize", &initialize_params(true, auth.is_some()));
        let (posted, session_id) = self.post(None, msg, Some(id), LogSink::NONE, auth).await?;
        let Posted::Answer(r) = posted else {
            return Err(CallError::Down("initialize answered 404".into()));
        };
        let (version, info, offered) = check_initialized(&r?)?;
        self.shared
            .offered
            .store(offered, std::sync::atomic::Ordering::Relaxed);
        self.shared
            .epoch
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let session = Session {
            id: session_id,
            version: HeaderValue::from_str(&version)
                .map_err(|_| CallError::Protocol("bad protocol version".into()))?,
            stateless: false,
        };
        self.shared
            .stateless
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let note = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_vec();
        self.post(Some(&session), note, None, LogSink::NONE, auth).await?;
        Ok((session, version, info))
    }

    /// The session, established first when there is none.
    async fn session(&self) -> Result<Session, CallError> {
        let mut s = self.session.lock().await;
        if let Some(s) = &*s {
            return Ok(s.clone());
        }
        let (session, version, info) = self.open(None).await?;
        self.shared.set_health(|h| {
            h.protocol_version = Some(version);
            h.server_info = info;
        });
        *s = Some(session.clone());
        Ok(session)
    }

    /// The session of calls made with `auth` (a caller's credential; `None`: the server's
    /// session). Each credential opens a session of its own: an upstream may bind a session
    /// to whoever opened it (the official SDKs do), so a caller's calls never ride on the
    /// server's session nor on another caller's.
    async fn session_as(&self, auth: Option<&HeaderValue>) -> Result<Session, CallError> {
        let Some(a) = auth else {
            return self.session().await;
        };
        if let Some(s) = self.caller_session(|m| m.get(a).cloned()) {
            return Ok(s);
        }
        let (session, _, _) = self.open(Some(a)).await?;
        self.caller_session(|m| {
            if m.len() >= MAX_CALLER_SESSIONS {
                // The oldest is not known; any one goes (its caller opens another).
                let k = m.keys().next().cloned();
                k.map(|k| m.remove(&k));
            }
            m.insert(a.clone(), session.clone());
        });
        Ok(session)
    }

    fn caller_session<T>(&self, f: impl FnOnce(&mut rustc_hash::FxHashMap<HeaderValue, Session>) -> T) -> T {
        f(&mut self
            .caller_sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Whether requests are made in protocol 2026-07-28 (connecting first if needed).
    pub(super) async fn speaks_2026(&self, auth: Option<&HeaderValue>) -> Result<bool, CallError> {
        let t = self.shared.timeout;
        match tokio::time::timeout(t, self.session_as(auth)).await {
            Ok(s) => s.map(|s| s.stateless),
            Err(_) => Err(CallError::Timeout(t)),
        }
    }

    async fn forget_session(&self, old: &Session, auth: Option<&HeaderValue>) {
        if let Some(a) = auth {
            self.caller_session(|m| {
                if m.get(a).is_some_and(|cur| cur.id == old.id) {
                    m.remove(a);
                }
            });
            return;
        }
        let mut s = self.session.lock().await;
        if s.as_ref().is_some_and(|cur| cur.id == old.id) {
            *s = None;
        }
    }

    async fn exchange<P: serde::Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
        log: LogSink<'_>,
        auth: Option<&HeaderValue>,
    ) -> Result<Value, CallError> {
        for _ in 0..2 {
            let session = self.session_as(auth).await?;
            let id = self.shared.id();
            let msg = if session.stateless {
                // 2026-07-28 has no `ping`: asking what the server is proves it answers.
                let method = if method == "ping" {
                    "server/discover"
                } else {
                    method
                };
                match declared(log) {
                    Some(caps) => declaring(id, method, params, caps),
                    None => stateless_envelope(id, method, params),
                }
            } else {
                envelope(id, method, params)
            };
            match self.post(Some(&session), msg, Some(id), log, auth).await? {
                (Posted::Answer(r), _) if session.stateless => {
                    return self.rounds(&session, method, params, r?, log, auth).await;
                }
                (Posted::Answer(r), _) => return r,
                (Posted::SessionGone, _) => self.forget_session(&session, auth).await,
            }
        }
        Err(CallError::Down(
            "the upstream keeps forgetting its session".into(),
        ))
    }

    /// A 2026-07-28 answer `first`: complete, or the upstream's questions for the client of
    /// the call (`input_required`), relayed to it (`log.ask`) and the request made again
    /// with the answers and the upstream's `requestState`, round after round (at most
    /// [`MAX_ROUNDS`]). A question the client is asked in its own input round ends the call
    /// here: the client's retry makes it again, and the answer is then at hand.
    async fn rounds<P: serde::Serialize + ?Sized>(
        &self,
        session: &Session,
        method: &str,
        params: &P,
        first: Value,
        log: LogSink<'_>,
        auth: Option<&HeaderValue>,
    ) -> Result<Value, CallError> {
        let mut v = first;
        for n in 0..=MAX_ROUNDS {
            let Some(ask) = log.ask else {
                return complete(v, log.tasks);
            };
            let Some(round) = super::relay::InputRound::of(&mut v)? else {
                return complete(v, log.tasks);
            };
            if n == MAX_ROUNDS {
                break;
            }
            let answers = super::relay::ask_each(ask, round.requests).await?;
            let mut again = serde_json::to_value(params).unwrap_or_else(|_| json!({}));
            if let Some(o) = again.as_object_mut() {
                o.insert("inputResponses".into(), Value::Object(answers));
                match round.state {
                    Some(s) => o.insert("requestState".into(), Value::String(s)),
                    None => o.remove("requestState"),
                };
            }
            let id = self.shared.id();
            let msg = declaring(id, method, &again, declared(log).unwrap_or_else(|| json!({})));
            v = match self.post(Some(session), msg, Some(id), log, auth).await? {
                (Posted::Answer(r), _) => r?,
                (Posted::SessionGone, _) => {
                    return Err(CallError::Down("the upstream answered 404 to a retry".into()));
                }
            };
        }
        Err(CallError::Protocol(format!(
            "it still asks for input after {MAX_ROUNDS} rounds"
        )))
    }

    pub(super) async fn request<P: serde::Serialize + Sync + ?Sized>(
        &self,
        method: &str,
        params: &P,
        log: LogSink<'_>,
        auth: Option<&HeaderValue>,
    ) -> Result<Value, CallError> {
        let Ok(_permit) = self.inflight.try_acquire() else {
            return Err(CallError::Busy);
        };
        let t = self.shared.timeout;
        tokio::time::timeout(t, self.exchange(method, params, log, auth))
            .await
            .unwrap_or(Err(CallError::Timeout(t)))
    }

    /// Follows the upstream's GET stream of notifications (2026-07-28: a
    /// `subscriptions/listen`) until it ends. Returns false when the upstream offers none.
    async fn listen(&self) -> bool {
        let Ok(Ok(session)) = tokio::time::timeout(self.shared.timeout, self.session()).await else {
            return true;
        };
        if session.stateless {
            return self.listen_stateless(&session).await;
        }
        let secrets = self.shared.secrets.snapshot();
        let Ok(req) = self.build(Method::GET, Some(&session), Bytes::new(), &secrets, None) else {
            return false;
        };
        let Ok(Ok(resp)) = tokio::time::timeout(self.shared.timeout, self.send(req, &secrets)).await else {
            return true;
        };
        if resp.status() == StatusCode::NOT_FOUND {
            self.forget_session(&session, None).await;
            return true;
        }
        if !resp.status().is_success() {
            return false;
        }
        let body = Body::Hyper {
            body: resp.into_body(),
            last: Bytes::new(),
        };
        let _ = self
            .read_stream(body, None, LogSink::NONE, Some(&session), None)
            .await;
        true
    }
}

impl Remote {
    /// A 2026-07-28 `subscriptions/listen` for list changes of what is imported and updates
    /// of the subscribed resources, followed until it ends (or the subscribed resources
    /// change: then it is opened again).
    async fn listen_stateless(&self, session: &Session) -> bool {
        use super::offers::{PROMPTS, RESOURCES};
        let wants = self.shared.wants;
        let params = json!({"notifications": {
            "toolsListChanged": true,
            "resourcesListChanged": wants & RESOURCES != 0,
            "promptsListChanged": wants & PROMPTS != 0,
            "resourceSubscriptions": self.shared.watches.uris(),
        }});
        let id = self.shared.id();
        let msg = stateless_envelope(id, "subscriptions/listen", &params);
        tokio::select! {
            r = self.post(Some(session), msg, Some(id), LogSink::NONE, None) => matches!(r, Ok((Posted::Answer(Ok(_)), _))),
            () = self.shared.relisten.notified() => true,
        }
    }
}

/// Input rounds with one 2026-07-28 upstream in one request, at most.
const MAX_ROUNDS: usize = 8;

/// The client capabilities a 2026-07-28 request declares for `log`: those of the client its
/// questions are relayed to, and the tasks extension where a task is followed (`None`:
/// none).
fn declared(log: LogSink<'_>) -> Option<Value> {
    if log.ask.is_none() && log.caps.is_none() && !log.tasks {
        return None;
    }
    let mut caps = if log.ask.is_some() || log.caps.is_some() {
        relayed_caps(log.caps)
    } else {
        json!({})
    };
    if log.tasks {
        caps["extensions"] = json!({super::tasks::EXTENSION: {}});
    }
    Some(caps)
}

/// The client capabilities a 2026-07-28 upstream is told of when its questions are
/// relayed: those the call's client declared (`None`: not known, so every relayed one).
fn relayed_caps(caps: Option<crate::session::ClientCaps>) -> Value {
    let c = caps.unwrap_or(super::relay::EVERY_RELAYED);
    let mut out = serde_json::Map::new();
    if c.elicitation || c.elicitation_url {
        let mut e = serde_json::Map::new();
        if c.elicitation {
            e.insert("form".into(), json!({}));
        }
        if c.elicitation_url {
            e.insert("url".into(), json!({}));
        }
        out.insert("elicitation".into(), Value::Object(e));
    }
    if c.sampling {
        out.insert("sampling".into(), json!({}));
    }
    if c.roots {
        out.insert("roots".into(), json!({}));
    }
    Value::Object(out)
}

/// A 2026-07-28 result: complete (or, `task`: the tasks extension was declared, a task),
/// or a request for input that is not relayed here.
fn complete(v: Value, task: bool) -> Result<Value, CallError> {
    match v.get("resultType").and_then(Value::as_str) {
        None | Some("complete") => Ok(v),
        Some("task") if task => Ok(v),
        Some("input_required") => Err(CallError::Protocol(
            "it asks the client for input (an input_required result), which is relayed only to a client of 2026-07-28 (or, in a tool call, of any revision)"
                .into(),
        )),
        Some(other) => Err(CallError::Protocol(format!(
            "a result of type `{}`",
            other.chars().take(32).collect::<String>()
        ))),
    }
}

/// Keeps the session up and the tool list fresh until the upstream is stopped.
async fn supervise(remote: std::sync::Weak<Remote>, stop: tokio_util::sync::CancellationToken) {
    let mut backoff = BACKOFF.0;
    let mut short_streams = 0u32;
    let mut attempt = 0u32;
    loop {
        let Some(r) = remote.upgrade() else { return };
        let no_params = json!({});
        // Connecting while not ready (at first, after a failure): a span when tracing is on.
        attempt = attempt.saturating_add(1);
        let ready = r.shared.health.lock().is_ok_and(|h| h.state == "ready");
        let span = if ready {
            None
        } else {
            crate::otel::spans::upstream_connect(&r.shared.name, attempt)
        };
        let up = tokio::select! {
            up = crate::otel::spans::under(span.as_ref(), r.request("ping", &no_params, LogSink::NONE, None)) => up,
            () = stop.cancelled() => return,
        };
        if let Some(cx) = &span {
            crate::otel::finish(cx, up.as_ref().err().map(CallError::kind));
        }
        if up.is_ok() {
            attempt = 0;
        }
        match up {
            Ok(_) => {
                backoff = BACKOFF.0;
                let was_ready = r.shared.health.lock().is_ok_and(|h| h.state == "ready");
                r.shared.set_health(|h| {
                    h.state = "ready";
                    h.error = None;
                    h.connections = 1;
                });
                if !was_ready {
                    r.shared.relist.notify_one();
                }
                // Notifications until the stream ends or a request finds the connection
                // gone; without a stream, until such a request (or a minute passes: then
                // ping again). A stream that keeps ending at once is retried with backoff.
                let opened = std::time::Instant::now();
                let streamed = tokio::select! {
                    s = r.listen() => s,
                    () = r.lost.notified() => true,
                    () = stop.cancelled() => return,
                };
                if !streamed {
                    tokio::select! {
                        () = r.lost.notified() => {}
                        () = tokio::time::sleep(Duration::from_secs(60)) => {}
                        () = stop.cancelled() => return,
                    }
                }
                if opened.elapsed() < Duration::from_secs(1) {
                    short_streams += 1;
                } else {
                    short_streams = 0;
                }
                drop(r);
                let mut pause = BACKOFF.0.saturating_mul(1 << short_streams.min(7));
                if !back_off(&stop, &mut pause).await {
                    return;
                }
            }
            Err(e) => {
                r.shared.set_health(|h| {
                    h.state = "down";
                    h.error = Some(e.to_string());
                    h.connections = 0;
                });
                drop(r);
                if !back_off(&stop, &mut backoff).await {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_2026_request_carries_its_revision_and_mirrors_its_method_and_name() {
        let body = stateless_envelope(
            7,
            "tools/call",
            &json!({"name": "écho", "arguments": {}, "_meta": {"progressToken": 3}}),
        );
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["params"]["_meta"][VERSION_KEY], STATELESS);
        assert_eq!(v["params"]["_meta"][CAPS_KEY], json!({}));
        assert_eq!(
            v["params"]["_meta"]["progressToken"], 3,
            "what _meta held is kept"
        );
        let none = ParamHeaders::default();
        let h = mirrored(&body, &none);
        assert_eq!(
            h[0],
            ("mcp-method".into(), HeaderValue::from_static("tools/call"))
        );
        // Not plain ASCII: base64.
        assert_eq!(
            h[1],
            ("mcp-name".into(), HeaderValue::from_static("=?base64?w6ljaG8=?="))
        );
        let read = stateless_envelope(8, "resources/read", &json!({"uri": "file:///a b"}));
        assert_eq!(
            mirrored(&read, &none)[1],
            ("mcp-name".into(), HeaderValue::from_static("file:///a b"))
        );
        assert_eq!(
            mirrored(&stateless_envelope(9, "tools/list", &json!({})), &none).len(),
            1
        );
        // Params that are not an object still get a `_meta`.
        let odd: Value = serde_json::from_slice(&stateless_envelope(1, "x", &json!([1]))).unwrap();
        assert_eq!(odd["params"]["_meta"][VERSION_KEY], STATELESS);
        assert!(mirrored(b"not json", &none).is_empty());
    }

    #[test]
    fn a_2026_call_mirrors_the_arguments_its_tool_declares() {
        let declared = super::super::param_headers(&[
            json!({"name": "weather", "inputSchema": {"type": "object", "properties": {
                "city": {"type": "string", "x-mcp-header": "City"},
                "days": {"type": "integer", "x-mcp-header": "Days"},
                "metric": {"type": "boolean", "x-mcp-header": "Metric"},
                "note": {"type": "string"},
            }}}),
            json!({"name": "plain", "inputSchema": {"type": "object"}}),
        ]);
        assert_eq!(declared.len(), 1, "only tools that declare headers are kept");
        let call = |name: &str, args: Value| {
            let body = stateless_envelope(1, "tools/call", &json!({"name": name, "arguments": args}));
            let mut h: Vec<(String, String)> = mirrored(&body, &declared)
                .into_iter()
                .skip(2)
                .map(|(n, v)| (n.into_owned(), v.to_str().unwrap().to_owned()))
                .collect();
            h.sort();
            h
        };
        assert_eq!(
            call(
                "weather",
                json!({"city": "Zürich", "days": 3, "metric": true, "note": "x"})
            ),
            [
                ("mcp-param-city".to_owned(), "=?base64?WsO8cmljaA==?=".to_owned()),
                ("mcp-param-days".to_owned(), "3".to_owned()),
                ("mcp-param-metric".to_owned(), "true".to_owned()),
            ]
        );
        // Absent, null or of another type: no header (the upstream's validation says why).
        assert_eq!(
            call(
                "weather",
                json!({"city": " padded ", "days": 1.5, "metric": null})
            ),
            [("mcp-param-city".to_owned(), "=?base64?IHBhZGRlZCA=?=".to_owned())]
        );
        assert!(call("plain", json!({"city": "x"})).is_empty());
        assert!(call("weather", json!("not an object")).is_empty());
    }

    #[test]
    fn only_complete_2026_results_are_answers() {
        assert!(complete(json!({"resultType": "complete", "content": []}), false).is_ok());
        assert!(complete(json!({"content": []}), false).is_ok());
        assert!(complete(json!({"resultType": "task"}), true).is_ok());
        for other in ["input_required", "task", "anything"] {
            assert!(matches!(
                complete(json!({"resultType": other}), false),
                Err(CallError::Protocol(_))
            ));
        }
        assert!(refused_session(&CallError::Rpc(
            -32601,
            "Method not found".into()
        )));
        assert!(!refused_session(&CallError::Timeout(Duration::from_secs(1))));
        assert!(!refused_session(&CallError::Unauthorized));
    }

    #[test]
    fn an_upstream_is_told_the_capabilities_the_calls_client_declared() {
        use crate::session::ClientCaps;
        assert_eq!(relayed_caps(Some(ClientCaps::default())), json!({}));
        let c = ClientCaps {
            elicitation_url: true,
            roots: true,
            ..ClientCaps::default()
        };
        assert_eq!(
            relayed_caps(Some(c)),
            json!({"elicitation": {"url": {}}, "roots": {}})
        );
        // Not known (this replica did not see the session's initialize): every relayed one.
        assert_eq!(
            relayed_caps(None),
            json!({"elicitation": {"form": {}, "url": {}}, "sampling": {}, "roots": {}})
        );
        let body: Value =
            serde_json::from_slice(&declaring(1, "tools/call", &json!({}), relayed_caps(None))).unwrap();
        assert_eq!(body["params"]["_meta"][CAPS_KEY]["sampling"], json!({}));
    }
}
