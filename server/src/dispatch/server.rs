//! The server core every method handler works on: registry, executor, sessions, pending
//! client requests, running cancellable calls and the notification fan-out; and the
//! per-request facts a transport supplies ([`Ctx`]).

use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use rustc_hash::FxHashMap;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::cancel::Cancels;
use crate::exec::Executor;
use crate::metrics::Metrics;
use crate::peer::Pending;
use crate::protocol;
use crate::registry::Registry;
use crate::session::Sessions;
use crate::spec::access::Principal;

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
    /// [`super::Outcome::Deferred`], which can reach the client while the call runs
    /// (progress, log messages, sampling, elicitation). Otherwise it runs here, unable to
    /// reach the client.
    pub stream: bool,
    /// Which protocol era the message is read in.
    pub era: Era<'a>,
    /// What the caller's credentials grant, for tools with `access`; `None` when it presented
    /// none (client authentication off, stdio).
    pub caller: Option<&'a Principal>,
    /// Which session a successful `initialize` opens.
    pub opens: Opens,
    /// The caller's network address, when the transport knows it (HTTP: the TCP peer, or
    /// the client a trusted proxy names). A caller without credentials is counted by it:
    /// its limits, its tasks and its task requests. `None` over stdio.
    pub client: Option<crate::limits::ClientAddr>,
}

/// How a transport tells the handshake era from the stateless revision (2026-07-28).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era<'a> {
    /// Handshake era (`initialize`, sessions): HTTP without a 2026-07-28 version header.
    Handshake,
    /// 2026-07-28: HTTP with this `MCP-Protocol-Version`, which `_meta` must repeat.
    Stateless(&'a str),
    /// Per message (stdio): 2026-07-28 when the params' `_meta` names a protocol version
    /// (and the method is not `initialize`), the handshake era otherwise.
    Detect,
}

/// Which session a successful `initialize` opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opens {
    /// A new id minted for the caller ([`crate::session::mint`]), which the answer carries
    /// ([`super::Reply::session`]; HTTP sends it as `Mcp-Session-Id`). A client's own id is
    /// never taken.
    Minted,
    /// The transport's one session, [`Ctx::session`] (stdio).
    Given,
}

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

/// The MCP server core: registry, executor, notification fan-out, cancellation.
#[derive(Debug)]
pub struct Server {
    /// The tool registry.
    pub registry: Arc<Registry>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The request metrics of each method label ([`super::LABELS`]), by slot.
    pub(super) by_method: crate::metrics::MethodMetrics,
    /// Runs tools.
    pub exec: Executor,
    pub(super) events: broadcast::Sender<Arc<Event>>,
    /// What the server remembers per session.
    pub sessions: Sessions,
    /// Requests sent to clients, waiting for answers.
    pub pending: Pending,
    pub(super) cancels: Cancels,
    pub(super) limits: Limits,
    /// Signs 2026-07-28 `requestState`.
    pub(super) state_key: crate::dispatch::stateless::StateKey,
    /// Resource URIs watched by open `subscriptions/listen` streams.
    pub(super) watched: Arc<Mutex<FxHashMap<Box<str>, usize>>>,
    /// The budgets of rate and concurrency limits.
    pub limiter: Arc<crate::limits::Limiter>,
    /// The audit trail, when it is on.
    pub audit: Option<Arc<crate::audit::AuditLog>>,
    /// Tasks of the `io.modelcontextprotocol/tasks` extension.
    pub(super) tasks: super::tasks::store::Tasks,
    /// The work of the tasks this replica runs (a stopping server lets it finish).
    pub(super) running: tokio_util::task::TaskTracker,
    /// How often each caller may ask about its tasks.
    pub(super) polls: super::tasks::polls::Polls,
}

/// How a [`Server`] is put together. Every setting has a default; [`ServerBuilder::build`]
/// makes the server once, so a setting can never be lost on a server already shared.
#[derive(Debug)]
#[must_use]
pub struct ServerBuilder {
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    exec: Executor,
    limits: Limits,
    limiter: Option<Arc<crate::limits::Limiter>>,
    audit: Option<Arc<crate::audit::AuditLog>>,
    tasks: (super::TaskBounds, Option<super::SharedOptions>),
    state_key: Option<crate::dispatch::stateless::StateKey>,
}

impl ServerBuilder {
    /// The metrics the server will record to.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The secret store the server's tools (and its audit trail's redaction) will read.
    pub fn secrets(&self) -> &Arc<crate::secrets::Secrets> {
        &self.exec.secrets
    }

    /// The limits of requests, sessions and answers (default: [`Limits::default`]).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Counts rate and concurrency limits in `limiter` (default: one with no shared store).
    pub fn limiter(mut self, limiter: Arc<crate::limits::Limiter>) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// Records calls to `audit` (default: no audit trail; see docs/governance.md).
    pub fn audit(mut self, audit: Option<Arc<crate::audit::AuditLog>>) -> Self {
        self.audit = audit;
        self
    }

    /// Keeps tasks within `bounds`, in this process's memory or, with `shared`, in Redis
    /// shared by every replica (default: the default bounds, in memory; see docs/protocol.md).
    pub fn tasks(mut self, bounds: super::TaskBounds, shared: Option<super::SharedOptions>) -> Self {
        self.tasks = (bounds, shared);
        self
    }

    /// Signs `requestState` with `key` (default: a random key of this process): replicas
    /// that share a key accept each other's state.
    pub fn state_key(mut self, key: crate::dispatch::stateless::StateKey) -> Self {
        self.state_key = Some(key);
        self
    }

    /// The server.
    #[must_use]
    pub fn build(self) -> Arc<Server> {
        use super::tasks::store::Tasks;
        let (events, _) = broadcast::channel(64);
        let metrics = self.metrics;
        let (bounds, shared) = self.tasks;
        let tasks = match shared {
            None => Tasks::memory(bounds, metrics.tasks.clone()),
            Some(o) => Tasks::shared(o, bounds, metrics.tasks.clone()),
        };
        let server = Arc::new(Server {
            registry: self.registry,
            exec: self.exec,
            events,
            sessions: Sessions::default(),
            pending: Pending::default(),
            cancels: Cancels::default(),
            limits: self.limits,
            state_key: self
                .state_key
                .unwrap_or_else(crate::dispatch::stateless::StateKey::random),
            watched: Arc::default(),
            limiter: self.limiter.unwrap_or_else(|| {
                crate::limits::Limiter::new(crate::limits::DEFAULT_MAX_KEYS, None, metrics.gov.clone())
            }),
            audit: self.audit,
            tasks,
            running: tokio_util::task::TaskTracker::new(),
            polls: super::tasks::polls::Polls::default(),
            by_method: metrics.methods(&super::LABELS),
            metrics,
        });
        let weak = Arc::downgrade(&server);
        server.exec.upstreams.on_resource_updated(move |uri| {
            if let Some(s) = weak.upgrade() {
                s.upstream_resource_updated(uri);
            }
        });
        server
    }
}

impl Server {
    /// The settings of a server over a registry, each at its default until set.
    pub fn builder(registry: Arc<Registry>, metrics: Arc<Metrics>) -> ServerBuilder {
        ServerBuilder {
            registry,
            metrics,
            exec: Executor::new(),
            limits: Limits::default(),
            limiter: None,
            audit: None,
            tasks: (super::TaskBounds::default(), None),
            state_key: None,
        }
    }

    /// A server over a registry, every setting at its default.
    pub fn new(registry: Arc<Registry>, metrics: Arc<Metrics>) -> Arc<Self> {
        Self::builder(registry, metrics).build()
    }

    /// A server over a registry with the given limits, every other setting at its default.
    pub fn with_limits(registry: Arc<Registry>, metrics: Arc<Metrics>, limits: Limits) -> Arc<Self> {
        Self::builder(registry, metrics).limits(limits).build()
    }

    /// Follows the task store until `stop`: a task cancelled through another replica stops
    /// here within a poll interval.
    pub async fn follow_tasks(&self, stop: CancellationToken) {
        self.tasks.follow(stop).await;
    }

    /// On shutdown: lets the tasks this replica runs finish within `drain` (when tasks are
    /// shared; a task in memory ends with the process), then records those still running as
    /// failed, saying why.
    pub async fn drain_tasks(&self, drain: std::time::Duration) {
        self.tasks.drain(&self.running, drain).await;
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Calls registered for cancellation right now (running slow calls that have a session).
    pub fn cancellable_calls(&self) -> usize {
        self.cancels.len()
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
pub(super) struct InflightGuard<'a>(&'a Gauge<i64, AtomicI64>);

impl<'a> InflightGuard<'a> {
    #[inline]
    pub(super) fn enter(g: &'a Gauge<i64, AtomicI64>) -> Self {
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
