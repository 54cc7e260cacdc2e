//! The context every compile step shares: where a spec is (its path), the problems found so
//! far, the names its templates may use, and the checks of templates and Secret references.
//! The compile driver (`config::compile`), the handler kinds and the upstreams import it; it
//! imports none of them.

use std::fmt;

use rustc_hash::FxHashMap;

use crate::template::{Authored, Template};

/// One problem found in a ToolSet, located by a path such as `tools[3].handler.http.url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Where the problem is.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem that stops a ToolSet from loading.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// All problems, in document order.
    pub problems: Vec<Problem>,
}

impl ConfigError {
    pub fn one(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            problems: vec![Problem {
                path: path.into(),
                message: message.into(),
            }],
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(f, "{n} problem{} in tool config", if n == 1 { "" } else { "s" })?;
        for p in &self.problems {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

/// First segment of a secret reference, `{{secret.NAME.KEY}}`.
pub const SECRET_ROOT: &str = "secret";
/// Most distinct Secrets one ToolSet may reference (each is one watch per pod).
pub const MAX_SECRETS: usize = 64;
/// Where secret references may appear (everywhere else they would reach the model).
pub const SECRET_PLACES: &str = "an http tool's url, headers and body, and an exec tool's env";

/// One value a tool reads from a Secret: `{{secret.NAME.KEY}}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SecretRef {
    /// The Secret's name (or a directory of `--secrets dir:PATH`).
    pub name: String,
    /// The key within it.
    pub key: String,
}

impl std::fmt::Display for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "secret `{}` key `{}`", self.name, self.key)
    }
}

#[derive(Default)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    /// The first problem's message (for nested checks that report one reason).
    pub fn first_message(&self) -> String {
        self.0.first().map_or_else(String::new, |p| p.message.clone())
    }

    pub fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            path: path.into(),
            message: message.into(),
        });
    }

    /// Adds problems reported by a nested compiler as `sub.path: message`, under `prefix`.
    pub fn nested(&mut self, prefix: &str, errs: Vec<String>) {
        for e in errs {
            match e.split_once(": ") {
                Some((path, msg)) => self.push(format!("{prefix}.{path}"), msg),
                None => self.push(prefix, e),
            }
        }
    }
}

pub fn valid_tool_name(n: &str) -> bool {
    (1..=128).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Names a template may refer to: the input's declared properties (unless the input is open),
/// and `steps.N` for N below `steps`.
pub struct Names<'a> {
    pub props: Option<Vec<&'a str>>,
    pub steps: Option<usize>,
}

impl<'a> Names<'a> {
    /// Exactly these argument names, no steps.
    pub fn arguments(props: Vec<&'a str>) -> Self {
        Self {
            props: Some(props),
            steps: None,
        }
    }
}

/// What a kind's compile step works with: where its spec is (`tools[3].handler.http`), the
/// names its templates may use, the problems found so far, and the ToolSet's tools by name.
pub struct Cx<'a> {
    /// Path of the spec being compiled.
    pub at: String,
    /// Names the templates may use.
    pub names: &'a Names<'a>,
    /// Problems found.
    pub p: &'a mut Problems,
    /// Index of every tool of the ToolSet by name.
    pub index: &'a FxHashMap<&'a str, usize>,
}

impl Cx<'_> {
    /// The context of the `kind` field under this one.
    pub fn kind(&mut self, kind: &str) -> Cx<'_> {
        Cx {
            at: format!("{}.{kind}", self.at),
            names: self.names,
            p: &mut *self.p,
            index: self.index,
        }
    }
}

pub fn check_template(t: &Template, names: &Names<'_>, path: &str, p: &mut Problems) {
    check_roots(t, names, path, p, None, None);
}

/// Checks a template that may also read Secrets, adding the references it makes to `refs`.
pub fn check_secret_template(
    t: &Template,
    names: &Names<'_>,
    path: &str,
    p: &mut Problems,
    refs: &mut Vec<SecretRef>,
) {
    check_roots(t, names, path, p, Some(refs), None);
}

/// First segment of a claim of the caller's access token, `{{caller.CLAIM}}` (http tools).
pub const CALLER_ROOT: &str = "caller";

/// Checks a template of an http tool's request: it may read Secrets (added to `refs`) and the
/// caller's claims (their top-level names added to `claims`).
pub fn check_request_template(
    t: &Template,
    names: &Names<'_>,
    path: &str,
    p: &mut Problems,
    refs: &mut Vec<SecretRef>,
    claims: &mut Vec<Box<str>>,
) {
    check_roots(t, names, path, p, Some(refs), Some(claims));
}

/// The store holds ConfigMaps too (CA bundles: `tls.caConfigMap`), under this prefix, which
/// no Secret name can start with (Kubernetes names have no `:`). A `dir:` source reads them
/// from `PATH/configmap:NAME/KEY`.
pub const CONFIG_MAP_PREFIX: &str = "configmap:";

/// A Kubernetes object name (DNS subdomain): 1-253 lower-case letters, digits, `-` and `.`,
/// starting and ending with a letter or digit.
pub fn valid_config_map_name(n: &str) -> bool {
    (1..=253).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.'))
        && n.starts_with(|c: char| c.is_ascii_alphanumeric())
        && n.ends_with(|c: char| c.is_ascii_alphanumeric())
}

pub fn valid_secret_part(s: &str) -> bool {
    (1..=253).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}

/// Checks the `{{caller.CLAIM}}` references of a template (allowed where `claims` is given,
/// their names added to it); returns whether `caller` is an argument instead.
fn check_caller(
    t: &Template,
    names: &Names<'_>,
    path: &str,
    p: &mut Problems,
    claims: Option<&mut Vec<Box<str>>>,
) -> bool {
    let caller_is_argument = names
        .props
        .as_ref()
        .is_some_and(|props| props.contains(&CALLER_ROOT));
    if let Some(claims) = claims {
        for segments in t.paths_under(CALLER_ROOT) {
            if caller_is_argument {
                p.push(
                    path,
                    "`caller` names the caller's token claims in an http tool's request; rename the argument `caller`",
                );
                break;
            }
            match segments.get(1) {
                Some(claim) => {
                    if !claims.iter().any(|c| &**c == *claim) {
                        claims.push((*claim).into());
                    }
                }
                None => p.push(path, "use `caller.CLAIM`, e.g. `{{caller.sub}}`"),
            }
        }
    } else if !caller_is_argument && t.roots().any(|(r, _)| r == CALLER_ROOT) {
        p.push(
            path,
            "the caller's claims (`{{caller.CLAIM}}`) may be used only in an http tool's url, headers and body",
        );
    }
    caller_is_argument
}

pub fn check_roots(
    t: &Template,
    names: &Names<'_>,
    path: &str,
    p: &mut Problems,
    mut secrets: Option<&mut Vec<SecretRef>>,
    claims: Option<&mut Vec<Box<str>>>,
) {
    let caller_is_argument = check_caller(t, names, path, p, claims);
    let secret_is_argument = names
        .props
        .as_ref()
        .is_some_and(|props| props.contains(&SECRET_ROOT));
    if !secret_is_argument || secrets.is_some() {
        for segments in t.paths_under(SECRET_ROOT) {
            let Some(refs) = secrets.as_deref_mut() else {
                p.push(
                    path,
                    format!("secrets (`{{{{secret.NAME.KEY}}}}`) may be used only in {SECRET_PLACES}"),
                );
                break;
            };
            match segments.as_slice() {
                [_, name, key] if valid_secret_part(name) && valid_secret_part(key) => {
                    let r = SecretRef {
                        name: (*name).to_owned(),
                        key: (*key).to_owned(),
                    };
                    if !refs.contains(&r) {
                        refs.push(r);
                    }
                }
                _ => p.push(
                    path,
                    format!(
                        "`{}` is not a secret reference: use `secret.NAME.KEY` (letters, digits, `-`, `_`)",
                        segments.join(".")
                    ),
                ),
            }
        }
    }
    for (root, idx) in t.roots() {
        if root == SECRET_ROOT && (secrets.is_some() || !secret_is_argument) {
            continue;
        }
        if root == CALLER_ROOT && !caller_is_argument {
            continue;
        }
        if root == "steps"
            && let Some(limit) = names.steps
        {
            match idx {
                Some(i) if i < limit => {}
                Some(i) => p.push(
                    path,
                    format!("`steps.{i}` refers to a step that has not run yet (this is step {limit})"),
                ),
                None => p.push(
                    path,
                    "use `steps.N.text` or `steps.N.structured` with a step number",
                ),
            }
            continue;
        }
        if let Some(props) = &names.props
            && !props.contains(&root)
        {
            p.push(
                path,
                format!(
                    "template uses `{root}`, which is not an input property ({})",
                    if props.is_empty() {
                        "none declared".to_owned()
                    } else {
                        props.join(", ")
                    }
                ),
            );
        }
    }
}

pub fn template(src: Authored<'_>, path: &str, p: &mut Problems) -> Option<Template> {
    Template::compile(src).map_err(|e| p.push(path, e)).ok()
}

pub fn checked_template(
    src: Authored<'_>,
    path: &str,
    names: &Names<'_>,
    p: &mut Problems,
) -> Option<Template> {
    let t = template(src, path, p)?;
    check_template(&t, names, path, p);
    Some(t)
}

/// The value of `r` in a snapshot of the secret store (`{NAME: {KEY: value}}`), or why there is none
/// (never a value).
///
/// # Errors
/// The Secret or ConfigMap, or its key, is not in the snapshot.
pub fn value_in<'a>(snapshot: &'a serde_json::Value, r: &SecretRef) -> Result<&'a str, String> {
    snapshot
        .get(&r.name)
        .and_then(|s| s.get(&r.key))
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| format!("{r} is not available"))
}
