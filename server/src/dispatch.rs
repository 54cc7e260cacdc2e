//! Message dispatch: JSON-RPC bytes in, JSON-RPC bytes out. Shared by the HTTP and stdio
//! transports. The tools/call path parses the envelope with borrowed slices, loads the
//! registry snapshot without a lock, and writes the response straight into one buffer.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::config::{ResourceKind, Role};
use crate::handlers::{Executor, ToolOutput, check_output};
use crate::metrics::{Metrics, method_index};
use crate::protocol::{
    self, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR, RESOURCE_NOT_FOUND,
};
use crate::registry::{ListKind, Registry, Snapshot};

/// A JSON-RPC message as received: every field borrowed from the request bytes.
#[derive(Deserialize)]
struct Incoming<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// Keeps `"id": null` distinguishable from a missing id.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct CallParams<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Deserialize)]
struct CursorParams<'a> {
    #[serde(borrow, default)]
    cursor: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitializeParams<'a> {
    #[serde(borrow)]
    protocol_version: Cow<'a, str>,
}

#[derive(Deserialize)]
struct ReadParams<'a> {
    #[serde(borrow)]
    uri: Cow<'a, str>,
}

#[derive(Deserialize)]
struct PromptParams<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default)]
    arguments: Option<Map<String, Value>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CancelParams<'a> {
    #[serde(borrow)]
    request_id: &'a RawValue,
}

/// Per-request facts supplied by the transport.
#[derive(Debug, Clone, Copy)]
pub struct Ctx<'a> {
    /// Session (HTTP `Mcp-Session-Id`, `stdio`, or empty): scopes request ids for cancellation.
    pub session: &'a str,
    /// Protocol revision in force for this message.
    pub version: &'a str,
}

/// What dispatch produced.
#[derive(Debug, Default)]
pub struct Handled {
    /// The response bytes; `None` when the input held only notifications or responses.
    pub body: Option<Vec<u8>>,
    /// True when the input was a successful `initialize` (the transport may open a session).
    pub initialized: bool,
    /// The input could not be read as a request at all (parse error, invalid request without
    /// a usable id): HTTP answers 400 with the JSON-RPC error as body.
    pub malformed: bool,
}

type Failure = (i32, String);

/// Running cancellable calls by (session, request id).
type CancelMap = FxHashMap<(Box<str>, Box<str>), CancellationToken>;

fn fail<T>(code: i32, msg: impl Into<String>) -> Result<T, Failure> {
    Err((code, msg.into()))
}

fn outcome_index(code: i32) -> usize {
    match code {
        PARSE_ERROR => 1,
        INVALID_REQUEST => 2,
        METHOD_NOT_FOUND => 3,
        INVALID_PARAMS | RESOURCE_NOT_FOUND => 4,
        _ => 5,
    }
}

/// The MCP server core: registry, executor, notification fan-out, cancellation.
#[derive(Debug)]
pub struct Server {
    /// The tool registry.
    pub registry: Arc<Registry>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Runs tools.
    pub exec: Executor,
    events: broadcast::Sender<Arc<str>>,
    cancels: Mutex<CancelMap>,
}

impl Server {
    /// A server over a registry.
    pub fn new(registry: Arc<Registry>, metrics: Arc<Metrics>) -> Arc<Self> {
        let (events, _) = broadcast::channel(64);
        Arc::new(Self {
            registry,
            metrics,
            exec: Executor::new(),
            events,
            cancels: Mutex::new(FxHashMap::default()),
        })
    }

    /// Subscribes to server-to-client notifications (serialized JSON-RPC messages).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<str>> {
        self.events.subscribe()
    }

    /// Sends a notification to every open stream.
    pub fn notify(&self, method: &str) {
        let _ = self.events.send(protocol::notification(method).into());
    }

    /// Handles one transport message: a single JSON-RPC message, or a batch when `batches` is
    /// allowed (protocol 2025-03-26 only).
    pub async fn handle(&self, body: &[u8], ctx: Ctx<'_>, batches: bool) -> Handled {
        let first = body.iter().find(|b| !b.is_ascii_whitespace());
        if first != Some(&b'[') {
            return self.handle_one(body, ctx).await;
        }
        let start = Instant::now();
        let items: Vec<&RawValue> = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => return self.rejected(start, "batch", PARSE_ERROR, &format!("Parse error: {e}")),
        };
        if !batches {
            return self.rejected(
                start,
                "batch",
                INVALID_REQUEST,
                &format!(
                    "JSON-RPC batches are not supported in protocol version {}",
                    ctx.version
                ),
            );
        }
        if items.is_empty() {
            return self.rejected(start, "batch", INVALID_REQUEST, "empty batch");
        }
        let mut out = Vec::from(&b"["[..]);
        let mut any = false;
        let mut initialized = false;
        for item in items {
            let h = Box::pin(self.handle_one(item.get().as_bytes(), ctx)).await;
            initialized |= h.initialized;
            if let Some(b) = h.body {
                if any {
                    out.push(b',');
                }
                out.extend_from_slice(&b);
                any = true;
            }
        }
        out.push(b']');
        Handled {
            body: any.then_some(out),
            initialized,
            ..Handled::default()
        }
    }

    fn rejected(&self, start: Instant, method: &str, code: i32, msg: &str) -> Handled {
        self.metrics
            .record(method_index(method), outcome_index(code), start.elapsed());
        Handled {
            body: Some(protocol::error_response(None, code, msg)),
            malformed: true,
            ..Handled::default()
        }
    }

    /// Handles one JSON-RPC message.
    pub async fn handle_one(&self, body: &[u8], ctx: Ctx<'_>) -> Handled {
        let start = Instant::now();
        let msg: Incoming<'_> = match serde_json::from_slice(body) {
            Ok(m) => m,
            Err(e) if e.is_data() => {
                return self.rejected(
                    start,
                    "invalid",
                    INVALID_REQUEST,
                    &format!("Invalid request: {e}"),
                );
            }
            Err(e) => return self.rejected(start, "invalid", PARSE_ERROR, &format!("Parse error: {e}")),
        };
        if msg.jsonrpc.as_deref() != Some("2.0") {
            let id = msg.id.filter(|i| protocol::valid_id(i));
            self.metrics.record(
                method_index("invalid"),
                outcome_index(INVALID_REQUEST),
                start.elapsed(),
            );
            let body = Some(protocol::error_response(
                id,
                INVALID_REQUEST,
                "Invalid request: `jsonrpc` must be \"2.0\"",
            ));
            return Handled {
                body,
                malformed: id.is_none(),
                ..Handled::default()
            };
        }
        let Some(method) = msg.method.as_deref() else {
            if msg.id.is_some() && (msg.result.is_some() || msg.error.is_some()) {
                // A response to a server request; this server sends none, so there is nothing to match.
                self.metrics.record(method_index("response"), 0, start.elapsed());
                return Handled::default();
            }
            return self.rejected(start, "invalid", INVALID_REQUEST, "Invalid request: no `method`");
        };
        let Some(id) = msg.id else {
            self.on_notification(method, msg.params, ctx);
            self.metrics
                .record(method_index("notification"), 0, start.elapsed());
            return Handled::default();
        };
        if !protocol::valid_id(id) {
            return self.rejected(
                start,
                "invalid",
                INVALID_REQUEST,
                "Invalid request: `id` must be a string or a number",
            );
        }
        self.metrics.inflight.inc();
        let mut out = Vec::with_capacity(256);
        let mut initialized = false;
        let result = match method {
            "tools/call" => self.call_tool(msg.params, id, ctx, &mut out).await,
            "tools/list" => self.list(ListKind::Tools, msg.params, id, &mut out),
            "initialize" => self
                .initialize(msg.params, id, &mut out)
                .map(|()| initialized = true),
            "ping" => {
                protocol::write_result(&mut out, id, b"{}");
                Ok(())
            }
            "resources/list" => self.list(ListKind::Resources, msg.params, id, &mut out),
            "resources/templates/list" => self.list(ListKind::ResourceTemplates, msg.params, id, &mut out),
            "resources/read" => self.read_resource(msg.params, id, &mut out),
            "prompts/list" => self.list(ListKind::Prompts, msg.params, id, &mut out),
            "prompts/get" => self.get_prompt(msg.params, id, &mut out),
            other => fail(METHOD_NOT_FOUND, format!("Method not found: {other}")),
        };
        self.metrics.inflight.dec();
        let outcome = match result {
            Ok(()) => 0,
            Err((code, message)) => {
                out.clear();
                protocol::write_error(&mut out, Some(id), code, &message, None);
                outcome_index(code)
            }
        };
        self.metrics
            .record(method_index(method), outcome, start.elapsed());
        Handled {
            body: Some(out),
            initialized,
            malformed: false,
        }
    }

    fn on_notification(&self, method: &str, params: Option<&RawValue>, ctx: Ctx<'_>) {
        if method == "notifications/cancelled"
            && let Some(p) = params.and_then(|p| serde_json::from_str::<CancelParams<'_>>(p.get()).ok())
        {
            let key = (Box::from(ctx.session), Box::from(p.request_id.get()));
            if let Some(token) = self.cancels.lock().ok().and_then(|mut m| m.remove(&key)) {
                token.cancel();
            }
        }
    }

    fn initialize(&self, params: Option<&RawValue>, id: &RawValue, out: &mut Vec<u8>) -> Result<(), Failure> {
        let p: InitializeParams<'_> = parse_params(params)?;
        let version = protocol::supported(&p.protocol_version).unwrap_or(protocol::LATEST_VERSION);
        protocol::write_result(out, id, self.registry.load().initialize_result(version));
        Ok(())
    }

    fn list(
        &self,
        kind: ListKind,
        params: Option<&RawValue>,
        id: &RawValue,
        out: &mut Vec<u8>,
    ) -> Result<(), Failure> {
        let cursor = match params {
            Some(_) => parse_params::<CursorParams<'_>>(params)?.cursor,
            None => None,
        };
        let snap = self.registry.load();
        match snap.page(kind, cursor.as_deref()) {
            Some(page) => {
                protocol::write_result(out, id, page);
                Ok(())
            }
            None => fail(
                INVALID_PARAMS,
                "Invalid cursor: not issued by the current list (it may have changed; list again without a cursor)",
            ),
        }
    }

    async fn call_tool(
        &self,
        params: Option<&RawValue>,
        id: &RawValue,
        ctx: Ctx<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), Failure> {
        let p: CallParams<'_> = parse_params(params)?;
        let guard = self.registry.load();
        let Some(index) = guard.tool_index(&p.name) else {
            return fail(INVALID_PARAMS, format!("Unknown tool: {}", p.name));
        };
        let args = match p.arguments {
            None => Value::Object(Map::new()),
            Some(v @ Value::Object(_)) => v,
            Some(_) => return fail(INVALID_PARAMS, "Invalid params: `arguments` must be an object"),
        };
        let start = Instant::now();
        let tool = &guard.tools[index];
        let mut problems = Vec::new();
        tool.def.input.validate(&args, &mut problems);
        if !problems.is_empty() {
            let text = format!(
                "Invalid arguments for tool {}: {}",
                tool.def.name,
                problems.join("; ")
            );
            write_tool_result(out, id, &ToolOutput::error(text));
            tool.metrics.invalid_arguments.observe(start.elapsed());
            return Ok(());
        }
        let output = match self.exec.run_now(&guard, index, &args) {
            Some(o) => o,
            None => {
                // A slow handler: hold the snapshot by Arc (a reload may swap meanwhile) and
                // make the call cancellable by `notifications/cancelled`.
                let snap: Arc<Snapshot> = arc_swap::Guard::into_inner(guard);
                let result = self.run_cancellable(&snap, index, args, ctx, id).await;
                let tool = &snap.tools[index];
                return match result {
                    Some(o) => {
                        let o = check_output(&snap, index, o);
                        write_tool_result(out, id, &o);
                        observe(tool, &o, start);
                        Ok(())
                    }
                    None => fail(protocol::REQUEST_CANCELLED, "Request cancelled"),
                };
            }
        };
        let output = check_output(&guard, index, output);
        write_tool_result(out, id, &output);
        observe(tool, &output, start);
        Ok(())
    }

    async fn run_cancellable(
        &self,
        snap: &Snapshot,
        index: usize,
        args: Value,
        ctx: Ctx<'_>,
        id: &RawValue,
    ) -> Option<ToolOutput> {
        let token = CancellationToken::new();
        let key = (Box::from(ctx.session), Box::from(id.get()));
        if let Ok(mut m) = self.cancels.lock() {
            m.insert(key.clone(), token.clone());
        }
        let result = tokio::select! {
            o = self.exec.run(snap, index, args, 0) => Some(o),
            () = token.cancelled() => None,
        };
        if let Ok(mut m) = self.cancels.lock() {
            m.remove(&key);
        }
        result
    }

    fn read_resource(
        &self,
        params: Option<&RawValue>,
        id: &RawValue,
        out: &mut Vec<u8>,
    ) -> Result<(), Failure> {
        let p: ReadParams<'_> = parse_params(params)?;
        let snap = self.registry.load();
        let resources = &snap.config.resources;
        let found = snap.static_resource(&p.uri).map(|i| match &resources[i].kind {
            ResourceKind::Static { text, .. } => (text.clone(), &resources[i].mime_type),
            ResourceKind::Templated { .. } => unreachable!("static index"),
        });
        let found = found.or_else(|| {
            resources.iter().find_map(|r| match &r.kind {
                ResourceKind::Templated { pattern, text } => pattern
                    .matches(&p.uri)
                    .map(|vars| (text.render(&vars), &r.mime_type)),
                ResourceKind::Static { .. } => None,
            })
        });
        let Some((text, mime)) = found else {
            return fail(RESOURCE_NOT_FOUND, format!("Resource not found: {}", p.uri));
        };
        let result = json!({"contents": [{"uri": p.uri, "mimeType": mime, "text": text}]});
        protocol::write_result(out, id, &serde_json::to_vec(&result).unwrap_or_default());
        Ok(())
    }

    fn get_prompt(&self, params: Option<&RawValue>, id: &RawValue, out: &mut Vec<u8>) -> Result<(), Failure> {
        let p: PromptParams<'_> = parse_params(params)?;
        let snap = self.registry.load();
        let Some(i) = snap.prompt_index(&p.name) else {
            return fail(INVALID_PARAMS, format!("Unknown prompt: {}", p.name));
        };
        let prompt = &snap.config.prompts[i];
        let args = Value::Object(p.arguments.unwrap_or_default());
        let missing: Vec<&str> = prompt
            .required
            .iter()
            .filter(|r| args.get(r.as_str()).is_none_or(Value::is_null))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return fail(
                INVALID_PARAMS,
                format!(
                    "Missing required argument(s) for prompt {}: {}",
                    p.name,
                    missing.join(", ")
                ),
            );
        }
        let messages: Vec<Value> = prompt
            .messages
            .iter()
            .map(|(role, t)| {
                let role = match role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                };
                json!({"role": role, "content": {"type": "text", "text": t.render(&args)}})
            })
            .collect();
        let mut result = json!({"messages": messages});
        if let Some(d) = &prompt.description {
            result["description"] = Value::String(d.clone());
        }
        protocol::write_result(out, id, &serde_json::to_vec(&result).unwrap_or_default());
        Ok(())
    }
}

fn parse_params<'a, T: Deserialize<'a>>(params: Option<&'a RawValue>) -> Result<T, Failure> {
    let Some(p) = params else {
        return fail(INVALID_PARAMS, "Invalid params: `params` is required");
    };
    serde_json::from_str(p.get()).map_err(|e| (INVALID_PARAMS, format!("Invalid params: {e}")))
}

fn write_tool_result(out: &mut Vec<u8>, id: &RawValue, o: &ToolOutput) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.get().as_bytes());
    out.extend_from_slice(b",\"result\":");
    o.write_json(out);
    out.push(b'}');
}

#[inline]
fn observe(tool: &crate::registry::Tool, o: &ToolOutput, start: Instant) {
    let h = if o.is_error {
        &tool.metrics.tool_error
    } else {
        &tool.metrics.ok
    };
    h.observe(start.elapsed());
}
