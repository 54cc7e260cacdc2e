//! Identity to upstreams and http tools on the real binary: a client's Authorization header
//! reaches only what is configured to receive it. One recording listener plays every API and
//! upstream MCP server (each mode of `identity`, http tools and remote upstreams alike) and
//! keeps every request's headers; a local issuer signs the client's token (ES256), publishes
//! its key and answers RFC 8693 token exchanges (recording them too). The real OpenID
//! provider (Keycloak) drives the same paths in tests/sdk/python/test_python_sdk_identity.py.

mod real_binary;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use real_binary::{Proc, http_with, start_http_env, wait_for};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};

/// One request a listener received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    /// The JSON-RPC method of an MCP request (empty otherwise).
    method: String,
    authorization: String,
    x_user: String,
    session: String,
    body: String,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Header names (lower-case) and values.
type Headers = Vec<(String, String)>;

/// Reads one HTTP/1.1 request: its path, headers and body (`None` at the end of the
/// connection).
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<(String, Headers, String)> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut words = line.split_whitespace();
    let path = words.nth(1)?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            return None;
        }
        if h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    let len = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    Some((path, headers, String::from_utf8_lossy(&body).into_owned()))
}

/// Serves `answer` on a loopback port (keep-alive), recording every request in the log.
fn listen(answer: impl Fn(&Seen) -> (u16, String) + Send + Sync + 'static) -> (u16, Log) {
    listen_with(move |s| {
        let (status, text) = answer(s);
        (status, text, String::new())
    })
}

/// [`listen`] with extra header lines in the answers.
fn listen_with(answer: impl Fn(&Seen) -> (u16, String, String) + Send + Sync + 'static) -> (u16, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let log: Log = Arc::default();
    let (seen, answer) = (log.clone(), Arc::new(answer));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let (seen, answer) = (seen.clone(), answer.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                while let Some((path, headers, body)) = read_request(&mut reader) {
                    let header = |n: &str| {
                        headers
                            .iter()
                            .find(|(k, _)| k == n)
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default()
                    };
                    let method = serde_json::from_str::<Value>(&body)
                        .ok()
                        .and_then(|v| v["method"].as_str().map(str::to_owned))
                        .unwrap_or_default();
                    let s = Seen {
                        path,
                        method,
                        authorization: header("authorization"),
                        x_user: header("x-user"),
                        session: header("mcp-session-id"),
                        body,
                    };
                    let (status, text, extra) = answer(&s);
                    seen.lock().unwrap().push(s);
                    let ctype = if text.starts_with('{') {
                        "application/json"
                    } else {
                        "text/plain"
                    };
                    let reason = if status == 200 { "OK" } else { "Other" };
                    let _ = write!(
                        conn,
                        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n{extra}Content-Length: {}\r\n\r\n{text}",
                        text.len()
                    );
                }
            });
        }
    });
    (port, log)
}

/// What the recording listener answers: a minimal MCP server under `/mcp/...` (each
/// `initialize` opens a session `s-N`) whose one tool echoes the Authorization it got, and a
/// JSON API elsewhere that does the same.
fn api_and_upstreams() -> impl Fn(&Seen) -> (u16, String, String) + Send + Sync + 'static {
    let sessions = Mutex::new(0);
    move |s: &Seen| {
        if !s.path.starts_with("/mcp/") {
            let saw = json!({"saw": s.authorization, "user": s.x_user}).to_string();
            return (200, saw, String::new());
        }
        if s.body.is_empty() {
            return (405, String::new(), String::new());
        }
        let req: Value = serde_json::from_str(&s.body).unwrap_or(Value::Null);
        let mut extra = String::new();
        let result = match s.method.as_str() {
            "initialize" => {
                let mut n = sessions.lock().unwrap();
                *n += 1;
                extra = format!("Mcp-Session-Id: s-{n}\r\n");
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "recorder", "version": "1"}
                })
            }
            "tools/list" => json!({"tools": [{"name": "whoami", "inputSchema": {"type": "object"}}]}),
            "tools/call" => {
                json!({"content": [{"type": "text", "text": format!("upstream saw {}", s.authorization)}]})
            }
            m if m.starts_with("notifications/") => return (202, String::new(), String::new()),
            _ => json!({}),
        };
        let body = json!({"jsonrpc": "2.0", "id": req["id"], "result": result}).to_string();
        (200, body, extra)
    }
}

fn now() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()).unwrap()
}

/// An issuer: discovery document, its ES256 key, a token endpoint that exchanges any subject
/// token for `exchanged-AUDIENCE-N` (and refuses the audience `refused`).
struct Issuer {
    url: String,
    key: EcdsaKeyPair,
    log: Log,
}

impl Issuer {
    fn start() -> Issuer {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        let point = key.public_key().as_ref().to_vec();
        let jwk = json!({"keys": [{
            "kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256", "use": "sig",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        }]});
        let base: Arc<Mutex<String>> = Arc::default();
        let (b, exchanges) = (base.clone(), Arc::new(Mutex::new(0)));
        let (port, log) = listen(move |s| {
            let url = b.lock().unwrap().clone();
            match s.path.as_str() {
                "/.well-known/openid-configuration" => (
                    200,
                    json!({"issuer": url, "jwks_uri": format!("{url}/jwks"), "token_endpoint": format!("{url}/token")})
                        .to_string(),
                ),
                "/jwks" => (200, jwk.to_string()),
                "/token" => {
                    let form = parse_form(&s.body);
                    let audience = form.iter().find(|(k, _)| k == "audience").map_or("", |(_, v)| v);
                    let subject = form.iter().find(|(k, _)| k == "subject_token").map_or("", |(_, v)| v);
                    match audience {
                        "slow" => std::thread::sleep(std::time::Duration::from_secs(8)),
                        "huge" => return (200, format!(r#"{{"access_token":"{}"}}"#, "a".repeat(200_000))),
                        "garbage" => return (200, "<html>not json</html>".to_owned()),
                        "echo" => {
                            let why = format!("subject_token {subject} is not welcome");
                            return (400, json!({"error": "invalid_grant", "error_description": why}).to_string());
                        }
                        _ => {}
                    }
                    if audience == "refused" {
                        return (
                            400,
                            json!({"error": "invalid_target", "error_description": "no such audience"}).to_string(),
                        );
                    }
                    let mut n = exchanges.lock().unwrap();
                    *n += 1;
                    (
                        200,
                        json!({"access_token": format!("exchanged-{audience}-{n}"), "token_type": "Bearer",
                            "expires_in": 300, "issued_token_type": "urn:ietf:params:oauth:token-type:access_token"})
                        .to_string(),
                    )
                }
                _ => (404, String::new()),
            }
        });
        let url = format!("http://127.0.0.1:{port}");
        *base.lock().unwrap() = url.clone();
        Issuer { url, key, log }
    }

    fn token(&self, claims: &Value) -> String {
        let head = URL_SAFE_NO_PAD.encode(json!({"alg": "ES256", "kid": "k1", "typ": "JWT"}).to_string());
        let body = URL_SAFE_NO_PAD.encode(claims.to_string());
        let input = format!("{head}.{body}");
        let sig = self.key.sign(&SystemRandom::new(), input.as_bytes()).unwrap();
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }

    fn exchanges(&self) -> Vec<Seen> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.path == "/token")
            .cloned()
            .collect()
    }
}

fn parse_form(body: &str) -> Vec<(String, String)> {
    let decode = |s: &str| {
        let mut out = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' && i + 2 < b.len() {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(if b[i] == b'+' { b' ' } else { b[i] });
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    };
    body.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

fn write_secret(root: &std::path::Path, name: &str, key: &str, value: &str) {
    std::fs::create_dir_all(root.join(name)).unwrap();
    std::fs::write(root.join(name).join(key), value).unwrap();
}

/// Calls `tool` as the caller of `token`: the result (or error) text, and whether it failed.
fn call(p: &Proc, token: &str, tool: &str) -> (String, bool) {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
    );
    let resp = http_with(
        p.mcp,
        "POST",
        "/mcp",
        &format!("Authorization: Bearer {token}\r\n"),
        &body,
    )
    .expect("an answer");
    let v: Value = serde_json::from_str(resp.split_once("\r\n\r\n").map_or("", |(_, b)| b))
        .unwrap_or_else(|e| panic!("{e}: {resp}"));
    let r = &v["result"];
    assert!(r.is_object(), "{tool}: {v}");
    (
        r["content"][0]["text"].as_str().unwrap_or_default().to_owned(),
        r["isError"] == true,
    )
}

fn tools(p: &Proc, token: &str) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    http_with(
        p.mcp,
        "POST",
        "/mcp",
        &format!("Authorization: Bearer {token}\r\n"),
        body,
    )
    .unwrap_or_default()
}

const OWN: &str = "server-own-credential-0123";
const STATIC: &str = "static-client-token-0123456789";

fn toolset(api: u16) -> String {
    let u = format!("http://127.0.0.1:{api}");
    format!(
        r#"
tools:
  - {{name: api-plain, handler: {{http: {{url: "{u}/api/plain"}}}}}}
  - name: api-server
    handler: {{http: {{url: "{u}/api/server", headers: {{Authorization: "Bearer {{{{secret.own.token}}}}"}}}}}}
  - name: api-forward
    handler:
      http:
        url: "{u}/api/forward"
        headers: {{X-User: "{{{{caller.sub}}}}"}}
        identity: {{mode: forward, audience: "{u}/api"}}
  - {{name: api-forward-other, handler: {{http: {{url: "{u}/api/forward-other", identity: {{mode: forward, audience: "{u}/api/forward-other"}}}}}}}}
  - {{name: api-exchange, handler: {{http: {{url: "{u}/api/exchange", identity: {{mode: exchange, audience: notes, scopes: [read]}}}}}}}}
  - {{name: api-exchange-refused, handler: {{http: {{url: "{u}/api/exchange-refused", identity: {{mode: exchange, audience: refused}}}}}}}}
  - {{name: api-exchange-slow, handler: {{http: {{url: "{u}/api/exchange-bad", identity: {{mode: exchange, audience: slow}}}}}}}}
  - {{name: api-exchange-huge, handler: {{http: {{url: "{u}/api/exchange-bad", identity: {{mode: exchange, audience: huge}}}}}}}}
  - {{name: api-exchange-garbage, handler: {{http: {{url: "{u}/api/exchange-bad", identity: {{mode: exchange, audience: garbage}}}}}}}}
  - {{name: api-exchange-echo, handler: {{http: {{url: "{u}/api/exchange-bad", identity: {{mode: exchange, audience: echo}}}}}}}}
upstreams:
  - {{name: up-plain, http: {{url: "{u}/mcp/plain"}}, tools: {{prefix: plain_}}}}
  - name: up-server
    http: {{url: "{u}/mcp/server", headers: {{Authorization: "Bearer {{{{secret.own.token}}}}"}}}}
    tools: {{prefix: server_}}
  - name: up-forward
    http: {{url: "{u}/mcp/forward", headers: {{Authorization: "Bearer {{{{secret.own.token}}}}"}}}}
    identity: {{mode: forward, audience: "{u}/mcp/forward"}}
    tools: {{prefix: forward_}}
  - {{name: up-forward-other, http: {{url: "{u}/mcp/forward-other"}}, identity: {{mode: forward, audience: "{u}/mcp/forward-other"}}, tools: {{prefix: fother_}}}}
  - name: up-exchange
    http: {{url: "{u}/mcp/exchange", headers: {{Authorization: "Bearer {{{{secret.own.token}}}}"}}}}
    identity: {{mode: exchange, audience: notes}}
    tools: {{prefix: exchange_}}
  - {{name: up-exchange-refused, http: {{url: "{u}/mcp/exchange-refused"}}, identity: {{mode: exchange, audience: refused}}, tools: {{prefix: erefused_}}}}
"#
    )
}

/// Every mode of `identity`, on http tools and remote upstreams: the caller's token reaches
/// exactly the two targets that forward it (and the issuer, as the subject of an exchange);
/// the others get nothing or the server's own credential or an exchanged token; a call that
/// cannot have its credential fails and sends nothing; what a target echoes is redacted.
#[test]
fn a_callers_token_reaches_only_the_targets_configured_for_it() {
    let issuer = Issuer::start();
    let (api, seen) = listen_with(api_and_upstreams());
    let secrets = tempfile::tempdir().unwrap();
    write_secret(secrets.path(), "own", "token", OWN);
    write_secret(secrets.path(), "exchange", "secret", "client-secret-0123456789");
    write_secret(secrets.path(), "clients", "tokens", STATIC);
    let secrets_arg = format!("--secrets=dir:{}", secrets.path().display());
    let issuer_arg = format!("--auth-issuer={}", issuer.url);
    let p = start_http_env(
        &toolset(api),
        &[
            &secrets_arg,
            "--auth-tokens-secret=clients.tokens",
            &issuer_arg,
            "--auth-audience=quiver",
            "--token-exchange-client-id=quiver",
            "--token-exchange-client-secret=exchange.secret",
        ],
        &[],
    );
    let alice_sub = "alice-subject-0001";
    let client = issuer.token(&json!({
        "iss": issuer.url, "sub": alice_sub, "exp": now() + 600,
        "aud": ["quiver", "notes", format!("http://127.0.0.1:{api}/api"), format!("http://127.0.0.1:{api}/mcp/forward")],
    }));
    wait_for("every upstream's tool imported", || {
        let list = tools(&p, &client);
        [
            "plain_",
            "server_",
            "forward_",
            "fother_",
            "exchange_",
            "erefused_",
        ]
        .iter()
        .all(|pre| list.contains(&format!("\"{pre}whoami\"")))
    });

    // The server's own credential, or none: the client's token is not there.
    assert_eq!(
        call(&p, &client, "api-plain"),
        (json!({"saw": "", "user": ""}).to_string(), false)
    );
    let (text, failed) = call(&p, &client, "api-server");
    assert!(
        !failed && text.contains("\"saw\":\"Bearer [redacted]\""),
        "{text}"
    );
    assert_eq!(
        call(&p, &client, "plain_whoami"),
        ("upstream saw ".to_owned(), false)
    );
    assert_eq!(
        call(&p, &client, "server_whoami"),
        ("upstream saw Bearer [redacted]".to_owned(), false)
    );

    // Forwarded where the token is addressed to the target; what comes back is redacted.
    let (text, failed) = call(&p, &client, "api-forward");
    assert!(!failed, "{text}");
    assert_eq!(
        text,
        json!({"saw": "Bearer [redacted]", "user": "[redacted]"}).to_string()
    );
    assert_eq!(
        call(&p, &client, "forward_whoami"),
        ("upstream saw Bearer [redacted]".to_owned(), false)
    );

    // Not addressed to the `-other` targets: refused before anything is sent.
    for tool in ["api-forward-other", "fother_whoami"] {
        let (text, failed) = call(&p, &client, tool);
        assert!(
            failed && text.contains("forward-other` in `aud`"),
            "{tool}: {text}"
        );
        assert!(!text.contains(&client), "{text}");
    }

    // Exchanged: the target gets the issuer's token for it, once per caller, audience and
    // scopes; the issuer gets the caller's token as the subject, with the client's secret.
    for _ in 0..3 {
        let (text, failed) = call(&p, &client, "api-exchange");
        assert!(
            !failed && text.contains("\"saw\":\"Bearer [redacted]\""),
            "{text}"
        );
    }
    assert_eq!(
        call(&p, &client, "exchange_whoami"),
        ("upstream saw Bearer [redacted]".to_owned(), false)
    );
    let exchanges = issuer.exchanges();
    assert_eq!(
        exchanges.len(),
        2,
        "one exchange per (caller, audience, scopes): {exchanges:?}"
    );
    for (ex, scope) in exchanges.iter().zip([Some("read"), None]) {
        let form = parse_form(&ex.body);
        let get = |k: &str| form.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(
            get("grant_type"),
            Some("urn:ietf:params:oauth:grant-type:token-exchange")
        );
        assert_eq!(get("subject_token"), Some(client.as_str()));
        assert_eq!(
            get("subject_token_type"),
            Some("urn:ietf:params:oauth:token-type:access_token")
        );
        assert_eq!(get("audience"), Some("notes"));
        assert_eq!(get("scope"), scope);
        assert_eq!(
            ex.authorization,
            format!("Basic {}", STANDARD.encode("quiver:client-secret-0123456789"))
        );
    }

    // A refused exchange is a tool error, with no fallback to the server's credential.
    for tool in ["api-exchange-refused", "erefused_whoami"] {
        let (text, failed) = call(&p, &client, tool);
        assert!(
            failed && text.contains("token exchange for audience `refused` failed: the issuer refused (HTTP 400; invalid_target: no such audience)"),
            "{tool}: {text}"
        );
    }

    // A token endpoint that stalls, floods, answers garbage or echoes the subject token: a
    // bounded wait, a bounded read, a clear error that names no token; nothing is sent.
    for (tool, want) in [
        ("api-exchange-slow", "the token endpoint did not answer within 5s"),
        ("api-exchange-huge", "larger than 65536 bytes"),
        (
            "api-exchange-garbage",
            "the token endpoint answered something that is not JSON",
        ),
        (
            "api-exchange-echo",
            "the issuer refused (HTTP 400; invalid_grant: subject_token [redacted] is not welcome)",
        ),
    ] {
        let (text, failed) = call(&p, &client, tool);
        assert!(failed && text.contains(want), "{tool}: {text}");
        assert!(!text.contains(&client), "{tool}: {text}");
    }

    // A static token is nobody's identity to pass on.
    for tool in ["api-forward", "api-exchange", "forward_whoami", "exchange_whoami"] {
        let (text, failed) = call(&p, STATIC, tool);
        assert!(
            failed && text.contains("presented no OAuth/OIDC access token"),
            "{tool}: {text}"
        );
    }

    // What each target received, request by request.
    let seen = seen.lock().unwrap().clone();
    let at = |path: &str| -> Vec<&Seen> { seen.iter().filter(|s| s.path == path).collect() };
    let bearer = |t: &str| format!("Bearer {t}");
    for s in &seen {
        let forwarded =
            s.path == "/api/forward" || (s.path == "/mcp/forward" && s.authorization == bearer(&client));
        assert_eq!(s.authorization == bearer(&client), forwarded, "{s:?}");
        assert!(
            !s.authorization.contains(STATIC) && !s.body.contains(&client),
            "{s:?}"
        );
    }
    assert!(at("/api/plain").iter().all(|s| s.authorization.is_empty()));
    assert!(at("/mcp/plain").iter().all(|s| s.authorization.is_empty()));
    assert!(at("/api/server").iter().all(|s| s.authorization == bearer(OWN)));
    assert!(at("/mcp/server").iter().all(|s| s.authorization == bearer(OWN)));
    assert_eq!(at("/api/forward").len(), 1);
    assert_eq!(at("/api/forward")[0].x_user, alice_sub);
    // The upstreams' own session (initialize, tools/list, ...) carries their configured
    // credential; a caller's call goes in a session opened with the caller's credential.
    for (path, callers) in [
        ("/mcp/forward", bearer(&client)),
        ("/mcp/exchange", bearer("exchanged-notes-2")),
    ] {
        let requests = at(path);
        let (as_caller, own): (Vec<&Seen>, Vec<&Seen>) =
            requests.iter().partition(|s| s.authorization == callers);
        let methods: Vec<&str> = as_caller.iter().map(|s| s.method.as_str()).collect();
        assert_eq!(
            methods,
            ["initialize", "notifications/initialized", "tools/call"],
            "{path}: {requests:?}"
        );
        assert!(
            own.iter()
                .all(|s| s.authorization == bearer(OWN) && s.method != "tools/call"),
            "{path}: {requests:?}"
        );
        let callers_session = &as_caller[1].session;
        assert!(
            !callers_session.is_empty() && as_caller[2].session == *callers_session,
            "{path}: {requests:?}"
        );
        assert!(
            own.iter().all(|s| s.session != *callers_session),
            "{path}: {requests:?}"
        );
    }
    assert_eq!(
        at("/mcp/exchange")
            .iter()
            .find(|s| s.method == "tools/call")
            .unwrap()
            .authorization,
        "Bearer exchanged-notes-2"
    );
    assert!(
        at("/api/exchange")
            .iter()
            .all(|s| s.authorization == "Bearer exchanged-notes-1")
    );
    assert_eq!(at("/api/exchange").len(), 3);
    for path in ["/api/forward-other", "/api/exchange-refused", "/api/exchange-bad"] {
        assert!(at(path).is_empty(), "{path} got a request");
    }
    for path in ["/mcp/forward-other", "/mcp/exchange-refused"] {
        assert!(
            at(path).iter().all(|s| s.method != "tools/call"),
            "{path} got a call"
        );
    }
}

/// `identity` where it cannot work is refused when the ToolSet loads, naming the field.
#[test]
fn identity_that_cannot_work_is_refused_at_load() {
    let cases = [
        (
            "upstreams:\n  - {name: s, stdio: {command: [cat]}, identity: {mode: exchange, audience: a}}\n",
            "upstreams[0].identity: a stdio upstream has no request headers",
        ),
        (
            "tools:\n  - {name: t, handler: {http: {url: \"http://x/\", headers: {authorization: \"Bearer k\"}, identity: {mode: forward, audience: \"http://x\"}}}}\n",
            "tools[0].handler.http.headers.authorization: `identity` sets the Authorization header",
        ),
        (
            "tools:\n  - {name: t, handler: {http: {url: \"https://collector.example/c\", identity: {mode: forward, audience: quiver}}}}\n",
            "tools[0].handler.http.identity.audience: `forward` sends the caller's token only to the resource it is addressed to",
        ),
        (
            "upstreams:\n  - {name: u, http: {url: \"https://collector.example/mcp\"}, identity: {mode: forward, audience: \"https://notes.example/mcp\"}}\n",
            "upstreams[0].identity.audience: names the resource",
        ),
        (
            "tools:\n  - {name: t, handler: {http: {url: \"http://x/\", identity: {mode: exchange}}}}\n",
            "tools[0].handler.http.identity.audience: required",
        ),
        (
            "tools:\n  - {name: t, handler: {exec: {command: [echo, \"{{caller.sub}}\"]}}}\n",
            "may be used only in an http tool's url, headers and body",
        ),
        (
            "tools:\n  - {name: t, input: {caller: string}, handler: {http: {url: \"http://x/{{caller.sub}}\"}}}\n",
            "rename the argument `caller`",
        ),
    ];
    for (yaml, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.yaml");
        std::fs::write(&path, yaml).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_quiver-server"))
            .args(["check", &format!("--config=file:{}", path.display())])
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success() && text.contains(want), "{yaml}\n{text}");
    }
}

/// A JSON-RPC request as `token`'s caller, opting in to the tasks extension for it (the
/// per-request form of a client's capability); the response's body.
fn rpc_with_tasks(p: &Proc, token: &str, method: &str, params: Value) -> Value {
    let mut params = params;
    params["_meta"] = json!({"io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}});
    let body = json!({"jsonrpc": "2.0", "id": 3, "method": method, "params": params}).to_string();
    let headers = format!("Authorization: Bearer {token}\r\n");
    let resp = http_with(p.mcp, "POST", "/mcp", &headers, &body).expect("an answer");
    serde_json::from_str(resp.split_once("\r\n\r\n").map_or("", |(_, b)| b))
        .unwrap_or_else(|e| panic!("{e}: {resp}"))
}

/// A call run as a task carries its caller's token to the API as the same call without a
/// task does, and only that caller can read or cancel the task: another caller's id is
/// answered as unknown.
#[test]
fn a_task_carries_its_callers_token_and_only_its_caller_reads_it() {
    let issuer = Issuer::start();
    let (api, seen) = listen_with(api_and_upstreams());
    let u = format!("http://127.0.0.1:{api}");
    let tools = format!(
        "tools:\n  - name: api-forward\n    handler: {{http: {{url: \"{u}/api/forward\", headers: {{X-User: \"{{{{caller.sub}}}}\"}}, identity: {{mode: forward, audience: \"{u}/api\"}}}}}}\n"
    );
    let issuer_arg = format!("--auth-issuer={}", issuer.url);
    let p = start_http_env(&tools, &[&issuer_arg, "--auth-audience=quiver"], &[]);
    let token = |sub: &str| {
        issuer.token(&json!({"iss": issuer.url, "sub": sub, "exp": now() + 600, "aud": ["quiver", format!("{u}/api")]}))
    };
    let (alice, bob) = (token("alice-0001"), token("bob-0002"));
    let created = rpc_with_tasks(
        &p,
        &alice,
        "tools/call",
        json!({"name": "api-forward", "arguments": {}}),
    );
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let id = created["result"]["taskId"]
        .as_str()
        .expect("a task id")
        .to_owned();
    let mut done = Value::Null;
    wait_for("the task to complete", || {
        done = rpc_with_tasks(&p, &alice, "tasks/get", json!({"taskId": id}));
        done["result"]["status"] != "working"
    });
    assert_eq!(done["result"]["status"], "completed", "{done}");
    let result = &done["result"]["result"];
    assert_eq!(result["isError"], false, "{done}");
    assert_eq!(
        result["content"][0]["text"],
        json!({"saw": "Bearer [redacted]", "user": "[redacted]"}).to_string()
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        (seen[0].authorization.as_str(), seen[0].x_user.as_str()),
        (format!("Bearer {alice}").as_str(), "alice-0001")
    );
    // Bob cannot tell alice's task from one that does not exist.
    for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
        let params = |id: &str| json!({"taskId": id, "inputResponses": {"k": {"action": "accept"}}});
        let foreign = rpc_with_tasks(&p, &bob, method, params(&id));
        let unknown = rpc_with_tasks(&p, &bob, method, params(&"0".repeat(32)));
        assert_eq!(foreign["error"]["code"], -32602, "{method}: {foreign}");
        assert_eq!(foreign["error"]["code"], unknown["error"]["code"], "{method}");
        assert!(foreign.get("result").is_none(), "{method}: {foreign}");
    }
    let still = rpc_with_tasks(&p, &alice, "tasks/get", json!({"taskId": id}));
    assert_eq!(
        still["result"]["status"], "completed",
        "bob's cancel changed nothing: {still}"
    );
}
