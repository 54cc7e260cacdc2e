//! The traced path of a request (only taken when tracing is on): a server span named and
//! attributed after OpenTelemetry's MCP conventions, under the client's context (from
//! `params._meta`, else the transport's, e.g. HTTP `traceparent`), current while the
//! request runs. Whether there is a span at all is decided first and cheaply
//! ([`crate::otel::sample`]; the client's sampled flag counts only for a caller trusted with
//! it): an unsampled request runs as if tracing were off. A deferred tool call carries its
//! span until it ends. Span names carry only tool and prompt names the registry holds.

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
        let trusted = crate::otel::sample::trusts(authenticated(&ctx));
        let Some(cx) = crate::otel::sample::request_span(tracer, params.map(RawValue::get), trusted) else {
            // Not sampled: decided before anything was built for it; runs as untraced. A
            // transport's context the client sampled (HTTP `traceparent`) is not current
            // then: nothing below may hang a span on it or send it on.
            let run = self.request(id, method, params, ctx, deadline, start, bytes);
            return if Context::map_current(|c| c.span().span_context().is_sampled()) {
                run.with_context(Context::new()).await
            } else {
                run.await
            };
        };
        if cx.span().is_recording() {
            describe(&cx, &self.registry, id, method, params, ctx);
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

/// Whether the caller authenticated (presented credentials the server accepted), or is
/// stdio's client (the process that started the server).
fn authenticated(ctx: &Ctx<'_>) -> bool {
    ctx.caller.is_some() || matches!(ctx.era, Era::Detect)
}

/// The span's name, `{method} {target}` for a tool call or a prompt, adding the target's
/// attributes to `attrs`. The target is a name the client sent: only one `known` to the
/// registry names the span (`unknown` otherwise), so span names stay as few as the
/// registry's tools and prompts and never carry a client's string.
fn named(
    method: &str,
    target: Option<&str>,
    known: impl FnOnce(&str) -> bool,
    attrs: &mut Vec<KeyValue>,
) -> String {
    let key = match method {
        "tools/call" => "gen_ai.tool.name",
        "prompts/get" => "gen_ai.prompt.name",
        _ => return method.to_owned(),
    };
    if method == "tools/call" {
        attrs.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
    }
    match target {
        Some(name) if known(name) => {
            let name = cut(name);
            let span = format!("{method} {name}");
            attrs.push(KeyValue::new(key, name));
            span
        }
        Some(_) => format!("{method} unknown"),
        None => method.to_owned(),
    }
}

/// Names the span `{mcp.method.name} {target}` and sets its attributes.
fn describe(
    cx: &Context,
    registry: &crate::registry::Registry,
    id: &RawValue,
    method: &str,
    params: Option<&RawValue>,
    ctx: Ctx<'_>,
) {
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
    let known = |name: &str| {
        let snap = registry.load();
        match method {
            "tools/call" => snap.tool_index(name).is_some(),
            "prompts/get" => snap.prompt_index(name).is_some(),
            _ => false,
        }
    };
    let name = named(method, t.name.as_deref(), known, &mut attrs);
    if let Some(uri) = t.uri.as_deref().filter(|_| method.starts_with("resources/")) {
        attrs.push(KeyValue::new("mcp.resource.uri", cut(uri)));
    }
    span.update_name(name);
    span.set_attributes(attrs);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(attrs: &[KeyValue], key: &str) -> Option<String> {
        attrs
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.as_str().into_owned())
    }

    #[test]
    fn callers_with_credentials_and_stdios_client_count_as_authenticated() {
        let principal = crate::spec::access::Principal::default();
        let ctx = |era, caller| Ctx {
            session: "",
            version: "2025-11-25",
            stream: true,
            era,
            caller,
            opens: super::super::server::Opens::Minted,
            client: None,
        };
        assert!(!authenticated(&ctx(Era::Handshake, None)));
        assert!(!authenticated(&ctx(Era::Stateless("2026-07-28"), None)));
        assert!(authenticated(&ctx(Era::Handshake, Some(&principal))));
        assert!(authenticated(&ctx(Era::Detect, None)));
    }

    #[test]
    fn only_names_the_registry_holds_name_spans() {
        let registry = ["add", "greet"];
        let known = |n: &str| registry.contains(&n);
        for (method, target, want, key, value) in [
            (
                "tools/call",
                Some("add"),
                "tools/call add",
                "gen_ai.tool.name",
                Some("add"),
            ),
            (
                "prompts/get",
                Some("greet"),
                "prompts/get greet",
                "gen_ai.prompt.name",
                Some("greet"),
            ),
            (
                "tools/call",
                Some("evil\n\u{202e}x"),
                "tools/call unknown",
                "gen_ai.tool.name",
                None,
            ),
            (
                "prompts/get",
                Some("nope-1234"),
                "prompts/get unknown",
                "gen_ai.prompt.name",
                None,
            ),
            ("tools/call", None, "tools/call", "gen_ai.tool.name", None),
            ("tools/list", Some("add"), "tools/list", "gen_ai.tool.name", None),
        ] {
            let mut attrs = Vec::new();
            assert_eq!(named(method, target, known, &mut attrs), want);
            assert_eq!(attr(&attrs, key).as_deref(), value, "{method} {target:?}");
        }
        // Every distinct unknown name is one span name.
        let mut attrs = Vec::new();
        let names: std::collections::BTreeSet<String> = (0..100)
            .map(|i| named("tools/call", Some(&format!("t{i}")), known, &mut attrs))
            .collect();
        assert_eq!(names.len(), 1);
        assert!(
            attrs.iter().all(|kv| !kv.value.as_str().starts_with('t')),
            "{attrs:?}"
        );
    }
}
