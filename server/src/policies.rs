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
    let mut own: Vec<Option<Box<ToolPolicies>>> = tools
        .iter()
        .map(|t| {
            let upstream = match &t.handler {
                CompiledHandler::Upstream(u) => cfg.upstreams.get(u.upstream).map_or("", |u| u.name.as_str()),
                _ => "",
            };
            cfg.policies
                .for_tool(&t.name, upstream, t.descriptor.get("annotations"))
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
    for s in steps {
        if matches!(own.get(s.tool), Some(Some(_))) && !found.contains(&s.tool) {
            found.push(s.tool);
        }
        if let Some(step) = tools.get(s.tool) {
            guarded_steps(tools, own, step, depth + 1, found);
        }
    }
}
