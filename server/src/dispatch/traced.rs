//! The traced path of a request (only taken when tracing is on): a server span named and
//! attributed after OpenTelemetry's MCP conventions, under the client's context (from
//! `params._meta`, else the transport's, e.g. HTTP `traceparent`), current while the
//! request runs. Whether there is a span at all is decided first and cheaply
//! ([`crate::otel::sample`]): an unsampled request runs as if tracing were off. A deferred tool call carries its span until it ends.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use opentelemetry::trace::TraceContextExt;
use opentelemetry::{Context, KeyValue};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::outcome::Outcome;
use super::server::{Ctx, Era, Server};
use crate::otel::FutureExt as _;

/// What of the params names the span: a tool or prompt name, a resource URI.
#[derive(Deserialize, Default)]
struct Target<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    uri: Option<Cow<'a, str>>,
}

/// Longest tool/prompt name or URI put on a span.
const MAX_ATTR: usize = 256;

fn cut(s: &str) -> String {
    match s.char_indices().nth(MAX_ATTR) {
        Some((i, _)) => s[..i].to_owned(),
        None => s.to_owned(),
    }
}

impl Server {
    /// [`Server::request`] inside a server span.
    #[allow(clippy::too_many_arguments)] // those of `request`
    pub(super) async fn traced(
        self: &Arc<Self>,
        id: &RawValue,
        method: &str,
        params: Option<&RawValue>,
        ctx: Ctx<'_>,
        deadline: Option<Instant>,
        start: Instant,
        bytes: usize,
    ) -> Outcome {
        let Some(tracer) = crate::otel::tracer() else {
            return self
                .request(id, method, params, ctx, deadline, start, bytes)
                .await;
        };
        let Some(cx) = crate::otel::sample::request_span(tracer, params.map(RawValue::get)) else {
            // Not sampled: decided before anything was built for it; runs as untraced.
            return self
                .request(id, method, params, ctx, deadline, start, bytes)
                .await;
        };
        if cx.span().is_recording() {
            describe(&cx, id, method, params, ctx);
        }
        let o = self
            .request(id, method, params, ctx, deadline, start, bytes)
            .with_context(cx.clone())
            .await;
        match o {
            Outcome::Deferred(mut d) => {
                d.trace = Some(cx);
                Outcome::Deferred(d)
            }
            other => {
                cx.span().end();
                other
            }
        }
    }
}

/// Names the span `{mcp.method.name} {target}` and sets its attributes.
fn describe(cx: &Context, id: &RawValue, method: &str, params: Option<&RawValue>, ctx: Ctx<'_>) {
    let span = cx.span();
    let t: Target<'_> = params
        .and_then(|p| serde_json::from_str(p.get()).ok())
        .unwrap_or_default();
    // The client names the method: a name the server does not know is `_OTHER` (as
    // OpenTelemetry names unknown HTTP methods), so a span never carries megabytes of it.
    let method = if super::table::lookup(method).is_some() {
        method
    } else {
        "_OTHER"
    };
    let mut attrs = Vec::with_capacity(8);
    attrs.push(KeyValue::new("mcp.method.name", method.to_owned()));
    attrs.push(KeyValue::new("mcp.protocol.version", ctx.version.to_owned()));
    let raw_id = id.get();
    attrs.push(KeyValue::new(
        "jsonrpc.request.id",
        cut(raw_id
            .strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .unwrap_or(raw_id)),
    ));
    if !ctx.session.is_empty() && ctx.session != "stdio" {
        // A keyed tag, never the id (a bearer capability on Streamable HTTP): it correlates
        // one session's spans with each other and with its audit records.
        attrs.push(KeyValue::new("mcp.session.id", crate::session::tag(ctx.session)));
    }
    attrs.push(KeyValue::new(
        "network.transport",
        if matches!(ctx.era, Era::Detect) {
            "pipe"
        } else {
            "tcp"
        },
    ));
    let name = match (method, t.name.as_deref()) {
        ("tools/call", Some(tool)) => {
            attrs.push(KeyValue::new("gen_ai.tool.name", cut(tool)));
            attrs.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
            format!("{method} {}", cut(tool))
        }
        ("prompts/get", Some(prompt)) => {
            attrs.push(KeyValue::new("gen_ai.prompt.name", cut(prompt)));
            format!("{method} {}", cut(prompt))
        }
        _ => method.to_owned(),
    };
    if let Some(uri) = t.uri.as_deref().filter(|_| method.starts_with("resources/")) {
        attrs.push(KeyValue::new("mcp.resource.uri", cut(uri)));
    }
    span.update_name(name);
    span.set_attributes(attrs);
}
