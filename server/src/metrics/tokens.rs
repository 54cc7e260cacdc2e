//! The metrics of results' tokens (`resultGuards.tokens`): tokens returned per tool and per
//! caller, and results over their tool's budget. The caller series are bounded: past
//! [`MAX_CALLERS`] distinct callers, the rest count under `caller="_other"`.

use std::sync::{Arc, Mutex};

use quiver_model::spec::access::Principal;
use rustc_hash::FxHashSet;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Distinct callers with a series of their own.
pub const MAX_CALLERS: usize = 500;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolName {
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OverLabels {
    tool: String,
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallerName {
    caller: String,
}

/// Counters of results' tokens.
#[derive(Debug, Default)]
pub struct TokenMetrics {
    results: Family<ToolName, Counter>,
    over: Family<OverLabels, Counter>,
    callers: Family<CallerName, Counter>,
    /// The callers with a series of their own.
    listed: Mutex<FxHashSet<Box<str>>>,
}

impl TokenMetrics {
    /// Registers the metrics in `root` (the `quiver_` registry).
    pub fn register(root: &mut Registry) -> Arc<Self> {
        let m = Self::default();
        root.register(
            "result_tokens",
            "Tokens of the results tools returned, by tool, for tools whose result guard meters tokens (counted before a cut)",
            m.results.clone(),
        );
        root.register(
            "caller_result_tokens",
            "Tokens of the results returned to each caller (the authenticated subject; _anonymous without client authentication; _other past the bound on distinct callers), for tools whose result guard meters tokens",
            m.callers.clone(),
        );
        root.register(
            "results_over_token_budget",
            "Results over their tool's maxResultTokens, by tool and what was done (truncate, refuse)",
            m.over.clone(),
        );
        Arc::new(m)
    }

    /// Counts the tokens of one result of `tool`.
    pub fn returned(&self, tool: &str, tokens: u64) {
        self.results
            .get_or_create(&ToolName {
                tool: tool.to_owned(),
            })
            .inc_by(tokens);
    }

    /// Counts a result of `tool` over its budget.
    pub fn over(&self, tool: &str, action: &'static str) {
        self.over
            .get_or_create(&OverLabels {
                tool: tool.to_owned(),
                action,
            })
            .inc();
    }

    /// Counts the tokens returned to `caller` (`None`: not authenticated): by the token's
    /// `sub`, else the digest that stands for its credentials (as the audit record names
    /// it). A name starting with `_` gets another, so no caller is taken for `_anonymous` or
    /// `_other`.
    pub fn to_caller(&self, caller: Option<&Principal>, tokens: u64) {
        let name = caller
            .map(|p| {
                if p.identity.sub.is_empty() {
                    &*p.subject
                } else {
                    &*p.identity.sub
                }
            })
            .filter(|n| !n.is_empty());
        let mut label = CallerName {
            caller: match name {
                None => "_anonymous".to_owned(),
                Some(n) if n.starts_with('_') => format!("_{n}"),
                Some(n) => n.to_owned(),
            },
        };
        if self.callers.get(&label).is_none() {
            let mut listed = self
                .listed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !listed.contains(label.caller.as_str()) {
                if listed.len() < MAX_CALLERS {
                    listed.insert(label.caller.as_str().into());
                } else {
                    label.caller = "_other".to_owned();
                }
            }
        }
        self.callers.get_or_create(&label).inc_by(tokens);
    }

    /// Drops the series of a tool that is no longer served.
    pub fn forget_tool(&self, tool: &str) {
        self.results.remove(&ToolName {
            tool: tool.to_owned(),
        });
        for action in ["truncate", "refuse"] {
            self.over.remove(&OverLabels {
                tool: tool.to_owned(),
                action,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callers_past_the_bound_share_one_series() {
        let mut root = Registry::default();
        let m = TokenMetrics::register(&mut root);
        let named = |sub: &str| {
            let mut p = Principal::new(["read"], []);
            p.identity.sub = sub.into();
            p
        };
        m.to_caller(Some(&named("_other")), 7);
        for i in 0..MAX_CALLERS + 10 {
            m.to_caller(Some(&named(&format!("user-{i}"))), 2);
        }
        m.to_caller(Some(&named("user-0")), 1);
        m.to_caller(None, 5);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &root).expect("encode");
        assert!(
            text.contains("caller_result_tokens_total{caller=\"user-0\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("caller_result_tokens_total{caller=\"__other\"} 7"),
            "a caller named _other is not the bucket: {text}"
        );
        // The last 11 user-N (2 each) and the anonymous caller (5).
        assert!(
            text.contains("caller_result_tokens_total{caller=\"_other\"} 27"),
            "{text}"
        );
        assert!(!text.contains(&format!("user-{}\"", MAX_CALLERS + 1)));
        assert!(
            !text.contains(&format!("user-{}\"", MAX_CALLERS - 1)),
            "the bound counts __other"
        );
        let series = text.matches("caller_result_tokens_total{").count();
        assert_eq!(series, MAX_CALLERS + 1, "the bound plus _other");
    }
}
