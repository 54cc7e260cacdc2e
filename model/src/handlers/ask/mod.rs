//! The handlers that ask the client: `sample` (the client's model, `sampling/createMessage`),
//! `elicit` (the user, `elicitation/create`) and `ask` (several questions at once, also the
//! client's roots; under protocol 2026-07-28 one `InputRequiredResult`). Prompts ask with
//! the same questions.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::schema::Schema;
use crate::spec::checks::shallow;
use crate::spec::context::{Cx, Names, Problems, checked_template};
use crate::spec::json_field;
use crate::template::{Authored, Template};

/// One question of an `ask` handler: exactly one of `sample`, `elicit`, `roots`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuestionSpec {
    /// Ask the client's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<SampleSpec>,
    /// Ask the user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elicit: Option<ElicitSpec>,
    /// Ask for the client's roots (`roots/list`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roots: Option<RootsSpec>,
    /// Skip the question (its answer is `null`) when the client did not declare the
    /// capability, instead of failing the call.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// A `roots/list` request (it has no parameters).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RootsSpec {}

/// A `sampling/createMessage` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SampleSpec {
    /// The user message: a template over the arguments.
    pub prompt: String,
    /// System prompt (a template over the arguments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// Most tokens the model may produce (1 to 1,000,000).
    pub max_tokens: u64,
    /// Name of the request in a 2026-07-28 `InputRequiredResult` (letters, digits, `_`, `-`,
    /// `.`; at most 64). Default: numbered in asking order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// An `elicitation/create` request (form mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ElicitSpec {
    /// What the user is asked: a template over the arguments.
    pub message: String,
    /// The form: an object JSON Schema whose properties are strings (optionally enums),
    /// numbers, integers, booleans or arrays of enum strings. The answer is checked against it.
    #[serde(deserialize_with = "json_field::required")]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub schema: Value,
    /// Name of the request in a 2026-07-28 `InputRequiredResult` (letters, digits, `_`, `-`,
    /// `.`; at most 64). Default: numbered in asking order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Most questions one `ask` handler asks.
pub const MAX_QUESTIONS: usize = 16;

/// Longest key of a question.
pub const MAX_QUESTION_KEY: usize = 64;

/// A compiled question of an `ask` handler.
#[derive(Debug)]
pub struct Question {
    /// Its name (the `InputRequiredResult` key, and the key of its answer in the result).
    pub key: String,
    /// What is asked.
    pub kind: QuestionKind,
    /// Skipped when the client cannot answer it.
    pub optional: bool,
}

/// What a question asks.
#[derive(Debug)]
pub enum QuestionKind {
    /// The client's model.
    Sample(SampleCall),
    /// The user.
    Elicit(Box<ElicitCall>),
    /// The client's roots.
    Roots,
}

/// A compiled `sample` handler.
#[derive(Debug)]
pub struct SampleCall {
    /// The user message.
    pub prompt: Template,
    /// The system prompt.
    pub system_prompt: Option<Template>,
    /// Token cap.
    pub max_tokens: u64,
    /// Name of the request under 2026-07-28 (`None`: numbered).
    pub key: Option<String>,
}

/// A compiled `elicit` handler.
#[derive(Debug)]
pub struct ElicitCall {
    /// What the user is asked.
    pub message: Template,
    /// The requested schema, as sent.
    pub schema: Value,
    /// The same, compiled to check the answer.
    pub check: Schema,
    /// Name of the request under 2026-07-28 (`None`: numbered).
    pub key: Option<String>,
}

/// Most tokens a `sample` handler may ask for.
pub const MAX_SAMPLE_TOKENS: u64 = 1_000_000;

/// Property types an elicitation form may ask for.
const FORM_TYPES: [&str; 5] = ["string", "number", "integer", "boolean", "array"];

/// Compiles a template and checks the names it uses; problems are reported under `path`.
/// Whether `key` may name a question: 1 to 64 letters, digits, `_`, `-`, `.`.
fn valid_key(key: &str) -> bool {
    (1..=MAX_QUESTION_KEY).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn check_key(key: Option<&String>, path: &str, p: &mut Problems) -> Option<String> {
    let k = key?;
    if !valid_key(k) {
        p.push(path, "must be 1 to 64 letters, digits, `_`, `-` or `.`");
    }
    Some(k.clone())
}

pub fn sample_call(spec: &SampleSpec, at: &str, names: &Names<'_>, p: &mut Problems) -> SampleCall {
    let prompt = checked_template(Authored::new(&spec.prompt), &format!("{at}.prompt"), names, p);
    let system_prompt = spec
        .system_prompt
        .as_deref()
        .and_then(|s| checked_template(Authored::new(s), &format!("{at}.systemPrompt"), names, p));
    if !(1..=MAX_SAMPLE_TOKENS).contains(&spec.max_tokens) {
        p.push(
            format!("{at}.maxTokens"),
            format!("must be 1 to {MAX_SAMPLE_TOKENS}"),
        );
    }
    SampleCall {
        prompt: prompt.unwrap_or_else(Template::empty),
        system_prompt,
        max_tokens: spec.max_tokens,
        key: check_key(spec.key.as_ref(), &format!("{at}.key"), p),
    }
}

pub fn elicit_call(spec: &ElicitSpec, at: &str, names: &Names<'_>, p: &mut Problems) -> ElicitCall {
    let message = checked_template(Authored::new(&spec.message), &format!("{at}.message"), names, p);
    let shallow_ok = shallow(&spec.schema, &format!("{at}.schema"), p);
    if spec.schema.get("type").and_then(Value::as_str) != Some("object") {
        p.push(
            format!("{at}.schema.type"),
            "a form schema must have `type: object`",
        );
    }
    match spec.schema.get("properties").and_then(Value::as_object) {
        Some(props) if !props.is_empty() => {
            for (k, v) in props {
                let ty = v.get("type").and_then(Value::as_str);
                if !ty.is_some_and(|t| FORM_TYPES.contains(&t)) {
                    p.push(
                        format!("{at}.schema.properties.{k}.type"),
                        "must be string, number, integer, boolean or array (forms are flat)",
                    );
                }
            }
        }
        _ => p.push(format!("{at}.schema.properties"), "must list at least one field"),
    }
    let check = if shallow_ok {
        Schema::compile(&spec.schema)
            .map_err(|errs| p.nested(&format!("{at}.schema"), errs))
            .unwrap_or_default()
    } else {
        Schema::default()
    };
    ElicitCall {
        message: message.unwrap_or_else(Template::empty),
        schema: spec.schema.clone(),
        check,
        key: check_key(spec.key.as_ref(), &format!("{at}.key"), p),
    }
}

pub fn questions(
    questions: &BTreeMap<String, QuestionSpec>,
    at: &str,
    names: &Names<'_>,
    p: &mut Problems,
) -> Vec<Question> {
    if questions.is_empty() {
        p.push(at, "must ask at least one question");
    }
    if questions.len() > MAX_QUESTIONS {
        p.push(at, format!("may ask at most {} questions", MAX_QUESTIONS));
    }
    let mut out = Vec::with_capacity(questions.len());
    for (key, q) in questions.iter().take(MAX_QUESTIONS) {
        let qat = format!("{at}.{key}");
        if !valid_key(key) {
            p.push(
                &qat,
                "a question's key must be 1 to 64 letters, digits, `_`, `-` or `.`",
            );
        }
        let set = usize::from(q.sample.is_some())
            + usize::from(q.elicit.is_some())
            + usize::from(q.roots.is_some());
        if set != 1 {
            p.push(&qat, "must have exactly one of `sample`, `elicit`, `roots`");
            continue;
        }
        let own_key = q
            .sample
            .as_ref()
            .and_then(|s| s.key.as_ref())
            .or_else(|| q.elicit.as_ref().and_then(|e| e.key.as_ref()));
        if own_key.is_some() {
            p.push(
                &qat,
                "a question of `ask` is named by its map key; drop its `key`",
            );
        }
        let kind = if let Some(s) = &q.sample {
            QuestionKind::Sample(sample_call(s, &format!("{qat}.sample"), names, p))
        } else if let Some(e) = &q.elicit {
            QuestionKind::Elicit(Box::new(elicit_call(e, &format!("{qat}.elicit"), names, p)))
        } else {
            QuestionKind::Roots
        };
        out.push(Question {
            key: key.clone(),
            kind,
            optional: q.optional,
        });
    }
    out
}

/// Compiles a `sample` spec.
pub fn compile_sample(spec: &SampleSpec, cx: &mut Cx<'_>) -> SampleCall {
    sample_call(spec, &cx.at, cx.names, cx.p)
}

/// Compiles an `elicit` spec.
pub fn compile_elicit(spec: &ElicitSpec, cx: &mut Cx<'_>) -> ElicitCall {
    elicit_call(spec, &cx.at, cx.names, cx.p)
}

/// Compiles an `ask` spec.
pub fn compile(asked: &BTreeMap<String, QuestionSpec>, cx: &mut Cx<'_>) -> Vec<Question> {
    questions(asked, &cx.at, cx.names, cx.p)
}
