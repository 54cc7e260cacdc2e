//! `sign_out_upstream`, the tool appended to a ToolSet with an upstream of `identity.mode:
//! user`: a user forgets their own token for such an upstream (the next call asks them to
//! sign in again). A built-in tool rather than a route, so that a user signs out where they
//! use the upstream (their client), as themselves (their access token names them), without
//! a page of its own; listed only where there is something to sign out of.

use serde_json::json;

use crate::config::compiled::{CompiledHandler, CompiledTool};
use crate::config::governance::ToolGovernance;
use crate::schema::Schema;
use crate::spec::context::Problems;
use crate::spec::identity::IdentityMode;

/// The tool's name.
pub const SIGN_OUT: &str = "sign_out_upstream";

/// The upstreams of `specs` that sign users in (`identity.mode: user` on `http`).
pub fn signing_in(specs: &[super::UpstreamSpec]) -> Vec<&str> {
    specs
        .iter()
        .filter(|u| u.http.is_some() && u.identity.as_ref().is_some_and(|i| i.mode == IdentityMode::User))
        .map(|u| u.name.as_str())
        .collect()
}

/// The sign-out tool for `upstreams` (not empty); a problem when a tool of the ToolSet has
/// its name (`taken`).
pub fn tool(upstreams: &[&str], taken: bool, p: &mut Problems) -> CompiledTool {
    if taken {
        p.push(
            "tools",
            format!("a tool is named `{SIGN_OUT}`, the tool a user signs out of an upstream with `identity.mode: user` by; rename it"),
        );
    }
    let input = json!({
        "type": "object",
        "properties": {
            "upstream": {
                "type": "string",
                "enum": upstreams,
                "description": "The upstream to sign out of."
            }
        },
        "required": ["upstream"],
        "additionalProperties": false
    });
    let descriptor = json!({
        "name": SIGN_OUT,
        "title": "Sign out of an upstream",
        "description": format!(
            "Forgets your own sign-in to one of these upstreams ({}): its tools stop acting as you, and the next call of one asks you to sign in again.",
            upstreams.join(", ")
        ),
        "inputSchema": input,
        "annotations": {"readOnlyHint": false, "destructiveHint": true, "idempotentHint": true, "openWorldHint": false},
    });
    CompiledTool {
        name: SIGN_OUT.to_owned(),
        input: Schema::compile(&input).unwrap_or_default(),
        output: None,
        descriptor,
        handler: CompiledHandler::SignOut,
        access: None,
        governance: ToolGovernance::default(),
        task: crate::config::TaskSupport::Forbidden,
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{compile, parse};

    fn tools(yaml: &str) -> Result<Vec<(String, serde_json::Value)>, Vec<String>> {
        let ts = parse("t.yaml", yaml).map_err(|e| vec![e.to_string()])?;
        compile(&ts)
            .map(|c| c.tools.into_iter().map(|t| (t.name, t.descriptor)).collect())
            .map_err(|e| e.problems.iter().map(ToString::to_string).collect())
    }

    const USER: &str = "upstreams:\n  - {name: github, http: {url: \"https://api.example/mcp\"}, identity: {mode: user}, tools: {prefix: gh_}}\n  - {name: wiki, http: {url: \"https://wiki.example/mcp\"}, identity: {mode: user}, tools: {prefix: wiki_}}\n  - {name: notes, http: {url: \"https://notes.example/mcp\"}, tools: {prefix: notes_}}\n";

    #[test]
    fn the_sign_out_tool_is_listed_only_with_an_upstream_that_signs_users_in() {
        let t = tools(USER).unwrap();
        let (_, d) = t.iter().find(|(n, _)| n == super::SIGN_OUT).expect("listed");
        assert_eq!(
            d["inputSchema"]["properties"]["upstream"]["enum"],
            serde_json::json!(["github", "wiki"])
        );
        assert_eq!(d["inputSchema"]["required"], serde_json::json!(["upstream"]));
        let plain = "upstreams:\n  - {name: notes, http: {url: \"https://notes.example/mcp\"}}\n";
        assert!(tools(plain).unwrap().iter().all(|(n, _)| n != super::SIGN_OUT));
        // One upstream without a prefix: the tool does not make it clash.
        let one = "upstreams:\n  - {name: github, http: {url: \"https://api.example/mcp\"}, identity: {mode: user}}\n";
        assert!(tools(one).unwrap().iter().any(|(n, _)| n == super::SIGN_OUT));
        let taken = format!(
            "tools:\n  - {{name: {}, handler: {{template: hi}}}}\n{USER}",
            super::SIGN_OUT
        );
        let problems = tools(&taken).unwrap_err();
        assert!(
            problems.iter().any(|p| p.contains("the tool a user signs out")),
            "{problems:?}"
        );
    }
}
