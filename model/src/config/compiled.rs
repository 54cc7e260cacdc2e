//! The compiled form of a ToolSet, which the registry serves from: tools with their
//! validators and handlers, resources and prompts.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::model::ToolSet;
use super::steps::Step;
use super::upstream::{CompiledUpstream, UpstreamCall, UpstreamPrompt};
use crate::handlers::ask::{ElicitCall, Question, SampleCall};
use crate::handlers::builtin::Builtin;
use crate::handlers::content::Content;
use crate::handlers::exec::ExecCall;
use crate::handlers::http::HttpCall;
use crate::schema::Schema;
use crate::spec::access::Access;
use crate::spec::checks::percent_decode;
use crate::spec::context::SecretRef;
use crate::spec::shared::Role;
use crate::template::Template;

/// A validated, compiled ToolSet.
#[derive(Debug)]
pub struct CompiledToolSet {
    /// The (merged) source document.
    pub spec: ToolSet,
    /// Content hash of `spec` (see [`super::hash`]).
    pub hash: String,
    /// Tools in declaration order.
    pub tools: Vec<CompiledTool>,
    /// Resources in declaration order.
    pub resources: Vec<CompiledResource>,
    /// Prompts in declaration order.
    pub prompts: Vec<CompiledPrompt>,
    /// Items per list page.
    pub page_size: usize,
    /// Names of the Secrets its tools and upstreams reference (what a pod must be allowed
    /// to read).
    pub secrets: std::collections::BTreeSet<String>,
    /// Upstream MCP servers whose tools are imported (see [`CompiledToolSet::tools`]: the
    /// imported ones follow the declared ones once an upstream has listed them).
    pub upstreams: Vec<CompiledUpstream>,
    /// A digest of the upstreams' tool lists the imported tools come from (0 when none):
    /// the registry changes when it does, the config (`hash`) does not.
    pub upstream_digest: u64,
    /// The `policies` and the tools' inline `policy`, compiled.
    pub policies: super::policy::PolicySet,
    /// `toolSearch`, when on (then `tools` holds `find_tools`).
    pub search: Option<super::search::SearchSettings>,
    /// The guardrail webhooks (each tool gets those that apply to it in the registry).
    pub webhooks: super::webhooks::WebhookSet,
    /// The OpenAPI sources that pin their operations, with the pinned view of each tool
    /// (decided on when the registry is built, as an upstream's).
    pub pinned_documents: Vec<super::openapi::PinnedSource>,
}

/// A compiled tool.
#[derive(Debug)]
pub struct CompiledTool {
    /// Tool name.
    pub name: String,
    /// The `tools/list` entry (name, title, description, inputSchema, ...); `Null` once the
    /// tool is in a registry snapshot, which serves it from its pre-serialized pages.
    pub descriptor: Value,
    /// Validator of the arguments.
    pub input: Schema,
    /// Validator of structured results, when an output schema is declared (boxed: most
    /// tools have none).
    pub output: Option<Box<Schema>>,
    /// What runs a call.
    pub handler: CompiledHandler,
    /// Who may call it (a pipeline's includes its steps'); `None`: every caller let in.
    pub access: Option<std::sync::Arc<Access>>,
    /// Limits on its calls and its audit options.
    pub governance: super::governance::ToolGovernance,
    /// Whether its calls may run as tasks.
    pub task: super::model::TaskSupport,
}

/// A compiled handler.
#[derive(Debug)]
pub enum CompiledHandler {
    /// A built-in function.
    Builtin(Builtin),
    /// An HTTP request. (The larger kinds are boxed, so a tool pays for its own kind only.)
    Http(Box<HttpCall>),
    /// A process.
    Exec(Box<ExecCall>),
    /// A text template.
    Template(Template),
    /// Steps referring to other tools by index.
    Pipeline(Vec<Step>),
    /// Content blocks rendered from the arguments.
    Content(Vec<Content>),
    /// A tool error whose message is rendered from the arguments.
    Error(Template),
    /// A `sampling/createMessage` request to the client.
    Sample(Box<SampleCall>),
    /// An `elicitation/create` request to the client.
    Elicit(Box<ElicitCall>),
    /// Several questions to the client, by key.
    Ask(Vec<Question>),
    /// A tool of an upstream MCP server.
    Upstream(UpstreamCall),
    /// `find_tools`, answered by the dispatcher (it sees the caller and the registry).
    FindTools,
    /// `sign_out_upstream`: forgets the caller's own token for an upstream with
    /// `identity.mode: user` (run by the server, which holds the tokens).
    SignOut,
}

impl CompiledHandler {
    /// The Secret values this handler reads.
    pub fn secrets(&self) -> &[SecretRef] {
        match self {
            Self::Http(h) => &h.secrets,
            Self::Exec(e) => &e.secrets,
            _ => &[],
        }
    }
}

/// A compiled resource.
#[derive(Debug)]
pub struct CompiledResource {
    /// The `resources/list` (or `resources/templates/list`) entry.
    pub descriptor: Value,
    /// MIME type of the text.
    pub mime_type: String,
    /// Fixed or templated.
    pub kind: ResourceKind,
    /// Values `completion/complete` offers for a URI template's variables.
    pub values: BTreeMap<String, Vec<String>>,
    /// The policies a `resources/read` of it must meet (`None`: none applies).
    pub policies: Option<Box<[std::sync::Arc<super::policy::Policy>]>>,
}

impl CompiledResource {
    /// Its `uri`, or its `uriTemplate`, as the ToolSet writes it (what policies select).
    pub fn declared_uri(&self) -> &str {
        match &self.kind {
            ResourceKind::Static { uri, .. } => uri,
            ResourceKind::Templated { pattern, .. } => pattern.source(),
            ResourceKind::Upstream { uri, .. } => uri,
        }
    }

    /// Whether it is listed by `resources/templates/list` (not `resources/list`).
    pub fn is_template(&self) -> bool {
        match &self.kind {
            ResourceKind::Static { .. } => false,
            ResourceKind::Templated { .. } => true,
            ResourceKind::Upstream { pattern, .. } => pattern.is_some(),
        }
    }
}

/// Whether a resource has a fixed URI or a URI template.
#[derive(Debug)]
pub enum ResourceKind {
    /// A fixed URI and its contents.
    Static {
        /// The URI.
        uri: String,
        /// The text, or base64 when `blob`.
        text: String,
        /// Whether `text` is a base64 blob.
        blob: bool,
    },
    /// A URI template and the contents' template over its variables.
    Templated {
        /// The URI pattern.
        pattern: UriPattern,
        /// The text template (base64 when `blob`).
        text: Template,
        /// Whether the rendered text is a base64 blob.
        blob: bool,
    },
    /// A resource (or resource template) an upstream lists, served under the upstream's
    /// name, `+` and its own URI; read from the upstream.
    Upstream {
        /// Index of the upstream in [`CompiledToolSet::upstreams`].
        upstream: usize,
        /// The served URI (or URI template).
        uri: String,
        /// The served URI template, matched as [`UriPattern::matches_segments`] does
        /// (`None`: a fixed URI).
        pattern: Option<UriPattern>,
    },
}

/// An RFC 6570 level-1 URI template (`scheme://{a}/x/{b}`), used for matching.
#[derive(Debug, Clone)]
pub struct UriPattern {
    parts: Vec<(bool, String)>,
    source: String,
}

impl UriPattern {
    pub fn compile(src: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = src;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push((false, rest[..open].to_owned()));
            }
            let close = rest[open..].find('}').ok_or("unclosed `{`")? + open;
            let name = &rest[open + 1..close];
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!(
                    "`{{{name}}}` is not a simple variable (RFC 6570 level 1)"
                ));
            }
            if parts.last().is_some_and(|(var, _)| *var) {
                return Err("two variables must be separated by literal text".into());
            }
            parts.push((true, name.to_owned()));
            rest = &rest[close + 1..];
        }
        if !rest.is_empty() {
            parts.push((false, rest.to_owned()));
        }
        Ok(Self {
            parts,
            source: src.to_owned(),
        })
    }

    /// The template as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The template's variable names, in order.
    pub fn variables(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter(|(v, _)| *v).map(|(_, n)| n.as_str())
    }

    /// [`Self::matches`], where each variable's value, decoded, is one harmless path
    /// segment: no `/` or `\\`, not `.` or `..`, no control character. What a level-1
    /// template expands to always is (it percent-encodes reserved characters); a URI that
    /// is not could walk out of what the template names at a server that decodes it.
    pub fn matches_segments(&self, uri: &str) -> Option<Value> {
        let vars = self.matches(uri)?;
        let harmless = |v: &Value| {
            v.as_str().is_some_and(|s| {
                !matches!(s, "." | "..") && !s.chars().any(|c| matches!(c, '/' | '\\') || c.is_control())
            })
        };
        vars.as_object()?.values().all(harmless).then_some(vars)
    }

    /// Matches `uri`, returning the variables as a JSON object.
    pub fn matches(&self, uri: &str) -> Option<Value> {
        let mut vars = Map::new();
        let mut rest = uri;
        let mut i = 0;
        while i < self.parts.len() {
            let (is_var, text) = &self.parts[i];
            if *is_var {
                let end = match self.parts.get(i + 1) {
                    Some((_, lit)) => rest.find(lit.as_str())?,
                    None => rest.len(),
                };
                if end == 0 {
                    return None;
                }
                vars.insert(text.clone(), Value::String(percent_decode(&rest[..end])));
                rest = &rest[end..];
            } else {
                rest = rest.strip_prefix(text.as_str())?;
            }
            i += 1;
        }
        rest.is_empty().then_some(Value::Object(vars))
    }
}

/// A compiled prompt.
#[derive(Debug)]
pub struct CompiledPrompt {
    /// Prompt name.
    pub name: String,
    /// The `prompts/list` entry.
    pub descriptor: Value,
    /// Names of required arguments.
    pub required: Vec<String>,
    /// Names of all arguments.
    pub arguments: Vec<String>,
    /// Messages: role and content block.
    pub messages: Vec<(Role, Content)>,
    /// Prompt description for `prompts/get`.
    pub description: Option<String>,
    /// Values `completion/complete` offers, by argument name.
    pub values: BTreeMap<String, Vec<String>>,
    /// Questions answered before rendering (their answers are `input`).
    pub ask: Vec<Question>,
    /// The policies a `prompts/get` of it must meet (`None`: none applies).
    pub policies: Option<Box<[std::sync::Arc<super::policy::Policy>]>>,
    /// The upstream that serves it (`None`: this ToolSet's own).
    pub upstream: Option<UpstreamPrompt>,
}
