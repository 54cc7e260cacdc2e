//! Each program the server starts (a stdio upstream's process, an exec tool's run) gets a
//! directory of its own as `HOME` and `TMPDIR`, on the real binary: another child can
//! neither read what it wrote there nor write anywhere else it could share, and the
//! directory goes when the run ends.

mod real_binary;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Stdio;

use real_binary::{Proc, free_port, server_as_nobody, tool_text, wait_for};

/// A stdio MCP server that writes a note into its HOME and TMPDIR when it starts; its tool
/// `where` answers with its HOME.
const KEEPER: &str = r#"
printf zq-keeper-home-note-4471 > "$HOME/note"
printf zq-keeper-tmp-note-8820 > "$TMPDIR/tmpnote"
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/^{"jsonrpc":"2.0","id":\([0-9][0-9]*\).*/\1/p')
  case "$line" in
    *'"method":"initialize"'*)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"keeper","version":"1"}}}\n' "$id" ;;
    *'"method":"tools/list"'*)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"where","inputSchema":{"type":"object"}}]}}\n' "$id" ;;
    *'"method":"tools/call"'*)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"%s"}]}}\n' "$id" "$HOME" ;;
  esac
done
"#;

/// An exec tool run that reads the keeper's directory (given as `$1`) and tries writing to its own HOME, to `/tmp` and `/dev/shm`, and into
/// the keeper's directory.
const SNOOP: &str = r#"
printf 'HOME=%s ' "$HOME"
cat "$1/note" "$1/tmpnote" 2>/dev/null
echo zq > "$HOME/mine" 2>/dev/null && printf 'WROTE-HOME '
echo zq > "/tmp/zq-shared-$$" 2>/dev/null && printf 'WROTE-TMP ' && rm -f "/tmp/zq-shared-$$"
echo zq > "/dev/shm/zq-shared-$$" 2>/dev/null && printf 'WROTE-SHM ' && rm -f "/dev/shm/zq-shared-$$"
echo zq > "$1/planted" 2>/dev/null && printf 'PLANTED '
echo quiet > /dev/null && printf 'DEVNULL '
printf 'END'
"#;

fn call(p: &Proc, tool: &str, args: &str) -> String {
    tool_text(p, "", tool, args)
}

#[test]
fn children_cannot_read_each_others_home_and_write_only_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    // The server's TMPDIR, where it makes its children's directories.
    let tmp = d.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    // What a child of an earlier server left behind (a container restarted on the same
    // scratch volume keeps it), readable to every uid but for the confinement.
    let stale = tmp.join("quiver-children-424242-0011223344556677/child-0");
    std::fs::create_dir_all(&stale).unwrap();
    for dir in [stale.parent().unwrap(), stale.as_path()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(stale.join("note"), "zq-stale-home-note-5150").unwrap();
    std::fs::write(stale.join("tmpnote"), "zq-stale-tmp-note-5151").unwrap();
    std::fs::write(d.join("keeper.sh"), KEEPER).unwrap();
    std::fs::write(d.join("snoop.sh"), SNOOP).unwrap();
    let tools = format!(
        "tools:\n  - name: snoop\n    input: {{dir: string}}\n    handler: {{exec: {{command: [/bin/sh, {d}/snoop.sh, \"{{{{dir}}}}\"]}}}}\n\
         upstreams:\n  - name: keeper\n    stdio: {{command: [/bin/sh, {d}/keeper.sh]}}\n    tools: {{prefix: keeper_}}\n",
        d = d.display()
    );
    std::fs::write(d.join("tools.yaml"), tools).unwrap();
    let (mcp, admin) = (free_port(), free_port());
    // As in a pod: not root.
    let child = server_as_nobody(d)
        .arg(format!("--config=file:{}/tools.yaml", d.display()))
        .arg(format!("--listen=127.0.0.1:{mcp}"))
        .arg(format!("--admin-listen=127.0.0.1:{admin}"))
        .env("TMPDIR", &tmp)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let server = Proc::ready(child, mcp, admin, tempfile::tempdir().unwrap());
    let mut home = String::new();
    wait_for("the keeper's tool", || {
        home = call(&server, "keeper_where", "{}");
        !home.is_empty()
    });
    let home = std::path::PathBuf::from(home);
    // Its own directory, private, under the server's TMPDIR, with what it wrote.
    assert!(home.starts_with(&tmp), "{}", home.display());
    let meta = std::fs::metadata(&home).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o700, "{}", home.display());
    wait_for("the keeper's notes", || {
        home.join("note").exists() && home.join("tmpnote").exists()
    });

    let out = call(
        &server,
        "snoop",
        &serde_json::json!({"dir": home.display().to_string()}).to_string(),
    );
    assert!(out.ends_with("END"), "the snoop did not run through: {out}");
    for v in ["zq-keeper-home-note-4471", "zq-keeper-tmp-note-8820"] {
        assert!(!out.contains(v), "an exec tool read the keeper's {v}: {out}");
    }
    // (Names may be listed, as in every hidden tree: they are numbers.)
    assert!(out.contains("WROTE-HOME") && out.contains("DEVNULL"), "{out}");
    for w in ["WROTE-TMP", "WROTE-SHM", "PLANTED"] {
        assert!(
            !out.contains(w),
            "an exec tool wrote where others read ({w}): {out}"
        );
    }
    assert!(!home.join("planted").exists());
    // The run's directory went with it.
    let snoop_home = out
        .strip_prefix("HOME=")
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("no HOME in {out}"));
    assert_ne!(std::path::Path::new(snoop_home), home);
    assert!(snoop_home.starts_with(&*tmp.to_string_lossy()), "{snoop_home}");
    wait_for("the run's directory removed", || {
        !std::path::Path::new(snoop_home).exists()
    });
    // An earlier run's directories are hidden as well.
    let out = call(
        &server,
        "snoop",
        &serde_json::json!({"dir": stale.display().to_string()}).to_string(),
    );
    assert!(out.ends_with("END"), "the snoop did not run through: {out}");
    assert!(
        !out.contains("zq-stale"),
        "an exec tool read an earlier run's child's files: {out}"
    );
    // The keeper's, whose process still runs, stays.
    assert!(home.join("note").exists());
}
