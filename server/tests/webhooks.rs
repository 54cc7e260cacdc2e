//! Guardrail webhooks against a real Open Policy Agent (`QUIVER_OPA`, else
//! scripts/opa.sh builds it from its Go module) and the real server binary: a validating
//! webhook with a Rego policy refuses one argument value for one group and lets the rest
//! through; a mutating one redacts an argument; a mutating result webhook rewrites a result;
//! with the webhook down, `failurePolicy: Fail` refuses the call and `Ignore` lets it run;
//! over HTTPS, OPA requiring client certificates answers a webhook presenting one, and a
//! webhook without it does not decide; a signed request verifies under its key (checked by a
//! receiver in the test) and a key under 32 bytes signs nothing; tools no webhook picks are
//! untouched.

mod real_binary;

use std::process::{Command, Stdio};

use real_binary::{Proc, http_with, metric, start_http_env, wait_for};
use serde_json::{Value, json};

const TOKENS: &str = "sre-token-0123456789 scope=read group=sre\n\
                      dev-token-0123456789 scope=read group=dev\n";
const SRE: &str = "sre-token-0123456789";
const DEV: &str = "dev-token-0123456789";

/// The policy OPA serves: `data.mcp.arguments` (validating), `data.mcp.scrub` (mutating the
/// arguments), `data.mcp.result` (mutating the result).
const POLICY: &str = r#"package mcp

default arguments := {"allowed": true}

arguments := {"allowed": false, "reason": "deploys to prod need the sre group"} if {
	input.tool.name == "deploy"
	input.arguments.environment == "prod"
	not sre
}

sre if "sre" in input.caller.groups

default scrub := {"allowed": true}

scrub := {"allowed": true, "arguments": object.union(input.arguments, {"card": "[redacted]"})} if {
	input.arguments.card
}

default result := {"allowed": true}

result := {"allowed": true, "result": {"content": [{"type": "text", "text": "[withheld by policy]"}]}} if {
	regex.match("internal", input.result.content[0].text)
}
"#;

type Opa = real_binary::Service;

/// OPA serving [`POLICY`] on 127.0.0.1 (with `tls`: the PKI directory's `server.crt`,
/// requiring a client certificate of its CA).
fn opa(tls: Option<&std::path::Path>) -> Opa {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.rego"), POLICY).unwrap();
    let port = real_binary::free_port();
    let mut cmd = Command::new(real_binary::provided("QUIVER_OPA", "opa.sh"));
    cmd.args(["run", "--server", "--skip-version-check", "--log-level=error"])
        .arg(format!("--addr=127.0.0.1:{port}"))
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(pki) = tls {
        cmd.arg(format!("--tls-cert-file={}", pki.join("server.crt").display()))
            .arg(format!(
                "--tls-private-key-file={}",
                pki.join("server.key").display()
            ))
            .arg(format!("--tls-ca-cert-file={}", pki.join("ca.crt").display()))
            .arg("--authentication=tls");
    }
    cmd.arg("policy.rego");
    let child = cmd.spawn().expect("opa");
    wait_for("OPA to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    Opa { child, port, dir }
}

fn tools(opa: u16, dead: u16) -> String {
    format!(
        "webhooks:
  - {{name: prod-guard, url: 'http://127.0.0.1:{opa}/v1/data/mcp/arguments', tools: [deploy]}}
  - {{name: scrub-card, url: 'http://127.0.0.1:{opa}/v1/data/mcp/scrub', type: mutating, tools: [note]}}
  - {{name: internal-result, url: 'http://127.0.0.1:{opa}/v1/data/mcp/result', type: mutating, on: result, tools: [lookup]}}
  - {{name: down-fail, url: 'http://127.0.0.1:{dead}/v1/data/mcp/arguments', tools: [strict], timeout: 1s}}
  - {{name: down-ignore, url: 'http://127.0.0.1:{dead}/v1/data/mcp/arguments', tools: [lenient], failurePolicy: Ignore, timeout: 1s}}
tools:
  - {{name: deploy, input: {{environment: string}}, handler: {{template: 'deployed to {{{{environment}}}}'}}}}
  - {{name: note, input: {{text: string, card: 'string?'}}, handler: {{template: '{{{{text}}}} {{{{card}}}}'}}}}
  - {{name: lookup, input: {{q: string}}, handler: {{template: '{{{{q}}}}'}}}}
  - {{name: strict, handler: {{template: ran}}}}
  - {{name: lenient, handler: {{template: ran}}}}
  - {{name: plain, handler: {{template: ran}}}}
"
    )
}

/// The server with `tools`, the two callers' tokens and a secrets directory holding `files`
/// (`NAME/KEY` to contents).
fn server(tools: &str, files: &[(&str, &str)]) -> (Proc, tempfile::TempDir) {
    let secrets = tempfile::tempdir().unwrap();
    let mut all = vec![("clients/tokens", TOKENS)];
    all.extend_from_slice(files);
    for (path, text) in all {
        let p = secrets.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let source = format!("--secrets=dir:{}", secrets.path().display());
    let p = start_http_env(tools, &[&source, "--auth-tokens-secret=clients.tokens"], &[]);
    (p, secrets)
}

/// The `result` of a call of `tool` by `token`.
fn call(p: &Proc, token: &str, tool: &str, args: Value) -> Value {
    let msg = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": args}});
    let resp = http_with(
        p.mcp,
        "POST",
        "/mcp",
        &format!("Authorization: Bearer {token}\r\n"),
        &msg.to_string(),
    )
    .expect("an answer");
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {resp}"));
    v.get("result")
        .cloned()
        .unwrap_or_else(|| panic!("no result: {v}"))
}

fn text(r: &Value) -> &str {
    r["content"][0]["text"].as_str().unwrap_or_default()
}

#[test]
fn opa_decides_redacts_and_rewrites_and_failure_policies_hold_with_the_webhook_down() {
    let o = opa(None);
    let dead = real_binary::free_port();
    let (p, _secrets) = server(&tools(o.port, dead), &[]);

    // Validating: one argument value refused for one group, everything else let through.
    let r = call(&p, DEV, "deploy", json!({"environment": "staging"}));
    assert_eq!((text(&r), &r["isError"]), ("deployed to staging", &json!(false)));
    let r = call(&p, DEV, "deploy", json!({"environment": "prod"}));
    assert_eq!(r["isError"], true, "{r}");
    assert_eq!(
        text(&r),
        "refused by guardrail `prod-guard`: deploys to prod need the sre group"
    );
    let r = call(&p, SRE, "deploy", json!({"environment": "prod"}));
    assert_eq!(text(&r), "deployed to prod", "{r}");

    // Mutating: the argument the tool gets is the webhook's.
    let r = call(
        &p,
        DEV,
        "note",
        json!({"text": "paid with", "card": "4111 1111 1111 1111"}),
    );
    assert_eq!(text(&r), "paid with [redacted]", "{r}");
    let r = call(&p, DEV, "note", json!({"text": "no card"}));
    assert_eq!(text(&r).trim_end(), "no card", "{r}");

    // A mutating result webhook rewrites what the caller gets.
    assert_eq!(
        text(&call(&p, DEV, "lookup", json!({"q": "the internal plan"}))),
        "[withheld by policy]"
    );
    assert_eq!(
        text(&call(&p, DEV, "lookup", json!({"q": "the public plan"}))),
        "the public plan"
    );

    // The webhook down: Fail refuses, Ignore goes on, a tool without webhooks never asks.
    let r = call(&p, DEV, "strict", json!({}));
    assert_eq!(r["isError"], true, "{r}");
    assert!(
        text(&r).starts_with("guardrail `down-fail` did not decide"),
        "{r}"
    );
    assert!(text(&r).ends_with("the call was not made"), "{r}");
    assert_eq!(text(&call(&p, DEV, "lenient", json!({}))), "ran");
    assert_eq!(text(&call(&p, DEV, "plain", json!({}))), "ran");

    let m = |hook: &str, outcome: &str| {
        metric(
            p.admin,
            &format!("quiver_webhook_requests_total{{webhook=\"{hook}\",outcome=\"{outcome}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(m("prod-guard", "allowed"), 2.0);
    assert_eq!(m("prod-guard", "denied"), 1.0);
    assert_eq!(m("scrub-card", "mutated"), 1.0);
    assert_eq!(m("internal-result", "mutated"), 1.0);
    assert_eq!(m("down-fail", "failed"), 1.0);
    assert_eq!(m("down-ignore", "failed"), 1.0);

    // OPA stopped: the webhooks that reached it now fail as the policy says.
    drop(o);
    let r = call(&p, SRE, "deploy", json!({"environment": "staging"}));
    assert!(
        text(&r).starts_with("guardrail `prod-guard` did not decide"),
        "{r}"
    );
}

#[test]
fn over_https_opa_requires_the_client_certificate_the_webhook_presents() {
    let pki = tempfile::tempdir().unwrap();
    real_binary::make_pki(pki.path());
    let o = opa(Some(pki.path()));
    let read = |f: &str| std::fs::read_to_string(pki.path().join(f)).unwrap();
    let (ca, crt, key) = (read("ca.crt"), read("client.crt"), read("client.key"));
    let tools = format!(
        "webhooks:
  - {{name: mtls, url: 'https://localhost:{port}/v1/data/mcp/arguments', tools: [deploy], tls: {{caSecret: opa-ca, clientCertSecret: opa-client}}}}
  - {{name: no-cert, url: 'https://localhost:{port}/v1/data/mcp/arguments', tools: [other], tls: {{caSecret: opa-ca}}}}
tools:
  - {{name: deploy, input: {{environment: string}}, handler: {{template: 'deployed to {{{{environment}}}}'}}}}
  - {{name: other, handler: {{template: ran}}}}
",
        port = o.port
    );
    let (p, _secrets) = server(
        &tools,
        &[
            ("opa-ca/ca.crt", &ca),
            ("opa-client/tls.crt", &crt),
            ("opa-client/tls.key", &key),
        ],
    );
    assert_eq!(
        text(&call(&p, DEV, "deploy", json!({"environment": "staging"}))),
        "deployed to staging"
    );
    let r = call(&p, DEV, "deploy", json!({"environment": "prod"}));
    assert!(text(&r).starts_with("refused by guardrail `mtls`"), "{r}");
    let r = call(&p, DEV, "other", json!({}));
    assert!(text(&r).starts_with("guardrail `no-cert` did not decide"), "{r}");
}

/// One webhook request at a time on `listener`: its signature (`X-Quiver-Signature:
/// t=..,v1=..` under `key`, over `t.body`) checked and its time within a minute of now;
/// answered allowed when both hold, refused saying which failed otherwise. Returns after
/// `n` requests.
fn verifying_receiver(
    listener: std::net::TcpListener,
    key: &'static [u8],
    n: usize,
) -> std::thread::JoinHandle<Vec<String>> {
    use std::io::{BufRead, BufReader, Read, Write};
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for _ in 0..n {
            let (stream, _) = listener.accept().expect("a webhook request");
            let mut r = BufReader::new(stream);
            let (mut signature, mut length) = (String::new(), 0usize);
            loop {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                let line = line.trim_end();
                if line.is_empty() {
                    break;
                }
                if let Some((k, v)) = line.split_once(':') {
                    match k.to_ascii_lowercase().as_str() {
                        "x-quiver-signature" => signature = v.trim().to_owned(),
                        "content-length" => length = v.trim().parse().unwrap(),
                        _ => {}
                    }
                }
            }
            let mut body = vec![0; length];
            r.read_exact(&mut body).unwrap();
            let verdict = (|| {
                let (t, mac) = signature.strip_prefix("t=")?.split_once(",v1=")?;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .ok()?
                    .as_secs();
                let t: u64 = t.parse().ok()?;
                if now.abs_diff(t) > 60 {
                    return Some("stale");
                }
                let tag: Vec<u8> = (0..mac.len() / 2)
                    .map(|i| u8::from_str_radix(&mac[2 * i..2 * i + 2], 16))
                    .collect::<Result<_, _>>()
                    .ok()?;
                let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
                let signed = [t.to_string().as_bytes(), b".", &body].concat();
                Some(if ring::hmac::verify(&key, &signed, &tag).is_ok() {
                    "valid"
                } else {
                    "forged"
                })
            })()
            .unwrap_or("unsigned");
            seen.push(verdict.to_owned());
            let answer = if verdict == "valid" {
                r#"{"result": {"allowed": true}}"#.to_owned()
            } else {
                format!(r#"{{"result": {{"allowed": false, "reason": "signature {verdict}"}}}}"#)
            };
            let mut s = r.into_inner();
            write!(s, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}", answer.len()).unwrap();
        }
        seen
    })
}

#[test]
fn requests_are_signed_with_the_hmac_key_and_a_short_key_is_no_key() {
    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef-webhook-key";
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let receiver = verifying_receiver(listener, KEY, 1);
    let tools = format!(
        "webhooks:
  - {{name: signed, url: 'http://127.0.0.1:{port}/check', tools: [signed], hmacSecret: {{name: guard, key: hmac}}}}
  - {{name: weak, url: 'http://127.0.0.1:{port}/check', tools: [weak], hmacSecret: {{name: guard, key: short}}}}
tools:
  - {{name: signed, handler: {{template: ran}}}}
  - {{name: weak, handler: {{template: ran}}}}
"
    );
    let key = std::str::from_utf8(KEY).unwrap();
    let (p, _secrets) = server(&tools, &[("guard/hmac", key), ("guard/short", "too-short-a-key")]);
    assert_eq!(text(&call(&p, DEV, "signed", json!({}))), "ran");
    // A key under 32 bytes signs nothing: the webhook does not decide, and Fail refuses.
    let r = call(&p, DEV, "weak", json!({}));
    assert_eq!(
        text(&r),
        "guardrail `weak` did not decide; the call was not made",
        "{r}"
    );
    assert_eq!(receiver.join().unwrap(), ["valid"]);
}
