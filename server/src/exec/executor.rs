//! The [`Executor`] that runs a compiled tool against validated arguments, and the result
//! type every kind returns.

use std::future::Future;
use std::sync::{Arc, LazyLock};

use serde_json::Value;

use super::http::Outbound;
use super::{ask, builtin, command, content, pipeline, template};
use crate::config::compiled::CompiledHandler;
use crate::handlers::builtin::Builtin;
use crate::handlers::http::HttpCall;
use crate::net::http::HttpClient;
use crate::peer::CallCtx;
use crate::protocol::output::{OutputFuture, ToolOutput};
use crate::registry::Snapshot;
use crate::secrets::Secrets;
use crate::spec::context::SecretRef;
use crate::spec::identity::IdentityMode;

/// The secret scope of handlers that read none.
static EMPTY: LazyLock<Arc<Value>> = LazyLock::new(|| Arc::new(Value::Object(serde_json::Map::new())));

/// Runs tools. Holds what handlers share: the pooled HTTP client, the secret values and
/// the upstream connections.
#[derive(Debug, Clone)]
pub struct Executor {
    pub(super) http: HttpClient,
    /// Values of `{{secret.NAME.KEY}}`.
    pub secrets: Arc<Secrets>,
    /// Connections to upstream MCP servers.
    pub upstreams: Arc<crate::upstream::Hub>,
    /// The credentials of calls that act as their caller (`identity`).
    pub identity: Arc<crate::identity::Broker>,
}

/// Pipelines may nest at most this deep. Cycles and deeper nesting are rejected when a
/// ToolSet is compiled; this bounds the rest.
pub const MAX_DEPTH: usize = crate::handlers::pipeline::MAX_PIPELINE_NESTING;

impl Executor {
    /// An executor with a fresh HTTP connection pool and an empty secret store.
    pub fn new() -> Self {
        let http = HttpClient::new();
        let secrets = Secrets::new();
        Self {
            upstreams: crate::upstream::Hub::new(Arc::clone(&secrets), http.clone()),
            http,
            secrets,
            identity: Arc::default(),
        }
    }

    /// Runs a handler that reads secrets: fails naming the first one missing, and redacts
    /// the values it used from what it returns.
    async fn with_secrets<F: Future<Output = ToolOutput>>(
        &self,
        refs: &[SecretRef],
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

    /// Runs the tool synchronously when its handler never waits (most builtins, templates)
    /// and no guardrail webhook is asked about it: no future is boxed, no task is spawned.
    /// `None` means "use [`Executor::run`]".
    #[inline]
    pub fn run_now(&self, snap: &Snapshot, tool: usize, args: &Value) -> Option<ToolOutput> {
        if snap.tools[tool].hooks.is_some() {
            return None;
        }
        Self::run_plain(snap, tool, args)
    }

    #[inline]
    fn run_plain(snap: &Snapshot, tool: usize, args: &Value) -> Option<ToolOutput> {
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
            let t = &snap.tools[tool];
            match &t.hooks {
                None => self.run_handler(snap, tool, args, depth, budget, cx).await,
                Some(hooks) => {
                    let upstream = match &t.def.handler {
                        CompiledHandler::Upstream(u) => {
                            snap.upstreams.get(u.upstream).map(|l| l.name.as_str())
                        }
                        _ => None,
                    };
                    let run = |args| self.run_handler(snap, tool, args, depth, budget, cx);
                    self.hooked(t, hooks, upstream, args, cx, run).await
                }
            }
        })
    }

    /// Runs the tool's handler (after its webhooks allowed the call).
    async fn run_handler<'a>(
        &'a self,
        snap: &'a Snapshot,
        tool: usize,
        args: Value,
        depth: usize,
        budget: Option<&'a pipeline::Budget>,
        cx: &'a CallCtx<'a>,
    ) -> ToolOutput {
        {
            if let Some(out) = Self::run_plain(snap, tool, &args) {
                return out;
            }
            match &snap.tools[tool].def.handler {
                CompiledHandler::Builtin(_) => builtin::sleep(&args).await,
                CompiledHandler::Http(h) => self.http_call(snap, tool, h, &args, cx).await,
                CompiledHandler::Exec(e) => {
                    self.with_secrets(&e.secrets, |s| async move { command::run(e, &args, &s).await })
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
                    pipeline::run(self, snap, tool, steps, args, depth, budget, cx).await
                }
                CompiledHandler::Pipeline(_) => ToolOutput::error("pipelines nested too deep"),
                CompiledHandler::Upstream(u) => match snap.upstreams.get(u.upstream) {
                    Some(link) => {
                        let auth = match link.identity() {
                            None => None,
                            Some(id) if id.mode == IdentityMode::User => {
                                return self.user_call(link, id, u, &args, cx).await;
                            }
                            Some(id) => {
                                let what = format!("upstream `{}`", link.name);
                                match self.identity.authorization(id, cx.credential, &what).await {
                                    Ok(a) => Some(a),
                                    Err(e) => return ToolOutput::error(e),
                                }
                            }
                        };
                        let mut out = self
                            .with_secrets(&link.secrets, |_| link.call_tool(u, args, cx, auth.as_ref()))
                            .await;
                        if let Some(a) = &auth {
                            crate::identity::redact(&mut out, &[bearer_value(a)]);
                        }
                        out
                    }
                    None => ToolOutput::error("this tool's upstream is not connected"),
                },
                // Answered by the dispatcher, which knows the caller; no pipeline can name it.
                CompiledHandler::FindTools => ToolOutput::error("find_tools cannot run here"),
                CompiledHandler::SignOut => self.sign_out(&args, cx).await,
                CompiledHandler::Template(_) | CompiledHandler::Content(_) | CompiledHandler::Error(_) => {
                    unreachable!("templates, content and errors run synchronously")
                }
            }
        }
    }
}

/// The token of a `Bearer TOKEN` value.
pub(super) fn bearer_value(h: &http::HeaderValue) -> &str {
    h.to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
}

impl Executor {
    /// An http tool's request, with the credential of its `identity` and the caller's claims
    /// its templates use; the values of both are redacted from the result, like Secrets.
    async fn http_call(
        &self,
        snap: &Snapshot,
        tool: usize,
        h: &HttpCall,
        args: &Value,
        cx: &CallCtx<'_>,
    ) -> ToolOutput {
        let what = || format!("tool `{}`", snap.tools[tool].def.name);
        let auth = match &h.identity {
            None => None,
            Some(id) => match self.identity.authorization(id, cx.credential, &what()).await {
                Ok(a) => Some(a),
                Err(e) => return ToolOutput::error(e),
            },
        };
        let caller = cx.credential.map_or(&Value::Null, |c| c.claims());
        let mut used: Vec<&str> = Vec::new();
        for name in &h.claims {
            match caller.get(&**name) {
                None if cx.credential.is_none() => {
                    return ToolOutput::error(format!(
                        "{}'s request uses the caller's claims, and the caller presented no OAuth/OIDC access token; refused",
                        what()
                    ));
                }
                None => {
                    return ToolOutput::error(format!(
                        "{}'s request uses the caller's `{name}` claim, which the caller's token does not have; refused",
                        what()
                    ));
                }
                Some(Value::String(v)) => used.push(v),
                Some(_) => {}
            }
        }
        let outbound = Outbound {
            authorization: auth.as_ref(),
            caller,
        };
        let mut out = self
            .with_secrets(&h.secrets, |s| async move {
                super::http::call(&self.http, h, args, &s, &outbound).await
            })
            .await;
        used.extend(auth.as_ref().map(bearer_value));
        crate::identity::redact(&mut out, &used);
        out
    }
}

impl pipeline::RunStep for Executor {
    #[inline]
    fn run_step<'a>(
        &'a self,
        snap: &'a Snapshot,
        tool: usize,
        args: Value,
        depth: usize,
        budget: &'a pipeline::Budget,
        cx: &'a CallCtx<'a>,
    ) -> OutputFuture<'a> {
        self.run_within(snap, tool, args, depth, Some(budget), cx)
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
    questions: &[crate::handlers::ask::Question],
    args: &Value,
    cx: &CallCtx<'_>,
) -> ToolOutput {
    ask::ask(questions, args, cx).await
}
