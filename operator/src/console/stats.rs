//! The last hour of a server, from Prometheus: each tool's calls, errors and 95th
//! percentile latency, the calls refused and why, and the health of its upstreams. The
//! series are the ones the server exports and the dashboards read, selected by the
//! McpServer's namespace and Service (its name), as a ServiceMonitor labels them.
//!
//! Prometheus is asked six instant queries at once, each bounded in time and size; a
//! Prometheus that does not answer costs the page its figures, never the page.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::Full;
use serde_json::Value;

use super::client::Http;

/// The longest wait for one query.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read.
const MAX_ANSWER: usize = 4 << 20;
/// Series kept of one answer (a server has at most a few thousand tools).
const MAX_SERIES: usize = 10_000;
/// The window of every figure.
pub const WINDOW: &str = "1h";

/// One tool's last hour.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolStats {
    /// Calls that reached the tool.
    pub calls: f64,
    /// Of those, the ones that ended in an error (the tool's own, or arguments it refused).
    pub errors: f64,
    /// 95th percentile latency in seconds, when there were calls.
    pub p95: Option<f64>,
}

/// One upstream's state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpstreamHealth {
    /// Whether every pod has it connected (`None`: no pod reports it).
    pub up: Option<bool>,
    /// Failed forwarded calls of the last hour, by kind.
    pub errors: Vec<(String, f64)>,
}

/// A server's last hour.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// By tool name.
    pub tools: BTreeMap<String, ToolStats>,
    /// Calls refused, by why (`forbidden`, `rate_limited`, a limit's kind and tool, ...).
    pub refusals: Vec<(String, f64)>,
    /// By upstream name.
    pub upstreams: BTreeMap<String, UpstreamHealth>,
}

/// `s` as a PromQL string literal's content.
fn lit(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The last hour's growth of each series the selector `m` picks: `increase` for a series
/// that existed an hour ago, its whole value for one born since (a series appears with its
/// first event, so `increase` alone would miss the first call of every tool, and every call
/// of a pod started since).
fn in_window(m: &str) -> String {
    let w = WINDOW;
    format!("((increase({m}[{w}]) and {m} offset {w}) or ({m} unless {m} offset {w}))")
}

/// The six queries for the server `namespace/name`: calls by tool and outcome, latency by
/// tool, refusals by limit, refusals of `tools/call` by code, upstreams up, upstream errors.
pub fn queries(namespace: &str, name: &str) -> [String; 6] {
    let sel = format!("namespace=\"{}\", service=\"{}\"", lit(namespace), lit(name));
    [
        format!(
            "sum by (tool, outcome) ({})",
            in_window(&format!("quiver_dispatch_duration_seconds_count{{{sel}}}"))
        ),
        format!(
            "histogram_quantile(0.95, sum by (tool, le) ({}))",
            in_window(&format!("quiver_dispatch_duration_seconds_bucket{{{sel}}}"))
        ),
        format!(
            "sum by (tool, kind) ({}) > 0",
            in_window(&format!("quiver_limited_total{{{sel}}}"))
        ),
        format!(
            "sum by (outcome) ({}) > 0",
            in_window(&format!(
                "quiver_requests_total{{{sel}, method=\"tools/call\", outcome=~\"forbidden|rate_limited|missing_capability\"}}"
            ))
        ),
        format!("min by (upstream) (quiver_upstream_up{{{sel}}})"),
        format!(
            "sum by (upstream, kind) ({}) > 0",
            in_window(&format!("quiver_upstream_errors_total{{{sel}}}"))
        ),
    ]
}

/// The series of an instant query's answer: each one's labels and value.
///
/// # Errors
/// A sentence when the answer is an error or not a vector.
pub fn vector(answer: &Value) -> Result<Series, String> {
    if answer["status"].as_str() != Some("success") {
        let why = answer["error"].as_str().unwrap_or("no reason given");
        return Err(format!(
            "Prometheus refused the query: {}",
            super::short(why, 200)
        ));
    }
    if answer["data"]["resultType"].as_str() != Some("vector") {
        return Err("Prometheus answered something other than a vector".into());
    }
    let series = answer["data"]["result"].as_array().map_or(&[][..], Vec::as_slice);
    Ok(series
        .iter()
        .take(MAX_SERIES)
        .filter_map(|s| {
            let labels = s["metric"]
                .as_object()?
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect();
            let value: f64 = s["value"][1].as_str()?.parse().ok()?;
            Some((labels, value))
        })
        .collect())
}

/// An instant vector: each series' labels and value.
pub type Series = Vec<(BTreeMap<String, String>, f64)>;

fn label<'a>(l: &'a BTreeMap<String, String>, k: &str) -> &'a str {
    l.get(k).map_or("", String::as_str)
}

/// The figures of the six answers of [`queries`], in their order.
pub fn assemble(answers: [Series; 6]) -> Stats {
    let [calls, latency, limited, refused, up, upstream_errors] = answers;
    let mut s = Stats::default();
    for (l, v) in calls {
        let t = s.tools.entry(label(&l, "tool").to_owned()).or_default();
        t.calls += v;
        if label(&l, "outcome") != "ok" {
            t.errors += v;
        }
    }
    for (l, v) in latency {
        if v.is_finite() {
            s.tools.entry(label(&l, "tool").to_owned()).or_default().p95 = Some(v);
        }
    }
    s.tools
        .retain(|name, t| !name.is_empty() && (t.calls > 0.0 || t.p95.is_some()));
    for (l, v) in refused {
        s.refusals.push((label(&l, "outcome").replace('_', " "), v));
    }
    for (l, v) in limited {
        s.refusals
            .push((format!("{} limit on {}", label(&l, "kind"), label(&l, "tool")), v));
    }
    for (l, v) in up {
        s.upstreams
            .entry(label(&l, "upstream").to_owned())
            .or_default()
            .up = Some(v >= 1.0);
    }
    for (l, v) in upstream_errors {
        let u = s.upstreams.entry(label(&l, "upstream").to_owned()).or_default();
        u.errors.push((label(&l, "kind").to_owned(), v));
    }
    s.upstreams.remove("");
    s
}

/// Asks Prometheus at `base` for the last hour of `namespace/name`.
///
/// # Errors
/// A sentence when a query fails (unreachable, refused, too slow).
pub async fn fetch(http: &Http, base: &str, namespace: &str, name: &str) -> Result<Stats, String> {
    let base = base.trim_end_matches('/');
    let ask = |q: String| async move {
        let url = format!(
            "{base}/api/v1/query?{}",
            form_urlencoded::Serializer::new(String::new())
                .append_pair("query", &q)
                .finish()
        );
        let req = Request::get(&url)
            .header(header::ACCEPT, "application/json")
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let r = http.send(req, MAX_ANSWER, QUERY_TIMEOUT).await?;
        let answer: Value = serde_json::from_slice(&r.body)
            .map_err(|_| format!("Prometheus answered HTTP {} without JSON", r.status))?;
        vector(&answer)
    };
    let [a, b, c, d, e, f] = queries(namespace, name);
    let (a, b, c, d, e, f) = tokio::try_join!(ask(a), ask(b), ask(c), ask(d), ask(e), ask(f))?;
    Ok(assemble([a, b, c, d, e, f]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer(series: &[(&[(&str, &str)], &str)]) -> Value {
        let result: Vec<Value> = series
            .iter()
            .map(|(labels, v)| {
                let metric: serde_json::Map<String, Value> =
                    labels.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
                json!({"metric": metric, "value": [1_700_000_000.0, v]})
            })
            .collect();
        json!({"status": "success", "data": {"resultType": "vector", "result": result}})
    }

    #[test]
    fn the_selector_names_the_server_and_cannot_be_broken_out_of() {
        let q = queries("team-a", "weather");
        let m = "quiver_dispatch_duration_seconds_count{namespace=\"team-a\", service=\"weather\"}";
        assert_eq!(
            q[0],
            format!(
                "sum by (tool, outcome) (((increase({m}[1h]) and {m} offset 1h) or ({m} unless {m} offset 1h)))"
            )
        );
        let evil = queries("a\"}) or vector(1", "b\\");
        assert!(
            evil[0].contains("namespace=\"a\\\"}) or vector(1\", service=\"b\\\\\""),
            "{}",
            evil[0]
        );
    }

    #[test]
    fn answers_become_figures_per_tool_refusals_and_upstreams() {
        let s = assemble([
            vector(&answer(&[
                (&[("tool", "greet"), ("outcome", "ok")], "10"),
                (&[("tool", "greet"), ("outcome", "tool_error")], "2"),
                (&[("tool", "idle"), ("outcome", "ok")], "0"),
            ]))
            .unwrap(),
            vector(&answer(&[
                (&[("tool", "greet")], "0.0125"),
                (&[("tool", "idle")], "NaN"),
            ]))
            .unwrap(),
            vector(&answer(&[(&[("tool", "greet"), ("kind", "rate")], "3")])).unwrap(),
            vector(&answer(&[(&[("outcome", "forbidden")], "4")])).unwrap(),
            vector(&answer(&[
                (&[("upstream", "docs")], "1"),
                (&[("upstream", "notes")], "0"),
            ]))
            .unwrap(),
            vector(&answer(&[(&[("upstream", "notes"), ("kind", "timeout")], "5")])).unwrap(),
        ]);
        assert_eq!(s.tools.len(), 1, "{s:?}");
        assert_eq!(
            s.tools["greet"],
            ToolStats {
                calls: 12.0,
                errors: 2.0,
                p95: Some(0.0125)
            }
        );
        assert_eq!(
            s.refusals,
            vec![
                ("forbidden".to_owned(), 4.0),
                ("rate limit on greet".to_owned(), 3.0)
            ]
        );
        assert_eq!(s.upstreams["docs"].up, Some(true));
        assert_eq!(
            s.upstreams["notes"],
            UpstreamHealth {
                up: Some(false),
                errors: vec![("timeout".into(), 5.0)]
            }
        );
    }

    #[test]
    fn errors_and_odd_answers_are_sentences_not_panics() {
        assert!(
            vector(&json!({"status": "error", "error": "parse error at char 3"}))
                .unwrap_err()
                .contains("parse error")
        );
        assert!(
            vector(&json!({"status": "success", "data": {"resultType": "matrix", "result": []}})).is_err()
        );
        assert!(vector(&json!(null)).is_err());
        let odd = json!({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"tool": 3}, "value": [1, "1"]}, {"metric": {}, "value": [1, 2]}, 7, {"value": [1, "x"]}]}});
        let v = vector(&odd).unwrap();
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].0.is_empty());
    }
}
