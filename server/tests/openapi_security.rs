//! Security schemes of an imported OpenAPI document, on the real binary: each operation
//! carries the credential its document asks for (API key in a header, the query or a cookie,
//! bearer, basic, OAuth2 client credentials), read from Secrets; an OAuth2 token is fetched
//! once for many calls, again on expiry and on a 401, and a broken token endpoint is a tool
//! error that says what is wrong.

mod real_binary;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use real_binary::{Proc, http, start_http_env, wait_for};
use serde_json::{Value, json};

/// One request the target received.
#[derive(Debug, Clone)]
struct Seen {
    target: String,
    headers: BTreeMap<String, String>,
}

#[derive(Default)]
struct State {
    seen: Mutex<Vec<Seen>>,
    /// Tokens issued so far.
    issued: AtomicUsize,
    /// Tokens below this number are refused by `/api` (a revocation).
    revoked_below: AtomicUsize,
    /// Documents served, by path (a hostile document host).
    docs: Mutex<BTreeMap<String, String>>,
}

/// The API and its token endpoint on one loopback port: API paths record what they receive;
/// `/token` checks the grant and issues `tok-N` living 2 seconds; `/token-*` misbehave.
fn target() -> (u16, Arc<State>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let state = Arc::new(State::default());
    let st = state.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let st = st.clone();
            std::thread::spawn(move || serve(conn, &st));
        }
    });
    (port, state)
}

fn serve(mut conn: std::net::TcpStream, st: &State) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let target = line.split(' ').nth(1).unwrap_or_default().to_owned();
    let mut headers = BTreeMap::new();
    loop {
        let mut l = String::new();
        if reader.read_line(&mut l).unwrap_or(0) == 0 || l == "\r\n" {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    let _ = reader.read_exact(&mut body);
    let body = String::from_utf8_lossy(&body).into_owned();
    let auth = headers.get("authorization").cloned().unwrap_or_default();
    if let Some(doc) = st.docs.lock().unwrap().get(&target).cloned() {
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{doc}",
            doc.len()
        );
        return;
    }
    let (status, content) = match target.as_str() {
        "/token" => {
            let ok = auth == "Basic Y2xpZW50OnMzY3JldA=="
                && body.contains("grant_type=client_credentials")
                && body.contains("scope=read");
            if ok {
                let n = st.issued.fetch_add(1, Ordering::SeqCst) + 1;
                (
                    "200 OK",
                    json!({"access_token": format!("tok-{n}"), "token_type": "Bearer", "expires_in": 2})
                        .to_string(),
                )
            } else {
                ("401 Unauthorized", json!({"error": "invalid_client"}).to_string())
            }
        }
        "/token-huge" => (
            "200 OK",
            format!("{{\"access_token\": \"{}\"}}", "a".repeat(1 << 20)),
        ),
        "/token-html" => ("200 OK", "<html>sign in</html>".to_owned()),
        "/token-missing" => ("200 OK", json!({"token_type": "Bearer"}).to_string()),
        "/token-500" => ("500 Internal Server Error", "oops".to_owned()),
        "/token-slow" => {
            std::thread::sleep(Duration::from_secs(3));
            ("200 OK", json!({"access_token": "late"}).to_string())
        }
        _ => {
            st.seen.lock().unwrap().push(Seen {
                target: target.clone(),
                headers: headers.clone(),
            });
            let revoked = auth
                .strip_prefix("Bearer tok-")
                .and_then(|n| n.parse::<usize>().ok())
                .is_some_and(|n| n < st.revoked_below.load(Ordering::SeqCst));
            if revoked {
                ("401 Unauthorized", "revoked".to_owned())
            } else {
                ("200 OK", json!({"ok": true}).to_string())
            }
        }
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{content}",
        content.len()
    );
}

fn write_secret(root: &std::path::Path, name: &str, key: &str, value: &str) {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(key), value).unwrap();
}

fn call(p: &Proc, tool: &str, args: Value) -> Value {
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": args}});
    let resp = http(p.mcp, "POST", "/mcp", &req.to_string()).expect("an answer");
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str::<Value>(body).unwrap_or_else(|e| panic!("{e}: {resp}"))["result"].clone()
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

fn document(port: u16) -> Value {
    let op = |id: &str, security: Value, params: Value| {
        json!({"get": {"operationId": id, "security": security, "parameters": params,
                       "responses": {"200": {"description": "ok"}}}})
    };
    let cc = |path: &str| json!({"type": "oauth2", "flows": {"clientCredentials": {"tokenUrl": format!("http://127.0.0.1:{port}{path}"), "scopes": {"read": "read"}}}});
    let mut paths = json!({
        "/header": op("header", json!([{"key": []}]), json!([])),
        "/query": op("query", json!([{"oidc": []}, {"query": []}]), json!([{"name": "limit", "in": "query", "schema": {"type": "integer"}}])),
        "/cookie": op("cookie", json!([{"cookie": []}]), json!([{"name": "theme", "in": "cookie", "schema": {"type": "string"}}])),
        "/bearer": op("bearer", json!([{"bearer": []}]), json!([])),
        "/basic": op("basic", json!([{"basic": []}]), json!([])),
        "/open": op("open", json!([]), json!([])),
        "/api": op("oauth", json!([{"cc": ["read"]}]), json!([])),
        "/api/other": op("oauthOther", json!([{"cc": ["read"]}]), json!([])),
    });
    let mut schemes = json!({
        "key": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
        "query": {"type": "apiKey", "in": "query", "name": "api key"},
        "cookie": {"type": "apiKey", "in": "cookie", "name": "sid"},
        "bearer": {"type": "http", "scheme": "bearer"},
        "basic": {"type": "http", "scheme": "basic"},
        "oidc": {"type": "openIdConnect", "openIdConnectUrl": "http://127.0.0.1/x"},
        "cc": cc("/token"),
    });
    for bad in ["huge", "html", "missing", "500", "slow"] {
        paths[format!("/bad/{bad}")] = op(
            &format!("bad_{bad}"),
            json!([{format!("cc_{bad}"): ["read"]}]),
            json!([]),
        );
        schemes[format!("cc_{bad}")] = cc(&format!("/token-{bad}"));
    }
    json!({
        "openapi": "3.0.3", "info": {"title": "secured", "version": "1"},
        "servers": [{"url": format!("http://127.0.0.1:{port}")}],
        "paths": paths, "components": {"securitySchemes": schemes}
    })
}

fn start(port: u16) -> (Proc, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    write_secret(dir.path(), "api", "key", "k&v x\n");
    write_secret(dir.path(), "api", "token", "bearer-token");
    write_secret(dir.path(), "api", "user", "alice");
    write_secret(dir.path(), "api", "password", "p@ss w");
    write_secret(dir.path(), "oauth", "id", "client");
    write_secret(dir.path(), "oauth", "secret", "s3cret\n");
    let doc = dir.path().join("api.json");
    std::fs::write(&doc, document(port).to_string()).unwrap();
    let mut security = String::new();
    for bad in ["", "_huge", "_html", "_missing", "_500", "_slow"] {
        security.push_str(&format!(
            "      cc{bad}: {{secret: oauth, clientIdKey: id, clientSecretKey: secret, allowHttp: true}}\n"
        ));
    }
    let tools = format!(
        r#"openapi:
  - name: api
    file: {doc}
    timeout: 1s
    security:
      key: {{secret: api, key: key}}
      query: {{secret: api, key: key}}
      cookie: {{secret: api, key: key}}
      bearer: {{secret: api, key: token}}
      basic: {{secret: api, usernameKey: user, passwordKey: password}}
{security}"#,
        doc = doc.display()
    );
    let source = format!("--secrets=dir:{}", dir.path().display());
    (start_http_env(&tools, &[&source], &[]), dir)
}

fn last(st: &State) -> Seen {
    st.seen.lock().unwrap().last().cloned().expect("a request")
}

#[test]
fn api_keys_bearer_and_basic_reach_the_api_where_the_document_says() {
    let (port, st) = target();
    let (p, _dir) = start(port);

    let r = call(&p, "header", json!({}));
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(
        last(&st).headers.get("x-api-key").map(String::as_str),
        Some("k&v x")
    );

    // `oidc` has no credential: the next alternative, the query; the argument joins it.
    let r = call(&p, "query", json!({"limit": 5}));
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(last(&st).target, "/query?api%20key=k%26v%20x&limit=5");

    // One Cookie header: the scheme's and the argument's.
    let r = call(&p, "cookie", json!({"theme": "dark"}));
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(
        last(&st).headers.get("cookie").map(String::as_str),
        Some("sid=k%26v%20x; theme=dark")
    );

    call(&p, "bearer", json!({}));
    assert_eq!(last(&st).headers["authorization"], "Bearer bearer-token");
    call(&p, "basic", json!({}));
    assert_eq!(last(&st).headers["authorization"], "Basic YWxpY2U6cEBzcyB3");
    call(&p, "open", json!({}));
    let seen = last(&st);
    assert_eq!(seen.target, "/open");
    assert!(!seen.headers.contains_key("authorization") && !seen.headers.contains_key("x-api-key"));
}

#[test]
fn an_oauth2_token_is_fetched_once_for_many_calls_and_again_on_expiry_or_401() {
    let (port, st) = target();
    let (p, _dir) = start(port);
    for tool in ["oauth", "oauthOther", "oauth", "oauthOther", "oauth"] {
        let r = call(&p, tool, json!({}));
        assert_eq!(r["isError"], false, "{r}");
        assert_eq!(last(&st).headers["authorization"], "Bearer tok-1");
    }
    assert_eq!(
        st.issued.load(Ordering::SeqCst),
        1,
        "one grant, one token for both operations"
    );
    // The token lives 2s: once it is about to expire, the next call fetches a new one.
    wait_for("a token fetched again on expiry", || {
        call(&p, "oauth", json!({}));
        st.issued.load(Ordering::SeqCst) == 2
    });
    assert_eq!(last(&st).headers["authorization"], "Bearer tok-2");
    // The API refuses the current token: the call fetches a new one and succeeds.
    st.revoked_below.store(3, Ordering::SeqCst);
    let r = call(&p, "oauth", json!({}));
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(st.issued.load(Ordering::SeqCst), 3);
    assert_eq!(last(&st).headers["authorization"], "Bearer tok-3");
    // Refused again after the fresh token: an error, with no loop of fetches.
    st.revoked_below.store(usize::MAX, Ordering::SeqCst);
    let r = call(&p, "oauth", json!({}));
    assert_eq!(r["isError"], true, "{r}");
    assert!(text(&r).contains("401"), "{r}");
    assert_eq!(st.issued.load(Ordering::SeqCst), 4);
}

#[test]
fn a_broken_token_endpoint_is_a_tool_error_saying_what_is_wrong() {
    let (port, st) = target();
    let (p, _dir) = start(port);
    for (tool, want) in [
        ("bad_huge", "more than 65536 bytes"),
        ("bad_html", "answered no JSON"),
        ("bad_missing", "no `access_token`"),
        ("bad_500", "answered 500"),
        ("bad_slow", "did not answer within 1s"),
    ] {
        let r = call(&p, tool, json!({}));
        assert_eq!(r["isError"], true, "{tool}: {r}");
        assert!(text(&r).contains(want), "{tool}: {r}");
        assert!(!text(&r).contains("s3cret"), "{tool}: {r}");
    }
    assert!(
        st.seen.lock().unwrap().is_empty(),
        "no API request without a token"
    );
    // The server is still serving.
    assert_eq!(call(&p, "open", json!({}))["isError"], false);
}

/// A hostile document host, end to end: a document fetched by `url` whose server URL names a
/// Secret, and one whose server resolves to this host. The document's text reads nothing,
/// and a server it chose is not connected to when it is this host.
#[test]
fn a_fetched_documents_text_reads_no_secret_and_its_server_is_never_this_host() {
    let (port, st) = target();
    let get = |id: &str, security: Value| json!({"get": {"operationId": id, "security": security, "responses": {"200": {"description": "ok"}}}});
    st.docs.lock().unwrap().insert(
        "/billing.json".to_owned(),
        json!({
            "openapi": "3.0.3", "info": {"title": "billing", "version": "1"},
            "servers": [{"url": format!("http://127.0.0.1:{port}/x/{{{{secret.db.password}}}}{{{{caller.sub}}}}")}],
            "paths": {"/invoices": get("invoices", json!([{"key": []}]))},
            "components": {"securitySchemes": {"key": {"type": "apiKey", "in": "header", "name": "X-Api-Key"}}}
        })
        .to_string(),
    );
    // `vm`-style names: the machine's own host name resolves to one of its own addresses.
    let own = std::process::Command::new("hostname").output().unwrap();
    let own = String::from_utf8_lossy(&own.stdout).trim().to_owned();
    st.docs.lock().unwrap().insert(
        "/open.json".to_owned(),
        json!({
            "openapi": "3.0.3", "info": {"title": "open", "version": "1"},
            "servers": [{"url": format!("http://{own}:{port}/y")}],
            "paths": {"/status": get("status", json!([]))}
        })
        .to_string(),
    );
    let dir = tempfile::tempdir().unwrap();
    write_secret(dir.path(), "db", "password", "hunter2-db");
    write_secret(dir.path(), "api", "key", "billing-key");
    let tools = format!(
        r#"tools:
  - name: dbq
    handler: {{http: {{url: "http://127.0.0.1:{port}/q?pw={{{{secret.db.password}}}}"}}}}
openapi:
  - name: billing
    url: http://127.0.0.1:{port}/billing.json
    fetch: {{allowHttp: true}}
    allowedOrigins: [http://127.0.0.1:{port}]
    security: {{key: {{secret: api, key: key}}}}
  - name: open
    url: http://127.0.0.1:{port}/open.json
    fetch: {{allowHttp: true}}
"#
    );
    let source = format!("--secrets=dir:{}", dir.path().display());
    let p = start_http_env(&tools, &[&source], &[]);

    let r = call(&p, "invoices", json!({}));
    assert_eq!(r["isError"], false, "{r}");
    let r = call(&p, "status", json!({}));
    assert_eq!(r["isError"], true, "{r}");
    assert!(text(&r).contains("may not choose"), "{r}");
    let seen = st.seen.lock().unwrap().clone();
    for s in &seen {
        assert!(
            !s.target.contains("hunter2"),
            "the document's text read a Secret: {s:?}"
        );
        assert!(!s.target.starts_with("/y"), "a call reached this host: {s:?}");
    }
    // The document's braces were sent as the characters they are, with the API key, to the
    // origin the author allowed.
    assert!(
        seen.iter()
            .any(|s| s.target == "/x/{{secret.db.password}}{{caller.sub}}/invoices"
                && s.headers.get("x-api-key").map(String::as_str) == Some("billing-key")),
        "{seen:?}"
    );
}
