//! The table of quiver-server flags (docs/operator.md, `## Running the server`) is checked
//! against the command line the binary parses: a flag renamed, added or removed without its
//! row fails here. Hidden flags (for tests only, not in `--help`) are not documented.

use std::collections::BTreeSet;

use clap::CommandFactory;
use quiver_server::cli::Cli;

#[test]
fn operator_md_lists_every_server_flag_and_no_other() {
    let code: BTreeSet<String> = Cli::command()
        .get_arguments()
        .filter(|a| !a.is_hide_set())
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

/// The Redis ACLs docs/governance.md gives a Quiver user are the commands the code sends (the
/// shared-limit and shared-task tests run as users with exactly these).
#[test]
fn governance_md_gives_the_redis_acl_users_the_commands_the_code_sends() {
    let doc =
        std::fs::read_to_string(format!("{}/../docs/governance.md", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let limits = quiver_server::limits::redis::ACL_COMMANDS;
    let tasks = quiver_server::dispatch::TASKS_REDIS_ACL_COMMANDS;
    for (acl, keys) in [
        (limits, quiver_server::limits::redis::ACL_KEYS),
        (tasks, "~payments/billing/*"),
    ] {
        let acl = acl.split_whitespace().collect::<Vec<_>>().join(" ");
        let line = format!("resetkeys {keys} resetchannels -@all {acl}");
        assert!(
            doc.lines()
                .any(|l| l.starts_with("ACL SETUSER ") && l.ends_with(&line)),
            "docs/governance.md has no `ACL SETUSER ... {line}`"
        );
    }
}

/// The metrics of users' upstream sign-in in docs/observability.md's table are the ones the
/// server registers.
#[test]
fn observability_md_lists_every_oauth_metric() {
    let m = quiver_server::metrics::Metrics::new("test", "system");
    // Families whose series come with use.
    m.oauth.sign_in("notes", "ok");
    m.oauth.refresh("notes", "ok");
    m.oauth.revocation("notes", "ok");
    let code: BTreeSet<String> = m
        .encode()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE quiver_oauth_"))
        .map(|l| {
            let mut parts = l.split_whitespace();
            let (name, kind) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
            let suffix = if kind == "counter" { "_total" } else { "" };
            format!("quiver_oauth_{name}{suffix}")
        })
        .collect();
    assert!(code.len() >= 4, "{code:?}");
    let doc =
        std::fs::read_to_string(format!("{}/../docs/observability.md", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let documented: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `quiver_oauth_"))
        .filter_map(|l| l.split('`').next())
        .map(|n| format!("quiver_oauth_{n}"))
        .collect();
    assert_eq!(
        documented, code,
        "docs/observability.md's oauth metrics and the server's differ"
    );
}

/// The Redis ACL docs/upstreams.md gives the token vault's user is what the vault sends.
#[test]
fn upstreams_md_gives_the_vaults_redis_user_the_commands_the_code_sends() {
    let doc =
        std::fs::read_to_string(format!("{}/../docs/upstreams.md", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let acl = quiver_server::oauth::vault::ACL_COMMANDS
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    // The pattern of one prefix, its hash written `HASH` as the doc explains it.
    let keys = quiver_server::oauth::vault::acl_keys("PREFIX")
        .replace(&quiver_server::oauth::vault::prefix_hash("PREFIX"), "HASH");
    let line = format!("resetkeys {keys} resetchannels -@all {acl}");
    assert!(
        doc.lines()
            .any(|l| l.starts_with("ACL SETUSER ") && l.ends_with(&line)),
        "docs/upstreams.md has no `ACL SETUSER ... {line}`"
    );
}
