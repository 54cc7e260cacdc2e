//! One duration grammar, and schemas that keep what they admit: every duration field of the McpServer CRD admits only values that
//! quiver-server parses (the flags and ToolSet fields the operator renders from them use the
//! same parser), so a value the API server accepts never keeps a pod from starting.
//!
//! The duration fields are found in the generated CRD itself (a string whose pattern
//! generates only `NUMBER UNIT` text), and each pattern is sampled by proptest.

use kube::CustomResourceExt;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use quiver_operator::crd::McpServer;
use serde_json::Value;

/// Every `(path, pattern)` of a string property of `schema`.
fn patterns(schema: &Value, path: &str, out: &mut Vec<(String, String)>) {
    if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
        out.push((path.to_owned(), p.to_owned()));
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            patterns(v, &format!("{path}.{k}"), out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(v) = schema.get(key).filter(|v| v.is_object()) {
            patterns(v, &format!("{path}[]"), out);
        }
    }
}

/// Values a pattern admits, `n` of them (its anchors dropped: proptest generates whole strings).
fn samples(pattern: &str, n: usize) -> Vec<String> {
    let bare = pattern.trim_start_matches('^').trim_end_matches('$');
    let Ok(strategy) = proptest::string::string_regex(bare) else {
        return Vec::new();
    };
    let mut runner = TestRunner::deterministic();
    (0..n)
        .filter_map(|_| strategy.new_tree(&mut runner).ok().map(|t| t.current()))
        .collect()
}

fn looks_like_a_duration(s: &str) -> bool {
    let unit = ["ms", "s", "m", "h"].into_iter().find(|u| s.ends_with(u));
    unit.is_some_and(|u| {
        let n = &s[..s.len() - u.len()];
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit() || b == b'.')
    })
}

#[test]
fn every_duration_the_crd_admits_is_one_quiver_server_parses() {
    let crd = serde_json::to_value(McpServer::crd()).unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut all = Vec::new();
    patterns(schema, "", &mut all);
    let durations: Vec<(String, String)> = all
        .into_iter()
        .filter(|(_, p)| {
            let s = samples(p, 32);
            !s.is_empty() && s.iter().all(|v| looks_like_a_duration(v))
        })
        .collect();
    // The test is not vacuous: the task, Redis and limit durations are among them.
    for field in [
        ".spec.tasks.ttl",
        ".spec.tasks.drain",
        ".spec.tasks.redis.timeout",
    ] {
        assert!(
            durations.iter().any(|(p, _)| p == field),
            "{field} not found among {durations:?}"
        );
    }
    for (path, pattern) in &durations {
        for v in samples(pattern, 512) {
            let parsed = quiver_model::config::parse_duration(&v);
            assert!(
                parsed.is_ok(),
                "{path}: the CRD admits `{v}`, quiver-server says {parsed:?}"
            );
        }
    }
}

#[test]
fn each_duration_fields_documented_maximum_parses() {
    for v in ["24h", "60m", "5s", "9999ms", "1h"] {
        assert!(quiver_model::config::parse_duration(v).is_ok(), "{v}");
    }
}

/// A map whose values may be any JSON (a type name or a whole JSON Schema under `input`)
/// keeps what is inside each value: `additionalProperties: true` would let the API server
/// prune a value's fields (an `enum` of a shorthand input property was stored as `{}`).
#[test]
fn no_map_of_any_values_lets_the_api_server_prune_them() {
    fn walk(schema: &Value, path: &str, out: &mut Vec<String>) {
        match schema {
            Value::Object(m) => {
                if m.get("additionalProperties") == Some(&Value::Bool(true)) {
                    out.push(path.to_owned());
                }
                for (k, v) in m {
                    walk(v, &format!("{path}/{k}"), out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, path, out)),
            _ => {}
        }
    }
    let crd = serde_json::to_value(McpServer::crd()).unwrap();
    let mut found = Vec::new();
    walk(&crd, "", &mut found);
    assert!(
        found.is_empty(),
        "maps whose values the API server would prune: {found:?}"
    );
    let input = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["tools"]["items"]["properties"]["input"];
    assert_eq!(
        input["additionalProperties"]["x-kubernetes-preserve-unknown-fields"], true,
        "{input}"
    );
}
