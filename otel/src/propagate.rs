//! W3C trace context in and out: `traceparent`/`tracestate` from HTTP headers and from an
//! MCP message's `params._meta` (the MCP convention), and into outgoing HTTP requests and
//! `_meta` of requests to upstream MCP servers.
//!
//! What a client sends is hostile: a `traceparent` longer than its fixed 55 characters or
//! a `tracestate` longer than W3C's 512 is ignored, and anything the W3C propagator does
//! not accept starts a new trace. A client's `tracestate` is dropped as it arrives unless
//! the server is told to forward it (`--trace-forward-tracestate`): otherwise its text
//! would travel verbatim to every upstream and API a call reaches.

use std::borrow::Cow;

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::sync::atomic::{AtomicBool, Ordering};

/// Longest `traceparent` read (version 00 has exactly 55 characters; later versions may
/// add fields).
const MAX_TRACEPARENT: usize = 128;
/// Longest `tracestate` read (W3C: at most 32 members, 512 characters in total is what a
/// vendor must propagate).
const MAX_TRACESTATE: usize = 512;

/// Whether a client's `tracestate` is kept (and so passed on); set at start.
static FORWARD_STATE: AtomicBool = AtomicBool::new(false);

/// Keeps clients' `tracestate` (`true`) or drops it as it arrives (`false`, the default).
pub(super) fn set_forward_state(forward: bool) {
    FORWARD_STATE.store(forward, Ordering::Relaxed);
}

/// The two fields, as a message or request carries them.
#[derive(Debug, Default, Deserialize)]
struct Fields<'a> {
    #[serde(borrow, default)]
    traceparent: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tracestate: Option<Cow<'a, str>>,
}

impl Extractor for Fields<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => self.traceparent.as_deref().filter(|v| v.len() <= MAX_TRACEPARENT),
            "tracestate" => self.tracestate.as_deref().filter(|v| v.len() <= MAX_TRACESTATE),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

/// The context `fields` carry; their `tracestate` only when `keep_state`.
fn extract(mut fields: Fields<'_>, keep_state: bool) -> Option<Context> {
    fields.traceparent.as_ref()?;
    if !keep_state {
        fields.tracestate = None;
    }
    let cx = TraceContextPropagator::new().extract_with_context(&Context::new(), &fields);
    cx.span().span_context().is_valid().then_some(cx)
}

/// Whether clients' `tracestate` is kept.
fn keep_state() -> bool {
    FORWARD_STATE.load(Ordering::Relaxed)
}

/// The client's context from HTTP headers, if they carry a valid `traceparent` (its
/// `tracestate` only when the server forwards it).
pub fn from_headers(headers: &http::HeaderMap) -> Option<Context> {
    from_headers_with(headers, keep_state())
}

fn from_headers_with(headers: &http::HeaderMap, keep_state: bool) -> Option<Context> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(Cow::Borrowed);
    extract(
        Fields {
            traceparent: text("traceparent"),
            tracestate: text("tracestate"),
        },
        keep_state,
    )
}

/// The client's context from a request's `params._meta`, if it carries a valid
/// `traceparent` (its `tracestate` only when the server forwards it). Reads the params only
/// as far as serde must to find `_meta`.
pub fn from_meta(params: Option<&RawValue>) -> Option<Context> {
    from_meta_str(params?.get())
}

/// [`from_meta`] of the params' raw JSON text.
pub fn from_meta_str(params: &str) -> Option<Context> {
    from_meta_with(params, keep_state())
}

fn from_meta_with(params: &str, keep_state: bool) -> Option<Context> {
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(borrow, default, rename = "_meta")]
        meta: Option<Fields<'a>>,
    }
    let p: Params<'_> = serde_json::from_str(params).ok()?;
    extract(p.meta?, keep_state)
}

/// The `traceparent` (and `tracestate`, when not empty) of the span of `cx`, to send on.
pub fn fields(cx: &Context) -> Option<(String, Option<String>)> {
    struct Collect(Option<String>, Option<String>);
    impl Injector for Collect {
        fn set(&mut self, key: &str, value: String) {
            match key {
                "traceparent" => self.0 = Some(value),
                "tracestate" if !value.is_empty() => self.1 = Some(value),
                _ => {}
            }
        }
    }
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut c = Collect(None, None);
    TraceContextPropagator::new().inject_context(cx, &mut c);
    Some((c.0?, c.1))
}

/// Puts the context of `cx` into outgoing HTTP headers (replacing any the request had).
pub fn inject_headers(cx: &Context, headers: &mut http::HeaderMap) {
    if let Some((parent, state)) = fields(cx) {
        if let Ok(v) = http::HeaderValue::from_str(&parent) {
            headers.insert("traceparent", v);
        }
        match state.and_then(|s| http::HeaderValue::from_str(&s).ok()) {
            Some(v) => {
                headers.insert("tracestate", v);
            }
            None => {
                headers.remove("tracestate");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn meta_and_headers_carry_the_client_context() {
        let raw = RawValue::from_string(format!(
            r#"{{"name":"t","arguments":{{"x":[1,2]}},"_meta":{{"progressToken":1,"traceparent":"{PARENT}","tracestate":"k=v"}}}}"#
        ))
        .unwrap();
        let cx = from_meta_with(raw.get(), true).unwrap();
        let sc = cx.span().span_context().clone();
        assert_eq!(sc.trace_id().to_string(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(sc.span_id().to_string(), "b7ad6b7169203331");
        assert!(sc.is_sampled() && sc.is_remote());
        assert_eq!(sc.trace_state().header(), "k=v");

        let mut h = http::HeaderMap::new();
        h.insert("traceparent", PARENT.parse().unwrap());
        h.insert("tracestate", "k=v".parse().unwrap());
        let cx = from_headers_with(&h, true).unwrap();
        assert_eq!(
            cx.span().span_context().trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(cx.span().span_context().trace_state().header(), "k=v");
    }

    #[test]
    fn a_clients_tracestate_is_dropped_unless_forwarded() {
        let raw = format!(r#"{{"_meta":{{"traceparent":"{PARENT}","tracestate":"vendor=client-secret"}}}}"#);
        let mut h = http::HeaderMap::new();
        h.insert("traceparent", PARENT.parse().unwrap());
        h.insert("tracestate", "vendor=client-secret".parse().unwrap());
        // By default (as the server starts unless told otherwise) and when off: the trace
        // continues, its state is gone, and nothing of it goes out.
        for cx in [
            from_meta_str(&raw).unwrap(),
            from_headers(&h).unwrap(),
            from_meta_with(&raw, false).unwrap(),
            from_headers_with(&h, false).unwrap(),
        ] {
            let sc = cx.span().span_context().clone();
            assert_eq!(sc.trace_id().to_string(), "0af7651916cd43dd8448eb211c80319c");
            assert_eq!(sc.trace_state().header(), "");
            assert_eq!(fields(&cx), Some((PARENT.to_owned(), None)));
            let mut out = http::HeaderMap::new();
            out.insert("tracestate", "vendor=client-secret".parse().unwrap());
            inject_headers(&cx, &mut out);
            assert!(out.get("tracestate").is_none(), "{out:?}");
        }
        // Forwarded when configured.
        let cx = from_headers_with(&h, true).unwrap();
        assert_eq!(
            fields(&cx),
            Some((PARENT.to_owned(), Some("vendor=client-secret".to_owned())))
        );
    }

    #[test]
    fn bad_contexts_are_ignored() {
        let long_state = format!("k={}", "v".repeat(600));
        let cases = [
            r#"{"_meta":{"traceparent":"garbage"}}"#.to_owned(),
            r#"{"_meta":{"traceparent":"00-00000000000000000000000000000000-b7ad6b7169203331-01"}}"#
                .to_owned(),
            r#"{"_meta":{"traceparent":7}}"#.to_owned(),
            r#"{"_meta":"x"}"#.to_owned(),
            r#"{"_meta":{}}"#.to_owned(),
            r#"[1,2]"#.to_owned(),
            format!(r#"{{"_meta":{{"traceparent":"{PARENT}{}"}}}}"#, "-00".repeat(40)),
        ];
        for c in &cases {
            let raw = RawValue::from_string(c.clone()).unwrap();
            assert!(from_meta(Some(&raw)).is_none(), "{c}");
        }
        assert!(from_meta(None).is_none());
        // An over-long tracestate is dropped; the parent still counts.
        let raw = RawValue::from_string(format!(
            r#"{{"_meta":{{"traceparent":"{PARENT}","tracestate":"{long_state}"}}}}"#
        ))
        .unwrap();
        let cx = from_meta_with(raw.get(), true).unwrap();
        assert_eq!(cx.span().span_context().trace_state().header(), "");
        let mut h = http::HeaderMap::new();
        h.insert("traceparent", "00-zz".parse().unwrap());
        assert!(from_headers(&h).is_none());
        assert!(from_headers(&http::HeaderMap::new()).is_none());
    }

    #[test]
    fn a_context_goes_out_as_it_came_in() {
        let sc = SpanContext::new(
            TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(),
            SpanId::from_hex("b7ad6b7169203331").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::from_key_value([("k", "v")]).unwrap(),
        );
        let cx = Context::new().with_remote_span_context(sc);
        assert_eq!(fields(&cx), Some((PARENT.to_owned(), Some("k=v".to_owned()))));
        let mut h = http::HeaderMap::new();
        h.insert("tracestate", "old=1".parse().unwrap());
        inject_headers(&cx, &mut h);
        assert_eq!(h["traceparent"], PARENT);
        assert_eq!(h["tracestate"], "k=v");
        assert_eq!(fields(&Context::new()), None);
    }
}
