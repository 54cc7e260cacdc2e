//! Policies: conditions in CEL on the caller, the tool and the arguments, which a call must
//! meet after its `access` is granted. Named policies apply to the whole ToolSet or to the
//! tools a selector picks (by name, or by the upstream they are imported from); a tool may
//! also carry one inline `policy` expression. Every expression is checked and compiled at
//! load ([`expr`]) and run by [`eval`] over the call's facts in place.

pub mod eval;
pub mod expr;
mod scan;

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use eval::{MAX_COST, ToolFacts, Verdict};

use super::access::Principal;
use super::context::Problems;

/// Most named policies of one ToolSet.
pub const MAX_POLICIES: usize = 64;
/// Most entries in one selector list.
pub const MAX_SELECTOR_ENTRIES: usize = 64;

/// A named condition on tool calls, for every tool or for those its selectors pick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicySpec {
    /// The policy's name, which a denial names (1-63 characters of a-z, 0-9 and `-`).
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// A CEL expression that must be true for the call to go ahead. It may read `caller`
    /// (`subject`, `issuer`, `clientId`, `claims`, `groups`, `scopes`), `tool` (`name`,
    /// `upstream`, `annotations`) and `args`; see docs/governance.md for the subset of CEL
    /// accepted and its limits.
    #[schemars(length(min = 1, max = 2048))]
    pub expression: String,
    /// Tools it applies to, by name; a name ending in `*` matches every tool whose name
    /// starts with the rest. With neither `tools` nor `upstreams`, it applies to every tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 129)))]
    pub tools: Vec<String>,
    /// Upstreams whose imported tools it applies to, by the upstream's `name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 63)))]
    pub upstreams: Vec<String>,
}

/// A compiled policy.
#[derive(Debug)]
pub struct Policy {
    /// Its name; for a tool's inline `policy`, the tool's name.
    pub name: Box<str>,
    /// Whether it is a tool's inline `policy`.
    pub inline: bool,
    program: expr::Program,
}

/// Why a call was denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyDenial {
    /// The policy (for an inline one, the tool's name).
    pub policy: Box<str>,
    /// Whether it is the tool's inline `policy`.
    pub inline: bool,
    /// What its expression came to.
    pub verdict: Verdict,
}

impl PolicyDenial {
    /// The client's message: which policy, never its expression.
    pub fn message(&self, tool: &str) -> String {
        let why = match self.verdict {
            Verdict::TooCostly => " (its evaluation exceeded its cost limit)",
            Verdict::Error => " (it could not be evaluated on this call, e.g. a missing argument)",
            _ => "",
        };
        if self.inline {
            format!("Forbidden: the policy of tool {tool} does not allow this call{why}")
        } else {
            format!(
                "Forbidden: policy `{}` does not allow this call of tool {tool}{why}",
                self.policy
            )
        }
    }
}

impl Policy {
    /// Compiles one expression.
    ///
    /// # Errors
    /// Why it is refused.
    pub fn compile(name: &str, inline: bool, src: &str) -> Result<Self, String> {
        Ok(Self {
            name: name.into(),
            inline,
            program: expr::compile(src)?,
        })
    }

    /// Whether it reads the arguments.
    pub fn reads_args(&self) -> bool {
        self.program.reads_args
    }

    /// Runs it; `args` is `None` at `tools/list` time.
    pub fn evaluate(&self, caller: Option<&Principal>, tool: ToolFacts<'_>, args: Option<&Value>) -> Verdict {
        eval::evaluate(&self.program.root, caller, tool, args)
    }
}

/// The policies that apply to one tool, with the facts about it they read.
#[derive(Debug)]
pub struct ToolPolicies {
    /// In order: the ToolSet's named ones, then the tool's inline one.
    pub list: Box<[Arc<Policy>]>,
    /// The tool's annotations (`Null`: none).
    pub annotations: Value,
    /// The upstream it is imported from (`""`: declared).
    pub upstream: Box<str>,
    /// For a pipeline: the tools it runs (its steps, and theirs), by index, that have
    /// policies. Each step's call is checked against its tool's own policies with the
    /// arguments that step sends; here they decide only whether the pipeline is listed.
    pub steps: Box<[usize]>,
}

impl ToolPolicies {
    /// Checks a call (`args` `Some`) or a listing (`None`: a policy that depends on the
    /// arguments lets the tool be listed).
    ///
    /// # Errors
    /// The first policy that does not allow it.
    pub fn check(
        &self,
        name: &str,
        caller: Option<&Principal>,
        args: Option<&Value>,
    ) -> Result<(), PolicyDenial> {
        let facts = ToolFacts {
            name,
            upstream: &self.upstream,
            annotations: &self.annotations,
        };
        for p in &*self.list {
            match p.evaluate(caller, facts, args) {
                Verdict::Allow => {}
                Verdict::Unknown if args.is_none() => {}
                verdict => {
                    return Err(PolicyDenial {
                        policy: p.name.clone(),
                        inline: p.inline,
                        verdict,
                    });
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Selector {
    /// Exact names, and prefixes (those written with a trailing `*`).
    names: Vec<Box<str>>,
    prefixes: Vec<Box<str>>,
    upstreams: Vec<Box<str>>,
}

impl Selector {
    fn picks(&self, tool: &str, upstream: &str) -> bool {
        let everything = self.names.is_empty() && self.prefixes.is_empty() && self.upstreams.is_empty();
        everything
            || self.names.iter().any(|n| **n == *tool)
            || self.prefixes.iter().any(|p| tool.starts_with(&**p))
            || (!upstream.is_empty() && self.upstreams.iter().any(|u| **u == *upstream))
    }
}

/// Every policy of a ToolSet, compiled.
#[derive(Debug, Default)]
pub struct PolicySet {
    named: Vec<(Arc<Policy>, Selector)>,
    /// Inline policies by tool name.
    inline: Vec<(Box<str>, Arc<Policy>)>,
}

impl PolicySet {
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.named.is_empty() && self.inline.is_empty()
    }

    /// The policies of a tool, `None` when none applies (the tool then pays nothing).
    pub fn for_tool(
        &self,
        name: &str,
        upstream: &str,
        annotations: Option<&Value>,
    ) -> Option<Box<ToolPolicies>> {
        let mut list: Vec<Arc<Policy>> = self
            .named
            .iter()
            .filter(|(_, s)| s.picks(name, upstream))
            .map(|(p, _)| Arc::clone(p))
            .collect();
        // Inline policies belong to declared tools only.
        if upstream.is_empty() {
            list.extend(
                self.inline
                    .iter()
                    .filter(|(t, _)| **t == *name)
                    .map(|(_, p)| Arc::clone(p)),
            );
        }
        (!list.is_empty()).then(|| {
            Box::new(ToolPolicies {
                list: list.into(),
                annotations: annotations.cloned().unwrap_or(Value::Null),
                upstream: upstream.into(),
                steps: Box::new([]),
            })
        })
    }
}

fn valid_policy_name(n: &str) -> bool {
    (1..=63).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !n.starts_with('-')
}

/// Compiles a ToolSet's `policies`, given its tools (name and inline `policy`, in order)
/// and its upstreams' names.
pub(crate) fn compile<'a>(
    policies: &[PolicySpec],
    tools: &[(&'a str, Option<&'a str>)],
    upstreams: &[&str],
    p: &mut Problems,
) -> PolicySet {
    let mut set = PolicySet::default();
    if policies.len() > MAX_POLICIES {
        p.push("policies", format!("at most {MAX_POLICIES} policies"));
        return set;
    }
    let declared = |n: &str| tools.iter().any(|(t, _)| *t == n);
    for (i, spec) in policies.iter().enumerate() {
        let at = format!("policies[{i}]");
        if !valid_policy_name(&spec.name) {
            p.push(
                format!("{at}.name"),
                "a policy name is 1-63 characters of a-z, 0-9 and `-`, not starting with `-`",
            );
        } else if policies[..i].iter().any(|o| o.name == spec.name) {
            p.push(
                format!("{at}.name"),
                format!("duplicate policy name `{}`", spec.name),
            );
        }
        let mut sel = Selector {
            names: Vec::new(),
            prefixes: Vec::new(),
            upstreams: Vec::new(),
        };
        if spec.tools.len() > MAX_SELECTOR_ENTRIES || spec.upstreams.len() > MAX_SELECTOR_ENTRIES {
            p.push(
                &at,
                format!("`tools` and `upstreams` list at most {MAX_SELECTOR_ENTRIES} names each"),
            );
            continue;
        }
        for (j, t) in spec.tools.iter().enumerate() {
            match t.strip_suffix('*') {
                Some(prefix) if super::context::valid_tool_name(prefix) || prefix.is_empty() => {
                    sel.prefixes.push(prefix.into());
                }
                None if super::context::valid_tool_name(t) => {
                    // A tool that is neither declared nor possibly imported can never be picked:
                    // most likely a typo, which would leave the tool it meant unguarded.
                    if !declared(t) && upstreams.is_empty() {
                        p.push(format!("{at}.tools[{j}]"), format!("no tool is named `{t}`"));
                    }
                    sel.names.push(t.as_str().into());
                }
                _ => p.push(
                    format!("{at}.tools[{j}]"),
                    "a tool name, or a prefix of one followed by `*`",
                ),
            }
        }
        for (j, u) in spec.upstreams.iter().enumerate() {
            if upstreams.contains(&u.as_str()) {
                sel.upstreams.push(u.as_str().into());
            } else {
                p.push(
                    format!("{at}.upstreams[{j}]"),
                    format!("no upstream is named `{u}`"),
                );
            }
        }
        match Policy::compile(&spec.name, false, &spec.expression) {
            Ok(policy) => set.named.push((Arc::new(policy), sel)),
            Err(e) => p.push(format!("{at}.expression"), e),
        }
    }
    for (i, (name, policy)) in tools.iter().enumerate() {
        if let Some(src) = policy {
            match Policy::compile(name, true, src) {
                Ok(policy) => set.inline.push(((*name).into(), Arc::new(policy))),
                Err(e) => p.push(format!("tools[{i}].policy"), e),
            }
        }
    }
    set
}

#[cfg(test)]
mod tests;
