//! The `pipeline` handler's declaration: steps that call other tools of the ToolSet (or
//! build a result from earlier steps), in order or as a graph of dependencies, each
//! optionally conditional (`when`), repeated over an array (`forEach`), retried (`retry`).
//! Compiled, with the checks that need every tool, by [`crate::config::pipelines`].

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::json_field;
use crate::spec::shared::LogLevel;

/// Pipelines may nest at most this deep (a pipeline whose step is a pipeline is 2 deep).
pub const MAX_PIPELINE_NESTING: usize = 16;

/// One call of a pipeline may run at most this many steps, nested pipelines' steps, each
/// element of a `forEach` and each retry included.
pub const MAX_PIPELINE_STEPS: usize = 10_000;

/// Most steps of one pipeline.
pub const MAX_STEPS_PER_PIPELINE: usize = 256;

/// Largest `forEach.maxItems`.
pub const MAX_FOR_EACH_ITEMS: u32 = 1000;

/// Default `forEach.maxItems`.
pub const DEFAULT_FOR_EACH_ITEMS: u32 = 100;

/// Largest `forEach.maxParallel`.
pub const MAX_PARALLEL: u32 = 64;

/// Most attempts of a retried step (the first one included).
pub const MAX_ATTEMPTS: u32 = 10;

/// Longest wait before a retry.
pub const MAX_BACKOFF: std::time::Duration = std::time::Duration::from_secs(30);

/// One step of a pipeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PipelineStep {
    /// A name for the step (1-63 of `a-z 0-9 _ -`, starting with a letter): `needs` of
    /// other steps names it, and templates and conditions read its result as `steps.ID`
    /// (as well as by its number, `steps.N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Name of another tool of this ToolSet. Exclusive with `result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// Instead of a tool, a value built from the arguments and earlier steps (a JSON
    /// template, as `input`): the step's structured result (its text is the value as
    /// JSON). The last step's result is the pipeline's, checked against its `outputSchema`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "json_field::optional"
    )]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub result: Option<Value>,
    /// Arguments for that tool (JSON template over the pipeline's arguments and
    /// `steps.N.text` / `steps.N.structured`, and `item` and `index` under `forEach`).
    /// Omitted: the pipeline's own arguments.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "json_field::optional"
    )]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub input: Option<Value>,
    /// Steps (by `id`) that must finish before this one starts. Once a step of the pipeline
    /// has `needs`, the steps form a graph: a step starts as soon as those it needs are
    /// done, steps without `needs` at once, and independent steps run at the same time.
    /// Without `needs` anywhere, each step follows the one before. A cycle is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub needs: Vec<String>,
    /// Runs the step only when this holds: an expression in the language of `policies`
    /// (CEL) over `args`, `caller`, `tool` and `steps` (the results of the steps it needs),
    /// e.g. `size(steps.search.structured.items) > 0`. Otherwise the step is skipped: its
    /// text is empty and `steps.ID.skipped` is true. An expression that cannot be decided
    /// fails the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Runs the step once per element of an array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<ForEachSpec>,
    /// Tries the step again when its tool answers with an error (an unreachable service, a
    /// timeout): for tools that may be run twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// What a declined form does, when the step's tool asks the user (`elicit`, `ask`):
    /// `fail` (the default: the pipeline fails), `skip` (the step is skipped), or `end`
    /// (the pipeline ends here, successfully, with the step's answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_decline: Option<OnAnswer>,
    /// What a cancelled form does, as `onDecline`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_cancel: Option<OnAnswer>,
    /// A log message sent to the client (`notifications/message`) as the step starts: a
    /// template over the pipeline's arguments and earlier steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// Level of `log` (default `info`); clients choose the least severe level they receive
    /// with `logging/setLevel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<LogLevel>,
}

/// A step run once per element of an array. Its result: the runs' texts, one per line, and
/// as structured content `{items: [...]}`, each run's structured content (or its text), in
/// the array's order. The first run that fails fails the step (the others are stopped).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForEachSpec {
    /// The array: a template that is exactly one value, e.g.
    /// `"{{steps.list.structured.items}}"` or `"{{ids}}"`. Each run's `input` reads the
    /// element as `item` and its position as `index`.
    pub items: String,
    /// At most this many runs at the same time (default 1, at most 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub max_parallel: Option<u32>,
    /// At most this many elements (default 100, at most 1000); a longer array fails the
    /// step. It bounds the steps one call may run, which is checked when the config loads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_items: Option<u32>,
}

/// Retries of a step whose tool answered with an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts in all, the first one included (2-10).
    #[schemars(range(min = 2, max = 10))]
    pub attempts: u32,
    /// Wait before the first retry (default `200ms`), doubled before each next one, at
    /// most 30s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
}

/// What a step that asked the user does with a declined or cancelled form.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnAnswer {
    /// The pipeline fails with the step's error.
    #[default]
    Fail,
    /// The step is skipped; the steps that need it run.
    Skip,
    /// The pipeline ends here, successfully, with the step's answer.
    End,
}
