//! The tool registry: an immutable snapshot of compiled tools with pre-serialized list pages
//! and initialize results, published through an atomic pointer swap. A request loads the
//! snapshot once; a reload builds the next one off the hot path; in-flight calls finish on
//! the snapshot they started with.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::{ArcSwap, Guard};
use rustc_hash::FxHashMap;
use serde_json::{Value, json};

use crate::config::{CompiledTool, CompiledToolSet, ResourceKind, ServerInfo};
use crate::metrics::{Metrics, ToolMetrics};
use crate::protocol::SUPPORTED_VERSIONS;

/// What the server offers, the same in `initialize` and `server/discover`.
fn capabilities() -> Value {
    json!({
        "tools": {"listChanged": true},
        "resources": {"listChanged": true, "subscribe": true},
        "prompts": {"listChanged": true},
        "logging": {},
        "completions": {},
        "extensions": {"io.modelcontextprotocol/tasks": {}},
    })
}

/// The revision whose core protocol has tasks: its `initialize` declares them and its
/// `tools/list` tells each tool's `execution.taskSupport`.
pub const CORE_TASKS_VERSION: &str = "2025-11-25";

/// A served tool: its compiled form and its metric handles.
#[derive(Debug)]
pub struct Tool {
    /// Compiled definition.
    pub def: CompiledTool,
    /// Dispatch histograms of this tool.
    pub metrics: ToolMetrics,
    /// The policies its calls must meet (`None`: none).
    pub policies: Option<Box<crate::config::policy::ToolPolicies>>,
    /// The guardrail webhooks asked about its calls (`None`: none, the usual case).
    pub hooks: Option<Box<crate::config::webhooks::ToolHooks>>,
}

/// One generation of the registry.
#[derive(Debug)]
pub struct Snapshot {
    /// 1 for the first config loaded, +1 per successful reload.
    pub generation: u64,
    /// Content hash of the config.
    pub hash: String,
    /// What list cursors of this snapshot start with: from the config hash and the
    /// upstreams' tool lists, so a cursor never pages across a change of either.
    cursor_tag: String,
    /// Tools in declaration order (pipelines refer to them by index).
    pub tools: Vec<Tool>,
    by_name: FxHashMap<Box<str>, usize>,
    tool_pages: Vec<Box<[u8]>>,
    /// Per page of `tool_pages`, where 2025-11-25's `tools/list` adds a tool's
    /// `execution.taskSupport`: the offset of the tool's closing brace, and the value (only
    /// tools that may run as tasks; a few bytes each instead of a second copy of the pages).
    task_marks: Vec<Box<[(u32, &'static str)]>>,
    /// Each tool's serialized `tools/list` entry, when some tool has `access` or policies
    /// (its list is then rendered per caller) or tool search is on (`find_tools` answers
    /// with them).
    pub tool_entries: Option<Box<[Box<[u8]>]>>,
    /// Whether `tools/list` is rendered per caller (some tool has `access` or policies).
    pub per_caller: bool,
    /// The search index and the listed tools, when tool search is on.
    pub search: Option<Box<crate::search::Catalog>>,
    resource_pages: Vec<Box<[u8]>>,
    template_pages: Vec<Box<[u8]>>,
    prompt_pages: Vec<Box<[u8]>>,
    initialize: Vec<(&'static str, Box<[u8]>)>,
    /// The `server/discover` result (2026-07-28), without cache hints.
    pub discover: Box<[u8]>,
    /// `"resultType":"complete","_meta":{serverInfo}`: what every 2026-07-28 result carries.
    pub result_stamp: Box<[u8]>,
    /// `{name, version, title?}` of the server.
    pub server_info: Value,
    static_resources: FxHashMap<Box<str>, usize>,
    prompts_by_name: FxHashMap<Box<str>, usize>,
    /// The compiled config (resources and prompts are read from it).
    pub config: CompiledToolSet,
    /// When this snapshot was built.
    pub loaded_at: SystemTime,
    /// Links of `config.upstreams`, in the same order (what imported tools call).
    pub upstreams: Vec<Arc<crate::upstream::Link>>,
    /// Every scope a tool's `access` requires, sorted (`scopes_supported` of the
    /// protected-resource metadata).
    pub scopes: Box<[Box<str>]>,
}

/// Every scope a tool's `access` requires, sorted.
fn access_scopes(tools: &[Tool]) -> Box<[Box<str>]> {
    // Imported tools share their upstream's `access`: each distinct one is read once.
    let mut seen = rustc_hash::FxHashSet::default();
    let scopes: std::collections::BTreeSet<&str> = tools
        .iter()
        .filter_map(|t| t.def.access.as_ref())
        .filter(|a| seen.insert(Arc::as_ptr(a)))
        .flat_map(|a| a.scopes())
        .collect();
    scopes.into_iter().map(Box::from).collect()
}

/// Whether who sees a tool depends on the caller (some tool has `access` or policies).
fn guarded(tools: &[Tool]) -> bool {
    tools
        .iter()
        .any(|t| t.def.access.is_some() || t.policies.is_some())
}

/// Each tool's serialized `tools/list` entry, to list or return one by one.
fn entries(tools: &[Tool]) -> Box<[Box<[u8]>]> {
    tools
        .iter()
        .map(|t| {
            serde_json::to_vec(&t.def.descriptor)
                .unwrap_or_default()
                .into_boxed_slice()
        })
        .collect()
}

/// The tool lists of a snapshot: its `tools/list` pages (the listed tools only), each
/// tool's entry when a list is rendered per caller or searched, and the search index.
struct ToolLists {
    search: Option<Box<crate::search::Catalog>>,
    tool_pages: Vec<Box<[u8]>>,
    task_marks: Vec<Box<[(u32, &'static str)]>>,
    per_caller: bool,
    tool_entries: Option<Box<[Box<[u8]>]>>,
}

fn tool_lists(tools: &[Tool], cfg: &CompiledToolSet, tag: &str) -> ToolLists {
    let search = cfg.search.as_ref().map(|s| {
        Box::new(crate::search::Catalog::build(
            tools.iter().map(|t| &t.def.descriptor),
            s,
        ))
    });
    let listed = || {
        tools
            .iter()
            .enumerate()
            .filter(|(i, _)| search.as_ref().is_none_or(|c| c.listed(*i)))
            .map(|(_, t)| t)
    };
    let (tool_pages, ends) =
        pages_with_ends("tools", listed().map(|t| &t.def.descriptor), cfg.page_size, tag);
    let mut supports = listed().map(|t| task_support(t.def.task));
    let task_marks = ends
        .iter()
        .map(|page| {
            page.iter()
                .zip(supports.by_ref())
                .filter_map(|(&end, support)| Some((end, support?)))
                .collect()
        })
        .collect();
    let per_caller = guarded(tools);
    let tool_entries = (per_caller || search.is_some()).then(|| entries(tools));
    ToolLists {
        search,
        tool_pages,
        task_marks,
        per_caller,
        tool_entries,
    }
}

/// What a snapshot answers about the server itself, serialized once.
struct Handshake {
    /// `{name, version, title?}`.
    info: Value,
    /// The `initialize` result per supported version.
    initialize: Vec<(&'static str, Box<[u8]>)>,
    /// The `server/discover` result.
    discover: Box<[u8]>,
    /// What every 2026-07-28 result carries.
    result_stamp: Box<[u8]>,
}

/// The server's `{name, version, title?}` and its handshake answers, serialized.
fn handshake(server: &ServerInfo) -> Handshake {
    let mut info = json!({"name": server.name, "version": server.version});
    if let Some(t) = &server.title {
        info["title"] = Value::String(t.clone());
    }
    let initialize = SUPPORTED_VERSIONS
        .iter()
        .map(|v| {
            let mut caps = capabilities();
            if *v == CORE_TASKS_VERSION {
                // Tasks of the core protocol (2025-11-25 only): task-augmented tools/call,
                // tasks/list and tasks/cancel (each leaf an object).
                caps["tasks"] = json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}});
            }
            let mut r = json!({
                "protocolVersion": v,
                "capabilities": caps,
                "serverInfo": info,
            });
            if let Some(i) = &server.instructions {
                r["instructions"] = Value::String(i.clone());
            }
            (*v, serde_json::to_vec(&r).unwrap_or_default().into_boxed_slice())
        })
        .collect();
    let mut discover = json!({
        "resultType": "complete",
        "supportedVersions": crate::protocol::ALL_VERSIONS,
        "capabilities": capabilities(),
        "_meta": {"io.modelcontextprotocol/serverInfo": info},
    });
    if let Some(i) = &server.instructions {
        discover["instructions"] = Value::String(i.clone());
    }
    let discover = serde_json::to_vec(&discover)
        .unwrap_or_default()
        .into_boxed_slice();
    let result_stamp = crate::protocol::stateless_result_fields(&info).into_boxed_slice();
    Handshake {
        info,
        initialize,
        discover,
        result_stamp,
    }
}

/// Which list a page belongs to.
#[derive(Debug, Clone, Copy)]
pub enum ListKind {
    /// `tools/list`.
    Tools,
    /// `resources/list`.
    Resources,
    /// `resources/templates/list`.
    ResourceTemplates,
    /// `prompts/list`.
    Prompts,
}

/// The compiled tools, taken out of `cfg`, with their metric handles and policies.
/// Whether tool `tool` of `tools`, run at pipeline depth `depth`, may run long: a process,
/// an HTTP request, an upstream call, `builtin: sleep`, or a pipeline with such a step.
pub fn may_run_long(tools: &[Tool], tool: usize, depth: usize) -> bool {
    use crate::config::compiled::CompiledHandler as H;
    let Some(t) = tools.get(tool) else {
        return false;
    };
    // Its webhooks are requests over the network.
    if t.hooks.is_some() {
        return true;
    }
    match &t.def.handler {
        // Sign-out: one vault operation (Redis), bounded by its timeout.
        H::Exec(_) | H::Http(_) | H::Upstream(_) | H::SignOut => true,
        H::Builtin(b) => *b == crate::handlers::builtin::Builtin::Sleep,
        // Deeper than a pipeline may nest, the step fails at once.
        // A retried step waits between its attempts.
        H::Pipeline(steps) => {
            depth < crate::config::MAX_PIPELINE_NESTING
                && steps
                    .iter()
                    .any(|s| s.retry.is_some() || s.tool().is_some_and(|t| may_run_long(tools, t, depth + 1)))
        }
        H::Template(_)
        | H::Content(_)
        | H::Error(_)
        | H::Sample(_)
        | H::Elicit(_)
        | H::Ask(_)
        | H::FindTools => false,
    }
}

/// A pipeline that does not declare `task` runs as a task (`optional`) when one of its steps
/// may run long, like the kinds it calls; one that only answers at once or asks the client
/// stays `forbidden`. Decided here, where the steps' tools (imported ones too) are known.
fn pipelines_that_run_long_are_tasks(tools: &mut [Tool], undeclared: &rustc_hash::FxHashSet<String>) {
    use crate::config::compiled::CompiledHandler as H;
    let long: Vec<usize> = (0..tools.len())
        .filter(|&i| {
            matches!(tools[i].def.handler, H::Pipeline(_)) && undeclared.contains(&tools[i].def.name)
        })
        .filter(|&i| may_run_long(tools, i, 0))
        .collect();
    for i in long {
        tools[i].def.task = crate::config::TaskSupport::Optional;
    }
}

/// The webhooks that pick `def` (by its name, or the upstream it is imported from).
fn hooks_of(
    def: &crate::config::CompiledTool,
    cfg: &CompiledToolSet,
) -> Option<Box<crate::config::webhooks::ToolHooks>> {
    if cfg.webhooks.hooks.is_empty() {
        return None;
    }
    let upstream = match &def.handler {
        crate::config::CompiledHandler::Upstream(u) => {
            cfg.upstreams.get(u.upstream).map_or("", |u| u.name.as_str())
        }
        _ => "",
    };
    // `find_tools` and `sign_out_upstream` answer from the server itself.
    if matches!(
        def.handler,
        crate::config::CompiledHandler::FindTools | crate::config::CompiledHandler::SignOut
    ) {
        return None;
    }
    cfg.webhooks.for_tool(&def.name, upstream)
}

fn tools_of(cfg: &mut CompiledToolSet, metrics: &Metrics) -> Vec<Tool> {
    let defs = std::mem::take(&mut cfg.tools);
    let policies = crate::policies::attach(&defs, cfg);
    defs.into_iter()
        .zip(policies)
        .map(|(def, policies)| Tool {
            metrics: metrics.tool(),
            hooks: hooks_of(&def, cfg),
            def,
            policies,
        })
        .collect()
}

impl Snapshot {
    /// Builds a snapshot: resolves metric handles and serializes every answer that only
    /// changes on reload.
    pub fn build(config: CompiledToolSet, generation: u64, metrics: &Metrics) -> Self {
        let mut cfg = config;
        // The tools' source specs are compiled and never read again: at ~1-2 KiB of parsed
        // values per tool they would dominate a large registry's memory.
        let undeclared: rustc_hash::FxHashSet<String> = cfg
            .spec
            .tools
            .iter()
            .filter(|t| t.task.is_none())
            .map(|t| t.name.clone())
            .collect();
        drop(std::mem::take(&mut cfg.spec.tools));
        let mut tools = tools_of(&mut cfg, metrics);
        pipelines_that_run_long_are_tasks(&mut tools, &undeclared);
        let by_name = tools
            .iter()
            .enumerate()
            .map(|(i, t)| (t.def.name.as_str().into(), i))
            .collect();
        let tag = cursor_tag(&cfg.hash, cfg.upstream_digest);
        let tag = tag.as_str();
        let page_size = cfg.page_size;
        let ToolLists {
            search,
            tool_pages,
            task_marks,
            per_caller,
            tool_entries,
        } = tool_lists(&tools, &cfg, tag);
        // Served from the pages from now on; as a `Value` tree a descriptor costs several
        // times its serialized size (a map node per object).
        for t in &mut tools {
            t.def.descriptor = Value::Null;
        }
        let of_kind = |templated: bool| {
            cfg.resources
                .iter()
                .filter(move |r| r.is_template() == templated)
                .map(|r| &r.descriptor)
        };
        let resource_pages = pages("resources", of_kind(false), page_size, tag);
        let template_pages = pages("resourceTemplates", of_kind(true), page_size, tag);
        let prompt_pages = pages(
            "prompts",
            cfg.prompts.iter().map(|p| &p.descriptor),
            page_size,
            tag,
        );
        let static_resources = cfg
            .resources
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match &r.kind {
                ResourceKind::Static { uri, .. }
                | ResourceKind::Upstream {
                    uri, pattern: None, ..
                } => Some((uri.as_str().into(), i)),
                ResourceKind::Templated { .. } | ResourceKind::Upstream { .. } => None,
            })
            .collect();
        let scopes = access_scopes(&tools);
        let prompts_by_name = cfg
            .prompts
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.as_str().into(), i))
            .collect();
        let Handshake {
            info,
            initialize,
            discover,
            result_stamp,
        } = handshake(&cfg.spec.server);
        Self {
            generation,
            hash: cfg.hash.clone(),
            cursor_tag: tag.to_owned(),
            tools,
            by_name,
            tool_pages,
            task_marks,
            tool_entries,
            per_caller,
            search,
            resource_pages,
            template_pages,
            prompt_pages,
            initialize,
            discover,
            result_stamp,
            server_info: info,
            static_resources,
            prompts_by_name,
            scopes,
            config: cfg,
            loaded_at: SystemTime::now(),
            upstreams: Vec::new(),
        }
    }

    /// What this snapshot's list cursors start with.
    pub fn cursor_tag(&self) -> &str {
        &self.cursor_tag
    }

    /// Index of a tool by name.
    #[inline]
    pub fn tool_index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Whether `tools/list` shows the tool at `index` (with tool search on, only the core
    /// tools and `find_tools`).
    #[inline]
    pub fn listed(&self, index: usize) -> bool {
        self.search.as_ref().is_none_or(|c| c.listed(index))
    }

    /// Index of a static resource by URI.
    pub fn static_resource(&self, uri: &str) -> Option<usize> {
        self.static_resources.get(uri).copied()
    }

    /// Index of a prompt by name.
    pub fn prompt_index(&self, name: &str) -> Option<usize> {
        self.prompts_by_name.get(name).copied()
    }

    /// The serialized initialize result for a protocol version.
    pub fn initialize_result(&self, version: &str) -> &[u8] {
        self.initialize
            .iter()
            .find(|(v, _)| *v == version)
            .map_or(&[], |(_, b)| b)
    }

    /// The serialized page for `cursor` (`None` = first page), or `None` for a cursor this
    /// snapshot did not issue.
    pub fn page(&self, kind: ListKind, cursor: Option<&str>) -> Option<&[u8]> {
        let pages = match kind {
            ListKind::Tools => &self.tool_pages,
            ListKind::Resources => &self.resource_pages,
            ListKind::ResourceTemplates => &self.template_pages,
            ListKind::Prompts => &self.prompt_pages,
        };
        pages.get(self.page_index(cursor)?).map(|p| &**p)
    }

    fn page_index(&self, cursor: Option<&str>) -> Option<usize> {
        match cursor {
            None => Some(0),
            Some(c) => {
                let (tag, n) = c.split_once('-')?;
                if tag != self.cursor_tag {
                    return None;
                }
                n.parse().ok()
            }
        }
    }

    /// Writes the `tools/list` page for `cursor` as 2025-11-25 lists it: each tool that may
    /// run as a task with its `execution.taskSupport`. `None` for a cursor this snapshot did
    /// not issue.
    pub fn write_core_tools_page(&self, cursor: Option<&str>, out: &mut Vec<u8>) -> Option<()> {
        let index = self.page_index(cursor)?;
        let page = self.tool_pages.get(index)?;
        out.reserve(page.len() + 40 * self.task_marks.get(index).map_or(0, |m| m.len()));
        let mut from = 0;
        for &(end, support) in self.task_marks.get(index).map_or(&[][..], |m| m) {
            let end = (end as usize).min(page.len());
            out.extend_from_slice(&page[from..end]);
            out.extend_from_slice(b",\"execution\":{\"taskSupport\":\"");
            out.extend_from_slice(support.as_bytes());
            out.extend_from_slice(b"\"}");
            from = end;
        }
        out.extend_from_slice(&page[from..]);
        Some(())
    }
}

/// The tag that ties a list cursor to the registry contents that issued it: the config
/// hash's first 8 characters, or with upstream tools, 8 hex digits of both.
fn cursor_tag(hash: &str, upstream_digest: u64) -> String {
    if upstream_digest == 0 {
        return hash[..8.min(hash.len())].to_owned();
    }
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    (hash, upstream_digest).hash(&mut h);
    format!("{:08x}", h.finish() as u32)
}

/// The `execution.taskSupport` 2025-11-25 lists for a tool's `task` setting (`None`:
/// absent, which means `forbidden`).
pub fn task_support(task: crate::config::TaskSupport) -> Option<&'static str> {
    match task {
        crate::config::TaskSupport::Forbidden => None,
        crate::config::TaskSupport::Optional => Some("optional"),
        crate::config::TaskSupport::Required => Some("required"),
    }
}

fn pages<'a>(
    key: &str,
    items: impl Iterator<Item = &'a Value>,
    page_size: usize,
    tag: &str,
) -> Vec<Box<[u8]>> {
    pages_with_ends(key, items, page_size, tag).0
}

/// The pages of a list, and per page where each item ends (the offset of its last byte,
/// its closing brace).
fn pages_with_ends<'a>(
    key: &str,
    items: impl Iterator<Item = &'a Value>,
    page_size: usize,
    tag: &str,
) -> (Vec<Box<[u8]>>, Vec<Vec<u32>>) {
    let items: Vec<&Value> = items.collect();
    let chunks: Vec<&[&Value]> = if items.is_empty() {
        vec![&[]]
    } else {
        items.chunks(page_size).collect()
    };
    let n = chunks.len();
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            // Written straight out: building a `Value` first would deep-copy every descriptor.
            let mut page = Vec::with_capacity(128 * chunk.len() + 64);
            let mut ends = Vec::with_capacity(chunk.len());
            page.extend_from_slice(b"{\"");
            page.extend_from_slice(key.as_bytes());
            page.extend_from_slice(b"\":[");
            for (k, item) in chunk.iter().enumerate() {
                if k > 0 {
                    page.push(b',');
                }
                serde_json::to_writer(&mut page, item).unwrap_or_default();
                ends.push(u32::try_from(page.len() - 1).unwrap_or(u32::MAX));
            }
            page.push(b']');
            if i + 1 < n {
                page.extend_from_slice(b",\"nextCursor\":");
                serde_json::to_writer(&mut page, &format!("{tag}-{}", i + 1)).unwrap_or_default();
            }
            page.push(b'}');
            (page.into_boxed_slice(), ends)
        })
        .unzip()
}

/// What the last reload attempt did, for `/status`.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReloadStatus {
    /// `success`, `invalid` or `unchanged`.
    pub result: String,
    /// Seconds since the Unix epoch.
    pub at_unix: u64,
    /// The problems, when the config was rejected.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// The registry: the current snapshot and its history counters.
#[derive(Debug)]
pub struct Registry {
    current: ArcSwap<Snapshot>,
    generation: AtomicU64,
    ready: AtomicBool,
    last_reload: Mutex<ReloadStatus>,
}

impl Registry {
    /// A registry serving an empty tool set until the first config is swapped in.
    pub fn new(metrics: &Metrics) -> Arc<Self> {
        let empty = crate::config::compile(&crate::config::ToolSet::default())
            .unwrap_or_else(|e| panic!("empty ToolSet must compile: {e}"));
        Arc::new(Self {
            current: ArcSwap::from_pointee(Snapshot::build(empty, 0, metrics)),
            generation: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            last_reload: Mutex::new(ReloadStatus::default()),
        })
    }

    /// The current snapshot (no lock; a few atomic operations).
    #[inline]
    pub fn load(&self) -> Guard<Arc<Snapshot>> {
        self.current.load()
    }

    /// The current snapshot as an owned pointer, for calls that outlive a guard.
    pub fn load_full(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Builds and publishes the next generation; returns it.
    pub fn swap(&self, config: CompiledToolSet, metrics: &Metrics) -> Arc<Snapshot> {
        self.swap_linked(config, Vec::new(), metrics)
    }

    /// [`Registry::swap`] of a config with upstreams, and their links.
    pub fn swap_linked(
        &self,
        config: CompiledToolSet,
        links: Vec<Arc<crate::upstream::Link>>,
        metrics: &Metrics,
    ) -> Arc<Snapshot> {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let mut snap = Snapshot::build(config, generation, metrics);
        snap.upstreams = links;
        let next = Arc::new(snap);
        let prev = self.current.swap(next.clone());
        for t in &prev.tools {
            if next.tool_index(&t.def.name).is_none() {
                metrics.forget_tool(&t.def.name);
            }
        }
        metrics.registry_tools.set(next.tools.len() as i64);
        metrics.registry_generation.set(generation as i64);
        self.ready.store(true, Ordering::Release);
        next
    }

    /// Whether a config has been loaded.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Records the outcome of a reload attempt.
    pub fn set_last_reload(&self, status: ReloadStatus) {
        if let Ok(mut s) = self.last_reload.lock() {
            *s = status;
        }
    }

    /// The outcome of the last reload attempt.
    pub fn last_reload(&self) -> ReloadStatus {
        self.last_reload.lock().map(|s| s.clone()).unwrap_or_default()
    }
}
