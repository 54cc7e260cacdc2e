//! The ToolSet document: the YAML a server loads and the operator renders into a ConfigMap.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub use crate::handlers::ask::{ElicitSpec, QuestionSpec, RootsSpec, SampleSpec};
pub use crate::handlers::content::{ContentSpec, EmbeddedResourceSpec, MediaSpec, ResourceLinkSpec};
pub use crate::handlers::exec::ExecHandler;
pub use crate::handlers::http::{HttpHandler, TlsSpec};
pub use crate::handlers::pipeline::PipelineStep;

use crate::spec::json_field;
use crate::spec::shared::{Role, ToolAnnotations};

/// The only `apiVersion` a ToolSet document may carry.
pub const API_VERSION: &str = "quiver.dev/v1alpha1";
/// The only `kind` a ToolSet document may carry.
pub const KIND: &str = "ToolSet";

fn default_api_version() -> String {
    API_VERSION.to_owned()
}
fn default_kind() -> String {
    KIND.to_owned()
}

/// A set of MCP tools, resources and prompts served by one quiver-server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolSet {
    /// Document version; must be `quiver.dev/v1alpha1`.
    #[serde(default = "default_api_version")]
    pub api_version: String,
    /// Document kind; must be `ToolSet`.
    #[serde(default = "default_kind")]
    pub kind: String,
    /// How the server introduces itself in the MCP `initialize` result.
    #[serde(default)]
    pub server: ServerInfo,
    /// The tools this server offers (`tools/list`, `tools/call`).
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// Static or URI-templated text resources (`resources/list`, `resources/read`).
    #[serde(default)]
    pub resources: Vec<ResourceSpec>,
    /// Prompt templates with arguments (`prompts/list`, `prompts/get`).
    #[serde(default)]
    pub prompts: Vec<PromptSpec>,
    /// MCP servers whose tools are served as this server's own (an aggregating gateway).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstreams: Vec<super::upstream::UpstreamSpec>,
    /// OpenAPI documents whose operations are served as http tools (see docs/openapi.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub openapi: Vec<super::openapi::OpenApiSpec>,
    /// Named policies: CEL conditions a call must meet, on every tool or on the tools
    /// their `tools`/`upstreams` pick (see docs/governance.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub policies: Vec<super::policy::PolicySpec>,
    /// Rate and concurrency limits on every tool call of this server (see
    /// docs/governance.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub limits: Vec<super::governance::LimitSpec>,
    /// What every tool's results are searched for (secrets, personal data) and what is done
    /// with what is found, unless a tool or its source declares its own (see
    /// docs/guards.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_guards: Option<super::guards::ResultGuardSpec>,
    /// Guardrail webhooks: services asked about tool calls (their arguments) or results
    /// before they go on, which allow, refuse or rewrite them (see docs/guards.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub webhooks: Vec<super::webhooks::WebhookSpec>,
    /// Tool search: `tools/list` shows only the core tools and `find_tools`, which finds
    /// the others by what they do (see docs/toolset.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_search: Option<super::search::ToolSearchSpec>,
}

impl Default for ToolSet {
    fn default() -> Self {
        Self {
            api_version: default_api_version(),
            kind: default_kind(),
            server: ServerInfo::default(),
            tools: Vec::new(),
            resources: Vec::new(),
            prompts: Vec::new(),
            upstreams: Vec::new(),
            openapi: Vec::new(),
            policies: Vec::new(),
            limits: Vec::new(),
            result_guards: None,
            webhooks: Vec::new(),
            tool_search: None,
        }
    }
}

/// Server identity and listing behaviour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerInfo {
    /// Server name reported in `serverInfo.name`.
    #[serde(default = "default_server_name")]
    pub name: String,
    /// Server version reported in `serverInfo.version`.
    #[serde(default = "default_server_version")]
    pub version: String,
    /// Human-readable title reported in `serverInfo.title`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Instructions for the client's model, returned by `initialize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Items per page of `tools/list`, `resources/list` and `prompts/list` (1-10000, default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u32>,
}

fn default_server_name() -> String {
    "quiver".to_owned()
}
fn default_server_version() -> String {
    "1.0.0".to_owned()
}

impl Default for ServerInfo {
    fn default() -> Self {
        Self {
            name: default_server_name(),
            version: default_server_version(),
            title: None,
            instructions: None,
            page_size: None,
        }
    }
}

/// One tool: its name, what it accepts, and what answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolSpec {
    /// Unique tool name: 1-128 characters of `A-Z a-z 0-9 _ - .`.
    pub name: String,
    /// Human-readable display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the tool does, for the client's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Shorthand input: property name to a type (`string`, `number`, `integer`, `boolean`,
    /// `object`, `array`; suffix `?` for optional) or to a full JSON Schema. Compiled to
    /// `inputSchema` with every non-optional property required. Exclusive with `inputSchema`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "json_field::optional_map"
    )]
    // Each value is a type name or a whole JSON Schema: the API server must keep what is
    // inside it (a bare `additionalProperties: true` would let it prune a schema's fields).
    #[schemars(extend(
        "x-kubernetes-preserve-unknown-fields" = true,
        "additionalProperties" = {"x-kubernetes-preserve-unknown-fields": true}
    ))]
    pub input: Option<BTreeMap<String, Value>>,
    /// Full JSON Schema (an object schema) of the arguments. Exclusive with `input`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "json_field::optional"
    )]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub input_schema: Option<Value>,
    /// JSON Schema of `structuredContent`; when set, results carry structured content.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "json_field::optional"
    )]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub output_schema: Option<Value>,
    /// MCP tool annotations (hints for clients).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<ToolAnnotations>,
    /// Who may call it: scopes and groups from the caller's credentials. Omitted: every
    /// caller the server lets in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<crate::spec::access::AccessSpec>,
    /// A CEL condition this tool's calls must meet, besides the ToolSet's `policies` (see
    /// docs/governance.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub policy: Option<String>,
    /// Rate and concurrency limits on this tool's calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub limits: Vec<super::governance::LimitSpec>,
    /// What the audit trail records of this tool's calls beyond the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<super::governance::ToolAuditSpec>,
    /// What this tool's results are searched for and what is done with what is found,
    /// instead of the ToolSet's `resultGuards` (see docs/guards.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_guards: Option<super::guards::ResultGuardSpec>,
    /// Whether a call may run as a task for a client that declared the tasks extension:
    /// `optional` (the default of `exec` and `http` tools), `required` (a client without
    /// the extension is refused with -32021) or `forbidden` (always answered at once; the
    /// default of every other kind). `sample`, `elicit`, `ask` and `pipeline` tools may
    /// declare it (their tasks wait in `input_required` for the client's answers); the kinds
    /// that answer at once may not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskSupport>,
    /// What executes a call of this tool.
    pub handler: Handler,
}

/// Whether a tool's calls may run as tasks (`tools[].task`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskSupport {
    /// Always answered at once.
    Forbidden,
    /// A task for a client that declared the tasks extension; at once for any other.
    Optional,
    /// Only as a task: a client without the tasks extension is refused (-32021).
    Required,
}

/// The handler of a tool: exactly one kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Handler {
    /// A function built into the server (`echo`, `add`, `multiply`, `upper`, `lower`,
    /// `length`, `sha256`, `now`, `sleep`, `json`).
    Builtin(String),
    /// An HTTP request whose URL, headers and body are templates over the arguments.
    Http(HttpHandler),
    /// A program run directly from an argv list (never through a shell).
    Exec(ExecHandler),
    /// A text template over the arguments, e.g. `Hello {{name}}!`.
    Template(String),
    /// Other tools of this set, run in order; later steps see `{{steps.N.text}}`.
    Pipeline(Vec<PipelineStep>),
    /// Content blocks (text, image, audio, embedded resource, resource link) whose strings are
    /// templates over the arguments: a result that is more than one text block.
    Content(Vec<ContentSpec>),
    /// Always fails with this message (a template over the arguments), e.g. a retired tool
    /// that tells the model what to use instead.
    Error(String),
    /// Asks the client's model for a completion (`sampling/createMessage`); the model's
    /// answer is the result. Needs a client that declared `sampling`.
    Sample(SampleSpec),
    /// Asks the user for input through the client (`elicitation/create`); the answer is the
    /// result's structured content. Needs a client that declared `elicitation`.
    Elicit(ElicitSpec),
    /// Asks the client several questions at once (the model, the user, the client's roots),
    /// each under its key; the result's structured content maps each key to its answer.
    /// Under protocol 2026-07-28 they travel together in one `InputRequiredResult`.
    Ask(BTreeMap<String, QuestionSpec>),
}

/// A resource: a fixed `uri`, or a `uriTemplate` whose `{var}`s fill the text (or blob)
/// template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceSpec {
    /// Fixed URI of the resource. Exclusive with `uriTemplate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// RFC 6570 level-1 URI template, e.g. `greeting://{name}`. Exclusive with `uri`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri_template: Option<String>,
    /// Resource name.
    pub name: String,
    /// Human-readable title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the resource holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// MIME type of the contents (default `text/plain` for text, `application/octet-stream`
    /// for a blob).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Text contents; a template over the URI template's variables. Exclusive with `blob`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Binary contents as base64 (a template, like `text`). Exclusive with `text`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blob: Option<String>,
    /// Values `completion/complete` suggests for the URI template's variables (not enforced).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub values: BTreeMap<String, Vec<String>>,
}

/// A prompt template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PromptSpec {
    /// Unique prompt name.
    pub name: String,
    /// Human-readable title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the prompt is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Arguments the messages may use as `{{name}}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arguments: Vec<PromptArgument>,
    /// The messages `prompts/get` returns, rendered with the arguments (and, with `ask`,
    /// the answers as `{{input.KEY...}}`).
    pub messages: Vec<PromptMessage>,
    /// Questions to the client (its model, the user, its roots) answered before the
    /// messages are rendered. Served under protocol 2026-07-28, where `prompts/get` answers
    /// with an `InputRequiredResult` until the client retries with the answers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ask: BTreeMap<String, QuestionSpec>,
}

/// A prompt argument.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PromptArgument {
    /// Argument name.
    pub name: String,
    /// What the argument means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Whether `prompts/get` must supply it.
    #[serde(default)]
    pub required: bool,
    /// Values `completion/complete` suggests for it (not enforced).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// A prompt message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PromptMessage {
    /// Speaker.
    pub role: Role,
    /// Text template over the prompt's arguments. Exclusive with `content`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A content block (image, audio, embedded resource, ...) whose strings are templates
    /// over the prompt's arguments. Exclusive with `text`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<ContentSpec>,
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
