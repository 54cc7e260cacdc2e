//! OpenTelemetry traces: the tracer (off unless an OTLP endpoint is configured), the spans
//! Quiver opens and how a trace context travels in and out (W3C `traceparent`/`tracestate`
//! in HTTP headers and in an MCP message's `params._meta`).
//!
//! Off, the hot path pays one branch: [`enabled`] is one atomic load, and every helper
//! returns at once. On, each MCP request gets a server span, which the steps below it
//! (auth, pipeline steps, http tools, upstream calls) find as the current context.
//!
//! A step that wants its own span (a policy check, a limit) calls [`child`] and, when it
//! gets a context back, runs under it and ends it with [`finish`].

pub mod config;
mod export;
pub mod logs;
pub mod propagate;
pub mod sample;
pub mod spans;

use std::borrow::Cow;
use std::sync::OnceLock;

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

pub use self::config::{ClientTraceArgs, TraceArgs, TrustSampling};
pub use opentelemetry::context::FutureExt;

/// The tracer, set once at start when tracing is on.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Whether spans are made at all (an OTLP endpoint is configured).
#[inline]
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// The tracer, when tracing is on.
#[inline]
pub fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get()
}

/// The running exporter; [`Guard::shutdown`] exports what is left (at exit).
#[derive(Debug)]
pub struct Guard {
    provider: SdkTracerProvider,
    flusher: export::Flusher,
    ratio: Option<f64>,
    own_ratio: f64,
}

impl Guard {
    /// The tracer provider (for a `tracing` bridge).
    pub fn provider(&self) -> &SdkTracerProvider {
        &self.provider
    }

    /// Exports the spans still queued, waiting at most `timeout`, and stops the provider.
    pub async fn shutdown(self, timeout: std::time::Duration) {
        export::flush(&self.flusher, timeout).await;
        let _ = self.provider.shutdown();
    }
}

/// Turns tracing on as `args` and the environment say (see [`config`]), following clients'
/// trace contexts as far as `client` says; `None` when off.
/// `dropped` counts spans the full export queue refused. Needs a Tokio runtime (the
/// exporter runs on it).
///
/// # Errors
/// The configuration is invalid (an endpoint that is not a URL, a ratio outside 0..=1).
pub fn init(
    args: &TraceArgs,
    client: &ClientTraceArgs,
    dropped: prometheus_client::metrics::counter::Counter,
) -> anyhow::Result<Option<Guard>> {
    let Some(guard) = start(args, dropped, "quiver-server")? else {
        return Ok(None);
    };
    let tracer = opentelemetry::trace::TracerProvider::tracer(&guard.provider, "quiver-server");
    if TRACER.set(tracer).is_err() {
        anyhow::bail!("tracing was already initialised");
    }
    sample::set_policy(guard.ratio, guard.own_ratio, client.trace_trust_client_sampling);
    propagate::set_forward_state(client.trace_forward_tracestate);
    Ok(Some(guard))
}

/// The exporter and provider alone, for a program that makes its spans otherwise (the
/// operator, through its `tracing` spans): configured like the server's; `service` is the
/// default `service.name`. `None` when tracing is off. Needs a Tokio runtime.
///
/// # Errors
/// The configuration is invalid.
pub fn start(
    args: &TraceArgs,
    dropped: prometheus_client::metrics::counter::Counter,
    service: &'static str,
) -> anyhow::Result<Option<Guard>> {
    let Some(cfg) = args.resolve()? else {
        return Ok(None);
    };
    let (provider, flusher) = export::provider(&cfg, dropped, service)?;
    tracing::info!(
        endpoint = %cfg.endpoint_shown(),
        sampler = %cfg.sampler_shown(),
        "exporting traces over OTLP/HTTP"
    );
    Ok(Some(Guard {
        provider,
        flusher,
        ratio: cfg.ratio,
        own_ratio: cfg.own_ratio,
    }))
}

/// Opens a span below the current context (an internal step of a request, unless `kind`
/// says otherwise). `None` when tracing is off or there is no sampled span to hang it on
/// (then the caller does nothing more).
#[inline]
pub fn child(
    name: impl Into<Cow<'static, str>>,
    kind: SpanKind,
    attributes: Vec<KeyValue>,
) -> Option<Context> {
    let tracer = tracer()?;
    if !Context::map_current(|cx| cx.span().span_context().is_sampled()) {
        return None;
    }
    let parent = Context::current();
    let span = tracer
        .span_builder(name)
        .with_kind(kind)
        .with_attributes(attributes)
        .start_with_context(tracer, &parent);
    Some(parent.with_span(span))
}

/// The hook for a step of a request (a policy check, a limit): an internal span named
/// `name` below the request's span, or `None` (nothing to do) when tracing is off or the
/// request is not sampled. End it with [`finish`]; for async work run the future under it
/// with [`spans::within`]. Off, it costs one branch and allocates nothing.
#[inline]
pub fn internal(name: &'static str) -> Option<Context> {
    if !enabled() {
        return None;
    }
    child(name, SpanKind::Internal, Vec::new())
}

/// Ends the span of `cx`, as an error when `error` names one (`error.type`).
pub fn finish(cx: &Context, error: Option<&str>) {
    let span = cx.span();
    if let Some(e) = error {
        span.set_attribute(KeyValue::new("error.type", e.to_owned()));
        span.set_status(Status::error(e.to_owned()));
    }
    span.end();
}

/// Marks the current span as failed with a JSON-RPC error (`rpc.response.status_code`,
/// `error.type`). Called on error paths only; nothing when tracing is off.
pub fn rpc_error(code: i32) {
    if !enabled() {
        return;
    }
    let cx = Context::current();
    let span = cx.span();
    span.set_attribute(KeyValue::new("rpc.response.status_code", code.to_string()));
    span.set_attribute(KeyValue::new("error.type", code.to_string()));
    span.set_status(Status::error(format!("JSON-RPC error {code}")));
}

/// Marks the current span as a tool call that ended with `isError: true`.
pub fn tool_error() {
    if !enabled() {
        return;
    }
    let cx = Context::current();
    let span = cx.span();
    span.set_attribute(KeyValue::new("error.type", "tool_error"));
    span.set_status(Status::error("tool_error"));
}

/// The trace id of the current span when it is sampled (for exemplars and logs).
pub fn current_trace_id() -> Option<opentelemetry::trace::TraceId> {
    if !enabled() {
        return None;
    }
    Context::map_current(|cx| {
        let span = cx.span();
        let sc = span.span_context();
        sc.is_sampled().then(|| sc.trace_id())
    })
}
