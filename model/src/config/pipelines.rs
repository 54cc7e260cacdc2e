//! The checks of a ToolSet's pipelines that need every tool compiled first: cycles, how
//! deep pipelines nest, how many steps one call runs, and who may call a pipeline.

use std::sync::Arc;

use crate::config::compiled::{CompiledHandler, CompiledTool};
use crate::handlers::pipeline::{MAX_PIPELINE_NESTING, MAX_PIPELINE_STEPS};
use crate::spec::access::Access;
use crate::spec::context::Problems;

/// Rejects pipeline cycles, nesting deeper than [`MAX_PIPELINE_NESTING`] and pipelines one
/// call of which would run more than [`MAX_PIPELINE_STEPS`] steps, and gives each pipeline
/// the access its steps need.
pub fn check(tools: &mut [CompiledTool], p: &mut Problems) {
    let Some(walk) = walk(tools, p) else {
        return;
    };
    for (i, e) in walk.widened {
        p.push(
            format!("tools[{i}].access"),
            format!(
                "`{}` runs tools that need other scopes or groups, and {e}",
                tools[i].name
            ),
        );
    }
    for (t, a) in tools.iter_mut().zip(walk.access) {
        t.access = a;
    }
    limits(tools, &walk.nesting, &walk.cost, p);
    step_kinds(tools, p);
}

/// Steps whose tool cannot do what the step asks of it: `retry` of a tool that is not a
/// request or a program (what may fail for a while), and a tool that asks the client
/// (at any depth) where steps run at the same time: its answers are matched to its
/// questions by their order, which would then depend on timing.
fn step_kinds(tools: &[CompiledTool], p: &mut Problems) {
    for (i, t) in tools.iter().enumerate() {
        let CompiledHandler::Pipeline(steps) = &t.handler else {
            continue;
        };
        // Steps in order, each after the one before (a `forEach` of them may still run
        // its elements one by one, in order).
        let ordered = steps.iter().enumerate().all(|(j, s)| {
            if j == 0 {
                s.needs.is_empty()
            } else {
                *s.needs == [j - 1]
            }
        });
        for (j, s) in steps.iter().enumerate() {
            let Some(tool) = s.tool() else { continue };
            let at = format!("tools[{i}].handler.pipeline[{j}]");
            if s.retry.is_some()
                && !matches!(
                    tools[tool].handler,
                    CompiledHandler::Http(_) | CompiledHandler::Exec(_)
                )
            {
                p.push(
                    format!("{at}.retry"),
                    "only a step of an http or exec tool is retried (a request or a program may fail for a while)",
                );
            }
            let parallel = !ordered || s.for_each.as_ref().is_some_and(|f| f.max_parallel > 1);
            if parallel && asks(tools, tool, 0) {
                p.push(
                    &at,
                    format!(
                        "`{}` asks the client (sample, elicit, ask): it runs only in a pipeline without `needs`, and not in a `forEach` with `maxParallel` over 1 (its answers are matched to its questions by their order)",
                        tools[tool].name
                    ),
                );
            }
        }
    }
}

/// Whether tool `t` asks the client, itself or in a step at any depth.
fn asks(tools: &[CompiledTool], t: usize, depth: usize) -> bool {
    match &tools[t].handler {
        CompiledHandler::Sample(_) | CompiledHandler::Elicit(_) | CompiledHandler::Ask(_) => true,
        CompiledHandler::Pipeline(steps) if depth < MAX_PIPELINE_NESTING => steps
            .iter()
            .filter_map(super::steps::Step::tool)
            .any(|s| asks(tools, s, depth + 1)),
        _ => false,
    }
}

/// What the walk over the pipelines found, by tool index.
struct Walk {
    /// Pipelines on the deepest chain starting at a tool (itself included); 0 for other handlers.
    nesting: Vec<usize>,
    /// The steps one call of it runs (nested ones included); 0 for other handlers.
    cost: Vec<usize>,
    /// Who may call each tool, a pipeline's steps' needs added to its own.
    access: Vec<Option<Arc<Access>>>,
    /// Pipelines whose steps' access cannot be added to theirs, and why.
    widened: Vec<(usize, String)>,
}

/// Walks the pipelines depth first with an explicit stack (no recursion: a chain of
/// thousands of pipelines is input too). `None` after reporting a cycle.
fn walk(tools: &[CompiledTool], p: &mut Problems) -> Option<Walk> {
    const NEW: u8 = 0;
    const ON_PATH: u8 = 1;
    const DONE: u8 = 2;
    let steps_of = |i: usize| match &tools[i].handler {
        CompiledHandler::Pipeline(steps) => steps.as_slice(),
        _ => &[],
    };
    let mut state = vec![NEW; tools.len()];
    let mut w = Walk {
        nesting: vec![0usize; tools.len()],
        cost: vec![0usize; tools.len()],
        access: tools.iter().map(|t| t.access.clone()).collect(),
        widened: Vec::new(),
    };
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
                let Some(tool) = step.tool() else { continue };
                match state[tool] {
                    NEW => {
                        state[tool] = ON_PATH;
                        path.push((tool, 0));
                    }
                    ON_PATH => {
                        let from = path.iter().position(|&(x, _)| x == tool).unwrap_or(0);
                        let mut names: Vec<&str> = path[from..]
                            .iter()
                            .map(|&(x, _)| tools[x].name.as_str())
                            .collect();
                        names.push(&tools[tool].name);
                        p.push(
                            format!("tools[{tool}].handler.pipeline"),
                            format!("pipeline cycle: {}", names.join(" -> ")),
                        );
                        return None;
                    }
                    _ => {}
                }
                continue;
            }
            if !steps.is_empty() {
                w.finish(i, steps);
            }
            state[i] = DONE;
            path.pop();
        }
    }
    Some(w)
}

impl Walk {
    /// Records pipeline `i` once all its steps are done: its nesting, its cost, and the access
    /// it needs (what each of its steps needs too).
    fn finish(&mut self, i: usize, steps: &[super::steps::Step]) {
        self.nesting[i] = 1 + steps
            .iter()
            .filter_map(|s| Some(self.nesting[s.tool()?]))
            .max()
            .unwrap_or(0);
        // Each element of a `forEach` and each attempt runs the step's tool again.
        self.cost[i] = steps.iter().fold(0usize, |acc, s| {
            let once = 1usize.saturating_add(s.tool().map_or(0, |t| self.cost[t]));
            acc.saturating_add(once.saturating_mul(s.runs()))
        });
        let mut need: Option<Access> = self.access[i].as_deref().cloned();
        for s in steps.iter().filter_map(super::steps::Step::tool) {
            if let Some(a) = self.access[s].as_deref() {
                let n = need.get_or_insert_with(Access::default);
                if let Err(e) = n.include(a) {
                    self.widened.push((i, e));
                    break;
                }
            }
        }
        self.access[i] = need.map(Arc::new);
    }
}

/// Reports pipelines that nest too deep or run too many steps.
fn limits(tools: &[CompiledTool], nesting: &[usize], cost: &[usize], p: &mut Problems) {
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
