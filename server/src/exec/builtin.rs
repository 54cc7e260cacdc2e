//! Built-in tools: small, allocation-light functions useful on their own and as pipeline steps.

use std::time::{Duration, SystemTime};

use serde_json::{Number, Value, json};
use sha2::{Digest, Sha256};

use crate::handlers::builtin::Builtin;
use crate::protocol::output::ToolOutput;

fn text_arg(args: &Value) -> Result<&str, ToolOutput> {
    args.get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| ToolOutput::error("argument `text` (a string) is required"))
}

fn number_result(n: Number) -> ToolOutput {
    ToolOutput {
        text: n.to_string(),
        structured: Some(json!({"result": n})),
        content: None,
        is_error: false,
    }
}

fn arith(args: &Value, int: fn(i64, i64) -> Option<i64>, float: fn(f64, f64) -> f64) -> ToolOutput {
    let (Some(a), Some(b)) = (args.get("a"), args.get("b")) else {
        return ToolOutput::error("arguments `a` and `b` (numbers) are required");
    };
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64())
        && let Some(r) = int(x, y)
    {
        return number_result(r.into());
    }
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => match Number::from_f64(float(x, y)) {
            Some(n) => number_result(n),
            None => ToolOutput::error("the result is not a finite number"),
        },
        _ => ToolOutput::error("arguments `a` and `b` must be numbers"),
    }
}

/// Runs a builtin that never waits.
pub fn run(b: Builtin, args: &Value) -> ToolOutput {
    let text = |f: fn(&str) -> String| match text_arg(args) {
        Ok(t) => ToolOutput::text(f(t)),
        Err(e) => e,
    };
    match b {
        Builtin::Echo => text(str::to_owned),
        Builtin::Upper => text(str::to_uppercase),
        Builtin::Lower => text(str::to_lowercase),
        Builtin::Sha256 => text(|t| {
            let d = Sha256::digest(t.as_bytes());
            d.iter().map(|b| format!("{b:02x}")).collect()
        }),
        Builtin::Length => match text_arg(args) {
            Ok(t) => number_result(t.chars().count().into()),
            Err(e) => e,
        },
        Builtin::Add => arith(args, i64::checked_add, |x, y| x + y),
        Builtin::Multiply => arith(args, i64::checked_mul, |x, y| x * y),
        Builtin::Now => ToolOutput::text(crate::net::time::rfc3339(SystemTime::now())),
        Builtin::Json => ToolOutput {
            text: args.to_string(),
            structured: Some(args.clone()),
            content: None,
            is_error: false,
        },
        Builtin::Sleep => ToolOutput::error("sleep is asynchronous"),
    }
}

/// `sleep`: waits `ms` milliseconds (validated to 0..=60000 by its schema).
pub async fn sleep(args: &Value) -> ToolOutput {
    // The schema accepts any integral number, so `2e3` (a float in JSON terms) is 2000 ms.
    let ms = args
        .get("ms")
        .and_then(|v| {
            v.as_u64().or_else(|| {
                v.as_f64()
                    .filter(|f| f.is_finite() && *f >= 0.0)
                    .map(|f| f as u64)
            })
        })
        .unwrap_or(0)
        .min(60_000);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    ToolOutput::text(format!("slept {ms} ms"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_keeps_integers_and_handles_floats() {
        assert_eq!(
            run(Builtin::Add, &json!({"a": 2, "b": 3})).structured,
            Some(json!({"result": 5}))
        );
        assert_eq!(run(Builtin::Add, &json!({"a": 0.5, "b": 2})).text, "2.5");
        assert_eq!(
            run(Builtin::Multiply, &json!({"a": i64::MAX, "b": 2})).text,
            "1.8446744073709552e+19"
        );
        assert!(run(Builtin::Add, &json!({"a": 1})).is_error);
    }

    #[test]
    fn text_builtins() {
        assert_eq!(run(Builtin::Upper, &json!({"text": "abc"})).text, "ABC");
        assert_eq!(run(Builtin::Length, &json!({"text": "héllo"})).text, "5");
        assert_eq!(
            run(Builtin::Sha256, &json!({"text": "abc"})).text,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
