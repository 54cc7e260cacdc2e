//! The real binary reaps what exec tools orphan: it makes itself a child subreaper (it is
//! PID 1 in its image), so a process that leaves its run's group and outlives its parent
//! is re-parented to the server, and is waited for when it exits instead of staying a zombie.

mod real_binary;

use std::time::{Duration, Instant};

use real_binary::{PATIENCE, http, start_http_with};

/// `(state, ppid)` of a process, from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(char, u32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = s.get(s.rfind(')')? + 1..)?.split_ascii_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.next()?.parse().ok()?))
}

#[test]
fn orphans_that_escape_their_group_are_reparented_and_reaped() {
    // The escaping process writes its pid once setsid has moved it to a session (and group)
    // of its own; the tool waits for that, so killing the run's group cannot race it.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    std::fs::write(
        dir.path().join("inner.sh"),
        // It lives until the test lets it go, however slow the machine.
        // The pid goes to its run's private directory (the only place it may write); the
        // release file is the test's.
        "echo $$ > \"$HOME/pid.tmp\" && mv \"$HOME/pid.tmp\" \"$HOME/pid\"; while [ ! -e \"$1.release\" ]; do /bin/sleep 0.01; done\n",
    )
    .unwrap();
    let tools = format!(
        r#"
tools:
  - name: escape
    handler:
      exec:
        command: [/bin/sh, -c, "/usr/bin/setsid /bin/sh {d}/inner.sh {d}/pid </dev/null >/dev/null 2>&1 & while [ ! -e $HOME/pid ]; do /bin/sleep 0.01; done; echo left $(cat $HOME/pid)"]
"#
    );
    let p = start_http_with(&tools, &[]);
    let server = p.child.id();
    let answer = http(
        p.mcp,
        "POST",
        "/mcp",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"escape","arguments":{}}}"#,
    )
    .expect("an answer");
    let orphan: u32 = answer
        .split(r#""text":"left "#)
        .nth(1)
        .and_then(|t| t.split('\\').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {answer}"));

    // Killing the run's group spared it (another group); its parent (sh) is gone, so it now
    // belongs to the server, the subreaper.
    let deadline = Instant::now() + PATIENCE;
    while stat(orphan).is_some_and(|(_, ppid)| ppid != server) {
        assert!(
            Instant::now() < deadline,
            "the orphan was never re-parented to the server"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        stat(orphan).is_some(),
        "the orphan lives on its own until released"
    );
    std::fs::write(dir.path().join("pid.release"), "").unwrap();
    // When it exits the server waits for it: it does not stay a zombie.
    let deadline = Instant::now() + PATIENCE;
    while let Some((state, ppid)) = stat(orphan) {
        assert!(
            Instant::now() < deadline,
            "pid {orphan} still there in state {state} (parent {ppid})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
