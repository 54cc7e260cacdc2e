//! Prometheus metrics. Hot-path instruments are lock-free atomics whose handles are resolved
//! once (per tool, when a registry snapshot is built; per method, when the dispatcher is
//! built, from the method labels it hands over), so recording a request does no label
//! hashing and takes no lock.

pub mod governance;
pub mod oauth;
pub mod tasks;
pub mod tokens;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// Bucket upper bounds (seconds) of the dispatch and request histograms: 1 µs to 10 s.
pub const LATENCY_BUCKETS: [f64; 22] = [
    0.000_001,
    0.000_002_5,
    0.000_005,
    0.000_01,
    0.000_025,
    0.000_05,
    0.000_1,
    0.000_25,
    0.000_5,
    0.001,
    0.002_5,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
];

#[derive(Debug)]
struct HistogramInner {
    bounds: &'static [f64],
    /// Per-bucket (non-cumulative) counts; the last slot is +Inf.
    counts: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
    /// Whether sampled traces leave exemplars here (the dispatch histograms).
    keeps_exemplars: std::sync::atomic::AtomicBool,
    /// The latest exemplar per bucket; made with the first one (tracing on only).
    exemplars: OnceLock<Box<[arc_swap::ArcSwapOption<Exemplar>]>>,
}

/// One observation that names its trace (an OpenMetrics exemplar).
#[derive(Debug)]
struct Exemplar {
    trace_id: opentelemetry::trace::TraceId,
    /// The observed value, seconds.
    value: f64,
    /// When, seconds since the Unix epoch.
    at: f64,
}

/// A lock-free histogram (prometheus-client's own takes a mutex per observation).
#[derive(Debug, Clone)]
pub struct Histogram(Arc<HistogramInner>);

impl Default for Histogram {
    fn default() -> Self {
        Self::new(&LATENCY_BUCKETS)
    }
}

impl Histogram {
    /// A histogram with the given ascending bucket bounds.
    pub fn new(bounds: &'static [f64]) -> Self {
        Self(Arc::new(HistogramInner {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
            keeps_exemplars: std::sync::atomic::AtomicBool::new(false),
            exemplars: OnceLock::new(),
        }))
    }

    /// Lets sampled traces leave exemplars in this histogram.
    pub fn keep_exemplars(&self) {
        self.0.keeps_exemplars.store(true, Ordering::Relaxed);
    }

    /// Keeps the current trace (when sampled) as bucket `i`'s exemplar.
    #[cold]
    fn exemplar(&self, i: usize, secs: f64) {
        if !self.0.keeps_exemplars.load(Ordering::Relaxed) {
            return;
        }
        let Some(trace_id) = crate::otel::current_trace_id() else {
            return;
        };
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let slots = self.0.exemplars.get_or_init(|| {
            (0..self.0.counts.len())
                .map(|_| arc_swap::ArcSwapOption::empty())
                .collect()
        });
        if let Some(slot) = slots.get(i) {
            slot.store(Some(Arc::new(Exemplar {
                trace_id,
                value: secs,
                at,
            })));
        }
    }

    /// Bucket `i`'s exemplar as OpenMetrics writes it after the sample (` # {...} v t`).
    fn exemplar_text(&self, i: usize) -> Option<String> {
        let e = self.0.exemplars.get()?.get(i)?.load_full()?;
        Some(format!(
            " # {{trace_id=\"{}\"}} {} {:.3}",
            e.trace_id, e.value, e.at
        ))
    }

    /// Records one duration.
    #[inline]
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = self.0.bounds.partition_point(|b| *b < secs);
        self.0.counts[i].fetch_add(1, Ordering::Relaxed);
        // Tracing off: this branch is all it costs.
        if crate::otel::enabled() {
            self.exemplar(i, secs);
        }
        self.0
            .sum_nanos
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Number of observations so far.
    pub fn count(&self) -> u64 {
        self.0.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

impl prometheus_client::metrics::TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut buckets = Vec::with_capacity(self.0.counts.len());
        let mut count = 0;
        for (i, c) in self.0.counts.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            count += n;
            buckets.push((self.0.bounds.get(i).copied().unwrap_or(f64::INFINITY), n));
        }
        let sum = self.0.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Process CPU time (`process_cpu_seconds_total`), read from /proc/self/stat when scraped.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessCpu;

/// Resident memory (`process_resident_memory_bytes`), read from /proc/self/statm when scraped.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessRss;

/// Clock ticks per second of /proc/self/stat times (USER_HZ, 100 on Linux).
const USER_HZ: f64 = 100.0;
const PAGE_SIZE: f64 = 4096.0;

fn proc_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / USER_HZ
}

fn proc_rss_bytes() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<f64>().ok()))
        .map_or(0.0, |pages| pages * PAGE_SIZE)
}

impl EncodeMetric for ProcessCpu {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, f64, f64>(&proc_cpu_seconds(), None)
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

impl EncodeMetric for ProcessRss {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&proc_rss_bytes())
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// Labels of the per-tool dispatch histogram.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabels {
    /// Tool name.
    pub tool: String,
    /// `ok`, `tool_error` (isError result) or `invalid_arguments`.
    pub outcome: &'static str,
}

/// Labels of the result guards' counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuardLabels {
    /// Tool name.
    pub tool: String,
    /// What was found (`email`, `aws_access_key_id`, ...).
    pub kind: &'static str,
    /// What was done with the result: `flag`, `redact` or `refuse`.
    pub action: &'static str,
}

/// Labels of per-method instruments.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// JSON-RPC method, one of the labels given to [`Metrics::methods`].
    pub method: &'static str,
}

/// Labels of the request counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// JSON-RPC method, one of the labels given to [`Metrics::methods`].
    pub method: &'static str,
    /// `ok` or the JSON-RPC error class.
    pub outcome: &'static str,
}

/// Labels of the reload counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `success`, `invalid` (config rejected, previous kept) or `unchanged`.
    pub result: &'static str,
}

/// Labels of the per-upstream instruments.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabels {
    /// The upstream's name.
    pub upstream: String,
}

/// Labels of what an upstream serves.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamServedLabels {
    /// The upstream's name.
    pub upstream: String,
    /// `tools`, `resources` or `prompts`.
    pub kind: &'static str,
}

/// The kinds of `quiver_upstream_served`.
const UPSTREAM_SERVED: [&str; 3] = ["tools", "resources", "prompts"];

/// Labels of a counter of an upstream's events by how they ended.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamOutcomeLabels {
    /// The upstream's name.
    pub upstream: String,
    /// How it ended (one of the family's outcomes).
    pub outcome: &'static str,
}

/// Outcomes of `quiver_upstream_tasks_total`: the upstream's task ended with a result
/// (`completed`) or an error (`failed`, a tool error included); the call ended first and the
/// task was cancelled at the upstream (`cancelled`); or the task was lost track of (`lost`:
/// the upstream went away, answered nonsense, or the wait ran out).
pub const UPSTREAM_TASK_OUTCOMES: [&str; 4] = ["completed", "failed", "cancelled", "lost"];
/// Outcomes of `quiver_upstream_questions_total`: the client answered the relayed
/// question, or it was refused (not declared by the client, malformed, one too many).
pub const UPSTREAM_QUESTION_OUTCOMES: [&str; 2] = ["answered", "refused"];

/// Labels of the upstream error counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamErrorLabels {
    /// The upstream's name.
    pub upstream: String,
    /// `timeout`, `down`, `rpc_error`, `protocol`, `busy` or `unauthorized`.
    pub kind: &'static str,
}

/// Error kinds of `quiver_upstream_errors_total`.
pub const UPSTREAM_ERRORS: [&str; 6] = ["timeout", "down", "rpc_error", "protocol", "busy", "unauthorized"];

/// The instruments of one upstream.
#[derive(Debug, Clone)]
pub struct UpstreamMetrics {
    /// Latency of tools/call forwarded to it.
    pub requests: Histogram,
    errors: Vec<Counter>,
    /// 1 while connected (at least one process ready).
    pub up: Gauge<i64, AtomicI64>,
    /// Ready processes (stdio) or sessions (http).
    pub connections: Gauge<i64, AtomicI64>,
    /// Restarts of its processes, reconnections excluded.
    pub restarts: Counter,
    /// Its tools whose definitions await approval (`pin`).
    pub awaiting_approval: Gauge<i64, AtomicI64>,
    /// Definitions that became pending (changed or new since approved).
    pub definition_changes: Counter,
    /// Tools, resources (and templates) and prompts it serves.
    served: Vec<Gauge<i64, AtomicI64>>,
    /// Its tasks followed, by [`UPSTREAM_TASK_OUTCOMES`].
    tasks: Vec<Counter>,
    /// Its questions relayed to clients, by [`UPSTREAM_QUESTION_OUTCOMES`].
    questions: Vec<Counter>,
}

impl UpstreamMetrics {
    /// Sets how many tools, resources (and templates) and prompts it serves.
    pub fn served(&self, counts: [usize; 3]) {
        for (g, n) in self.served.iter().zip(counts) {
            g.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Counts a task of the upstream's that ended (`outcome`: one of
    /// [`UPSTREAM_TASK_OUTCOMES`]).
    pub fn task_ended(&self, outcome: &str) {
        if let Some(i) = UPSTREAM_TASK_OUTCOMES.iter().position(|k| *k == outcome) {
            self.tasks[i].inc();
        }
    }

    /// Counts a question of the upstream's relayed to a client: answered or refused.
    pub fn question(&self, answered: bool) {
        self.questions[usize::from(!answered)].inc();
    }

    /// Counts a failed forwarded call.
    pub fn error(&self, kind: &str) {
        if let Some(i) = UPSTREAM_ERRORS.iter().position(|k| *k == kind) {
            self.errors[i].inc();
        }
    }
}

#[derive(Debug, Default)]
struct UpstreamFamilies {
    requests: Family<UpstreamLabels, Histogram>,
    errors: Family<UpstreamErrorLabels, Counter>,
    up: Family<UpstreamLabels, Gauge<i64, AtomicI64>>,
    connections: Family<UpstreamLabels, Gauge<i64, AtomicI64>>,
    restarts: Family<UpstreamLabels, Counter>,
    awaiting_approval: Family<UpstreamLabels, Gauge<i64, AtomicI64>>,
    definition_changes: Family<UpstreamLabels, Counter>,
    served: Family<UpstreamServedLabels, Gauge<i64, AtomicI64>>,
    tasks: Family<UpstreamOutcomeLabels, Counter>,
    questions: Family<UpstreamOutcomeLabels, Counter>,
}

/// The series of `upstream` in `family`, one per outcome of `all`.
fn by_outcome(
    family: &Family<UpstreamOutcomeLabels, Counter>,
    upstream: &str,
    all: &[&'static str],
) -> Vec<Counter> {
    all.iter()
        .map(|outcome| {
            family
                .get_or_create(&UpstreamOutcomeLabels {
                    upstream: upstream.to_owned(),
                    outcome,
                })
                .clone()
        })
        .collect()
}

/// Labels of the refusal counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// The limit that refused the work (one of [`Refusal::ALL`]'s names).
    pub limit: &'static str,
}

/// A limit that turned work away; each has its own `quiver_refusals_total` series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The connection cap was reached (the accept loop paused).
    Connections,
    /// `--max-concurrency` requests were already being handled (HTTP 503).
    Inflight,
    /// `--max-streams` GET streams were already open (HTTP 503).
    Streams,
    /// A request body did not arrive within `--body-read-timeout` (HTTP 408).
    BodyTimeout,
    /// A request body or stdio line was over `--max-body-bytes`.
    BodyBytes,
    /// A batch was longer than `--max-batch`.
    Batch,
    /// A response was over `--max-response-bytes`.
    ResponseBytes,
    /// A call ran past `--request-timeout`.
    RequestTimeout,
    /// A request without a valid credential (HTTP 401).
    Unauthenticated,
    /// A `tools/call` the caller's scopes or groups do not allow (HTTP 403).
    Forbidden,
}

impl Refusal {
    /// Every refusal, in label order.
    pub const ALL: [Refusal; 10] = [
        Refusal::Connections,
        Refusal::Inflight,
        Refusal::Streams,
        Refusal::BodyTimeout,
        Refusal::BodyBytes,
        Refusal::Batch,
        Refusal::ResponseBytes,
        Refusal::RequestTimeout,
        Refusal::Unauthenticated,
        Refusal::Forbidden,
    ];

    /// The `limit` label value.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Connections => "connections",
            Refusal::Inflight => "inflight",
            Refusal::Streams => "streams",
            Refusal::BodyTimeout => "body_timeout",
            Refusal::BodyBytes => "body_bytes",
            Refusal::Batch => "batch",
            Refusal::ResponseBytes => "response_bytes",
            Refusal::RequestTimeout => "request_timeout",
            Refusal::Unauthenticated => "unauthenticated",
            Refusal::Forbidden => "forbidden",
        }
    }
}

/// Outcomes of a request (the `outcome` label of `requests_total`), by JSON-RPC error code
/// ([`outcome_index`]).
pub const OUTCOMES: [&str; 12] = [
    "ok",
    "parse_error",
    "invalid_request",
    "method_not_found",
    "invalid_params",
    "internal_error",
    "forbidden",
    "cancelled",
    "missing_capability",
    "header_mismatch",
    "unsupported_version",
    "rate_limited",
];

/// Index in [`OUTCOMES`] of an answer with this JSON-RPC error code (an unknown resource
/// counts as invalid params; codes without their own outcome as `internal_error`).
pub const fn outcome_index(code: i32) -> usize {
    use crate::protocol as p;
    match code {
        p::PARSE_ERROR => 1,
        p::INVALID_REQUEST => 2,
        p::METHOD_NOT_FOUND => 3,
        p::INVALID_PARAMS | p::RESOURCE_NOT_FOUND => 4,
        p::FORBIDDEN => 6,
        p::REQUEST_CANCELLED => 7,
        p::MISSING_CAPABILITY => 8,
        p::HEADER_MISMATCH => 9,
        p::UNSUPPORTED_VERSION => 10,
        p::RATE_LIMITED => 11,
        _ => 5,
    }
}

/// The request instruments of each `method` label, by slot: the label's place in the list
/// given to [`Metrics::methods`].
#[derive(Debug)]
pub struct MethodMetrics {
    /// `quiver_request_duration_seconds`, one per label.
    durations: Box<[Histogram]>,
    /// `quiver_requests_total`, [`OUTCOMES`] per label.
    requests: Box<[Counter]>,
}

impl MethodMetrics {
    /// Records a handled message of the label at `method`, answered with `outcome` (an index
    /// in [`OUTCOMES`]).
    #[inline]
    pub fn record(&self, method: usize, outcome: usize, elapsed: Duration) {
        if let Some(h) = self.durations.get(method) {
            h.observe(elapsed);
        }
        if let Some(c) = self.requests.get(method * OUTCOMES.len() + outcome) {
            c.inc();
        }
    }
}

/// Handles of a tool's dispatch histogram, by outcome, each created by the first call that
/// ends that way (and shared with the snapshots before and after). A tool nobody calls, or
/// that never fails, costs no series: with thousands of tools, a histogram of 23 buckets for
/// each tool and outcome up front would be most of the memory per tool and of every scrape.
#[derive(Debug)]
pub struct ToolMetrics {
    ok: OnceLock<Histogram>,
    tool_error: OnceLock<Histogram>,
    invalid_arguments: OnceLock<Histogram>,
    family: Family<ToolLabels, Histogram>,
    guards: Family<GuardLabels, Counter>,
    hooks: HookFamilies,
    /// Results' tokens.
    pub tokens: Arc<crate::metrics::tokens::TokenMetrics>,
}

/// The guardrail webhooks' instruments.
#[derive(Debug, Clone, Default)]
pub struct HookFamilies {
    requests: Family<HookLabels, Counter>,
    duration: Family<HookName, Histogram>,
}

/// Labels of `quiver_webhook_requests_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookLabels {
    /// The webhook's name.
    pub webhook: String,
    /// `allowed`, `mutated`, `denied`, `failed`.
    pub outcome: &'static str,
}

/// Labels of `quiver_webhook_duration_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookName {
    /// The webhook's name.
    pub webhook: String,
}

impl ToolMetrics {
    /// Successful calls; `name` is the tool's.
    #[inline]
    pub fn ok(&self, name: &str) -> &Histogram {
        self.ok.get_or_init(|| series(&self.family, name, "ok"))
    }

    /// Calls whose result had `isError: true`.
    pub fn tool_error(&self, name: &str) -> &Histogram {
        self.tool_error
            .get_or_init(|| series(&self.family, name, "tool_error"))
    }

    /// Calls rejected by input validation.
    pub fn invalid_arguments(&self, name: &str) -> &Histogram {
        self.invalid_arguments
            .get_or_init(|| series(&self.family, name, "invalid_arguments"))
    }

    /// Counts a request to a guardrail webhook about a call of this tool, by outcome, and
    /// the time it took.
    pub fn hooked(&self, webhook: &str, outcome: &'static str, took: std::time::Duration) {
        self.hooks
            .requests
            .get_or_create(&HookLabels {
                webhook: webhook.to_owned(),
                outcome,
            })
            .inc();
        self.hooks
            .duration
            .get_or_create(&HookName {
                webhook: webhook.to_owned(),
            })
            .observe(took);
    }

    /// Counts a result in which the tool's result guard found something: once per kind
    /// found, by what was done with the result.
    pub fn guarded(&self, name: &str, v: &crate::config::guards::Verdict) {
        for kind in v.found.iter() {
            self.guards
                .get_or_create(&GuardLabels {
                    tool: name.to_owned(),
                    kind: kind.name(),
                    action: v.action.label(),
                })
                .inc();
        }
    }
}

fn series(family: &Family<ToolLabels, Histogram>, tool: &str, outcome: &'static str) -> Histogram {
    let h = family
        .get_or_create(&ToolLabels {
            tool: tool.to_owned(),
            outcome,
        })
        .clone();
    h.keep_exemplars();
    h
}

/// Every metric of the server.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    dispatch: Family<ToolLabels, Histogram>,
    guards: Family<GuardLabels, Counter>,
    hooks: HookFamilies,
    request_duration: Family<MethodLabels, Histogram>,
    requests: Family<RequestLabels, Counter>,
    /// Requests being handled now.
    pub inflight: Gauge<i64, AtomicI64>,
    /// Tools in the current registry.
    pub registry_tools: Gauge<i64, AtomicI64>,
    /// Generation of the current registry.
    pub registry_generation: Gauge<i64, AtomicI64>,
    reloads: Family<ReloadLabels, Counter>,
    /// Duration of config reloads (parse, compile, swap).
    pub reload_duration: Histogram,
    /// Open server-to-client streams (HTTP GET and stdio).
    pub streams: Gauge<i64, AtomicI64>,
    /// Open connections on the MCP port.
    pub connections: Gauge<i64, AtomicI64>,
    /// Notifications to a client dropped because it read too slowly.
    pub peer_dropped: Counter,
    /// Finished spans dropped because the export queue was full.
    pub trace_spans_dropped: Counter,
    refusals: Vec<Counter>,
    upstreams: UpstreamFamilies,
    /// Counters of limits and the audit trail.
    pub gov: Arc<crate::metrics::governance::GovMetrics>,
    /// Counters of tasks.
    pub tasks: Arc<crate::metrics::tasks::TaskMetrics>,
    /// Counters of results' tokens.
    pub tokens: Arc<crate::metrics::tokens::TokenMetrics>,
    /// Metrics of users' upstream authorization (the token vault).
    pub oauth: Arc<crate::metrics::oauth::OAuthMetrics>,
}

impl Metrics {
    /// Registers every metric under the `quiver_` prefix.
    // Long: one flat registration per metric family, each with its help text, in the order
    // /metrics and docs/observability.md list them; split, the names would scatter.
    pub fn new(profile: &str, allocator: &str) -> Arc<Self> {
        let mut root = Registry::with_prefix("quiver");
        let dispatch = Family::<ToolLabels, Histogram>::default();
        root.register_with_unit(
            "dispatch_duration",
            "Time to execute a tools/call, from lookup to serialized result",
            Unit::Seconds,
            dispatch.clone(),
        );
        let guards = Family::<GuardLabels, Counter>::default();
        root.register(
            "result_guard_findings",
            "Tool results in which a result guard found secrets or personal data, by tool, kind found and what was done with the result (flag, redact, refuse)",
            guards.clone(),
        );
        let hooks = HookFamilies::default();
        root.register(
            "webhook_requests",
            "Requests to guardrail webhooks about tool calls, by webhook and outcome (allowed, mutated, denied, failed: the webhook did not decide)",
            hooks.requests.clone(),
        );
        root.register_with_unit(
            "webhook_duration",
            "Time a guardrail webhook took to answer (or to fail), by webhook",
            Unit::Seconds,
            hooks.duration.clone(),
        );
        let request_duration = Family::<MethodLabels, Histogram>::default();
        root.register_with_unit(
            "request_duration",
            "Time to answer a JSON-RPC message, by method",
            Unit::Seconds,
            request_duration.clone(),
        );
        let requests = Family::<RequestLabels, Counter>::default();
        root.register(
            "requests",
            "JSON-RPC messages handled, by method and outcome",
            requests.clone(),
        );
        let inflight = Gauge::default();
        root.register("inflight_requests", "Requests being handled", inflight.clone());
        let registry_tools = Gauge::default();
        root.register(
            "registry_tools",
            "Tools in the serving registry",
            registry_tools.clone(),
        );
        let registry_generation = Gauge::default();
        root.register(
            "registry_generation",
            "Generation of the serving registry (1 = first load)",
            registry_generation.clone(),
        );
        let reloads = Family::<ReloadLabels, Counter>::default();
        root.register(
            "config_reloads",
            "Config reload attempts by result",
            reloads.clone(),
        );
        for r in ["success", "invalid", "unchanged"] {
            let _ = reloads.get_or_create(&ReloadLabels { result: r });
        }
        let reload_duration = Histogram::default();
        root.register_with_unit(
            "config_reload_duration",
            "Time to parse, compile and swap in a config",
            Unit::Seconds,
            reload_duration.clone(),
        );
        let streams = Gauge::default();
        root.register(
            "open_streams",
            "Open server-to-client notification streams",
            streams.clone(),
        );
        let connections = Gauge::default();
        root.register(
            "open_connections",
            "Open connections on the MCP port",
            connections.clone(),
        );
        let peer_dropped = Counter::default();
        root.register(
            "peer_messages_dropped",
            "Progress and log notifications dropped because the client read too slowly",
            peer_dropped.clone(),
        );
        let trace_spans_dropped = Counter::default();
        root.register(
            "trace_spans_dropped",
            "Finished trace spans dropped because the export queue was full (tracing on only)",
            trace_spans_dropped.clone(),
        );
        let refusals_family = Family::<RefusalLabels, Counter>::default();
        root.register(
            "refusals",
            "Work turned away by a limit (connections, inflight, streams, body_timeout, body_bytes, batch, response_bytes, request_timeout)",
            refusals_family.clone(),
        );
        let refusals = Refusal::ALL
            .iter()
            .map(|r| {
                refusals_family
                    .get_or_create(&RefusalLabels { limit: r.name() })
                    .clone()
            })
            .collect();
        let upstreams = UpstreamFamilies::default();
        root.register_with_unit(
            "upstream_request_duration",
            "Time of tools/call forwarded to an upstream MCP server, by upstream",
            Unit::Seconds,
            upstreams.requests.clone(),
        );
        root.register(
            "upstream_errors",
            "Forwarded calls that failed, by upstream and kind (timeout, down, rpc_error, protocol, busy, unauthorized)",
            upstreams.errors.clone(),
        );
        root.register(
            "upstream_up",
            "1 while an upstream MCP server is connected",
            upstreams.up.clone(),
        );
        root.register(
            "upstream_connections",
            "Ready processes (stdio) or sessions (http) of an upstream",
            upstreams.connections.clone(),
        );
        root.register(
            "upstream_restarts",
            "Restarts of an upstream's processes",
            upstreams.restarts.clone(),
        );
        root.register(
            "upstream_tools_awaiting_approval",
            "Tools of a pinned upstream whose definitions (new or changed) await approval",
            upstreams.awaiting_approval.clone(),
        );
        root.register(
            "upstream_served",
            "Tools, resources (and templates) and prompts an upstream's lists give clients, by kind",
            upstreams.served.clone(),
        );
        root.register(
            "upstream_tasks",
            "Tasks of an upstream's own that calls were followed through, by how they ended (completed, failed, cancelled, lost)",
            upstreams.tasks.clone(),
        );
        root.register(
            "upstream_questions",
            "Questions of an upstream (elicitation, sampling, roots) relayed to the client of a call, answered or refused",
            upstreams.questions.clone(),
        );
        root.register(
            "upstream_definition_changes",
            "Tool definitions of a pinned upstream that changed or appeared since approved",
            upstreams.definition_changes.clone(),
        );
        // Process CPU and memory per pod, for the dashboards (read from /proc when scraped).
        root.register_with_unit(
            "process_cpu",
            "Total user and system CPU time spent",
            Unit::Seconds,
            ProcessCpu,
        );
        root.register_with_unit(
            "process_resident_memory",
            "Resident memory size",
            Unit::Bytes,
            ProcessRss,
        );
        let gov = crate::metrics::governance::GovMetrics::register(&mut root);
        let tasks = crate::metrics::tasks::TaskMetrics::register(&mut root);
        let tokens = crate::metrics::tokens::TokenMetrics::register(&mut root);
        let oauth = crate::metrics::oauth::OAuthMetrics::register(&mut root);
        root.register(
            "build",
            "Build information",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION").to_owned()),
                ("profile", profile.to_owned()),
                ("allocator", allocator.to_owned()),
            ]),
        );
        Arc::new(Self {
            registry: root,
            dispatch,
            guards,
            hooks,
            request_duration,
            requests,
            inflight,
            registry_tools,
            registry_generation,
            reloads,
            reload_duration,
            streams,
            connections,
            peer_dropped,
            trace_spans_dropped,
            refusals,
            upstreams,
            gov,
            tasks,
            tokens,
            oauth,
        })
    }

    /// The instruments of an upstream (created on first use, shared afterwards).
    pub fn upstream(&self, name: &str) -> UpstreamMetrics {
        let f = &self.upstreams;
        let labels = UpstreamLabels {
            upstream: name.to_owned(),
        };
        UpstreamMetrics {
            requests: f.requests.get_or_create(&labels).clone(),
            errors: UPSTREAM_ERRORS
                .iter()
                .map(|kind| {
                    f.errors
                        .get_or_create(&UpstreamErrorLabels {
                            upstream: name.to_owned(),
                            kind,
                        })
                        .clone()
                })
                .collect(),
            up: f.up.get_or_create(&labels).clone(),
            connections: f.connections.get_or_create(&labels).clone(),
            restarts: f.restarts.get_or_create(&labels).clone(),
            awaiting_approval: f.awaiting_approval.get_or_create(&labels).clone(),
            definition_changes: f.definition_changes.get_or_create(&labels).clone(),
            served: UPSTREAM_SERVED
                .iter()
                .map(|kind| {
                    f.served
                        .get_or_create(&UpstreamServedLabels {
                            upstream: name.to_owned(),
                            kind,
                        })
                        .clone()
                })
                .collect(),
            tasks: by_outcome(&f.tasks, name, &UPSTREAM_TASK_OUTCOMES),
            questions: by_outcome(&f.questions, name, &UPSTREAM_QUESTION_OUTCOMES),
        }
    }

    /// The pinning instruments of an OpenAPI source that pins its operations (named
    /// `openapi.NAME` in the `upstream` label): tools awaiting approval, definitions that
    /// became pending. It has no connection or request series (its calls are http tools').
    /// [`Self::forget_upstream`] drops them.
    pub fn pinned_document(&self, source: &str) -> (Gauge<i64, AtomicI64>, Counter) {
        let labels = UpstreamLabels {
            upstream: source.to_owned(),
        };
        let f = &self.upstreams;
        (
            f.awaiting_approval.get_or_create(&labels).clone(),
            f.definition_changes.get_or_create(&labels).clone(),
        )
    }

    /// Drops the series of an upstream that is no longer configured.
    pub fn forget_upstream(&self, name: &str) {
        let f = &self.upstreams;
        let labels = UpstreamLabels {
            upstream: name.to_owned(),
        };
        f.requests.remove(&labels);
        f.up.remove(&labels);
        f.connections.remove(&labels);
        f.restarts.remove(&labels);
        f.awaiting_approval.remove(&labels);
        f.definition_changes.remove(&labels);
        for kind in UPSTREAM_ERRORS {
            f.errors.remove(&UpstreamErrorLabels {
                upstream: name.to_owned(),
                kind,
            });
        }
        for kind in UPSTREAM_SERVED {
            f.served.remove(&UpstreamServedLabels {
                upstream: name.to_owned(),
                kind,
            });
        }
        for (family, all) in [
            (&f.tasks, &UPSTREAM_TASK_OUTCOMES[..]),
            (&f.questions, &UPSTREAM_QUESTION_OUTCOMES[..]),
        ] {
            for outcome in all {
                family.remove(&UpstreamOutcomeLabels {
                    upstream: name.to_owned(),
                    outcome,
                });
            }
        }
    }

    /// Handles of one tool's dispatch histograms, each series created by its first call
    /// (or shared with an earlier snapshot's, when that one made it already).
    pub fn tool(&self) -> ToolMetrics {
        ToolMetrics {
            ok: OnceLock::new(),
            tool_error: OnceLock::new(),
            invalid_arguments: OnceLock::new(),
            family: self.dispatch.clone(),
            guards: self.guards.clone(),
            hooks: self.hooks.clone(),
            tokens: self.tokens.clone(),
        }
    }

    /// Drops the series of a tool that is no longer served.
    pub fn forget_tool(&self, name: &str) {
        for outcome in ["ok", "tool_error", "invalid_arguments"] {
            self.dispatch.remove(&ToolLabels {
                tool: name.to_owned(),
                outcome,
            });
        }
        self.tokens.forget_tool(name);
        for kind in crate::guard::KINDS {
            for action in ["flag", "redact", "refuse"] {
                self.guards.remove(&GuardLabels {
                    tool: name.to_owned(),
                    kind: kind.name(),
                    action,
                });
            }
        }
    }

    /// The request instruments of each of `labels` (the `method` label values, which the
    /// dispatcher names), their series made at zero; slot `i` is `labels[i]`.
    pub fn methods(&self, labels: &'static [&'static str]) -> MethodMetrics {
        let durations = labels
            .iter()
            .map(|method| {
                self.request_duration
                    .get_or_create(&MethodLabels { method })
                    .clone()
            })
            .collect();
        let requests = labels
            .iter()
            .flat_map(|method| OUTCOMES.iter().map(move |outcome| (method, outcome)))
            .map(|(method, outcome)| {
                self.requests
                    .get_or_create(&RequestLabels { method, outcome })
                    .clone()
            })
            .collect();
        MethodMetrics { durations, requests }
    }

    /// Counts work turned away by a limit.
    #[inline]
    pub fn refused(&self, r: Refusal) {
        self.refusals[r as usize].inc();
    }

    /// How often a limit has turned work away.
    pub fn refusals(&self, r: Refusal) -> u64 {
        self.refusals[r as usize].get()
    }

    /// Counts a reload attempt.
    pub fn reload(&self, result: &'static str) {
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        if crate::otel::enabled() {
            out = self.with_exemplars(&out);
        }
        out
    }

    /// The exposition with each dispatch bucket's exemplar (the latest sampled trace that
    /// landed in it) after its sample, as OpenMetrics writes exemplars.
    fn with_exemplars(&self, text: &str) -> String {
        const BUCKET: &str = "quiver_dispatch_duration_seconds_bucket{";
        let mut out = String::with_capacity(text.len() + 1024);
        for line in text.lines() {
            out.push_str(line);
            if let Some(labels) = line.strip_prefix(BUCKET)
                && let Some(e) = self.bucket_exemplar(labels)
            {
                out.push_str(&e);
            }
            out.push('\n');
        }
        out
    }

    /// The exemplar of the dispatch bucket whose labels (and sample) are `rest`.
    fn bucket_exemplar(&self, rest: &str) -> Option<String> {
        let label = |name: &str| -> Option<&str> {
            let start = rest.find(&format!("{name}=\""))? + name.len() + 2;
            let len = rest[start..].find('"')?;
            let v = &rest[start..start + len];
            // An escaped value is not looked up (tool names have no quotes or backslashes).
            (!v.contains('\\')).then_some(v)
        };
        let outcome = ["ok", "tool_error", "invalid_arguments"]
            .into_iter()
            .find(|o| label("outcome") == Some(*o))?;
        let h = self.dispatch.get(&ToolLabels {
            tool: label("tool")?.to_owned(),
            outcome,
        })?;
        let i = match label("le")? {
            "+Inf" => h.0.bounds.len(),
            le => {
                let le: f64 = le.parse().ok()?;
                h.0.bounds
                    .iter()
                    .position(|b| (*b - le).abs() <= f64::EPSILON * b.abs().max(1.0))?
            }
        };
        h.exemplar_text(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_code_has_its_outcome_label() {
        use crate::protocol as p;
        for (code, label) in [
            (p::PARSE_ERROR, "parse_error"),
            (p::INVALID_REQUEST, "invalid_request"),
            (p::METHOD_NOT_FOUND, "method_not_found"),
            (p::INVALID_PARAMS, "invalid_params"),
            (p::RESOURCE_NOT_FOUND, "invalid_params"),
            (p::INTERNAL_ERROR, "internal_error"),
            (p::FORBIDDEN, "forbidden"),
            (p::REQUEST_CANCELLED, "cancelled"),
            (p::MISSING_CAPABILITY, "missing_capability"),
            (p::HEADER_MISMATCH, "header_mismatch"),
            (p::UNSUPPORTED_VERSION, "unsupported_version"),
            (p::RATE_LIMITED, "rate_limited"),
            (-1, "internal_error"),
        ] {
            assert_eq!(OUTCOMES[outcome_index(code)], label, "{code}");
        }
        assert_eq!(OUTCOMES[0], "ok");
    }

    #[test]
    fn shared_limit_failure_series_exist_at_zero_before_any_failure() {
        let text = Metrics::new("test", "system").encode();
        for kind in crate::metrics::governance::SHARED_FAILURE_KINDS {
            let series = format!("quiver_limits_shared_failures_total{{kind=\"{kind}\"}} 0");
            assert!(text.contains(&series), "{series} in\n{text}");
        }
    }

    #[test]
    fn task_series_exist_at_zero_before_any_task() {
        let text = Metrics::new("test", "system").encode();
        for series in [
            "quiver_tasks_created_total 0",
            "quiver_tasks_running 0",
            "quiver_tasks_ended_total{status=\"stopped\"} 0",
            "quiver_task_store_failures_total{op=\"get\"} 0",
            "quiver_task_store_failures_total{op=\"finish\"} 0",
        ] {
            assert!(text.contains(series), "{series} in\n{text}");
        }
    }

    #[test]
    fn oauth_vault_series_exist_at_zero_before_any_token() {
        let m = Metrics::new("test", "system");
        let text = m.encode();
        assert!(text.contains("quiver_oauth_vault_tokens 0"), "{text}");
        for reason in crate::metrics::oauth::VAULT_ERROR_REASONS {
            let series = format!("quiver_oauth_vault_errors_total{{reason=\"{reason}\"}} 0");
            assert!(text.contains(&series), "{series} in\n{text}");
        }
        m.oauth.vault_error("forged");
        m.oauth.vault_tokens_add(2);
        let text = m.encode();
        assert!(
            text.contains("quiver_oauth_vault_errors_total{reason=\"forged\"} 1"),
            "{text}"
        );
        assert!(text.contains("quiver_oauth_vault_tokens 2"), "{text}");
    }

    #[test]
    fn histogram_buckets_and_exposition() {
        let m = Metrics::new("test", "system");
        let t = m.tool();
        assert!(!m.encode().contains("tool=\"add\""), "no series before a call");
        t.ok("add").observe(Duration::from_micros(3));
        t.ok("add").observe(Duration::from_millis(2));
        let methods = m.methods(&["ping", "tools/call"]);
        assert!(
            m.encode()
                .contains("quiver_requests_total{method=\"tools/call\",outcome=\"rate_limited\"} 0"),
            "every outcome of a method has its series before the first request"
        );
        methods.record(1, 0, Duration::from_micros(40));
        let text = m.encode();
        assert!(
            text.contains("quiver_dispatch_duration_seconds_count{tool=\"add\",outcome=\"ok\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "quiver_dispatch_duration_seconds_bucket{le=\"5e-6\",tool=\"add\",outcome=\"ok\"} 1"
            ) || text.contains("le=\"0.000005\""),
            "{text}"
        );
        assert!(
            text.contains("quiver_requests_total{method=\"tools/call\",outcome=\"ok\"} 1"),
            "{text}"
        );
        assert!(text.contains("quiver_build_info{version="), "{text}");
        assert!(text.contains("quiver_process_resident_memory_bytes "), "{text}");
        // histogram_quantile needs the +Inf bucket.
        assert!(
            text.contains(r#"quiver_dispatch_duration_seconds_bucket{le="+Inf",tool="add",outcome="ok"} 2"#),
            "{text}"
        );
        // Error outcomes have a series once a call ends that way, shared by later snapshots.
        assert!(
            !text.contains("outcome=\"tool_error\"") && !text.contains("outcome=\"invalid_arguments\""),
            "{text}"
        );
        t.tool_error("add").observe(Duration::from_micros(9));
        m.tool().tool_error("add").observe(Duration::from_micros(9));
        let text = m.encode();
        assert!(
            text.contains(r#"quiver_dispatch_duration_seconds_count{tool="add",outcome="tool_error"} 2"#),
            "{text}"
        );
        assert!(!text.contains("outcome=\"invalid_arguments\""), "{text}");
        m.forget_tool("add");
        assert!(!m.encode().contains("tool=\"add\""));
    }
}
