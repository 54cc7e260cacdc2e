//! The table of quiver-server flags (docs/operator.md, `## Running the server`) is checked
//! against the command line the binary parses: a flag renamed, added or removed without its
//! row fails here.

use std::collections::BTreeSet;

use clap::CommandFactory;
use quiver_server::cli::Cli;

#[test]
fn operator_md_lists_every_server_flag_and_no_other() {
    let code: BTreeSet<String> = Cli::command()
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|l| *l != "help" && *l != "version")
        .map(|l| format!("--{l}"))
        .collect();
    assert!(code.contains("--listen") && code.len() > 20, "{code:?}");
    let doc = std::fs::read_to_string(format!("{}/../docs/operator.md", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Running the server"))
        .expect("docs/operator.md has a `## Running the server` section");
    let documented: BTreeSet<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `--"))
        .filter_map(|l| l.split('`').next())
        .map(|f| format!("--{f}"))
        .collect();
    assert_eq!(
        documented, code,
        "docs/operator.md's server flag table and `quiver-server --help` differ"
    );
}
