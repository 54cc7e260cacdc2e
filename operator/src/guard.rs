//! Input the operator refuses before handing a ToolSet to quiver-server's compiler, which
//! runs inside this process: a panic there would abort the operator (release builds use
//! `panic = "abort"`) and with it every McpServer of the cluster.
//!
//! - Timeouts whose number would not fit a `Duration` (e.g. `timeout:
//!   100000000000000000000s`). `quiver_model::config::parse_duration` reports them as errors
//!   itself now (`Duration::try_from_secs_f64`; it used `from_secs_f64`, which panicked):
//!   this check stays as a second line, and names the field in the operator's own words.
//! - The McpServer's name becomes a Service name and a label value: it must be a DNS-1035
//!   label, or every apply would be rejected and retried.

use quiver_model::config::{Handler, ToolSet};

/// Longest McpServer name: Service names are DNS-1035 labels.
pub const MAX_NAME: usize = 63;
/// Largest timeout number the operator passes on, in any unit (the server allows 5 minutes).
const MAX_TIMEOUT_NUMBER: f64 = 1e9;

/// Problems with the McpServer's name, if any.
pub fn name(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    (!ok).then(|| {
        format!(
            "metadata.name: `{name}` must be a DNS label (at most {MAX_NAME} lowercase letters, digits and '-', starting with a letter): it names the Service"
        )
    })
}

/// Whether quiver-server's duration parser can take `s` without panicking: either it rejects
/// it with an error, or its number is small enough to become a `Duration`.
fn duration_is_safe(s: &str) -> bool {
    let s = s.trim();
    let number = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => &s[..i],
        None => return true, // no unit: the parser reports it
    };
    match number.parse::<f64>() {
        Ok(n) => n.is_finite() && n <= MAX_TIMEOUT_NUMBER,
        Err(_) => true, // not a number: the parser reports it
    }
}

/// Timeouts of `ts` the server's compiler cannot survive, located with `origins[i]` (where
/// tool `i` came from).
pub fn timeouts(ts: &ToolSet, origins: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, tool) in ts.tools.iter().enumerate() {
        let (kind, timeout) = match &tool.handler {
            Handler::Http(h) => ("http", h.timeout.as_deref()),
            Handler::Exec(e) => ("exec", e.timeout.as_deref()),
            _ => continue,
        };
        if let Some(t) = timeout.filter(|t| !duration_is_safe(t)) {
            let origin = origins.get(i).map_or("tools[?]", String::as_str);
            let shown: String = t.chars().take(40).collect();
            problems.push(format!(
                "{origin}.handler.{kind}.timeout: `{shown}` is out of range (at most 5m)"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_that_would_panic_the_parser_are_caught() {
        for bad in [
            "100000000000000000000s",
            "1000000000000m",
            "99999999999999999999999999ms",
        ] {
            assert!(!duration_is_safe(bad), "{bad}");
        }
        for fine in ["2s", "250ms", "1.5m", "5", "5h", ".s", "", "1e400s", "600s"] {
            assert!(duration_is_safe(fine), "{fine}");
        }
    }

    #[test]
    fn names_must_be_dns_labels() {
        assert_eq!(name("calc-2"), None);
        for bad in ["a.b", "Calc", "-a", "a-", "1a", &"a".repeat(64)] {
            assert!(name(bad).is_some(), "{bad}");
        }
    }
}
