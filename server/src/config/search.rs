//! `toolSearch`: the settings of a server whose `tools/list` shows a few core tools and
//! `find_tools` (compiled, with the tool itself, by `find_tools`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The name of the tool that searches the others.
pub const FIND_TOOLS: &str = "find_tools";
/// Most core tools a server may name.
pub const MAX_CORE_TOOLS: usize = 64;
/// Largest `maxLimit`.
pub const MAX_LIMIT: u32 = 50;
/// Longest `find_tools` query, in characters.
pub const MAX_QUERY_CHARS: u64 = 512;
pub(super) const DEFAULT_LIMIT: u32 = 5;
pub(super) const DEFAULT_MAX_LIMIT: u32 = 20;

fn yes() -> bool {
    true
}

/// Tool search: `tools/list` shows only the core tools and a `find_tools` tool that returns
/// the tools best matching a plain-language query, with their schemas. Every tool stays
/// callable by name, with the same checks as when listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolSearchSpec {
    /// Whether tool search is on (default true when `toolSearch` is present).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Tools listed by `tools/list` besides `find_tools`: names, or prefixes ending in `*`
    /// (at most 64).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub core_tools: Vec<String>,
    /// Tools `find_tools` returns when the call names no `limit` (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 50))]
    pub default_limit: Option<u32>,
    /// Most tools one `find_tools` call may ask for (default 20, at most 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 50))]
    pub max_limit: Option<u32>,
}

/// Compiled `toolSearch`.
#[derive(Debug, Clone)]
pub struct SearchSettings {
    /// Core tool names, and prefixes (a `*` pattern without its `*`).
    pub(super) core: Vec<(String, bool)>,
    /// Tools returned when a call names no limit.
    pub default_limit: usize,
    /// Most tools returned by one call.
    pub max_limit: usize,
}

impl SearchSettings {
    /// Whether `tools/list` shows the tool named `name`.
    pub fn listed(&self, name: &str) -> bool {
        name == FIND_TOOLS
            || self.core.iter().any(|(c, prefix)| {
                if *prefix {
                    name.starts_with(c.as_str())
                } else {
                    name == c
                }
            })
    }
}
