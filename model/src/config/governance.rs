//! Rate and concurrency limits (`limits`, on the ToolSet, a tool or an upstream's tools) and
//! a tool's audit options (`audit`): their YAML shape and compiled form.
//!
//! A limit is a token bucket in GCRA form (a sustained `rate` and a `burst` on top of it)
//! and/or a cap on calls in flight (`concurrency`), counted per caller or over every caller
//! (`per`). Limits of the ToolSet count every `tools/call`; an upstream's count the calls of
//! the tools served from it; a tool's count its own calls. A call runs only if every limit
//! that applies to it lets it.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::context::Problems;

/// Most limits one place (the ToolSet, a tool, an upstream) may list.
pub const MAX_LIMITS: usize = 4;
/// Largest `burst` and `concurrency`.
pub const MAX_BURST: u32 = 1_000_000;
/// Most calls per second a `rate` may allow (one per microsecond).
const MAX_PER_SECOND: u64 = 1_000_000;

/// A rate and/or concurrency limit on tool calls.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LimitSpec {
    /// Sustained rate: `N/s`, `N/m` or `N/h` (e.g. `10/s`, `600/m`). A call over it is
    /// refused with a retry hint (HTTP 429 with `Retry-After` where the answer allows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 24))]
    pub rate: Option<String>,
    /// Calls allowed at once on top of an idle budget (default: the `N` of `rate`). Needs
    /// `rate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub burst: Option<u32>,
    /// Calls in flight at once; one more is refused at once (never queued).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub concurrency: Option<u32>,
    /// Whose calls share one budget: `caller` (default: each authenticated caller its own;
    /// a caller without credentials is its network address, whatever sessions it opens) or
    /// `all` (every caller together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<LimitPer>,
    /// Count `rate` in Redis, shared by every replica (`--limits-redis`); otherwise each
    /// replica counts on its own. `concurrency` is always per replica.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
}

/// Whose calls share a limit's budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum LimitPer {
    /// Each caller has its own budget.
    #[default]
    Caller,
    /// One budget for every caller.
    All,
}

/// What the audit trail records of a tool's calls, beyond who, when and how it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolAuditSpec {
    /// Record the call's arguments: properties marked `writeOnly: true` in the input
    /// schema, and values under names like `password` or `token`, are replaced by
    /// `[redacted]`; every string is scrubbed of the server's secrets and of anything shaped
    /// like a credential.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub arguments: bool,
}

/// Where a limit is declared: what it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The ToolSet's: every tool call.
    Server,
    /// An upstream's: calls of the tools served from it.
    Upstream,
    /// A tool's: its own calls.
    Tool,
}

impl Scope {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Server => "server",
            Self::Upstream => "upstream",
            Self::Tool => "tool",
        }
    }
}

/// A sustained rate in GCRA form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Time between two calls at the sustained rate, in nanoseconds.
    pub interval_ns: u64,
    /// Calls allowed at once from an idle budget.
    pub burst: u32,
}

impl Rate {
    /// The window of the burst: `interval * burst`, in nanoseconds.
    pub fn tolerance_ns(&self) -> u64 {
        self.interval_ns.saturating_mul(u64::from(self.burst))
    }
}

/// A compiled limit.
#[derive(Debug, PartialEq, Eq)]
pub struct Limit {
    /// What it counts.
    pub scope: Scope,
    /// The tool or upstream it is declared on (empty for the ToolSet's).
    pub name: Box<str>,
    /// Its place, e.g. `tools[2].limits[0]`: with `name`, what keeps its budgets apart from
    /// every other limit's (and the same across a reload that keeps it in place).
    pub at: Box<str>,
    /// The rate, if it has one.
    pub rate: Option<Rate>,
    /// The cap on calls in flight, if it has one.
    pub concurrency: Option<u32>,
    /// Each caller its own budget.
    pub per_caller: bool,
    /// `rate` counted in Redis.
    pub shared: bool,
}

/// A compiled tool's governance: the limits that apply to its calls (the ToolSet's, its
/// upstream's, its own) and whether its arguments are audited.
#[derive(Debug, Clone, Default)]
pub struct ToolGovernance {
    /// Every limit a call must pass; empty: none (the usual case, one branch).
    pub limits: Arc<[Arc<Limit>]>,
    /// Record arguments in the audit trail, with these top-level properties redacted.
    pub audit_arguments: Option<Arc<[Box<str>]>>,
    /// What its results are searched for (`None`: nothing, the usual case).
    pub result_guard: Option<Arc<super::guards::ResultGuard>>,
}

/// `N/s`, `N/m`, `N/h` as nanoseconds between calls.
fn parse_rate(s: &str) -> Result<u64, String> {
    let (n, unit) = s
        .trim()
        .split_once('/')
        .ok_or_else(|| format!("`{s}`: write N/s, N/m or N/h"))?;
    let n: u64 = n
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: the count must be a whole number"))?;
    let period: u64 = match unit.trim() {
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return Err(format!("`{s}`: the unit must be s, m or h")),
    };
    if n == 0 || n.saturating_mul(1_000_000_000) / period > MAX_PER_SECOND {
        return Err(format!(
            "`{s}`: the count must be 1 or more, at most {MAX_PER_SECOND} per second"
        ));
    }
    Ok(period / n)
}

/// Compiles the `limits` at `at` (`limits`, `tools[2].limits`, `upstreams[0].tools.limits`).
pub fn compile_limits(
    specs: &[LimitSpec],
    scope: Scope,
    name: &str,
    at: &str,
    p: &mut Problems,
) -> Vec<Arc<Limit>> {
    if specs.len() > MAX_LIMITS {
        p.push(at.to_owned(), format!("at most {MAX_LIMITS} limits"));
        return Vec::new();
    }
    let mut out = Vec::with_capacity(specs.len());
    for (i, s) in specs.iter().enumerate() {
        let here = format!("{at}[{i}]");
        let interval = match s.rate.as_deref().map(parse_rate) {
            None => None,
            Some(Ok(ns)) => Some(ns),
            Some(Err(e)) => {
                p.push(format!("{here}.rate"), e);
                continue;
            }
        };
        if s.rate.is_none() && s.concurrency.is_none() {
            p.push(here.clone(), "needs `rate`, `concurrency` or both");
            continue;
        }
        if s.burst.is_some() && s.rate.is_none() {
            p.push(format!("{here}.burst"), "needs `rate`");
        }
        if s.shared && s.rate.is_none() {
            p.push(format!("{here}.shared"), "shares a `rate`; this limit has none");
        }
        for (field, v) in [("burst", s.burst), ("concurrency", s.concurrency)] {
            if v.is_some_and(|v| v == 0 || v > MAX_BURST) {
                p.push(
                    format!("{here}.{field}"),
                    format!("must be between 1 and {MAX_BURST}"),
                );
            }
        }
        let count = s
            .rate
            .as_deref()
            .and_then(|r| r.split_once('/'))
            .and_then(|(n, _)| n.trim().parse::<u32>().ok())
            .unwrap_or(1);
        out.push(Arc::new(Limit {
            scope,
            name: name.into(),
            at: here.into(),
            rate: interval.map(|interval_ns| Rate {
                interval_ns,
                burst: s.burst.unwrap_or(count).clamp(1, MAX_BURST),
            }),
            concurrency: s.concurrency.map(|c| c.clamp(1, MAX_BURST)),
            per_caller: s.per.unwrap_or_default() == LimitPer::Caller,
            shared: s.shared,
        }));
    }
    out
}

/// The limits of a call, most specific first (a tool's, its upstream's, the ToolSet's) and
/// per-caller budgets before shared ones: a caller refused by its own budget does not spend
/// the budget every caller shares.
pub fn ordered(layers: &[&[Arc<Limit>]]) -> Arc<[Arc<Limit>]> {
    let mut all: Vec<Arc<Limit>> = Vec::new();
    for per_caller in [true, false] {
        for layer in layers {
            all.extend(layer.iter().filter(|l| l.per_caller == per_caller).cloned());
        }
    }
    all.into()
}

/// The top-level properties of an input schema that must never be recorded: those marked
/// `writeOnly: true` (JSON Schema's mark for values sent but never shown, e.g. passwords).
pub fn sensitive_properties(schema: &Value) -> Arc<[Box<str>]> {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|props| {
            props
                .iter()
                .filter(|(_, s)| s.get("writeOnly").and_then(Value::as_bool) == Some(true))
                .map(|(k, _)| Box::from(k.as_str()))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(yaml: &str) -> Result<Arc<Limit>, Vec<String>> {
        let spec: LimitSpec = serde_saphyr::from_str(yaml).unwrap();
        let mut p = Problems(Vec::new());
        let mut l = compile_limits(&[spec], Scope::Tool, "t", "tools[0].limits", &mut p);
        if p.0.is_empty() {
            Ok(l.remove(0))
        } else {
            Err(p.0.iter().map(|x| format!("{}: {}", x.path, x.message)).collect())
        }
    }

    #[test]
    fn rates_compile_to_intervals_and_bursts() {
        let l = one("{rate: 10/s}").unwrap();
        assert_eq!(
            l.rate,
            Some(Rate {
                interval_ns: 100_000_000,
                burst: 10
            })
        );
        assert!(l.per_caller && !l.shared && l.concurrency.is_none());
        let l = one("{rate: 600/m, burst: 2, per: all, concurrency: 3}").unwrap();
        assert_eq!(l.rate.unwrap().interval_ns, 100_000_000);
        assert_eq!(l.rate.unwrap().burst, 2);
        assert_eq!(l.concurrency, Some(3));
        assert!(!l.per_caller);
        assert_eq!(
            one("{rate: 1/h}").unwrap().rate.unwrap().interval_ns,
            3_600_000_000_000
        );
    }

    #[test]
    fn bad_limits_name_their_field() {
        for (yaml, field) in [
            ("{rate: 10}", "rate"),
            ("{rate: 10/d}", "rate"),
            ("{rate: 0/s}", "rate"),
            ("{rate: x/s}", "rate"),
            ("{rate: 2000000/s}", "rate"),
            ("{rate: -1/s}", "rate"),
            ("{}", "limits[0]"),
            ("{concurrency: 0}", "concurrency"),
            ("{concurrency: 2, burst: 3}", "burst"),
            ("{concurrency: 2, shared: true}", "shared"),
            ("{rate: 1/s, burst: 0}", "burst"),
        ] {
            let e = one(yaml).expect_err(yaml);
            assert!(e.iter().any(|m| m.contains(field)), "{yaml}: {e:?}");
        }
        let mut p = Problems(Vec::new());
        let five = vec![
            LimitSpec {
                concurrency: Some(1),
                ..LimitSpec::default()
            };
            5
        ];
        assert!(compile_limits(&five, Scope::Server, "", "limits", &mut p).is_empty());
        assert!(p.0[0].message.contains("at most 4"));
    }

    #[test]
    fn per_caller_limits_come_first_and_specific_before_general() {
        let mut p = Problems(Vec::new());
        let spec = |per| LimitSpec {
            concurrency: Some(1),
            per: Some(per),
            ..LimitSpec::default()
        };
        let server = compile_limits(
            &[spec(LimitPer::All), spec(LimitPer::Caller)],
            Scope::Server,
            "",
            "limits",
            &mut p,
        );
        let tool = compile_limits(
            &[spec(LimitPer::All), spec(LimitPer::Caller)],
            Scope::Tool,
            "t",
            "tools[0].limits",
            &mut p,
        );
        let all = ordered(&[&tool, &server]);
        let got: Vec<(&str, bool)> = all.iter().map(|l| (l.scope.label(), l.per_caller)).collect();
        assert_eq!(
            got,
            [
                ("tool", true),
                ("server", true),
                ("tool", false),
                ("server", false)
            ]
        );
    }

    #[test]
    fn write_only_properties_are_sensitive() {
        let s = serde_json::json!({"type": "object", "properties": {
            "user": {"type": "string"},
            "password": {"type": "string", "writeOnly": true},
            "pin": {"type": "string", "writeOnly": false},
        }});
        assert_eq!(&*sensitive_properties(&s), [Box::from("password")]);
        assert!(sensitive_properties(&serde_json::json!({"type": "object"})).is_empty());
    }
}
