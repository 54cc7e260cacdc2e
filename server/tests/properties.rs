//! Property tests of everything that reads untrusted input: the template engine, the ToolSet
//! parser and compiler, and the JSON-RPC message dispatcher. Release builds abort on panic,
//! so "never panics" is an availability property here, checked along with what each
//! accepted input must satisfy.
//!
//! Inputs are generated from small grammars of the tokens each reader cares about (so the
//! generator reaches the interesting branches instead of failing at the first byte), plus
//! arbitrary bytes. The number of cases is bounded (`PROPTEST_CASES` overrides it) so the
//! README test command runs these in seconds. Seed inputs checked in under
//! `tests/corpus/` (earlier crashes and hostile classes) are run through the same checks
//! first, and failures proptest finds are kept in `proptest-regressions/` and replayed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// ToolSets the generator produced that compiled, and tool calls that succeeded: the
/// properties below say something only if generated inputs get that far.
static ACCEPTED_TOOLSETS: AtomicUsize = AtomicUsize::new(0);
static SUCCESSFUL_CALLS: AtomicUsize = AtomicUsize::new(0);

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use quiver_server::config::{
    self, CompiledHandler, MAX_PIPELINE_NESTING, MAX_PIPELINE_STEPS, MAX_VALUE_DEPTH,
};
use quiver_server::dispatch::{Ctx, Era, Opens, Outcome, Server};
use quiver_server::metrics::Metrics;
use quiver_server::registry::Registry;
use quiver_server::reload::Reloader;
use quiver_server::template::{JsonTemplate, Template, depth};
use serde_json::{Map, Value, json};

fn cases(default: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(default);
    Config {
        cases,
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct(
            "tests/corpus/proptest-regressions.txt",
        ))),
        ..Config::default()
    }
}

/// Text built from the tokens a reader branches on, and now and then any character.
fn tokens(alphabet: &'static [&'static str], max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            8 => prop::sample::select(alphabet).prop_map(str::to_owned),
            1 => any::<char>().prop_map(String::from),
        ],
        0..max,
    )
    .prop_map(|v| v.concat())
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |f| f.is_finite())
            .prop_map(Value::from),
        tokens(
            &[
                "a", "..", "/", "%2e", "-", "--x", "{{x}}", "\\", "@", ":", "é", " "
            ],
            6
        )
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 40, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(&["x", "y", "steps", "text", "0", "a"][..]).prop_map(str::to_owned),
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

const TEMPLATE_TOKENS: &[&str] = &[
    "{{", "}}", "{", "}", "|", ".", " ", "x", "y", "steps", "0", "1", "text", "json", "url", "raw", "upper",
    "lower", "trim", "nope", "-", "_", "/", "?", "#", "http://h", "é",
];

fn is_encoded(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._~%".contains(c)
}

fn check_template(src: &str, scope: &Value) -> Result<(), TestCaseError> {
    let Ok(t) = Template::compile(quiver_server::template::Authored::new(src)) else {
        return Ok(());
    };
    if !src.contains("{{") {
        prop_assert!(t.is_literal());
        prop_assert_eq!(t.render(scope).unwrap(), src);
    }
    let text = t.render(scope).unwrap();
    let url = t.render_url(scope).unwrap();
    prop_assert!(url.starts_with(t.literal_prefix()) && text.starts_with(t.literal_prefix()));
    // In a URL, a value is percent-encoded unless filtered `raw` or `url`: nothing it holds
    // can end the path or start a query.
    for filters in ["", " | upper", " | json", " | trim | lower"] {
        let encoded = Template::compile(quiver_server::template::Authored::new(&format!(
            "{{{{x{filters}}}}}"
        )))
        .unwrap()
        .render_url(scope)
        .unwrap();
        prop_assert!(encoded.chars().all(is_encoded), "{encoded}");
    }
    Ok(())
}

#[test]
fn templates_compile_and_render_any_input_without_panicking() {
    let corpus = include_str!("corpus/templates.txt");
    let scope =
        json!({"x": "a b/..", "y": [1, {"z": null}], "steps": [{"text": "t", "structured": {"a": 1}}]});
    for line in corpus.lines() {
        check_template(line, &scope).unwrap();
    }
    let mut runner = TestRunner::new(cases(2048));
    runner
        .run(&(tokens(TEMPLATE_TOKENS, 24), arb_json()), |(src, scope)| {
            check_template(&src, &scope)?;
            // The same text as a JSON template, inside a value.
            let v = json!({"a": [src.clone(), 1], "b": src});
            if let Ok(jt) = JsonTemplate::compile(quiver_server::template::Authored::json(&v)) {
                let out = jt.render(&scope).unwrap();
                prop_assert!(out.is_object());
            }
            Ok(())
        })
        .unwrap();
    // Uniform random text, for what the grammar does not think of.
    runner
        .run(&".{0,64}", |src| check_template(&src, &json!({})))
        .unwrap();
}

// ---- ToolSets ----

const NAMES: &[&str] = &["a", "b", "c", "d", "e", "p", "bad name", ""];

fn arb_handler() -> impl Strategy<Value = Value> {
    let name = || prop::sample::select(NAMES).prop_map(str::to_owned);
    prop_oneof![
        prop::sample::select(&["echo", "add", "sleep", "json", "now", "nope"][..])
            .prop_map(|b| json!({"builtin": b})),
        tokens(TEMPLATE_TOKENS, 10).prop_map(|t| json!({"template": t})),
        (
            prop::sample::select(&["http://", "https://", "ftp://", "", "http://u:p@"][..]),
            tokens(
                &[
                    "h",
                    "127.0.0.1",
                    ":",
                    "80",
                    "99999",
                    "{{x}}",
                    "{{x|raw}}",
                    "@",
                    ".",
                    "/",
                    "?",
                    "#",
                    "[::1]",
                    "\\",
                    "%2e"
                ],
                8
            ),
            prop::sample::select(&["GET", "POST", "get", "TRACE"][..]),
            prop::option::of(arb_json()),
            prop::sample::select(&["1s", "0s", "99999999999999999999s", "5m1s", "nan", "-1s", "1.5ms"][..]),
        )
            .prop_map(|(scheme, rest, method, body, timeout)| {
                let mut h = json!({"url": format!("{scheme}{rest}"), "method": method, "timeout": timeout});
                if let Some(b) = body {
                    h["body"] = b;
                }
                json!({"http": h})
            }),
        (
            prop::collection::vec(tokens(&["/bin/echo", "--", "-l", "{{x}}", "a", "{{"], 3), 0..4),
            any::<u64>(),
        )
            .prop_map(|(command, max)| json!({"exec": {"command": command, "maxOutputBytes": max}})),
        prop::collection::vec((name(), prop::option::of(arb_json())), 0..5).prop_map(|steps| {
            let steps: Vec<Value> = steps
                .into_iter()
                .map(|(tool, input)| match input {
                    Some(i) => json!({"tool": tool, "input": i}),
                    None => json!({"tool": tool}),
                })
                .collect();
            json!({"pipeline": steps})
        }),
    ]
}

fn arb_tool() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(NAMES),
        arb_handler(),
        prop::option::of(prop::collection::btree_map(
            prop::sample::select(&["x", "y"][..]).prop_map(str::to_owned),
            prop_oneof![
                prop::sample::select(&["string", "number?", "integer", "object", "nope"][..])
                    .prop_map(Value::from),
                arb_json(),
            ],
            0..3,
        )),
        prop::option::of(arb_json()),
    )
        .prop_map(|(name, handler, input, output)| {
            let mut t = json!({"name": name, "handler": handler});
            if let Some(i) = input {
                t["input"] = json!(i);
            }
            if let Some(o) = output {
                t["outputSchema"] = o;
            }
            t
        })
}

/// Nesting and step counts of a pipeline, computed the obvious (recursive) way: the
/// compiler's iterative walk must agree on the ToolSets it accepts.
fn nesting_and_steps(tools: &[config::CompiledTool], i: usize) -> (usize, usize) {
    match &tools[i].handler {
        CompiledHandler::Pipeline(steps) => steps.iter().fold((1, 0), |(n, c), s| {
            let (sn, sc) = s.tool().map_or((0, 0), |t| nesting_and_steps(tools, t));
            (n.max(sn + 1), c + s.runs() * (1 + sc))
        }),
        _ => (0, 0),
    }
}

fn check_toolset(text: &str) -> Result<(), TestCaseError> {
    let Ok(ts) = config::parse("t", text) else {
        return Ok(());
    };
    let Ok(compiled) = config::compile(&ts) else {
        return Ok(());
    };
    ACCEPTED_TOOLSETS.fetch_add(1, Ordering::Relaxed);
    for i in 0..compiled.tools.len() {
        let (nesting, steps) = nesting_and_steps(&compiled.tools, i);
        prop_assert!(nesting <= MAX_PIPELINE_NESTING && steps <= MAX_PIPELINE_STEPS);
        let t = &ts.tools[i];
        for v in [&t.input_schema, &t.output_schema].into_iter().flatten() {
            prop_assert!(depth(v) <= MAX_VALUE_DEPTH);
        }
        if let CompiledHandler::Http(h) = &compiled.tools[i].handler {
            let config::Handler::Http(src) = &t.handler else {
                unreachable!()
            };
            prop_assert!(src.url.starts_with(&h.origin), "{} / {}", src.url, h.origin);
            let rest = &src.url[h.origin.len()..];
            prop_assert!(
                rest.is_empty() || rest.starts_with(['/', '?', '#']),
                "{}",
                src.url
            );
        }
    }
    // What the operator writes (serde_saphyr's YAML of the model) reads back as the same
    // ToolSet: `check`, reload and the operator accept the same set.
    let yaml = serde_saphyr::to_string(&ts).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let again = config::parse("again", &yaml)
        .and_then(|ts| config::compile(&ts))
        .map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
    prop_assert_eq!(again.hash, compiled.hash);
    Ok(())
}

#[test]
fn toolsets_parse_and_compile_without_panicking_and_round_trip() {
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus/toolsets")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        check_toolset(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let mut runner = TestRunner::new(cases(1024));
    runner
        .run(&prop::collection::vec(arb_tool(), 0..8), |tools| {
            check_toolset(&json!({ "tools": tools }).to_string())
        })
        .unwrap();
    runner
        .run(
            &tokens(
                &[
                    "tools:", "\n", "  - ", "{", "}", "[", "]", "name: a", "handler:", "&a", "*a", "!!str",
                    "'", "\"", ": ", "1e999", "- ",
                ],
                40,
            ),
            |text| check_toolset(&text),
        )
        .unwrap();
    let accepted = ACCEPTED_TOOLSETS.load(Ordering::Relaxed);
    assert!(accepted >= 20, "only {accepted} generated ToolSets compiled");
}

// ---- JSON-RPC messages ----

const TOOLS: &str = r#"
tools:
  - {name: echo, handler: {builtin: echo}}
  - {name: add, handler: {builtin: add}}
  - {name: json, handler: {builtin: json}}
  - {name: greet, input: {name: string}, handler: {template: "hi {{name}} {{name|json}}"}}
  - {name: two, input: {name: string}, handler: {pipeline: [{tool: greet}, {tool: echo, input: {text: "{{steps.0.text}}"}}]}}
resources:
  - {uriTemplate: "greeting://{name}", name: g, text: "Hello {{name}}"}
prompts:
  - {name: p, arguments: [{name: topic, required: true}], messages: [{role: user, text: "{{topic}}"}]}
"#;

/// Well-formed calls with arguments at the edges of their types: they get past validation
/// into the handlers.
fn arb_call() -> impl Strategy<Value = Value> {
    let text = || tokens(&["a", "{{name}}", "\\u0000", "é", "\"", "{{", "}}", " "], 8);
    let number = || {
        prop_oneof![
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
        ]
    };
    let args = prop_oneof![
        text().prop_map(|t| ("echo", json!({"text": t}))),
        (number(), number()).prop_map(|(a, b)| ("add", json!({"a": a, "b": b}))),
        arb_json().prop_map(|v| ("json", json!({"v": v}))),
        text().prop_map(|t| ("greet", json!({"name": t}))),
        text().prop_map(|t| ("two", json!({"name": t}))),
    ];
    (any::<u32>(), args).prop_map(|(id, (name, arguments))| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
    })
}

fn arb_message() -> impl Strategy<Value = Value> {
    let method = prop::sample::select(
        &[
            "initialize",
            "ping",
            "tools/list",
            "tools/call",
            "resources/list",
            "resources/read",
            "resources/templates/list",
            "prompts/list",
            "prompts/get",
            "notifications/cancelled",
            "notifications/initialized",
            "logging/setLevel",
            "completion/complete",
            "resources/subscribe",
            "resources/unsubscribe",
            "nope",
            "",
        ][..],
    );
    let id = prop_oneof![
        Just(json!(1)),
        any::<i64>().prop_map(Value::from),
        tokens(&["a", "1"], 4).prop_map(Value::from),
        Just(Value::Null),
        Just(json!([1])),
        Just(json!(1.5)),
    ];
    let params = prop_oneof![
        arb_json(),
        (
            prop::sample::select(&["echo", "add", "json", "greet", "two", "missing"][..]),
            arb_json()
        )
            .prop_map(|(name, args)| json!({"name": name, "arguments": args})),
        tokens(&["greeting://", "x", "%", "%2e", "/"], 5).prop_map(|uri| json!({"uri": uri})),
        arb_json().prop_map(|a| json!({"name": "p", "arguments": a})),
        Just(json!({"cursor": "garbage"})),
        Just(json!({"requestId": 1})),
        (tokens(&["debug", "info", "x", "\u{0}"], 2), arb_json()).prop_map(|(l, j)| json!({"level": l, "_meta": j})),
        (
            prop::sample::select(&["ref/prompt", "ref/resource", "ref/x", ""][..]),
            tokens(&["p", "greeting://{name}", "%", "é"], 3),
            tokens(&["a", "R", "", "\u{10ffff}"], 4),
        )
            .prop_map(|(kind, name, value)| json!({"ref": {"type": kind, "name": name, "uri": name}, "argument": {"name": "name", "value": value}})),
    ];
    let any_message = (
        prop::option::weighted(0.9, prop::sample::select(&["2.0", "1.0"][..])),
        prop::option::weighted(0.9, id),
        method,
        prop::option::weighted(0.8, params),
    )
        .prop_map(|(v, id, m, p)| {
            let mut msg = json!({"method": m});
            if let Some(v) = v {
                msg["jsonrpc"] = v.into();
            }
            if let Some(id) = id {
                msg["id"] = id;
            }
            if let Some(p) = p {
                msg["params"] = p;
            }
            msg
        });
    prop_oneof![1 => any_message, 1 => arb_call()]
}

const BYTE_TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"\"id\"",
    b"1",
    b"\xff",
    b"\"method\"",
    b"\"tools/call\"",
    b"\\u0000",
    b"1e999",
];

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    jsonrpc: String,
    id: Option<Box<serde_json::value::RawValue>>,
    result: Option<Box<serde_json::value::RawValue>>,
    error: Option<Value>,
}

fn server() -> Arc<Server> {
    let metrics = Metrics::new("test", "system");
    let server = Server::new(Registry::new(&metrics), metrics);
    Reloader::new(server.clone())
        .apply(&[("t".into(), TOOLS.into())])
        .unwrap_or_else(|e| panic!("{e}"));
    server
}

/// Every answer is JSON; every answer to a request with a usable id carries that id and
/// exactly one of `result` or `error`.
fn check_message(
    rt: &tokio::runtime::Runtime,
    server: &Arc<Server>,
    body: &[u8],
    batches: bool,
) -> Result<(), TestCaseError> {
    let ctx = Ctx {
        session: "s",
        version: "2025-03-26",
        stream: true,
        // Each message in the era it shows: those with a `_meta` protocol version take the
        // 2026-07-28 path.
        era: Era::Detect,
        caller: None,
        opens: Opens::Given,
        client: None,
    };
    let handled = rt.block_on(server.handle(body, ctx, batches));
    // A slow call comes back to be run where it could stream; run it without a client.
    let out = match handled {
        Outcome::Deferred(d) => rt.block_on(d.run(None)).map(|r| r.body),
        other => other.into_body(),
    };
    let Some(out) = out else {
        return Ok(());
    };
    // Ids are echoed verbatim, so they are read raw: `1e999` is valid JSON though no f64.
    let answers: Vec<Answer> = match out.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => serde_json::from_slice(&out),
        _ => serde_json::from_slice(&out).map(|a| vec![a]),
    }
    .map_err(|e| {
        TestCaseError::fail(format!(
            "answer is not JSON-RPC: {e}: {}",
            String::from_utf8_lossy(&out)
        ))
    })?;
    for a in answers {
        prop_assert_eq!(&a.jsonrpc, "2.0");
        prop_assert!(a.result.is_some() != a.error.is_some());
        if a.result
            .as_ref()
            .is_some_and(|r| r.get().contains("\"isError\":false"))
        {
            SUCCESSFUL_CALLS.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(e) = &a.error {
            prop_assert!(e["code"].is_i64() && e["message"].is_string(), "{e}");
        }
        if let (Some(id), Ok(sent)) = (&a.id, serde_json::from_slice::<Value>(body)) {
            // A single request's answer carries its id, byte for byte.
            if sent.is_object() && id.get() != "null" {
                prop_assert!(String::from_utf8_lossy(body).contains(id.get()), "{}", id.get());
            }
        }
    }
    Ok(())
}

#[test]
fn any_message_gets_a_well_formed_answer_or_none() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = server();
    for line in include_str!("corpus/messages.txt").lines() {
        check_message(&rt, &server, line.as_bytes(), true).unwrap_or_else(|e| panic!("{line}: {e}"));
    }
    let mut runner = TestRunner::new(cases(2048));
    runner
        .run(&(arb_message(), any::<bool>()), |(msg, batches)| {
            check_message(&rt, &server, msg.to_string().as_bytes(), batches)
        })
        .unwrap();
    runner
        .run(
            &(prop::collection::vec(arb_message(), 0..6), any::<bool>()),
            |(msgs, batches)| check_message(&rt, &server, Value::Array(msgs).to_string().as_bytes(), batches),
        )
        .unwrap();
    // Bytes: truncated JSON, stray brackets, invalid UTF-8.
    runner
        .run(
            &prop::collection::vec(
                prop_oneof![
                    prop::sample::select(BYTE_TOKENS).prop_map(<[u8]>::to_vec),
                    any::<u8>().prop_map(|b| vec![b]),
                ],
                0..40,
            ),
            |bytes| check_message(&rt, &server, &bytes.concat(), true),
        )
        .unwrap();
    let calls = SUCCESSFUL_CALLS.load(Ordering::Relaxed);
    assert!(calls >= 20, "only {calls} generated tool calls succeeded");
}
