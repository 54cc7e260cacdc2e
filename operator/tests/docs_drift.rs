//! The operator's flag and metric tables in docs/ are checked against the code: a flag or a
//! metric renamed, added or removed without its documentation fails here.

use std::collections::BTreeSet;
use std::process::Command;

use quiver_operator::metrics::{Metrics, Outcome};

fn doc(path: &str) -> String {
    std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// The first-column code spans of the table rows in the section titled `heading`.
fn table_keys(text: &str, heading: &str) -> BTreeSet<String> {
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("no section `## {heading}`"));
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect()
}

/// Long flags of a `--help` text, without clap's own.
fn help_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("-")
                .and_then(|l| l.split_once(", "))
                .map_or(l, |(_, rest)| rest);
            l.strip_prefix("--")?
                .split([' ', '=', '<'])
                .next()
                .map(|f| format!("--{f}"))
        })
        .filter(|f| f != "--help" && f != "--version")
        .collect()
}

#[test]
fn operator_md_lists_every_flag_and_no_other() {
    let out = Command::new(env!("CARGO_BIN_EXE_quiver-operator"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let code = help_flags(&String::from_utf8(out.stdout).unwrap());
    assert!(code.contains("--watch-namespaces") && code.len() > 10, "{code:?}");
    let documented = table_keys(&doc("docs/operator.md"), "Flags");
    assert_eq!(
        documented, code,
        "docs/operator.md's Flags table and `quiver-operator --help` differ"
    );
}

#[test]
fn observability_md_lists_every_operator_metric() {
    let m = Metrics::default();
    // Families without a series are not printed: give the per-condition gauge its series.
    m.set_conditions(std::iter::empty());
    // The per-stage error counter has its series from the first failure.
    m.observe(
        std::time::Duration::ZERO,
        Outcome::Error {
            category: "conflict",
            stage: "apply",
            kind: "Deployment",
        },
        None,
    );
    let text = m.encode();
    let names: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let mut parts = l.split_whitespace();
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_owned()
            }
        })
        .collect();
    assert!(names.len() >= 6, "{names:?}");
    let documented: BTreeSet<String> = table_keys(&doc("docs/observability.md"), "Metrics reference")
        .into_iter()
        .filter(|k| k.starts_with("quiver_operator_"))
        .collect();
    assert_eq!(
        documented, names,
        "docs/observability.md's operator table and the operator's /metrics differ"
    );
}

/// The top-level fields of `spec` in the committed CRD (crds/mcpservers.quiver.dev.yaml).
fn crd_spec_fields() -> BTreeSet<String> {
    let crd: serde_json::Value = serde_saphyr::from_str(&doc("crds/mcpservers.quiver.dev.yaml")).unwrap();
    let versions = crd["spec"]["versions"].as_array().unwrap();
    versions
        .iter()
        .flat_map(|v| {
            v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
        })
        .collect()
}

/// The code spans (`` `…` ``) of `text`.
fn code_spans(text: &str) -> BTreeSet<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// A user upgrading reads CHANGELOG.md to learn what the API gained: every top-level field
/// of the McpServer spec is named there (as `` `FIELD` `` or `` `spec.FIELD` ``) under a
/// version heading.
#[test]
fn changelog_names_every_top_level_spec_field() {
    let fields = crd_spec_fields();
    assert!(
        fields.len() >= 30 && fields.contains("tools") && fields.contains("sessionAffinity"),
        "{fields:?}"
    );
    let changelog = doc("CHANGELOG.md");
    let versions = changelog
        .split_once("\n## ")
        .map(|(_, rest)| rest)
        .expect("CHANGELOG.md has no `## VERSION` section");
    let named = code_spans(versions);
    let missing: Vec<&String> = fields
        .iter()
        .filter(|f| !named.contains(f.as_str()) && !named.contains(format!("spec.{f}").as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "CHANGELOG.md does not name these McpServer spec fields under a version: {missing:?}"
    );
}
