//! The [`Executor`] that runs a compiled tool against validated arguments, and the result
//! type every kind returns.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};

use serde_json::Value;

use super::HttpClient;
use super::{ask, builtin, content, exec, pipeline, template};
use crate::config::{Builtin, CompiledHandler};
use crate::peer::CallCtx;
use crate::registry::Snapshot;
use crate::secrets::Secrets;

/// The secret scope of handlers that read none.
static EMPTY: LazyLock<Arc<Value>> = LazyLock::new(|| Arc::new(Value::Object(serde_json::Map::new())));

/// What the templates of an http request or an exec environment see: the arguments, and
/// the secret store under `secret` (which no argument can shadow).
pub(crate) struct WithSecrets<'a> {
    pub args: &'a Value,
    pub secrets: &'a Value,
}

impl crate::template::Scope for WithSecrets<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        if name == crate::config::SECRET_ROOT {
            Some(self.secrets)
        } else {
            self.args.get(name)
        }
    }
}

/// The result of a tool call (MCP `CallToolResult`): one text block (or rich content blocks),
/// optional structured content, and whether the tool reported an error.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// The text content (with `content`: the text of its text blocks, for pipelines).
    pub text: String,
    /// `structuredContent`.
    pub structured: Option<Value>,
    /// Content blocks sent instead of the one text block.
    pub content: Option<Vec<Value>>,
    /// `isError`.
    pub is_error: bool,
}

impl ToolOutput {
    /// A successful text result.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            structured: None,
            content: None,
            is_error: false,
        }
    }

    /// A tool execution error the client's model can read and act on.
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            structured: None,
            content: None,
            is_error: true,
        }
    }

    /// Appends the serialized `CallToolResult` object.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        if let Some(blocks) = &self.content {
            out.extend_from_slice(b"{\"content\":");
            let _ = serde_json::to_writer(&mut *out, blocks);
        } else {
            out.extend_from_slice(b"{\"content\":[{\"type\":\"text\",\"text\":");
            let _ = serde_json::to_writer(&mut *out, &self.text);
            out.extend_from_slice(b"}]");
        }
        if let Some(s) = &self.structured {
            out.extend_from_slice(b",\"structuredContent\":");
            let _ = serde_json::to_writer(&mut *out, s);
        }
        out.extend_from_slice(if self.is_error {
            b",\"isError\":true}"
        } else {
            b",\"isError\":false}"
        });
    }
}

/// A boxed future of a tool result (pipelines recurse, so the async path is boxed).
pub type OutputFuture<'a> = Pin<Box<dyn Future<Output = ToolOutput> + Send + 'a>>;

/// Runs tools. Holds what handlers share: the pooled HTTP client, the secret values and
/// the upstream connections.
#[derive(Debug, Clone)]
pub struct Executor {
    http: HttpClient,
    /// Values of `{{secret.NAME.KEY}}`.
    pub secrets: Arc<Secrets>,
    /// Connections to upstream MCP servers.
    pub upstreams: Arc<crate::upstream::Hub>,
}

/// Pipelines may nest at most this deep. Cycles and deeper nesting are rejected when a
/// ToolSet is compiled; this bounds the rest.
pub const MAX_DEPTH: usize = crate::config::MAX_PIPELINE_NESTING;

impl Executor {
    /// An executor with a fresh HTTP connection pool and an empty secret store.
    pub fn new() -> Self {
        let http = HttpClient::new();
        let secrets = Secrets::new();
        Self {
            upstreams: crate::upstream::Hub::new(Arc::clone(&secrets), http.clone()),
            http,
            secrets,
        }
    }

    /// Runs a handler that reads secrets: fails naming the first one missing, and redacts
    /// the values it used from what it returns.
    async fn with_secrets<F: Future<Output = ToolOutput>>(
        &self,
        refs: &[crate::config::SecretRef],
        run: impl FnOnce(Arc<Value>) -> F,
    ) -> ToolOutput {
        if refs.is_empty() {
            return run(Arc::clone(&EMPTY)).await;
        }
        if let Some(why) = self.secrets.unavailable(refs) {
            return ToolOutput::error(why);
        }
        let mut out = run(self.secrets.snapshot()).await;
        self.secrets.redact(refs, &mut out);
        out
    }

    /// Runs the tool synchronously when its handler never waits (most builtins, templates):
    /// no future is boxed, no task is spawned. `None` means "use [`Executor::run`]".
    #[inline]
    pub fn run_now(&self, snap: &Snapshot, tool: usize, args: &Value) -> Option<ToolOutput> {
        match &snap.tools[tool].def.handler {
            CompiledHandler::Builtin(b) if *b != Builtin::Sleep => Some(builtin::run(*b, args)),
            CompiledHandler::Template(t) => Some(template::run(t, args)),
            CompiledHandler::Content(blocks) => Some(content::run(blocks, args)),
            CompiledHandler::Error(t) => Some(template::fail(t, args)),
            _ => None,
        }
    }

    /// Runs a tool whose arguments have been validated; `cx` reaches the caller's client.
    pub fn run<'a>(
        &'a self,
        snap: &'a Snapshot,
        tool: usize,
        args: Value,
        depth: usize,
        cx: &'a CallCtx<'a>,
    ) -> OutputFuture<'a> {
        self.run_within(snap, tool, args, depth, None, cx)
    }

    /// Runs a tool as a step of a pipeline call, which shares one [`pipeline::Budget`]
    /// across all its nested steps (`None`: the tool is the call itself).
    pub(crate) fn run_within<'a>(
        &'a self,
        snap: &'a Snapshot,
        tool: usize,
        args: Value,
        depth: usize,
        budget: Option<&'a pipeline::Budget>,
        cx: &'a CallCtx<'a>,
    ) -> OutputFuture<'a> {
        Box::pin(async move {
            if let Some(out) = self.run_now(snap, tool, &args) {
                return out;
            }
            match &snap.tools[tool].def.handler {
                CompiledHandler::Builtin(_) => builtin::sleep(&args).await,
                CompiledHandler::Http(h) => {
                    self.with_secrets(&h.secrets, |s| async move { self.http.call(h, &args, &s).await })
                        .await
                }
                CompiledHandler::Exec(e) => {
                    self.with_secrets(&e.secrets, |s| async move { exec::run(e, &args, &s).await })
                        .await
                }
                CompiledHandler::Sample(s) => ask::sample(s, &args, cx).await,
                CompiledHandler::Elicit(e) => ask::elicit(e, &args, cx).await,
                CompiledHandler::Ask(q) => ask::ask(q, &args, cx).await,
                CompiledHandler::Pipeline(steps) if depth < MAX_DEPTH => {
                    let fresh;
                    let budget = match budget {
                        Some(b) => b,
                        None => {
                            fresh = pipeline::Budget::new();
                            &fresh
                        }
                    };
                    pipeline::run(self, snap, steps, args, depth, budget, cx).await
                }
                CompiledHandler::Pipeline(_) => ToolOutput::error("pipelines nested too deep"),
                CompiledHandler::Upstream(u) => match snap.upstreams.get(u.upstream) {
                    Some(link) => {
                        self.with_secrets(&link.secrets, |_| link.call_tool(&u.remote, args, cx))
                            .await
                    }
                    None => ToolOutput::error("this tool's upstream is not connected"),
                },
                CompiledHandler::Template(_) | CompiledHandler::Content(_) | CompiledHandler::Error(_) => {
                    unreachable!("templates, content and errors run synchronously")
                }
            }
        })
    }
}

impl Default for Executor {
    fn default() -> Self {
        Self::new()
    }
}

/// Asks `questions` (an `ask` handler's, or a prompt's): the answers by key as structured
/// content (see the `ask` handler).
pub async fn ask_questions(
    questions: &[crate::config::Question],
    args: &Value,
    cx: &CallCtx<'_>,
) -> ToolOutput {
    ask::ask(questions, args, cx).await
}

/// Checks a successful result against the tool's output schema.
pub fn check_output(snap: &Snapshot, tool: usize, out: ToolOutput) -> ToolOutput {
    let Some(schema) = &snap.tools[tool].def.output else {
        return out;
    };
    if out.is_error {
        return out;
    }
    match &out.structured {
        None => ToolOutput::error("the tool declares an outputSchema but produced no structured content"),
        Some(s) => {
            let mut errs = Vec::new();
            schema.validate(s, &mut errs);
            if errs.is_empty() {
                out
            } else {
                ToolOutput::error(format!(
                    "the result does not match the tool's outputSchema: {}",
                    errs.join("; ").replace("arguments", "result")
                ))
            }
        }
    }
}
