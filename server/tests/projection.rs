//! Answer projection through the real quiver-server: a hand-written http tool and an imported
//! OpenAPI operation, both against a local HTTP target on 127.0.0.1 that answers a list of
//! pods, keep only the fields they name (text and structured content alike).

mod real_binary;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

use real_binary::{Proc, http, start_http_with};
use serde_json::{Value, json};

fn pods() -> Value {
    let pod = |name: &str, phase: &str| {
        json!({
            "metadata": {"name": name, "namespace": "default", "uid": "0b7c", "labels": {"app": "web"},
                         "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}]},
            "status": {"phase": phase, "podIP": "10.0.0.7", "conditions": [{"type": "Ready", "status": "True"}]}
        })
    };
    json!({
        "kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "981"},
        "items": [pod("web-0", "Running"), pod("web-1", "Pending"), {"metadata": {"name": "bare"}}]
    })
}

/// A target answering `GET /pods` with [`pods`] and anything else with plain text.
fn target() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
            }
            let (kind, body) = if first.starts_with("GET /pods ") {
                ("application/json", pods().to_string())
            } else {
                ("text/plain", "plain words, not JSON".to_owned())
            };
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

fn rpc(p: &Proc, method: &str, params: Value) -> Value {
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let resp = http(p.mcp, "POST", "/mcp", &req.to_string()).expect("an answer");
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str::<Value>(body).unwrap_or_else(|e| panic!("{e}: {resp}"))["result"].clone()
}

fn call(p: &Proc, tool: &str) -> Value {
    let r = rpc(p, "tools/call", json!({"name": tool, "arguments": {}}));
    assert_ne!(r["isError"], json!(true), "{tool}: {r}");
    r
}

/// An OpenAPI document of the target: `listPods`, whose answer schema is the pod list's.
fn document(port: u16) -> String {
    json!({
        "openapi": "3.0.3",
        "info": {"title": "pods", "version": "1"},
        "servers": [{"url": format!("http://127.0.0.1:{port}")}],
        "paths": {"/pods": {"get": {
            "operationId": "listPods",
            "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": {
                "$ref": "#/components/schemas/PodList"}}}}}
        }}},
        "components": {"schemas": {
            "PodList": {"type": "object", "required": ["items"], "properties": {
                "kind": {"type": "string"}, "apiVersion": {"type": "string"},
                "items": {"type": "array", "items": {"$ref": "#/components/schemas/Pod"}}}},
            "Pod": {"type": "object", "properties": {
                "metadata": {"type": "object", "properties": {"name": {"type": "string"}, "uid": {"type": "string"}}},
                "status": {"type": "object", "properties": {"phase": {"type": "string"}, "podIP": {"type": "string"}}}}}
        }}
    })
    .to_string()
}

#[test]
fn http_tools_and_imported_operations_keep_only_the_named_fields() {
    let port = target();
    // In a YAML flow list the paths are quoted (`[` opens a list there); a block list needs
    // no quotes, as the openapi source shows.
    let project = r#"["items[].metadata.name", "items[].status.phase", kind]"#;
    let tools = format!(
        "tools:\n  - name: pods\n    handler: {{http: {{url: \"http://127.0.0.1:{port}/pods\", project: {project}}}}}\n  \
         - name: whole\n    handler: {{http: {{url: \"http://127.0.0.1:{port}/pods\"}}}}\n  \
         - name: words\n    handler: {{http: {{url: \"http://127.0.0.1:{port}/text\", project: [a.b]}}}}\n\
         openapi:\n  - name: pods\n    document: {doc}\n    project:\n      listPods:\n        - items[].metadata.name\n        - items[].status.phase\n        - kind\n",
        doc = serde_json::to_string(&document(port)).unwrap(),
    );
    let p = start_http_with(&tools, &[]);
    let expected = json!({
        "kind": "PodList",
        "items": [
            {"metadata": {"name": "web-0"}, "status": {"phase": "Running"}},
            {"metadata": {"name": "web-1"}, "status": {"phase": "Pending"}},
            {"metadata": {"name": "bare"}},
        ]
    });
    for tool in ["pods", "listPods"] {
        let r = call(&p, tool);
        let text = r["content"][0]["text"].as_str().expect("a text block");
        assert_eq!(serde_json::from_str::<Value>(text).unwrap(), expected, "{tool}");
        assert_eq!(r["structuredContent"], expected, "{tool}");
    }
    // Without `project` the whole answer comes back; the projection is a fraction of it.
    let whole = call(&p, "whole");
    let whole_len = whole["content"][0]["text"].as_str().unwrap().len();
    assert_eq!(whole["structuredContent"], pods());
    assert!(expected.to_string().len() * 3 < whole_len, "{whole_len}");
    // A non-JSON answer is kept as it came.
    let words = call(&p, "words");
    assert_eq!(words["content"][0]["text"], "plain words, not JSON");
    // The imported tool's output schema is the projected one.
    let list = rpc(&p, "tools/list", json!({}));
    let tool = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "listPods")
        .expect("listPods is served");
    let out = &tool["outputSchema"];
    assert_eq!(out["properties"]["kind"], json!({"type": "string"}));
    assert!(out["properties"].get("apiVersion").is_none(), "{out}");
    assert!(out.get("required").is_none(), "{out}");
}

#[test]
fn a_bad_path_stops_the_server_naming_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tools.yaml");
    std::fs::write(
        &config,
        "tools:\n  - name: t\n    handler: {http: {url: \"http://127.0.0.1:9/x\", project: [ok, \"items[0].name\"]}}\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quiver-server"))
        .arg("check")
        .arg(format!("--config=file:{}", config.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("tools[0].handler.http.project[1]"), "{err}");
}
