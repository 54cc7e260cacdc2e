//! The ToolSet configuration: model, loading from YAML sources, validation and compilation.

mod compile;
mod model;

use std::fmt;
use std::time::Duration;

use sha2::{Digest, Sha256};

pub use compile::{
    Builtin, CompiledHandler, CompiledPrompt, CompiledResource, CompiledTool, CompiledToolSet, ExecCall,
    HttpCall, ResourceKind, Step, UriPattern, compile,
};
pub use model::*;

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
    pub(crate) fn one(path: impl Into<String>, message: impl Into<String>) -> Self {
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

/// Parses one YAML document into a ToolSet.
///
/// # Errors
/// A YAML syntax error or a field that does not belong, named with `source`.
pub fn parse(source: &str, text: &str) -> Result<ToolSet, ConfigError> {
    // YAML 1.2 booleans only: a property named `n` or `no` stays a string ("Norway problem").
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    serde_saphyr::from_str_with_options::<ToolSet>(text, options)
        .map_err(|e| ConfigError::one(source, e.to_string().replace('\n', " ")))
}

/// Parses and merges several documents (files of a directory, keys of a ConfigMap) in the
/// order given: the first document's `server` wins; tools, resources and prompts are concatenated.
///
/// # Errors
/// Parse problems of every document, or no document at all.
pub fn load(sources: &[(String, String)]) -> Result<ToolSet, ConfigError> {
    let mut problems = Vec::new();
    let mut merged: Option<ToolSet> = None;
    for (name, text) in sources {
        match parse(name, text) {
            Ok(ts) => match &mut merged {
                None => merged = Some(ts),
                Some(m) => {
                    m.tools.extend(ts.tools);
                    m.resources.extend(ts.resources);
                    m.prompts.extend(ts.prompts);
                }
            },
            Err(e) => problems.extend(e.problems),
        }
    }
    if !problems.is_empty() {
        return Err(ConfigError { problems });
    }
    merged.ok_or_else(|| ConfigError::one("config", "no ToolSet document found (expected *.yaml or *.yml)"))
}

/// Content hash of a ToolSet: the same for the same tools however the YAML is formatted.
/// The operator writes it into status and the server reports it on `/status`.
pub fn hash(ts: &ToolSet) -> String {
    let bytes = serde_json::to_vec(ts).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    let mut out = String::with_capacity(16);
    for b in &digest[..8] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Parses a duration such as `250ms`, `2s`, `1.5s`, `1m`.
///
/// # Errors
/// Anything else.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => return Err(format!("`{s}` has no unit (use ms, s or m)")),
    };
    let n: f64 = num.parse().map_err(|_| format!("`{s}` is not a duration"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (use ms, s or m)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5h").is_err());
    }

    #[test]
    fn hash_ignores_formatting() {
        let a = parse("a", "tools: [{name: t, handler: {template: hi}}]").unwrap();
        let b = parse(
            "b",
            "apiVersion: quiver.dev/v1alpha1\ntools:\n  - handler:\n      template: hi\n    name: t\n",
        )
        .unwrap();
        assert_eq!(hash(&a), hash(&b));
        let c = parse("c", "tools: [{name: t, handler: {template: ho}}]").unwrap();
        assert_ne!(hash(&a), hash(&c));
    }

    #[test]
    fn unknown_fields_are_errors_naming_the_source() {
        let e = parse("tools.yaml", "tools: [{name: t, handlr: {template: hi}}]").unwrap_err();
        assert_eq!(e.problems[0].path, "tools.yaml");
        assert!(e.problems[0].message.contains("handlr"), "{e}");
    }

    #[test]
    fn yaml_1_1_booleans_stay_strings() {
        let ts = parse(
            "t",
            "tools: [{name: t, inputSchema: {type: object, required: [n, no, y]}, handler: {builtin: json}}]",
        )
        .unwrap();
        assert_eq!(
            ts.tools[0].input_schema.as_ref().unwrap()["required"],
            serde_json::json!(["n", "no", "y"])
        );
    }

    #[test]
    fn load_merges_documents() {
        let ts = load(&[
            (
                "a.yaml".into(),
                "server: {name: first}\ntools: [{name: a, handler: {template: x}}]".into(),
            ),
            (
                "b.yaml".into(),
                "server: {name: second}\ntools: [{name: b, handler: {template: y}}]".into(),
            ),
        ])
        .unwrap();
        assert_eq!(ts.server.name, "first");
        assert_eq!(ts.tools.len(), 2);
        assert!(load(&[]).is_err());
    }
}
