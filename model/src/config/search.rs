//! `toolSearch`: the settings of a server whose `tools/list` shows a few core tools and
//! `find_tools` (compiled, with the `find_tools` tool, by [`super::search_build`]).

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

#[cfg(test)]
mod tests {
    use super::super::{compile as compile_set, parse};

    fn problems(yaml: &str) -> Vec<String> {
        let ts = parse("t", yaml).unwrap_or_else(|e| panic!("{e}"));
        match compile_set(&ts) {
            Ok(_) => Vec::new(),
            Err(e) => e
                .problems
                .iter()
                .map(|p| format!("{}: {}", p.path, p.message))
                .collect(),
        }
    }

    const TOOLS: &str =
        "tools:\n  - {name: echo, handler: {builtin: echo}}\n  - {name: kube_list, handler: {template: x}}\n";

    #[test]
    fn search_adds_find_tools_and_lists_the_core_tools_only() {
        let ts = parse(
            "t",
            &format!("{TOOLS}toolSearch: {{coreTools: [echo, 'kube_*'], defaultLimit: 2}}\n"),
        )
        .unwrap();
        let c = compile_set(&ts).unwrap();
        let s = c.search.as_ref().expect("on");
        assert_eq!(c.tools.last().map(|t| t.name.as_str()), Some(super::FIND_TOOLS));
        assert!(s.listed("echo") && s.listed("kube_list") && s.listed("find_tools") && !s.listed("ech"));
        assert_eq!((s.default_limit, s.max_limit), (2, 20));
        let off = parse("t", &format!("{TOOLS}toolSearch: {{enabled: false}}\n")).unwrap();
        let c = compile_set(&off).unwrap();
        assert!(c.search.is_none() && c.tools.len() == 2);
    }

    #[test]
    fn bad_settings_are_refused_with_their_path() {
        let bad = |s: &str| problems(&format!("{TOOLS}toolSearch: {s}\n"));
        assert_eq!(
            bad("{coreTools: [nope]}"),
            ["toolSearch.coreTools[0]: no tool is named `nope`"]
        );
        assert_eq!(
            bad("{coreTools: ['bad name*']}"),
            ["toolSearch.coreTools[0]: `bad name*` is not a tool name or a prefix ending in `*`"]
        );
        assert_eq!(
            bad("{maxLimit: 51}"),
            ["toolSearch.maxLimit: must be between 1 and 50"]
        );
        assert_eq!(bad("{maxLimit: 0}").len(), 2);
        assert_eq!(
            bad("{defaultLimit: 9, maxLimit: 8}"),
            ["toolSearch.defaultLimit: must be between 1 and `maxLimit`"]
        );
        let many: Vec<String> = (0..65).map(|i| format!("x{i}*")).collect();
        assert_eq!(
            bad(&format!("{{coreTools: [{}]}}", many.join(","))),
            ["toolSearch.coreTools: 65 names; at most 64"]
        );
        let taken = problems("tools: [{name: find_tools, handler: {builtin: echo}}]\ntoolSearch: {}\n");
        assert_eq!(
            taken,
            ["toolSearch: a tool is named `find_tools`, the name of the search tool; rename it"]
        );
        // Without search the name is free.
        assert!(problems("tools: [{name: find_tools, handler: {builtin: echo}}]\n").is_empty());
    }

    #[test]
    fn a_core_name_may_be_an_imported_tool_when_there_are_upstreams() {
        let yaml = format!(
            "{TOOLS}upstreams: [{{name: up, http: {{url: 'http://127.0.0.1:9/mcp'}}, tools: {{prefix: up_}}}}]\ntoolSearch: {{coreTools: [up_remote]}}\n"
        );
        assert_eq!(problems(&yaml), Vec::<String>::new());
    }
}
