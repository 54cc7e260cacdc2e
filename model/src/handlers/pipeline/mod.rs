//! The `pipeline` handler: other tools of the ToolSet, run in order; each step's input is a
//! template over the arguments and the results of the steps before it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::checks::shallow;
use crate::spec::context::{Cx, Names, check_template, checked_template};
use crate::spec::json_field;
use crate::spec::shared::LogLevel;
use crate::template::{JsonTemplate, Template};

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
pub fn compile(steps: &[PipelineStep], cx: &mut Cx<'_>) -> Vec<Step> {
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
            let jt = JsonTemplate::compile(crate::template::Authored::json(v))
                .map_err(|e| p.push(format!("{sp}.input"), e))
                .ok()?;
            for t in jt.templates() {
                check_template(t, &step_names, &format!("{sp}.input"), p);
            }
            Some(jt)
        });
        let log = s.log.as_ref().and_then(|src| {
            let t = checked_template(
                crate::template::Authored::new(src),
                &format!("{sp}.log"),
                &step_names,
                p,
            )?;
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
