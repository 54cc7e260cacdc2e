//! A bridged upstream (`quiver-server bridge`, as in an upstream sidecar) on the real
//! binaries: the server reaches it through its socket and token, and a child of the server
//! (an exec tool) that knows the socket's path can neither read the token, nor talk to the
//! upstream's program, nor put its own socket in the bridge's place.

mod real_binary;

use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Stdio};

use real_binary::{Proc, free_port, server_as_nobody, tool_text, wait_for};

/// A stdio MCP server with one tool, `answer`.
const MCP: &str = r#"
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/^{"jsonrpc":"2.0","id":\([0-9][0-9]*\).*/\1/p')
  case "$line" in
    *'"method":"initialize"'*)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"bridged","version":"1"}}}\n' "$id" ;;
    *'"method":"tools/list"'*)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"answer","inputSchema":{"type":"object"}}]}}\n' "$id" ;;
    *'"method":"tools/call"'*)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"zq-bridged-answer-6612"}]}}\n' "$id" ;;
  esac
done
"#;

/// What a child of the server tries with the socket at SOCK: read its token, speak MCP to
/// it (with and without a token line first), and replace it with a socket of its own.
const PROBE: &str = r#"
import os, socket
SOCK = "SOCKPATH"
out = ["PROBED"]
try:
    out.append("TOKEN=" + open(SOCK + ".token").read().strip())
except Exception as e:
    out.append("TOKEN-DENIED=" + type(e).__name__)
init = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"p","version":"1"}}}\n'
for first in [b"", b"0" * 64 + b"\n"]:
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(SOCK)
        s.sendall(first + init)
        got = b""
        while b"\n" not in got:
            try:
                chunk = s.recv(4096)
            except socket.timeout:
                break
            if not chunk:
                break
            got += chunk
        out.append("GOT=[" + got.decode(errors="replace").replace(" ", "") + "]")
    except Exception as e:
        out.append("TALK-FAILED=" + type(e).__name__)
try:
    mine = socket.socket(socket.AF_UNIX)
    mine.bind(SOCK + ".mine")
    os.rename(SOCK + ".mine", SOCK)
    out.append("REPLACED")
except Exception as e:
    out.append("REPLACE-DENIED=" + type(e).__name__)
print(" ".join(out))
"#;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tools_call(p: &Proc, tool: &str) -> String {
    tool_text(p, "", tool, "{}")
}

#[test]
fn a_child_of_the_server_cannot_reach_a_bridged_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The socket directory, writable by the bridge's user (the sidecar's volume).
    let run = d.join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = run.join("bridge.sock");
    let sock_s = sock.display().to_string();
    std::fs::write(d.join("mcp.sh"), MCP).unwrap();
    std::fs::write(d.join("probe.py"), PROBE.replace("SOCKPATH", &sock_s)).unwrap();

    let _bridge = Killed(
        server_as_nobody(d)
            .args(["bridge", "--socket", &sock_s, "--max-processes", "4", "--"])
            .arg("/bin/sh")
            .arg(d.join("mcp.sh"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("the bridge's socket", || sock.exists());
    let token = std::fs::read_to_string(format!("{sock_s}.token")).unwrap();
    assert_eq!(token.trim().len(), 64, "{token}");

    let tools = format!(
        "tools:\n  - name: probe\n    handler: {{exec: {{command: [/usr/bin/python3, {d}/probe.py], timeout: 60s}}}}\n\
         upstreams:\n  - name: up\n    stdio: {{socket: {sock_s}}}\n    tools: {{prefix: up_}}\n",
        d = d.display()
    );
    std::fs::write(d.join("tools.yaml"), tools).unwrap();
    let (mcp, admin) = (free_port(), free_port());
    let child = server_as_nobody(d)
        .arg(format!("--config=file:{}/tools.yaml", d.display()))
        .arg(format!("--listen=127.0.0.1:{mcp}"))
        .arg(format!("--admin-listen=127.0.0.1:{admin}"))
        // Where the operator mounts socket directories, the server hides them by default.
        .arg(format!("--hide-from-children={}", run.display()))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let server = Proc::ready(child, mcp, admin, tempfile::tempdir().unwrap());
    // The server presents the token: the upstream's tool is served.
    wait_for("the bridged upstream's tool", || {
        tools_call(&server, "up_answer") == "zq-bridged-answer-6612"
    });

    let out = tools_call(&server, "probe");
    assert!(out.contains("PROBED"), "the probe did not run: {out}");
    assert!(out.contains("TOKEN-DENIED"), "a child read the token: {out}");
    assert!(!out.contains(token.trim()), "a child read the token: {out}");
    assert!(
        !out.contains("protocolVersion") && !out.contains("bridged"),
        "a child talked to the bridged program: {out}"
    );
    assert!(
        out.contains("REPLACE-DENIED") && !out.contains("REPLACED "),
        "a child replaced the socket: {out}"
    );
    // The bridge still serves the server afterwards.
    assert_eq!(tools_call(&server, "up_answer"), "zq-bridged-answer-6612");
}
