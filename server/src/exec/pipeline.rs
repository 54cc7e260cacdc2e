//! The `pipeline` handler: runs other tools of the same snapshot as steps. Each step's
//! templates see the pipeline's arguments and the results of the steps it needs
//! (`steps.N` / `steps.ID`: `text`, `structured`, `skipped`).
//!
//! Steps run as the compiler ordered them: one after the other (a chain), or as a graph
//! where a step starts once the steps it needs are done and independent steps run at the
//! same time, in this call's task (they wait on the network together; nothing is spawned).
//! A step may be conditional (`when`), run once per element of an array with at most
//! `maxParallel` runs at a time (`forEach`), retried with back-off (`retry`), or build a
//! value (`result`). The first failing step ends the pipeline, and the steps still running
//! are dropped (cancelled).
//!
//! A call is bounded three ways. The compiler rejects cycles, nesting deeper than
//! [`crate::exec::MAX_DEPTH`] and ToolSets where one call could run more than [`MAX_STEPS`]
//! tools (nested pipelines, elements and attempts multiply). At run time a [`Budget`] shared
//! by every nested step counts the steps and the bytes of the step results kept for later
//! steps, and the pipeline yields to the scheduler between steps, so a long call shares its
//! worker and stops as soon as it is cancelled or times out (the caller drops it).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use serde_json::{Map, Value};

use crate::config::policy::{Target, ToolFacts};
use crate::config::{CompiledHandler, ForEach, OnAnswer, Step, StepRun, is_chain};
use crate::handlers::pipeline::{MAX_BACKOFF, MAX_PIPELINE_STEPS as MAX_STEPS};
use crate::peer::CallCtx;
use crate::protocol::output::{OutputFuture, ToolOutput};
use crate::registry::Snapshot;
use crate::template::{Scope, approx_size};

/// The most bytes of step results one pipeline call (with its nested pipelines) keeps.
pub const MAX_KEPT_BYTES: usize = 64 << 20;

/// The most tools one pipeline call (with its nested pipelines) runs at the same time,
/// whatever its `maxParallel`s and independent steps add up to.
pub const MAX_IN_FLIGHT: usize = 64;

/// What is left of a pipeline call's allowance of steps and kept bytes, and of the tools
/// it may run at the same time.
#[derive(Debug)]
pub struct Budget {
    steps: AtomicUsize,
    bytes: AtomicUsize,
    in_flight: tokio::sync::Semaphore,
}

impl Budget {
    /// The allowance of one call.
    pub const fn new() -> Self {
        Self {
            steps: AtomicUsize::new(MAX_STEPS),
            bytes: AtomicUsize::new(MAX_KEPT_BYTES),
            in_flight: tokio::sync::Semaphore::const_new(MAX_IN_FLIGHT),
        }
    }

    fn take(counter: &AtomicUsize, n: usize) -> bool {
        counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(n))
            .is_ok()
    }
}

/// What a step's templates read: the arguments, the finished steps, and under `forEach`
/// the element and its position.
struct PipelineScope<'a> {
    args: &'a Value,
    steps: &'a Value,
    each: Option<(&'a Value, &'a Value)>,
}

impl Scope for PipelineScope<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        match (name, self.each) {
            ("steps", _) => Some(self.steps),
            ("item", Some((item, _))) => Some(item),
            ("index", Some((_, index))) => Some(index),
            _ => self.args.get(name),
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

/// How a step ended.
enum Outcome {
    /// Its result.
    Done(ToolOutput),
    /// The result of a `forEach`, whose runs' bytes were counted as they finished.
    Gathered(ToolOutput),
    /// Its condition did not hold, or the user declined and `onDecline: skip`.
    Skipped,
    /// The user declined and `onDecline: end`: the pipeline's result.
    End(ToolOutput),
    /// The pipeline's error.
    Failed(ToolOutput),
}

/// One call of a pipeline.
struct Call<'a, E> {
    exec: &'a E,
    snap: &'a Snapshot,
    /// The pipeline tool's index.
    tool: usize,
    steps: &'a [Step],
    args: &'a Value,
    depth: usize,
    budget: &'a Budget,
    cx: &'a CallCtx<'a>,
    /// The steps run one after the other.
    chain: bool,
}

/// Runs the steps of pipeline `tool`; its result is its last step's.
#[allow(clippy::too_many_arguments)] // the executor's context, passed through
pub async fn run<E: RunStep + Sync>(
    exec: &E,
    snap: &Snapshot,
    tool: usize,
    steps: &[Step],
    args: Value,
    depth: usize,
    budget: &Budget,
    cx: &CallCtx<'_>,
) -> ToolOutput {
    let call = Call {
        exec,
        snap,
        tool,
        steps,
        args: &args,
        depth,
        budget,
        cx,
        chain: is_chain(steps),
    };
    call.run().await
}

impl<'a, E: RunStep + Sync> Call<'a, E> {
    // Long: the scheduler's loop, its state kept in one place.
    async fn run(&self) -> ToolOutput {
        let n = self.steps.len();
        let total = n as u64;
        let report = self.depth == 0;
        let mut waiting: Vec<usize> = self.steps.iter().map(|s| s.needs.len()).collect();
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, s) in self.steps.iter().enumerate() {
            for &j in &*s.needs {
                dependents[j].push(i);
            }
        }
        let mut ready: VecDeque<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
        let mut running: FuturesUnordered<BoxFuture<'_, (usize, Outcome)>> = FuturesUnordered::new();
        let mut done = Value::Object(Map::new());
        let mut last = ToolOutput::text("");
        let mut finished = 0u64;
        loop {
            while let Some(i) = ready.pop_front() {
                if self.depth == 0 && self.cx.until_step == Some(i) {
                    return last;
                }
                // A chain reports each step as it starts, a graph (whose steps start
                // together) as each finishes: progress only ever grows.
                if report && self.chain {
                    self.cx.progress(finished, Some(total), Some(self.name(i)));
                }
                match self.start(i, &done) {
                    Ok(fut) => running.push(fut),
                    Err(outcome) => running.push(Box::pin(async move { (i, outcome) })),
                }
            }
            let Some((i, outcome)) = running.next().await else {
                break;
            };
            finished += 1;
            if report && !self.chain {
                self.cx.progress(finished, Some(total), Some(self.name(i)));
            }
            let (record, out) = match outcome {
                Outcome::End(out) | Outcome::Failed(out) => return out,
                Outcome::Skipped => (skipped(), ToolOutput::text("")),
                Outcome::Gathered(out) => (record(&out), out),
                Outcome::Done(out) => {
                    // Kept once more under the step's id.
                    let copies = 1 + usize::from(self.steps[i].id.is_some());
                    let kept = (out.text.len() + out.structured.as_ref().map_or(0, approx_size)) * copies;
                    if !Budget::take(&self.budget.bytes, kept) {
                        return ToolOutput::error(format!(
                            "step {i} ({}): the results of this call's steps exceed {} MiB",
                            self.name(i),
                            MAX_KEPT_BYTES >> 20
                        ));
                    }
                    (record(&out), out)
                }
            };
            if let Value::Object(m) = &mut done {
                if let Some(id) = &self.steps[i].id {
                    m.insert(id.to_string(), record.clone());
                }
                m.insert(i.to_string(), record);
            }
            if i + 1 == n {
                last = out;
            }
            for &d in &dependents[i] {
                waiting[d] -= 1;
                if waiting[d] == 0 {
                    ready.push_back(d);
                }
            }
        }
        if report {
            self.cx.progress(total, Some(total), None);
        }
        last
    }

    /// What step `i` is called in messages: its tool, or its id.
    fn name(&self, i: usize) -> &'a str {
        let s = &self.steps[i];
        match s.tool() {
            Some(t) => &self.snap.tools[t].def.name,
            None => s.id.as_deref().unwrap_or("result"),
        }
    }

    fn fail(&self, i: usize, why: impl std::fmt::Display) -> Outcome {
        Outcome::Failed(ToolOutput::error(format!("step {i} ({}): {why}", self.name(i))))
    }

    /// Starts step `i`: its log, its condition and its input(s), from what is done now;
    /// the returned future owns what it needs. `Err`: it ended already.
    fn start<'s>(&'s self, i: usize, done: &Value) -> Result<BoxFuture<'s, (usize, Outcome)>, Outcome> {
        let step = &self.steps[i];
        let scope = PipelineScope {
            args: self.args,
            steps: done,
            each: None,
        };
        if let Some(cond) = &step.when {
            // It reads only the steps this one needs (checked when the config loads),
            // which are all done.
            let facts = ToolFacts {
                name: &self.snap.tools[self.tool].def.name,
                upstream: "",
                annotations: &Value::Null,
            };
            match cond.holds(self.cx.caller, Target::Tool(facts), self.args, done) {
                Ok(true) => {}
                Ok(false) => return Err(Outcome::Skipped),
                Err(why) => return Err(self.fail(i, format!("when: {why}"))),
            }
        }
        if let Some((level, message)) = &step.log {
            match message.render(&scope) {
                Ok(text) => self.cx.log(*level, self.name(i), &text),
                Err(e) => return Err(self.fail(i, format!("log: {e}"))),
            }
        }
        let tool = match &step.run {
            StepRun::Result(t) => {
                return Err(match t.render(&scope) {
                    Ok(v) => Outcome::Done(built(v)),
                    Err(e) => self.fail(i, e),
                });
            }
            StepRun::Tool(t) => *t,
        };
        let Some(each) = &step.for_each else {
            let input = self.input(i, &scope).map_err(|e| self.fail(i, e))?;
            return Ok(Box::pin(async move { (i, self.attempts(i, tool, input).await) }));
        };
        let inputs = self.inputs(i, each, done).map_err(|e| self.fail(i, e))?;
        let max = each.max_parallel;
        Ok(Box::pin(async move {
            let count = inputs.len();
            let runs = inputs
                .into_iter()
                .enumerate()
                .map(|(k, input)| async move { (k, self.attempts(i, tool, input).await) });
            // Runs finish in any order: the first failure ends the step at once.
            let mut results = futures_util::stream::iter(runs).buffer_unordered(max);
            let mut outs: Vec<Option<ToolOutput>> = (0..count).map(|_| None).collect();
            while let Some((k, o)) = results.next().await {
                let out = match o {
                    Outcome::Done(out) | Outcome::Gathered(out) => out,
                    Outcome::Skipped => ToolOutput::text(""),
                    other => return (i, other),
                };
                // Counted as it comes (twice: the step's result gathers it again).
                let kept = 2 * (out.text.len() + out.structured.as_ref().map_or(0, approx_size));
                if !Budget::take(&self.budget.bytes, kept) {
                    return (
                        i,
                        self.fail(
                            i,
                            format!(
                                "the results of this call's steps exceed {} MiB",
                                MAX_KEPT_BYTES >> 20
                            ),
                        ),
                    );
                }
                outs[k] = Some(out);
            }
            (
                i,
                Outcome::Gathered(gathered(outs.into_iter().flatten().collect())),
            )
        }))
    }

    /// A step's arguments: its `input`, or the pipeline's own.
    fn input(&self, i: usize, scope: &PipelineScope<'_>) -> Result<Value, String> {
        match &self.steps[i].input {
            Some(t) => t.render(scope).map_err(|e| e.to_string()),
            None => Ok(self.args.clone()),
        }
    }

    /// The arguments of each run of a `forEach` step.
    fn inputs(&self, i: usize, each: &ForEach, done: &Value) -> Result<Vec<Value>, String> {
        let scope = PipelineScope {
            args: self.args,
            steps: done,
            each: None,
        };
        let items = match each.items.render(&scope).map_err(|e| e.to_string())? {
            Value::Array(a) => a,
            Value::Null => return Err("forEach.items: no such value".into()),
            other => {
                return Err(format!("forEach.items: an array is needed, not {}", kind(&other)));
            }
        };
        if items.len() > each.max_items {
            return Err(format!(
                "forEach.items: {} elements; at most {} (forEach.maxItems)",
                items.len(),
                each.max_items
            ));
        }
        let mut inputs = Vec::with_capacity(items.len());
        for (k, item) in items.iter().enumerate() {
            let index = Value::from(k);
            let input = self.input(
                i,
                &PipelineScope {
                    args: self.args,
                    steps: done,
                    each: Some((item, &index)),
                },
            )?;
            // Every run's arguments are held until it runs: they count as kept results do,
            // each as it is made, so that a large one repeated fails before the next.
            if !Budget::take(&self.budget.bytes, approx_size(&input)) {
                return Err(format!(
                    "the arguments of its runs, with the results this call keeps, exceed {} MiB (at element {k})",
                    MAX_KEPT_BYTES >> 20
                ));
            }
            inputs.push(input);
        }
        Ok(inputs)
    }

    /// Runs the step's tool with `input`, again after a failure while `retry` allows.
    async fn attempts(&self, i: usize, tool: usize, input: Value) -> Outcome {
        let step = &self.steps[i];
        let (tries, mut wait) = step
            .retry
            .map_or((1, std::time::Duration::ZERO), |r| (r.attempts, r.backoff));
        let mut attempt = 1;
        loop {
            let (out, retriable) = self.once(i, tool, input.clone()).await;
            if !out.is_error {
                return Outcome::Done(out);
            }
            if let Some(answer) = self.answer(i, tool, &out) {
                return match answer {
                    OnAnswer::Fail => self.failed(i, &out),
                    OnAnswer::Skip => Outcome::Skipped,
                    OnAnswer::End => Outcome::End(ToolOutput {
                        is_error: false,
                        ..out
                    }),
                };
            }
            if !retriable {
                // Refused before it ran (its arguments, a policy, the call's bounds).
                return self.fail(i, &out.text);
            }
            if attempt >= tries {
                return self.failed(i, &out);
            }
            attempt += 1;
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_BACKOFF);
        }
    }

    fn failed(&self, i: usize, out: &ToolOutput) -> Outcome {
        Outcome::Failed(ToolOutput::error(format!(
            "step {i} ({}) failed: {}",
            self.name(i),
            out.text
        )))
    }

    /// What the step's `onDecline` / `onCancel` says of a form the user did not fill in
    /// (`None`: the error is not such an answer).
    fn answer(&self, i: usize, tool: usize, out: &ToolOutput) -> Option<OnAnswer> {
        if !matches!(
            self.snap.tools[tool].def.handler,
            CompiledHandler::Elicit(_) | CompiledHandler::Ask(_)
        ) {
            return None;
        }
        let step = &self.steps[i];
        match out.structured.as_ref()?.get("action")?.as_str()? {
            "decline" => Some(step.on_decline),
            "cancel" => Some(step.on_cancel),
            _ => None,
        }
    }

    /// One run of the step's tool: its arguments checked and its policies met, exactly as
    /// if the caller had called that tool itself. The flag says whether a failure may be
    /// tried again (the tool's own error, not a refusal).
    async fn once(&self, i: usize, tool: usize, input: Value) -> (ToolOutput, bool) {
        let t = &self.snap.tools[tool];
        if !Budget::take(&self.budget.steps, 1) {
            return (
                ToolOutput::error(format!(
                    "the call ran {MAX_STEPS} steps, the most one call may run"
                )),
                false,
            );
        }
        // Let other requests run, and let a cancelled or timed-out call stop here.
        tokio::task::yield_now().await;
        let mut errs = Vec::new();
        t.def.input.validate(&input, &mut errs);
        if !errs.is_empty() {
            return (
                ToolOutput::error(format!("invalid arguments: {}", errs.join("; "))),
                false,
            );
        }
        if let Some(policies) = &t.policies
            && let Err(denied) = policies.check(&t.def.name, self.cx.caller, Some(&input))
        {
            return (ToolOutput::error(denied.message(&t.def.name)), false);
        }
        // A tool that is not a pipeline holds one of the call's in-flight permits while it
        // runs (a pipeline's own steps take theirs: holding one here could starve them).
        let _permit = match &t.def.handler {
            CompiledHandler::Pipeline(_) => None,
            _ => self.budget.in_flight.acquire().await.ok(),
        };
        let run = self
            .exec
            .run_step(self.snap, tool, input, self.depth + 1, self.budget, self.cx);
        let out = crate::otel::spans::within(crate::otel::spans::step(i, &t.def.name), run, |o| {
            o.is_error.then_some("tool_error")
        })
        .await;
        let (out, verdict) = super::output::guard_output(self.snap, tool, out);
        // What may fail for a while: a request or a program (not a refusal of its result).
        let retriable = matches!(t.def.handler, CompiledHandler::Http(_) | CompiledHandler::Exec(_))
            && verdict.is_none_or(|v| v.action != crate::config::guards::GuardAction::Refuse);
        (out, retriable)
    }
}

/// A finished step as later steps read it.
fn record(out: &ToolOutput) -> Value {
    let mut r = Map::new();
    r.insert("text".into(), Value::String(out.text.clone()));
    r.insert("structured".into(), out.structured.clone().unwrap_or(Value::Null));
    r.insert("skipped".into(), Value::Bool(false));
    Value::Object(r)
}

fn skipped() -> Value {
    let mut r = Map::new();
    r.insert("text".into(), Value::String(String::new()));
    r.insert("structured".into(), Value::Null);
    r.insert("skipped".into(), Value::Bool(true));
    Value::Object(r)
}

/// A `result` step's value as a result: structured when it is an object, its text the
/// value (a string as it is, anything else as JSON).
fn built(v: Value) -> ToolOutput {
    let text = match &v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    ToolOutput {
        structured: v.is_object().then_some(v),
        ..ToolOutput::text(text)
    }
}

/// The runs of a `forEach` step as one result: its text their texts, one per line; its
/// structured content `{items: [...]}`, each run's structured content (or text).
fn gathered(outs: Vec<ToolOutput>) -> ToolOutput {
    let text = outs
        .iter()
        .map(|o| o.text.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let items: Vec<Value> = outs
        .into_iter()
        .map(|o| o.structured.unwrap_or(Value::String(o.text)))
        .collect();
    let mut m = Map::new();
    m.insert("items".into(), Value::Array(items));
    ToolOutput {
        structured: Some(Value::Object(m)),
        ..ToolOutput::text(text)
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The first step of `steps` that may run long (a process, an HTTP request, an upstream call,
/// `builtin: sleep`, a retried step, or a nested pipeline with such a step); `None`: every
/// step answers at once or asks the client. A pipeline that is not a chain may run its
/// steps at once: its first step (0) counts as long, so none runs before the call is a task.
pub fn first_long_step(snap: &Snapshot, steps: &[Step]) -> Option<usize> {
    if !is_chain(steps) {
        return Some(0);
    }
    steps.iter().position(|s| {
        s.retry.is_some()
            || s.tool()
                .is_some_and(|t| crate::registry::may_run_long(&snap.tools, t, 1))
    })
}
