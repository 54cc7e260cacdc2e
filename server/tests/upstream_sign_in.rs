//! Each user's own sign-in to upstreams, on the real binary, against a real authorization
//! server on both sides: Keycloak's realm `quiver` issues the callers' tokens and signs the
//! browser in (client `quiver-sign-in`), its realm `upstream` is the third party's own
//! authorization server (scripts/idp/*.json). A stand-in upstream MCP server on a loopback
//! port serves two endpoints, `/notes/mcp` (Quiver registers itself at the realm, RFC 7591)
//! and `/wiki/mcp` (a confidential client registered beforehand, its issuer configured, whose
//! access tokens live 30 s); it lists its tool to anyone, and answers a call only with a
//! token the realm's userinfo endpoint accepts, naming the user it names.
//!
//! The browser is played over plain HTTP: cookies by host and path, redirects followed one by
//! one, Keycloak's login form posted. Alice is carol upstream, Bob is dave.
//!
//! Keycloak is started for the test unless QUIVER_IDP_ENV names the `env` file of one started
//! with `scripts/idp.sh start DIR`.

mod real_binary;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::{BodyExt, Full};
use quiver_server::net::http::HttpClient;
use real_binary::{Proc, free_port};
use serde_json::{Value, json};

/// Bound on any one request of the test (never a pass/fail timing).
const PATIENCE: Duration = Duration::from_secs(60);

/// A Keycloak instance: started here (and stopped on drop), or the one QUIVER_IDP_ENV names.
struct Idp {
    env: HashMap<String, String>,
    started: Option<PathBuf>,
}

impl Idp {
    fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/idp.sh")
    }

    fn get() -> Self {
        let (file, started) = match std::env::var("QUIVER_IDP_ENV") {
            Ok(f) => (PathBuf::from(f), None),
            Err(_) => {
                let dir = std::env::temp_dir().join(format!("quiver-sign-in-{}", std::process::id()));
                let out = Command::new(Self::script())
                    .arg("start")
                    .arg(&dir)
                    .output()
                    .expect("scripts/idp.sh");
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                (dir.join("env"), Some(dir))
            }
        };
        let text = std::fs::read_to_string(&file).expect("the idp env file");
        let env = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Self { env, started }
    }
}

impl Drop for Idp {
    fn drop(&mut self) {
        if let Some(dir) = &self.started {
            let _ = Command::new(Self::script()).arg("stop").arg(dir).status();
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// One request through the HTTP client (no redirect followed); the answer with its body.
async fn send(http: &HttpClient, req: Request<Full<Bytes>>) -> Response<Bytes> {
    let work = async {
        let resp = http.send(req, None, &Value::Null).await.expect("an answer");
        let (parts, body) = resp.into_parts();
        Response::from_parts(parts, body.collect().await.expect("a body").to_bytes())
    };
    tokio::time::timeout(PATIENCE, work)
        .await
        .expect("an answer in time")
}

fn text(r: &Response<Bytes>) -> String {
    String::from_utf8_lossy(r.body()).into_owned()
}

/// What the stand-in upstream saw: the endpoint, bearer token and user (when the token was
/// accepted) of each request that carried one.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Bearer>>>);

/// The endpoint a token was sent to, the token, and the user it names (`None`: refused).
type Bearer = (String, String, Option<String>);

/// Answers MCP on `/{name}/mcp`: `initialize`, `ping`, notifications, `tools/list` (tool
/// `whoami`) to anyone; a request with a bearer token only when the realm's userinfo accepts it, and
/// `whoami` says who it names. A refused token gets `401` with the challenge.
async fn upstream(issuer: String, seen: Seen) -> String {
    let issuer_of_prm = issuer.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let http = HttpClient::new();
    let b = base.clone();
    let mcp = move |axum::extract::Path(name): axum::extract::Path<String>,
                    headers: http::HeaderMap,
                    body: Bytes| {
        let (http, issuer, seen, base) = (http.clone(), issuer.clone(), seen.clone(), b.clone());
        async move {
            let msg: Value = serde_json::from_slice(&body).unwrap_or_default();
            let user = match headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
                None => None,
                Some(auth) => {
                    let token = auth.strip_prefix("Bearer ").unwrap_or_default().to_owned();
                    let req = Request::get(format!("{issuer}/protocol/openid-connect/userinfo"))
                        .header(header::AUTHORIZATION, format!("Bearer {token}"))
                        .body(Full::default())
                        .unwrap();
                    let r = send(&http, req).await;
                    let me: Value = serde_json::from_slice(r.body()).unwrap_or_default();
                    let user = me["preferred_username"].as_str().map(str::to_owned);
                    seen.0.lock().unwrap().push((
                        name.clone(),
                        token,
                        user.clone().filter(|_| r.status() == 200),
                    ));
                    match (r.status().as_u16(), me["preferred_username"].as_str()) {
                        (200, Some(u)) => Some(u.to_owned()),
                        _ => {
                            let challenge = format!(
                                r#"Bearer error="invalid_token", resource_metadata="{base}/.well-known/oauth-protected-resource/{name}/mcp""#
                            );
                            return (
                                http::StatusCode::UNAUTHORIZED,
                                [(header::WWW_AUTHENTICATE, challenge)],
                                String::new(),
                            );
                        }
                    }
                }
            };
            let id = msg["id"].clone();
            let result = match msg["method"].as_str().unwrap_or_default() {
                "initialize" => json!({
                    "protocolVersion": msg["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": format!("{name}-upstream"), "version": "1"},
                }),
                "tools/list" => {
                    json!({"tools": [{"name": "whoami", "description": "who calls", "inputSchema": {"type": "object"}}]})
                }
                "tools/call" => match user {
                    Some(u) => {
                        json!({"content": [{"type": "text", "text": format!("{name}: you are {u}")}], "isError": false})
                    }
                    None => json!({"content": [{"type": "text", "text": "nobody"}], "isError": true}),
                },
                _ if id.is_null() => {
                    return (
                        http::StatusCode::ACCEPTED,
                        [(header::CONTENT_TYPE, "application/json".to_owned())],
                        String::new(),
                    );
                }
                _ => json!({}),
            };
            let answer = json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
            (
                http::StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json".to_owned())],
                answer,
            )
        }
    };
    let (iss, b) = (issuer_of_prm, base.clone());
    let prm = move |axum::extract::Path(name): axum::extract::Path<String>| {
        let (iss, b) = (iss.clone(), b.clone());
        async move {
            let doc = json!({
                "resource": format!("{b}/{name}/mcp"),
                "authorization_servers": [iss],
                "scopes_supported": ["openid", "profile"],
            });
            ([(header::CONTENT_TYPE, "application/json")], doc.to_string())
        }
    };
    let app = axum::Router::new()
        .route("/{name}/mcp", axum::routing::post(mcp))
        .route(
            "/.well-known/oauth-protected-resource/{name}/mcp",
            axum::routing::get(prm),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

/// A browser: cookies by host and path, no redirect followed on its own.
struct Browser {
    http: HttpClient,
    /// (host, path, name) -> value.
    jar: Vec<(String, String, String, String)>,
    /// The `code` and `state` of every redirect it was sent, and every cookie it was given.
    saw: Vec<String>,
}

impl Browser {
    fn new(http: &HttpClient) -> Self {
        Self {
            http: http.clone(),
            jar: Vec::new(),
            saw: Vec::new(),
        }
    }

    fn cookie_header(&self, uri: &http::Uri) -> String {
        let (host, path) = (uri.host().unwrap_or_default(), uri.path());
        self.jar
            .iter()
            .filter(|(h, p, _, _)| h == host && path.starts_with(p.as_str()))
            .map(|(_, _, n, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn keep(&mut self, uri: &http::Uri, r: &Response<Bytes>) {
        let host = uri.host().unwrap_or_default().to_owned();
        for c in r.headers().get_all(header::SET_COOKIE) {
            let c = c.to_str().unwrap_or_default();
            let mut parts = c.split(';').map(str::trim);
            let Some((name, value)) = parts.next().and_then(|kv| kv.split_once('=')) else {
                continue;
            };
            let mut path = "/".to_owned();
            let mut gone = value.is_empty();
            for a in parts {
                let lower = a.to_ascii_lowercase();
                if let Some(p) = lower.strip_prefix("path=") {
                    path = a[5..5 + p.len()].to_owned();
                }
                if lower == "max-age=0" || lower.starts_with("expires=thu, 01 jan 1970") {
                    gone = true;
                }
            }
            self.jar
                .retain(|(h, p, n, _)| !(h == &host && p == &path && n == name));
            if !gone {
                self.jar
                    .push((host.clone(), path, name.to_owned(), value.to_owned()));
            }
        }
    }

    async fn request(&mut self, req: http::request::Builder, body: Option<String>) -> Response<Bytes> {
        let uri = req.uri_ref().unwrap().clone();
        let req = req
            .header(header::COOKIE, self.cookie_header(&uri))
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .unwrap();
        let r = send(&self.http, req).await;
        self.keep(&uri, &r);
        if let Some(to) = r.headers().get(header::LOCATION).and_then(|l| l.to_str().ok()) {
            self.saw.extend(
                ["code", "state"]
                    .map(|k| query_value(to, k))
                    .into_iter()
                    .filter(|v| v.len() > 8),
            );
        }
        self.saw.extend(
            self.jar
                .iter()
                .map(|(_, _, _, v)| v.clone())
                .filter(|v| v.len() > 8),
        );
        r
    }

    async fn get(&mut self, url: &str) -> Response<Bytes> {
        self.request(Request::get(url), None).await
    }

    /// Follows `url` through the identity provider, signing in as `user` when it asks, up to
    /// the first answer of `stop_at`: that answer.
    async fn through_idp(&mut self, url: &str, user: &str, stop_at: &str) -> Response<Bytes> {
        let mut next = url.to_owned();
        for _ in 0..10 {
            let r = self.get(&next).await;
            if next.starts_with(stop_at) {
                return r;
            }
            if r.status() == 302 {
                next = location(&r);
                continue;
            }
            assert_eq!(r.status(), 200, "{next}: {}", text(&r));
            let html = text(&r);
            let form = html.find("id=\"kc-form-login\"").expect("Keycloak's login form");
            let action = html[form..]
                .split("action=\"")
                .nth(1)
                .and_then(|a| a.split('"').next())
                .expect("its action")
                .replace("&amp;", "&");
            let body = format!("username={user}&password={user}-password&credentialId=");
            let req = Request::post(action).header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
            let r = self.request(req, Some(body)).await;
            assert_eq!(r.status(), 302, "{}", text(&r));
            next = location(&r);
        }
        panic!("more redirects than a sign-in takes");
    }
}

fn location(r: &Response<Bytes>) -> String {
    r.headers()[header::LOCATION].to_str().unwrap().to_owned()
}

/// The MCP endpoint as one caller (one access token).
struct Caller {
    http: HttpClient,
    mcp: String,
    token: String,
    session: Option<String>,
}

impl Caller {
    async fn rpc(&self, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
        let mut req = Request::post(&self.mcp)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header(header::AUTHORIZATION, format!("Bearer {}", self.token));
        if let Some(s) = &self.session {
            req = req
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", "2025-11-25");
        }
        self.answer(req, body).await
    }

    /// Sends `req` with `body` and reads its JSON-RPC answer (JSON, or the SSE event
    /// holding it).
    async fn answer(&self, req: http::request::Builder, body: String) -> Value {
        let r = send(&self.http, req.body(Full::new(Bytes::from(body))).unwrap()).await;
        let t = text(&r);
        let json = t
            .lines()
            .find_map(|l| l.strip_prefix("data:"))
            .map_or(t.as_str(), str::trim);
        serde_json::from_str(json).unwrap_or_else(|_| panic!("{}: {t}", r.status()))
    }

    /// Calls `tool`: its text, and whether it is a tool error.
    async fn call(&self, tool: &str, args: Value) -> (String, bool) {
        let v = self
            .rpc("tools/call", json!({"name": tool, "arguments": args}))
            .await;
        let r = &v["result"];
        assert!(r.is_object(), "{v}");
        (
            r["content"][0]["text"].as_str().unwrap_or_default().to_owned(),
            r["isError"] == true,
        )
    }

    /// A 2026-07-28 call of `tool` (no session) from a client that opens URLs, with `extra`
    /// params (a retry's `requestState` and `inputResponses`).
    async fn stateless_call(&self, tool: &str, extra: Value) -> Value {
        let mut params = json!({
            "name": tool,
            "arguments": {},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}, "url": {}}},
            },
        });
        if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
        let req = Request::post(&self.mcp)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header(header::AUTHORIZATION, format!("Bearer {}", self.token))
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", tool);
        self.answer(req, body.to_string()).await
    }

    /// The sign-in link a call of `tool` answers with.
    async fn link(&self, tool: &str) -> String {
        let (t, error) = self.call(tool, json!({})).await;
        assert!(error && t.contains("Open this link in your browser"), "{t}");
        let at = t.find("http://").expect("a link");
        t[at..].split_whitespace().next().unwrap().to_owned()
    }
}

/// An access token of the realm `quiver` for `user` (client `agent`, password grant).
async fn access_token(http: &HttpClient, token_endpoint: &str, user: &str) -> String {
    let body = format!("grant_type=password&client_id=agent&username={user}&password={user}-password");
    let req = Request::post(token_endpoint)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let r = send(http, req).await;
    let v: Value = serde_json::from_slice(r.body()).unwrap_or_default();
    v["access_token"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_owned()
}

/// A whole sign-in: the link opened in `browser`, signed in as `user` at the realm `quiver`
/// and as `upstream_user` at the realm `upstream`; the last page.
async fn sign_in(
    browser: &mut Browser,
    link: &str,
    mcp_base: &str,
    user: &str,
    upstream_user: &str,
) -> Response<Bytes> {
    let callback = format!("{mcp_base}/oauth/callback");
    let r = browser.get(link).await;
    assert_eq!(r.status(), 302, "{}", text(&r));
    let bound = browser.through_idp(&location(&r), user, &callback).await;
    if bound.status() != 302 {
        return bound;
    }
    browser
        .through_idp(&location(&bound), upstream_user, &callback)
        .await
}

fn toolset(upstream: &str, upstream_issuer: &str) -> String {
    format!(
        r#"upstreams:
  - name: notes
    http: {{url: "{upstream}/notes/mcp"}}
    identity: {{mode: user, scopes: [openid, profile]}}
    tools: {{prefix: notes_}}
  - name: wiki
    http: {{url: "{upstream}/wiki/mcp"}}
    identity:
      mode: user
      scopes: [openid, profile]
      issuer: "{upstream_issuer}"
      client: {{id: notes-registered, secret: "{{{{secret.upstream-client.secret}}}}"}}
    tools: {{prefix: wiki_}}
"#
    )
}

#[test]
fn each_user_signs_in_to_upstreams_and_calls_act_as_them() {
    let idp = Idp::get();
    let upstream_issuer = idp.env["QUIVER_IDP_UPSTREAM_ISSUER"].clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(idp, upstream_issuer));
}

/// The server with the stand-in upstream, its audit file and its log file.
fn start_server(upstream: &str, issuer: &str, upstream_issuer: &str) -> (Proc, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tools.yaml");
    std::fs::write(&config, toolset(upstream, upstream_issuer)).unwrap();
    let (audit, log) = (dir.path().join("audit.jsonl"), dir.path().join("server.log"));
    let (mcp, admin) = (free_port(), free_port());
    let ring = format!("k1:{}", STANDARD.encode([7u8; 32]));
    let child = Command::new(env!("CARGO_BIN_EXE_quiver-server"))
        .arg(format!("--config=file:{}", config.display()))
        .arg(format!("--listen=127.0.0.1:{mcp}"))
        .arg(format!("--admin-listen=127.0.0.1:{admin}"))
        .arg(format!("--auth-issuer={issuer}"))
        .arg("--auth-audience=quiver")
        .arg("--secrets=env")
        .arg(format!("--upstream-sign-in-url=http://127.0.0.1:{mcp}"))
        .arg("--upstream-sign-in-keys=signin.keys")
        .arg("--upstream-sign-in-client-id=quiver-sign-in")
        .arg("--upstream-sign-in-client-secret=signin.browser")
        // Keycloak is on a loopback port: metadata may name it.
        .arg("--upstream-sign-in-local-servers")
        .arg(format!("--audit=file:{}", audit.display()))
        .env("QUIVER_SECRET_SIGNIN_KEYS", ring)
        .env("QUIVER_SECRET_SIGNIN_BROWSER", "quiver-sign-in-secret-0123456789")
        .env(
            "QUIVER_SECRET_UPSTREAM_CLIENT_SECRET",
            "notes-registered-secret-0123456789",
        )
        .env("RUST_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    (Proc::ready(child, mcp, admin, dir), audit, log)
}

async fn metrics(http: &HttpClient, admin: u16) -> String {
    let r = send(
        http,
        Request::get(format!("http://127.0.0.1:{admin}/metrics"))
            .body(Full::default())
            .unwrap(),
    )
    .await;
    text(&r)
}

// Long: one story, each step depending on the one before.
async fn run(idp: Idp, upstream_issuer: String) {
    let http = HttpClient::new();
    let seen = Seen::default();
    let up = upstream(upstream_issuer.clone(), seen.clone()).await;
    let issuer = idp.env["QUIVER_IDP_ISSUER"].clone();
    let token_endpoint = idp.env["QUIVER_IDP_TOKEN_ENDPOINT"].clone();
    let (server, audit, log) = start_server(&up, &issuer, &upstream_issuer);
    let base = format!("http://127.0.0.1:{}", server.mcp);
    let caller = |token: String| Caller {
        http: http.clone(),
        mcp: format!("{base}/mcp"),
        token,
        session: None,
    };
    let alice = caller(access_token(&http, &token_endpoint, "alice").await);
    let bob = caller(access_token(&http, &token_endpoint, "bob").await);

    // The sign-out tool is listed with the upstreams' tools (imported once connected).
    let mut names = Vec::new();
    for _ in 0..600 {
        let tools = alice.rpc("tools/list", json!({})).await;
        names = tools["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect();
        if names.iter().any(|n| n == "wiki_whoami") && names.iter().any(|n| n == "notes_whoami") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !names.iter().any(|n| n == "notes_whoami") {
        let r = send(
            &http,
            Request::get(format!("http://127.0.0.1:{}/status", server.admin))
                .body(Full::default())
                .unwrap(),
        )
        .await;
        panic!(
            "{names:?}\n{}\n{}",
            text(&r),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    assert!(names.iter().any(|n| n == "sign_out_upstream"), "{names:?}");

    // 1. First call: a link (tool error). A client that declared URL elicitation gets -32042.
    let link = alice.link("notes_whoami").await;
    assert!(link.starts_with(&format!("{base}/oauth/start?t=")), "{link}");
    let session = open_session(&http, &base, &alice.token).await;
    let eliciting = Caller {
        session: Some(session),
        ..caller(alice.token.clone())
    };
    let v = eliciting
        .rpc("tools/call", json!({"name": "notes_whoami", "arguments": {}}))
        .await;
    assert_eq!(v["error"]["code"], -32042, "{v}");
    let e = &v["error"]["data"]["elicitations"][0];
    assert_eq!(e["mode"], "url");
    assert!(
        e["url"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{base}/oauth/start?t="))
            && e["elicitationId"].is_string(),
        "{e}"
    );

    // A 2026-07-28 client that opens URLs gets the link as a URL-mode question of the call's
    // input round; declining ends the call, asking nothing more.
    let asked = alice.stateless_call("notes_whoami", json!({})).await;
    let r = &asked["result"];
    assert_eq!(r["resultType"], "input_required", "{asked}");
    let q = &r["inputRequests"]["sign-in-notes"];
    assert_eq!(q["method"], "elicitation/create", "{asked}");
    assert_eq!(q["params"]["mode"], "url", "{asked}");
    assert!(
        q["params"]["url"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{base}/oauth/start?t=")),
        "{asked}"
    );
    let round_state = r["requestState"].as_str().unwrap().to_owned();
    let answer = |action: &str| json!({"requestState": round_state, "inputResponses": {"sign-in-notes": {"action": action}}});
    let declined = alice.stateless_call("notes_whoami", answer("decline")).await;
    assert_eq!(declined["result"]["isError"], true, "{declined}");
    assert!(
        declined["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("you declined to sign in to upstream `notes`"),
        "{declined}"
    );

    // 2. Alice opens the link, signs in at the realm `quiver`, then upstream as carol.
    let mut alices = Browser::new(&http);
    let done = sign_in(&mut alices, &link, &base, "alice", "carol").await;
    assert_eq!(done.status(), 200, "{}", text(&done));
    assert!(text(&done).contains("Signed in to notes"));
    assert!(
        text(&done).contains("signed in to notes. Its authorization server reports the account carol."),
        "{}",
        text(&done)
    );
    assert_eq!(done.headers()[header::CACHE_CONTROL], "no-store");
    assert_eq!(done.headers()[header::REFERRER_POLICY], "no-referrer");
    assert_eq!(
        alice.call("notes_whoami", json!({})).await,
        ("notes: you are carol".to_owned(), false)
    );
    assert_eq!(
        eliciting.call("notes_whoami", json!({})).await.0,
        "notes: you are carol"
    );
    // The 2026-07-28 client's retry, having opened the link, goes through.
    let retried = alice.stateless_call("notes_whoami", answer("accept")).await;
    assert_eq!(
        retried["result"]["content"][0]["text"], "notes: you are carol",
        "{retried}"
    );

    // 3. Bob separately, as dave; alice stays carol.
    let link = bob.link("notes_whoami").await;
    let mut bobs = Browser::new(&http);
    assert_eq!(
        sign_in(&mut bobs, &link, &base, "bob", "dave").await.status(),
        200
    );
    assert_eq!(bob.call("notes_whoami", json!({})).await.0, "notes: you are dave");
    assert_eq!(
        alice.call("notes_whoami", json!({})).await.0,
        "notes: you are carol"
    );

    // The access token bob's calls carry is revoked at the upstream's authorization server:
    // the upstream answers 401, the server refreshes the token once and calls again.
    let (dcr_client, bobs_token) = {
        let seen = seen.0.lock().unwrap();
        let t = seen
            .iter()
            .rev()
            .find(|(n, _, u)| n == "notes" && u.as_deref() == Some("dave"))
            .map(|(_, t, _)| t.clone())
            .expect("bob's token reached the upstream");
        (jwt_claim(&t, "azp"), t)
    };
    let revoke = format!("token={bobs_token}&token_type_hint=access_token&client_id={dcr_client}");
    let req = Request::post(format!("{upstream_issuer}/protocol/openid-connect/revoke"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from(revoke)))
        .unwrap();
    assert_eq!(send(&http, req).await.status(), 200);
    assert_eq!(bob.call("notes_whoami", json!({})).await.0, "notes: you are dave");
    let m = metrics(&http, server.admin).await;
    assert!(
        m.contains("quiver_upstream_errors_total{upstream=\"notes\",kind=\"unauthorized\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("quiver_oauth_refreshes_total{upstream=\"notes\",result=\"ok\"} 1"),
        "{m}"
    );

    // 4. Bob's browser completing a link made for alice: refused, nothing stored.
    let alices_wiki = alice.link("wiki_whoami").await;
    let refused = sign_in(&mut bobs, &alices_wiki, &base, "bob", "dave").await;
    assert_eq!(refused.status(), 403, "{}", text(&refused));
    assert!(
        text(&refused).contains("made for another user"),
        "{}",
        text(&refused)
    );
    assert!(
        alice.call("wiki_whoami", json!({})).await.1,
        "alice is not signed in to wiki"
    );

    // 5. A client registered beforehand (confidential, its `issuer` configured) whose tokens
    // live 30 s. Its access token revoked at the authorization server: the upstream answers
    // 401, the server refreshes as that client (its secret, at the configured issuer's token
    // endpoint) and calls again.
    let link = alice.link("wiki_whoami").await;
    assert_eq!(
        sign_in(&mut alices, &link, &base, "alice", "carol")
            .await
            .status(),
        200
    );
    assert_eq!(
        alice.call("wiki_whoami", json!({})).await.0,
        "wiki: you are carol"
    );
    let carols = {
        let seen = seen.0.lock().unwrap();
        seen.iter()
            .rev()
            .find(|(n, _, u)| n == "wiki" && u.as_deref() == Some("carol"))
            .map(|(_, t, _)| t.clone())
            .expect("carol's token reached the wiki")
    };
    let revoke = format!(
        "token={carols}&token_type_hint=access_token&client_id=notes-registered&client_secret=notes-registered-secret-0123456789"
    );
    let req = Request::post(format!("{upstream_issuer}/protocol/openid-connect/revoke"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from(revoke)))
        .unwrap();
    assert_eq!(send(&http, req).await.status(), 200);
    assert_eq!(
        alice.call("wiki_whoami", json!({})).await.0,
        "wiki: you are carol"
    );
    let m = metrics(&http, server.admin).await;
    let refreshed = m
        .lines()
        .find(|l| {
            l.starts_with("quiver_oauth_refreshes_total{")
                && l.contains("upstream=\"wiki\"")
                && l.contains("result=\"ok\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(refreshed >= 1, "{m}");

    // 6. Sign-out: the next call asks again, and the token is revoked at the authorization
    // server (RFC 7009): its userinfo refuses it.
    let carols_notes = {
        let seen = seen.0.lock().unwrap();
        seen.iter()
            .rev()
            .find(|(n, _, u)| n == "notes" && u.as_deref() == Some("carol"))
            .map(|(_, t, _)| t.clone())
            .expect("carol's token reached notes")
    };
    let (t, error) = alice
        .call("sign_out_upstream", json!({"upstream": "notes"}))
        .await;
    assert!(!error && t.contains("Signed out of upstream `notes`"), "{t}");
    alice.link("notes_whoami").await;
    let req = Request::get(format!("{upstream_issuer}/protocol/openid-connect/userinfo"))
        .header(header::AUTHORIZATION, format!("Bearer {carols_notes}"))
        .body(Full::default())
        .unwrap();
    assert_eq!(send(&http, req).await.status(), 401, "revoked upstream");
    let m = metrics(&http, server.admin).await;
    assert!(
        m.contains("quiver_oauth_revocations_total{upstream=\"notes\",result=\"ok\"} 1"),
        "{m}"
    );
    assert_eq!(bob.call("notes_whoami", json!({})).await.0, "notes: you are dave");

    // 7. An administrator revokes bob everywhere.
    let bob_sub = jwt_claim(&bob.token, "sub");
    let url = format!(
        "http://127.0.0.1:{}/oauth/tokens?subject={}%7C{bob_sub}",
        server.admin,
        issuer.replace(':', "%3A").replace('/', "%2F")
    );
    let r = send(&http, Request::delete(url).body(Full::default()).unwrap()).await;
    assert_eq!(
        (
            r.status().as_u16(),
            serde_json::from_slice::<Value>(r.body()).unwrap()
        ),
        (200, json!({"removed": 1}))
    );
    bob.link("notes_whoami").await;
    let m = metrics(&http, server.admin).await;
    assert!(
        m.contains("quiver_oauth_revocations_total{upstream=\"notes\",result=\"ok\"} 2"),
        "{m}"
    );
    let bad = format!("http://127.0.0.1:{}/oauth/tokens?upstream=notes", server.admin);
    assert_eq!(
        send(&http, Request::delete(bad).body(Full::default()).unwrap())
            .await
            .status(),
        400
    );

    // 8. Sign-ins and refreshes are counted and audited; nothing of a token, a code, a state,
    // a cookie or a link is in the log (at debug level) or the audit trail.
    let m = metrics(&http, server.admin).await;
    assert!(
        m.contains("quiver_oauth_sign_ins_total{upstream=\"notes\",result=\"ok\"} 2"),
        "{m}"
    );
    assert!(
        m.contains("quiver_oauth_sign_ins_total{upstream=\"wiki\",result=\"wrong_user\"} 1"),
        "{m}"
    );
    let trail = wait_for_file(&audit, "oauth.revoke");
    for event in [
        "\"oauth.sign_in\"",
        "\"oauth.refresh\"",
        "\"oauth.sign_out\"",
        "\"oauth.revoke\"",
    ] {
        assert!(trail.contains(event), "{event} missing from\n{trail}");
    }
    // Each call that reached the upstream with a user's token names the upstream account it
    // acted as; the records of other tools name none.
    let records: Vec<Value> = trail.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let acted: Vec<(&str, Option<&str>)> = records
        .iter()
        .filter(|r| r["event"] == "tools/call" && r["outcome"] == "ok")
        .map(|r| (r["tool"].as_str().unwrap(), r["upstreamAccount"].as_str()))
        .collect();
    let mut unnamed = 0;
    for (tool, account) in &acted {
        if !(tool.starts_with("notes_") || tool.starts_with("wiki_")) {
            assert_eq!(*account, None, "{tool}");
        } else if account.is_none() {
            unnamed += 1;
        } else {
            assert!(matches!(account, Some("carol" | "dave")), "{tool}: {account:?}");
        }
    }
    // The one answer of theirs that did not reach the upstream: the 2026-07-28 input round.
    assert_eq!(unnamed, 1, "{acted:?}");
    for who in ["carol", "dave"] {
        assert!(
            acted.contains(&("notes_whoami", Some(who))),
            "no call as {who}: {acted:?}"
        );
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    let mut secrets: Vec<String> = seen.0.lock().unwrap().iter().map(|(_, t, _)| t.clone()).collect();
    secrets.push(query_value(&link, "t"));
    secrets.push(query_value(&alices_wiki, "t"));
    secrets.extend([alice.token.clone(), bob.token.clone()]);
    secrets.extend(alices.saw.iter().chain(&bobs.saw).cloned());
    assert!(secrets.len() > 20, "{}", secrets.len());
    for s in &secrets {
        let probe = &s[s.len().saturating_sub(40)..];
        assert!(!logged.contains(probe), "the log holds a token or link");
        assert!(!trail.contains(probe), "the audit trail holds a token or link");
    }

    // 9. A reload moves the wiki to another URL: alice's token, obtained for the old one, is
    // never sent to the new one; her next call there gets a sign-in link instead.
    let config = audit.parent().unwrap().join("tools.yaml");
    let moved = toolset(&up, &upstream_issuer).replace("/wiki/mcp", "/wiki-moved/mcp");
    std::fs::write(&config, moved).unwrap();
    let mut answer = Value::Null;
    for _ in 0..600 {
        answer = alice
            .rpc("tools/call", json!({"name": "wiki_whoami", "arguments": {}}))
            .await;
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        if text.contains("/oauth/start?t=") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        answer["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("Open this link in your browser")),
        "{answer}"
    );
    let sent_there = seen
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(n, _, _)| n == "wiki-moved")
        .count();
    assert_eq!(sent_there, 0, "a token reached the wiki's new URL");
    drop(server);
}

/// A session of the handshake era opened by `initialize` with URL elicitation declared.
async fn open_session(http: &HttpClient, base: &str, token: &str) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {"elicitation": {"form": {}, "url": {}}},
        "clientInfo": {"name": "eliciting", "version": "1"}}})
    .to_string();
    let req = Request::post(format!("{base}/mcp"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let r = send(http, req).await;
    r.headers()["mcp-session-id"].to_str().unwrap().to_owned()
}

fn query_value(url: &str, name: &str) -> String {
    url.split_once('?')
        .map(|(_, q)| q)
        .unwrap_or_default()
        .split('&')
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .unwrap_or_default()
        .to_owned()
}

fn jwt_claim(token: &str, claim: &str) -> String {
    let payload = token.split('.').nth(1).unwrap();
    let v: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap();
    v[claim].as_str().unwrap().to_owned()
}

/// The file once it holds `want` (the audit writer flushes on its own schedule).
fn wait_for_file(path: &Path, want: &str) -> String {
    let mut text = String::new();
    real_binary::wait_for("the audit record", || {
        text = std::fs::read_to_string(path).unwrap_or_default();
        text.contains(want)
    });
    text
}

/// What the server says when it refuses to start with `args` serving `tools`.
fn refused_start(tools: &str, args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tools.yaml");
    std::fs::write(&config, tools).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quiver-server"))
        .arg(format!("--config=file:{}", config.display()))
        .arg("--listen=127.0.0.1:0")
        .arg("--admin-listen=127.0.0.1:0")
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success(), "started with {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_user_upstream_needs_the_servers_sign_in_and_its_flags_are_checked_at_start() {
    const USER: &str =
        "upstreams:\n  - {name: notes, http: {url: \"http://127.0.0.1:9/mcp\"}, identity: {mode: user}}\n";
    let e = refused_start(USER, &[]);
    assert!(
        e.contains("upstreams[0].identity.mode") && e.contains("needs this server's upstream sign-in"),
        "{e}"
    );
    let auth = [
        "--auth-issuer=http://127.0.0.1:9/realms/q",
        "--auth-audience=quiver",
    ];
    let full = |url: &'static str| {
        let mut a = vec![
            url,
            "--upstream-sign-in-keys=signin.keys",
            "--secrets=env",
            "--upstream-sign-in-client-id=q",
        ];
        a.extend(auth);
        a
    };
    for (args, want) in [
        (
            full("--upstream-sign-in-url=http://mcp.example.com"),
            "must be https",
        ),
        (
            full("--upstream-sign-in-url=https://mcp.example.com/?a=1"),
            "must not have a query",
        ),
        (
            vec!["--upstream-sign-in-url=https://mcp.example.com"],
            "needs --upstream-sign-in-keys",
        ),
        (
            vec![
                "--upstream-sign-in-url=https://mcp.example.com",
                "--upstream-sign-in-keys=s.k",
            ],
            "--upstream-sign-in-keys needs --secrets",
        ),
        (
            vec![
                "--upstream-sign-in-url=https://m.example",
                "--upstream-sign-in-keys=s.k",
                "--secrets=env",
            ],
            "needs --upstream-sign-in-client-id",
        ),
        (
            vec![
                "--upstream-sign-in-url=https://m.example",
                "--upstream-sign-in-keys=s.k",
                "--secrets=env",
                "--upstream-sign-in-client-id=q",
            ],
            "needs --auth-issuer",
        ),
        (vec!["--upstream-sign-in-keys=s.k"], "need --upstream-sign-in-url"),
        (
            [
                full("--upstream-sign-in-url=https://m.example"),
                vec![
                    "--upstream-sign-in-redis=r:6379",
                    "--upstream-sign-in-redis-ca=/ca.pem",
                ],
            ]
            .concat(),
            "need --upstream-sign-in-redis-tls",
        ),
        (
            [
                full("--upstream-sign-in-url=https://m.example"),
                vec!["--upstream-sign-in-max-per-user=0"],
            ]
            .concat(),
            "--upstream-sign-in-max-per-user 1 to 512",
        ),
    ] {
        let e = refused_start("tools: []\n", &args);
        assert!(e.contains(want), "{args:?}: {e}");
    }
}
