//! The `pipeline` handler: runs other tools of the same snapshot in order. Each step's
//! input template sees the pipeline's arguments and `steps.N.text` / `steps.N.structured`.
//!
//! A call is bounded three ways. The compiler rejects cycles, nesting deeper than
//! [`crate::exec::MAX_DEPTH`] and ToolSets where one call would run more than [`MAX_STEPS`] tools
//! (nested pipelines multiply). At run time a [`Budget`] shared by every nested step counts
//! the steps and the bytes of the step results kept for later steps, and the pipeline yields
//! to the scheduler between steps, so a long call shares its worker and stops as soon as it
//! is cancelled or times out (the caller drops it).

use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Map, Value};

use crate::handlers::pipeline::{MAX_PIPELINE_STEPS as MAX_STEPS, Step};
use crate::peer::CallCtx;
use crate::protocol::output::{OutputFuture, ToolOutput};
use crate::registry::Snapshot;
use crate::template::{Scope, approx_size};

/// The most bytes of step results one pipeline call (with its nested pipelines) keeps.
pub const MAX_KEPT_BYTES: usize = 64 << 20;

/// What is left of a pipeline call's allowance of steps and kept bytes.
#[derive(Debug)]
pub struct Budget {
    steps: AtomicUsize,
    bytes: AtomicUsize,
}

impl Budget {
    /// The allowance of one call.
    pub const fn new() -> Self {
        Self {
            steps: AtomicUsize::new(MAX_STEPS),
            bytes: AtomicUsize::new(MAX_KEPT_BYTES),
        }
    }

    fn take(counter: &AtomicUsize, n: usize) -> bool {
        counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(n))
            .is_ok()
    }
}

struct PipelineScope<'a> {
    args: &'a Value,
    steps: &'a Value,
}

impl Scope for PipelineScope<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        if name == "steps" {
            Some(self.steps)
        } else {
            self.args.get(name)
        }
    }
}

/// What runs the tool of a step (the executor): the pipeline only needs this of it.
pub(crate) trait RunStep {
    /// Runs tool `tool` of `snap` with validated `args` as a step of a call at `depth`,
    /// counting against the call's `budget`.
    fn run_step<'a>(
        &'a self,
        snap: &'a Snapshot,
        tool: usize,
        args: Value,
        depth: usize,
        budget: &'a Budget,
        cx: &'a CallCtx<'a>,
    ) -> OutputFuture<'a>;
}

/// Runs the steps; the first failing step ends the pipeline with its error.
pub async fn run<E: RunStep>(
    exec: &E,
    snap: &Snapshot,
    steps: &[Step],
    args: Value,
    depth: usize,
    budget: &Budget,
    cx: &CallCtx<'_>,
) -> ToolOutput {
    // Progress counts this pipeline's own steps (a nested pipeline reports none of its own).
    let total = steps.len() as u64;
    let report = depth == 0;
    let mut done = Value::Array(Vec::with_capacity(steps.len()));
    let mut last = ToolOutput::text("");
    for (i, step) in steps.iter().enumerate() {
        if depth == 0 && cx.until_step == Some(i) {
            return last;
        }
        let tool = &snap.tools[step.tool];
        if !Budget::take(&budget.steps, 1) {
            return ToolOutput::error(format!(
                "step {i} ({}): the call ran {MAX_STEPS} steps, the most one call may run",
                tool.def.name
            ));
        }
        if report {
            cx.progress(i as u64, Some(total), Some(&tool.def.name));
        }
        if let Some((level, message)) = &step.log {
            match message.render(&PipelineScope {
                args: &args,
                steps: &done,
            }) {
                Ok(text) => cx.log(*level, &snap.tools[step.tool].def.name, &text),
                Err(e) => return ToolOutput::error(format!("step {i} ({}): log: {e}", tool.def.name)),
            }
        }
        // Let other requests run, and let a cancelled or timed-out call stop here.
        tokio::task::yield_now().await;
        let input = match &step.input {
            Some(t) => match t.render(&PipelineScope {
                args: &args,
                steps: &done,
            }) {
                Ok(v) => v,
                Err(e) => return ToolOutput::error(format!("step {i} ({}): {e}", tool.def.name)),
            },
            None => args.clone(),
        };
        let mut errs = Vec::new();
        tool.def.input.validate(&input, &mut errs);
        if !errs.is_empty() {
            return ToolOutput::error(format!(
                "step {i} ({}): invalid arguments: {}",
                tool.def.name,
                errs.join("; ")
            ));
        }
        // The step's call meets its tool's policies with the arguments it sends, exactly as
        // if the caller had called that tool itself.
        if let Some(policies) = &tool.policies
            && let Err(denied) = policies.check(&tool.def.name, cx.caller, Some(&input))
        {
            return ToolOutput::error(format!(
                "step {i} ({}): {}",
                tool.def.name,
                denied.message(&tool.def.name)
            ));
        }
        let run = exec.run_step(snap, step.tool, input, depth + 1, budget, cx);
        let out = crate::otel::spans::within(crate::otel::spans::step(i, &tool.def.name), run, |o| {
            o.is_error.then_some("tool_error")
        })
        .await;
        let (out, _) = super::output::guard_output(snap, step.tool, out);
        if out.is_error {
            return ToolOutput::error(format!("step {i} ({}) failed: {}", tool.def.name, out.text));
        }
        let kept = out.text.len() + out.structured.as_ref().map_or(0, approx_size);
        if !Budget::take(&budget.bytes, kept) {
            return ToolOutput::error(format!(
                "step {i} ({}): the results of this call's steps exceed {} MiB",
                tool.def.name,
                MAX_KEPT_BYTES >> 20
            ));
        }
        let mut record = Map::new();
        record.insert("text".into(), Value::String(out.text.clone()));
        record.insert("structured".into(), out.structured.clone().unwrap_or(Value::Null));
        if let Value::Array(a) = &mut done {
            a.push(Value::Object(record));
        }
        last = out;
    }
    if report {
        cx.progress(total, Some(total), None);
    }
    last
}

/// The first step of `steps` that may run long (a process, an HTTP request, an upstream call,
/// `builtin: sleep`, or a nested pipeline with such a step); `None`: every step answers at
/// once or asks the client.
pub fn first_long_step(snap: &Snapshot, steps: &[Step]) -> Option<usize> {
    steps
        .iter()
        .position(|s| crate::registry::may_run_long(&snap.tools, s.tool, 1))
}
