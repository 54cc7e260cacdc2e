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
