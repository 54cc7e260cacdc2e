//! The ToolSet configuration: model, loading from YAML sources, validation and compilation.
//!
//! This module is the facade the runtime above it (registry, dispatch, transports, reload)
//! and the operator use: it re-exports the model, the compiled form and each handler kind's
//! types. Nothing below it imports it: the compile steps share the compile context and field
//! checks of [`crate::spec`], and each handler kind imports those and its own types directly.

pub mod compile;
pub mod compiled;
pub mod egress;
pub mod governance;
pub mod guards;
mod json_doc;
pub mod model;
pub mod openapi;
mod pipelines;
pub mod policy;
pub mod search;
mod search_build;
pub mod steps;
pub mod upstream;
pub mod webhooks;

pub use crate::handlers::content;

pub use crate::handlers::ask::{
    ElicitCall, MAX_QUESTION_KEY, MAX_QUESTIONS, MAX_SAMPLE_TOKENS, Question, QuestionKind, SampleCall,
};
pub use crate::handlers::builtin::Builtin;
pub use crate::handlers::exec::{ExecArg, ExecCall};
pub use crate::handlers::http::{HttpCall, TlsRefs};
pub use crate::handlers::pipeline::{MAX_PIPELINE_NESTING, MAX_PIPELINE_STEPS, OnAnswer};
pub use crate::spec::checks::parse_duration;
pub use crate::spec::context::{
    CONFIG_MAP_PREFIX, ConfigError, MAX_SECRETS, Problem, SECRET_ROOT, SecretRef, valid_config_map_name,
};
pub use crate::spec::json_field::MAX_VALUE_DEPTH;
pub use crate::spec::shared::{LogLevel, Role, ToolAnnotations};
pub use compile::compile;
pub use compiled::{
    CompiledHandler, CompiledPrompt, CompiledResource, CompiledTool, CompiledToolSet, ResourceKind,
    UriPattern,
};
pub use json_doc::write as write_document;
pub use model::*;
pub use steps::{ForEach, Retry, Step, StepRun, is_chain};

/// Largest ToolSet document accepted, in bytes (a ConfigMap holds at most 1 MiB; files may be
/// larger, up to this).
pub const MAX_DOCUMENT_BYTES: usize = 8 << 20;
/// Deepest nesting of YAML collections accepted in a document. Every walk over a parsed
/// document is bounded by this (and [`compile`] bounds embedded JSON values more tightly).
pub const MAX_YAML_DEPTH: usize = 48;

pub fn yaml_options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    // YAML 1.2 booleans only: a property named `n` or `no` stays a string ("Norway problem").
    options.strict_booleans = true;
    // Errors name a line and column, never quote the text: a config line may hold a credential,
    // and errors reach logs, /status, events and conditions.
    options.with_snippet = false;
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_YAML_DEPTH;
    budget.max_reader_input_bytes = Some(MAX_DOCUMENT_BYTES);
    budget.max_total_scalar_bytes = MAX_DOCUMENT_BYTES;
    // Aliases replay their anchor's events: bound the expansion ("billion laughs").
    budget.max_events = 500_000;
    budget.max_nodes = 250_000;
    options.budget = Some(budget);
    options
}

/// [`redact`] for other parsers of configuration documents.
pub fn redact_message(message: &str) -> String {
    redact(message)
}

/// Removes quoted text from a parser message: serde quotes the offending value
/// (`invalid type: string "sk-live-…", expected u64`), which may be a secret.
fn redact(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(open) = rest.find('"') {
        out.push_str(&rest[..open]);
        match rest[open + 1..].find('"') {
            Some(close) => {
                out.push_str("\"…\"");
                rest = &rest[open + 1 + close + 1..];
            }
            None => {
                out.push('…');
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out.replace('\n', " ")
}

/// Parses one YAML document into a ToolSet. A document that is plain JSON (as the operator
/// writes it) takes a faster parser to the same ToolSet (see `json_doc`).
///
/// # Errors
/// A YAML syntax error, a document over the size or nesting limits, or a field that does not
/// belong, named with `source`. Messages give the position and never quote the document.
pub fn parse(source: &str, text: &str) -> Result<ToolSet, ConfigError> {
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(ConfigError::one(
            source,
            format!(
                "the document has {} bytes; at most {MAX_DOCUMENT_BYTES} are accepted",
                text.len()
            ),
        ));
    }
    if let Some(ts) = json_doc::parse(text) {
        return Ok(ts);
    }
    serde_saphyr::from_str_with_options::<ToolSet>(text, yaml_options())
        .map_err(|e| ConfigError::one(source, redact(&e.to_string())))
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
                    m.upstreams.extend(ts.upstreams);
                    m.openapi.extend(ts.openapi);
                    m.policies.extend(ts.policies);
                    m.limits.extend(ts.limits);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_do_not_quote_the_document() {
        let secret = "sk-live-0123456789abcdef";
        for yaml in [
            format!("tools: [{{name: t, handler: {{http: {{url: 'http://x/', maxResponseBytes: \"{secret}\"}}}}}}]"),
            "tools:\n  - name: t\n    handler: {http: {url: x, headers: {Authorization: Bearer SECRET}}}\n   bad: [\n".replace("SECRET", secret),
            format!("server: {{name: {secret}, pageSize: {secret}}}"),
            secret.to_string(),
        ] {
            let e = parse("tools.yaml", &yaml).unwrap_err().to_string();
            assert!(!e.contains("0123456789abcdef"), "secret in {e:?}");
            assert!(e.contains("tools.yaml"), "{e}");
        }
    }

    #[test]
    fn deep_and_huge_documents_are_refused_not_crashed_on() {
        let deep = format!(
            "tools: [{{name: t, handler: {{builtin: json}}, inputSchema: {}{}}}]",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert!(parse("t", &deep).is_err());
        let deep_block: String = (0..5_000).map(|i| format!("{}- \n", "  ".repeat(i))).collect();
        assert!(parse("t", &deep_block).is_err());
        let laughs = "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]\n";
        assert!(parse("t", laughs).is_err());
        let huge = format!("tools: []\n# {}", "x".repeat(MAX_DOCUMENT_BYTES));
        assert!(parse("t", &huge).unwrap_err().to_string().contains("at most"));
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
