//! Log lines that name the trace: with tracing on, a JSON log line written while a sampled
//! span is current gets `trace_id` and `span_id` fields (what log backends join on).

use std::fmt;

use opentelemetry::Context;
use opentelemetry::trace::TraceContextExt;
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Wraps a JSON event format: adds the current span's ids to each line written under one.
#[derive(Debug)]
pub struct WithTraceIds<F>(pub F);

/// The ids of the current sampled span, as hex (what log lines and audit records name, so
/// that a trace backend finds the request); `None` when tracing is off or it is not sampled.
pub fn current_ids() -> Option<(String, String)> {
    if !super::enabled() {
        return None;
    }
    Context::map_current(|cx| {
        let span = cx.span();
        let sc = span.span_context();
        sc.is_sampled()
            .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
    })
}

/// Adds the two fields to a JSON object line (`{...}` and a newline).
fn splice(line: &str, trace_id: &str, span_id: &str) -> Option<String> {
    let head = line.trim_end().strip_suffix('}')?;
    let sep = if head.trim_end().ends_with('{') { "" } else { "," };
    Some(format!(
        "{head}{sep}\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"}}\n"
    ))
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    F: FormatEvent<S, N>,
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some((trace_id, span_id)) = current_ids() else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::with_capacity(256);
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match splice(&line, &trace_id, &span_id) {
            Some(with) => writer.write_str(&with),
            None => writer.write_str(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_added_to_the_object() {
        let line = "{\"timestamp\":\"t\",\"level\":\"WARN\",\"fields\":{\"message\":\"m\"}}\n";
        let out = splice(line, "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331").unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["trace_id"], "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(v["span_id"], "b7ad6b7169203331");
        assert_eq!(v["fields"]["message"], "m");
        assert!(out.ends_with("}\n"));
        let v: serde_json::Value = serde_json::from_str(&splice("{}\n", "a", "b").unwrap()).unwrap();
        assert_eq!(v["trace_id"], "a");
        assert!(splice("not json", "a", "b").is_none());
    }
}
