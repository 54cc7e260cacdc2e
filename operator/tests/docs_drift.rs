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
