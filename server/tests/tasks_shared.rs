//! Tasks shared by replicas: two real servers over one real Redis (Debian's redis-server,
//! `QUIVER_REDIS_SERVER` or scripts/redis.sh). A task started through one is read and
//! cancelled through the other, and a stopping server finishes its tasks within its drain or
//! records why it could not. Over TLS with client certificates (made by the openssl
//! command) and an ACL user limited to the documented commands, the same holds; a server
//! that does not trust Redis's certificate answers a clear, counted error.

mod real_binary;

use std::process::{Command, Stdio};

use real_binary::{
    PATIENCE, Proc, free_port, http_with, metric, start_http_env, terminate, wait_exit, wait_for,
};
use serde_json::{Value, json};

const TOOLS: &str = "tools:
  - {name: brief, handler: {exec: {command: [/bin/sh, -c, 'sleep 1; echo brief-done']}}}
  - {name: endless, handler: {exec: {command: [/bin/sleep, '600']}}}
  - name: confirm
    task: required
    handler: {elicit: {key: sure, message: Proceed?, schema: {type: object, properties: {ok: {type: boolean}}, required: [ok]}}}
";

type Redis = real_binary::Service;

fn redis() -> Redis {
    start_redis(|port| vec!["--port".into(), port.to_string()])
}

/// A redis-server on loopback listening as `listen(port)` says.
fn start_redis(listen: impl FnOnce(u16) -> Vec<String>) -> Redis {
    let bin = real_binary::provided("QUIVER_REDIS_SERVER", "redis.sh");
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(bin)
        .args(listen(port))
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server");
    wait_for("redis to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    Redis { child, port, dir }
}

fn replica(r: &Redis, extra: &[&str]) -> Proc {
    let addr = format!("--tasks-redis=127.0.0.1:{}", r.port);
    let mut args = vec![addr.as_str(), "--tasks-redis-prefix=it/ns/srv/"];
    args.extend_from_slice(extra);
    start_http_env(TOOLS, &args, &[])
}

/// A 2026-07-28 request of a client that declared the tasks extension (and elicitation).
fn rpc(p: &Proc, method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}, "extensions": {"io.modelcontextprotocol/tasks": {}}},
    });
    let name = params["name"]
        .as_str()
        .or(params["taskId"].as_str())
        .unwrap_or_default();
    // Only a name a header can carry (the forged ids below are sent without one).
    let name = if name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.is_empty()
        && name.len() < 80
    {
        format!("Mcp-Name: {name}\r\n")
    } else {
        String::new()
    };
    let headers = format!("MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: {method}\r\n{name}");
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).to_string();
    let resp = http_with(p.mcp, "POST", "/mcp", &headers, &body).expect("an answer");
    serde_json::from_str(resp.split_once("\r\n\r\n").map_or("", |(_, b)| b))
        .unwrap_or_else(|e| panic!("{e}: {resp}"))
}

fn start(p: &Proc, tool: &str) -> String {
    let created = rpc(p, "tools/call", json!({"name": tool, "arguments": {}}));
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    created["result"]["taskId"]
        .as_str()
        .expect("a task id")
        .to_owned()
}

/// The task's state through `p`, once it is no longer working.
fn ended(p: &Proc, id: &str) -> Value {
    let mut got = Value::Null;
    wait_for("the task to end", || {
        got = rpc(p, "tasks/get", json!({"taskId": id}));
        // Polling this much faster than the task's pollInterval, the client (one address)
        // is told to wait now and then (-32004): it asks again.
        got["error"]["code"] != -32004 && got["result"]["status"] != "working"
    });
    got["result"].clone()
}

/// The pids of the children of `pid` running `/bin/sleep`.
fn sleeping_children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            // pid (comm) state ppid ...
            let after = stat.rsplit_once(") ").map_or("", |(_, a)| a);
            stat.contains("(sleep)") && after.split(' ').nth(1) == Some(&pid.to_string())
        })
        .collect()
}

#[test]
fn a_task_started_on_one_replica_is_read_and_cancelled_through_another() {
    let r = redis();
    let (a, b) = (replica(&r, &[]), replica(&r, &[]));
    let id = start(&a, "brief");
    let seen = rpc(&b, "tasks/get", json!({"taskId": id}));
    assert!(
        ["working", "completed"].contains(&seen["result"]["status"].as_str().unwrap_or_default()),
        "known to the other replica at once: {seen}"
    );
    let done = ended(&b, &id);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["content"][0]["text"].as_str().map(str::trim),
        Some("brief-done"),
        "{done}"
    );

    // Cancelled through b: a stops the work (its process ends) and the task stays cancelled.
    let id = start(&a, "endless");
    wait_for("the tool's process to start", || {
        !sleeping_children(a.child.id()).is_empty()
    });
    let ack = rpc(&b, "tasks/cancel", json!({"taskId": id}));
    assert!(ack.get("error").is_none(), "{ack}");
    assert_eq!(
        rpc(&a, "tasks/get", json!({"taskId": id}))["result"]["status"],
        "cancelled"
    );
    wait_for("the cancelled task's process to end", || {
        sleeping_children(a.child.id()).is_empty()
    });
    assert_eq!(
        rpc(&b, "tasks/get", json!({"taskId": id}))["result"]["status"],
        "cancelled"
    );

    // An id neither replica issued, a malformed one, one of another prefix: unknown on both.
    for p in [&a, &b] {
        for forged in ["0".repeat(32), "x".repeat(65), String::new()] {
            let e = rpc(p, "tasks/get", json!({"taskId": forged}));
            assert_eq!(e["error"]["code"], -32602, "{e}");
        }
    }
    let other = start_http_env(
        TOOLS,
        &[
            &format!("--tasks-redis=127.0.0.1:{}", r.port),
            "--tasks-redis-prefix=it/ns/other/",
        ],
        &[],
    );
    let e = rpc(&other, "tasks/get", json!({"taskId": id}));
    assert_eq!(
        e["error"]["code"], -32602,
        "another server's tasks are not this one's: {e}"
    );
}

#[test]
fn a_question_of_a_task_on_one_replica_is_answered_through_another() {
    let r = redis();
    let (a, b) = (replica(&r, &[]), replica(&r, &[]));
    let id = start(&a, "confirm");
    let mut got = Value::Null;
    wait_for("the task to ask", || {
        got = rpc(&b, "tasks/get", json!({"taskId": id}));
        got["result"]["status"] == "input_required"
    });
    assert_eq!(
        got["result"]["inputRequests"]["sure"]["method"], "elicitation/create",
        "{got}"
    );
    let ack = rpc(
        &b,
        "tasks/update",
        json!({"taskId": id, "inputResponses": {"sure": {"action": "accept", "content": {"ok": true}}}}),
    );
    assert!(ack.get("error").is_none(), "{ack}");
    let done = ended(&b, &id);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["content"]["ok"], true,
        "{done}"
    );
}

#[test]
fn a_stopping_replica_finishes_its_tasks_within_its_drain_and_fails_the_rest_saying_why() {
    let r = redis();
    let mut a = replica(&r, &["--tasks-drain=3s"]);
    let b = replica(&r, &[]);
    let brief = start(&a, "brief");
    let endless = start(&a, "endless");
    terminate(&a);
    let done = ended(&b, &brief);
    assert_eq!(done["status"], "completed", "finished while draining: {done}");
    let failed = ended(&b, &endless);
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], -32603, "{failed}");
    let message = failed["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("stopped before the task finished"), "{message}");
    assert!(
        wait_exit(&mut a, PATIENCE).is_some(),
        "the server exits after its drain"
    );
    assert!(sleeping_children(a.child.id()).is_empty());
}

#[test]
fn without_redis_the_server_says_so_and_keeps_its_working_answers() {
    // A Redis that is gone: task operations answer a clear internal error, never a hang,
    // and calls that are not tasks go on.
    let port = free_port();
    let p = start_http_env(
        TOOLS,
        &[
            &format!("--tasks-redis=127.0.0.1:{port}"),
            "--tasks-redis-timeout=200ms",
        ],
        &[],
    );
    let e = rpc(&p, "tools/call", json!({"name": "brief", "arguments": {}}));
    assert_eq!(e["error"]["code"], -32603, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("task store is unavailable"),
        "{e}"
    );
    let e = rpc(&p, "tasks/get", json!({"taskId": "0".repeat(32)}));
    assert_eq!(e["error"]["code"], -32603, "{e}");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "brief", "arguments": {}}});
    let plain = http_with(p.mcp, "POST", "/mcp", "", &body.to_string()).expect("an answer");
    assert!(plain.contains("brief-done"), "{plain}");
}

#[test]
fn replicas_share_tasks_over_mutual_tls_as_an_acl_user_and_an_untrusted_redis_is_a_counted_error() {
    let pki = tempfile::tempdir().unwrap();
    real_binary::make_pki(pki.path());
    let p = |n: &str| pki.path().join(n).to_string_lossy().into_owned();
    // TLS only, client certificates required, and a user allowed the documented commands on
    // this server's keys alone.
    let acl = quiver_server::dispatch::TASKS_REDIS_ACL_COMMANDS;
    let r = start_redis(|port| {
        let mut args: Vec<String> = [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-auth-clients",
            "yes",
        ]
        .map(String::from)
        .to_vec();
        for (flag, file) in [
            ("--tls-cert-file", "server.crt"),
            ("--tls-key-file", "server.key"),
            ("--tls-ca-cert-file", "ca.crt"),
        ] {
            args.extend([flag.to_owned(), p(file)]);
        }
        args.extend(
            [
                "--user",
                "quiver",
                "on",
                ">tasks-pw",
                "~it/ns/srv/*",
                "resetchannels",
                "-@all",
            ]
            .map(String::from),
        );
        args.extend(acl.split_whitespace().map(String::from));
        args
    });
    let flags = |ca: &str| {
        vec![
            format!("--tasks-redis=localhost:{}", r.port),
            "--tasks-redis-prefix=it/ns/srv/".to_owned(),
            "--tasks-redis-tls".to_owned(),
            format!("--tasks-redis-ca={}", p(ca)),
            format!("--tasks-redis-client-cert={}", p("client.crt")),
            format!("--tasks-redis-client-key={}", p("client.key")),
            "--tasks-redis-username=quiver".to_owned(),
        ]
    };
    // A tool reading the CA and the client key: the key is the server's alone.
    let tools = format!(
        "{TOOLS}  - {{name: peek, handler: {{exec: {{command: [/bin/sh, -c, 'cat {} {} || true']}}}}}}\n",
        p("ca.crt"),
        p("client.key")
    );
    let replica = |ca: &str| {
        let flags = flags(ca);
        let args: Vec<&str> = flags.iter().map(String::as_str).collect();
        start_http_env(&tools, &args, &[("QUIVER_TASKS_REDIS_PASSWORD", "tasks-pw")])
    };
    let (a, b) = (replica("ca.crt"), replica("ca.crt"));
    let id = start(&a, "brief");
    let done = ended(&b, &id);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["content"][0]["text"].as_str().map(str::trim),
        Some("brief-done"),
        "{done}"
    );
    let peeked = ended(&a, &start(&b, "peek")).to_string();
    assert!(
        peeked.contains("BEGIN CERTIFICATE") && !peeked.contains("PRIVATE KEY"),
        "{peeked}"
    );
    assert_eq!(
        metric(a.admin, "quiver_task_store_failures_total{op=\"create\"}"),
        Some(0.0)
    );

    // Redis's certificate from a CA this replica does not trust: the store is unavailable,
    // the error says why, and the failure is counted.
    let untrusting = replica("other-ca.crt");
    let refused = rpc(
        &untrusting,
        "tools/call",
        json!({"name": "brief", "arguments": {}}),
    );
    assert_eq!(refused["error"]["code"], -32603, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("TLS handshake failed"), "{refused}");
    assert_eq!(
        metric(
            untrusting.admin,
            "quiver_task_store_failures_total{op=\"create\"}"
        ),
        Some(1.0)
    );
}
