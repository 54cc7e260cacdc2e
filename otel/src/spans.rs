//! Spans of the transport and of steps below dispatch: each helper is free when tracing is
//! off (one branch) and when there is no sampled span to hang its span on.

use std::future::Future;

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};

use super::{FutureExt as _, enabled, propagate, tracer};

/// Runs `f` (the dispatch of an HTTP request) under the client's context from its
/// `traceparent`/`tracestate` headers, when tracing is on and it sent them.
pub async fn under_headers<F: Future>(headers: &http::HeaderMap, f: F) -> F::Output {
    if !enabled() {
        return f.await;
    }
    match propagate::from_headers(headers) {
        Some(cx) => f.with_context(cx).await,
        None => f.await,
    }
}

/// Runs the authentication of an HTTP request (`f`) in an `auth` span below the client's
/// context, when tracing is on, the client sent a `traceparent`, and it is sampled: by the
/// client's flag when every client's is trusted, else by the server's own decision (the
/// caller is not known yet). The span says `quiver.auth.outcome` (`allowed` or `denied`);
/// a denial is its error.
pub async fn auth<T, E, F: Future<Output = Result<T, E>>>(headers: &http::HeaderMap, f: F) -> Result<T, E> {
    if !enabled() {
        return f.await;
    }
    let Some((tracer, client)) = tracer().zip(propagate::from_headers(headers)) else {
        return f.await;
    };
    let Some(parent) = super::sample::before_auth(&client) else {
        return f.await;
    };
    let span = tracer
        .span_builder("auth")
        .with_kind(SpanKind::Internal)
        .start_with_context(tracer, &parent);
    let cx = parent.with_span(span);
    let r = f.with_context(cx.clone()).await;
    let span = cx.span();
    match &r {
        Ok(_) => span.set_attribute(KeyValue::new("quiver.auth.outcome", "allowed")),
        Err(_) => {
            span.set_attribute(KeyValue::new("quiver.auth.outcome", "denied"));
            span.set_attribute(KeyValue::new("error.type", "unauthenticated"));
            span.set_status(Status::error("unauthenticated"));
        }
    }
    span.end();
    r
}

/// Runs `f` inside the span of `cx` (from [`super::child`]) when there is one, and ends
/// the span with `error(&output)` as its error, if any.
pub async fn within<F: Future>(
    cx: Option<Context>,
    f: F,
    error: impl FnOnce(&F::Output) -> Option<&'static str>,
) -> F::Output {
    match cx {
        None => f.await,
        Some(cx) => {
            let out = f.with_context(cx.clone()).await;
            super::finish(&cx, error(&out));
            out
        }
    }
}

/// Runs `f` with the span of `cx` current, when there is one (so what `f` sends out
/// carries that span's context); the span is not ended.
pub async fn under<F: Future>(cx: Option<&Context>, f: F) -> F::Output {
    match cx {
        Some(cx) => f.with_context(cx.clone()).await,
        None => f.await,
    }
}

/// The `traceparent` and `tracestate` (when not empty) headers of the current sampled
/// span, for an outgoing request; nothing when tracing is off or nothing is sampled.
pub fn headers(mut add: impl FnMut(&str, &http::HeaderValue)) {
    let Some((parent, state)) = sampled_current().as_ref().and_then(propagate::fields) else {
        return;
    };
    for (name, value) in [("traceparent", Some(parent)), ("tracestate", state)] {
        if let Some(v) = value.and_then(|v| http::HeaderValue::from_str(&v).ok()) {
            add(name, &v);
        }
    }
}

/// The current context when it holds a sampled span (what outgoing requests carry on).
pub fn sampled_current() -> Option<Context> {
    if !enabled() {
        return None;
    }
    Context::map_current(|cx| cx.span().span_context().is_sampled().then(|| cx.clone()))
}

/// A client span for an outgoing HTTP request (`GET`, `POST`...) of an http tool, with the
/// OpenTelemetry HTTP client attributes. `url_template` gives the configured URL with its
/// placeholders as `{}` (called only when tracing is on).
pub fn http_client(method: &str, uri: &http::Uri, url_template: impl FnOnce() -> String) -> Option<Context> {
    if !enabled() {
        return None;
    }
    let mut attrs = vec![
        KeyValue::new("http.request.method", method.to_owned()),
        KeyValue::new("server.address", uri.host().unwrap_or("").to_owned()),
    ];
    if let Some(port) = uri.port_u16().or(match uri.scheme_str() {
        Some("https") => Some(443),
        Some("http") => Some(80),
        _ => None,
    }) {
        attrs.push(KeyValue::new("server.port", i64::from(port)));
    }
    // The URL as sent would carry templated arguments, claims and secrets (in its path as
    // well as its query): the origin, and the configured URL with its placeholders as `{}`.
    attrs.push(KeyValue::new(
        "url.full",
        format!(
            "{}://{}",
            uri.scheme_str().unwrap_or("http"),
            uri.authority()
                .map_or("", |a| a.as_str().rsplit('@').next().unwrap_or("")),
        ),
    ));
    let mut shape = url_template();
    if shape.len() > 1024 {
        let end = (0..=1024).rev().find(|&i| shape.is_char_boundary(i)).unwrap_or(0);
        shape.truncate(end);
    }
    attrs.push(KeyValue::new("url.template", shape));
    super::child(method.to_owned(), SpanKind::Client, attrs)
}

/// Ends an HTTP client span with the answer's status (`http.response.status_code`; 4xx and
/// 5xx are errors) or why there was none (`error.type`).
pub fn end_http(cx: &Context, status: Result<u16, &'static str>) {
    match status {
        Ok(code) => {
            cx.span()
                .set_attribute(KeyValue::new("http.response.status_code", i64::from(code)));
            if code >= 400 {
                super::finish(cx, Some(&code.to_string()));
            } else {
                super::finish(cx, None);
            }
        }
        Err(e) => super::finish(cx, Some(e)),
    }
}

/// The span of step `index` of a pipeline, which runs tool `tool`.
pub fn step(index: usize, tool: &str) -> Option<Context> {
    if !enabled() {
        return None;
    }
    super::child(
        format!("pipeline step {tool}"),
        SpanKind::Internal,
        vec![
            KeyValue::new("quiver.pipeline.step", i64::try_from(index).unwrap_or(i64::MAX)),
            KeyValue::new("gen_ai.tool.name", tool.to_owned()),
        ],
    )
}

/// The client span of a `tools/call` to upstream `upstream`'s tool `tool`.
pub fn upstream_call(upstream: &str, tool: &str) -> Option<Context> {
    if !enabled() {
        return None;
    }
    super::child(
        format!("tools/call {tool}"),
        SpanKind::Client,
        vec![
            KeyValue::new("mcp.method.name", "tools/call"),
            KeyValue::new("gen_ai.tool.name", tool.to_owned()),
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("quiver.upstream", upstream.to_owned()),
        ],
    )
}

/// A span that starts a trace of its own (work no request asked for: a config reload, an
/// upstream reconnecting), sampled as a request without a parent is. `None` when tracing
/// is off or it is not sampled.
fn root(name: &'static str, kind: SpanKind, attributes: Vec<KeyValue>) -> Option<Context> {
    let tracer = tracer()?;
    let span = tracer
        .span_builder(name)
        .with_kind(kind)
        .with_attributes(attributes)
        .start_with_context(tracer, &Context::new());
    let cx = Context::new().with_span(span);
    cx.span().span_context().is_sampled().then_some(cx)
}

/// The span of a config reload (`config reload`, from new config text) or rebuild
/// (`config rebuild`, for an upstream's new tool list).
pub fn reload(rebuild: bool) -> Option<Context> {
    if !enabled() {
        return None;
    }
    root(
        if rebuild {
            "config rebuild"
        } else {
            "config reload"
        },
        SpanKind::Internal,
        Vec::new(),
    )
}

/// Ends a reload span: `quiver.reload.result` (`success`, `unchanged`, `invalid`), the
/// generation now serving, and for an invalid config the number of problems (its error).
pub fn end_reload(cx: &Context, result: &'static str, generation: Option<u64>, problems: usize) {
    let span = cx.span();
    span.set_attribute(KeyValue::new("quiver.reload.result", result));
    if let Some(g) = generation {
        span.set_attribute(KeyValue::new(
            "quiver.generation",
            i64::try_from(g).unwrap_or(i64::MAX),
        ));
    }
    if result == "invalid" {
        span.set_attribute(KeyValue::new(
            "quiver.reload.problems",
            i64::try_from(problems).unwrap_or(i64::MAX),
        ));
        super::finish(cx, Some("invalid_config"));
    } else {
        super::finish(cx, None);
    }
}

/// The client span of an upstream's connection attempt after it was down (or before it
/// was ever up): `upstream connect`, with `quiver.upstream` and the attempt's number.
pub fn upstream_connect(upstream: &str, attempt: u32) -> Option<Context> {
    if !enabled() {
        return None;
    }
    root(
        "upstream connect",
        SpanKind::Client,
        vec![
            KeyValue::new("quiver.upstream", upstream.to_owned()),
            KeyValue::new("quiver.upstream.attempt", i64::from(attempt)),
        ],
    )
}
