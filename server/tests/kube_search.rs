//! Retrieval quality of tool search over the Kubernetes API: the tools an OpenAPI import of
//! a real kube-apiserver's core/v1 and apps/v1 documents makes (tool name = operationId,
//! description, parameter names), searched with the hand-labeled queries of
//! tests/search/kube-queries.yaml. Prints recall@3 and recall@5 and fails below 0.9 at 5.
//!
//! Needs a control plane (`scripts/control-plane.sh up DIR`, then `source DIR/env`): the
//! documents are fetched with `kubectl get --raw` at test time, never stored.

use std::process::Command;

use quiver_server::config::{ToolSet, compile};
use quiver_server::search::{Catalog, Scratch};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// Largest OpenAPI document read.
const MAX_DOCUMENT: usize = 32 << 20;
const METHODS: [&str; 7] = ["get", "put", "post", "delete", "patch", "head", "options"];

#[derive(Deserialize)]
struct Labeled {
    query: String,
    expect: Vec<String>,
}

fn openapi(path: &str) -> Value {
    let out = Command::new("kubectl")
        .args(["get", "--raw", path])
        .output()
        .expect("kubectl on PATH (source the control plane's env)");
    assert!(
        out.status.success(),
        "kubectl get --raw {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.len() <= MAX_DOCUMENT, "{path}: document too large");
    serde_json::from_slice(&out.stdout).expect("an OpenAPI JSON document")
}

/// A parameter, resolved when it is a `$ref` into `components.parameters`.
fn parameter<'a>(doc: &'a Value, p: &'a Value) -> Option<&'a str> {
    let p = match p.get("$ref").and_then(Value::as_str) {
        Some(r) => doc.pointer(&r.replacen('#', "", 1))?,
        None => p,
    };
    p.get("name").and_then(Value::as_str)
}

/// One tool per operation, as the OpenAPI importer makes them: the operationId as name, the
/// description (or summary), and one property per parameter (and `body` for a request body).
fn tools(doc: &Value, out: &mut Vec<Value>) {
    let Some(paths) = doc.get("paths").and_then(Value::as_object) else {
        return;
    };
    for item in paths.values() {
        let shared = item.get("parameters").and_then(Value::as_array);
        for m in METHODS {
            let Some(op) = item.get(m) else { continue };
            let Some(id) = op.get("operationId").and_then(Value::as_str) else {
                continue;
            };
            let mut props = Map::new();
            let own = op.get("parameters").and_then(Value::as_array);
            for p in shared.into_iter().flatten().chain(own.into_iter().flatten()) {
                if let Some(name) = parameter(doc, p) {
                    props.insert(name.to_owned(), json!({"type": "string"}));
                }
            }
            if op.get("requestBody").is_some() {
                props.insert("body".into(), json!({"type": "object"}));
            }
            let description = op
                .get("description")
                .or_else(|| op.get("summary"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            out.push(json!({
                "name": id,
                "description": description,
                "inputSchema": {"type": "object", "properties": props},
                "handler": {"template": "ok"},
            }));
        }
    }
}

#[test]
#[ignore = "needs cluster"]
fn kube_operations_are_found_from_plain_language() {
    let mut defs = Vec::new();
    for path in ["/openapi/v3/api/v1", "/openapi/v3/apis/apps/v1"] {
        tools(&openapi(path), &mut defs);
    }
    assert!(defs.len() > 200, "only {} operations", defs.len());
    let ts: ToolSet =
        serde_json::from_value(json!({"tools": defs, "toolSearch": {"maxLimit": 50}})).expect("a ToolSet");
    let compiled = compile(&ts).unwrap_or_else(|e| panic!("{e}"));
    let settings = compiled.search.as_ref().expect("tool search on");
    let catalog = Catalog::build(compiled.tools.iter().map(|t| &t.descriptor), settings);
    let names: Vec<&str> = compiled.tools.iter().map(|t| t.name.as_str()).collect();

    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/search/kube-queries.yaml"
    ))
    .expect("the labeled queries");
    let labeled: Vec<Labeled> = serde_saphyr::from_str(&text).expect("labeled queries parse");
    assert!(labeled.len() >= 50, "only {} labeled queries", labeled.len());
    let (mut at3, mut at5) = (0, 0);
    let (mut scratch, mut hits) = (Scratch::default(), Vec::new());
    for l in &labeled {
        for e in &l.expect {
            assert!(
                names.contains(&e.as_str()),
                "{:?} expects {e}, which the apiserver does not serve",
                l.query
            );
        }
        catalog
            .index
            .search(&l.query, 5, &mut scratch, |i| names[i] != "find_tools", &mut hits);
        let got: Vec<&str> = hits.iter().map(|(i, _)| names[*i]).collect();
        let rank = got.iter().position(|g| l.expect.iter().any(|e| e == g));
        at3 += usize::from(rank.is_some_and(|r| r < 3));
        at5 += usize::from(rank.is_some());
        if rank.is_none_or(|r| r >= 3) || std::env::var_os("QUIVER_SEARCH_VERBOSE").is_some() {
            println!(
                "{:?} rank {rank:?}; expected {:?}; got {got:?}",
                l.query, l.expect
            );
        }
    }
    let n = labeled.len() as f64;
    let (r3, r5) = (at3 as f64 / n, at5 as f64 / n);
    println!(
        "{} operations, {} queries: recall@3 {r3:.3}, recall@5 {r5:.3}",
        names.len(),
        labeled.len()
    );
    assert!(r5 >= 0.9, "recall@5 {r5:.3} < 0.9");
}
