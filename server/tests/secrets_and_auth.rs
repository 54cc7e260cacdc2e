//! Secrets and client auth on the real binary: `{{secret.NAME.KEY}}` values reach the
//! upstream (http headers, exec env) but never the caller, a rotated value is used by the next
//! call with no restart, and `--auth-tokens-secret` guards `/mcp` with rotatable tokens.

mod real_binary;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use real_binary::{Proc, http, http_with, start_http_env, wait_for};
use serde_json::{Value, json};

/// An upstream that records the `Authorization` header of each request and answers with it.
fn upstream() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut auth = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((k, v)) = line.split_once(':')
                    && k.eq_ignore_ascii_case("authorization")
                {
                    auth = v.trim().to_owned();
                }
            }
            log.lock().unwrap().push(auth.clone());
            let body = format!("upstream saw: {auth}");
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, seen)
}

fn body_json(resp: &str) -> Value {
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {resp}"))
}

fn call(p: &Proc, tool: &str) -> Value {
    let req =
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": {}}});
    let resp = http(p.mcp, "POST", "/mcp", &req.to_string()).expect("an answer");
    body_json(&resp)["result"].clone()
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

fn write_secret(root: &std::path::Path, name: &str, key: &str, value: &str) {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    // Replaced the way a rotation replaces it: a new file renamed over the old one.
    let tmp = dir.join(format!(".{key}.tmp"));
    std::fs::write(&tmp, value).unwrap();
    std::fs::rename(tmp, dir.join(key)).unwrap();
}

#[test]
fn secret_values_reach_the_upstream_not_the_caller_and_rotate_without_restart() {
    let (port, seen) = upstream();
    let secrets = tempfile::tempdir().unwrap();
    write_secret(secrets.path(), "api", "token", "first-secret-value");
    let tools = format!(
        r#"tools:
  - name: fetch
    handler: {{http: {{url: "http://127.0.0.1:{port}/x", headers: {{Authorization: "Bearer {{{{secret.api.token}}}}"}}}}}}
  - name: token-length
    handler: {{exec: {{command: [/bin/sh, -c, 'printf %s "$TOKEN" | wc -c'], env: {{TOKEN: "{{{{secret.api.token}}}}"}}}}}}
  - name: token-echo
    handler: {{exec: {{command: [/usr/bin/printenv, TOKEN], env: {{TOKEN: "{{{{secret.api.token}}}}"}}}}}}
  - name: missing-key
    handler: {{http: {{url: "http://127.0.0.1:{port}/x", headers: {{X: "{{{{secret.api.nope}}}}"}}}}}}
  - name: missing-secret
    handler: {{http: {{url: "http://127.0.0.1:{port}/x", headers: {{X: "{{{{secret.gone.k}}}}"}}}}}}
"#
    );
    let source = format!("--secrets=dir:{}", secrets.path().display());
    let p = start_http_env(&tools, &[&source], &[]);

    let r = call(&p, "fetch");
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(seen.lock().unwrap().last().unwrap(), "Bearer first-secret-value");
    assert_eq!(
        text(&r),
        "upstream saw: Bearer [redacted]",
        "the echoed value is redacted"
    );
    assert_eq!(
        text(&call(&p, "token-length")).trim(),
        "18",
        "the process got the value"
    );
    assert_eq!(text(&call(&p, "token-echo")).trim(), "[redacted]");

    let r = call(&p, "missing-key");
    assert_eq!(r["isError"], true);
    assert_eq!(
        text(&r),
        "secret `api` key `nope` is not available: the secret has no such key"
    );
    let r = call(&p, "missing-secret");
    assert_eq!(r["isError"], true);
    assert!(
        text(&r).starts_with("secret `gone` key `k` is not available"),
        "{r}"
    );

    let status = body_json(&http(p.admin, "GET", "/status", "").unwrap());
    assert_eq!(status["secrets"]["api"], "loaded", "{status}");
    assert!(!status.to_string().contains("first-secret-value"));

    write_secret(secrets.path(), "api", "token", "second-secret-value");
    wait_for("the next call uses the rotated value", || {
        call(&p, "fetch");
        seen.lock().unwrap().last().map(String::as_str) == Some("Bearer second-secret-value")
    });
    assert_eq!(text(&call(&p, "token-length")).trim(), "19");
    assert_eq!(text(&call(&p, "fetch")), "upstream saw: Bearer [redacted]");
    let metrics = http(p.admin, "GET", "/metrics", "").unwrap();
    assert!(!metrics.contains("secret-value"));
}

#[test]
fn the_env_source_reads_quiver_secret_variables() {
    let tools = "tools:\n  - name: len\n    handler: {exec: {command: [/bin/sh, -c, 'printf %s \"$T\" | wc -c'], env: {T: \"{{secret.my-api.token}}\"}}}\n";
    let p = start_http_env(
        tools,
        &["--secrets=env"],
        &[("QUIVER_SECRET_MY_API_TOKEN", "0123456789")],
    );
    assert_eq!(text(&call(&p, "len")).trim(), "10");
    let p = start_http_env(tools, &[], &[("QUIVER_SECRET_MY_API_TOKEN", "0123456789")]);
    let r = call(&p, "len");
    assert_eq!(
        text(&r),
        "secret `my-api` key `token` is not available: the server has no secret source (--secrets)"
    );
}

fn post(p: &Proc, headers: &str) -> String {
    let ping =
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":2}}}"#;
    http_with(p.mcp, "POST", "/mcp", headers, ping).expect("an answer")
}

fn header<'a>(resp: &'a str, name: &str) -> Option<&'a str> {
    resp.split("\r\n\r\n").next()?.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[test]
fn bearer_tokens_guard_mcp_and_rotate_without_restart() {
    let secrets = tempfile::tempdir().unwrap();
    write_secret(
        secrets.path(),
        "clients",
        "tokens",
        "# the team's tokens\nalpha-token-0123456789\nbeta-token-0123456789\n",
    );
    let source = format!("--secrets=dir:{}", secrets.path().display());
    let p = start_http_env(
        "tools:\n  - {name: add, handler: {builtin: add}}\n",
        &[&source, "--auth-tokens-secret=clients.tokens"],
        &[],
    );

    let none = post(&p, "");
    assert!(none.starts_with("HTTP/1.1 401"), "{none}");
    assert_eq!(header(&none, "www-authenticate"), Some("Bearer realm=\"mcp\""));
    assert_eq!(body_json(&none)["error"]["code"], -32600);
    let wrong = post(&p, "Authorization: Bearer alpha-token-012345678\r\n");
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    assert!(
        header(&wrong, "www-authenticate")
            .unwrap()
            .contains("error=\"invalid_token\"")
    );
    for token in ["alpha-token-0123456789", "beta-token-0123456789"] {
        let ok = post(&p, &format!("Authorization: Bearer {token}\r\n"));
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert_eq!(text(&body_json(&ok)["result"]), "3");
    }
    // GET and DELETE are guarded too; the admin port is not an MCP port and stays open.
    let get = http_with(p.mcp, "GET", "/mcp", "", "").unwrap();
    assert!(get.starts_with("HTTP/1.1 401"), "{get}");
    assert!(
        http(p.admin, "GET", "/readyz", "")
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );

    write_secret(secrets.path(), "clients", "tokens", "gamma-token-0123456789\n");
    wait_for("the rotated token is accepted", || {
        post(&p, "Authorization: Bearer gamma-token-0123456789\r\n").starts_with("HTTP/1.1 200")
    });
    assert!(post(&p, "Authorization: Bearer alpha-token-0123456789\r\n").starts_with("HTTP/1.1 401"));
    let metrics = http(p.admin, "GET", "/metrics", "").unwrap();
    let refused = metrics
        .lines()
        .find(|l| l.starts_with("quiver_refusals_total") && l.contains("unauthenticated"))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(!refused.ends_with(" 0"), "{refused}");
    let status = body_json(&http(p.admin, "GET", "/status", "").unwrap());
    assert_eq!(status["auth"], "bearer");
    assert!(!status.to_string().contains("token-0123456789"));
}

#[test]
fn auth_without_a_secret_source_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("t.yaml");
    std::fs::write(&config, "tools: []\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quiver-server"))
        .arg(format!("--config=file:{}", config.display()))
        .arg("--listen=127.0.0.1:0")
        .arg("--admin-listen=off")
        .arg("--auth-tokens-secret=clients.tokens")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--auth-tokens-secret needs --secrets"), "{err}");
}

fn call_as(p: &Proc, token: &str, tool: &str, args: &str) -> String {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
    );
    let auth = if token.is_empty() {
        String::new()
    } else {
        format!("Authorization: Bearer {token}\r\n")
    };
    http_with(p.mcp, "POST", "/mcp", &auth, &body).expect("an answer")
}

/// Per-tool `access`: the scopes and groups a static token grants decide which tools it may
/// call; a refusal is a 403 whose challenge names the missing scopes, checked before the
/// arguments; a pipeline needs what its steps need; a tool without `access` stays open.
#[test]
fn tool_access_follows_the_callers_scopes_and_groups() {
    let secrets = tempfile::tempdir().unwrap();
    write_secret(
        secrets.path(),
        "clients",
        "tokens",
        "reader-token-0123456789 scope=read\n\
         deployer-token-0123456789 scope=read scope=deploy:write group=sre\n\
         dev-token-0123456789 scope=read scope=deploy:write group=dev\n",
    );
    let source = format!("--secrets=dir:{}", secrets.path().display());
    let p = start_http_env(
        "tools:
  - {name: open, handler: {template: hi}}
  - name: deploy
    input: {service: string}
    access: {scopes: [deploy:write], groups: [sre, platform]}
    handler: {template: 'deployed {{service}}'}
  - name: release
    input: {service: string}
    handler: {pipeline: [{tool: deploy}]}
",
        &[&source, "--auth-tokens-secret=clients.tokens"],
        &[],
    );
    let open = call_as(&p, "reader-token-0123456789", "open", "{}");
    assert!(open.starts_with("HTTP/1.1 200"), "{open}");

    // Missing scope: 403, the challenge names it, and the arguments were never looked at.
    let r = call_as(&p, "reader-token-0123456789", "deploy", r#"{"wrong": 1}"#);
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    assert_eq!(
        header(&r, "www-authenticate"),
        Some("Bearer realm=\"mcp\", error=\"insufficient_scope\", scope=\"deploy:write\"")
    );
    let err = &body_json(&r)["error"];
    assert_eq!(err["code"], -32003);
    assert_eq!(err["data"]["missingScopes"], json!(["deploy:write"]));
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("requires the scopes `deploy:write`"),
        "{err}"
    );
    // Right scopes, wrong group: 403 without a scope challenge (asking for scopes cannot help).
    let r = call_as(&p, "dev-token-0123456789", "deploy", r#"{"service": "api"}"#);
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    assert_eq!(header(&r, "www-authenticate"), None);
    assert_eq!(
        body_json(&r)["error"]["data"]["allowedGroups"],
        json!(["sre", "platform"])
    );
    // The pipeline that runs `deploy` is no way around it.
    let r = call_as(&p, "dev-token-0123456789", "release", r#"{"service": "api"}"#);
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    for tool in ["deploy", "release"] {
        let r = call_as(&p, "deployer-token-0123456789", tool, r#"{"service": "api"}"#);
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert_eq!(text(&body_json(&r)["result"]), "deployed api");
    }
    let metrics = http(p.admin, "GET", "/metrics", "").unwrap();
    let refused = metrics
        .lines()
        .find(|l| l.starts_with("quiver_refusals_total") && l.contains("forbidden"))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(refused.ends_with(" 3"), "{refused}");
}

/// With client authentication off nobody has credentials: a tool with `access` cannot be
/// called, and the error says why.
#[test]
fn without_client_auth_a_tool_with_access_refuses_every_caller() {
    let p = start_http_env(
        "tools:\n  - {name: guarded, access: {groups: [sre]}, handler: {template: x}}\n",
        &[],
        &[],
    );
    let r = call_as(&p, "", "guarded", "{}");
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    let message = body_json(&r)["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("does not authenticate its clients"), "{message}");
}
