//! CEL policies against the real binary: a caller's group decides which arguments it may
//! call a tool with, `tools/list` shows each caller only what it may call, a denial names
//! the policy and counts as `forbidden`, and an invalid expression at reload keeps the
//! working config.

mod real_binary;

use real_binary::{Proc, http, http_with, metric, start_http_env, wait_for};
use serde_json::{Value, json};

const TOKENS: &str = "sre-token-0123456789 scope=read group=sre\n\
                      dev-token-0123456789 scope=read group=dev\n";
const SRE: &str = "sre-token-0123456789";
const DEV: &str = "dev-token-0123456789";

const TOOLS: &str = "
policies:
  - name: no-prod-unless-sre
    expression: \"'sre' in caller.groups && args.namespace != 'prod'\"
    tools: [restart]
  - name: readers-only
    expression: \"'read' in caller.scopes\"
tools:
  - {name: status, handler: {template: ok}}
  - name: restart
    input: {namespace: string}
    handler: {template: 'restarted in {{namespace}}'}
  - name: scale
    input: {replicas: integer}
    policy: 'args.replicas <= 3'
    handler: {template: 'scaled to {{replicas}}'}
  - name: rollout
    input: {namespace: string}
    handler: {pipeline: [{tool: restart}]}
  - name: relabel
    input: {namespace: string, target: string}
    handler: {pipeline: [{tool: restart, input: {namespace: '{{target}}'}}]}
";

fn body(resp: &str) -> Value {
    let b = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(b).unwrap_or_else(|e| panic!("{e}: {resp}"))
}

fn rpc(p: &Proc, token: &str, method: &str, params: Value) -> String {
    let msg = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    http_with(
        p.mcp,
        "POST",
        "/mcp",
        &format!("Authorization: Bearer {token}\r\n"),
        &msg.to_string(),
    )
    .expect("an answer")
}

fn call(p: &Proc, token: &str, tool: &str, args: Value) -> String {
    rpc(p, token, "tools/call", json!({"name": tool, "arguments": args}))
}

fn listed(p: &Proc, token: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut params = json!({});
    loop {
        let r = body(&rpc(p, token, "tools/list", params));
        for t in r["result"]["tools"].as_array().expect("tools") {
            names.push(t["name"].as_str().unwrap().to_owned());
        }
        match r["result"]["nextCursor"].as_str() {
            Some(c) => params = json!({"cursor": c}),
            None => return names,
        }
    }
}

fn start(tools: &str) -> (Proc, tempfile::TempDir) {
    let secrets = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(secrets.path().join("clients")).unwrap();
    std::fs::write(secrets.path().join("clients").join("tokens"), TOKENS).unwrap();
    let source = format!("--secrets=dir:{}", secrets.path().display());
    let p = start_http_env(tools, &[&source, "--auth-tokens-secret=clients.tokens"], &[]);
    (p, secrets)
}

fn forbidden(p: &Proc) -> f64 {
    let m = http(p.admin, "GET", "/metrics", "").unwrap();
    m.lines()
        .find(|l| l.starts_with("quiver_refusals_total") && l.contains("\"forbidden\""))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn a_callers_group_decides_the_arguments_it_may_call_with() {
    let (p, _secrets) = start(TOOLS);
    let ok = call(&p, SRE, "restart", json!({"namespace": "dev"}));
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert_eq!(body(&ok)["result"]["content"][0]["text"], "restarted in dev");

    let before = forbidden(&p);
    for (token, ns) in [(SRE, "prod"), (DEV, "dev"), (DEV, "prod")] {
        let r = call(&p, token, "restart", json!({"namespace": ns}));
        assert!(r.starts_with("HTTP/1.1 403"), "{r}");
        let err = &body(&r)["error"];
        assert_eq!(err["code"], -32003, "{err}");
        assert_eq!(
            err["message"],
            "Forbidden: policy `no-prod-unless-sre` does not allow this call of tool restart"
        );
        assert_eq!(
            err["data"],
            json!({"tool": "restart", "policy": "no-prod-unless-sre"})
        );
        // The expression is the server's business; no scope would help, so no challenge.
        assert!(!r.contains("caller.groups"), "{r}");
        let head = r.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
        assert!(!head.contains("www-authenticate"), "{r}");
    }
    // A pipeline's step meets the policies of the tool it calls, with the arguments the
    // step sends and the caller's identity, as if the caller called that tool itself.
    let step_denied = |r: &str| {
        let b = body(r);
        assert_eq!(b["result"]["isError"], true, "{r}");
        assert_eq!(
            b["result"]["content"][0]["text"],
            "step 0 (restart): Forbidden: policy `no-prod-unless-sre` does not allow this call of tool restart",
            "{r}"
        );
    };
    step_denied(&call(&p, DEV, "rollout", json!({"namespace": "dev"})));
    let r = call(&p, SRE, "rollout", json!({"namespace": "dev"}));
    assert_eq!(
        body(&r)["result"]["content"][0]["text"],
        "restarted in dev",
        "{r}"
    );
    // Renamed arguments do not slip past it: what counts is the namespace `restart` gets.
    step_denied(&call(
        &p,
        SRE,
        "relabel",
        json!({"namespace": "dev", "target": "prod"}),
    ));
    let r = call(&p, SRE, "relabel", json!({"namespace": "prod", "target": "dev"}));
    assert_eq!(
        body(&r)["result"]["content"][0]["text"],
        "restarted in dev",
        "{r}"
    );
    // A policy runs before validation: the refused caller learns nothing of the schema.
    let r = call(&p, DEV, "restart", json!({"wrong": 1}));
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    // An inline policy is named after its tool.
    let r = call(&p, DEV, "scale", json!({"replicas": 9}));
    assert_eq!(
        body(&r)["error"]["message"],
        "Forbidden: the policy of tool scale does not allow this call"
    );
    let r = call(&p, DEV, "scale", json!({"replicas": 2}));
    assert_eq!(body(&r)["result"]["content"][0]["text"], "scaled to 2", "{r}");
    // Refused steps are the pipelines' tool errors, not refused requests.
    assert_eq!(forbidden(&p) - before, 5.0);
    // Callers are not labels.
    let m = http(p.admin, "GET", "/metrics", "").unwrap();
    let outcome = m
        .lines()
        .find(|l| {
            l.starts_with("quiver_requests_total{")
                && l.contains("method=\"tools/call\"")
                && l.contains("outcome=\"forbidden\"")
        })
        .unwrap_or_else(|| panic!("{m}"));
    assert!(outcome.ends_with(" 5"), "{outcome}");
    assert!(!m.contains("sre-token") && !m.contains("no-prod-unless-sre"));
}

#[test]
fn tools_list_shows_each_caller_what_it_may_call() {
    let (p, _secrets) = start(TOOLS);
    // `restart` is false for dev whatever the arguments: hidden, and so is the pipeline
    // that runs it. `scale` depends on the arguments alone: listed.
    assert_eq!(
        listed(&p, SRE),
        ["status", "restart", "scale", "rollout", "relabel"]
    );
    assert_eq!(listed(&p, DEV), ["status", "scale"]);
    // Pages are per caller too: one tool per page, cursors go on past hidden tools.
    let one_per_page = TOOLS.replace("policies:", "server: {pageSize: 1}\npolicies:");
    let (q, _s) = start(&one_per_page);
    assert_eq!(listed(&q, DEV), ["status", "scale"]);
    assert_eq!(
        listed(&q, SRE),
        ["status", "restart", "scale", "rollout", "relabel"]
    );
    let bad = body(&rpc(&q, DEV, "tools/list", json!({"cursor": "nope-v1"})));
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
}

#[test]
fn an_invalid_expression_at_reload_keeps_the_working_config() {
    let (p, _secrets) = start(TOOLS);
    let config = p._dir.path().join("tools.yaml");
    let write = |text: &str| {
        let tmp = p._dir.path().join("next.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &config).unwrap();
    };
    let reloads = |result: &str| {
        metric(
            p.admin,
            &format!("quiver_config_reloads_total{{result=\"{result}\"}}"),
        )
        .unwrap_or(0.0)
    };
    write(&TOOLS.replace("args.namespace != 'prod'", "args.namespace != prod"));
    wait_for("the invalid reload is counted", || reloads("invalid") >= 1.0);
    let status = body(&http(p.admin, "GET", "/status", "").unwrap());
    let problems = status.to_string();
    assert!(
        problems.contains("policies[0].expression: unknown variable `prod`"),
        "{problems}"
    );
    // The old policies still decide.
    assert!(call(&p, DEV, "restart", json!({"namespace": "dev"})).starts_with("HTTP/1.1 403"));
    assert!(call(&p, SRE, "restart", json!({"namespace": "dev"})).starts_with("HTTP/1.1 200"));

    // A valid change takes effect: dev may now restart outside prod.
    write(&TOOLS.replace("'sre' in caller.groups && ", ""));
    wait_for("the new policy serves", || {
        call(&p, DEV, "restart", json!({"namespace": "dev"})).starts_with("HTTP/1.1 200")
    });
    assert!(call(&p, DEV, "restart", json!({"namespace": "prod"})).starts_with("HTTP/1.1 403"));
    assert_eq!(
        listed(&p, DEV),
        ["status", "restart", "scale", "rollout", "relabel"]
    );
}

#[test]
fn without_access_or_policies_every_caller_gets_the_shared_pages() {
    let (p, _secrets) = start("tools:\n  - {name: status, handler: {template: ok}}\n");
    let msg = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let a = http_with(
        p.mcp,
        "POST",
        "/mcp",
        &format!("Authorization: Bearer {SRE}\r\n"),
        msg,
    )
    .unwrap();
    let b = http_with(
        p.mcp,
        "POST",
        "/mcp",
        &format!("Authorization: Bearer {DEV}\r\n"),
        msg,
    )
    .unwrap();
    assert_eq!(body(&a), body(&b));
    assert_eq!(body(&a)["result"]["tools"][0]["name"], "status");
}

/// A policy selecting an upstream applies to every tool imported from it (here the server
/// itself over stdio, serving one tool), reads `tool.upstream`, and hides those tools from
/// the callers it refuses.
#[test]
fn a_policy_on_an_upstream_governs_its_imported_tools() {
    let inner = tempfile::tempdir().unwrap();
    let inner_config = inner.path().join("inner.yaml");
    std::fs::write(
        &inner_config,
        "tools:\n  - {name: echo, input: {text: string}, handler: {template: 'echo {{text}}'}}\n",
    )
    .unwrap();
    let tools = format!(
        "policies:
  - name: inner-for-sre
    expression: \"'sre' in caller.groups && tool.upstream == 'inner' && tool.name.startsWith('inner_')\"
    upstreams: [inner]
tools:
  - {{name: local, handler: {{template: ok}}}}
upstreams:
  - name: inner
    stdio: {{command: [{bin}, --stdio, '--config=file:{cfg}', --admin-listen=off]}}
    tools: {{prefix: inner_}}
",
        bin = env!("CARGO_BIN_EXE_quiver-server"),
        cfg = inner_config.display(),
    );
    let (p, _secrets) = start(&tools);
    wait_for("the upstream's tool is imported", || {
        listed(&p, SRE).contains(&"inner_echo".to_owned())
    });
    assert_eq!(listed(&p, SRE), ["local", "inner_echo"]);
    assert_eq!(listed(&p, DEV), ["local"]);
    let r = call(&p, SRE, "inner_echo", json!({"text": "hi"}));
    assert_eq!(body(&r)["result"]["content"][0]["text"], "echo hi", "{r}");
    let r = call(&p, DEV, "inner_echo", json!({"text": "hi"}));
    assert_eq!(
        body(&r)["error"]["data"],
        json!({"tool": "inner_echo", "policy": "inner-for-sre"}),
        "{r}"
    );
    assert!(call(&p, DEV, "local", json!({})).starts_with("HTTP/1.1 200"));
}

/// Audit records name a session by a keyed tag, never by its id (a bearer capability on
/// Streamable HTTP), and a refused credential's record names no session at all, whatever
/// `Mcp-Session-Id` the request sent.
#[test]
fn audit_records_never_carry_a_session_id() {
    let secrets = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(secrets.path().join("clients")).unwrap();
    std::fs::write(secrets.path().join("clients").join("tokens"), TOKENS).unwrap();
    let trail = tempfile::tempdir().unwrap();
    let file = trail.path().join("audit.jsonl");
    let p = start_http_env(
        TOOLS,
        &[
            &format!("--secrets=dir:{}", secrets.path().display()),
            "--auth-tokens-secret=clients.tokens",
            &format!("--audit=file:{}", file.display()),
        ],
        &[],
    );
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let auth = format!("Authorization: Bearer {SRE}\r\n");
    let r = http_with(p.mcp, "POST", "/mcp", &auth, &init.to_string()).expect("an answer");
    let sid = r
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("mcp-session-id")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no session: {r}"));
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "status", "arguments": {}}})
    .to_string();
    let with = |token: &str| {
        format!(
            "Authorization: Bearer {token}\r\nMcp-Session-Id: {sid}\r\nMCP-Protocol-Version: 2025-11-25\r\n"
        )
    };
    let ok = http_with(p.mcp, "POST", "/mcp", &with(SRE), &call).expect("an answer");
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let refused =
        http_with(p.mcp, "POST", "/mcp", &with("not-a-valid-token-0123"), &call).expect("an answer");
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    wait_for("both records are written", || {
        metric(p.admin, "quiver_audit_records_total").unwrap_or(0.0) >= 2.0
    });
    let text = std::fs::read_to_string(&file).unwrap();
    let nonce = sid.split('.').next().unwrap();
    assert!(!text.contains(nonce), "{text}");
    let records: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let called = records
        .iter()
        .find(|r| r["event"] == "tools/call")
        .expect("the call");
    let tag = called["session"].as_str().expect("a session tag");
    assert!(
        tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()),
        "{tag}"
    );
    let denied = records
        .iter()
        .find(|r| r["event"] == "authentication")
        .expect("the 401");
    assert_eq!(denied["outcome"], "unauthenticated");
    assert!(denied.get("session").is_none(), "{denied}");
}
