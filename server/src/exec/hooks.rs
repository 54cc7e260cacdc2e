//! Guardrail webhooks on a call ([`crate::config::webhooks`]): the arguments go to each
//! `on: arguments` webhook of the tool before it runs, the result to each `on: result`
//! webhook before it is sent, in declared order. A webhook allows (a mutating one may return
//! the arguments or the result to use instead), refuses, or does not decide (unreachable,
//! slow, an answer that is not a decision), which its `failurePolicy` turns into a refusal
//! (`Fail`) or an allowance (`Ignore`). Tools no webhook picks never come here.
//!
//! The request is OPA's Data API input, `{"input": {...}}`, signed when the webhook has an
//! `hmacSecret`; the answer is read from `{"result": {...}}`, within the webhook's byte bound
//! and time limit.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use serde_json::{Map, Value, json};

use crate::config::webhooks::{FailurePolicy, HookType, Phase, ToolHooks, Webhook};
use crate::peer::CallCtx;
use crate::protocol::output::ToolOutput;
use crate::registry::Tool;

/// Longest reason of a refusal passed on to the caller, in characters.
const MAX_REASON: usize = 512;
/// Shortest signing key accepted (`hmacSecret`), in bytes: 256 bits.
const MIN_KEY_BYTES: usize = 32;

/// What a webhook said about a call.
#[derive(Debug)]
pub(super) enum Decision {
    /// Go on; with a mutating webhook's replacement, if it returned one.
    Allow(Option<Value>),
    /// Refused, with the webhook's reason.
    Deny(String),
    /// It did not decide: why (logged; the caller is told only that it did not).
    Failed(String),
    /// The call is more than the webhook takes (`maxBytes`): refused whatever its
    /// `failurePolicy`, or a caller (or an upstream) could pad its way past an `Ignore` one.
    TooLarge(usize),
}

impl Decision {
    /// The outcome label of `quiver_webhook_requests_total`.
    fn label(&self) -> &'static str {
        match self {
            Self::Allow(None) => "allowed",
            Self::Allow(Some(_)) => "mutated",
            Self::Deny(_) | Self::TooLarge(_) => "denied",
            Self::Failed(_) => "failed",
        }
    }
}

impl super::Executor {
    /// Runs tool `tool` through its webhooks: its arguments first, then (with `run`) the
    /// tool, then its result.
    pub(super) async fn hooked<'a, F>(
        &'a self,
        t: &'a Tool,
        hooks: &'a ToolHooks,
        upstream: Option<&'a str>,
        mut args: Value,
        cx: &'a CallCtx<'a>,
        run: impl FnOnce(Value) -> F,
    ) -> ToolOutput
    where
        F: Future<Output = ToolOutput>,
    {
        for h in &hooks.arguments {
            let input = input(t, upstream, Phase::Arguments, &args, None, cx);
            let d = self.decide(t, h, &input).await;
            if let Err(end) = settle(t, h, Phase::Arguments, d, &mut args, |new| {
                arguments_within(t, new)
            }) {
                return end;
            }
        }
        if hooks.result.is_empty() {
            return run(args).await;
        }
        let mut out = run(args.clone()).await;
        for h in &hooks.result {
            let input = input(t, upstream, Phase::Result, &args, Some(&out), cx);
            let d = self.decide(t, h, &input).await;
            if let Err(end) = settle(t, h, Phase::Result, d, &mut out, output_from) {
                return end;
            }
        }
        out
    }

    /// Asks `h` about a call of `t`, counting the outcome and the time it took.
    async fn decide(&self, t: &Tool, h: &Webhook, input: &Value) -> Decision {
        let start = Instant::now();
        let d = self.ask(h, input).await;
        t.metrics.hooked(&h.name, d.label(), start.elapsed());
        if let Decision::Failed(why) = &d {
            tracing::warn!(webhook = %h.name, tool = %t.def.name, error = %why, "a guardrail webhook did not decide");
        }
        d
    }

    /// One request to `h` with `input`, within its time limit and byte bound.
    async fn ask(&self, h: &Webhook, input: &Value) -> Decision {
        if input["phase"] == "result" && input["result"].is_null() {
            return Decision::Failed("the result could not be read back to be sent (nested too deep)".into());
        }
        let body = match serde_json::to_vec(&json!({ "input": input })) {
            Ok(b) if b.len() <= h.max_bytes => b,
            Ok(b) => return Decision::TooLarge(b.len()),
            Err(e) => return Decision::Failed(e.to_string()),
        };
        if let Some(why) = self.secrets.unavailable(&h.secrets) {
            return Decision::Failed(why);
        }
        let values = self.secrets.snapshot();
        let mut req = http::Request::post(h.url.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, crate::net::http::USER_AGENT);
        if let Some(key) = &h.hmac {
            let secret = match crate::spec::context::value_in(&values, key) {
                Ok(s) if s.len() >= MIN_KEY_BYTES => s,
                Ok(_) => {
                    return Decision::Failed(format!(
                        "{key} is shorter than {MIN_KEY_BYTES} bytes: not a signing key"
                    ));
                }
                Err(e) => return Decision::Failed(e),
            };
            req = req.header(
                "x-quiver-signature",
                signature(secret.as_bytes(), unix_now(), &body),
            );
        }
        let req = match req.body(Full::new(Bytes::from(body))) {
            Ok(r) => r,
            Err(e) => return Decision::Failed(e.to_string()),
        };
        let exchange = async {
            let resp = self.http.send(req, h.tls.as_ref(), &values).await?;
            if !resp.status().is_success() {
                return Err(format!("answered HTTP {}", resp.status().as_u16()));
            }
            Limited::new(resp.into_body(), h.max_bytes)
                .collect()
                .await
                .map(|b| -> Bytes { b.to_bytes() })
                .map_err(|e| {
                    format!(
                        "reading the answer: {e} (at most maxBytes, {} bytes)",
                        h.max_bytes
                    )
                })
        };
        let bytes = match tokio::time::timeout(h.timeout, exchange).await {
            Err(_) => return Decision::Failed(format!("no answer within {:?}", h.timeout)),
            Ok(Err(e)) => return Decision::Failed(e),
            Ok(Ok(b)) => b,
        };
        decision(h, &bytes)
    }
}

/// What webhook `h`'s decision `d` about the value of phase `on` (the arguments, or the
/// result) does: the value kept or rewritten (`fit` checks a rewrite) and the call goes on,
/// or the call ends with `Err`.
fn settle<T>(
    t: &Tool,
    h: &Webhook,
    on: Phase,
    d: Decision,
    value: &mut T,
    fit: impl FnOnce(Value) -> Result<T, String>,
) -> Result<(), ToolOutput> {
    let ended = match on {
        Phase::Arguments => "refused",
        Phase::Result => "result withheld",
    };
    match d {
        Decision::Allow(None) => Ok(()),
        Decision::Allow(Some(new)) => match fit(new) {
            Ok(v) => {
                *value = v;
                Ok(())
            }
            Err(why) => {
                tracing::warn!(webhook = %h.name, tool = %t.def.name, phase = ?on, error = %why, "a mutating guardrail webhook answered a value that does not fit");
                failed(h, on).map_or(Ok(()), Err)
            }
        },
        Decision::Deny(reason) => Err(ToolOutput::error(format!(
            "{ended} by guardrail `{}`: {reason}",
            h.name
        ))),
        Decision::TooLarge(n) => Err(ToolOutput::error(format!(
            "{ended}: {} a request of {n} bytes, more than guardrail `{}` accepts ({})",
            match on {
                Phase::Arguments => "the call's arguments make",
                Phase::Result => "it makes",
            },
            h.name,
            h.max_bytes
        ))),
        Decision::Failed(_) => failed(h, on).map_or(Ok(()), Err),
    }
}

/// The refusal of a call (or the withheld result) whose webhook did not decide under
/// `failurePolicy: Fail`; `None` under `Ignore` (the call goes on). Why it did not decide is
/// in the server's log (it may name internal hosts, TLS settings or Secrets), not here.
fn failed(h: &Webhook, on: Phase) -> Option<ToolOutput> {
    match h.failure_policy {
        FailurePolicy::Ignore => None,
        FailurePolicy::Fail => Some(ToolOutput::error(match on {
            Phase::Arguments => format!("guardrail `{}` did not decide; the call was not made", h.name),
            Phase::Result => format!("guardrail `{}` did not decide; the result was withheld", h.name),
        })),
    }
}

/// Reads a webhook's answer: `{"result": {"allowed": BOOL, "reason": TEXT, "arguments":
/// OBJECT, "result": CallToolResult}}`. A replacement counts only from a mutating webhook.
pub(super) fn decision(h: &Webhook, bytes: &[u8]) -> Decision {
    let Ok(Value::Object(mut answer)) = serde_json::from_slice::<Value>(bytes) else {
        return Decision::Failed("the answer is not a JSON object".into());
    };
    let Some(Value::Object(mut result)) = answer.remove("result") else {
        return Decision::Failed(
            "the answer has no `result` object (for OPA: the rule is undefined for this input)".into(),
        );
    };
    let Some(allowed) = result.get("allowed").and_then(Value::as_bool) else {
        return Decision::Failed("the answer's `result.allowed` is not a boolean".into());
    };
    if !allowed {
        let reason = result
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("no reason given");
        let reason: String = reason
            .chars()
            .take(MAX_REASON)
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        return Decision::Deny(reason);
    }
    let replacement = match (h.kind, h.on) {
        (HookType::Validating, _) => None,
        (HookType::Mutating, Phase::Arguments) => result.remove("arguments"),
        (HookType::Mutating, Phase::Result) => result.remove("result"),
    };
    Decision::Allow(replacement.filter(|v| !v.is_null()))
}

/// The webhook's `input`: the phase, the tool (its name, its upstream), the arguments, the
/// result (`on: result`) and the caller (its subject, client, issuer, groups and scopes;
/// `null` without credentials).
fn input(
    t: &Tool,
    upstream: Option<&str>,
    on: Phase,
    args: &Value,
    out: Option<&ToolOutput>,
    cx: &CallCtx<'_>,
) -> Value {
    let mut m = Map::new();
    let phase = match on {
        Phase::Arguments => "arguments",
        Phase::Result => "result",
    };
    m.insert("phase".into(), json!(phase));
    m.insert("tool".into(), json!({"name": t.def.name, "upstream": upstream}));
    m.insert("arguments".into(), args.clone());
    if let Some(o) = out {
        let mut buf = Vec::with_capacity(256);
        o.write_json(&mut buf);
        // A result too deep to read back is `null`: `ask` refuses to send it.
        m.insert(
            "result".into(),
            serde_json::from_slice(&buf).unwrap_or(Value::Null),
        );
    }
    let caller = cx.caller.map(|p| {
        json!({
            "subject": if p.identity.sub.is_empty() { &p.subject } else { &p.identity.sub },
            "clientId": p.identity.client_id,
            "issuer": p.identity.issuer,
            "groups": p.groups,
            "scopes": p.scopes,
        })
    });
    m.insert("caller".into(), caller.unwrap_or(Value::Null));
    Value::Object(m)
}

/// A mutating webhook's arguments, checked against the tool's input schema as a client's
/// would be.
fn arguments_within(t: &Tool, new: Value) -> Result<Value, String> {
    let mut errs = Vec::new();
    t.def.input.validate(&new, &mut errs);
    if errs.is_empty() {
        Ok(new)
    } else {
        Err(format!(
            "its arguments do not fit the tool's input schema: {}",
            errs.join("; ")
        ))
    }
}

/// A mutating webhook's result: a `CallToolResult` (`content` blocks, optional
/// `structuredContent` and `isError`); the output schema and result guards still apply.
fn output_from(v: Value) -> Result<ToolOutput, String> {
    let Value::Object(mut m) = v else {
        return Err("its `result` is not a CallToolResult object".into());
    };
    let Some(Value::Array(blocks)) = m.remove("content") else {
        return Err("its `result.content` is not an array of content blocks".into());
    };
    if let Some(bad) = blocks.iter().position(|b| !block_shape(b)) {
        return Err(format!("its `result.content[{bad}]` is not a content block"));
    }
    let text: String = blocks
        .iter()
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n");
    Ok(ToolOutput {
        text,
        structured: m.remove("structuredContent").filter(|s| !s.is_null()),
        content: Some(blocks),
        is_error: m.get("isError").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// Whether `b` has the fields its `type` needs: `text`; `data` and `mimeType`; `uri` and
/// `name`; `resource` with a `uri`.
fn block_shape(b: &Value) -> bool {
    let s = |k: &str| b.get(k).is_some_and(Value::is_string);
    match b.get("type").and_then(Value::as_str) {
        Some("text") => s("text"),
        Some("image" | "audio") => s("data") && s("mimeType"),
        Some("resource_link") => s("uri") && s("name"),
        Some("resource") => b["resource"].get("uri").is_some_and(Value::is_string),
        _ => false,
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
}

/// `t=UNIX_SECONDS,v1=HEX`: HMAC-SHA256 with `key` over `UNIX_SECONDS.BODY`.
pub(super) fn signature(key: &[u8], t: u64, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let mut ctx = ring::hmac::Context::with_key(&key);
    ctx.update(t.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    let tag = ctx.sign();
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("t={t},v1={hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(yaml: &str) -> std::sync::Arc<Webhook> {
        let specs: Vec<crate::config::webhooks::WebhookSpec> = serde_saphyr::from_str(yaml).unwrap();
        let mut p = crate::spec::context::Problems(Vec::new());
        let set = crate::config::webhooks::compile(&specs, &mut p);
        assert!(
            p.0.is_empty(),
            "{:?}",
            p.0.iter().map(ToString::to_string).collect::<Vec<_>>()
        );
        set.hooks[0].clone()
    }

    #[test]
    fn answers_are_read_as_opa_data_api_results() {
        let v = hook("[{name: v, url: 'https://x/'}]");
        let m = hook("[{name: m, url: 'https://x/', type: mutating}]");
        assert!(matches!(
            decision(&v, br#"{"result": {"allowed": true}}"#),
            Decision::Allow(None)
        ));
        // A validating webhook's replacement is not taken.
        assert!(matches!(
            decision(&v, br#"{"result": {"allowed": true, "arguments": {"a": 1}}}"#),
            Decision::Allow(None)
        ));
        assert!(matches!(
            decision(&m, br#"{"result": {"allowed": true, "arguments": {"a": 1}}}"#),
            Decision::Allow(Some(_))
        ));
        match decision(
            &v,
            b"{\"result\": {\"allowed\": false, \"reason\": \"prod is off limits\\nFORGED\"}}",
        ) {
            Decision::Deny(r) => assert_eq!(r, "prod is off limits FORGED"),
            d => panic!("{d:?}"),
        }
        for bad in [
            &b"{}"[..],
            b"[]",
            b"not json",
            br#"{"result": {"allowed": "yes"}}"#,
            br#"{"result": true}"#,
        ] {
            assert!(
                matches!(decision(&v, bad), Decision::Failed(_)),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_signature_covers_the_time_and_the_body() {
        let a = signature(b"k", 1_800_000_000, b"{}");
        assert!(
            a.starts_with("t=1800000000,v1=") && a.len() == "t=1800000000,v1=".len() + 64,
            "{a}"
        );
        assert_ne!(a, signature(b"k", 1_800_000_001, b"{}"));
        assert_ne!(a, signature(b"k", 1_800_000_000, b"{ }"));
        assert_ne!(a, signature(b"j", 1_800_000_000, b"{}"));
    }

    #[test]
    fn a_mutated_result_must_be_a_call_tool_result() {
        let out = output_from(json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "isError": false})).unwrap();
        assert_eq!(out.text, "a\nb");
        assert!(output_from(json!({"content": "x"})).is_err());
        assert!(output_from(json!({"content": [{"type": "text"}]})).is_err());
        assert!(output_from(json!({"content": [{"type": "image", "data": "AAAA"}]})).is_err());
        assert!(output_from(json!({"content": [{"text": "no type"}]})).is_err());
        assert!(output_from(json!("x")).is_err());
    }
}
