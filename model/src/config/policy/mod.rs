//! Policies: conditions in CEL on the caller, the request (a tool call, a resource read or a
//! prompt get) and its arguments, which a request must meet (a tool call after its `access`
//! is granted). A named policy without selectors applies to every tool, resource and
//! prompt; one with selectors to the tools (by name, or by the upstream they are imported
//! from), resources (by `uri`/`uriTemplate`) and prompts (by name) they pick; a tool may
//! also carry one inline `policy` expression. Every expression is checked and compiled at
//! load ([`expr`]) and run by [`eval`] over the request's facts in place.

pub mod eval;
pub mod expr;
mod scan;

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use eval::{MAX_COST, Target, ToolFacts, Verdict};

use crate::spec::access::Principal;
use crate::spec::context::Problems;

/// Most named policies of one ToolSet.
pub const MAX_POLICIES: usize = 64;
/// Most entries in one selector list.
pub const MAX_SELECTOR_ENTRIES: usize = 64;
/// Longest resource URI or prompt name in a selector (without its trailing `*`).
pub const MAX_SELECTOR_TEXT: usize = 1024;

/// A named condition on tool calls, resource reads and prompt gets: on every one, or on
/// those its selectors pick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicySpec {
    /// The policy's name, which a denial names (1-63 characters of a-z, 0-9 and `-`).
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// A CEL expression that must be true for the request to go ahead. It may read `caller`
    /// (`subject`, `issuer`, `clientId`, `claims`, `groups`, `scopes`), `request.method`
    /// (`tools/call`, `resources/read`, `prompts/get`), `tool` (`name`, `upstream`,
    /// `annotations`), `resource.uri`, `prompt.name` and `args` (a tool's or a prompt's
    /// arguments, a URI template's variables); see docs/governance.md for the subset of CEL
    /// accepted and its limits.
    #[schemars(length(min = 1, max = 2048))]
    pub expression: String,
    /// Tools it applies to, by name; a name ending in `*` matches every tool whose name
    /// starts with the rest. With no selector at all (`tools`, `upstreams`, `resources`,
    /// `prompts`), it applies to every tool, resource and prompt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 129)))]
    pub tools: Vec<String>,
    /// Upstreams whose imported tools, resources and prompts it applies to, by the
    /// upstream's `name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 63)))]
    pub upstreams: Vec<String>,
    /// Resources whose `resources/read` it applies to, by their `uri` or `uriTemplate` as
    /// written in the ToolSet; an entry ending in `*` matches every one that starts with the
    /// rest. A policy that names only tools or upstreams does not apply to resources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 1025)))]
    pub resources: Vec<String>,
    /// Prompts whose `prompts/get` it applies to, by name; a name ending in `*` matches every
    /// prompt whose name starts with the rest. A policy that names only tools or upstreams
    /// does not apply to prompts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 1025)))]
    pub prompts: Vec<String>,
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
    fn why(&self) -> &'static str {
        match self.verdict {
            Verdict::TooCostly => " (its evaluation exceeded its cost limit)",
            Verdict::Error => " (it could not be evaluated on this call, e.g. a missing argument)",
            _ => "",
        }
    }

    /// The client's message for a `resources/read` or `prompts/get` it refused (`kind`
    /// `resource` or `prompt`): which policy, never its expression.
    pub fn request_message(&self, kind: &str, name: &str) -> String {
        format!(
            "Forbidden: policy `{}` does not allow this request of {kind} {name}{}",
            self.policy,
            self.why()
        )
    }

    /// The client's message for a tool call: which policy, never its expression.
    pub fn message(&self, tool: &str) -> String {
        let why = self.why();
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

    /// Runs it on a request about `target`; `args` is `None` at `tools/list` time.
    pub fn evaluate<'a>(
        &self,
        caller: Option<&Principal>,
        target: impl Into<Target<'a>>,
        args: Option<&Value>,
    ) -> Verdict {
        eval::evaluate(&self.program.root, caller, target.into(), args)
    }
}

/// A pipeline step's `when`: a policy's expression that may also read `steps`.
#[derive(Debug)]
pub struct Condition {
    program: expr::Program,
}

impl Condition {
    /// Compiles one condition.
    ///
    /// # Errors
    /// Why it is refused.
    pub fn compile(src: &str) -> Result<Self, String> {
        Ok(Self {
            program: expr::compile_condition(src)?,
        })
    }

    /// The steps it reads (`steps.ID`, `steps[N]`, `has(steps.ID)`), as written.
    ///
    /// # Errors
    /// It reads `steps` some other way (`size(steps)`, `steps[i]` of a computed `i`): which
    /// steps it reads would then be known only when it runs.
    pub fn steps_read(&self) -> Result<Vec<String>, &'static str> {
        let mut out = Vec::new();
        read_steps(&self.program.root, &mut out)?;
        Ok(out)
    }

    /// Whether it holds for a call of pipeline `tool` by `caller` with `args`, once `steps`
    /// finished; `Err` says why it could not be decided (an error, or over its cost).
    ///
    /// # Errors
    /// It could not be decided.
    pub fn holds<'a>(
        &self,
        caller: Option<&Principal>,
        tool: impl Into<Target<'a>>,
        args: &Value,
        steps: &Value,
    ) -> Result<bool, &'static str> {
        match eval::evaluate_with(&self.program.root, caller, tool.into(), Some(args), Some(steps)) {
            Verdict::Allow => Ok(true),
            Verdict::Deny => Ok(false),
            Verdict::TooCostly => Err("it costs more to evaluate than a condition may"),
            Verdict::Error | Verdict::Unknown => {
                Err("it could not be evaluated (a value of the wrong type, or a missing field without has())")
            }
        }
    }
}

/// Collects the steps `n` reads into `out` (see [`Condition::steps_read`]).
fn read_steps(n: &expr::Node, out: &mut Vec<String>) -> Result<(), &'static str> {
    use expr::{Lit, Node, Var};
    const HOW: &str = "read a step as `steps.ID`, `steps[N]` or `has(steps.ID)`";
    let one = |inner: &Node| matches!(inner, Node::Var(Var::Steps));
    match n {
        Node::Var(Var::Steps) => return Err(HOW),
        Node::Select(inner, field) | Node::Has(inner, field) if one(inner) => {
            out.push(field.to_string());
            return Ok(());
        }
        Node::Index(inner, key) if one(inner) => {
            // `steps` is a map: the type check refuses a number as its key.
            return match &**key {
                Node::Lit(Lit::Str(s)) => {
                    out.push(s.to_string());
                    Ok(())
                }
                _ => Err(HOW),
            };
        }
        _ => {}
    }
    match n {
        Node::Lit(_) | Node::List(_) | Node::Var(_) => Ok(()),
        Node::Select(a, _)
        | Node::Has(a, _)
        | Node::Not(a)
        | Node::Neg(a)
        | Node::Size(a)
        | Node::Matches(a, _) => read_steps(a, out),
        Node::Index(a, b)
        | Node::And(a, b)
        | Node::Or(a, b)
        | Node::Cmp(_, a, b)
        | Node::Arith(_, a, b)
        | Node::In(a, b)
        | Node::Str(_, a, b)
        | Node::Quant(_, a, b) => {
            read_steps(a, out)?;
            read_steps(b, out)
        }
        Node::Cond(abc) => abc.iter().try_for_each(|x| read_steps(x, out)),
    }
}

/// Checks a request about `target` against every policy of `list` in order: a call (`args`
/// `Some`) or a listing (`None`: a policy that depends on the arguments lets it be listed).
///
/// # Errors
/// The first policy that does not allow it.
pub fn check_all(
    list: &[Arc<Policy>],
    caller: Option<&Principal>,
    target: Target<'_>,
    args: Option<&Value>,
) -> Result<(), PolicyDenial> {
    for p in list {
        match p.evaluate(caller, target, args) {
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
        check_all(&self.list, caller, Target::Tool(facts), args)
    }
}

/// Exact names, and prefixes (those written with a trailing `*`).
#[derive(Debug, Default)]
struct Names {
    exact: Vec<Box<str>>,
    prefixes: Vec<Box<str>>,
}

impl Names {
    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }

    fn picks(&self, name: &str) -> bool {
        self.exact.iter().any(|n| **n == *name) || self.prefixes.iter().any(|p| name.starts_with(&**p))
    }
}

#[derive(Debug, Default)]
struct Selector {
    tools: Names,
    upstreams: Vec<Box<str>>,
    resources: Names,
    prompts: Names,
}

impl Selector {
    /// No selector at all: every tool, resource and prompt.
    fn everything(&self) -> bool {
        self.tools.is_empty()
            && self.upstreams.is_empty()
            && self.resources.is_empty()
            && self.prompts.is_empty()
    }

    fn picks(&self, tool: &str, upstream: &str) -> bool {
        self.everything() || self.tools.picks(tool) || self.names_upstream(upstream)
    }

    fn names_upstream(&self, upstream: &str) -> bool {
        !upstream.is_empty() && self.upstreams.iter().any(|u| **u == *upstream)
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

    /// The policies of the resource declared with `uri` (its `uri` or `uriTemplate`), `None`
    /// when none applies.
    pub fn for_resource(&self, uri: &str) -> Option<Box<[Arc<Policy>]>> {
        self.picked(|s| s.everything() || s.resources.picks(uri))
    }

    /// The policies of a resource of upstream `upstream` served as `uri` (or URI template):
    /// those naming it, and those naming its upstream.
    pub fn for_upstream_resource(&self, upstream: &str, uri: &str) -> Option<Box<[Arc<Policy>]>> {
        self.picked(|s| s.everything() || s.resources.picks(uri) || s.names_upstream(upstream))
    }

    /// The policies of a prompt of upstream `upstream` served as `name`: those naming it,
    /// and those naming its upstream.
    pub fn for_upstream_prompt(&self, upstream: &str, name: &str) -> Option<Box<[Arc<Policy>]>> {
        self.picked(|s| s.everything() || s.prompts.picks(name) || s.names_upstream(upstream))
    }

    /// The policies of the prompt `name`, `None` when none applies.
    pub fn for_prompt(&self, name: &str) -> Option<Box<[Arc<Policy>]>> {
        self.picked(|s| s.everything() || s.prompts.picks(name))
    }

    fn picked(&self, picks: impl Fn(&Selector) -> bool) -> Option<Box<[Arc<Policy>]>> {
        let list: Vec<Arc<Policy>> = self
            .named
            .iter()
            .filter(|(_, s)| picks(s))
            .map(|(p, _)| Arc::clone(p))
            .collect();
        (!list.is_empty()).then(|| list.into())
    }
}

/// What a ToolSet declares that policies may name.
#[derive(Debug, Clone, Copy, Default)]
pub struct Declared<'a> {
    /// Its tools: name and inline `policy`, in order.
    pub tools: &'a [(&'a str, Option<&'a str>)],
    /// Its upstreams' names.
    pub upstreams: &'a [&'a str],
    /// Its resources' `uri` or `uriTemplate`.
    pub resources: &'a [&'a str],
    /// Its prompts' names.
    pub prompts: &'a [&'a str],
    /// It has OpenAPI sources, whose tools are named only once their documents are fetched.
    pub openapi: bool,
    /// Some upstream's resources are imported (known only once it lists them).
    pub imported_resources: bool,
    /// Some upstream's prompts are imported (known only once it lists them).
    pub imported_prompts: bool,
}

fn valid_policy_name(n: &str) -> bool {
    (1..=63).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !n.starts_with('-')
}

/// The names of one selector list: a name (checked by `valid`, and, unless `open`, one of
/// `known`), or a prefix of one followed by `*`. `what` says what an entry is ("tool name")
/// and `missing` what a problem says of a name nothing has ("no tool is named").
fn names(
    list: &[String],
    at: &str,
    (what, missing): (&str, &str),
    valid: impl Fn(&str) -> bool,
    known: &[&str],
    open: bool,
    p: &mut Problems,
) -> Names {
    let mut out = Names::default();
    for (j, t) in list.iter().enumerate() {
        match t.strip_suffix('*') {
            Some(prefix) if valid(prefix) || prefix.is_empty() => out.prefixes.push(prefix.into()),
            None if valid(t) => {
                // A name nothing has can never be picked: most likely a typo, which would
                // leave what it meant unguarded.
                if !open && !known.contains(&t.as_str()) {
                    p.push(format!("{at}[{j}]"), format!("{missing} `{t}`"));
                }
                out.exact.push(t.as_str().into());
            }
            _ => p.push(
                format!("{at}[{j}]"),
                format!("a {what}, or a prefix of one followed by `*`"),
            ),
        }
    }
    out
}

/// The selector of `spec` (at `at`), its problems pushed.
fn selector(spec: &PolicySpec, at: &str, d: &Declared<'_>, p: &mut Problems) -> Selector {
    let tools: Vec<&str> = d.tools.iter().map(|(t, _)| *t).collect();
    // Resource URIs and prompt names are free text in the ToolSet: any line of it.
    let text = |u: &str| (1..=MAX_SELECTOR_TEXT).contains(&u.len()) && !u.chars().any(char::is_control);
    let mut sel = Selector {
        // A tool may be imported from an upstream or an OpenAPI document: a name is checked
        // only when the ToolSet has neither.
        tools: names(
            &spec.tools,
            &format!("{at}.tools"),
            ("tool name", "no tool is named"),
            crate::spec::context::valid_tool_name,
            &tools,
            !d.upstreams.is_empty() || d.openapi,
            p,
        ),
        resources: names(
            &spec.resources,
            &format!("{at}.resources"),
            ("resource URI", "no resource has the `uri` or `uriTemplate`"),
            text,
            d.resources,
            d.imported_resources,
            p,
        ),
        prompts: names(
            &spec.prompts,
            &format!("{at}.prompts"),
            ("prompt name", "no prompt is named"),
            text,
            d.prompts,
            d.imported_prompts,
            p,
        ),
        upstreams: Vec::new(),
    };
    for (j, u) in spec.upstreams.iter().enumerate() {
        if d.upstreams.contains(&u.as_str()) {
            sel.upstreams.push(u.as_str().into());
        } else {
            p.push(
                format!("{at}.upstreams[{j}]"),
                format!("no upstream is named `{u}`"),
            );
        }
    }
    sel
}

/// Compiles a ToolSet's `policies`, given what it declares.
pub fn compile(policies: &[PolicySpec], d: &Declared<'_>, p: &mut Problems) -> PolicySet {
    let mut set = PolicySet::default();
    if policies.len() > MAX_POLICIES {
        p.push("policies", format!("at most {MAX_POLICIES} policies"));
        return set;
    }
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
        let lists = [&spec.tools, &spec.upstreams, &spec.resources, &spec.prompts];
        if lists.iter().any(|l| l.len() > MAX_SELECTOR_ENTRIES) {
            p.push(
                &at,
                format!(
                    "`tools`, `upstreams`, `resources` and `prompts` list at most {MAX_SELECTOR_ENTRIES} names each"
                ),
            );
            continue;
        }
        let sel = selector(spec, &at, d, p);
        match Policy::compile(&spec.name, false, &spec.expression) {
            Ok(policy) => set.named.push((Arc::new(policy), sel)),
            Err(e) => p.push(format!("{at}.expression"), e),
        }
    }
    for (i, (name, policy)) in d.tools.iter().enumerate() {
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
