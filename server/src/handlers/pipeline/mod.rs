//! The `pipeline` handler: other tools of the ToolSet, run in order; each step's input is a
//! template over the arguments and the results of the steps before it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use std::sync::Arc;

use crate::config::access::Access;
use crate::config::compile::{
    CompiledHandler, CompiledTool, Cx, Names, Problems, check_template, checked_template, shallow,
};
use crate::config::{LogLevel, json_field};
use crate::template::{JsonTemplate, Template};

#[cfg(feature = "runtime")]
mod run;
#[cfg(feature = "runtime")]
pub(crate) use run::*;

/// Pipelines may nest at most this deep (a pipeline whose step is a pipeline is 2 deep).
pub const MAX_PIPELINE_NESTING: usize = 16;

/// One call of a pipeline may run at most this many steps, nested pipelines' steps included.
pub const MAX_PIPELINE_STEPS: usize = 10_000;

/// One step of a pipeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PipelineStep {
    /// Name of another tool of this ToolSet.
    pub tool: String,
    /// Arguments for that tool (JSON template over the pipeline's arguments and
    /// `steps.N.text` / `steps.N.structured`). Omitted: the pipeline's own arguments.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "json_field::optional"
    )]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub input: Option<Value>,
    /// A log message sent to the client (`notifications/message`) as the step starts: a
    /// template over the pipeline's arguments and earlier steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// Level of `log` (default `info`); clients choose the least severe level they receive
    /// with `logging/setLevel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<LogLevel>,
}

/// A pipeline step.
#[derive(Debug)]
pub struct Step {
    /// Index of the tool in [`CompiledToolSet::tools`].
    pub tool: usize,
    /// Argument template; `None` passes the pipeline's arguments.
    pub input: Option<JsonTemplate>,
    /// A log message sent to the client as the step starts, and its level.
    pub log: Option<(LogLevel, Template)>,
}

/// Compiles a `pipeline` spec (steps name tools by `cx.index`).
pub(crate) fn compile(steps: &[PipelineStep], cx: &mut Cx<'_>) -> Vec<Step> {
    let pp = cx.at.clone();
    let (names, p, index) = (cx.names, &mut *cx.p, cx.index);
    if steps.is_empty() {
        p.push(&pp, "must have at least one step");
    }
    let mut out = Vec::new();
    for (j, s) in steps.iter().enumerate() {
        let sp = format!("{pp}[{j}]");
        let Some(&target) = index.get(s.tool.as_str()) else {
            p.push(
                format!("{sp}.tool"),
                format!("no tool named `{}` in this ToolSet", s.tool),
            );
            continue;
        };
        // A step's templates see the arguments and the steps before it.
        let step_names = Names {
            props: names.props.clone(),
            steps: Some(j),
        };
        let input = s.input.as_ref().and_then(|v| {
            if !shallow(v, &format!("{sp}.input"), p) {
                return None;
            }
            let jt = JsonTemplate::compile(v)
                .map_err(|e| p.push(format!("{sp}.input"), e))
                .ok()?;
            for t in jt.templates() {
                check_template(t, &step_names, &format!("{sp}.input"), p);
            }
            Some(jt)
        });
        let log = s.log.as_ref().and_then(|src| {
            let t = checked_template(src, &format!("{sp}.log"), &step_names, p)?;
            Some((s.log_level.unwrap_or_default(), t))
        });
        if s.log.is_none() && s.log_level.is_some() {
            p.push(format!("{sp}.logLevel"), "is set but `log` is not");
        }
        out.push(Step {
            tool: target,
            input,
            log,
        });
    }
    out
}

/// Rejects pipeline cycles, nesting deeper than [`MAX_PIPELINE_NESTING`] and pipelines one
/// call of which would run more than [`MAX_PIPELINE_STEPS`] steps. The walk is an explicit
/// depth-first search (no recursion: a chain of thousands of pipelines is input too).
pub(crate) fn check(tools: &mut [CompiledTool], p: &mut Problems) {
    const NEW: u8 = 0;
    const ON_PATH: u8 = 1;
    const DONE: u8 = 2;
    let steps_of = |i: usize| match &tools[i].handler {
        CompiledHandler::Pipeline(steps) => steps.as_slice(),
        _ => &[],
    };
    let mut state = vec![NEW; tools.len()];
    // Pipelines on the deepest chain starting at a tool (itself included), and the steps one
    // call of it runs (nested ones included); both 0 for other handlers.
    let mut nesting = vec![0usize; tools.len()];
    let mut cost = vec![0usize; tools.len()];
    // Who may call each tool, a pipeline's steps' needs added to its own.
    let mut access: Vec<Option<Arc<Access>>> = tools.iter().map(|t| t.access.clone()).collect();
    let mut widened = Vec::new();
    for root in 0..tools.len() {
        if state[root] != NEW {
            continue;
        }
        state[root] = ON_PATH;
        let mut path: Vec<(usize, usize)> = vec![(root, 0)];
        while let Some((i, next)) = path.last_mut() {
            let (i, steps) = (*i, steps_of(*i));
            if let Some(step) = steps.get(*next) {
                *next += 1;
                match state[step.tool] {
                    NEW => {
                        state[step.tool] = ON_PATH;
                        path.push((step.tool, 0));
                    }
                    ON_PATH => {
                        let from = path.iter().position(|&(x, _)| x == step.tool).unwrap_or(0);
                        let mut names: Vec<&str> = path[from..]
                            .iter()
                            .map(|&(x, _)| tools[x].name.as_str())
                            .collect();
                        names.push(&tools[step.tool].name);
                        p.push(
                            format!("tools[{}].handler.pipeline", step.tool),
                            format!("pipeline cycle: {}", names.join(" -> ")),
                        );
                        return;
                    }
                    _ => {}
                }
                continue;
            }
            if !steps.is_empty() {
                nesting[i] = 1 + steps.iter().map(|s| nesting[s.tool]).max().unwrap_or(0);
                cost[i] = steps.iter().fold(0usize, |acc, s| {
                    acc.saturating_add(1).saturating_add(cost[s.tool])
                });
                // Its steps are done: it needs what each of them needs too.
                let mut need: Option<Access> = access[i].as_deref().cloned();
                for s in steps {
                    if let Some(a) = access[s.tool].as_deref() {
                        let n = need.get_or_insert_with(Access::default);
                        if let Err(e) = n.include(a) {
                            widened.push((i, e));
                            break;
                        }
                    }
                }
                access[i] = need.map(Arc::new);
            }
            state[i] = DONE;
            path.pop();
        }
    }
    for (i, e) in widened {
        p.push(
            format!("tools[{i}].access"),
            format!(
                "`{}` runs tools that need other scopes or groups, and {e}",
                tools[i].name
            ),
        );
    }
    for (t, a) in tools.iter_mut().zip(access) {
        t.access = a;
    }
    // A chain of thousands would name thousands of tools: name the first few.
    const SHOWN: usize = 10;
    let mut over = 0;
    let mut first_unshown = 0;
    for (i, t) in tools.iter().enumerate() {
        let problem = if nesting[i] > MAX_PIPELINE_NESTING {
            format!(
                "pipelines nest {} deep from `{}`; at most {MAX_PIPELINE_NESTING} are accepted",
                nesting[i], t.name
            )
        } else if cost[i] > MAX_PIPELINE_STEPS {
            let shown = if cost[i] == usize::MAX {
                "more than that".to_owned()
            } else {
                cost[i].to_string()
            };
            format!(
                "one call of `{}` would run {shown} steps (nested pipelines multiply); at most {MAX_PIPELINE_STEPS} are accepted",
                t.name
            )
        } else {
            continue;
        };
        over += 1;
        if over <= SHOWN {
            p.push(format!("tools[{i}].handler.pipeline"), problem);
        } else if over == SHOWN + 1 {
            first_unshown = i;
        }
    }
    if over > SHOWN {
        p.push(
            format!("tools[{first_unshown}].handler.pipeline"),
            format!(
                "and {} more pipelines from here on nest too deep or run too many steps",
                over - SHOWN
            ),
        );
    }
}
