use serde_json::{Value, json};

use super::*;

fn projection(paths: &[&str]) -> Projection {
    let paths: Vec<String> = paths.iter().map(|s| (*s).to_owned()).collect();
    let mut p = Problems::default();
    let out = compile(&paths, "tools[0].handler.http.project", &mut p);
    assert!(p.0.is_empty(), "{:?}", p.0);
    out.expect("paths")
}

fn problems(paths: &[String]) -> Vec<(String, String)> {
    let mut p = Problems::default();
    let out = compile(paths, "at.project", &mut p);
    assert!(out.is_none());
    p.0.into_iter().map(|x| (x.path, x.message)).collect()
}

fn pods() -> Value {
    json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "42"},
        "items": [
            {"metadata": {"name": "a", "uid": "1", "labels": {"app": "x"}},
             "spec": {"containers": [{"name": "c", "image": "i"}]},
             "status": {"phase": "Running", "podIP": "10.0.0.1"}},
            {"metadata": {"name": "b", "uid": "2"}, "spec": {}},
            "not an object",
        ]
    })
}

#[test]
fn keeps_named_fields_of_each_element() {
    let pj = projection(&["items[].metadata.name", "items[].status.phase", "kind"]);
    assert_eq!(
        pj.apply(pods()),
        Some(json!({
            "kind": "PodList",
            "items": [
                {"metadata": {"name": "a"}, "status": {"phase": "Running"}},
                {"metadata": {"name": "b"}},
            ]
        }))
    );
}

#[test]
fn nested_arrays_and_top_level_arrays() {
    let pj = projection(&["items[].spec.containers[].image"]);
    assert_eq!(
        pj.apply(pods()),
        Some(json!({"items": [{"spec": {"containers": [{"image": "i"}]}}, {"spec": {}}]}))
    );
    let grid = projection(&["rows[][]"]);
    assert_eq!(
        grid.apply(json!({"rows": [[1, 2], [3]], "other": 1})),
        Some(json!({"rows": [[1, 2], [3]]}))
    );
    let cells = projection(&["rows[][].v"]);
    assert_eq!(
        cells.apply(json!({"rows": [[{"v": 1, "w": 2}], [3, {"w": 4}]]})),
        Some(json!({"rows": [[{"v": 1}], [{}]]}))
    );
    let top = projection(&["[].id"]);
    assert_eq!(
        top.apply(json!([{"id": 1, "x": 2}, {"x": 3}, 7])),
        Some(json!([{"id": 1}, {}]))
    );
}

#[test]
fn a_path_to_a_parent_keeps_it_whole() {
    let pj = projection(&["metadata.name", "metadata"]);
    let v = json!({"metadata": {"name": "a", "uid": "1"}, "spec": {}});
    assert_eq!(pj.apply(v), Some(json!({"metadata": {"name": "a", "uid": "1"}})));
}

#[test]
fn missing_fields_and_other_shapes_are_left_out() {
    let pj = projection(&["a.b.c", "items[].x", "n"]);
    // Every field missing: an empty object.
    assert_eq!(pj.apply(json!({"z": 1})), Some(json!({})));
    // A scalar where an object is expected, an object where an array is expected.
    assert_eq!(
        pj.apply(json!({"a": {"b": 5}, "items": {"x": 1}, "n": null})),
        Some(json!({"a": {}, "n": null}))
    );
    // A top that is not what the paths select from: nothing to project.
    for v in [json!("text"), json!(3), json!(null), json!([1, 2]), json!(true)] {
        assert_eq!(pj.apply(v), None);
    }
    assert_eq!(projection(&["[].id"]).apply(json!({"id": 1})), None);
}

#[test]
fn deep_and_large_answers_cost_their_size() {
    // Nested far deeper than any path: only the path's depth is walked.
    let mut deep = json!(1);
    for _ in 0..100 {
        deep = json!({"a": deep, "b": [1, 2, 3]});
    }
    let pj = projection(&["a.a.b", "b"]);
    let out = pj.apply(deep).expect("an object");
    assert_eq!(out["b"], json!([1, 2, 3]));
    assert_eq!(out["a"]["a"]["b"], json!([1, 2, 3]));
    assert!(out["a"]["a"].get("a").is_none());
    // Many elements: each is projected.
    let items: Vec<Value> = (0..100_000)
        .map(|i| json!({"id": i, "blob": "x".repeat(8)}))
        .collect();
    let out = projection(&["items[].id"])
        .apply(json!({"items": items}))
        .expect("an object");
    let kept = out["items"].as_array().expect("an array");
    assert_eq!(kept.len(), 100_000);
    assert_eq!(kept[99_999], json!({"id": 99_999}));
}

#[test]
fn bad_paths_are_problems_naming_their_place() {
    let bad = [
        "",
        "a..b",
        "a.",
        ".a",
        "a[0]",
        "a[",
        "a]",
        "a b",
        "a.*",
        "a\u{0}b",
        &"x".repeat(MAX_PATH_BYTES + 1),
        &["a"; MAX_PATH_STEPS + 1].join("."),
        &format!("a{}", "[]".repeat(MAX_PATH_STEPS)),
    ];
    for path in bad {
        let got = problems(&[path.to_owned()]);
        assert_eq!(got.len(), 1, "{path:?}: {got:?}");
        assert_eq!(got[0].0, "at.project[0]", "{path:?}");
    }
    let got = problems(&["ok".to_owned(), "bad[".to_owned(), "fine.too".to_owned()]);
    assert_eq!(
        got.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(),
        ["at.project[1]"]
    );
    let many: Vec<String> = (0..=MAX_PROJECT_PATHS).map(|i| format!("f{i}")).collect();
    let got = problems(&many);
    assert_eq!(got[0].0, "at.project");
    let mut p = Problems::default();
    assert!(compile(&[], "at", &mut p).is_none());
    assert!(p.0.is_empty());
}

#[test]
fn output_schema_keeps_the_selected_properties() {
    let schema = json!({
        "type": "object",
        "description": "A list of pods.",
        "required": ["items", "kind"],
        "properties": {
            "kind": {"type": "string"},
            "apiVersion": {"type": "string"},
            "items": {"type": "array", "items": {"$ref": "#/$defs/Pod"}},
        },
        "$defs": {
            "Pod": {"type": "object", "properties": {
                "metadata": {"$ref": "#/$defs/Meta"},
                "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
            }},
            "Meta": {"type": "object", "properties": {"name": {"type": "string"}, "uid": {"type": "string"}}},
        }
    });
    let pj = projection(&["items[].metadata.name", "items[].status.phase", "kind"]);
    let out = pj.output_schema(&schema).expect("projectable");
    assert_eq!(
        out,
        json!({
            "type": "object",
            "description": "A list of pods.",
            "properties": {
                "kind": {"type": "string"},
                "items": {"type": "array", "items": {"type": "object", "properties": {
                    "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
                    "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                }}},
            }
        })
    );
    // The projected answer matches it.
    let compiled = crate::schema::Schema::compile(&out).expect("a schema");
    assert!(compiled.is_valid(&pj.apply(pods()).expect("projected")));
    // A whole sub-schema that refers to $defs keeps those it reaches, through one another.
    let out = projection(&["items"])
        .output_schema(&schema)
        .expect("projectable");
    assert_eq!(out["$defs"], schema["$defs"]);
    let out = projection(&["items[].metadata"])
        .output_schema(&schema)
        .expect("projectable");
    assert_eq!(out["$defs"], json!({"Meta": schema["$defs"]["Meta"]}));
    assert!(out["properties"].get("kind").is_none());
}

#[test]
fn output_schema_is_dropped_when_it_cannot_be_told() {
    let composed = json!({"type": "object", "properties": {
        "a": {"oneOf": [{"type": "object"}, {"type": "string"}]}}});
    assert_eq!(projection(&["a.b"]).output_schema(&composed), None);
    // Selecting the composed value whole is fine.
    assert!(projection(&["a"]).output_schema(&composed).is_some());
    let dangling = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}});
    assert_eq!(projection(&["a.b"]).output_schema(&dangling), None);
    let looping = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/L"}},
        "$defs": {"L": {"$ref": "#/$defs/L"}}});
    assert_eq!(projection(&["a.b"]).output_schema(&looping), None);
    // An array top is no output schema.
    assert_eq!(
        projection(&["[].id"]).output_schema(&json!({"type": "array"})),
        None
    );
    // Free-form and forbidden properties.
    let free =
        json!({"type": "object", "additionalProperties": false, "properties": {"x": {"type": "integer"}}});
    assert_eq!(
        projection(&["x", "y"]).output_schema(&free),
        Some(json!({"type": "object", "properties": {"x": {"type": "integer"}}}))
    );
    let open = json!({"type": "object"});
    assert_eq!(
        projection(&["y.z"]).output_schema(&open),
        Some(json!({"type": "object", "properties": {"y": true}}))
    );
}
