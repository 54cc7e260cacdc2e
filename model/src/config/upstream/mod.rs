//! Upstream MCP servers: tools imported from another MCP server, reached over Streamable
//! HTTP or run by quiver-server as a stdio program, then filtered, renamed and checked by
//! Quiver before anything is forwarded.
//!
//! This module owns the declaration (`upstreams:` of a ToolSet), its validation, and the
//! import step that turns an upstream's `tools/list` into compiled tools of the registry.
//! The connections themselves are `crate::upstream` (runtime only).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use rustc_hash::{FxHashMap, FxHashSet, FxHasher};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::handlers::http::{TlsRefs, TlsSpec, compile_tls};
use crate::spec::checks::{duration_or, header_name_problem, literal_origin, valid_env_name};
use crate::spec::context::{Names, Problems, SecretRef, check_secret_template, valid_tool_name};
use crate::spec::shared::ToolAnnotations;
use crate::template::{Authored, Template};

mod import;
pub mod offers;
pub mod pin;
pub mod sign_out;

/// At most this many upstreams per ToolSet.
pub const MAX_UPSTREAMS: usize = 64;
/// At most this many tools are imported from one upstream (more are reported, not served).
pub const MAX_UPSTREAM_TOOLS: usize = 10_000;
/// Headers of a remote upstream's requests that quiver-server sets itself (besides the
/// framing ones): the URL's host, the JSON-RPC body's type, and the MCP session.
const UPSTREAM_HEADERS: [&str; 5] = [
    "host",
    "content-type",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
];
/// At most this many stdio processes per upstream.
pub const MAX_PROCESSES: u32 = 16;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;
/// Largest `maxMessageBytes`.
const MAX_MESSAGE_BYTES: u64 = 64 << 20;
/// Largest descriptor of an imported tool (name, description, schemas, annotations), so a
/// page of `tools/list` always fits the server's response limit.
pub const MAX_DESCRIPTOR_BYTES: usize = 64 * 1024;
/// `pattern`s compiled per upstream import (each bounded in size by the schema compiler).
pub const MAX_UPSTREAM_PATTERNS: usize = 1000;
const MAX_PREFIX: usize = 64;

/// An MCP server whose tools this server serves as its own: exactly one of `http`, `stdio`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpstreamSpec {
    /// 1-63 characters of `a-z 0-9 -`, starting with a letter; names the upstream in
    /// `/status`, metrics and errors.
    pub name: String,
    /// A remote MCP server over Streamable HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<RemoteSpec>,
    /// An MCP server program run by quiver-server, speaking JSON-RPC over its stdin/stdout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdio: Option<StdioSpec>,
    /// Time limit of each request to the upstream, the handshake included (default 30s,
    /// at most 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Largest message accepted from the upstream, in bytes (default 4 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_message_bytes: Option<u64>,
    /// Which of its tools are served, and under which names. Changing only this never
    /// restarts or reconnects the upstream.
    #[serde(default, skip_serializing_if = "ImportSpec::is_empty")]
    pub tools: ImportSpec,
    /// Which credential its tool calls carry as `Authorization: Bearer ...` (`http` only; a
    /// stdio program has no request headers): the server's own (`http.headers`, the
    /// default), the caller's token (`forward`, only when addressed to `audience`), one
    /// exchanged for it (`exchange`), or the token each user got by signing in at the
    /// upstream's own authorization server (`user`). The server's own session
    /// (`initialize`, `tools/list`, notifications) keeps `http.headers`; each caller's calls
    /// go in a session opened with that caller's credential. See docs/governance.md and
    /// docs/upstreams.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<crate::spec::identity::IdentitySpec>,
    /// Pinned tool definitions: `warn` or `enforce` records each tool's definition (name,
    /// title, description, schemas, annotations) when first seen; a definition that changes
    /// later, or a tool that appears later, awaits approval (`kubectl quiver approve`).
    /// `enforce` does not list it and refuses its calls meanwhile; `warn` serves it and
    /// reports it. Default `off`. See docs/pinning.md.
    #[serde(default, skip_serializing_if = "is_off")]
    pub pin: pin::PinMode,
    /// Serve its resources and resource templates too (absent: none), each under the
    /// upstream's name, `+` and its own URI (`docs+file:///guide.md`): URIs of two upstreams
    /// never meet, and a read goes to the upstream that owns the URI. Read with the server's
    /// own credential (not with `identity`). See docs/upstreams.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<offers::ResourceImportSpec>,
    /// Serve its prompts too (absent: none), under their names or `prefix`/`rename`d ones.
    /// A name two upstreams list is served by neither; a prompt of the ToolSet keeps its
    /// name. Fetched with the server's own credential (not with `identity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompts: Option<offers::PromptImportSpec>,
    /// Which protocol revision it is spoken to in (`http` only): `auto` (the default) opens
    /// a session (`initialize`, revisions 2024-11-05 to 2025-11-25) and, when the upstream
    /// refuses one, speaks 2026-07-28 (stateless: `server/discover`, every request carrying
    /// its `_meta`); `handshake` only opens sessions; `2026-07-28` only speaks that
    /// revision. The revision in use is on `/status`. Clients of either revision use it
    /// alike.
    #[serde(default, skip_serializing_if = "is_auto")]
    pub revision: UpstreamRevision,
}

/// The protocol revision an upstream is spoken to in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum UpstreamRevision {
    /// A session first; 2026-07-28 when the upstream refuses one.
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// Sessions only (`initialize`; 2024-11-05 to 2025-11-25).
    #[serde(rename = "handshake")]
    Handshake,
    /// 2026-07-28 only (stateless).
    #[serde(rename = "2026-07-28")]
    Stateless,
}

fn is_auto(r: &UpstreamRevision) -> bool {
    *r == UpstreamRevision::Auto
}

pub(crate) fn is_off(m: &pin::PinMode) -> bool {
    !m.is_on()
}

/// A remote MCP server (Streamable HTTP).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemoteSpec {
    /// The MCP endpoint, `http://` or `https://` (literal).
    pub url: String,
    /// Headers of every request, e.g. `Authorization: "Bearer {{secret.github.token}}"`.
    /// Values are literal text and Secret references, read again for every request.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// TLS towards a server of a private CA, optionally with a client certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
}

/// A stdio MCP server program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StdioSpec {
    /// Program and arguments, literal (never through a shell). A program without `/` is
    /// looked up in `PATH`. Exclusive with `socket`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Instead of starting a program: a Unix socket where every connection is one process
    /// of the server, e.g. `quiver-server bridge` in a sidecar container (what the operator
    /// sets up for an upstream with an `image`). Exclusive with `command`, `env`, `cwd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// McpServer only: run `command` in a sidecar container of this image instead of the
    /// server's container (the operator adds the container and connects it by `socket`).
    /// `env` values are literal or exactly one `{{secret.NAME.KEY}}` each, read when the
    /// pod starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Environment: literal text and Secret references, read when a process starts. Only
    /// `PATH` is inherited; `HOME` and `TMPDIR` are a directory of the process's own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Processes kept running; calls are spread over them (default 1, at most 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u32>,
}

/// Which tools of an upstream are served, and how they are named and described.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImportSpec {
    /// Upstream tool names to serve (`*` matches any run of characters); empty serves all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// Upstream tool names not to serve (`*` as in `include`); wins over `include`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Put before every served name that `rename` does not set, e.g. `github_`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Upstream name to served name (no prefix added).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rename: BTreeMap<String, String>,
    /// Upstream name to the description served instead of the upstream's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub descriptions: BTreeMap<String, String>,
    /// Upstream name to the annotations served instead of the upstream's (hints clients may
    /// act on, e.g. auto-approving a `readOnlyHint` tool: an upstream's word is not taken
    /// where you know better).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, ToolAnnotations>,
    /// Upstream name to whether the served tool runs as a task (`optional`, `required`,
    /// `forbidden`), instead of what the upstream lists (`execution.taskSupport`) or the
    /// default `optional`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tasks: BTreeMap<String, super::TaskSupport>,
    /// Who may call the tools served from it (every one of them): scopes and groups from
    /// the caller's credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<crate::spec::access::AccessSpec>,
    /// Rate and concurrency limits counted over every call of the tools served from it (and
    /// every read of its resources and get of its prompts, when those are imported).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub limits: Vec<super::governance::LimitSpec>,
    /// What the results of the tools served from it are searched for, instead of the
    /// ToolSet's `resultGuards` (see docs/guards.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_guards: Option<super::guards::ResultGuardSpec>,
}

impl ImportSpec {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// How an upstream is reached.
#[derive(Debug)]
pub enum Transport {
    /// Streamable HTTP.
    Http {
        /// The endpoint.
        url: String,
        /// Header name and value template (secret references only).
        headers: Vec<(String, Template)>,
        /// TLS from Secrets.
        tls: Option<TlsRefs>,
    },
    /// A program on stdin/stdout.
    Stdio {
        /// Program (a path, or a name looked up in `PATH`).
        program: String,
        /// Its arguments.
        args: Vec<String>,
        /// Environment: literal text and secret references.
        env: Vec<(String, Template)>,
        /// Working directory.
        cwd: Option<String>,
        /// Processes kept running (connections to `socket`).
        processes: usize,
        /// Connect here instead of starting `program`.
        socket: Option<String>,
    },
}

/// A `*` pattern over tool names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob(String);

impl Glob {
    /// The pattern `p` (`*` is any run of characters).
    pub fn new(p: &str) -> Self {
        Self(p.to_owned())
    }

    /// Whether the pattern has no `*`.
    pub fn is_literal(&self) -> bool {
        !self.0.contains('*')
    }

    /// Whether `name` matches (`*` is any run of characters, possibly empty).
    pub fn matches(&self, name: &str) -> bool {
        let mut parts = self.0.split('*');
        let first = parts.next().unwrap_or_default();
        let Some(mut rest) = name.strip_prefix(first) else {
            return false;
        };
        let parts: Vec<&str> = parts.collect();
        let Some((last, middle)) = parts.split_last() else {
            return rest.is_empty();
        };
        for part in middle {
            match rest.find(part) {
                Some(i) => rest = &rest[i + part.len()..],
                None => return false,
            }
        }
        rest.len() >= last.len() && rest.ends_with(last)
    }
}

/// A compiled upstream.
#[derive(Debug)]
pub struct CompiledUpstream {
    /// Its name.
    pub name: String,
    /// How it is reached.
    pub transport: Transport,
    /// Time limit per request.
    pub timeout: Duration,
    /// Largest message accepted.
    pub max_message_bytes: usize,
    /// Secret values its connection uses (headers, TLS, environment).
    pub secrets: Vec<SecretRef>,
    /// Identity of the connection: an upstream whose key is unchanged by a reload keeps its
    /// connection or processes (only `tools` changed).
    pub key: u64,
    /// The caller's credential its tool calls carry (`None`: the server's own).
    pub identity: Option<crate::spec::identity::Identity>,
    /// Whether its tool definitions are pinned.
    pub pin: pin::PinMode,
    names: Namespace,
    /// Every upstream's names (this one's at `at`): a listed name another upstream could
    /// serve is served by neither.
    rivals: Arc<[Namespace]>,
    at: usize,
    descriptions: BTreeMap<String, String>,
    annotations: BTreeMap<String, Value>,
    tasks: BTreeMap<String, super::TaskSupport>,
    access: Option<Arc<crate::spec::access::Access>>,
    /// The limits of a call of its tools: its own, then (once the ToolSet's are added) the
    /// ToolSet's.
    pub limits: Arc<[Arc<super::governance::Limit>]>,
    /// The result guard of its tools (its own, else the ToolSet's).
    pub result_guard: Option<Arc<super::guards::ResultGuard>>,
    /// Which of its resources are served (`None`: none).
    resources: Option<offers::UriFilter>,
    /// Which of its prompts are served, and their names (`None`: none).
    prompts: Option<Namespace>,
    /// The protocol revision it is spoken to in.
    pub revision: UpstreamRevision,
}

/// The compiled handler of an imported tool.
#[derive(Debug)]
pub struct UpstreamCall {
    /// Index of the upstream in [`super::CompiledToolSet::upstreams`].
    pub upstream: usize,
    /// The tool's name at the upstream.
    pub remote: String,
    /// The upstream runs it only as a task of its own (it lists
    /// `execution.taskSupport: required`): it is called as one, and followed to its result.
    pub task: bool,
}

/// The compiled handler of an imported prompt.
#[derive(Debug, Clone)]
pub struct UpstreamPrompt {
    /// Index of the upstream in [`super::CompiledToolSet::upstreams`].
    pub upstream: usize,
    /// The prompt's name at the upstream.
    pub remote: String,
}

/// What importing an upstream's tool list did: for `/status` and the logs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportReport {
    /// Tools served.
    pub imported: usize,
    /// Tools listed but not served, each with why (a name taken, a schema Quiver cannot
    /// check, ...). Filtered-out tools are not listed.
    pub skipped: Vec<String>,
    /// Served names of tools whose definitions await approval (`pin`), whether held back
    /// (`enforce`) or served (`warn`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub awaiting: Vec<String>,
    /// Resources and resource templates served.
    #[serde(skip_serializing_if = "is_zero")]
    pub resources: usize,
    /// Prompts served.
    #[serde(skip_serializing_if = "is_zero")]
    pub prompts: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

pub(crate) fn valid_upstream_name(n: &str) -> bool {
    (1..=63).contains(&n.len())
        && n.starts_with(|c: char| c.is_ascii_lowercase())
        && !n.ends_with('-')
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Compiles `upstreams`; `local` are the ToolSet's own tool names.
pub(super) fn compile_upstreams(
    specs: &[UpstreamSpec],
    local: &FxHashSet<&str>,
    p: &mut Problems,
) -> Vec<CompiledUpstream> {
    if specs.len() > MAX_UPSTREAMS {
        // Nothing more is looked at: checking pairs of thousands would take the time and
        // memory of whoever validates (the operator included).
        p.push(
            "upstreams",
            format!("{} upstreams; at most {MAX_UPSTREAMS}", specs.len()),
        );
        return Vec::new();
    }
    let mut names: FxHashMap<&str, usize> = FxHashMap::default();
    let mut out = Vec::with_capacity(specs.len());
    for (i, u) in specs.iter().enumerate() {
        let at = format!("upstreams[{i}]");
        if !valid_upstream_name(&u.name) {
            p.push(
                format!("{at}.name"),
                format!(
                    "`{}` is not an upstream name (1-63 of a-z 0-9 -, starting with a letter, not ending with -)",
                    u.name
                ),
            );
        } else if let Some(first) = names.insert(&u.name, i) {
            p.push(
                format!("{at}.name"),
                format!("duplicate upstream name `{}` (also upstreams[{first}])", u.name),
            );
        }
        out.push(compile_upstream(u, i, &at, local, p));
    }
    check_names(&out, local, p);
    let rivals: Arc<[Namespace]> = out.iter().map(|u| u.names.clone()).collect();
    for u in &mut out {
        u.rivals = Arc::clone(&rivals);
    }
    out
}

/// Compiles `upstreams[i]` (at `at`) but for the names it shares with the others.
fn compile_upstream(
    u: &UpstreamSpec,
    i: usize,
    at: &str,
    local: &FxHashSet<&str>,
    p: &mut Problems,
) -> CompiledUpstream {
    let mut secrets = Vec::new();
    let transport = match (&u.http, &u.stdio) {
        (Some(h), None) => compile_remote(h, &format!("{at}.http"), p, &mut secrets),
        (None, Some(s)) => compile_stdio(s, &format!("{at}.stdio"), p, &mut secrets),
        _ => {
            p.push(at, "set exactly one of `http` and `stdio`");
            Transport::Stdio {
                program: String::new(),
                args: Vec::new(),
                env: Vec::new(),
                cwd: None,
                processes: 1,
                socket: None,
            }
        }
    };
    let timeout = duration_or(u.timeout.as_ref(), DEFAULT_TIMEOUT, &format!("{at}.timeout"), p);
    let max_message_bytes = match u.max_message_bytes {
        None => DEFAULT_MAX_MESSAGE_BYTES,
        Some(n @ 1024..=MAX_MESSAGE_BYTES) => usize::try_from(n).unwrap_or(DEFAULT_MAX_MESSAGE_BYTES),
        Some(_) => {
            p.push(
                format!("{at}.maxMessageBytes"),
                format!("must be between 1024 and {MAX_MESSAGE_BYTES}"),
            );
            DEFAULT_MAX_MESSAGE_BYTES
        }
    };
    let t = &u.tools;
    let (names, access) = compile_namespace(u, &format!("{at}.tools"), local, p);
    let identity = u.identity.as_ref().and_then(|i| {
        let target = u.http.as_ref().map_or("", |h| h.url.as_str());
        crate::spec::identity::compile_upstream(i, &format!("{at}.identity"), target, p, &mut secrets)
    });
    if u.identity.is_some() && (u.resources.is_some() || u.prompts.is_some()) {
        p.push(
            format!("{at}.identity"),
            "resources and prompts are read with the server's own credential, which would show every caller what one identity may see; import them from an upstream without `identity`",
        );
    }
    if u.revision == UpstreamRevision::Stateless && u.stdio.is_some() {
        p.push(
            format!("{at}.revision"),
            "a stdio upstream is spoken to in a session (the handshake revisions); `2026-07-28` is for `http` upstreams",
        );
    }
    if identity.is_some() && u.stdio.is_some() {
        p.push(
            format!("{at}.identity"),
            "a stdio upstream has no request headers to carry a token in; `identity` is for `http` upstreams",
        );
    }
    CompiledUpstream {
        identity,
        pin: u.pin,
        name: u.name.clone(),
        transport,
        timeout,
        max_message_bytes,
        secrets,
        key: connection_key(u),
        names,
        rivals: Arc::from(Vec::new()),
        at: i,
        descriptions: t.descriptions.clone(),
        annotations: t
            .annotations
            .iter()
            .map(|(k, a)| (k.clone(), serde_json::to_value(a).unwrap_or_default()))
            .collect(),
        tasks: t.tasks.clone(),
        access,
        limits: super::governance::compile_limits(
            &t.limits,
            super::governance::Scope::Upstream,
            &u.name,
            &format!("{at}.tools.limits"),
            p,
        )
        .into(),
        result_guard: t.result_guards.as_ref().map(super::guards::ResultGuard::compile),
        resources: u
            .resources
            .as_ref()
            .map(|r| offers::compile_resources(r, &format!("{at}.resources"), p)),
        prompts: u
            .prompts
            .as_ref()
            .map(|pr| offers::compile_prompts(pr, &u.name, &format!("{at}.prompts"), p)),
        revision: u.revision,
    }
}

/// The identity of an upstream's connection: its spec without `tools` and `pin`, and only
/// whether its resources and prompts are listed (not which are served).
fn connection_key(u: &UpstreamSpec) -> u64 {
    let mut h = FxHasher::default();
    let connection = UpstreamSpec {
        tools: ImportSpec::default(),
        pin: pin::PinMode::Off,
        resources: u
            .resources
            .as_ref()
            .map(|_| offers::ResourceImportSpec::default()),
        prompts: u.prompts.as_ref().map(|_| offers::PromptImportSpec::default()),
        ..u.clone()
    };
    serde_json::to_string(&connection)
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
}

/// The transport of an `http` upstream (at `hp`): a literal URL, and headers that may read
/// Secrets (added to `secrets`).
fn compile_remote(h: &RemoteSpec, hp: &str, p: &mut Problems, secrets: &mut Vec<SecretRef>) -> Transport {
    let none = Names::arguments(Vec::new());
    let url = Template::compile(Authored::new(&h.url))
        .ok()
        .filter(Template::is_literal);
    let mut origin = String::new();
    match &url {
        None => p.push(format!("{hp}.url"), "must be a literal URL"),
        Some(t) => match literal_origin(t) {
            Ok(o) => origin = o,
            Err(e) => p.push(format!("{hp}.url"), e),
        },
    }
    let mut headers = Vec::new();
    for (k, v) in &h.headers {
        let path = format!("{hp}.headers.{k}");
        if let Some(why) = header_name_problem(k, &UPSTREAM_HEADERS) {
            p.push(&path, why);
        }
        match Template::compile(Authored::new(v)) {
            Ok(t) => {
                check_secret_template(&t, &none, &path, p, secrets);
                headers.push((k.clone(), t));
            }
            Err(e) => p.push(&path, e),
        }
    }
    let tls = h
        .tls
        .as_ref()
        .map(|t| compile_tls(t, &format!("{hp}.tls"), &origin, p, secrets));
    Transport::Http {
        url: h.url.clone(),
        headers,
        tls,
    }
}

/// The transport of a `stdio` upstream (at `sp`): a program run with an environment that
/// may read Secrets (added to `secrets`), or a socket.
fn compile_stdio(s: &StdioSpec, sp: &str, p: &mut Problems, secrets: &mut Vec<SecretRef>) -> Transport {
    let program = s.command.first().cloned().unwrap_or_default();
    if s.image.is_some() {
        p.push(
            format!("{sp}.image"),
            "only an McpServer's spec.upstreams can run an image (the operator adds its container); quiver-server itself runs `command` or connects to `socket`",
        );
    }
    match &s.socket {
        None if program.is_empty() || program.contains('\0') => {
            p.push(format!("{sp}.command"), "must name a program");
        }
        None => {}
        Some(path) => {
            if !path.starts_with('/') || path.contains('\0') || path.len() > 100 {
                p.push(
                    format!("{sp}.socket"),
                    "must be an absolute path of at most 100 bytes",
                );
            }
            if !s.command.is_empty() || !s.env.is_empty() || s.cwd.is_some() {
                p.push(sp, "`socket` excludes `command`, `env` and `cwd` (they belong to whatever serves the socket)");
            }
        }
    }
    if s.command.iter().any(|a| a.contains('\0')) {
        p.push(format!("{sp}.command"), "arguments cannot hold NUL");
    }
    let none = Names::arguments(Vec::new());
    let mut env = Vec::new();
    for (k, v) in &s.env {
        let path = format!("{sp}.env.{k}");
        if !valid_env_name(k) {
            p.push(&path, "not a valid environment variable name");
        }
        match Template::compile(Authored::new(v)) {
            Ok(t) => {
                check_secret_template(&t, &none, &path, p, secrets);
                env.push((k.clone(), t));
            }
            Err(e) => p.push(&path, e),
        }
    }
    let processes = match s.processes.unwrap_or(1) {
        n @ 1..=MAX_PROCESSES => n as usize,
        _ => {
            p.push(
                format!("{sp}.processes"),
                format!("must be between 1 and {MAX_PROCESSES}"),
            );
            1
        }
    };
    if s.cwd.as_ref().is_some_and(|c| c.is_empty() || c.contains('\0')) {
        p.push(format!("{sp}.cwd"), "must be a directory path");
    }
    Transport::Stdio {
        program,
        args: s.command.iter().skip(1).cloned().collect(),
        env,
        cwd: s.cwd.clone(),
        processes,
        socket: s.socket.clone(),
    }
}

/// The names an upstream (its `tools`, at `tp`) serves, and who may call them; reports
/// names that would be those of the ToolSet's own tools (`local`).
fn compile_namespace(
    u: &UpstreamSpec,
    tp: &str,
    local: &FxHashSet<&str>,
    p: &mut Problems,
) -> (Namespace, Option<Arc<crate::spec::access::Access>>) {
    let t = &u.tools;
    let prefix = t.prefix.clone().unwrap_or_default();
    if t.prefix.is_some()
        && (prefix.is_empty()
            || prefix.len() > MAX_PREFIX
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')))
    {
        p.push(
            format!("{tp}.prefix"),
            format!("1-{MAX_PREFIX} characters of A-Z a-z 0-9 _ - ."),
        );
    }
    let globs = |list: &[String], field: &str, p: &mut Problems| -> Vec<Glob> {
        list.iter()
            .enumerate()
            .map(|(j, g)| {
                if !valid_tool_name(&g.replace('*', "x")) {
                    p.push(format!("{tp}.{field}[{j}]"), "tool names and `*` only");
                }
                Glob(g.clone())
            })
            .collect()
    };
    let include = globs(&t.include, "include", p);
    let access = t
        .access
        .as_ref()
        .and_then(|a| a.compile(&format!("{tp}.access"), p))
        .map(std::sync::Arc::new);
    let exclude = globs(&t.exclude, "exclude", p);
    let names = Namespace {
        upstream: u.name.clone(),
        include,
        exclude,
        prefix,
        rename: t.rename.clone(),
    };
    check_renames(t, &names, tp, local, p);
    for (name, d) in &t.descriptions {
        if d.trim().is_empty() {
            p.push(format!("{tp}.descriptions.{name}"), "must not be empty");
        }
    }
    for (j, g) in names.include.iter().enumerate() {
        if g.is_literal()
            && !t.rename.contains_key(&g.0)
            && local.contains(format!("{}{}", names.prefix, g.0).as_str())
        {
            p.push(
                format!("{tp}.include[{j}]"),
                format!(
                    "would be served as `{}{}`, a tool of this ToolSet; set `tools.prefix` or `tools.rename`",
                    names.prefix, g.0
                ),
            );
        }
    }
    (names, access)
}

/// Each `rename` target must be a valid name no other tool of the ToolSet or of this
/// upstream has.
fn check_renames(t: &ImportSpec, names: &Namespace, tp: &str, local: &FxHashSet<&str>, p: &mut Problems) {
    let mut targets: FxHashMap<&str, &str> = FxHashMap::default();
    for (from, to) in &t.rename {
        let path = format!("{tp}.rename.{from}");
        if !valid_tool_name(to) {
            p.push(&path, format!("`{to}` is not a valid tool name"));
        } else if local.contains(to.as_str()) {
            p.push(&path, format!("`{to}` is a tool of this ToolSet"));
        } else if let Some(other) = targets.insert(to, from) {
            p.push(&path, format!("`{other}` is renamed to `{to}` too"));
        } else if let Some(r) = names.prefixed_source(to) {
            p.push(
                &path,
                format!(
                    "`{to}` is also the name its own `{r}` is served as (prefix `{}`)",
                    names.prefix
                ),
            );
        }
    }
}

/// The names one upstream can serve: what its filter lets through, renamed or prefixed.
/// Names are compared exactly (byte for byte, case included), as calls look them up.
#[derive(Debug, Clone)]
pub struct Namespace {
    upstream: String,
    include: Vec<Glob>,
    exclude: Vec<Glob>,
    prefix: String,
    rename: BTreeMap<String, String>,
}

impl Namespace {
    fn selected(&self, remote: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|g| g.matches(remote)))
            && !self.exclude.iter().any(|g| g.matches(remote))
    }

    fn served_name(&self, remote: &str) -> String {
        self.rename
            .get(remote)
            .cloned()
            .unwrap_or_else(|| format!("{}{remote}", self.prefix))
    }

    /// The upstream tool that `name` would be the prefixed name of, if any.
    fn prefixed_source<'n>(&self, name: &'n str) -> Option<&'n str> {
        name.strip_prefix(self.prefix.as_str())
            .filter(|r| valid_tool_name(r) && !self.rename.contains_key(*r) && self.selected(r))
    }

    /// Whether some tool the upstream might list would be served as `name`.
    pub fn could_serve(&self, name: &str) -> bool {
        self.rename
            .iter()
            .any(|(from, to)| to == name && self.selected(from))
            || self.prefixed_source(name).is_some()
    }

    /// Every name it can serve, when `include` lists tool names (no `*`): a finite set.
    fn listed(&self) -> Option<Vec<String>> {
        if self.include.is_empty() || !self.include.iter().all(Glob::is_literal) {
            return None;
        }
        Some(
            self.include
                .iter()
                .filter(|g| self.selected(&g.0))
                .map(|g| self.served_name(&g.0))
                .collect(),
        )
    }

    /// The patterns of its prefixed names: `include`, or `*` when it lists none.
    fn patterns(&self) -> Vec<&str> {
        if self.include.is_empty() {
            vec!["*"]
        } else {
            self.include.iter().map(|g| g.0.as_str()).collect()
        }
    }

    /// Whether every prefixed name starting with `head` is excluded (`exclude: [gh_*]` keeps
    /// an upstream without a prefix off the names of an upstream with `prefix: gh_`).
    fn fenced(&self, head: &str) -> bool {
        let rest = if self.prefix.starts_with(head) {
            ""
        } else {
            match head.strip_prefix(self.prefix.as_str()) {
                Some(r) => r,
                None => return true,
            }
        };
        self.exclude.iter().any(|e| {
            e.0.strip_suffix('*')
                .is_some_and(|lead| !lead.contains('*') && rest.starts_with(lead))
        })
    }

    /// A name this and `other` could both serve, or why they might: `None` when they never
    /// meet, whatever the upstreams list.
    fn meets(&self, other: &Self) -> Option<String> {
        // A finite list is compared name by name: exact.
        for (a, b) in [(self, other), (other, self)] {
            if let Some(names) = a.listed() {
                return names
                    .into_iter()
                    .find(|n| b.could_serve(n))
                    .map(|n| format!("both could serve `{n}`"));
            }
        }
        for (a, b) in [(self, other), (other, self)] {
            for (from, to) in &a.rename {
                if a.selected(from) && b.could_serve(to) {
                    return Some(format!(
                        "both could serve `{to}` (upstream `{}` renames `{from}` to it)",
                        a.upstream
                    ));
                }
            }
        }
        // Open lists: two patterns can meet when the fixed text before their first `*`
        // (prefix included) of one starts the other's, unless an `exclude` fences it off.
        for ga in self.patterns() {
            for gb in other.patterns() {
                let literal = |g: &str| !g.contains('*');
                if literal(ga) || literal(gb) {
                    let (ns, g, rival) = if literal(ga) {
                        (self, ga, other)
                    } else {
                        (other, gb, self)
                    };
                    if ns.selected(g) && !ns.rename.contains_key(g) {
                        let n = format!("{}{g}", ns.prefix);
                        if rival.could_serve(&n) {
                            return Some(format!("both could serve `{n}`"));
                        }
                    }
                    continue;
                }
                let head = |ns: &Self, g: &str| format!("{}{}", ns.prefix, g.split('*').next().unwrap_or(""));
                let (ha, hb) = (head(self, ga), head(other, gb));
                let longer = if ha.len() >= hb.len() { &ha } else { &hb };
                if !(ha.starts_with(hb.as_str()) || hb.starts_with(ha.as_str()))
                    || self.fenced(longer)
                    || other.fenced(longer)
                {
                    continue;
                }
                let shown = |ns: &Self| {
                    if ns.prefix.is_empty() {
                        format!(
                            "upstream `{}` has no prefix, so it can serve any name",
                            ns.upstream
                        )
                    } else {
                        format!("upstream `{}` serves `{}*`", ns.upstream, ns.prefix)
                    }
                };
                return Some(if self.prefix == other.prefix {
                    format!("both import under the same prefix (`{}`)", self.prefix)
                } else {
                    format!(
                        "their names can meet at `{longer}…` ({}; {})",
                        shown(self),
                        shown(other)
                    )
                });
            }
        }
        None
    }
}

/// Refuses configs where two sources could serve one name: two upstreams, or an upstream and
/// a tool of the ToolSet. Which of them served it would otherwise depend on what the
/// upstreams happen to list, and in which order they answer: a call (its arguments, and the
/// `access` it is checked against) could go to the wrong one.
fn check_names(ups: &[CompiledUpstream], local: &FxHashSet<&str>, p: &mut Problems) {
    const FIX: &str = "give each upstream its own `tools.prefix` (neither a prefix of the other), list the tools in `tools.include`, or `exclude` the other's names";
    for (j, b) in ups.iter().enumerate() {
        for (i, a) in ups[..j].iter().enumerate() {
            if let Some(why) = a.names.meets(&b.names) {
                p.push(
                    format!("upstreams[{j}].tools"),
                    format!("upstreams[{i}] (`{}`) and this one: {why}; {FIX}", a.name),
                );
            }
        }
        // Names already reported with their own path (a rename, a listed name) are skipped.
        let ns = &b.names;
        let mut clash: Vec<&str> = local
            .iter()
            .copied()
            .filter(|l| {
                ns.could_serve(l)
                    && !ns.rename.values().any(|v| v == l)
                    && !ns
                        .include
                        .iter()
                        .any(|g| g.is_literal() && ns.served_name(&g.0) == *l)
            })
            .collect();
        if !clash.is_empty() {
            clash.sort_unstable();
            let shown: Vec<String> = clash.iter().take(3).map(|n| format!("`{n}`")).collect();
            p.push(
                format!("upstreams[{j}].tools"),
                format!(
                    "could serve {}{}, tool names of this ToolSet; set `tools.prefix`, list its tools in `tools.include`, or `exclude` them",
                    shown.join(", "),
                    if clash.len() > 3 { format!(" and {} more", clash.len() - 3) } else { String::new() }
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CompiledHandler;
    use crate::config::{compile, parse};
    use serde_json::json;

    #[test]
    fn globs_match_runs_of_characters() {
        let g = |s: &str| Glob(s.to_owned());
        assert!(g("get_*").matches("get_issue"));
        assert!(g("get_*").matches("get_"));
        assert!(!g("get_*").matches("list_issues"));
        assert!(g("*_issue*").matches("get_issue_comments"));
        assert!(g("a*b*c").matches("abc") && g("a*b*c").matches("axxbyyc"));
        assert!(!g("a*b*c").matches("acb"));
        assert!(!g("a*aa").matches("aa"));
        assert!(g("*").matches("anything") && g("exact").matches("exact") && !g("exact").matches("exactly"));
    }

    fn problems(yaml: &str) -> Vec<String> {
        match compile(&parse("t.yaml", yaml).unwrap()) {
            Ok(_) => Vec::new(),
            Err(e) => e.problems.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn upstreams_are_validated_with_their_paths() {
        let p = problems(
            r#"
tools: [{name: local, handler: {template: x}}]
upstreams:
  - {name: Bad_Name, stdio: {command: [srv]}}
  - {name: both, stdio: {command: [srv]}, http: {url: "http://x/mcp"}}
  - {name: neither}
  - {name: url, http: {url: "http://{{host}}/mcp"}}
  - {name: arg, http: {url: "http://x/mcp", headers: {Authorization: "Bearer {{token}}"}}}
  - {name: procs, stdio: {command: [srv], processes: 0}, timeout: 10m}
  - {name: clash, stdio: {command: [srv]}, tools: {prefix: "c_", rename: {a: local}, include: [local2]}}
  - {name: clash, stdio: {command: []}, tools: {prefix: "d_"}}
  - {name: hdr, http: {url: "http://x/mcp", headers: {Transfer-Encoding: chunked, Host: y, "Bad Name": z, Mcp-Session-Id: s}}}
"#,
        );
        for wanted in [
            "upstreams[0].name: `Bad_Name` is not an upstream name",
            "upstreams[1]: set exactly one of `http` and `stdio`",
            "upstreams[2]: set exactly one of `http` and `stdio`",
            "upstreams[3].http.url: must be a literal URL",
            "upstreams[4].http.headers.Authorization: template uses `token`",
            "upstreams[5].stdio.processes: must be between 1 and 16",
            "upstreams[5].timeout: must be more than 0 and at most 5m",
            "upstreams[6].tools.rename.a: `local` is a tool of this ToolSet",
            "upstreams[7].name: duplicate upstream name `clash`",
            "upstreams[7].stdio.command: must name a program",
            "upstreams[8].http.headers.Transfer-Encoding: `Transfer-Encoding` is set by quiver-server",
            "upstreams[8].http.headers.Host: `Host` is set by quiver-server",
            "upstreams[8].http.headers.Mcp-Session-Id: `Mcp-Session-Id` is set by quiver-server",
            "upstreams[8].http.headers.Bad Name: not a valid header name",
        ] {
            assert!(p.iter().any(|x| x.starts_with(wanted)), "{wanted} not in {p:#?}");
        }
    }

    #[test]
    fn upstreams_that_could_serve_the_same_name_are_refused() {
        let p = problems(
            "upstreams:\n  - {name: a, stdio: {command: [a]}}\n  - {name: b, stdio: {command: [b]}}\n",
        );
        assert!(
            p.iter().any(|x| x.starts_with(
                "upstreams[1].tools: upstreams[0] (`a`) and this one: both import under the same prefix"
            )),
            "{p:?}"
        );
        // Listed tools that do not meet may share a prefix; listed tools that meet may not.
        let ok = "upstreams:\n  - {name: a, stdio: {command: [a]}, tools: {include: [x]}}\n  - {name: b, stdio: {command: [b]}, tools: {include: [y]}}\n";
        assert_eq!(problems(ok), Vec::<String>::new());
        let p = problems(&ok.replace("[y]", "[x]"));
        assert!(p.iter().any(|x| x.contains("both could serve `x`")), "{p:?}");
        let p = problems(
            "tools: [{name: gh_x, handler: {template: x}}]\nupstreams:\n  - {name: a, stdio: {command: [a]}, tools: {prefix: gh_, include: [x]}}\n",
        );
        assert!(p.iter().any(|x| x.contains("would be served as `gh_x`")), "{p:?}");
        assert_eq!(
            problems(
                "upstreams:\n  - {name: a, stdio: {command: [a]}, tools: {prefix: a_}}\n  - {name: b, stdio: {command: [b]}, tools: {prefix: b_}}\n"
            ),
            Vec::<String>::new()
        );
    }

    /// `upstreams:` of two upstreams, `gh` second, for the name-clash cases.
    fn beside_gh(first: &str, gh_tools: &str) -> Vec<String> {
        problems(&format!(
            "upstreams:\n  - {{name: other, stdio: {{command: [o]}}, tools: {first}}}\n  - {{name: gh, stdio: {{command: [gh]}}, tools: {gh_tools}}}\n"
        ))
    }

    fn refused_as(p: &[String], wanted: &str) {
        assert!(
            p.iter()
                .any(|x| x.starts_with("upstreams[1].tools: upstreams[0] (`other`)") && x.contains(wanted)),
            "`{wanted}` not in {p:#?}"
        );
    }

    #[test]
    fn no_upstream_can_serve_a_name_of_another_upstreams_prefix() {
        // The impostor without a prefix that lists gh's name.
        refused_as(
            &beside_gh("{include: [gh_create_issue]}", "{prefix: gh_}"),
            "both could serve `gh_create_issue`",
        );
        // No prefix and no list: any name it is sent, gh's included.
        refused_as(
            &beside_gh("{}", "{prefix: gh_}"),
            "upstream `other` has no prefix, so it can serve any name",
        );
        refused_as(
            &beside_gh("{include: [\"gh_*\"]}", "{prefix: gh_}"),
            "can meet at `gh_…`",
        );
        refused_as(
            &beside_gh("{include: [\"*\"]}", "{prefix: gh_, include: [\"create_*\"]}"),
            "can meet at `gh_create_…`",
        );
        // One prefix the start of the other: `gh_x_y` is gh's `x_y` and other's `y`.
        refused_as(
            &beside_gh("{prefix: gh_x_}", "{prefix: gh_}"),
            "can meet at `gh_x_…`",
        );
        refused_as(&beside_gh("{prefix: g}", "{prefix: gh_}"), "can meet at `gh_…`");
        // Renamed into gh's names, or onto a name gh renames to.
        refused_as(
            &beside_gh("{prefix: o_, rename: {make: gh_create_issue}}", "{prefix: gh_}"),
            "both could serve `gh_create_issue` (upstream `other` renames `make` to it)",
        );
        refused_as(
            &beside_gh(
                "{prefix: o_, rename: {make: create}}",
                "{prefix: gh_, rename: {create_issue: create}}",
            ),
            "both could serve `create`",
        );
        // gh's listed name inside other's open names.
        refused_as(
            &beside_gh("{prefix: gh}", "{prefix: gh_, include: [list]}"),
            "both could serve `gh_list`",
        );
    }

    #[test]
    fn names_that_never_meet_are_accepted() {
        for (first, gh) in [
            // Disjoint prefixes, whatever is listed; case counts (names are looked up exactly).
            ("{prefix: o_}", "{prefix: gh_}"),
            ("{prefix: GH_}", "{prefix: gh_}"),
            ("{prefix: gh-}", "{prefix: gh_}"),
            // No prefix, but gh's names excluded.
            ("{exclude: [\"gh_*\"]}", "{prefix: gh_}"),
            ("{exclude: [\"g*\"]}", "{prefix: gh_}"),
            // No prefix, listed names outside gh's.
            ("{include: [search, \"get_*\"]}", "{prefix: gh_}"),
            // A listed name of gh excluded from the other (exact, not a pattern).
            (
                "{include: [\"*\"], exclude: [gh_list]}",
                "{prefix: gh_, include: [list]}",
            ),
            // A rename onto a name gh never serves (its `create` is renamed away).
            (
                "{prefix: o_, rename: {make: gh_create}}",
                "{prefix: gh_, rename: {create: issue}, include: [create]}",
            ),
        ] {
            assert_eq!(beside_gh(first, gh), Vec::<String>::new(), "{first} / {gh}");
        }
    }

    #[test]
    fn no_upstream_can_serve_a_name_of_the_toolsets_own_tools() {
        let with_local = |tools: &str| {
            problems(&format!(
                "tools: [{{name: deploy, handler: {{template: x}}}}, {{name: gh_x, handler: {{template: x}}}}]\nupstreams:\n  - {{name: a, stdio: {{command: [a]}}, tools: {tools}}}\n"
            ))
        };
        let p = with_local("{}");
        assert!(
            p.iter().any(|x| x
                .starts_with("upstreams[0].tools: could serve `deploy`, `gh_x`, tool names of this ToolSet")),
            "{p:#?}"
        );
        let p = with_local("{prefix: gh_}");
        assert!(p.iter().any(|x| x.contains("could serve `gh_x`")), "{p:#?}");
        let p = with_local("{prefix: o_, rename: {x: deploy}}");
        assert!(
            p.iter()
                .any(|x| x.contains("rename.x: `deploy` is a tool of this ToolSet")),
            "{p:#?}"
        );
        for fine in [
            "{prefix: o_}",
            "{exclude: [deploy, \"gh_*\"]}",
            "{include: [search]}",
            "{prefix: gh_, exclude: [x]}",
        ] {
            assert_eq!(with_local(fine), Vec::<String>::new(), "{fine}");
        }
        // A rename onto a name its own prefix gives another of its tools.
        let p =
            problems("upstreams: [{name: a, stdio: {command: [a]}, tools: {prefix: a_, rename: {x: a_y}}}]");
        assert!(
            p.iter()
                .any(|x| x.contains("rename.x: `a_y` is also the name its own `y` is served as")),
            "{p:#?}"
        );
    }

    #[test]
    fn a_listed_name_of_another_upstream_is_served_by_neither() {
        // Whatever a config lets through, an upstream never serves a name another upstream
        // can serve, listed yet or not (here: the two are compiled apart, as no valid config
        // holds both).
        let mut gh = upstream("upstreams: [{name: gh, stdio: {command: [gh]}, tools: {prefix: gh_}}]");
        let mut other = upstream("upstreams: [{name: other, stdio: {command: [o]}}]");
        let rivals: Arc<[Namespace]> = vec![gh.names.clone(), other.names.clone()].into();
        (gh.rivals, gh.at) = (Arc::clone(&rivals), 0);
        (other.rivals, other.at) = (rivals, 1);
        let listed = vec![json!({"name": "gh_create_issue"}), json!({"name": "search"})];
        let mut taken = FxHashSet::default();
        let (tools, report) = other.import(1, &listed, &mut taken);
        assert_eq!(
            tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            ["search"]
        );
        assert!(
            report
                .skipped
                .iter()
                .any(|s| s.contains("`gh_create_issue` is a name upstream `gh` can serve")),
            "{report:?}"
        );
        // ... and gh does not get it first either: `other` can serve any name.
        let (tools, report) = gh.import(0, &[json!({"name": "create_issue"})], &mut taken);
        assert!(tools.is_empty(), "{report:?}");
        assert!(
            report.skipped[0].contains("upstream `other` can serve"),
            "{report:?}"
        );
    }

    #[test]
    fn secrets_of_upstreams_are_granted_and_only_secrets_are_templates() {
        let ts = parse(
            "t",
            "upstreams:\n  - {name: gh, http: {url: \"https://api.example/mcp\", headers: {Authorization: \"Bearer {{secret.github.token}}\"}, tls: {caSecret: corp-ca}}, tools: {prefix: gh_}}\n  - {name: db, stdio: {command: [db-mcp], env: {DSN: \"{{secret.db.dsn}}\"}}, tools: {prefix: db_}}\n",
        )
        .unwrap();
        let c = compile(&ts).unwrap();
        assert_eq!(
            c.secrets.iter().map(String::as_str).collect::<Vec<_>>(),
            ["corp-ca", "db", "github"]
        );
    }

    #[test]
    fn only_the_tools_list_leaves_the_connection_key_unchanged() {
        let key = |yaml: &str| compile(&parse("t", yaml).unwrap()).unwrap().upstreams[0].key;
        let base = key("upstreams: [{name: a, stdio: {command: [a]}}]");
        assert_eq!(
            base,
            key("upstreams: [{name: a, stdio: {command: [a]}, tools: {include: [x], prefix: p_}}]")
        );
        assert_ne!(base, key("upstreams: [{name: a, stdio: {command: [a, --v]}}]"));
        assert_ne!(
            base,
            key("upstreams: [{name: a, stdio: {command: [a]}, timeout: 5s}]")
        );
    }

    fn upstream(yaml: &str) -> CompiledUpstream {
        compile(&parse("t", yaml).unwrap())
            .unwrap()
            .upstreams
            .into_iter()
            .next()
            .unwrap()
    }

    #[test]
    fn an_imported_tool_runs_as_a_task_as_set_else_as_the_upstream_lists_it() {
        use crate::config::TaskSupport;
        let u = upstream(
            "upstreams: [{name: up, stdio: {command: [up]}, tools: {tasks: {set: forbidden, insists: optional, gone: required}}}]",
        );
        let listed = vec![
            json!({"name": "plain", "inputSchema": {"type": "object"}}),
            json!({"name": "long", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "required"}}),
            json!({"name": "quick", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "forbidden"}}),
            json!({"name": "odd", "inputSchema": {"type": "object"}, "execution": {"taskSupport": 7}}),
            json!({"name": "set", "inputSchema": {"type": "object"}}),
            json!({"name": "insists", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "required"}}),
        ];
        let (tools, report) = u.import(0, &listed, &mut FxHashSet::default());
        let got: Vec<(&str, TaskSupport)> = tools.iter().map(|t| (t.name.as_str(), t.task)).collect();
        assert_eq!(
            got,
            [
                ("plain", TaskSupport::Optional),
                ("long", TaskSupport::Required),
                ("quick", TaskSupport::Forbidden),
                ("odd", TaskSupport::Optional),
                ("set", TaskSupport::Forbidden),
                ("insists", TaskSupport::Optional),
            ]
        );
        // The upstream's own `execution` is not listed as it wrote it.
        assert!(tools[1].descriptor.get("execution").is_none());
        assert!(report.skipped.join("\n").contains("`gone` (named in `tools`)"));
        assert!(
            parse(
                "t",
                "upstreams: [{name: up, stdio: {command: [up]}, tools: {tasks: {x: sometimes}}}]"
            )
            .is_err()
                || compile(
                    &parse(
                        "t",
                        "upstreams: [{name: up, stdio: {command: [up]}, tools: {tasks: {x: sometimes}}}]"
                    )
                    .unwrap()
                )
                .is_err()
        );
    }

    /// An upstream's text is data: a tool's name, title, description, annotations and
    /// schemas carrying template syntax are listed as written, never compiled, and the call
    /// reads no Secret (it forwards the arguments as they are).
    #[test]
    fn an_upstreams_text_is_data_whatever_template_syntax_it_holds() {
        let u = upstream("upstreams: [{name: up, stdio: {command: [up]}}]");
        let hostile = "{{secret.db.password}} {{caller.sub}} https://attacker.example";
        let listed = vec![
            json!({"name": "{{secret.db.password}}", "inputSchema": {"type": "object"}}),
            json!({"name": "ok", "title": hostile, "description": hostile,
                   "annotations": {"title": hostile},
                   "inputSchema": {"type": "object", "description": hostile,
                                   "properties": {"q": {"type": "string", "default": hostile, "examples": [hostile]}}},
                   "outputSchema": {"type": "object", "description": hostile}}),
        ];
        let (tools, report) = u.import(0, &listed, &mut FxHashSet::default());
        assert_eq!(tools.len(), 1, "{report:?}");
        assert!(report.skipped[0].contains("not a valid tool name"), "{report:?}");
        let t = &tools[0];
        assert_eq!(t.descriptor["description"], hostile);
        assert_eq!(t.descriptor["title"], hostile);
        assert_eq!(t.descriptor["inputSchema"]["properties"]["q"]["default"], hostile);
        assert_eq!(t.descriptor["outputSchema"]["description"], hostile);
        let CompiledHandler::Upstream(call) = &t.handler else {
            panic!("an imported tool forwards its call")
        };
        assert_eq!(call.remote, "ok");
        assert!(t.handler.secrets().is_empty());
    }

    #[test]
    fn import_filters_renames_describes_and_reports() {
        let u = upstream(
            "upstreams: [{name: gh, stdio: {command: [gh]}, tools: {prefix: gh_, include: [\"get_*\", search], exclude: [get_secret], rename: {search: find, gone: x}, descriptions: {get_issue: Read one issue.}, annotations: {get_issue: {readOnlyHint: true, openWorldHint: true}}}}]",
        );
        let listed = vec![
            json!({"name": "get_issue", "description": "upstream's", "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}),
            json!({"name": "get_secret", "inputSchema": {"type": "object"}}),
            json!({"name": "search", "title": "Search", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}}),
            json!({"name": "delete_repo", "inputSchema": {"type": "object"}}),
            json!({"name": "get_taken", "inputSchema": {"type": "object"}}),
            json!({"name": "get_bad", "inputSchema": {"type": "object", "properties": {"n": {"type": 7}}}}),
            json!({"name": "bad name!", "inputSchema": {"type": "object"}}),
        ];
        let mut taken: FxHashSet<String> = ["gh_get_taken".to_owned()].into_iter().collect();
        let (tools, report) = u.import(3, &listed, &mut taken);
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["gh_get_issue", "find"]);
        assert_eq!(tools[0].descriptor["description"], "Read one issue.");
        assert_eq!(
            tools[0].descriptor["annotations"],
            json!({"readOnlyHint": true, "openWorldHint": true})
        );
        assert_eq!(tools[1].descriptor["annotations"]["readOnlyHint"], true);
        assert!(tools[0].input.is_valid(&json!({"n": 1})) && !tools[0].input.is_valid(&json!({})));
        let CompiledHandler::Upstream(call) = &tools[1].handler else {
            panic!("not an upstream handler")
        };
        assert_eq!((call.upstream, call.remote.as_str()), (3, "search"));
        assert_eq!(report.imported, 2);
        let skipped = report.skipped.join("\n");
        for wanted in [
            "`get_taken`: `gh_get_taken` is already served",
            "`get_bad`: inputSchema",
            "not a valid tool name",
            "`gone` (named in `tools`)",
        ] {
            assert!(skipped.contains(wanted), "{wanted} not in {skipped}");
        }
        assert!(taken.contains("find") && taken.contains("gh_get_issue"));
    }

    #[test]
    fn an_upstream_schema_is_listed_as_sent_and_checked_where_it_can_be() {
        let u = upstream("upstreams: [{name: gh, stdio: {command: [gh]}}]");
        let schema = json!({
            "type": "object", "required": ["n"], "discriminator": {"propertyName": "n"},
            "properties": {
                "n": {"type": "integer", "x-unit": "s"},
                "m": {"type": "object", "patternProperties": {"^a": {"type": "string"}}}
            }
        });
        let listed =
            [json!({"name": "t", "inputSchema": schema, "outputSchema": {"type": "object", "example": {}}})];
        let (tools, report) = u.import(0, &listed, &mut FxHashSet::default());
        assert_eq!(report.imported, 1, "{:?}", report.skipped);
        assert_eq!(tools[0].descriptor["inputSchema"], schema);
        assert!(tools[0].input.is_valid(&json!({"n": 1})));
        assert!(!tools[0].input.is_valid(&json!({"n": "one"})) && !tools[0].input.is_valid(&json!({})));
    }

    #[test]
    fn access_applies_to_every_imported_tool_and_leaves_the_connection_alone() {
        let yaml = "upstreams: [{name: gh, stdio: {command: [gh]}, tools: {access: {scopes: [repo]}}}]";
        let u = upstream(yaml);
        let listed = vec![json!({"name": "a"}), json!({"name": "b"})];
        let (tools, _) = u.import(0, &listed, &mut FxHashSet::default());
        let caller = crate::spec::access::Principal::new(["repo"], []);
        for t in &tools {
            let need = t.access.as_deref().expect("access on every imported tool");
            assert!(need.check(None).is_err() && need.check(Some(&caller)).is_ok());
        }
        let open = "upstreams: [{name: gh, stdio: {command: [gh]}}]";
        assert_eq!(u.key, upstream(open).key, "an access change does not reconnect");
        let bad = compile(
            &parse(
                "t",
                "upstreams: [{name: gh, stdio: {command: [gh]}, tools: {access: {}}}]",
            )
            .unwrap(),
        );
        assert!(bad.unwrap_err().to_string().contains("upstreams[0].tools.access"));
    }

    #[test]
    fn costly_descriptors_and_patterns_are_not_imported() {
        let u = upstream("upstreams: [{name: a, stdio: {command: [a]}}]");
        let big = json!({"name": "big", "description": "x".repeat(MAX_DESCRIPTOR_BYTES)});
        // `\\w{200}` compiles to ~11 MB without a size limit: over the bound, it is listed
        // but not compiled (the upstream checks it), and still counts against the patterns.
        let costly = json!({"name": "costly", "inputSchema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "\\w{200}"}}}});
        let cheap = |i: usize| json!({"name": format!("p{i}"), "inputSchema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+$"}}}});
        let mut listed = vec![big, costly];
        listed.extend((0..=MAX_UPSTREAM_PATTERNS).map(cheap));
        let (tools, report) = u.import(0, &listed, &mut FxHashSet::default());
        assert_eq!(tools.len(), MAX_UPSTREAM_PATTERNS, "one pattern per tool");
        let skipped = report.skipped.join("\n");
        assert!(skipped.contains("`big`: its descriptor is about"), "{skipped}");
        let costly = tools
            .iter()
            .find(|t| t.name == "costly")
            .expect("costly imported");
        assert_eq!(
            costly.descriptor["inputSchema"]["properties"]["a"]["pattern"],
            "\\w{200}"
        );
        assert!(costly.input.is_valid(&json!({"a": "short"})), "not enforced");
        assert!(
            skipped.contains(&format!("over {MAX_UPSTREAM_PATTERNS} `pattern`s")),
            "{skipped}"
        );
    }

    #[test]
    fn thousands_of_upstreams_are_refused_without_looking_further() {
        let many: String = (0..5000)
            .map(|i| format!("  - {{name: u{i}, stdio: {{command: [x]}}}}\n"))
            .collect();
        let p = problems(&format!("upstreams:\n{many}"));
        assert_eq!(
            p,
            vec![format!("upstreams: 5000 upstreams; at most {MAX_UPSTREAMS}")]
        );
        assert!(problems("upstreams: [{name: ab-, stdio: {command: [x]}}]")[0].contains("not ending with -"));
        assert!(
            problems("upstreams: [{name: a, stdio: {command: [x]}, maxMessageBytes: 1000000000000}]")[0]
                .contains("maxMessageBytes")
        );
    }

    #[test]
    fn hostile_tool_lists_are_bounded() {
        let u = upstream("upstreams: [{name: a, stdio: {command: [a]}}]");
        let mut deep = json!({"type": "object"});
        for _ in 0..100 {
            deep = json!({"type": "object", "properties": {"x": deep}});
        }
        let listed = vec![
            json!({"name": "deep", "inputSchema": deep}),
            json!({"name": 7}),
            json!("not an object"),
            json!({"name": "dup", "inputSchema": {"type": "object"}}),
            json!({"name": "dup", "inputSchema": {"type": "object"}}),
            json!({"name": "x".repeat(129)}),
        ];
        let (tools, report) = u.import(0, &listed, &mut FxHashSet::default());
        assert_eq!(tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["dup"]);
        assert_eq!(report.skipped.len(), 4, "{:?}", report.skipped);
        let many: Vec<Value> = (0..MAX_UPSTREAM_TOOLS + 5)
            .map(|i| json!({"name": format!("t{i}")}))
            .collect();
        let (tools, report) = u.import(0, &many, &mut FxHashSet::default());
        assert_eq!(tools.len(), MAX_UPSTREAM_TOOLS);
        assert_eq!(report.skipped.len(), 5);
    }
}
