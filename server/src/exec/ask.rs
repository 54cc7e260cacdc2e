//! The `sample`, `elicit` and `ask` handlers: questions to the client (its model, the user,
//! its roots) whose answers make the tool's result. Before protocol 2026-07-28 each question
//! is a request sent to the client during the call (a single request in a session, not a
//! batch); under 2026-07-28 the call answers with an `InputRequiredResult` listing the
//! questions and completes when the client retries with the answers (see [`CallCtx::ask`]).

use serde_json::{Map, Value, json};

use crate::handlers::ask::{ElicitCall, Question, QuestionKind, SampleCall};
use crate::peer::{Asked, CallCtx, Need};
use crate::protocol::output::ToolOutput;

/// The output of a call stopped for input (2026-07-28). Dispatch answers with the
/// `InputRequiredResult` (or the error) the round gathered instead; this never reaches a
/// client, and as a tool error it stops a pipeline at the question.
fn stopped() -> ToolOutput {
    ToolOutput::error("the call needs input from the client")
}

fn rendered(t: &crate::template::Template, args: &Value, what: &str) -> Result<String, String> {
    t.render(args).map_err(|e| format!("{what}: {e}"))
}

fn sample_params(spec: &SampleCall, args: &Value) -> Result<Value, String> {
    let prompt = rendered(&spec.prompt, args, "prompt")?;
    let mut params = json!({
        "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
        "maxTokens": spec.max_tokens,
    });
    if let Some(s) = &spec.system_prompt {
        params["systemPrompt"] = rendered(s, args, "systemPrompt")?.into();
    }
    Ok(params)
}

fn elicit_params(spec: &ElicitCall, args: &Value) -> Result<Value, String> {
    let message = rendered(&spec.message, args, "message")?;
    Ok(json!({"mode": "form", "message": message, "requestedSchema": spec.schema}))
}

/// The model's answer as `{model, stopReason, role, text}` and its text.
fn sampled(answer: &Value) -> Result<(Value, String), String> {
    // `content` is one block, or (2025-11-25 on) an array of blocks.
    let blocks = match answer.get("content") {
        Some(Value::Array(a)) => a.iter().collect(),
        Some(b) => vec![b],
        None => Vec::new(),
    };
    let text: Vec<&str> = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    if text.is_empty() {
        return Err("the client's model answered without text content".to_owned());
    }
    let text = text.join("\n");
    let structured = json!({
        "model": answer.get("model").cloned().unwrap_or(Value::Null),
        "stopReason": answer.get("stopReason").cloned().unwrap_or(Value::Null),
        "role": answer.get("role").cloned().unwrap_or(Value::Null),
        "text": text,
    });
    Ok((structured, text))
}

/// The user's answer: `Ok({action, content})` for an accepted answer that matches the form,
/// `Err((structured, message))` for a declined, cancelled or invalid one.
fn elicited(spec: &ElicitCall, answer: &Value) -> Result<Value, (Option<Value>, String)> {
    let action = answer.get("action").and_then(Value::as_str).unwrap_or("");
    match action {
        "accept" => {
            let content = answer.get("content").cloned().unwrap_or_else(|| json!({}));
            let mut errs = Vec::new();
            spec.check.validate(&content, &mut errs);
            if errs.is_empty() {
                Ok(json!({"action": "accept", "content": content}))
            } else {
                Err((
                    None,
                    format!(
                        "the user's answer does not match the form: {}",
                        errs.join("; ").replace("arguments", "answer")
                    ),
                ))
            }
        }
        "decline" | "cancel" => Err((
            Some(json!({"action": action})),
            format!("the user did not answer (action={action})"),
        )),
        other => Err((
            None,
            format!(
                "the client answered elicitation/create with an unknown action `{}`",
                other.chars().take(32).collect::<String>()
            ),
        )),
    }
}

/// `sampling/createMessage`: the result's text is the model's text answer; the structured
/// content is `{model, stopReason, role, text}`.
pub async fn sample(spec: &SampleCall, args: &Value, cx: &CallCtx<'_>) -> ToolOutput {
    let answer = match cx
        .ask(Need::Sampling, spec.key.as_deref(), false, || {
            sample_params(spec, args)
        })
        .await
    {
        Asked::Answer(a) => a,
        Asked::Stop | Asked::Skipped => return stopped(),
        Asked::Failed(e) => return ToolOutput::error(e),
    };
    match sampled(&answer) {
        Ok((structured, text)) => ToolOutput {
            structured: Some(structured),
            ..ToolOutput::text(text)
        },
        Err(e) => ToolOutput::error(e),
    }
}

/// `elicitation/create`: an accepted answer (checked against the form's schema) is the
/// structured content `{action, content}`; a declined or cancelled one is a tool error, so a
/// pipeline stops there.
pub async fn elicit(spec: &ElicitCall, args: &Value, cx: &CallCtx<'_>) -> ToolOutput {
    let answer = match cx
        .ask(Need::Elicitation, spec.key.as_deref(), false, || {
            elicit_params(spec, args)
        })
        .await
    {
        Asked::Answer(a) => a,
        Asked::Stop | Asked::Skipped => return stopped(),
        Asked::Failed(e) => return ToolOutput::error(e),
    };
    match elicited(spec, &answer) {
        Ok(structured) => ToolOutput {
            text: format!("action=accept, content={}", structured["content"]),
            structured: Some(structured),
            content: None,
            is_error: false,
        },
        Err((structured, e)) => ToolOutput {
            structured,
            ..ToolOutput::error(e)
        },
    }
}

/// Several questions: every one is asked (under 2026-07-28 all unanswered ones travel in one
/// `InputRequiredResult`); the structured content maps each key to its answer: `{model,
/// stopReason, role, text}` for the model, `{action, content?}` for the user (a declined form
/// is an answer, not an error), `{roots}` for roots, `null` for a skipped optional question.
/// The text is that object as JSON.
pub async fn ask(questions: &[Question], args: &Value, cx: &CallCtx<'_>) -> ToolOutput {
    let mut answers = Map::new();
    let mut stop = false;
    for q in questions {
        let (need, key) = (
            match &q.kind {
                QuestionKind::Sample(_) => Need::Sampling,
                QuestionKind::Elicit(_) => Need::Elicitation,
                QuestionKind::Roots => Need::Roots,
            },
            Some(q.key.as_str()),
        );
        let params = || match &q.kind {
            QuestionKind::Sample(s) => sample_params(s, args),
            QuestionKind::Elicit(e) => elicit_params(e, args),
            QuestionKind::Roots => Ok(json!({})),
        };
        let value = match cx.ask(need, key, q.optional, params).await {
            Asked::Answer(a) => match &q.kind {
                QuestionKind::Sample(_) => match sampled(&a) {
                    Ok((s, _)) => s,
                    Err(e) => return ToolOutput::error(format!("{}: {e}", q.key)),
                },
                QuestionKind::Elicit(e) => match elicited(e, &a) {
                    Ok(s) => s,
                    Err((Some(s), _)) => s,
                    Err((None, e)) => return ToolOutput::error(format!("{}: {e}", q.key)),
                },
                QuestionKind::Roots => json!({"roots": a.get("roots").cloned().unwrap_or_else(|| json!([]))}),
            },
            Asked::Skipped => Value::Null,
            Asked::Stop => {
                // Keep asking: every unanswered question goes out in the same round.
                stop = true;
                continue;
            }
            Asked::Failed(e) => return ToolOutput::error(format!("{}: {e}", q.key)),
        };
        answers.insert(q.key.clone(), value);
    }
    if stop {
        return stopped();
    }
    let structured = Value::Object(answers);
    ToolOutput {
        text: structured.to_string(),
        structured: Some(structured),
        content: None,
        is_error: false,
    }
}
