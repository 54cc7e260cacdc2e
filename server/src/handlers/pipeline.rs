//! The `pipeline` handler: runs other tools of the same snapshot in order. Each step's
//! input template sees the pipeline's arguments and `steps.N.text` / `steps.N.structured`.

use serde_json::{Map, Value};

use super::{Executor, ToolOutput};
use crate::config::Step;
use crate::registry::Snapshot;
use crate::template::Scope;

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

/// Runs the steps; the first failing step ends the pipeline with its error.
pub async fn run(exec: &Executor, snap: &Snapshot, steps: &[Step], args: Value, depth: usize) -> ToolOutput {
    let mut done = Value::Array(Vec::with_capacity(steps.len()));
    let mut last = ToolOutput::text("");
    for (i, step) in steps.iter().enumerate() {
        let tool = &snap.tools[step.tool];
        let input = match &step.input {
            Some(t) => t.render(&PipelineScope {
                args: &args,
                steps: &done,
            }),
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
        let out = exec.run(snap, step.tool, input, depth + 1).await;
        if out.is_error {
            return ToolOutput::error(format!("step {i} ({}) failed: {}", tool.def.name, out.text));
        }
        let mut record = Map::new();
        record.insert("text".into(), Value::String(out.text.clone()));
        record.insert("structured".into(), out.structured.clone().unwrap_or(Value::Null));
        if let Value::Array(a) = &mut done {
            a.push(Value::Object(record));
        }
        last = out;
    }
    last
}
