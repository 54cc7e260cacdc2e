//! Every McpServer of deploy/samples renders to a valid config and builds its children,
//! offline: a sample a user copies never starts as `ConfigValid=False`.

use std::collections::BTreeSet;

use quiver_operator::build::{ApiServer, Defaults, build};
use quiver_operator::crd::McpServer;
use quiver_operator::render::render;

fn samples() -> Vec<(String, Vec<serde_json::Value>)> {
    let dir = format!("{}/../deploy/samples", env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let docs = text
                .split("\n---\n")
                .map(|d| serde_saphyr::from_str::<serde_json::Value>(d).unwrap())
                .collect();
            (p.file_name().unwrap().to_string_lossy().into_owned(), docs)
        })
        .collect()
}

#[test]
fn every_sample_mcpserver_renders_and_builds() {
    let defaults = Defaults {
        server_image: "quiver-server:t".into(),
        image_pull_policy: "IfNotPresent".into(),
        service_monitors: false,
        service_monitor_labels: Default::default(),
        catalog_prefix: "dev.quiver".into(),
    };
    let mut checked = 0;
    for (file, docs) in samples() {
        // ConfigMaps a sample ships for its own `toolsFrom`.
        let shipped: Vec<&serde_json::Value> = docs.iter().filter(|d| d["kind"] == "ConfigMap").collect();
        for doc in docs.iter().filter(|d| d["kind"] == "McpServer") {
            let mut doc = doc.clone();
            doc["metadata"]["namespace"] = "ns".into();
            doc["metadata"]["uid"] = "u-1".into();
            let name = doc["metadata"]["name"].as_str().unwrap().to_owned();
            let mcp: McpServer = serde_json::from_value(doc).unwrap_or_else(|e| panic!("{file}/{name}: {e}"));
            let fetched = mcp
                .spec
                .tools_from
                .iter()
                .map(|f| {
                    let r = &f.config_map_key_ref;
                    shipped
                        .iter()
                        .find(|cm| cm["metadata"]["name"] == r.name.as_str())
                        .and_then(|cm| cm["data"][r.key.as_str()].as_str().map(str::to_owned))
                })
                .collect();
            let rendered = render(&mcp, &fetched)
                .unwrap_or_else(|e| panic!("{file}/{name} is invalid: {}", e.message()));
            let children = build(&mcp, &rendered, &defaults, &ApiServer::default())
                .unwrap_or_else(|_| panic!("{file}/{name} does not build"));
            assert_eq!(children.deployment.metadata.name.as_deref(), Some(name.as_str()));
            checked += 1;
        }
    }
    assert!(checked >= 20, "samples checked: {checked}");
}

#[test]
fn the_rest_api_sample_reads_its_token_from_a_secret_with_egress_and_monitoring() {
    let (_, docs) = samples().into_iter().find(|(f, _)| f == "rest-api.yaml").unwrap();
    let mut doc = docs.into_iter().find(|d| d["kind"] == "McpServer").unwrap();
    doc["metadata"]["namespace"] = "ns".into();
    doc["metadata"]["uid"] = "u-1".into();
    let mcp: McpServer = serde_json::from_value(doc).unwrap();
    let rendered = render(&mcp, &vec![]).unwrap();
    assert_eq!(rendered.secrets, BTreeSet::from(["github-api".to_owned()]));
    assert!(!rendered.yaml.contains("github-token-goes-here"));
    let defaults = Defaults {
        server_image: "quiver-server:t".into(),
        image_pull_policy: "IfNotPresent".into(),
        service_monitors: false,
        service_monitor_labels: Default::default(),
        catalog_prefix: "dev.quiver".into(),
    };
    let c = build(&mcp, &rendered, &defaults, &ApiServer::default()).unwrap();
    assert!(c.service_monitor.is_some());
    let egress = c.network_policy.unwrap().spec.unwrap().egress.unwrap();
    assert!(egress.iter().any(|r| r.to.iter().flatten().any(|p| {
        p.ip_block
            .as_ref()
            .is_some_and(|b| b.cidr == "0.0.0.0/0" && b.except.iter().flatten().any(|e| e == "10.0.0.0/8"))
    })));
}
