//! Message dispatch: JSON-RPC bytes in, JSON-RPC bytes out. Shared by the HTTP and stdio
//! transports. The tools/call path parses the envelope with borrowed slices, loads the
//! registry snapshot without a lock, and writes the response straight into one buffer.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;
use rustc_hash::FxHashMap;
use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::config::access::Principal;
use crate::config::{LogLevel, ResourceKind, Role};
use crate::handlers::{Executor, ToolOutput, check_output};
use crate::metrics::{Metrics, Refusal, method_index};
use crate::peer::{CallCtx, Peer, Pending};
use crate::protocol::{
    self, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR, RESOURCE_NOT_FOUND,
};
use crate::registry::{ListKind, Registry, Snapshot};
use crate::session::{ClientCaps, Sessions};
use crate::template::Budget;

/// A JSON-RPC message as received: every field borrowed from the request bytes.
#[derive(Deserialize)]
struct Incoming<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed_str")]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "borrowed_str")]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// An optional string borrowed from the request bytes when it has no escapes (serde's own
/// `Option<Cow<str>>` always copies); `null` is `None`, like a missing field.
fn borrowed_str<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    struct Str;
    impl<'de> serde::de::Visitor<'de> for Str {
        type Value = Option<Cow<'de, str>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Borrowed(v)))
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(v.to_owned())))
        }
        fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(v)))
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(Str)
}

/// Keeps `"id": null` distinguishable from a missing id.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct CallParams<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<CallMeta<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CallMeta<'a> {
    #[serde(borrow, default)]
    progress_token: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct CursorParams<'a> {
    #[serde(borrow, default)]
    cursor: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitializeParams<'a> {
    #[serde(borrow)]
    protocol_version: Cow<'a, str>,
    #[serde(borrow, default)]
    capabilities: Option<&'a RawValue>,
}

/// The 2026-07-28 additions to `tools/call` params: the answers of a retry and the state the
/// server handed out with its questions.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RetryParams<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    input_responses: Option<&'a RawValue>,
    #[serde(borrow, default)]
    request_state: Option<Cow<'a, str>>,
}

/// `subscriptions/listen` params.
#[derive(Deserialize)]
struct ListenParams {
    #[serde(default)]
    notifications: Option<ListenFilter>,
}

#[derive(Deserialize)]
struct LevelParams<'a> {
    #[serde(borrow)]
    level: Cow<'a, str>,
}

#[derive(Deserialize)]
struct CompleteParams<'a> {
    #[serde(borrow, rename = "ref")]
    reference: CompleteRef<'a>,
    #[serde(borrow)]
    argument: CompleteArgument<'a>,
}

#[derive(Deserialize)]
struct CompleteRef<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    uri: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct CompleteArgument<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow)]
    value: Cow<'a, str>,
}

#[derive(Deserialize)]
struct ReadParams<'a> {
    #[serde(borrow)]
    uri: Cow<'a, str>,
}

#[derive(Deserialize)]
struct PromptParams<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default)]
    arguments: Option<Map<String, Value>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CancelParams<'a> {
    #[serde(borrow)]
    request_id: &'a RawValue,
}

/// Per-request facts supplied by the transport.
#[derive(Debug, Clone, Copy)]
pub struct Ctx<'a> {
    /// Session (HTTP `Mcp-Session-Id`, `stdio`, or empty): scopes request ids for cancellation.
    /// Calls without a session cannot be cancelled by `notifications/cancelled` (only by
    /// dropping the request, i.e. disconnecting): nothing ties a sessionless cancel to its call.
    pub session: &'a str,
    /// Protocol revision in force for this message.
    pub version: &'a str,
    /// The transport can stream the answer: a slow tool call is handed back as
    /// [`Handled::deferred`] for [`Server::run_deferred`], which can reach the client while the
    /// call runs (progress, log messages, sampling, elicitation). Otherwise it runs here,
    /// unable to reach the client.
    pub stream: bool,
    /// Which protocol era the message is read in.
    pub era: Era<'a>,
    /// What the caller's credentials grant, for tools with `access`; `None` when it presented
    /// none (client authentication off, stdio).
    pub caller: Option<&'a Principal>,
}

/// How a transport tells the handshake era from the stateless revision (2026-07-28).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era<'a> {
    /// Handshake era (`initialize`, sessions): HTTP without a 2026-07-28 version header.
    Legacy,
    /// 2026-07-28: HTTP with this `MCP-Protocol-Version`, which `_meta` must repeat.
    Modern(&'a str),
    /// Per message (stdio): 2026-07-28 when the params' `_meta` names a protocol version
    /// (and the method is not `initialize`), the handshake era otherwise.
    Detect,
}

/// What dispatch produced.
#[derive(Debug, Default)]
pub struct Handled {
    /// The response bytes; `None` when the input held only notifications or responses.
    pub body: Option<Vec<u8>>,
    /// True when the input was a successful `initialize` (the transport may open a session).
    pub initialized: bool,
    /// What the client of a successful `initialize` can do.
    pub client: ClientCaps,
    /// A slow tool call left for the transport to run (see [`Ctx::stream`]).
    pub deferred: Option<Deferred>,
    /// The input could not be read as a request at all (parse error, invalid request without
    /// a usable id): HTTP answers 400 with the JSON-RPC error as body.
    pub malformed: bool,
    /// The HTTP status of a 2026-07-28 answer (0: the transport decides).
    pub status: u16,
    /// A `subscriptions/listen` request the transport serves as a notification stream.
    pub listen: Option<Listen>,
    /// A `tools/call` the caller may not make (HTTP 403): the scopes it lacks, space
    /// separated, for a `WWW-Authenticate` challenge (empty when only groups are missing).
    pub forbidden: Option<String>,
}

/// An accepted `subscriptions/listen`: the transport opens its stream with
/// [`Listen::acknowledgement`], then sends the events [`Listen::wants`], each tagged by
/// [`Listen::tag`].
#[derive(Debug)]
pub struct Listen {
    /// The request's id: the subscription's id.
    pub id: Box<RawValue>,
    /// What it asked for (all of which this server honours).
    pub filter: ListenFilter,
    /// The registration of its resource URIs, removed when the listen ends.
    pub registration: Option<ListenRegistration>,
}

/// The notification filter of a `subscriptions/listen`.
#[derive(Debug, Default, Clone, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenFilter {
    /// `notifications/tools/list_changed`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tools_list_changed: bool,
    /// `notifications/prompts/list_changed`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prompts_list_changed: bool,
    /// `notifications/resources/list_changed`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resources_list_changed: bool,
    /// `notifications/resources/updated` for these URIs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_subscriptions: Vec<String>,
}

/// Resource URIs watched by open listens, counted, so that a reload knows which resources to
/// compare. Dropped with its listen.
#[derive(Debug)]
pub struct ListenRegistration {
    watched: Arc<Mutex<FxHashMap<Box<str>, usize>>>,
    uris: Vec<String>,
}

impl Drop for ListenRegistration {
    fn drop(&mut self) {
        if let Ok(mut w) = self.watched.lock() {
            for u in &self.uris {
                if let Some(n) = w.get_mut(u.as_str()) {
                    *n -= 1;
                    if *n == 0 {
                        w.remove(u.as_str());
                    }
                }
            }
        }
    }
}

/// Most resource URIs one listen may watch.
pub const MAX_LISTEN_URIS: usize = 1_024;

impl Listen {
    fn tagged(&self, method: &str, extra: Option<(&str, Value)>) -> Vec<u8> {
        let mut params = Map::new();
        params.insert(
            "_meta".into(),
            json!({"io.modelcontextprotocol/subscriptionId": serde_json::from_str::<Value>(self.id.get()).unwrap_or(Value::Null)}),
        );
        if let Some((k, v)) = extra {
            params.insert(k.into(), v);
        }
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "method": method, "params": params})).unwrap_or_default()
    }

    /// `notifications/subscriptions/acknowledged`, the stream's first message.
    pub fn acknowledgement(&self) -> Vec<u8> {
        self.tagged(
            "notifications/subscriptions/acknowledged",
            Some((
                "notifications",
                serde_json::to_value(&self.filter).unwrap_or_default(),
            )),
        )
    }

    /// The event as this subscription's notification, if it asked for it.
    pub fn wants(&self, e: &Event) -> Option<Vec<u8>> {
        let f = &self.filter;
        match &e.kind {
            EventKind::ToolsChanged if f.tools_list_changed => {
                Some(self.tagged("notifications/tools/list_changed", None))
            }
            EventKind::PromptsChanged if f.prompts_list_changed => {
                Some(self.tagged("notifications/prompts/list_changed", None))
            }
            EventKind::ResourcesChanged if f.resources_list_changed => {
                Some(self.tagged("notifications/resources/list_changed", None))
            }
            EventKind::ResourceUpdated(uri)
                if e.session.is_none() && f.resource_subscriptions.iter().any(|u| u == &**uri) =>
            {
                Some(self.tagged("notifications/resources/updated", Some(("uri", json!(&**uri)))))
            }
            _ => None,
        }
    }

    /// The graceful end of the subscription (server shutdown): its response.
    pub fn closing(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        protocol::write_result(
            &mut out,
            &self.id,
            format!(
                "{{\"resultType\":\"complete\",\"_meta\":{{\"io.modelcontextprotocol/subscriptionId\":{}}}}}",
                self.id.get()
            )
            .as_bytes(),
        );
        out
    }
}

type Failure = (i32, String);

/// Running cancellable calls by (session, request id); the number tells apart two calls that
/// reuse one key, so the first to finish does not unregister the other.
type CancelMap = FxHashMap<(Box<str>, Box<str>), (u64, CancellationToken)>;

/// Limits dispatch applies to every message, whatever the transport.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Messages in one JSON-RPC batch; a longer batch is refused whole with one `-32600`.
    pub max_batch: usize,
    /// Bytes of the response to one transport message (a batch counts as one); a larger
    /// answer is replaced by a `-32603` error instead of being sent.
    pub max_response_bytes: usize,
    /// Time one message may take; a slow tool call still running then ends with a tool
    /// error (`isError: true`). Tools' own timeouts are usually shorter.
    pub request_timeout: Duration,
    /// `ttlMs` of cacheable 2026-07-28 results (lists, reads, discovery): how long a client
    /// may reuse them without asking again. A reload also tells listening clients at once.
    pub cache_ttl_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_batch: 64,
            max_response_bytes: 8 << 20,
            request_timeout: Duration::from_secs(300),
            cache_ttl_ms: 0,
        }
    }
}

fn fail<T>(code: i32, msg: impl Into<String>) -> Result<T, Failure> {
    Err((code, msg.into()))
}

/// The `WWW-Authenticate` scopes of a refused call (see [`Handled::forbidden`]).
fn scope_challenge(code: i32, data: Option<&Value>) -> Option<String> {
    (code == protocol::FORBIDDEN).then(|| {
        // Every required scope when some are missing; none when only groups are.
        let names = |field: &str| -> Vec<&str> {
            data.and_then(|d| d.get(field))
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default()
        };
        if names("missingScopes").is_empty() {
            String::new()
        } else {
            names("requiredScopes").join(" ")
        }
    })
}

fn outcome_index(code: i32) -> usize {
    match code {
        PARSE_ERROR => 1,
        INVALID_REQUEST => 2,
        METHOD_NOT_FOUND => 3,
        INVALID_PARAMS | RESOURCE_NOT_FOUND => 4,
        _ => 5,
    }
}

/// The MCP server core: registry, executor, notification fan-out, cancellation.
#[derive(Debug)]
pub struct Server {
    /// The tool registry.
    pub registry: Arc<Registry>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Runs tools.
    pub exec: Executor,
    events: broadcast::Sender<Arc<Event>>,
    /// What the server remembers per session.
    pub sessions: Sessions,
    /// Requests sent to clients, waiting for answers.
    pub pending: Pending,
    cancels: Mutex<CancelMap>,
    next_call: AtomicU64,
    limits: Limits,
    /// Signs 2026-07-28 `requestState`.
    state_key: crate::modern::StateKey,
    /// Resource URIs watched by open `subscriptions/listen` streams.
    watched: Arc<Mutex<FxHashMap<Box<str>, usize>>>,
}

impl Server {
    /// A server over a registry, with the default [`Limits`].
    pub fn new(registry: Arc<Registry>, metrics: Arc<Metrics>) -> Arc<Self> {
        Self::with_limits(registry, metrics, Limits::default())
    }

    /// A server over a registry with the given limits.
    pub fn with_limits(registry: Arc<Registry>, metrics: Arc<Metrics>, limits: Limits) -> Arc<Self> {
        let (events, _) = broadcast::channel(64);
        Arc::new(Self {
            registry,
            metrics,
            exec: Executor::new(),
            events,
            sessions: Sessions::default(),
            pending: Pending::default(),
            cancels: Mutex::new(FxHashMap::default()),
            next_call: AtomicU64::new(0),
            limits,
            state_key: crate::modern::StateKey::random(),
            watched: Arc::default(),
        })
    }

    /// Signs `requestState` with `key` instead of this process's random key: replicas that
    /// share a key accept each other's state.
    #[must_use]
    pub fn with_state_key(self: Arc<Self>, key: crate::modern::StateKey) -> Arc<Self> {
        match Arc::try_unwrap(self) {
            Ok(mut s) => {
                s.state_key = key;
                Arc::new(s)
            }
            Err(shared) => shared,
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Calls registered for cancellation right now (running slow calls that have a session).
    pub fn cancellable_calls(&self) -> usize {
        self.cancels.lock().map_or(0, |m| m.len())
    }

    /// Subscribes to server-to-client notifications (serialized JSON-RPC messages).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.events.subscribe()
    }

    /// Sends a notification to every open stream.
    pub fn notify(&self, method: &str) {
        let kind = match method {
            "notifications/tools/list_changed" => EventKind::ToolsChanged,
            "notifications/prompts/list_changed" => EventKind::PromptsChanged,
            "notifications/resources/list_changed" => EventKind::ResourcesChanged,
            _ => EventKind::Other,
        };
        let _ = self.events.send(Arc::new(Event {
            session: None,
            message: protocol::notification(method).into(),
            kind,
        }));
    }

    /// Handles one transport message: a single JSON-RPC message, or a batch when `batches` is
    /// allowed (protocol 2025-03-26 only).
    pub async fn handle(&self, body: &[u8], ctx: Ctx<'_>, batches: bool) -> Handled {
        let first = body.iter().find(|b| !b.is_ascii_whitespace());
        if first != Some(&b'[') {
            return self.handle_one(body, ctx).await;
        }
        let start = Instant::now();
        let over = Cell::new(false);
        let seed = BoundedBatch {
            max: self.limits.max_batch,
            over: &over,
        };
        let mut de = serde_json::Deserializer::from_slice(body);
        let items = match seed.deserialize(&mut de).and_then(|v| de.end().map(|()| v)) {
            Ok(v) => v,
            Err(_) if over.get() => {
                self.metrics.refused(Refusal::Batch);
                return self.rejected(
                    start,
                    "batch",
                    INVALID_REQUEST,
                    &format!(
                        "Invalid request: a batch may hold at most {} messages",
                        self.limits.max_batch
                    ),
                );
            }
            Err(e) => return self.rejected(start, "batch", PARSE_ERROR, &format!("Parse error: {e}")),
        };
        if !batches {
            return self.rejected(
                start,
                "batch",
                INVALID_REQUEST,
                &format!(
                    "JSON-RPC batches are not supported in protocol version {}",
                    ctx.version
                ),
            );
        }
        if items.is_empty() {
            return self.rejected(start, "batch", INVALID_REQUEST, "empty batch");
        }
        // One deadline for the whole batch: its calls run one after another.
        let deadline = start + self.limits.request_timeout;
        let mut out = Vec::from(&b"["[..]);
        let mut any = false;
        let mut initialized = false;
        let mut client = ClientCaps::default();
        // Calls in a batch run here, one after another: a batch answer is one JSON array.
        let ctx = Ctx { stream: false, ..ctx };
        for item in items {
            let h = Box::pin(self.message(item.get().as_bytes(), ctx, Some(deadline))).await;
            initialized |= h.initialized;
            if h.initialized {
                client = h.client;
            }
            if let Some(b) = h.body {
                if any {
                    out.push(b',');
                }
                out.extend_from_slice(&b);
                any = true;
            }
            if out.len() > self.limits.max_response_bytes {
                self.metrics.refused(Refusal::ResponseBytes);
                return Handled {
                    body: Some(protocol::error_response(
                        None,
                        INTERNAL_ERROR,
                        &format!(
                            "the batch's responses exceed {} bytes; send fewer messages per batch",
                            self.limits.max_response_bytes
                        ),
                    )),
                    initialized,
                    client,
                    ..Handled::default()
                };
            }
        }
        out.push(b']');
        Handled {
            body: any.then_some(out),
            initialized,
            client,
            ..Handled::default()
        }
    }

    fn rejected(&self, start: Instant, method: &str, code: i32, msg: &str) -> Handled {
        self.rejected_as(start, method, code, msg, None)
    }

    /// An invalid message answered with an error; `id` when the message's id could be read
    /// (then it is not `malformed`: the client can match the error to its request).
    fn rejected_as(
        &self,
        start: Instant,
        method: &str,
        code: i32,
        msg: &str,
        id: Option<&RawValue>,
    ) -> Handled {
        self.metrics
            .record(method_index(method), outcome_index(code), start.elapsed());
        Handled {
            body: Some(protocol::error_response(id, code, msg)),
            malformed: id.is_none(),
            ..Handled::default()
        }
    }

    /// Handles one JSON-RPC message.
    pub async fn handle_one(&self, body: &[u8], ctx: Ctx<'_>) -> Handled {
        self.message(body, ctx, None).await
    }

    /// One message; `deadline` is the batch's, or `None` to start the request timeout when a
    /// slow call starts (a single message needs no clock reading on the fast path).
    async fn message(&self, body: &[u8], ctx: Ctx<'_>, deadline: Option<Instant>) -> Handled {
        let start = Instant::now();
        let msg: Incoming<'_> = match serde_json::from_slice(body) {
            Ok(m) => m,
            Err(e) if e.is_data() => {
                return self.rejected_as(
                    start,
                    "invalid",
                    INVALID_REQUEST,
                    &format!("Invalid request: {e}"),
                    protocol::peek_id(body),
                );
            }
            Err(e) => return self.rejected(start, "invalid", PARSE_ERROR, &format!("Parse error: {e}")),
        };
        if msg.jsonrpc.as_deref() != Some("2.0") {
            let id = msg.id.filter(|i| protocol::valid_id(i));
            self.metrics.record(
                method_index("invalid"),
                outcome_index(INVALID_REQUEST),
                start.elapsed(),
            );
            let body = Some(protocol::error_response(
                id,
                INVALID_REQUEST,
                "Invalid request: `jsonrpc` must be \"2.0\"",
            ));
            return Handled {
                body,
                malformed: id.is_none(),
                ..Handled::default()
            };
        }
        let Some(method) = msg.method.as_deref() else {
            if let Some(id) = msg.id
                && (msg.result.is_some() || msg.error.is_some())
            {
                // The answer to a request this server sent (sampling, elicitation). Answers
                // match only requests of the same session; anything else is dropped.
                self.pending.answer(ctx.session, id, msg.result, msg.error);
                self.metrics.record(method_index("response"), 0, start.elapsed());
                return Handled::default();
            }
            let id = msg.id.filter(|i| protocol::valid_id(i));
            return self.rejected_as(
                start,
                "invalid",
                INVALID_REQUEST,
                "Invalid request: no `method`",
                id,
            );
        };
        let Some(id) = msg.id else {
            self.on_notification(method, msg.params, ctx);
            self.metrics
                .record(method_index("notification"), 0, start.elapsed());
            return Handled::default();
        };
        if !protocol::valid_id(id) {
            return self.rejected(
                start,
                "invalid",
                INVALID_REQUEST,
                "Invalid request: `id` must be a string or a number",
            );
        }
        let header = match ctx.era {
            Era::Legacy => None,
            Era::Modern(h) => Some(Some(h)),
            Era::Detect => {
                (method != "initialize" && crate::modern::names_version(msg.params)).then_some(None)
            }
        };
        if let Some(header) = header {
            return self
                .modern_message(method, msg.params, id, header, ctx, deadline, start)
                .await;
        }
        // Decremented on drop: a request future dropped mid-call (client gone) still counts down.
        let inflight = InflightGuard::enter(&self.metrics.inflight);
        let mut out = Vec::with_capacity(256);
        let mut initialized = false;
        let mut client = ClientCaps::default();
        let result = match method {
            "tools/call" => match self
                .call_tool(msg.params, id, ctx, deadline, start, None, &mut out)
                .await
            {
                Ok(Some(d)) => {
                    return Handled {
                        deferred: Some(d),
                        ..Handled::default()
                    };
                }
                Ok(None) => Ok(()),
                Err((c, m, data)) => {
                    if let Some(scopes) = scope_challenge(c, data.as_ref()) {
                        // Written here: the refusal's `data` says what is missing.
                        drop(inflight);
                        protocol::write_error(&mut out, Some(id), c, &m, data.as_ref());
                        self.metrics
                            .record(method_index(method), outcome_index(c), start.elapsed());
                        return Handled {
                            body: Some(out),
                            status: 403,
                            forbidden: Some(scopes),
                            ..Handled::default()
                        };
                    }
                    Err((c, m))
                }
            },
            "tools/list" => self.list(ListKind::Tools, msg.params, id, &mut out),
            "initialize" => self.initialize(msg.params, id, &mut out).map(|caps| {
                initialized = true;
                client = caps;
            }),
            "ping" => {
                protocol::write_result(&mut out, id, b"{}");
                Ok(())
            }
            "resources/list" => self.list(ListKind::Resources, msg.params, id, &mut out),
            "resources/templates/list" => self.list(ListKind::ResourceTemplates, msg.params, id, &mut out),
            "resources/read" => self.read_resource(msg.params, id, &mut out),
            "prompts/list" => self.list(ListKind::Prompts, msg.params, id, &mut out),
            "prompts/get" => self.get_prompt(msg.params, id, &mut out),
            "completion/complete" => self.complete(msg.params, id, &mut out),
            "logging/setLevel" => self.set_level(msg.params, id, ctx, &mut out),
            "resources/subscribe" => self.subscription(msg.params, id, ctx, true, &mut out),
            "resources/unsubscribe" => self.subscription(msg.params, id, ctx, false, &mut out),
            other => fail(METHOD_NOT_FOUND, format!("Method not found: {other}")),
        };
        drop(inflight);
        self.finish(method, id, result, &mut out, start);
        Handled {
            body: Some(out),
            initialized,
            client,
            ..Handled::default()
        }
    }

    /// One request of the stateless revision (2026-07-28): `_meta` is checked, the method
    /// routed, and the result stamped with `resultType`, the server's identity and (for lists,
    /// reads and discovery) cache hints. Errors carry the HTTP status the revision assigns.
    #[allow(clippy::too_many_arguments)]
    async fn modern_message(
        &self,
        method: &str,
        params: Option<&RawValue>,
        id: &RawValue,
        header: Option<&str>,
        ctx: Ctx<'_>,
        deadline: Option<Instant>,
        start: Instant,
    ) -> Handled {
        let inflight = InflightGuard::enter(&self.metrics.inflight);
        let mut out = Vec::with_capacity(256);
        let legacy = |r: Result<(), Failure>| {
            r.map_err(|(c, m)| {
                // 2026-07-28 reports an unknown resource as invalid params.
                let c = if c == RESOURCE_NOT_FOUND {
                    INVALID_PARAMS
                } else {
                    c
                };
                (c, m, None)
            })
        };
        let meta = crate::modern::meta(params, header);
        let mut stamp = Some(false);
        let mut forbidden = None;
        let result: Result<(), crate::modern::Refusal> = match meta {
            Err(r) => Err(r),
            Ok(meta) => match method {
                "server/discover" => {
                    // Written whole, with its cache hints.
                    stamp = None;
                    let snap = self.registry.load();
                    let mut result = snap.discover.to_vec();
                    result.pop();
                    result.extend_from_slice(&crate::modern::cache_fields(self.limits.cache_ttl_ms));
                    result.push(b'}');
                    protocol::write_result(&mut out, id, &result);
                    Ok(())
                }
                "tools/call" => {
                    stamp = None;
                    let retry = params.map(|p| serde_json::from_str::<RetryParams<'_>>(p.get()));
                    match retry {
                        Some(Err(e)) => Err((INVALID_PARAMS, format!("Invalid params: {e}"), None)),
                        retry => {
                            let retry = retry.and_then(Result::ok);
                            let m = ModernArgs {
                                meta,
                                caller: ctx.caller.map_or("", |c| &c.subject),
                                answers: retry.as_ref().and_then(|r| r.input_responses),
                                state: retry.as_ref().and_then(|r| r.request_state.as_deref()),
                            };
                            match self
                                .call_tool(params, id, ctx, deadline, start, Some(m), &mut out)
                                .await
                            {
                                Ok(Some(d)) => {
                                    return Handled {
                                        deferred: Some(d),
                                        ..Handled::default()
                                    };
                                }
                                Ok(None) => Ok(()),
                                Err(e) => {
                                    forbidden = scope_challenge(e.0, e.2.as_ref());
                                    Err(e)
                                }
                            }
                        }
                    }
                }
                "tools/list" | "resources/list" | "resources/templates/list" | "prompts/list" => {
                    stamp = Some(true);
                    let kind = match method {
                        "tools/list" => ListKind::Tools,
                        "resources/list" => ListKind::Resources,
                        "resources/templates/list" => ListKind::ResourceTemplates,
                        _ => ListKind::Prompts,
                    };
                    legacy(self.list(kind, params, id, &mut out))
                }
                "resources/read" => {
                    stamp = Some(true);
                    legacy(self.read_resource(params, id, &mut out)).map_err(|(c, m, _)| {
                        // Name the URI that was not found.
                        let uri = parse_params::<ReadParams<'_>>(params)
                            .ok()
                            .filter(|_| m.starts_with("Resource not found"))
                            .map(|p| json!({"uri": p.uri}));
                        (c, m, uri)
                    })
                }
                "prompts/get" => {
                    stamp = None;
                    match params.map(|p| serde_json::from_str::<RetryParams<'_>>(p.get())) {
                        Some(Err(e)) => Err((INVALID_PARAMS, format!("Invalid params: {e}"), None)),
                        retry => {
                            let retry = retry.and_then(Result::ok);
                            let m = ModernArgs {
                                meta,
                                caller: ctx.caller.map_or("", |c| &c.subject),
                                answers: retry.as_ref().and_then(|r| r.input_responses),
                                state: retry.as_ref().and_then(|r| r.request_state.as_deref()),
                            };
                            self.prompt(params, id, Some(m), &mut out)
                        }
                    }
                }
                "completion/complete" => legacy(self.complete(params, id, &mut out)),
                "subscriptions/listen" => match self.listen(params, id) {
                    Ok(l) => {
                        drop(inflight);
                        self.metrics.record(method_index(method), 0, start.elapsed());
                        return Handled {
                            listen: Some(l),
                            ..Handled::default()
                        };
                    }
                    Err(e) => Err(e),
                },
                m if crate::modern::REMOVED_METHODS.contains(&m) => Err((
                    METHOD_NOT_FOUND,
                    format!("Method not found: {m} is not part of protocol {}", meta.version),
                    None,
                )),
                other => Err((METHOD_NOT_FOUND, format!("Method not found: {other}"), None)),
            },
        };
        drop(inflight);
        let status = self.finish_modern(method, id, result, stamp, &mut out, start);
        Handled {
            body: Some(out),
            status,
            forbidden,
            ..Handled::default()
        }
    }

    /// [`Server::finish`] for 2026-07-28: stamps a result (`stamp`: with cache hints or not;
    /// `None` when the answer is stamped already), writes a refusal with its `data`, and
    /// returns the answer's HTTP status.
    fn finish_modern(
        &self,
        method: &str,
        id: &RawValue,
        result: Result<(), crate::modern::Refusal>,
        stamp: Option<bool>,
        out: &mut Vec<u8>,
        start: Instant,
    ) -> u16 {
        match result {
            Ok(()) => {
                if let Some(cacheable) = stamp {
                    let snap = self.registry.load();
                    if cacheable {
                        let mut f = snap.result_stamp.to_vec();
                        f.extend_from_slice(&crate::modern::cache_fields(self.limits.cache_ttl_ms));
                        crate::modern::stamp(out, &f);
                    } else {
                        crate::modern::stamp(out, &snap.result_stamp);
                    }
                }
                self.finish(method, id, Ok(()), out, start);
                200
            }
            Err((code, message, data)) => {
                out.clear();
                protocol::write_error(out, Some(id), code, &message, data.as_ref());
                self.metrics
                    .record(method_index(method), outcome_index(code), start.elapsed());
                protocol::modern_http_status(code)
            }
        }
    }

    fn listen(&self, params: Option<&RawValue>, id: &RawValue) -> Result<Listen, crate::modern::Refusal> {
        let p: ListenParams = parse_params(params).map_err(|(c, m)| (c, m, None))?;
        let filter = p.notifications.unwrap_or_default();
        if filter.resource_subscriptions.len() > MAX_LISTEN_URIS {
            return Err((
                INVALID_PARAMS,
                format!("Invalid params: a listen may watch at most {MAX_LISTEN_URIS} resources"),
                None,
            ));
        }
        if let Some(u) = filter
            .resource_subscriptions
            .iter()
            .find(|u| u.len() > crate::session::MAX_URI_BYTES)
        {
            return Err((
                INVALID_PARAMS,
                format!(
                    "Invalid params: a resource URI is longer than {} bytes ({}...)",
                    crate::session::MAX_URI_BYTES,
                    u.chars().take(32).collect::<String>()
                ),
                None,
            ));
        }
        let registration = (!filter.resource_subscriptions.is_empty()).then(|| {
            if let Ok(mut w) = self.watched.lock() {
                for u in &filter.resource_subscriptions {
                    *w.entry(u.as_str().into()).or_default() += 1;
                }
            }
            ListenRegistration {
                watched: self.watched.clone(),
                uris: filter.resource_subscriptions.clone(),
            }
        });
        Ok(Listen {
            id: id.to_owned(),
            filter,
            registration,
        })
    }

    /// Bounds the answer's size, turns a failure into its JSON-RPC error, and records the
    /// message's metrics.
    fn finish(
        &self,
        method: &str,
        id: &RawValue,
        result: Result<(), Failure>,
        out: &mut Vec<u8>,
        start: Instant,
    ) {
        let result = match result {
            Ok(()) if out.len() > self.limits.max_response_bytes => {
                self.metrics.refused(Refusal::ResponseBytes);
                fail(
                    INTERNAL_ERROR,
                    format!(
                        "the response ({} bytes) exceeds the server's limit of {} bytes",
                        out.len(),
                        self.limits.max_response_bytes
                    ),
                )
            }
            r => r,
        };
        let outcome = match result {
            Ok(()) => 0,
            Err((code, message)) => {
                out.clear();
                out.shrink_to(256);
                protocol::write_error(out, Some(id), code, &message, None);
                outcome_index(code)
            }
        };
        self.metrics
            .record(method_index(method), outcome, start.elapsed());
    }

    /// Runs a slow tool call that [`Server::handle`] handed back (see [`Ctx::stream`]),
    /// reaching the client through `peer`. Returns the response and its HTTP status, or
    /// `None` when the client cancelled the call (a cancelled request gets no response).
    pub async fn run_deferred(
        &self,
        d: Deferred,
        session: &str,
        peer: Option<&Peer>,
    ) -> Option<(Vec<u8>, u16)> {
        let inflight = InflightGuard::enter(&self.metrics.inflight);
        let cx = CallCtx {
            session,
            peer,
            progress_token: d.progress.as_deref(),
            level: match &d.modern {
                Some(m) => m.level,
                None => Some(self.sessions.level(session)),
            },
            caps: match &d.modern {
                Some(m) => Some(m.inputs.caps),
                None => self.sessions.caps(session),
            },
            inputs: d.modern.as_ref().map(|m| &m.inputs),
            pending: Some(&self.pending),
            dropped: Some(&self.metrics.peer_dropped),
        };
        let result = self
            .run_cancellable(&d.snap, d.index, d.args, session, &d.id, None, &cx)
            .await;
        drop(inflight);
        let Some(o) = result else {
            self.metrics.record(
                method_index("tools/call"),
                outcome_index(protocol::REQUEST_CANCELLED),
                d.start.elapsed(),
            );
            return None;
        };
        let mut out = Vec::with_capacity(256);
        let Some(m) = d.modern else {
            conclude(&d.snap, d.index, &d.id, o, d.start, &mut out);
            self.finish("tools/call", &d.id, Ok(()), &mut out, d.start);
            return Some((out, 200));
        };
        let r = self.conclude_modern(&d.snap, d.index, &d.id, o, *m, d.start, &mut out);
        let status = self.finish_modern("tools/call", &d.id, r, None, &mut out, d.start);
        Some((out, status))
    }

    fn on_notification(&self, method: &str, params: Option<&RawValue>, ctx: Ctx<'_>) {
        // Sessionless calls are never registered, so a sessionless cancel has nothing to match
        // (one client must not cancel another's call by guessing its request id).
        if method == "notifications/cancelled"
            && !ctx.session.is_empty()
            && let Some(p) = params.and_then(|p| serde_json::from_str::<CancelParams<'_>>(p.get()).ok())
        {
            let key = (Box::from(ctx.session), Box::from(p.request_id.get()));
            if let Some((_, token)) = self.cancels.lock().ok().and_then(|mut m| m.remove(&key)) {
                token.cancel();
            }
        }
    }

    fn initialize(
        &self,
        params: Option<&RawValue>,
        id: &RawValue,
        out: &mut Vec<u8>,
    ) -> Result<ClientCaps, Failure> {
        let p: InitializeParams<'_> = parse_params(params)?;
        let version = protocol::supported(&p.protocol_version).unwrap_or(protocol::LATEST_VERSION);
        protocol::write_result(out, id, self.registry.load().initialize_result(version));
        Ok(crate::modern::client_caps(p.capabilities))
    }

    fn set_level(
        &self,
        params: Option<&RawValue>,
        id: &RawValue,
        ctx: Ctx<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), Failure> {
        let p: LevelParams<'_> = parse_params(params)?;
        let Some(level) = LogLevel::parse(&p.level) else {
            return fail(
                INVALID_PARAMS,
                format!(
                    "Invalid params: unknown level `{}` (one of debug, info, notice, warning, error, critical, alert, emergency)",
                    p.level.chars().take(64).collect::<String>()
                ),
            );
        };
        // Without a session there is nowhere to keep the level: such a client gets `info`.
        self.sessions.set_level(ctx.session, level);
        protocol::write_result(out, id, b"{}");
        Ok(())
    }

    fn subscription(
        &self,
        params: Option<&RawValue>,
        id: &RawValue,
        ctx: Ctx<'_>,
        on: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), Failure> {
        let p: ReadParams<'_> = parse_params(params)?;
        if on {
            if find_resource(&self.registry.load(), &p.uri).is_none() {
                return fail(RESOURCE_NOT_FOUND, format!("Resource not found: {}", p.uri));
            }
            self.sessions
                .subscribe(ctx.session, &p.uri)
                .or_else(|e| fail(INVALID_PARAMS, e.to_string()))?;
        } else {
            self.sessions.unsubscribe(ctx.session, &p.uri);
        }
        protocol::write_result(out, id, b"{}");
        Ok(())
    }

    /// Tells every session subscribed to a resource whose contents differ between `old` and
    /// `new` (or that is gone) with `notifications/resources/updated`.
    pub fn resources_updated(&self, old: &Snapshot, new: &Snapshot) {
        for (session, uri) in self.sessions.subscriptions() {
            let before = resource_contents(old, &uri);
            let after = resource_contents(new, &uri);
            if before != after {
                let msg = serde_json::to_string(&json!({
                    "jsonrpc": "2.0",
                    "method": "notifications/resources/updated",
                    "params": {"uri": &*uri},
                }))
                .unwrap_or_default();
                let _ = self.events.send(Arc::new(Event {
                    session: Some(session),
                    message: msg.into(),
                    kind: EventKind::ResourceUpdated(uri.clone()),
                }));
            }
        }
        let watched: Vec<Box<str>> = self
            .watched
            .lock()
            .map(|w| w.keys().cloned().collect())
            .unwrap_or_default();
        for uri in watched {
            if resource_contents(old, &uri) != resource_contents(new, &uri) {
                let _ = self.events.send(Arc::new(Event {
                    session: None,
                    message: Box::from(""),
                    kind: EventKind::ResourceUpdated(uri),
                }));
            }
        }
    }

    fn complete(&self, params: Option<&RawValue>, id: &RawValue, out: &mut Vec<u8>) -> Result<(), Failure> {
        let p: CompleteParams<'_> = parse_params(params)?;
        let snap = self.registry.load();
        let values = match (&*p.reference.kind, &p.reference.name, &p.reference.uri) {
            ("ref/prompt", Some(name), _) => {
                let Some(i) = snap.prompt_index(name) else {
                    return fail(INVALID_PARAMS, format!("Unknown prompt: {name}"));
                };
                snap.config.prompts[i].values.get(&*p.argument.name)
            }
            ("ref/resource", _, Some(uri)) => {
                let Some(r) = snap.config.resources.iter().find(|r| match &r.kind {
                    ResourceKind::Templated { pattern, .. } => pattern.source() == uri.as_ref(),
                    ResourceKind::Static { uri: u, .. } => u == uri.as_ref(),
                }) else {
                    return fail(RESOURCE_NOT_FOUND, format!("Resource not found: {uri}"));
                };
                r.values.get(&*p.argument.name)
            }
            _ => {
                return fail(
                    INVALID_PARAMS,
                    "Invalid params: `ref` must be {type: ref/prompt, name} or {type: ref/resource, uri}",
                );
            }
        };
        let prefix = p.argument.value.to_lowercase();
        let matching: Vec<&String> = values
            .into_iter()
            .flatten()
            .filter(|v| v.to_lowercase().starts_with(&prefix))
            .collect();
        let shown = &matching[..matching.len().min(MAX_COMPLETIONS)];
        let result = json!({"completion": {
            "values": shown,
            "total": matching.len(),
            "hasMore": matching.len() > shown.len(),
        }});
        protocol::write_result(out, id, &serde_json::to_vec(&result).unwrap_or_default());
        Ok(())
    }

    fn list(
        &self,
        kind: ListKind,
        params: Option<&RawValue>,
        id: &RawValue,
        out: &mut Vec<u8>,
    ) -> Result<(), Failure> {
        let cursor = match params {
            Some(_) => parse_params::<CursorParams<'_>>(params)?.cursor,
            None => None,
        };
        let snap = self.registry.load();
        match snap.page(kind, cursor.as_deref()) {
            Some(page) => {
                protocol::write_result(out, id, page);
                Ok(())
            }
            None => fail(
                INVALID_PARAMS,
                "Invalid cursor: not issued by the current list (it may have changed; list again without a cursor)",
            ),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn call_tool(
        &self,
        params: Option<&RawValue>,
        id: &RawValue,
        ctx: Ctx<'_>,
        deadline: Option<Instant>,
        received: Instant,
        modern: Option<ModernArgs<'_>>,
        out: &mut Vec<u8>,
    ) -> Result<Option<Deferred>, crate::modern::Refusal> {
        let p: CallParams<'_> = parse_params(params).map_err(|(c, m)| (c, m, None))?;
        let guard = self.registry.load();
        let Some(index) = guard.tool_index(&p.name) else {
            return Err((INVALID_PARAMS, format!("Unknown tool: {}", p.name), None));
        };
        let args = match p.arguments {
            None => Value::Object(Map::new()),
            Some(v @ Value::Object(_)) => v,
            Some(_) => {
                return Err((
                    INVALID_PARAMS,
                    "Invalid params: `arguments` must be an object".to_owned(),
                    None,
                ));
            }
        };
        let tool = &guard.tools[index];
        // Before the arguments are looked at: a caller that may not call the tool learns
        // nothing from it.
        if let Some(need) = &tool.def.access
            && let Err(denied) = need.check(ctx.caller)
        {
            self.metrics.refused(Refusal::Forbidden);
            return Err((
                protocol::FORBIDDEN,
                denied.message(&tool.def.name),
                Some(json!({
                    "tool": tool.def.name,
                    "missingScopes": denied.missing_scopes,
                    "requiredScopes": denied.required_scopes,
                    "allowedGroups": denied.not_in_groups,
                })),
            ));
        }
        let start = Instant::now();
        let mut problems = Vec::new();
        tool.def.input.validate(&args, &mut problems);
        if !problems.is_empty() {
            let text = format!(
                "Invalid arguments for tool {}: {}",
                tool.def.name,
                problems.join("; ")
            );
            write_tool_result(out, id, &ToolOutput::error(text));
            tool.metrics
                .invalid_arguments(&tool.def.name)
                .observe(start.elapsed());
            if modern.is_some() {
                crate::modern::stamp(out, &guard.result_stamp);
            }
            return Ok(None);
        }
        let modern = match modern {
            None => None,
            Some(m) => Some(Box::new(self.modern_call("tools/call", &p.name, &args, m)?)),
        };
        let progress = match &modern {
            Some(m) => m.progress.clone(),
            None => p.meta.and_then(|m| m.progress_token).map(ToOwned::to_owned),
        };
        let output = match self.exec.run_now(&guard, index, &args) {
            Some(o) => o,
            None => {
                // A slow handler: hold the snapshot by Arc (a reload may swap meanwhile) and
                // make the call cancellable by `notifications/cancelled`.
                let snap: Arc<Snapshot> = arc_swap::Guard::into_inner(guard);
                if ctx.stream {
                    return Ok(Some(Deferred {
                        snap,
                        index,
                        args,
                        id: id.to_owned(),
                        progress,
                        start: received,
                        modern,
                    }));
                }
                let cx = CallCtx {
                    session: ctx.session,
                    level: modern.as_ref().map_or(Some(LogLevel::Info), |m| m.level),
                    caps: modern.as_ref().map(|m| m.inputs.caps),
                    inputs: modern.as_ref().map(|m| &m.inputs),
                    ..CallCtx::DETACHED
                };
                let result = self
                    .run_cancellable(&snap, index, args, ctx.session, id, deadline, &cx)
                    .await;
                return match result {
                    Some(o) => match modern {
                        Some(m) => self
                            .conclude_modern(&snap, index, id, o, *m, start, out)
                            .map(|_| None),
                        None => {
                            conclude(&snap, index, id, o, start, out);
                            Ok(None)
                        }
                    },
                    None => Err((protocol::REQUEST_CANCELLED, "Request cancelled".to_owned(), None)),
                };
            }
        };
        conclude(&guard, index, id, output, start, out);
        if modern.is_some() {
            crate::modern::stamp(out, &guard.result_stamp);
        }
        Ok(None)
    }

    /// Opens a 2026-07-28 call's `requestState` and gathers the answers of its retry.
    fn modern_call(
        &self,
        method: &str,
        name: &str,
        args: &Value,
        m: ModernArgs<'_>,
    ) -> Result<ModernCall, crate::modern::Refusal> {
        let call = crate::modern::CallId::new(method, name, args, m.caller);
        let mut answers = match m.state {
            Some(s) => self
                .state_key
                .open(s, &call)
                .map_err(|e| (INVALID_PARAMS, format!("Invalid params: {e}"), None))?,
            None => Map::new(),
        };
        if let Some(raw) = m.answers {
            match serde_json::from_str::<Value>(raw.get()) {
                Ok(Value::Object(fresh)) => answers.extend(fresh),
                _ => {
                    return Err((
                        INVALID_PARAMS,
                        "Invalid params: `inputResponses` must be an object mapping each input request's key to the client's result".to_owned(),
                        None,
                    ));
                }
            }
        }
        Ok(ModernCall {
            inputs: crate::peer::Inputs::new(m.meta.caps, answers),
            call,
            level: m.meta.level,
            progress: m.meta.progress.map(ToOwned::to_owned),
        })
    }

    /// Ends a 2026-07-28 call: its result, or what its round gathered instead (an
    /// `InputRequiredResult`, a refused answer, a missing capability).
    #[allow(clippy::too_many_arguments)]
    fn conclude_modern(
        &self,
        snap: &Snapshot,
        index: usize,
        id: &RawValue,
        o: ToolOutput,
        m: ModernCall,
        start: Instant,
        out: &mut Vec<u8>,
    ) -> Result<(), crate::modern::Refusal> {
        let round = m.inputs.finish();
        if self.interrupted(round, &m.call, snap, id, out)? {
            let tool = &snap.tools[index];
            tool.metrics.ok(&tool.def.name).observe(start.elapsed());
            return Ok(());
        }
        conclude(snap, index, id, o, start, out);
        crate::modern::stamp(out, &snap.result_stamp);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_cancellable(
        &self,
        snap: &Snapshot,
        index: usize,
        args: Value,
        session: &str,
        id: &RawValue,
        deadline: Option<Instant>,
        cx: &CallCtx<'_>,
    ) -> Option<ToolOutput> {
        // Only a call in a session can be cancelled (`notifications/cancelled` names a
        // request of its own session); a sessionless one needs no token.
        let token = (!session.is_empty()).then(CancellationToken::new);
        // Unregistered on drop, also when the request future is dropped (client gone).
        let _entry = token.as_ref().map(|t| self.register_cancel(session, id, t));
        let cancelled = async {
            match &token {
                Some(t) => t.cancelled().await,
                None => std::future::pending().await,
            }
        };
        let limit = self.limits.request_timeout;
        let deadline = deadline.unwrap_or_else(|| Instant::now() + limit);
        tokio::select! {
            o = self.exec.run(snap, index, args, 0, cx) => Some(o),
            () = cancelled => None,
            () = tokio::time::sleep_until(deadline.into()) => {
                self.metrics.refused(Refusal::RequestTimeout);
                Some(ToolOutput::error(format!(
                    "the call did not finish within the server's request timeout ({})",
                    DisplayDuration(limit)
                )))
            }
        }
    }

    /// A token that `notifications/cancelled` naming `id` in `session` cancels (a stdio
    /// `subscriptions/listen`), registered until the returned entry is dropped.
    pub fn cancel_handle(&self, session: &str, id: &RawValue) -> (CancellationToken, impl Drop + '_) {
        let token = CancellationToken::new();
        let entry = self.register_cancel(session, id, &token);
        (token, entry)
    }

    fn register_cancel(&self, session: &str, id: &RawValue, token: &CancellationToken) -> CancelEntry<'_> {
        let key = (Box::from(session), Box::from(id.get()));
        let seq = self.next_call.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut m) = self.cancels.lock() {
            m.insert(key.clone(), (seq, token.clone()));
        }
        CancelEntry {
            map: &self.cancels,
            key,
            seq,
        }
    }

    fn read_resource(
        &self,
        params: Option<&RawValue>,
        id: &RawValue,
        out: &mut Vec<u8>,
    ) -> Result<(), Failure> {
        let p: ReadParams<'_> = parse_params(params)?;
        let snap = self.registry.load();
        let Some((text, blob, mime)) = resource_contents(&snap, &p.uri) else {
            return fail(RESOURCE_NOT_FOUND, format!("Resource not found: {}", p.uri));
        };
        let text = text.or_else(|e| fail(INVALID_PARAMS, format!("Resource {}: {e}", p.uri)))?;
        let result = if blob {
            if !crate::config::content::is_base64(&text) {
                return fail(
                    INVALID_PARAMS,
                    format!("Resource {}: the blob is not valid base64", p.uri),
                );
            }
            json!({"contents": [{"uri": p.uri, "mimeType": mime, "blob": text}]})
        } else {
            json!({"contents": [{"uri": p.uri, "mimeType": mime, "text": text}]})
        };
        protocol::write_result(out, id, &serde_json::to_vec(&result).unwrap_or_default());
        Ok(())
    }

    fn get_prompt(&self, params: Option<&RawValue>, id: &RawValue, out: &mut Vec<u8>) -> Result<(), Failure> {
        self.prompt(params, id, None, out).map_err(|(c, m, _)| (c, m))
    }

    /// `prompts/get`. A prompt that asks the client questions is served under 2026-07-28
    /// only (`modern`): until every answer is in, the answer is an `InputRequiredResult`.
    /// Stamps its own 2026-07-28 results.
    fn prompt(
        &self,
        params: Option<&RawValue>,
        id: &RawValue,
        modern: Option<ModernArgs<'_>>,
        out: &mut Vec<u8>,
    ) -> Result<(), crate::modern::Refusal> {
        let p: PromptParams<'_> = parse_params(params).map_err(|(c, m)| (c, m, None))?;
        let snap = self.registry.load();
        let Some(i) = snap.prompt_index(&p.name) else {
            return Err((INVALID_PARAMS, format!("Unknown prompt: {}", p.name), None));
        };
        let prompt = &snap.config.prompts[i];
        let stamped = modern.is_some();
        let mut args = Value::Object(p.arguments.unwrap_or_default());
        let missing: Vec<&str> = prompt
            .required
            .iter()
            .filter(|r| args.get(r.as_str()).is_none_or(Value::is_null))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err((
                INVALID_PARAMS,
                format!(
                    "Missing required argument(s) for prompt {}: {}",
                    p.name,
                    missing.join(", ")
                ),
                None,
            ));
        }
        if !prompt.ask.is_empty() {
            let Some(m) = modern else {
                return Err((
                    INVALID_PARAMS,
                    format!(
                        "Prompt {} asks the client for input, which needs protocol 2026-07-28 (input-required results)",
                        p.name
                    ),
                    None,
                ));
            };
            let m = self.modern_call("prompts/get", &p.name, &args, m)?;
            let cx = CallCtx {
                level: None,
                caps: Some(m.inputs.caps),
                inputs: Some(&m.inputs),
                ..CallCtx::DETACHED
            };
            // Under 2026-07-28 asking never waits: answers are in the request or the question
            // is recorded.
            let o = futures_util::FutureExt::now_or_never(crate::handlers::ask_questions(
                &prompt.ask,
                &args,
                &cx,
            ));
            let call = m.call;
            let round = m.inputs.finish();
            if self.interrupted(round, &call, &snap, id, out)? {
                return Ok(());
            }
            match o {
                Some(o) if !o.is_error => {
                    if let Some(obj) = args.as_object_mut() {
                        obj.insert("input".into(), o.structured.unwrap_or(Value::Null));
                    }
                }
                Some(o) => return Err((INVALID_PARAMS, format!("Prompt {}: {}", p.name, o.text), None)),
                None => {
                    return Err((
                        INTERNAL_ERROR,
                        "the prompt's questions did not complete".to_owned(),
                        None,
                    ));
                }
            }
        }
        let mut budget = Budget::new();
        let mut messages = Vec::with_capacity(prompt.messages.len());
        for (role, t) in &prompt.messages {
            let role = match role {
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            let content = t
                .render(&args, &mut budget)
                .map_err(|e| (INVALID_PARAMS, format!("Prompt {}: {e}", p.name), None))?;
            messages.push(json!({"role": role, "content": content}));
        }
        let mut result = json!({"messages": messages});
        if let Some(d) = &prompt.description {
            result["description"] = Value::String(d.clone());
        }
        protocol::write_result(out, id, &serde_json::to_vec(&result).unwrap_or_default());
        if stamped {
            crate::modern::stamp(out, &snap.result_stamp);
        }
        Ok(())
    }

    /// What a 2026-07-28 round gathered instead of a result: a refused answer (`Err`), a
    /// missing capability (`Err`), or questions (an `InputRequiredResult` is written: `true`).
    fn interrupted(
        &self,
        round: crate::peer::Round,
        call: &crate::modern::CallId,
        snap: &Snapshot,
        id: &RawValue,
        out: &mut Vec<u8>,
    ) -> Result<bool, crate::modern::Refusal> {
        if let Some(why) = round.invalid {
            return Err((INVALID_PARAMS, why, None));
        }
        if !round.missing.is_empty() {
            let required: Map<String, Value> = round
                .missing
                .iter()
                .map(|n| (n.capability().to_owned(), json!({})))
                .collect();
            let names: Vec<&str> = round.missing.iter().map(|n| n.capability()).collect();
            return Err((
                protocol::MISSING_CAPABILITY,
                format!(
                    "Missing required client capability: {} (declare it in `io.modelcontextprotocol/clientCapabilities`)",
                    names.join(", ")
                ),
                Some(json!({"requiredCapabilities": required})),
            ));
        }
        if round.asked.is_empty() {
            return Ok(false);
        }
        let state = self.state_key.seal(call, &round.used);
        let result = json!({
            "resultType": "input_required",
            "inputRequests": round.asked,
            "requestState": state,
            "_meta": {"io.modelcontextprotocol/serverInfo": snap.server_info},
        });
        protocol::write_result(out, id, &serde_json::to_vec(&result).unwrap_or_default());
        Ok(true)
    }
}

/// Most values one `completion/complete` answer lists (the protocol's limit).
const MAX_COMPLETIONS: usize = 100;

/// A resource's contents: the text (base64 when the flag says blob, or why it could not be
/// rendered) and its MIME type; `None` when no resource has the URI.
fn resource_contents<'s>(snap: &'s Snapshot, uri: &str) -> Option<(Result<String, String>, bool, &'s str)> {
    let (r, vars) = find_resource(snap, uri)?;
    let mime = r.mime_type.as_str();
    Some(match (&r.kind, vars) {
        (ResourceKind::Static { text, blob, .. }, _) => (Ok(text.clone()), *blob, mime),
        (ResourceKind::Templated { text, blob, .. }, vars) => (
            text.render(&vars.unwrap_or(Value::Null))
                .map_err(|e| e.to_string()),
            *blob,
            mime,
        ),
    })
}

/// The resource a URI names, with the URI template's variables when it matched one (nothing
/// is rendered).
fn find_resource<'s>(
    snap: &'s Snapshot,
    uri: &str,
) -> Option<(&'s crate::config::CompiledResource, Option<Value>)> {
    let resources = &snap.config.resources;
    if let Some(i) = snap.static_resource(uri) {
        return Some((&resources[i], None));
    }
    resources.iter().find_map(|r| match &r.kind {
        ResourceKind::Templated { pattern, .. } => pattern.matches(uri).map(|vars| (r, Some(vars))),
        ResourceKind::Static { .. } => None,
    })
}

/// A slow tool call handed back to the transport (see [`Ctx::stream`]): everything it needs,
/// owned, so the transport can run it where it streams the answer.
#[derive(Debug)]
pub struct Deferred {
    snap: Arc<Snapshot>,
    index: usize,
    args: Value,
    id: Box<RawValue>,
    progress: Option<Box<RawValue>>,
    start: Instant,
    modern: Option<Box<ModernCall>>,
}

/// What `tools/call` gets from a 2026-07-28 request besides the call itself.
struct ModernArgs<'a> {
    meta: crate::modern::Meta<'a>,
    /// The caller's [`Principal::subject`] (empty: not known), which `requestState` is bound to.
    caller: &'a str,
    answers: Option<&'a RawValue>,
    state: Option<&'a str>,
}

/// A 2026-07-28 call in progress: the round's questions and answers, what its state is
/// bound to, and the per-request log level and progress token.
#[derive(Debug)]
struct ModernCall {
    inputs: crate::peer::Inputs,
    call: crate::modern::CallId,
    level: Option<LogLevel>,
    progress: Option<Box<RawValue>>,
}

/// A server-to-client notification for the open streams.
#[derive(Debug)]
pub struct Event {
    /// The session whose streams get it; `None`: every stream.
    pub session: Option<Box<str>>,
    /// The serialized JSON-RPC notification (as handshake-era streams carry it).
    pub message: Box<str>,
    /// What happened (how `subscriptions/listen` streams filter and tag it).
    pub kind: EventKind,
}

/// What an [`Event`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// The tool list changed.
    ToolsChanged,
    /// The prompt list changed.
    PromptsChanged,
    /// The resource list changed.
    ResourcesChanged,
    /// A resource's contents changed (or it is gone).
    ResourceUpdated(Box<str>),
    /// Anything else.
    Other,
}

impl Event {
    /// Whether a handshake-era stream of `session` should carry this event. Resource updates
    /// for 2026-07-28 listens (no session) go to listens only.
    pub fn is_for(&self, session: &str) -> bool {
        match &self.session {
            Some(s) => &**s == session,
            None => !matches!(self.kind, EventKind::ResourceUpdated(_)),
        }
    }
}

/// Decrements the in-flight gauge when dropped.
struct InflightGuard<'a>(&'a Gauge<i64, AtomicI64>);

impl<'a> InflightGuard<'a> {
    #[inline]
    fn enter(g: &'a Gauge<i64, AtomicI64>) -> Self {
        g.inc();
        Self(g)
    }
}

impl Drop for InflightGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A call's entry in the cancellation map, removed when dropped (unless a newer call with the
/// same key replaced it, or a cancel already took it).
struct CancelEntry<'a> {
    map: &'a Mutex<CancelMap>,
    key: (Box<str>, Box<str>),
    seq: u64,
}

impl Drop for CancelEntry<'_> {
    fn drop(&mut self) {
        if let Ok(mut m) = self.map.lock()
            && m.get(&self.key).is_some_and(|(seq, _)| *seq == self.seq)
        {
            m.remove(&self.key);
        }
    }
}

/// Reads a batch's elements as raw messages, failing (and setting `over`) past `max` of them,
/// so an oversized batch is refused before its element list is built.
struct BoundedBatch<'c> {
    max: usize,
    over: &'c Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for BoundedBatch<'_> {
    type Value = Vec<&'de RawValue>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for BoundedBatch<'_> {
    type Value = Vec<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-RPC batch (an array of messages)")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(8).min(self.max));
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            if items.len() == self.max {
                self.over.set(true);
                return Err(serde::de::Error::custom("batch too long"));
            }
            items.push(item);
        }
        Ok(items)
    }
}

/// `300s`, `1.5s`, `250ms`.
struct DisplayDuration(Duration);

impl fmt::Display for DisplayDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.subsec_millis() == 0 {
            write!(f, "{}s", self.0.as_secs())
        } else if self.0 < Duration::from_secs(1) {
            write!(f, "{}ms", self.0.as_millis())
        } else {
            write!(f, "{}s", self.0.as_secs_f64())
        }
    }
}

fn parse_params<'a, T: Deserialize<'a>>(params: Option<&'a RawValue>) -> Result<T, Failure> {
    let Some(p) = params else {
        return fail(INVALID_PARAMS, "Invalid params: `params` is required");
    };
    serde_json::from_str(p.get()).map_err(|e| (INVALID_PARAMS, format!("Invalid params: {e}")))
}

fn write_tool_result(out: &mut Vec<u8>, id: &RawValue, o: &ToolOutput) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.get().as_bytes());
    out.extend_from_slice(b",\"result\":");
    o.write_json(out);
    out.push(b'}');
}

/// Checks a call's result against the tool's output schema, writes the response and records
/// the call's duration by outcome.
#[inline]
fn conclude(snap: &Snapshot, index: usize, id: &RawValue, o: ToolOutput, start: Instant, out: &mut Vec<u8>) {
    let o = check_output(snap, index, o);
    write_tool_result(out, id, &o);
    observe(&snap.tools[index], &o, start);
}

#[inline]
fn observe(tool: &crate::registry::Tool, o: &ToolOutput, start: Instant) {
    let h = if o.is_error {
        tool.metrics.tool_error(&tool.def.name)
    } else {
        tool.metrics.ok(&tool.def.name)
    };
    h.observe(start.elapsed());
}
