//! Criterion benchmark of importing an OpenAPI document: `openapi/import_1000` parses a
//! 3.1 JSON document of 1,000 operations (path, query and header parameters, JSON bodies and
//! answers referring to shared component schemas) and compiles them into http tools, as a
//! config load does.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use quiver_server::config::{ToolSet, compile};
use serde_json::{Map, json};

/// A document of `n` operations over `n / 4` resources (list, create, read, delete each).
fn document(n: usize) -> String {
    let mut paths = Map::new();
    for r in 0..n / 4 {
        let item = json!({"$ref": format!("#/components/schemas/Thing{}", r % 20)});
        paths.insert(
            format!("/v1/things{r}"),
            json!({
                "get": {"operationId": format!("listThings{r}"), "summary": "List things", "tags": ["things"],
                    "parameters": [
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                        {"name": "tag", "in": "query", "schema": {"type": "array", "items": {"type": "string"}}}
                    ],
                    "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": {"type": "object", "properties": {"items": {"type": "array", "items": item}}}}}}}},
                "post": {"operationId": format!("createThing{r}"), "summary": "Create a thing",
                    "requestBody": {"required": true, "content": {"application/json": {"schema": item}}},
                    "responses": {"201": {"description": "ok", "content": {"application/json": {"schema": item}}}}}
            }),
        );
        paths.insert(
            format!("/v1/things{r}/{{id}}"),
            json!({
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                "get": {"operationId": format!("getThing{r}"), "summary": "Read a thing",
                    "parameters": [{"name": "X-Request-Id", "in": "header", "schema": {"type": "string"}}],
                    "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": item}}}}},
                "delete": {"operationId": format!("deleteThing{r}"), "responses": {"204": {"description": "gone"}}}
            }),
        );
    }
    let mut schemas = Map::new();
    for s in 0..20 {
        schemas.insert(
            format!("Thing{s}"),
            json!({"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string", "maxLength": 64},
                "size": {"type": ["integer", "null"]},
                "owner": {"$ref": "#/components/schemas/Owner"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}}
            }}),
        );
    }
    schemas.insert(
        "Owner".into(),
        json!({"type": "object", "properties": {"id": {"type": "string"}}}),
    );
    json!({"openapi": "3.1.0", "info": {"title": "things", "version": "1"},
        "servers": [{"url": "http://127.0.0.1:8080"}], "paths": paths, "components": {"schemas": schemas}})
    .to_string()
}

fn bench(c: &mut Criterion) {
    let doc = document(1000);
    let ts: ToolSet = serde_json::from_value(json!({"openapi": [{"name": "things", "document": doc}]}))
        .unwrap_or_else(|e| panic!("{e}"));
    let n = compile(&ts).unwrap_or_else(|e| panic!("{e}")).tools.len();
    assert_eq!(n, 1000);
    c.bench_function("openapi/import_1000", |b| {
        b.iter(|| black_box(compile(black_box(&ts)).map(|c| c.tools.len())));
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
