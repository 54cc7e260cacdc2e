//! Logging and traces of the operator: `RUST_LOG`-filtered logs, and, when an OTLP endpoint
//! is configured (`--otlp-endpoint` or the `OTEL_*` variables, as for quiver-server), every
//! `tracing` span (one per reconcile, one per stage) exported as an OpenTelemetry span.

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Starts logging, and tracing when configured; the guard flushes spans at exit.
///
/// # Errors
/// The tracing configuration is invalid.
pub fn init(args: &quiver_otel::TraceArgs) -> anyhow::Result<Option<quiver_otel::Guard>> {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into());
    // Resolved first: its log line must find the subscriber, so it comes after init.
    let on = args.resolve()?.is_some();
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer());
    if !on {
        registry.init();
        return Ok(None);
    }
    let guard = quiver_otel::start(
        args,
        prometheus_client::metrics::counter::Counter::default(),
        "quiver-operator",
    )?;
    let layer = guard.as_ref().map(|g| {
        let tracer = opentelemetry::trace::TracerProvider::tracer(g.provider(), "quiver-operator");
        tracing_opentelemetry::layer().with_tracer(tracer)
    });
    registry.with(layer).init();
    Ok(guard)
}
