//! The `sample` and `elicit` handlers: a request to the client (the model, or the user) whose
//! answer is the tool's result. They need a client that declared the capability and a
//! transport that can carry the request (a single request in a session; not a batch).

use serde_json::{Value, json};

use super::ToolOutput;
use crate::config::{ElicitCall, SampleCall};
use crate::peer::CallCtx;

fn rendered(t: &crate::template::Template, args: &Value, what: &str) -> Result<String, ToolOutput> {
    t.render(args)
        .map_err(|e| ToolOutput::error(format!("{what}: {e}")))
}

/// `sampling/createMessage`: the result's text is the model's text answer; the structured
/// content is `{model, stopReason, role, text}`.
pub async fn sample(spec: &SampleCall, args: &Value, cx: &CallCtx<'_>) -> ToolOutput {
    if cx.caps.is_some_and(|c| !c.sampling) {
        return ToolOutput::error(
            "this tool asks the client's model (sampling/createMessage), and the client did not declare the sampling capability",
        );
    }
    let prompt = match rendered(&spec.prompt, args, "prompt") {
        Ok(p) => p,
        Err(e) => return e,
    };
    let mut params = json!({
        "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
        "maxTokens": spec.max_tokens,
    });
    if let Some(s) = &spec.system_prompt {
        match rendered(s, args, "systemPrompt") {
            Ok(s) => params["systemPrompt"] = s.into(),
            Err(e) => return e,
        }
    }
    let answer = match cx.request("sampling/createMessage", params).await {
        Ok(a) => a,
        Err(e) => return ToolOutput::error(format!("sampling failed: {e}")),
    };
    // `content` is one block, or (2025-11-25) an array of blocks.
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
        return ToolOutput::error("the client's model answered without text content");
    }
    let text = text.join("\n");
    ToolOutput {
        structured: Some(json!({
            "model": answer.get("model").cloned().unwrap_or(Value::Null),
            "stopReason": answer.get("stopReason").cloned().unwrap_or(Value::Null),
            "role": answer.get("role").cloned().unwrap_or(Value::Null),
            "text": text,
        })),
        ..ToolOutput::text(text)
    }
}

/// `elicitation/create`: an accepted answer (checked against the form's schema) is the
/// structured content `{action, content}`; a declined or cancelled one is a tool error, so a
/// pipeline stops there.
pub async fn elicit(spec: &ElicitCall, args: &Value, cx: &CallCtx<'_>) -> ToolOutput {
    if cx.caps.is_some_and(|c| !c.elicitation) {
        return ToolOutput::error(
            "this tool asks the user (elicitation/create), and the client did not declare the elicitation capability",
        );
    }
    let message = match rendered(&spec.message, args, "message") {
        Ok(m) => m,
        Err(e) => return e,
    };
    let params = json!({"mode": "form", "message": message, "requestedSchema": spec.schema});
    let answer = match cx.request("elicitation/create", params).await {
        Ok(a) => a,
        Err(e) => return ToolOutput::error(format!("elicitation failed: {e}")),
    };
    let action = answer.get("action").and_then(Value::as_str).unwrap_or("");
    match action {
        "accept" => {
            let content = answer.get("content").cloned().unwrap_or_else(|| json!({}));
            let mut errs = Vec::new();
            spec.check.validate(&content, &mut errs);
            if !errs.is_empty() {
                return ToolOutput::error(format!(
                    "the user's answer does not match the form: {}",
                    errs.join("; ").replace("arguments", "answer")
                ));
            }
            let text = format!("action=accept, content={content}");
            ToolOutput {
                structured: Some(json!({"action": "accept", "content": content})),
                ..ToolOutput::text(text)
            }
        }
        "decline" | "cancel" => ToolOutput {
            structured: Some(json!({"action": action})),
            ..ToolOutput::error(format!("the user did not answer (action={action})"))
        },
        other => ToolOutput::error(format!(
            "the client answered elicitation/create with an unknown action `{}`",
            other.chars().take(32).collect::<String>()
        )),
    }
}
