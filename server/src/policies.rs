//! Attaches to each tool of a registry snapshot the policies that apply to it: the
//! ToolSet's named ones its selectors pick and its inline one. A pipeline also records
//! which of the tools it runs have policies: each step's call is checked against its
//! tool's policies with the arguments that step sends, as if the caller called the tool
//! itself, and a pipeline is listed only to callers its steps' tools are listed to
//! (composing tools never widens who may run them).

use crate::config::policy::ToolPolicies;
use crate::config::{CompiledHandler, CompiledTool, CompiledToolSet, MAX_PIPELINE_NESTING};

/// The policies of each of `tools` (`None`: none applies, and a call pays nothing).
pub fn attach(tools: &[CompiledTool], cfg: &CompiledToolSet) -> Vec<Option<Box<ToolPolicies>>> {
    if cfg.policies.is_empty() {
        return tools.iter().map(|_| None).collect();
    }
    // An upstream's annotations are its claims: policies see the author's, or the most
    // cautious hints (read-write, destructive, not idempotent, open world) when there are none.
    let untrusted = serde_json::json!({
        "readOnlyHint": false, "destructiveHint": true, "idempotentHint": false, "openWorldHint": true
    });
    let mut own: Vec<Option<Box<ToolPolicies>>> = tools
        .iter()
        .map(|t| {
            let (upstream, annotations) = match &t.handler {
                CompiledHandler::Upstream(u) => match cfg.upstreams.get(u.upstream) {
                    Some(up) => (
                        up.name.as_str(),
                        Some(up.authors_annotations(&u.remote).unwrap_or(&untrusted)),
                    ),
                    None => ("", Some(&untrusted)),
                },
                _ => ("", t.descriptor.get("annotations")),
            };
            cfg.policies.for_tool(&t.name, upstream, annotations)
        })
        .collect();
    let steps: Vec<Vec<usize>> = tools
        .iter()
        .map(|t| {
            let mut found = Vec::new();
            guarded_steps(tools, &own, t, 0, &mut found);
            found
        })
        .collect();
    for (i, found) in steps.into_iter().enumerate() {
        if found.is_empty() {
            continue;
        }
        let t = &tools[i];
        own[i] = Some(match own[i].take() {
            Some(mut mine) => {
                mine.steps = found.into();
                mine
            }
            None => Box::new(ToolPolicies {
                list: Box::new([]),
                annotations: t.descriptor.get("annotations").cloned().unwrap_or_default(),
                upstream: "".into(),
                steps: found.into(),
            }),
        });
    }
    own
}

/// The tools with policies that pipeline `t` runs, at any depth, each once.
fn guarded_steps(
    tools: &[CompiledTool],
    own: &[Option<Box<ToolPolicies>>],
    t: &CompiledTool,
    depth: usize,
    found: &mut Vec<usize>,
) {
    let CompiledHandler::Pipeline(steps) = &t.handler else {
        return;
    };
    if depth > MAX_PIPELINE_NESTING {
        return;
    }
    for s in steps.iter().filter_map(crate::config::Step::tool) {
        if matches!(own.get(s), Some(Some(_))) && !found.contains(&s) {
            found.push(s);
        }
        if let Some(step) = tools.get(s) {
            guarded_steps(tools, own, step, depth + 1, found);
        }
    }
}

#[cfg(test)]
mod tests {
    use rustc_hash::FxHashSet;
    use serde_json::json;

    use crate::config::{compile, parse};

    /// An upstream that calls its tools read-only and harmless cannot pass a policy that
    /// refuses destructive tools: policies see the author's annotations, or the most
    /// cautious ones.
    #[test]
    fn policies_see_the_authors_annotations_of_an_upstreams_tools_never_the_upstreams_claims() {
        let cfg = compile(
            &parse(
                "t",
                "upstreams: [{name: up, stdio: {command: [up]}, tools: {annotations: {vetted: {destructiveHint: false, readOnlyHint: true}}}}]\npolicies: [{name: no-destruction, expression: \"tool.annotations.destructiveHint != true\"}]\n",
            )
            .unwrap(),
        )
        .unwrap();
        let claims = json!({"readOnlyHint": true, "destructiveHint": false});
        let listed = vec![
            json!({"name": "claims", "inputSchema": {"type": "object"}, "annotations": claims}),
            json!({"name": "vetted", "inputSchema": {"type": "object"}, "annotations": {"destructiveHint": true}}),
        ];
        let (tools, _) = cfg.upstreams[0].import(0, &listed, &mut FxHashSet::default());
        let attached = super::attach(&tools, &cfg);
        let seen = |i: usize| {
            attached[i]
                .as_ref()
                .expect("the policy applies")
                .annotations
                .clone()
        };
        assert_eq!(
            seen(0)["destructiveHint"],
            true,
            "the upstream's claim was trusted"
        );
        assert_eq!(seen(0)["readOnlyHint"], false);
        assert_eq!(
            seen(1)["destructiveHint"],
            false,
            "the author's annotations decide"
        );
        // What clients see is still what the upstream listed.
        assert_eq!(tools[0].descriptor["annotations"], claims);
    }
}
