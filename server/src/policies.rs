//! Attaches to each tool of a registry snapshot the policies that apply to it: the
//! ToolSet's named ones its selectors pick, its inline one and, for a pipeline, those of
//! every tool it runs (composing tools never widens who may run them).

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
    // A pipeline is subject to its steps' policies too, evaluated on its own arguments.
    let inherited: Vec<Vec<_>> = tools
        .iter()
        .map(|t| {
            let mut found = Vec::new();
            steps_policies(tools, &own, t, 0, &mut found);
            found
        })
        .collect();
    for (i, extra) in inherited.into_iter().enumerate() {
        if extra.is_empty() {
            continue;
        }
        let t = &tools[i];
        let mine = own[i].take();
        let mut list: Vec<_> = mine.as_ref().map(|m| m.list.to_vec()).unwrap_or_default();
        for p in extra {
            if !list.iter().any(|q| std::sync::Arc::ptr_eq(q, &p)) {
                list.push(p);
            }
        }
        own[i] = Some(Box::new(ToolPolicies {
            list: list.into(),
            annotations: mine
                .map(|m| m.annotations)
                .unwrap_or_else(|| t.descriptor.get("annotations").cloned().unwrap_or_default()),
            upstream: "".into(),
        }));
    }
    own
}

fn steps_policies(
    tools: &[CompiledTool],
    own: &[Option<Box<ToolPolicies>>],
    t: &CompiledTool,
    depth: usize,
    found: &mut Vec<std::sync::Arc<crate::config::policy::Policy>>,
) {
    let CompiledHandler::Pipeline(steps) = &t.handler else {
        return;
    };
    if depth > MAX_PIPELINE_NESTING {
        return;
    }
    for s in steps {
        if let Some(Some(p)) = own.get(s.tool) {
            found.extend(p.list.iter().cloned());
        }
        if let Some(step) = tools.get(s.tool) {
            steps_policies(tools, own, step, depth + 1, found);
        }
    }
}
