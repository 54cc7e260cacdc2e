use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::spec::access::Principal;

fn caller(groups: &[&str], claims: Value) -> Principal {
    let mut p = Principal::new(["read", "deploy:write"], groups.iter().copied());
    p.credential = Some(Arc::new(crate::spec::caller::Credential::new("token", claims)));
    p
}

fn run(src: &str, who: Option<&Principal>, args: Option<&Value>) -> Verdict {
    let p = Policy::compile("p", false, src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let annotations = json!({"readOnlyHint": true, "title": "T"});
    let facts = ToolFacts {
        name: "restart",
        upstream: "k8s",
        annotations: &annotations,
    };
    p.evaluate(who, facts, args)
}

#[test]
fn the_typical_rule_allows_sre_outside_prod_only() {
    let rule = "'sre' in caller.groups && args.namespace != 'prod'";
    let sre = caller(&["sre"], json!({"sub": "alice"}));
    let dev = caller(&["dev"], json!({"sub": "bob"}));
    assert_eq!(
        run(rule, Some(&sre), Some(&json!({"namespace": "dev"}))),
        Verdict::Allow
    );
    assert_eq!(
        run(rule, Some(&sre), Some(&json!({"namespace": "prod"}))),
        Verdict::Deny
    );
    assert_eq!(
        run(rule, Some(&dev), Some(&json!({"namespace": "dev"}))),
        Verdict::Deny
    );
    // No credentials: no groups.
    assert_eq!(run(rule, None, Some(&json!({"namespace": "dev"}))), Verdict::Deny);
    // A missing argument is an error (a denial), unless the other side decides.
    assert_eq!(run(rule, Some(&sre), Some(&json!({}))), Verdict::Error);
    assert_eq!(run(rule, Some(&dev), Some(&json!({}))), Verdict::Deny);
    // At list time: unknown for sre (listed), false for the others (hidden).
    assert_eq!(run(rule, Some(&sre), None), Verdict::Unknown);
    assert_eq!(run(rule, Some(&dev), None), Verdict::Deny);
    assert_eq!(
        run(
            "'sre' in caller.groups || args.namespace == 'dev'",
            Some(&dev),
            None
        ),
        Verdict::Unknown
    );
}

#[test]
fn every_variable_reads_what_it_names() {
    let who = caller(
        &["sre", "Domain Admins"],
        json!({"sub": "alice", "iss": "https://idp", "azp": "cli", "dept": {"name": "ops"}, "level": 3}),
    );
    let args = json!({"namespace": "dev", "replicas": 3, "big": 18446744073709551615u64, "ratio": 0.5,
        "items": [{"kind": "Pod"}, {"kind": "Service"}], "labels": {"team": "ops"}, "flag": true, "none": null});
    for src in [
        "caller.subject == 'alice' && caller.issuer == 'https://idp' && caller.clientId == 'cli'",
        "caller.claims.dept.name == 'ops' && caller.claims.level >= 3 && caller.claims['level'] == 3",
        "'Domain Admins' in caller.groups && 'deploy:write' in caller.scopes && size(caller.groups) == 2",
        "caller.groups[1] == 'Domain Admins' && caller.scopes.exists(s, s.startsWith('deploy:'))",
        "tool.name == 'restart' && tool.upstream == 'k8s' && tool.annotations.readOnlyHint",
        "has(tool.annotations.title) && !has(tool.annotations.destructiveHint)",
        "args.replicas + 1 == 4 && args.replicas * 2 == 6 && args.replicas / 2 == 1 && args.replicas % 2 == 1",
        "args.replicas == 3.0 && args.replicas < 3.5 && args.ratio > 0 && args.big > 0 && args.big == 18446744073709551615u",
        "args.items.all(i, i.kind != 'Secret') && args.items.exists_one(i, i.kind == 'Pod')",
        "args.items.exists(i, i.kind == 'Service') && !args.items.exists(i, i.kind == 'Secret')",
        "args.labels.exists(k, k == 'team') && 'team' in args.labels && args.labels.team in ['ops', 'sre']",
        "args.flag && args.none == null && args.namespace.matches('^d[a-z]+$') && args.namespace.contains('e')",
        "args.namespace.endsWith('ev') && size(args.namespace) == 3 && args.namespace.size() == 3",
        "args.namespace + '-1' == 'dev-1' && -args.replicas == -3 && args.items[1].kind == 'Service'",
        "(args.replicas > 5 ? 'big' : 'small') == 'small' && args.items == args.items",
        "args.labels == {'team': 'ops'}.team || true",
        "caller.groups.all(g, args.items.exists(i, size(i.kind) > 2) && size(g) > 1)",
        "[1, 2, 3].exists(x, x == args.replicas) && 2 in [1, 2]",
    ] {
        let v = match Policy::compile("p", false, src) {
            Ok(p) => p.evaluate(
                Some(&who),
                ToolFacts {
                    name: "restart",
                    upstream: "k8s",
                    annotations: &json!({"readOnlyHint": true, "title": "T"}),
                },
                Some(&args),
            ),
            Err(e) if src.contains('{') => {
                assert!(e.contains("map literals"), "{e}");
                continue;
            }
            Err(e) => panic!("{src}: {e}"),
        };
        assert_eq!(v, Verdict::Allow, "{src}");
    }
}

#[test]
fn errors_deny_and_a_deciding_side_wins_over_them() {
    let who = caller(&[], json!({}));
    let args = json!({"n": 1, "s": "x"});
    for (src, want) in [
        ("args.missing == 1", Verdict::Error),
        ("args.missing == 1 || true", Verdict::Allow),
        ("false && args.missing == 1", Verdict::Deny),
        ("args.missing == 1 && false", Verdict::Deny),
        ("args.n / 0 == 1", Verdict::Error),
        ("args.n < 's'", Verdict::Error),
        ("args.s", Verdict::Error),
        ("args.n", Verdict::Error),
        ("args.s.startsWith(args.n)", Verdict::Error),
        ("caller.claims.sub == 'x'", Verdict::Error),
        ("caller.subject == ''", Verdict::Allow),
        ("args.n == 's'", Verdict::Deny),
        ("-9223372036854775808 - 1 < 0", Verdict::Error),
    ] {
        assert_eq!(run(src, Some(&who), Some(&args)), want, "{src}");
    }
}

/// A JSON array of `n` strings (as a request's arguments may hold).
fn strings(n: usize) -> Value {
    Value::Array((0..n).map(|i| Value::String(format!("item-{i}"))).collect())
}

#[test]
fn costly_evaluations_stop_and_deny_in_bounded_time() {
    let args = json!({"a": strings(5_000), "s": "x".repeat(1 << 20)});
    for src in [
        // 25 million comparisons, stopped after the budget.
        "args.a.all(x, !args.a.exists(y, x == y + 'z'))",
        "args.a.exists(x, args.a.all(y, y != x))",
        "args.a.exists_one(x, args.a.exists(y, y == 'nope'))",
        // A megabyte regex-scanned per element.
        "args.a.all(x, args.s.matches('y$'))",
        "args.a.all(x, (args.s + args.s).contains('y'))",
    ] {
        let start = Instant::now();
        let v = run(src, None, Some(&args));
        assert_eq!(v, Verdict::TooCostly, "{src}");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{src}: {:?}",
            start.elapsed()
        );
    }
}

#[test]
fn selectors_pick_tools_by_name_prefix_and_upstream() {
    let spec = |tools: &[&str], upstreams: &[&str]| PolicySpec {
        name: "p".into(),
        expression: "true".into(),
        tools: tools.iter().map(|s| (*s).to_owned()).collect(),
        upstreams: upstreams.iter().map(|s| (*s).to_owned()).collect(),
        resources: Vec::new(),
        prompts: Vec::new(),
    };
    let tools = [
        ("restart", None),
        ("k8s-get", Some("'a' in caller.groups")),
        ("add", None),
    ];
    let mut p = Problems::default();
    let declared = |upstreams| Declared {
        tools: &tools,
        upstreams,
        ..Declared::default()
    };
    let set = compile(
        &[spec(&["restart", "k8s-*"], &["gh"])],
        &declared(&["gh"]),
        &mut p,
    );
    assert!(p.0.is_empty(), "{:?}", p.0);
    assert!(set.for_tool("restart", "", None).is_some());
    assert!(set.for_tool("k8s-delete", "", None).is_some());
    assert_eq!(set.for_tool("k8s-get", "", None).unwrap().list.len(), 2);
    assert!(set.for_tool("add", "", None).is_none());
    assert!(set.for_tool("issue", "gh", None).is_some());
    // An imported tool does not take a declared tool's inline policy.
    assert!(set.for_tool("add", "other", None).is_none());
    let all = compile(&[spec(&[], &[])], &declared(&[]), &mut p);
    assert!(all.for_tool("anything", "x", None).is_some());
    // Naming tools leaves resources and prompts alone; no selector takes them in.
    assert!(set.for_resource("doc://a").is_none() && set.for_prompt("trip").is_none());
    assert!(all.for_resource("doc://a").is_some() && all.for_prompt("trip").is_some());
}

#[test]
fn selectors_pick_resources_by_declared_uri_and_prompts_by_name() {
    let spec = |resources: &[&str], prompts: &[&str]| PolicySpec {
        name: "p".into(),
        expression: "true".into(),
        tools: Vec::new(),
        upstreams: Vec::new(),
        resources: resources.iter().map(|s| (*s).to_owned()).collect(),
        prompts: prompts.iter().map(|s| (*s).to_owned()).collect(),
    };
    let tools = [("restart", None)];
    let d = Declared {
        tools: &tools,
        resources: &["doc://a", "city://{name}", "docs://b"],
        prompts: &["trip", "Plan a trip"],
        ..Declared::default()
    };
    let mut p = Problems::default();
    let set = compile(
        &[spec(&["city://{name}", "docs://*"], &["Plan a trip"])],
        &d,
        &mut p,
    );
    assert!(p.0.is_empty(), "{:?}", p.0);
    assert!(set.for_resource("city://{name}").is_some());
    assert!(set.for_resource("docs://b").is_some());
    assert!(set.for_resource("doc://a").is_none());
    assert!(set.for_prompt("Plan a trip").is_some() && set.for_prompt("trip").is_none());
    // A policy that names only resources or prompts is not one for every tool.
    assert!(set.for_tool("restart", "", None).is_none());
    // A name nothing has is refused, naming the entry; so is a control character.
    compile(&[spec(&["city://x", "a\nb*"], &["nope"])], &d, &mut p);
    let got: Vec<&str> = p.0.iter().map(|x| x.path.as_str()).collect();
    assert_eq!(
        got,
        [
            "policies[0].resources[0]",
            "policies[0].resources[1]",
            "policies[0].prompts[0]"
        ]
    );
    assert!(
        p.0[0]
            .message
            .contains("no resource has the `uri` or `uriTemplate` `city://x`")
    );
    assert!(p.0[2].message.contains("no prompt is named `nope`"));
}

#[test]
fn the_request_kind_its_uri_and_its_prompt_are_readable() {
    let rule = "request.method == 'tools/call' ? tool.name == 'restart' \
        : request.method == 'resources/read' ? resource.uri.startsWith('doc://') && tool.name == '' \
        : prompt.name == 'trip' && resource.uri == '' && size(tool.annotations) == 0";
    let p = Policy::compile("p", false, rule).unwrap_or_else(|e| panic!("{e}"));
    let empty = json!({});
    let tool = ToolFacts {
        name: "restart",
        upstream: "",
        annotations: &Value::Null,
    };
    assert_eq!(p.evaluate(None, tool, Some(&empty)), Verdict::Allow);
    assert_eq!(
        p.evaluate(None, Target::Resource("doc://a"), Some(&empty)),
        Verdict::Allow
    );
    assert_eq!(
        p.evaluate(None, Target::Resource("file://a"), Some(&empty)),
        Verdict::Deny
    );
    assert_eq!(
        p.evaluate(None, Target::Prompt("trip"), Some(&empty)),
        Verdict::Allow
    );
    assert_eq!(
        p.evaluate(None, Target::Prompt("other"), Some(&empty)),
        Verdict::Deny
    );
    for (src, want) in [
        ("request.uri == ''", "unknown field `request.uri`"),
        ("resource.name == ''", "unknown field `resource.name`"),
        ("prompt.args == ''", "unknown field `prompt.args`"),
        ("request == 'x'", "is an object"),
    ] {
        let e = Policy::compile("p", false, src).unwrap_err();
        assert!(e.contains(want), "{src}: {e}");
    }
}

#[test]
fn problems_name_the_field() {
    let spec = |name: &str, expr: &str, tools: &[&str], ups: &[&str]| PolicySpec {
        name: name.into(),
        expression: expr.into(),
        tools: tools.iter().map(|s| (*s).to_owned()).collect(),
        upstreams: ups.iter().map(|s| (*s).to_owned()).collect(),
        resources: Vec::new(),
        prompts: Vec::new(),
    };
    let mut p = Problems::default();
    compile(
        &[
            spec("ok", "true", &[], &[]),
            spec("ok", "true", &[], &[]),
            spec("Bad_Name", "true", &[], &[]),
            spec("typo", "user.x == 1", &[], &[]),
            spec("sel", "true", &["nope", "bad name", "pre*"], &["gone"]),
        ],
        &Declared {
            tools: &[("t", Some("args.x +")), ("u", None)],
            ..Declared::default()
        },
        &mut p,
    );
    let got: Vec<String> = p.0.iter().map(|x| x.path.clone()).collect();
    assert_eq!(
        got,
        [
            "policies[1].name",
            "policies[2].name",
            "policies[3].expression",
            "policies[4].tools[0]",
            "policies[4].tools[1]",
            "policies[4].upstreams[0]",
            "tools[0].policy",
        ]
    );
    assert!(
        p.0[2].message.contains("unknown variable `user`"),
        "{}",
        p.0[2].message
    );
}

#[test]
fn a_denial_names_the_policy_never_its_expression() {
    let d = PolicyDenial {
        policy: "no-prod".into(),
        inline: false,
        verdict: Verdict::Deny,
    };
    assert_eq!(
        d.message("restart"),
        "Forbidden: policy `no-prod` does not allow this call of tool restart"
    );
    let d = PolicyDenial {
        policy: "restart".into(),
        inline: true,
        verdict: Verdict::TooCostly,
    };
    assert!(d.message("restart").contains("the policy of tool restart"));
    assert!(d.message("restart").contains("cost limit"));
}

/// The parser's worst cases at the size limit (long runs of tokens that keep its adaptive
/// prediction guessing) are answered, not stalled on.
#[test]
fn the_largest_garbage_is_answered_promptly() {
    let max = expr::MAX_EXPRESSION_BYTES;
    for unit in [
        "a.", "a(", "a[", "a ? ", "a in ", "1 2 ", "'", "\"", "a.all(", "!(", "x, ", ". . ", "?.", "{a: ",
    ] {
        let src: String = unit.repeat(max / unit.len());
        let start = Instant::now();
        let _ = expr::compile(&src);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{unit}: {:?}",
            start.elapsed()
        );
    }
}

proptest! {
    // POLICY_FUZZ_CASES=N runs more (e.g. 20000 before a release).
    #![proptest_config(ProptestConfig {
        cases: std::env::var("POLICY_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(400),
        ..ProptestConfig::default()
    })]

    /// Arbitrary text: compiled or refused, never a panic.
    #[test]
    fn any_text_compiles_or_is_refused(src in "\\PC{0,200}") {
        let _ = expr::compile(&src);
    }

    /// Text made of CEL's own tokens reaches far deeper into the parser and the checker;
    /// whatever compiles also runs to a verdict on any arguments.
    #[test]
    fn cel_shaped_text_never_panics(parts in proptest::collection::vec(prop::sample::select(vec![
        "args", "caller", "tool", ".", "x", "groups", "claims", "name", "(", ")", "[", "]", "{", "}", ",", ":",
        "'s'", "\"d\"", "1", "-1", "2u", "1.5", "null", "true", "false", "&&", "||", "!", "-", "+", "*", "/",
        "%", "==", "!=", "<", ">=", "?", "in", "size", "has", "all", "exists", "exists_one", "map", "filter",
        "matches", "startsWith", " ", "e", "b'x'", "'\\u00e9'", "r'x'", "'''", "0x1", "1e9", "@",
    ]), 0..40)) {
        let src = parts.concat();
        if let Ok(p) = Policy::compile("p", false, &src) {
            let args = json!({"x": [1, "a", {"x": null}], "name": "n", "groups": ["g"]});
            let who = caller(&["g"], json!({"x": 1}));
            let facts = ToolFacts { name: "t", upstream: "", annotations: &Value::Null };
            let _ = p.evaluate(Some(&who), facts, Some(&args));
            let _ = p.evaluate(None, facts, None);
        }
    }
}

/// Tools an OpenAPI document brings are named only once it is read (at the server, and again
/// whenever it changes), so with an OpenAPI source a policy may name any valid tool name, as
/// with an upstream; without either, a name no tool has is a typo and refused.
#[test]
fn a_policy_may_name_the_tools_of_an_openapi_source() {
    let src = |openapi: &str| {
        format!(
            "{openapi}policies: [{{name: reads, expression: 'true', tools: [listCoreV1Namespace, 'read*']}}]\ntools: [{{name: t, handler: {{builtin: echo}}}}]\n"
        )
    };
    let with = src("openapi: [{name: k8s, url: 'https://kubernetes.default.svc/openapi/v3/api/v1'}]\n");
    let compile = |text: &str| crate::config::compile(&crate::config::parse("t.yaml", text).unwrap());
    let compiled = compile(&with).unwrap();
    assert!(
        compiled
            .policies
            .for_tool("listCoreV1Namespace", "", None)
            .is_some()
    );
    assert!(compiled.policies.for_tool("t", "", None).is_none());
    let err = compile(&src("")).unwrap_err();
    assert!(
        err.problems.iter().any(|p| p.path == "policies[0].tools[0]"
            && p.message.contains("no tool is named `listCoreV1Namespace`")),
        "{err:?}"
    );
}
