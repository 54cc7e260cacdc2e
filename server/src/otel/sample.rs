//! Whether an MCP request is traced, decided before anything is built for it.
//!
//! With a ratio sampler (`--trace-sample-ratio` below 1) most requests are not sampled,
//! and those should cost next to nothing: no parse of `params._meta`, no span, no context
//! to run under. So a request is decided in this order:
//!
//! 1. its `params` name a `traceparent` (a byte search of the raw JSON; only then is
//!    `_meta` parsed): its client's decision stands (parent-based sampling);
//! 2. the transport gave a context (HTTP `traceparent`): likewise;
//! 3. otherwise a trace id is drawn from the SDK's own thread-local generator and judged
//!    by the SDK's ratio rule. Not sampled: the request runs untraced. Sampled: the id is
//!    handed to the SDK ([`Ids`]) for the span it starts at once, so both agree.
//!
//! A client that spells the key with JSON escapes is not found by the byte search: its
//! request is judged as one without a parent.
//!
//! Without a ratio by flag the sampler comes from `OTEL_TRACES_SAMPLER`, which only the
//! SDK interprets: every request then goes through the SDK as it is.

use std::cell::Cell;
use std::sync::OnceLock;

use opentelemetry::Context;
use opentelemetry::trace::{SpanId, SpanKind, TraceContextExt, TraceId, Tracer as _};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracer};

/// The ratio of requests without a parent that are sampled, when known (set at start).
static RATIO: OnceLock<f64> = OnceLock::new();

/// Records the ratio of the sampler in force (`None`: the SDK's, from the environment).
pub(super) fn set_ratio(ratio: Option<f64>) {
    if let Some(r) = ratio {
        let _ = RATIO.set(r);
    }
}

thread_local! {
    /// A trace id already judged sampled, for the root span this thread starts next.
    static STAGED: Cell<Option<TraceId>> = const { Cell::new(None) };
}

/// The SDK's random ids, except that a root span started right after a sampled draw gets
/// the id that was drawn.
#[derive(Debug, Default)]
pub(super) struct Ids;

impl IdGenerator for Ids {
    fn new_trace_id(&self) -> TraceId {
        STAGED
            .take()
            .unwrap_or_else(|| RandomIdGenerator::default().new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        RandomIdGenerator::default().new_span_id()
    }
}

/// The ratio rule of the SDK's `TraceIdRatioBased` sampler: the trace id's low 63 bits
/// below `ratio` of their range.
fn ratio_samples(ratio: f64, id: TraceId) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    let bound = (ratio.max(0.0) * (1u64 << 63) as f64) as u64;
    let low = u64::from_be_bytes(id.to_bytes()[8..].try_into().unwrap_or_default());
    (low >> 1) < bound
}

/// How a request is to be traced.
#[derive(Debug)]
enum Decision {
    /// Not sampled: run it untraced.
    Untraced,
    /// Start its span below this parent (the empty context for a root), with this trace
    /// id when one was drawn.
    Traced(Context, Option<TraceId>),
}

/// Decides as the module doc says; `ratio` is the known sampler's, `draw` a new trace id.
fn decide(ratio: Option<f64>, params: Option<&str>, draw: impl FnOnce() -> TraceId) -> Decision {
    let meta = params
        .filter(|p| p.contains("traceparent"))
        .and_then(super::propagate::from_meta_str);
    let Some(ratio) = ratio else {
        return Decision::Traced(meta.unwrap_or_else(Context::current), None);
    };
    let parent = meta
        .or_else(|| Context::map_current(|cx| cx.span().span_context().is_valid()).then(Context::current));
    match parent {
        // Parent-based: a remote parent's flag decides (unsampled parents are dropped).
        Some(p) if p.span().span_context().is_sampled() => Decision::Traced(p, None),
        Some(_) => Decision::Untraced,
        None if ratio >= 1.0 => Decision::Traced(Context::new(), None),
        None => {
            let id = draw();
            if ratio_samples(ratio, id) {
                Decision::Traced(Context::new(), Some(id))
            } else {
                Decision::Untraced
            }
        }
    }
}

/// The context of a new server span for an MCP request with raw `params`, or `None` when
/// the request is not sampled and nothing at all should be made for it.
pub fn request_span(tracer: &SdkTracer, params: Option<&str>) -> Option<Context> {
    start(tracer, RATIO.get().copied(), params)
}

fn start(tracer: &SdkTracer, ratio: Option<f64>, params: Option<&str>) -> Option<Context> {
    let draw = || RandomIdGenerator::default().new_trace_id();
    let Decision::Traced(parent, id) = decide(ratio, params, draw) else {
        return None;
    };
    STAGED.set(id);
    let span = tracer
        .span_builder("mcp")
        .with_kind(SpanKind::Server)
        .start_with_context(tracer, &parent);
    STAGED.set(None);
    Some(parent.with_span(span))
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};

    const SAMPLED: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const UNSAMPLED: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";

    fn meta(tp: &str) -> String {
        format!(r#"{{"name":"t","_meta":{{"traceparent":"{tp}"}}}}"#)
    }

    fn never() -> TraceId {
        panic!("no trace id may be drawn here")
    }

    #[test]
    fn an_unsampled_request_is_decided_before_any_span() {
        // Ratio 0, no parent: nothing but the draw happens.
        let plain = r#"{"name":"t","arguments":{"x":1}}"#;
        assert!(matches!(
            decide(Some(0.0), Some(plain), || TraceId::from(u128::MAX)),
            Decision::Untraced
        ));
        // A client's unsampled parent is honoured without a draw.
        assert!(matches!(
            decide(Some(0.5), Some(&meta(UNSAMPLED)), never),
            Decision::Untraced
        ));
        // A sampled parent is traced even at ratio 0, below that parent.
        let Decision::Traced(p, None) = decide(Some(0.0), Some(&meta(SAMPLED)), never) else {
            panic!("a sampled parent must be traced");
        };
        assert_eq!(
            p.span().span_context().trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        // "traceparent" elsewhere in the params, or a broken one: judged as no parent.
        let elsewhere = r#"{"name":"t","arguments":{"traceparent":"x"}}"#;
        assert!(matches!(
            decide(Some(0.0), Some(elsewhere), || TraceId::from(u128::MAX)),
            Decision::Untraced
        ));
        // Ratio 1: always a root, no draw.
        assert!(matches!(
            decide(Some(1.0), None, never),
            Decision::Traced(_, None)
        ));
        // An unknown sampler (from the environment): the SDK decides.
        assert!(matches!(
            decide(None, Some(plain), never),
            Decision::Traced(_, None)
        ));
    }

    #[test]
    fn the_ratio_rule_is_the_sdks() {
        assert!(ratio_samples(0.5, TraceId::from(0u128)));
        assert!(!ratio_samples(0.5, TraceId::from(u128::from(u64::MAX))));
        assert!(!ratio_samples(0.0, TraceId::from(0u128)));
        assert!(ratio_samples(1.0, TraceId::from(u128::MAX)));
    }

    #[test]
    fn a_sampled_draw_is_the_span_the_sdk_samples() {
        let provider = SdkTracerProvider::builder()
            .with_id_generator(Ids)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(0.5))))
            .build();
        let tracer = provider.tracer("t");
        let mut traced = 0;
        for _ in 0..400 {
            if let Some(cx) = start(&tracer, Some(0.5), None) {
                // Had the SDK drawn its own id, about half of these would not be sampled.
                assert!(cx.span().span_context().is_sampled());
                traced += 1;
            }
        }
        assert!((100..300).contains(&traced), "{traced} of 400 sampled at 0.5");
        assert_eq!(STAGED.get(), None);
    }
}
