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
//! A client's decision stands in 1 and 2 only when its sampled flag is trusted
//! (`--trace-trust-client-sampling`: by default, callers that authenticated). Otherwise the
//! parent's trace continues, but whether it is traced is the server's own decision: the
//! ratio of its sampler applied to that trace id. A client cannot make an anonymous request
//! expensive (exported) by setting a flag.
//!
//! A client that spells the key with JSON escapes is not found by the byte search: its
//! request is judged as one without a parent.
//!
//! Without a ratio by flag the sampler comes from `OTEL_TRACES_SAMPLER`, which only the
//! SDK interprets: every request with a trusted parent or without one then goes through
//! the SDK as it is.

use std::cell::Cell;
use std::sync::OnceLock;

use opentelemetry::Context;
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TraceContextExt, TraceId, Tracer as _};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracer};

use super::config::TrustSampling;

/// The ratio of requests without a parent that are sampled, when known (set at start).
static RATIO: OnceLock<f64> = OnceLock::new();
/// The ratio of the sampler in force, flag or environment (set at start).
static OWN: OnceLock<f64> = OnceLock::new();
/// Whose sampled flag is obeyed (set at start; `authenticated` until then).
static TRUST: OnceLock<TrustSampling> = OnceLock::new();

/// Records the ratio of the sampler in force (`ratio`: by flag, `None`: the SDK's, from the
/// environment; `own`: either), and whose sampled flag is obeyed.
pub(super) fn set_policy(ratio: Option<f64>, own: f64, trust: TrustSampling) {
    if let Some(r) = ratio {
        let _ = RATIO.set(r);
    }
    let _ = OWN.set(own);
    let _ = TRUST.set(trust);
}

/// Whether a caller's sampled flag is obeyed; `authenticated`: it presented valid
/// credentials, or it is stdio's client.
#[inline]
pub fn trusts(authenticated: bool) -> bool {
    trust_of(TRUST.get().copied().unwrap_or_default(), authenticated)
}

fn trust_of(trust: TrustSampling, authenticated: bool) -> bool {
    match trust {
        TrustSampling::Never => false,
        TrustSampling::Authenticated => authenticated,
        TrustSampling::Always => true,
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

/// What a decision goes by.
#[derive(Debug, Clone, Copy)]
struct Policy {
    /// The known sampler's ratio (by flag), for requests without a parent.
    ratio: Option<f64>,
    /// The ratio of the sampler in force, for a parent whose flag is not trusted.
    own: f64,
    /// Whether the client's sampled flag is obeyed.
    trusted: bool,
}

/// Decides as the module doc says; `draw` makes a new trace id.
fn decide(policy: Policy, params: Option<&str>, draw: impl FnOnce() -> TraceId) -> Decision {
    let meta = params
        .filter(|p| p.contains("traceparent"))
        .and_then(super::propagate::from_meta_str);
    let current = || Context::map_current(|cx| cx.span().span_context().is_valid()).then(Context::current);
    let meta = if policy.trusted {
        meta
    } else {
        // The client's trace continues; whether it is traced is the server's decision.
        match meta.or_else(current) {
            Some(p) => {
                return own_decision(&p, policy.own)
                    .map_or(Decision::Untraced, |p| Decision::Traced(p, None));
            }
            None => None,
        }
    };
    let Some(ratio) = policy.ratio else {
        return Decision::Traced(meta.unwrap_or_else(Context::current), None);
    };
    let parent = meta.or_else(current);
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

/// The server's own decision on `parent`, whose client's sampled flag is not trusted: the
/// ratio `own` applied to its trace id, as the SDK's ratio rule would. Sampled: the parent
/// marked sampled (so a parent-based sampler follows), its trace and span ids kept.
fn own_decision(parent: &Context, own: f64) -> Option<Context> {
    let span = parent.span();
    let sc = span.span_context();
    if !sc.is_valid() || !ratio_samples(own, sc.trace_id()) {
        return None;
    }
    let marked = SpanContext::new(
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().with_sampled(true),
        true,
        sc.trace_state().clone(),
    );
    Some(Context::new().with_remote_span_context(marked))
}

/// The parent of a span made before the caller is known (the HTTP `auth` span) under the
/// client's context `parent`: as the client says when every client is trusted, else as the
/// server decides. `None`: no span.
pub fn before_auth(parent: &Context) -> Option<Context> {
    before_auth_with(
        TRUST.get().copied().unwrap_or_default(),
        OWN.get().copied().unwrap_or(1.0),
        parent,
    )
}

fn before_auth_with(trust: TrustSampling, own: f64, parent: &Context) -> Option<Context> {
    if trust == TrustSampling::Always {
        return parent.span().span_context().is_sampled().then(|| parent.clone());
    }
    own_decision(parent, own)
}

/// The context of a new server span for an MCP request with raw `params`, or `None` when
/// the request is not sampled and nothing at all should be made for it.
pub fn request_span(tracer: &SdkTracer, params: Option<&str>, trusted: bool) -> Option<Context> {
    let policy = Policy {
        ratio: RATIO.get().copied(),
        own: OWN.get().copied().unwrap_or(1.0),
        trusted,
    };
    start(tracer, policy, params)
}

fn start(tracer: &SdkTracer, policy: Policy, params: Option<&str>) -> Option<Context> {
    let draw = || RandomIdGenerator::default().new_trace_id();
    let Decision::Traced(parent, id) = decide(policy, params, draw) else {
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

    /// A ratio by flag, clients trusted.
    fn known(r: f64) -> Policy {
        Policy {
            ratio: Some(r),
            own: r,
            trusted: true,
        }
    }

    /// The SDK's sampler from the environment, clients trusted.
    fn env_sampler() -> Policy {
        Policy {
            ratio: None,
            own: 1.0,
            trusted: true,
        }
    }

    fn untrusted(ratio: Option<f64>, own: f64) -> Policy {
        Policy {
            ratio,
            own,
            trusted: false,
        }
    }

    /// The trace id and the parent span id a decision continues, and whether it is sampled.
    fn continued(d: &Decision) -> Option<(String, String, bool)> {
        match d {
            Decision::Traced(p, None) => {
                let sc = p.span().span_context().clone();
                Some((
                    sc.trace_id().to_string(),
                    sc.span_id().to_string(),
                    sc.is_sampled(),
                ))
            }
            _ => None,
        }
    }

    #[test]
    fn an_untrusted_clients_flag_does_not_decide() {
        let id = "0af7651916cd43dd8448eb211c80319c".to_owned();
        let span = "b7ad6b7169203331".to_owned();
        // Sampled by the client, not by the server's ratio: untraced, whatever the flag says.
        for ratio in [Some(0.0), None] {
            let d = decide(untrusted(ratio, 0.0), Some(&meta(SAMPLED)), never);
            assert!(matches!(d, Decision::Untraced), "{ratio:?}: {d:?}");
        }
        // The server's ratio keeps it: traced, continuing the client's trace and span.
        for ratio in [Some(1.0), None] {
            let d = decide(untrusted(ratio, 1.0), Some(&meta(SAMPLED)), never);
            assert_eq!(continued(&d), Some((id.clone(), span.clone(), true)), "{ratio:?}");
        }
        // Not sampled by the client: the server's decision again, which may be to trace.
        let d = decide(untrusted(Some(1.0), 1.0), Some(&meta(UNSAMPLED)), never);
        assert_eq!(continued(&d), Some((id.clone(), span.clone(), true)));
        // The ratio is applied to the client's trace id, as the SDK's rule would.
        let low = "00-0000000000000000000000000000000f-b7ad6b7169203331-01";
        let high = "00-0000000000000000ffffffffffffffff-b7ad6b7169203331-01";
        assert!(matches!(
            decide(untrusted(Some(0.5), 0.5), Some(&meta(low)), never),
            Decision::Traced(..)
        ));
        assert!(matches!(
            decide(untrusted(Some(0.5), 0.5), Some(&meta(high)), never),
            Decision::Untraced
        ));
        // A transport's context (HTTP `traceparent`) is judged the same way.
        let cx = super::super::propagate::from_meta_str(&meta(SAMPLED)).unwrap();
        let _guard = cx.attach();
        assert!(matches!(
            decide(untrusted(Some(0.0), 0.0), None, never),
            Decision::Untraced
        ));
        let d = decide(untrusted(Some(0.0), 1.0), None, never);
        assert_eq!(continued(&d), Some((id, span, true)));
    }

    #[test]
    fn the_auth_span_follows_the_client_only_when_every_client_is_trusted() {
        let sampled = super::super::propagate::from_meta_str(&meta(SAMPLED)).unwrap();
        let unsampled = super::super::propagate::from_meta_str(&meta(UNSAMPLED)).unwrap();
        let is_sampled = |c: Option<Context>| c.is_some_and(|c| c.span().span_context().is_sampled());
        assert!(is_sampled(before_auth_with(TrustSampling::Always, 0.0, &sampled)));
        assert!(before_auth_with(TrustSampling::Always, 1.0, &unsampled).is_none());
        for trust in [TrustSampling::Authenticated, TrustSampling::Never] {
            assert!(before_auth_with(trust, 0.0, &sampled).is_none(), "{trust:?}");
            assert!(is_sampled(before_auth_with(trust, 1.0, &unsampled)), "{trust:?}");
        }
    }

    #[test]
    fn who_is_trusted_is_the_setting() {
        for (trust, anonymous, authenticated) in [
            (TrustSampling::Never, false, false),
            (TrustSampling::Authenticated, false, true),
            (TrustSampling::Always, true, true),
        ] {
            assert_eq!(trust_of(trust, false), anonymous, "{trust:?}");
            assert_eq!(trust_of(trust, true), authenticated, "{trust:?}");
        }
        assert_eq!(TrustSampling::default(), TrustSampling::Authenticated);
    }

    #[test]
    fn an_unsampled_request_is_decided_before_any_span() {
        // Ratio 0, no parent: nothing but the draw happens.
        let plain = r#"{"name":"t","arguments":{"x":1}}"#;
        assert!(matches!(
            decide(known(0.0), Some(plain), || TraceId::from(u128::MAX)),
            Decision::Untraced
        ));
        // A client's unsampled parent is honoured without a draw.
        assert!(matches!(
            decide(known(0.5), Some(&meta(UNSAMPLED)), never),
            Decision::Untraced
        ));
        // A sampled parent is traced even at ratio 0, below that parent.
        let Decision::Traced(p, None) = decide(known(0.0), Some(&meta(SAMPLED)), never) else {
            panic!("a sampled parent must be traced");
        };
        assert_eq!(
            p.span().span_context().trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        // "traceparent" elsewhere in the params, or a broken one: judged as no parent.
        let elsewhere = r#"{"name":"t","arguments":{"traceparent":"x"}}"#;
        assert!(matches!(
            decide(known(0.0), Some(elsewhere), || TraceId::from(u128::MAX)),
            Decision::Untraced
        ));
        // Ratio 1: always a root, no draw.
        assert!(matches!(
            decide(known(1.0), None, never),
            Decision::Traced(_, None)
        ));
        // An unknown sampler (from the environment): the SDK decides.
        assert!(matches!(
            decide(env_sampler(), Some(plain), never),
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
            if let Some(cx) = start(&tracer, known(0.5), None) {
                // Had the SDK drawn its own id, about half of these would not be sampled.
                assert!(cx.span().span_context().is_sampled());
                traced += 1;
            }
        }
        assert!((100..300).contains(&traced), "{traced} of 400 sampled at 0.5");
        assert_eq!(STAGED.get(), None);
    }
}
