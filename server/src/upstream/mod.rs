//! Connections to upstream MCP servers (the `upstreams:` of a ToolSet): a [`Link`] per
//! upstream, kept by the [`Hub`] across reloads for as long as its connection settings stay
//! the same, so a change of `tools:` (filters, names) never restarts or reconnects it.
//!
//! A link keeps its upstream's tool list. When that list changes (the first connect, an
//! upstream `notifications/tools/list_changed`, a restarted process that lists other tools)
//! the hub signals the reloader, which builds the next registry generation from the same
//! config and the new lists: the same snapshot swap as a config reload, and clients get
//! `notifications/tools/list_changed`.
//!
//! Every byte from an upstream is untrusted: messages are bounded
//! (`maxMessageBytes`), every request has a time limit, calls in flight per link are
//! bounded, a process that breaks the protocol is restarted (with backoff), and an
//! upstream's tool list is validated like a ToolSet's (see
//! [`crate::config::upstream::CompiledUpstream::import`]).

pub mod bridge;
#[allow(unsafe_code)]
// recv(2) with MSG_PEEK to probe an idle connection: the unsafe block states its contract
mod h1;
#[cfg(feature = "kube")]
mod pin_store;
pub mod pins;

#[cfg(feature = "kube")]
pub use pin_store::keep_in_configmap as keep_pins_in_configmap;
mod offers;
mod relay;
mod remote;
mod sse;
mod stdio;
mod tasks;

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use rustc_hash::{FxHashMap, FxHashSet, FxHasher};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::config::compiled::CompiledToolSet;
use crate::config::guards::{GuardAction, Verdict};
use crate::config::upstream::{CompiledUpstream, ImportReport, MAX_UPSTREAM_TOOLS, Transport};
use crate::guard::Scan;
use crate::metrics::{Metrics, UpstreamMetrics};
use crate::net::http::HttpClient;
use crate::peer::CallCtx;
use crate::protocol::output::ToolOutput;
use crate::secrets::Secrets;
use crate::spec::context::SecretRef;
use crate::spec::shared::LogLevel;

/// Requests in flight per link (per process for stdio); more are refused at once.
pub const MAX_IN_FLIGHT: usize = 1024;
/// An upstream's tools are listed at most this often, however many `list_changed` it sends.
const RELIST_INTERVAL: Duration = Duration::from_millis(250);
/// Longest error text shown per upstream on `/status` (and passed to the operator).
const MAX_STATUS_ERROR: usize = 512;
/// Longest line of an upstream's stderr or log message logged, in characters.
const MAX_LOG_CHARS: usize = 2048;
/// Longest string of an upstream's `serverInfo` kept.
const MAX_INFO_CHARS: usize = 256;
/// Longest reason shown per skipped tool on `/status`.
const MAX_STATUS_REASON: usize = 256;
/// Reasons for tools not served shown per upstream on `/status`.
const MAX_SKIPPED_SHOWN: usize = 20;
/// Entries of an upstream's tool list kept (valid or not): twice what can be imported.
const MAX_LISTED: usize = 2 * MAX_UPSTREAM_TOOLS;
/// Pages of `tools/list` read from an upstream before its list is taken as complete.
const MAX_LIST_PAGES: usize = 100;
/// The protocol version asked for in `initialize`.
const PROTOCOL_VERSION: &str = "2025-06-18";
/// Versions an upstream may answer with.
const UPSTREAM_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
/// First and longest wait before reconnecting or restarting.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(30));

/// Why a request to an upstream failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// No answer within the upstream's `timeout`.
    Timeout(Duration),
    /// Not connected, or the connection or process went away.
    Down(String),
    /// The upstream answered with a JSON-RPC error.
    Rpc(i64, String),
    /// The upstream answered something that is not MCP.
    Protocol(String),
    /// Too many requests in flight.
    Busy,
    /// Answered `401` to a request that carried a caller's credential (`identity`): the
    /// credential was refused.
    Unauthorized,
    /// The result guard withheld the answer (its refusal).
    Withheld(String),
    /// 2026-07-28: the upstream refused a plain call of a tool it runs only as a task
    /// (`-32021` naming the tasks extension); the message is its.
    NeedsTask(String),
    /// 2026-07-28: the upstream's question goes to the client in an input round, so the call
    /// ends here (the client's retry makes it again, and the answer is then at hand). Not a
    /// failure of the upstream's.
    Asked,
}

impl CallError {
    /// The metric label of the error.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "timeout",
            Self::Down(_) => "down",
            Self::Rpc(..) | Self::NeedsTask(_) => "rpc_error",
            Self::Protocol(_) => "protocol",
            Self::Busy => "busy",
            Self::Unauthorized => "unauthorized",
            Self::Withheld(_) => "withheld",
            Self::Asked => "asked",
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Timeout(d) => write!(f, "no answer within {d:?}"),
            Self::Down(why) => write!(f, "not available: {why}"),
            Self::Rpc(code, msg) => write!(f, "error {code}: {msg}"),
            Self::NeedsTask(msg) => write!(f, "error {}: {msg}", crate::protocol::MISSING_CAPABILITY),
            Self::Protocol(why) => write!(f, "broke the protocol: {why}"),
            Self::Busy => write!(f, "{MAX_IN_FLIGHT} requests are already in flight"),
            Self::Unauthorized => write!(f, "refused the caller's credential (HTTP 401)"),
            Self::Withheld(why) => f.write_str(why),
            Self::Asked => f.write_str("the client is asked first"),
        }
    }
}

/// A JSON-RPC message from an upstream, sorted.
#[derive(Debug)]
enum Message {
    /// The answer to one of our requests.
    Response(u64, Result<Value, CallError>),
    /// A request of the upstream's: id, method and params (`ping` is answered, a question to
    /// a call's client relayed, anything else refused).
    Request(Value, String, Value),
    /// A notification.
    Notification(String, Value),
}

fn classify(mut v: Value) -> Result<Message, String> {
    let Some(obj) = v.as_object_mut() else {
        return Err("a message that is not a JSON object".into());
    };
    let method = obj.get("method").and_then(Value::as_str).map(str::to_owned);
    match (method, obj.remove("id")) {
        (Some(m), None) => Ok(Message::Notification(
            m,
            obj.remove("params").unwrap_or(Value::Null),
        )),
        (Some(m), Some(id)) => Ok(Message::Request(
            id,
            m,
            obj.remove("params").unwrap_or(Value::Null),
        )),
        (None, Some(id)) => {
            let id = id.as_u64().ok_or("a response to a request id we never sent")?;
            if let Some(result) = obj.remove("result") {
                return Ok(Message::Response(id, Ok(result)));
            }
            let err = obj.get("error").ok_or("a response without result or error")?;
            let code = err.get("code").and_then(Value::as_i64).unwrap_or(0);
            let msg = err
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("no message")
                .chars()
                .take(1024)
                .collect();
            let extensions = err.pointer("/data/requiredCapabilities/extensions");
            if code == i64::from(crate::protocol::MISSING_CAPABILITY)
                && extensions.is_some_and(|e| e.get(tasks::EXTENSION).is_some())
            {
                return Ok(Message::Response(id, Err(CallError::NeedsTask(msg))));
            }
            Ok(Message::Response(id, Err(CallError::Rpc(code, msg))))
        }
        (None, None) => Err("a message without method or id".into()),
    }
}

/// The answer to a request of the upstream's: `ping` is answered, everything else (sampling,
/// elicitation, roots) is not forwarded to clients.
fn answer(id: Value, method: &str) -> Value {
    if method == "ping" {
        json!({"jsonrpc": "2.0", "id": id, "result": {}})
    } else {
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": format!("quiver-server does not forward `{}` from upstream servers", method.chars().take(64).collect::<String>())}})
    }
}

/// What arrives on a call's own HTTP answer stream for its client: log notifications, passed
/// on in order with the rest of the stream (`log`; `None`: not wanted, they are logged here),
/// and the upstream's questions to the client (`ask`: elicitation, sampling, roots), relayed
/// (`None`: refused).
#[derive(Clone, Copy, Default)]
pub(crate) struct LogSink<'a> {
    pub log: Option<&'a (dyn Fn(&Value) + Sync)>,
    pub ask: Option<&'a (dyn Fn(String, Value) -> relay::Asking<'a> + Sync)>,
    /// What the client of the call declared it answers (`None`: not known, so asked
    /// anyway), declared to a 2026-07-28 upstream in the request's `_meta` when questions
    /// are relayed.
    pub caps: Option<crate::session::ClientCaps>,
    /// 2026-07-28: the tasks extension is declared, so the upstream may answer with a task
    /// (this server follows it).
    pub tasks: bool,
}

impl LogSink<'_> {
    /// Nothing for a client: logs are logged, questions refused.
    pub(crate) const NONE: Self = Self {
        log: None,
        ask: None,
        caps: None,
        tasks: false,
    };
}

/// Unregisters a progress token however the call ends.
struct Registered<'a>(&'a Shared, u64);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.1);
    }
}

/// Requests waiting for their answers, by id.
#[derive(Debug, Default)]
struct Waiters(Mutex<FxHashMap<u64, oneshot::Sender<Result<Value, CallError>>>>);

impl Waiters {
    fn add(&self, id: u64) -> Result<oneshot::Receiver<Result<Value, CallError>>, CallError> {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if m.len() >= MAX_IN_FLIGHT {
            return Err(CallError::Busy);
        }
        let (tx, rx) = oneshot::channel();
        m.insert(id, tx);
        Ok(rx)
    }

    /// Hands an answer to its waiter; false when nobody waits for that id.
    fn answer(&self, id: u64, r: Result<Value, CallError>) -> bool {
        let w = self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
        w.is_some_and(|tx| tx.send(r).is_ok())
    }

    fn forget(&self, id: u64) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
    }

    /// Fails every waiting request (the connection or process is gone).
    fn fail_all(&self, why: &str) {
        let all: Vec<_> = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .collect();
        for (_, tx) in all {
            let _ = tx.send(Err(CallError::Down(why.to_owned())));
        }
    }
}

/// A JSON-RPC request, serialized without copying its params.
fn envelope<P: serde::Serialize + ?Sized>(id: u64, method: &str, params: &P) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Request<'a, P: ?Sized> {
        jsonrpc: &'static str,
        id: u64,
        method: &'a str,
        params: &'a P,
    }
    serde_json::to_vec(&Request {
        jsonrpc: "2.0",
        id,
        method,
        params,
    })
    .unwrap_or_default()
}

/// The `initialize` request's params. `relays`: the upstream's questions during a call are
/// relayed to the call's client (HTTP), so the capabilities to ask them are declared (a
/// client that lacks one gets the question refused, and the upstream the reason); `roots`
/// too (a session of one caller's own).
fn initialize_params(relays: bool, roots: bool) -> Value {
    let mut capabilities = json!({});
    if relays {
        capabilities = json!({"elicitation": {"form": {}, "url": {}}, "sampling": {}});
        if roots {
            capabilities["roots"] = json!({});
        }
    }
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": capabilities,
        "clientInfo": {"name": "quiver-server", "version": env!("CARGO_PKG_VERSION")},
    })
}

/// Checks an `initialize` result: its protocol version, server info, and what it offers
/// besides tools ([`offers::offered`]).
fn check_initialized(r: &Value) -> Result<(String, Value, u8), CallError> {
    let v = r
        .get("protocolVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| CallError::Protocol("an initialize result without protocolVersion".into()))?;
    if !UPSTREAM_VERSIONS.contains(&v) {
        return Err(CallError::Protocol(format!(
            "protocol version `{}` is not one quiver-server speaks",
            v.chars().take(32).collect::<String>()
        )));
    }
    let info = bounded_info(r.get("serverInfo").cloned().unwrap_or(Value::Null));
    Ok((v.to_owned(), info, offers::offered(r)))
}

/// An upstream's `serverInfo`, or null when it is nested too deep or too large to keep.
fn bounded_info(info: Value) -> Value {
    if crate::template::depth(&info) <= 4 && info.to_string().len() <= 4096 {
        info
    } else {
        Value::Null
    }
}

/// Scrubs every string of an upstream's JSON value in place (see [`Secrets::scrub`]).
fn scrub_strings(secrets: &Secrets, v: &mut Value) {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => *s = secrets.scrub(s, MAX_INFO_CHARS),
            Value::Array(a) => stack.extend(a.iter_mut()),
            Value::Object(o) => stack.extend(o.values_mut()),
            _ => {}
        }
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What `/status` shows of a link.
#[derive(Debug, Clone)]
struct Health {
    state: &'static str,
    error: Option<String>,
    /// The most recent failure, kept after a recovery: an upstream that flaps (ready, then
    /// broken again) shows why even while it is momentarily up.
    last_error: Option<(String, u64)>,
    since_unix: u64,
    restarts: u64,
    connections: usize,
    protocol_version: Option<String>,
    server_info: Value,
}

/// What a link shares with its connection tasks.
#[derive(Debug)]
struct Shared {
    name: String,
    timeout: Duration,
    max_bytes: usize,
    health: Mutex<Health>,
    /// Signalled when the tool list must be read again.
    relist: Notify,
    metrics: UpstreamMetrics,
    secrets: Arc<Secrets>,
    /// The Secret values the connection uses.
    refs: Vec<SecretRef>,
    stop: CancellationToken,
    next_id: AtomicU64,
    /// Calls waiting for progress, by the progress token sent upstream.
    progress: Mutex<FxHashMap<u64, mpsc::Sender<Value>>>,
    /// Lines of the upstream's stderr and log notifications this server logs per second.
    log_budget: LogBudget,
    /// What its `initialize` said it offers besides tools ([`offers::RESOURCES`], ...).
    offered: std::sync::atomic::AtomicU8,
    /// Counts its handshakes (a new session or process forgets subscriptions).
    epoch: AtomicU64,
    /// Its resource URIs clients subscribed to, and where their updates go.
    watches: offers::Watches,
    /// Whether it is spoken to in 2026-07-28 (no session; notifications by listen).
    stateless: std::sync::atomic::AtomicBool,
    /// What of its offers the config imports ([`offers::RESOURCES`], [`offers::PROMPTS`]).
    wants: u8,
    /// Signalled when a 2026-07-28 listen must be opened again (it watches other URIs).
    relisten: Notify,
    /// Places for the upstream's tasks calls are following ([`tasks::MAX_FOLLOWED`]).
    followed: tokio::sync::Semaphore,
    /// The arguments its tools declare with `x-mcp-header`, by its own tool names: a
    /// 2026-07-28 call mirrors them into `Mcp-Param-*` headers (empty for most upstreams).
    param_headers: ArcSwap<ParamHeaders>,
}

/// Per tool name, (property, lower-case `mcp-param-*` header name).
type ParamHeaders = FxHashMap<Box<str>, Box<[(Box<str>, Box<str>)]>>;

/// The `x-mcp-header` declarations of an upstream's listed tools, those that have any.
fn param_headers(tools: &[Value]) -> ParamHeaders {
    tools
        .iter()
        .filter_map(|t| {
            let name = t.get("name")?.as_str()?;
            let declared = crate::schema::declared_param_headers(t.get("inputSchema")?);
            (!declared.is_empty()).then(|| (name.into(), declared.into_boxed_slice()))
        })
        .collect()
}

/// At most [`LOG_LINES_PER_SECOND`] lines (or other messages) per second per upstream; the
/// rest are dropped (and counted in one line when the next second starts).
#[derive(Debug)]
struct LogBudget(Mutex<(u64, u32, u64)>, &'static str);

impl Default for LogBudget {
    fn default() -> Self {
        Self::new("log lines")
    }
}

/// Log lines per second and upstream.
const LOG_LINES_PER_SECOND: u32 = 50;

impl LogBudget {
    /// A budget of `what` (named when some are dropped).
    fn new(what: &'static str) -> Self {
        Self(Mutex::default(), what)
    }

    fn take(&self) -> bool {
        let now = now_unix();
        let mut g = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (second, used, dropped) = &mut *g;
        if *second != now {
            if *dropped > 0 {
                tracing::warn!(
                    dropped = *dropped,
                    "upstream {} dropped (over {LOG_LINES_PER_SECOND}/s)",
                    self.1
                );
            }
            *second = now;
            *used = 0;
            *dropped = 0;
        }
        if *used >= LOG_LINES_PER_SECOND {
            *dropped += 1;
            return false;
        }
        *used += 1;
        true
    }
}

impl Shared {
    /// Fails naming the first Secret value the connection needs that is not loaded (a
    /// process is not started, a request not sent, without its credentials).
    fn secrets_ready(&self) -> Result<(), CallError> {
        match self.secrets.unavailable(&self.refs) {
            None => Ok(()),
            Some(why) => Err(CallError::Down(why)),
        }
    }

    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn set_health(&self, f: impl FnOnce(&mut Health)) {
        let mut h = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        let before = h.state;
        f(&mut h);
        // What the upstream said is kept, logged and shown only redacted and bounded.
        if let Some(e) = h.error.take() {
            h.error = Some(self.secrets.scrub(&e, MAX_STATUS_ERROR));
        }
        scrub_strings(&self.secrets, &mut h.server_info);
        if let Some(e) = &h.error
            && h.last_error.as_ref().is_none_or(|(last, _)| last != e)
        {
            h.last_error = Some((e.clone(), now_unix()));
        }
        if h.state != before {
            h.since_unix = now_unix();
            match (h.state, &h.error) {
                ("down", Some(e)) => tracing::warn!(upstream = %self.name, error = %e, "upstream down"),
                (state, _) => tracing::info!(upstream = %self.name, state, "upstream state"),
            }
        }
        self.metrics.up.set(i64::from(h.state == "ready"));
        self.metrics.connections.set(h.connections as i64);
    }

    /// Reacts to an upstream notification.
    fn notified(&self, method: &str, params: &Value) {
        match method {
            "notifications/tools/list_changed"
            | "notifications/resources/list_changed"
            | "notifications/prompts/list_changed" => self.relist.notify_one(),
            "notifications/resources/updated" => {
                if let Some(uri) = params.get("uri").and_then(Value::as_str) {
                    self.watches.updated(&self.name, uri);
                }
            }
            "notifications/progress" => {
                let token = params.get("progressToken").and_then(Value::as_u64);
                let progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(tx) = token.and_then(|t| progress.get(&t)) {
                    // A slow client loses progress, never the call.
                    let _ = tx.try_send(params.clone());
                }
            }
            "notifications/message" if self.log_budget.take() => {
                let text = match params.get("data") {
                    Some(v) => self.secrets.scrub_json(v, MAX_LOG_CHARS),
                    None => String::new(),
                };
                tracing::info!(upstream = %self.name, message = %text, "upstream log");
            }
            _ => {}
        }
    }
}

#[derive(Clone)]
enum Conn {
    Stdio(Arc<stdio::Pool>),
    Http(Arc<remote::Remote>),
    /// One process of a stdio pool, for requests about a task it holds (a task lives in
    /// the process that made it).
    Pinned(Arc<stdio::Pool>, Arc<stdio::Proc>),
}

impl Conn {
    async fn request<P: serde::Serialize + Sync + ?Sized>(
        &self,
        method: &str,
        params: &P,
        log: LogSink<'_>,
        auth: Option<&http::HeaderValue>,
    ) -> Result<Value, CallError> {
        match self {
            Self::Stdio(p) => p.request(method, params).await,
            Self::Http(r) => r.request(method, params, log, auth).await,
            Self::Pinned(pool, p) => pool.request_on(p, method, params).await,
        }
    }
}

/// A list (of tools, resources, templates or prompts) as an upstream listed it, and its
/// hash.
#[derive(Debug, Default)]
struct Listed {
    /// Whether the upstream listed it yet (the default is the empty list before).
    read: bool,
    /// The entries.
    tools: Vec<Value>,
    hash: u64,
    /// The list was longer than is kept (entries or bytes).
    cut: bool,
}

/// One upstream's connection (or processes), its tool list and its health.
pub struct Link {
    /// The upstream's name.
    pub name: String,
    /// [`CompiledUpstream::key`].
    pub key: u64,
    /// Secret values its connection uses (redacted from results).
    pub secrets: Vec<SecretRef>,
    /// The caller's credential its tool calls carry (`None`: the server's own).
    identity: Option<crate::spec::identity::Identity>,
    shared: Arc<Shared>,
    conn: Conn,
    listed: ArcSwap<Listed>,
    /// Its resources, resource templates and prompts, as it lists them (each empty unless
    /// imported and offered).
    offers: [ArcSwap<Listed>; 3],
    /// What of its offers the config imports ([`offers::RESOURCES`], [`offers::PROMPTS`]).
    wants: u8,
    report: Mutex<ImportReport>,
    /// The result guard of its tools, as the config serving now says: the log and progress
    /// notifications of a call pass through it too.
    guard: arc_swap::ArcSwapOption<crate::config::guards::ResultGuard>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Link {
    fn start(
        u: &CompiledUpstream,
        http: &HttpClient,
        secrets: &Arc<Secrets>,
        metrics: &Metrics,
        (changed, updated): (&Arc<Notify>, &offers::OnUpdate),
    ) -> Arc<Self> {
        let wants = if u.imports_resources() {
            offers::RESOURCES
        } else {
            0
        } | if u.imports_prompts() { offers::PROMPTS } else { 0 };
        let shared = Arc::new(Shared {
            name: u.name.clone(),
            timeout: u.timeout,
            max_bytes: u.max_message_bytes,
            health: Mutex::new(Health {
                state: "starting",
                error: None,
                last_error: None,
                since_unix: now_unix(),
                restarts: 0,
                connections: 0,
                protocol_version: None,
                server_info: Value::Null,
            }),
            relist: Notify::new(),
            metrics: metrics.upstream(&u.name),
            secrets: Arc::clone(secrets),
            refs: u.secrets.clone(),
            stop: CancellationToken::new(),
            next_id: AtomicU64::new(1),
            progress: Mutex::default(),
            log_budget: LogBudget::default(),
            offered: std::sync::atomic::AtomicU8::new(0),
            epoch: AtomicU64::new(0),
            watches: offers::Watches::new(updated),
            stateless: std::sync::atomic::AtomicBool::new(false),
            wants,
            relisten: Notify::new(),
            followed: tokio::sync::Semaphore::new(tasks::MAX_FOLLOWED),
            param_headers: ArcSwap::default(),
        });
        let conn = match &u.transport {
            Transport::Stdio { .. } => Conn::Stdio(stdio::Pool::start(&shared, &u.transport)),
            Transport::Http { .. } => Conn::Http(remote::Remote::start(
                &shared,
                &u.transport,
                u.revision,
                http.clone(),
            )),
        };
        let link = Arc::new(Self {
            name: u.name.clone(),
            key: u.key,
            secrets: u.secrets.clone(),
            identity: u.identity.clone(),
            shared,
            conn,
            listed: ArcSwap::default(),
            offers: Default::default(),
            wants,
            report: Mutex::default(),
            guard: arc_swap::ArcSwapOption::new(u.result_guard.clone()),
        });
        Self::relist_on_change(&link, Arc::clone(changed));
        link
    }

    /// Lists the upstream again whenever it is told to (a first connect, a `list_changed`),
    /// at most every [`RELIST_INTERVAL`], and tells the reloader (`changed`) when a list
    /// differs; until the link is stopped or dropped.
    fn relist_on_change(link: &Arc<Self>, changed: Arc<Notify>) {
        let weak = Arc::downgrade(link);
        let stop = link.shared.stop.clone();
        tokio::spawn(async move {
            loop {
                let Some(relist) = weak.upgrade().map(|l| Arc::clone(&l.shared)) else {
                    return;
                };
                tokio::select! {
                    () = relist.relist.notified() => {}
                    () = stop.cancelled() => return,
                }
                drop(relist);
                let Some(link) = weak.upgrade() else { return };
                // The whole list within a few request timeouts (per list), and never after
                // the link was removed.
                let deadline = link
                    .shared
                    .timeout
                    .saturating_mul(4 * (1 + link.wants.count_ones()));
                let listed = tokio::select! {
                    l = tokio::time::timeout(deadline, link.list_all()) => l.unwrap_or_else(|_| {
                        tracing::warn!(upstream = %link.name, "listing took over {deadline:?}; keeping the last lists");
                        false
                    }),
                    () = stop.cancelled() => return,
                };
                drop(link);
                if listed {
                    changed.notify_one();
                }
                // An upstream that keeps announcing changes is listed at most this often.
                tokio::select! {
                    () = tokio::time::sleep(RELIST_INTERVAL) => {}
                    () = stop.cancelled() => return,
                }
            }
        });
    }

    /// Sends a request and waits for its answer (within the upstream's timeout).
    async fn request<P: serde::Serialize + Sync + ?Sized>(
        &self,
        method: &str,
        params: &P,
        log: LogSink<'_>,
    ) -> Result<Value, CallError> {
        self.request_as(method, params, log, None).await
    }

    /// [`Self::request`] with the `Authorization` of the caller's identity instead of the
    /// configured one (`auth`; never sent to a stdio upstream, which `identity` refuses).
    async fn request_as<P: serde::Serialize + Sync + ?Sized>(
        &self,
        method: &str,
        params: &P,
        log: LogSink<'_>,
        auth: Option<&http::HeaderValue>,
    ) -> Result<Value, CallError> {
        self.conn.request(method, params, log, auth).await
    }

    /// The credential its tool calls carry as their caller (`None`: the server's own).
    pub fn identity(&self) -> Option<&crate::spec::identity::Identity> {
        self.identity.as_ref()
    }

    /// Reads the upstream's tool list and what else of its offers is imported; true when
    /// one of them differs from the last.
    async fn list_all(&self) -> bool {
        self.resubscribe().await;
        let mut changed = self.list(&self.listed, "tools/list", "tools").await;
        if changed {
            let declared = param_headers(&self.listed.load().tools);
            self.shared.param_headers.store(Arc::new(declared));
        }
        let offered = self.shared.offered.load(Ordering::Relaxed) & self.wants;
        let lists = [
            (offers::RESOURCES, "resources/list", "resources"),
            (offers::RESOURCES, "resources/templates/list", "resourceTemplates"),
            (offers::PROMPTS, "prompts/list", "prompts"),
        ];
        for (slot, (bit, method, field)) in self.offers.iter().zip(lists) {
            if offered & bit != 0 {
                changed |= self.list(slot, method, field).await;
            } else if slot.load().read || !slot.load().tools.is_empty() {
                // No longer offered (a restarted upstream without it): nothing is served.
                slot.store(Arc::default());
                changed = true;
            }
        }
        changed
    }

    /// Reads one of the upstream's lists (`method`, whose pages hold `field`) into `slot`;
    /// true when it differs from the last one.
    async fn list(&self, slot: &ArcSwap<Listed>, method: &str, field: &str) -> bool {
        let mut tools = Vec::new();
        let mut bytes = 0usize;
        let mut cut = false;
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let page = match self.request(method, &params, LogSink::NONE).await {
                Ok(p) => p,
                Err(e) => {
                    let error = self.shared.secrets.scrub(&e.to_string(), MAX_STATUS_ERROR);
                    tracing::warn!(upstream = %self.name, error, method, "listing failed; keeping the last list");
                    return false;
                }
            };
            match page.get(field).and_then(Value::as_array) {
                Some(t) => {
                    // Bounded in entries (invalid ones included) and in bytes, whatever the
                    // pages: beyond this the list is cut, and the import says so.
                    for entry in t {
                        bytes += crate::template::approx_size(entry);
                        if tools.len() >= MAX_LISTED || bytes > self.shared.max_bytes.saturating_mul(4) {
                            cut = true;
                            break;
                        }
                        tools.push(entry.clone());
                    }
                    if cut {
                        tracing::warn!(upstream = %self.name, entries = tools.len(), bytes, "the upstream lists more than is kept; the rest is not read");
                        break;
                    }
                }
                None => {
                    tracing::warn!(upstream = %self.name, method, "answered without `{field}`; keeping the last list");
                    return false;
                }
            }
            cursor = page
                .get("nextCursor")
                .and_then(Value::as_str)
                .filter(|c| !c.is_empty() && c.len() <= 4096)
                .map(str::to_owned);
            if cursor.is_none() {
                break;
            }
        }
        if cursor.is_some() {
            tracing::warn!(upstream = %self.name, pages = MAX_LIST_PAGES, "the upstream lists more pages than are read; the rest is not read");
            cut = true;
        }
        let mut h = FxHasher::default();
        serde_json::to_string(&tools).unwrap_or_default().hash(&mut h);
        cut.hash(&mut h);
        let hash = h.finish();
        let last = slot.load();
        if last.read && last.hash == hash {
            return false;
        }
        tracing::info!(upstream = %self.name, entries = tools.len(), method, "upstream list read");
        slot.store(Arc::new(Listed {
            read: true,
            tools,
            hash,
            cut,
        }));
        true
    }

    /// Calls a tool of the upstream; its result is the call's result. When the caller asked
    /// for progress, the upstream is asked too and its progress is passed on.
    pub async fn call_tool(
        &self,
        call: &crate::config::upstream::UpstreamCall,
        args: Value,
        cx: &CallCtx<'_>,
        auth: Option<&http::HeaderValue>,
    ) -> ToolOutput {
        match self.try_call_tool(call, &args, cx, auth).await {
            Ok(out) => out,
            Err(e) => ToolOutput::error(format!("upstream `{}`: {e}", self.name)),
        }
    }

    /// [`Link::call_tool`], with a failure of the upstream (not a tool error) as an error:
    /// a caller's credential it refused ([`CallError::Unauthorized`]) can be renewed and the
    /// call made again.
    ///
    /// # Errors
    /// The upstream did not answer the call with a result.
    pub async fn try_call_tool(
        &self,
        call: &crate::config::upstream::UpstreamCall,
        args: &Value,
        cx: &CallCtx<'_>,
        auth: Option<&http::HeaderValue>,
    ) -> Result<ToolOutput, CallError> {
        use tasks::{CallMeta, CallParams};
        let remote = call.remote.as_str();
        let start = Instant::now();
        // Tracing on: a client span, whose context the upstream gets in `_meta`.
        let span = crate::otel::spans::upstream_call(&self.name, remote);
        let trace = span.as_ref().and_then(crate::otel::propagate::fields);
        // Log messages on the call's own HTTP answer stream go to the client as they are
        // read (stdio cannot tie a log line to one of the calls multiplexed on a process:
        // those are logged here). Progress comes back by token on any of the upstream's
        // streams, so through a channel, which exists only when the client asked for it.
        let forward_log = |params: &Value| self.forward_log(params, cx);
        let asked = relay::Questions::default();
        let relay = |method: String, params: Value| -> relay::Asking<'_> {
            Box::pin(self.relay(method, params, cx, &asked))
        };
        let log = LogSink {
            log: cx.wants_logs().then_some(&forward_log),
            ask: Some(&relay),
            caps: cx.caps.or(cx.inputs.map(|i| i.caps)),
            tasks: false,
        };
        let mut params = CallParams {
            name: remote,
            arguments: args,
            meta: trace.map(|(parent, state)| CallMeta {
                traceparent: Some(parent),
                tracestate: state,
                ..CallMeta::default()
            }),
            task: None,
        };
        let r = if cx.wants_progress() {
            let token = self.shared.id();
            params.meta.get_or_insert_with(CallMeta::default).progress_token = Some(token);
            let (tx, mut progress) = mpsc::channel(64);
            self.shared
                .progress
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(token, tx);
            let _registered = Registered(&self.shared, token);
            let forward_progress = |p: Value| self.forward_progress(p, cx);
            let call =
                crate::otel::spans::under(span.as_ref(), self.tools_call(&params, call.task, log, auth));
            tokio::pin!(call);
            let r = loop {
                tokio::select! {
                    // What arrived before the answer goes out before it.
                    biased;
                    Some(p) = progress.recv() => forward_progress(p),
                    r = &mut call => break r,
                }
            };
            // Progress that was queued when the answer came.
            while let Ok(p) = progress.try_recv() {
                forward_progress(p);
            }
            r
        } else {
            crate::otel::spans::under(span.as_ref(), self.tools_call(&params, call.task, log, auth)).await
        };
        self.shared.metrics.requests.observe(start.elapsed());
        let mut r = r.and_then(|v| to_output(v).map_err(CallError::Protocol));
        // Resources its result links or embeds are read through this server, under the
        // names it serves them by, where its resources are imported.
        if self.wants & offers::RESOURCES != 0
            && let Ok(out) = &mut r
        {
            for block in out.content.iter_mut().flatten() {
                self.serve_uris(block);
            }
        }
        if let Some(cx) = &span {
            let error = match &r {
                Ok(out) => out.is_error.then_some("tool_error"),
                Err(e) => Some(e.kind()),
            };
            crate::otel::finish(cx, error);
        }
        if let Err(e) = &r {
            self.shared.metrics.error(e.kind());
        }
        r
    }

    /// Passes an upstream's progress notification of a call on to its client: its message
    /// scrubbed of Secret values and passed through the tools' result guard (dropped where
    /// the guard would withhold the result).
    fn forward_progress(&self, mut p: Value, cx: &CallCtx<'_>) {
        if let Some(Value::String(m)) = p.get_mut("message") {
            *m = self.shared.secrets.scrub(m, MAX_LOG_CHARS);
        }
        if let Some(g) = &*self.guard.load()
            && let Some(Value::String(m)) = p.get_mut("message")
        {
            let (mut scan, mut v) = (Scan::default(), Verdict::default());
            match g.check_str(m, &mut scan, &mut v) {
                _ if v.action == GuardAction::Refuse => m.clear(),
                Some(r) => *m = r,
                None => {}
            }
        }
        cx.forward_progress(&p);
    }

    /// Passes an upstream's `notifications/message` of a call on to its client, at the
    /// level the client asked for, Secret values redacted.
    fn forward_log(&self, params: &Value, cx: &CallCtx<'_>) {
        let level = params
            .get("level")
            .and_then(Value::as_str)
            .and_then(LogLevel::parse)
            .unwrap_or_default();
        let mut data = params.get("data").cloned().unwrap_or(Value::Null);
        if let Some(g) = &*self.guard.load() {
            // What the tool's result may not carry, its log lines may not either: redacted,
            // or the line dropped where the result would be withheld.
            let (mut scan, mut v) = (Scan::default(), Verdict::default());
            g.check_value(&mut data, &mut scan, &mut v);
            if v.action == GuardAction::Refuse {
                return;
            }
        }
        let data = if data.is_null() {
            String::new()
        } else {
            self.shared.secrets.scrub_json(&data, 4096)
        };
        cx.log(level, &self.name, &data);
    }

    /// The link's health, tool count and import report.
    pub fn status(&self) -> Value {
        let h = self
            .shared
            .health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        // The first few reasons (not a copy of them all); the count says how many there are.
        let (imported, skipped, skipped_count, awaiting, offered) = {
            let r = self.report.lock().unwrap_or_else(PoisonError::into_inner);
            let shown: Vec<String> = r.skipped.iter().take(MAX_SKIPPED_SHOWN).cloned().collect();
            let awaiting: Vec<String> = r.awaiting.iter().take(MAX_SKIPPED_SHOWN).cloned().collect();
            (
                r.imported,
                shown,
                r.skipped.len(),
                awaiting,
                (r.resources, r.prompts),
            )
        };
        json!({
            "name": self.name,
            "transport": match self.conn { Conn::Stdio(_) | Conn::Pinned(..) => "stdio", Conn::Http(_) => "http" },
            "state": h.state,
            "error": h.error.map(|e| e.chars().take(MAX_STATUS_ERROR).collect::<String>()),
            "lastError": h.last_error.as_ref().map(|(e, _)| e.chars().take(MAX_STATUS_ERROR).collect::<String>()),
            "lastErrorUnix": h.last_error.as_ref().map(|(_, t)| *t),
            "sinceUnix": h.since_unix,
            "restarts": h.restarts,
            "connections": h.connections,
            "protocolVersion": h.protocol_version,
            "serverInfo": h.server_info,
            "listed": self.listed.load().tools.len(),
            "imported": imported,
            "resources": offered.0,
            "prompts": offered.1,
            "skipped": skipped,
            "skippedCount": skipped_count,
            "awaitingApproval": awaiting,
        })
    }

    fn stop(&self) {
        self.shared.stop.cancel();
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A `CallToolResult` from an upstream as this server's result.
fn to_output(mut v: Value) -> Result<ToolOutput, String> {
    let Some(obj) = v.as_object_mut() else {
        return Err("a tools/call result that is not an object".into());
    };
    let Some(Value::Array(blocks)) = obj.remove("content") else {
        return Err("a tools/call result without a content array".into());
    };
    if blocks
        .iter()
        .any(|b| !b.get("type").is_some_and(Value::is_string))
    {
        return Err("a content block without a type".into());
    }
    let text = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n");
    Ok(ToolOutput {
        text,
        structured: obj.remove("structuredContent").filter(Value::is_object),
        content: Some(blocks),
        is_error: obj.get("isError").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// Every link of the serving config, and the signal that an upstream's tools changed.
#[derive(Debug)]
pub struct Hub {
    links: Mutex<Vec<Arc<Link>>>,
    changed: Arc<Notify>,
    /// Pinned tool definitions.
    pub pins: pins::Pins,
    /// The OpenAPI sources pinned by the serving config (their series go when they do).
    pinned_documents: Mutex<Vec<String>>,
    secrets: Arc<Secrets>,
    http: HttpClient,
    /// Where upstreams' `notifications/resources/updated` go.
    updated: offers::OnUpdate,
}

impl Hub {
    /// A hub with no upstreams.
    pub fn new(secrets: Arc<Secrets>, http: HttpClient) -> Arc<Self> {
        Arc::new(Self {
            links: Mutex::default(),
            changed: Arc::new(Notify::new()),
            pins: pins::Pins::default(),
            pinned_documents: Mutex::default(),
            secrets,
            http,
            updated: offers::OnUpdate::default(),
        })
    }

    /// Sets what is told the served URI of an upstream resource a client subscribed to when
    /// its upstream says it was updated.
    pub fn on_resource_updated(&self, f: impl Fn(&str) + Send + Sync + 'static) {
        self.updated.set(Box::new(f));
    }

    /// The upstreams whose users sign in themselves (`identity.mode: user`): name and
    /// identity (for sign-out and revocation; not on the call path).
    pub fn user_identities(&self) -> Vec<(String, crate::spec::identity::Identity)> {
        use crate::spec::identity::IdentityMode;
        let links = self
            .links
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        links
            .iter()
            .filter_map(|l| {
                let id = l.identity().filter(|i| i.mode == IdentityMode::User)?;
                Some((l.name.clone(), id.clone()))
            })
            .collect()
    }

    /// Starts, keeps or stops links to match `ups` (a compiled config about to serve);
    /// returns them in the order of `ups`. A link whose key is unchanged is kept as it is.
    pub fn configure(&self, ups: &[CompiledUpstream], metrics: &Metrics) -> Vec<Arc<Link>> {
        let mut current = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        let mut by_key: FxHashMap<u64, Arc<Link>> = current.drain(..).map(|l| (l.key, l)).collect();
        let next: Vec<Arc<Link>> = ups
            .iter()
            .map(|u| match by_key.remove(&u.key) {
                Some(kept) => {
                    kept.guard.store(u.result_guard.clone());
                    kept
                }
                None => Link::start(
                    u,
                    &self.http,
                    &self.secrets,
                    metrics,
                    (&self.changed, &self.updated),
                ),
            })
            .collect();
        let kept: FxHashSet<&str> = next.iter().map(|l| l.name.as_str()).collect();
        for (_, old) in by_key {
            old.stop();
            if !kept.contains(old.name.as_str()) {
                metrics.forget_upstream(&old.name);
            }
        }
        current.clone_from(&next);
        next
    }

    /// Appends the tools the links' upstreams currently list to `compiled` (after its own
    /// tools, which win any name) and folds the lists into its hash. Tools a pinned upstream
    /// lists, or a pinned OpenAPI document describes, with definitions not approved are held
    /// back (`enforce`) or reported (`warn`).
    pub fn expand(&self, compiled: &mut CompiledToolSet, links: &[Arc<Link>], metrics: &Metrics) {
        self.pins.set_sources(
            compiled
                .upstreams
                .iter()
                .filter(|u| u.pin.is_on())
                .map(|u| u.name.clone())
                .chain(compiled.pinned_documents.iter().map(|d| d.source.clone()))
                .collect(),
        );
        let mut awaiting = FxHashMap::default();
        let mut h = FxHasher::default();
        let documents = self.pin_documents(compiled, metrics, &mut awaiting, &mut h);
        if links.is_empty() {
            self.pins.set_awaiting(awaiting);
            // Only an approval changes what is served without new config text.
            compiled.upstream_digest = if documents { h.finish() } else { 0 };
            return;
        }
        // A held tool's name stays taken: no upstream's tool is served in its place.
        let mut taken: FxHashSet<String> = compiled
            .tools
            .iter()
            .map(|t| t.name.clone())
            .chain(awaiting.keys().cloned())
            .collect();
        let mut offered = Vec::new();
        for (i, (u, link)) in compiled.upstreams.iter().zip(links).enumerate() {
            let listed = link.listed.load();
            listed.hash.hash(&mut h);
            let (mut tools, mut report) = u.import(i, &listed.tools, &mut taken);
            if u.pin.is_on() && listed.read {
                self.pin(u, link, &listed, &mut tools, &mut report, &mut awaiting);
                // An approval changes what is served without a new list.
                report.awaiting.hash(&mut h);
            }
            if listed.cut {
                report.skipped.push(format!(
                    "the list was cut after {} entries (at most {MAX_LISTED} entries and 4 × maxMessageBytes are read)",
                    listed.tools.len()
                ));
            }
            // The reasons quote the upstream's tool names.
            for why in &mut report.skipped {
                *why = link.shared.secrets.scrub(why, MAX_STATUS_REASON);
            }
            if !report.skipped.is_empty() {
                let first: Vec<&String> = report.skipped.iter().take(3).collect();
                tracing::warn!(upstream = %u.name, count = report.skipped.len(), first = ?first, "upstream tools not served (all on /status)");
            }
            *link.report.lock().unwrap_or_else(PoisonError::into_inner) = report;
            compiled.tools.extend(tools);
            if link.wants != 0 {
                offered.push(link.offered(u, i, &mut h));
            }
        }
        for (i, r) in crate::config::upstream::offers::add(compiled, offered) {
            links[i].add_to_report(r);
        }
        for link in links {
            let r = link.report.lock().unwrap_or_else(PoisonError::into_inner);
            link.shared.metrics.served([r.imported, r.resources, r.prompts]);
        }
        self.pins.set_awaiting(awaiting);
        compiled.upstream_digest = h.finish();
    }

    /// Pinning of the OpenAPI sources that pin their operations, as of an upstream's tools
    /// ([`Self::pin`]): the tools not approved are reported, and under `enforce` removed
    /// from `compiled` and named in `awaiting` (and folded into `h`: an approval serves them
    /// without new config text). Returns
    /// whether any source is pinned.
    fn pin_documents(
        &self,
        compiled: &mut CompiledToolSet,
        metrics: &Metrics,
        awaiting: &mut FxHashMap<String, String>,
        h: &mut FxHasher,
    ) -> bool {
        use crate::config::upstream::pin::PinMode;
        let mut held: FxHashSet<String> = FxHashSet::default();
        for doc in &compiled.pinned_documents {
            let seen = doc.tools.iter().map(|(_, s)| s.clone()).collect();
            let verdict = self.pins.observe(&doc.source, seen, true);
            let (waiting, changes) = metrics.pinned_document(&doc.source);
            changes.inc_by(verdict.changes);
            waiting.set(i64::try_from(verdict.unapproved.len()).unwrap_or(i64::MAX));
            if verdict.changes > 0 {
                tracing::warn!(source = %doc.source, changed = verdict.changes, mode = ?doc.mode, "OpenAPI operations changed or added; they await approval (kubectl quiver approve)");
            }
            let unapproved: FxHashSet<&str> = verdict.unapproved.iter().map(|(r, _)| r.as_str()).collect();
            for (name, seen) in &doc.tools {
                if doc.mode == PinMode::Enforce && unapproved.contains(seen.remote.as_str()) {
                    name.hash(h);
                    awaiting.insert(name.clone(), doc.source.clone());
                    held.insert(name.clone());
                }
            }
        }
        if !held.is_empty() {
            compiled.tools.retain(|t| !held.contains(&t.name));
        }
        let sources: Vec<String> = compiled
            .pinned_documents
            .iter()
            .map(|d| d.source.clone())
            .collect();
        let mut before = self
            .pinned_documents
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for gone in before.iter().filter(|s| !sources.contains(s)) {
            metrics.forget_upstream(gone);
        }
        *before = sources;
        !before.is_empty()
    }

    /// Pinning of one upstream's imported `tools`: the ones not approved are reported
    /// (and, under `enforce`, removed and named in `awaiting`).
    fn pin(
        &self,
        u: &CompiledUpstream,
        link: &Link,
        listed: &Listed,
        tools: &mut Vec<crate::config::compiled::CompiledTool>,
        report: &mut ImportReport,
        awaiting: &mut FxHashMap<String, String>,
    ) {
        use crate::config::compiled::CompiledHandler;
        use crate::config::upstream::pin::{PinMode, Seen};
        // The entry `import` served is a name's first; a name listed more than once is pinned
        // as all of its entries together, so it is never approved as one of them.
        let mut entries: FxHashMap<&str, Vec<&Value>> = FxHashMap::default();
        for t in &listed.tools {
            if let Some(n) = t.get("name").and_then(Value::as_str) {
                entries.entry(n).or_default().push(t);
            }
        }
        let remote = |t: &crate::config::compiled::CompiledTool| match &t.handler {
            CompiledHandler::Upstream(c) => Some(c.remote.clone()),
            _ => None,
        };
        let seen: Vec<Seen> = tools
            .iter()
            .filter_map(|t| {
                let r = remote(t)?;
                match entries.get(r.as_str())?.as_slice() {
                    [one] => Some(Seen::of(&r, one)),
                    many => Some(Seen::of_many(&r, many)),
                }
            })
            .collect();
        let verdict = self.pins.observe(&u.name, seen, !listed.cut);
        link.shared.metrics.definition_changes.inc_by(verdict.changes);
        link.shared
            .metrics
            .awaiting_approval
            .set(i64::try_from(verdict.unapproved.len()).unwrap_or(i64::MAX));
        if verdict.changes > 0 {
            tracing::warn!(upstream = %u.name, changed = verdict.changes, mode = ?u.pin, "tool definitions changed or added; they await approval (kubectl quiver approve)");
        }
        let held: FxHashMap<&str, &str> = verdict
            .unapproved
            .iter()
            .map(|(r, why)| (r.as_str(), *why))
            .collect();
        report.awaiting = held.keys().map(|r| u.served_name(r)).collect();
        report.awaiting.sort();
        if u.pin != PinMode::Enforce {
            return;
        }
        tools.retain(|t| {
            let Some(why) = remote(t).and_then(|r| held.get(r.as_str()).copied()) else {
                return true;
            };
            report
                .skipped
                .push(format!("`{}`: {why}; awaits approval", t.name));
            awaiting.insert(t.name.clone(), u.name.clone());
            false
        });
        report.imported = tools.len();
    }

    /// Signalled when an upstream's tool list changed.
    pub fn changed(&self) -> &Notify {
        &self.changed
    }

    /// Every link's status, for `/status`.
    pub fn status(&self) -> Vec<Value> {
        self.links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|l| l.status())
            .collect()
    }
}

/// Waits `backoff` (or until stopped), then doubles it up to the longest wait; false when
/// stopped.
async fn back_off(stop: &CancellationToken, backoff: &mut Duration) -> bool {
    tokio::select! {
        () = tokio::time::sleep(*backoff) => {}
        () = stop.cancelled() => return false,
    }
    *backoff = (*backoff * 2).min(BACKOFF.1);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_sorted_and_bad_ones_refused() {
        assert!(matches!(
            classify(json!({"jsonrpc": "2.0", "id": 7, "result": {"ok": 1}})),
            Ok(Message::Response(7, Ok(_)))
        ));
        assert!(matches!(
            classify(json!({"id": 8, "error": {"code": -32602, "message": "bad"}})),
            Ok(Message::Response(8, Err(CallError::Rpc(-32602, _))))
        ));
        assert!(
            matches!(classify(json!({"id": "x", "method": "ping"})), Ok(Message::Request(_, m, _)) if m == "ping")
        );
        assert!(matches!(
            classify(json!({"method": "notifications/tools/list_changed"})),
            Ok(Message::Notification(..))
        ));
        for bad in [
            json!([1]),
            json!({"id": "s", "result": 1}),
            json!({"id": 1}),
            json!({}),
            json!(5),
        ] {
            assert!(classify(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn results_must_be_call_tool_results() {
        let out = to_output(json!({"content": [{"type": "text", "text": "a"}, {"type": "image", "data": "", "mimeType": "image/png"}, {"type": "text", "text": "b"}], "structuredContent": {"n": 1}, "isError": true})).unwrap();
        assert_eq!(out.text, "a\nb");
        assert!(out.is_error && out.structured == Some(json!({"n": 1})) && out.content.unwrap().len() == 3);
        for bad in [
            json!([]),
            json!({}),
            json!({"content": "x"}),
            json!({"content": [{"text": "no type"}]}),
        ] {
            assert!(to_output(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn waiters_are_bounded_and_failed_when_the_connection_goes() {
        let w = Waiters::default();
        let mut rxs: Vec<_> = (0..MAX_IN_FLIGHT as u64).map(|i| w.add(i).unwrap()).collect();
        assert_eq!(w.add(99_999).unwrap_err(), CallError::Busy);
        assert!(w.answer(3, Ok(json!(1))));
        assert!(!w.answer(3, Ok(json!(1))), "answered twice");
        w.fail_all("gone");
        assert_eq!(rxs[3].try_recv().unwrap(), Ok(json!(1)));
        assert_eq!(rxs[4].try_recv().unwrap(), Err(CallError::Down("gone".into())));
        assert!(w.add(1).is_ok());
    }

    #[test]
    fn initialize_results_are_checked() {
        assert!(
            check_initialized(&json!({"protocolVersion": "2025-06-18", "serverInfo": {"name": "x"}})).is_ok()
        );
        assert!(check_initialized(&json!({"protocolVersion": "1999-01-01"})).is_err());
        assert!(check_initialized(&json!({})).is_err());
        let (_, info, _) = check_initialized(
            &json!({"protocolVersion": "2025-03-26", "serverInfo": {"name": "x".repeat(10_000)}}),
        )
        .unwrap();
        assert_eq!(info, Value::Null, "oversized server info is dropped");
    }
}
