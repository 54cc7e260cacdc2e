//! Compiling `toolSearch` (its settings in [`super::search`]): the checked settings, and
//! the `find_tools` tool appended to the compiled tools.

use rustc_hash::FxHashMap;
use serde_json::json;

use super::compiled::{CompiledHandler, CompiledTool};
use super::governance::ToolGovernance;
use super::search::{
    DEFAULT_LIMIT, DEFAULT_MAX_LIMIT, FIND_TOOLS, MAX_CORE_TOOLS, MAX_LIMIT, MAX_QUERY_CHARS, SearchSettings,
    ToolSearchSpec,
};
use crate::schema::Schema;
use crate::spec::context::{Problems, valid_tool_name};

/// Compiles `toolSearch` and, when it is on, appends `find_tools` to `tools`.
/// `has_upstreams`: a core name that no local tool has may be an imported one.
pub(super) fn compile(
    spec: Option<&ToolSearchSpec>,
    local: &FxHashMap<&str, usize>,
    has_upstreams: bool,
    tools: &mut Vec<CompiledTool>,
    p: &mut Problems,
) -> Option<SearchSettings> {
    let spec = spec.filter(|s| s.enabled)?;
    if local.contains_key(FIND_TOOLS) {
        p.push(
            "toolSearch",
            format!("a tool is named `{FIND_TOOLS}`, the name of the search tool; rename it"),
        );
    }
    if spec.core_tools.len() > MAX_CORE_TOOLS {
        p.push(
            "toolSearch.coreTools",
            format!("{} names; at most {MAX_CORE_TOOLS}", spec.core_tools.len()),
        );
    }
    let core = spec
        .core_tools
        .iter()
        .take(MAX_CORE_TOOLS)
        .enumerate()
        .filter_map(|(i, c)| core_name(c, local, has_upstreams, &format!("toolSearch.coreTools[{i}]"), p))
        .collect();
    let max_limit = spec.max_limit.unwrap_or(DEFAULT_MAX_LIMIT);
    let default_limit = spec.default_limit.unwrap_or(DEFAULT_LIMIT.min(max_limit));
    if !(1..=MAX_LIMIT).contains(&max_limit) {
        p.push(
            "toolSearch.maxLimit",
            format!("must be between 1 and {MAX_LIMIT}"),
        );
    }
    if !(1..=max_limit).contains(&default_limit) {
        p.push("toolSearch.defaultLimit", "must be between 1 and `maxLimit`");
    }
    let max_limit = max_limit.clamp(1, MAX_LIMIT);
    tools.push(find_tools(max_limit));
    Some(SearchSettings {
        core,
        default_limit: default_limit.clamp(1, max_limit) as usize,
        max_limit: max_limit as usize,
    })
}

/// One `coreTools` entry, checked.
fn core_name(
    c: &str,
    local: &FxHashMap<&str, usize>,
    has_upstreams: bool,
    at: &str,
    p: &mut Problems,
) -> Option<(String, bool)> {
    let (name, prefix) = match c.strip_suffix('*') {
        Some(stem) => (stem, true),
        None => (c, false),
    };
    if !(valid_tool_name(name) || (prefix && name.is_empty())) {
        p.push(at, format!("`{c}` is not a tool name or a prefix ending in `*`"));
        return None;
    }
    if !prefix && !has_upstreams && !local.contains_key(name) {
        p.push(at, format!("no tool is named `{name}`"));
        return None;
    }
    Some((name.to_owned(), prefix))
}

/// The `find_tools` tool: its schemas and the handler the dispatcher answers.
fn find_tools(max_limit: u32) -> CompiledTool {
    let input = json!({
        "type": "object",
        "properties": {
            "query": {
                "type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS,
                "description": "What you want to do, in plain words (e.g. `list the pods in a namespace`)."
            },
            "limit": {
                "type": "integer", "minimum": 1, "maximum": max_limit,
                "description": "Most tools to return."
            }
        },
        "required": ["query"],
        "additionalProperties": false
    });
    let output = json!({
        "type": "object",
        "properties": {"tools": {"type": "array", "items": {"type": "object"}}},
        "required": ["tools"]
    });
    let descriptor = json!({
        "name": FIND_TOOLS,
        "title": "Find tools",
        "description": "Searches this server's tools by what they do and returns the best matches, \
            best first, each with its name, description and inputSchema. Call a tool it returns by \
            its name with tools/call, as if it were listed.",
        "inputSchema": input,
        "outputSchema": output,
        "annotations": {"readOnlyHint": true, "idempotentHint": true, "openWorldHint": false},
    });
    CompiledTool {
        name: FIND_TOOLS.to_owned(),
        input: Schema::compile(&input).unwrap_or_default(),
        output: Schema::compile(&output).ok().map(Box::new),
        descriptor,
        handler: CompiledHandler::FindTools,
        access: None,
        governance: ToolGovernance::default(),
        task: crate::config::TaskSupport::Forbidden,
    }
}
