//! The flow against an in-test upstream and authorization servers on one loopback port
//! (axum): the upstream's metadata under `/.well-known/...`, servers under `/as` (and `/b`,
//! a second one). The servers check PKCE, the redirect URI, the client and the resource as
//! a real one would, so a flow that skips a step fails here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State as Axum;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use super::authorize::challenge_of;
use super::wire::{form, parse_query};
use super::*;

pub(crate) const CALLBACK: &str = "http://127.0.0.1:9/oauth/callback";

/// What the authorization server remembers of a code it issued.
#[derive(Clone, Debug)]
struct Issued {
    issuer: String,
    client_id: String,
    redirect_uri: String,
    challenge: String,
    resource: String,
    scope: Option<String>,
    /// The OpenID `nonce` of a sign-in asking for an ID token, and who signed in.
    nonce: Option<String>,
    sub: String,
}

#[derive(Default)]
pub(crate) struct Knobs {
    /// GET answers by path: status and body.
    docs: HashMap<String, (u16, String)>,
    /// Paths that never answer.
    hang: Vec<String>,
    /// Registered clients: id and secret.
    pub(crate) clients: HashMap<String, Option<String>>,
    /// The redirect URIs of registered clients.
    redirects: HashMap<String, Value>,
    registrations: usize,
    /// The registration endpoint's answer instead of a registration.
    register_answer: Option<(u16, String)>,
    codes: HashMap<String, Issued>,
    refresh_tokens: HashMap<String, Issued>,
    /// The token endpoint's answer instead of its own.
    pub(crate) token_answer: Option<(u16, String)>,
    /// Whether a refresh issues a new refresh token.
    pub(crate) rotate: bool,
    /// Holds the token endpoint's answers, once made, until the test releases them.
    pub(crate) token_gate: Option<Arc<Gate>>,
    /// Every form POSTed to a token endpoint, and its Authorization header.
    pub(crate) token_requests: Vec<(String, String)>,
    /// The path of each of them.
    pub(crate) token_paths: Vec<String>,
    /// Tokens revoked (RFC 7009): the token and its hint, and the Authorization header.
    pub(crate) revoked: Vec<(String, String, String)>,
    /// The revocation endpoint's answer instead of its own.
    pub(crate) revoke_answer: Option<(u16, String)>,
    issued: usize,
}

/// A gate on the token endpoint: each answer, once made (codes and refresh tokens already
/// spent or issued), adds a permit to `arrived`, then waits for one of `release`.
pub(crate) struct Gate {
    pub(crate) arrived: tokio::sync::Semaphore,
    pub(crate) release: tokio::sync::Semaphore,
}

impl Gate {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            arrived: tokio::sync::Semaphore::new(0),
            release: tokio::sync::Semaphore::new(0),
        })
    }
}

#[derive(Clone)]
pub(crate) struct Fake {
    pub(crate) base: String,
    pub(crate) knobs: Arc<Mutex<Knobs>>,
}

fn json_answer(status: u16, body: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [("content-type", "application/json")], body).into_response()
}

fn oauth_error(error: &str, description: &str) -> Response {
    json_answer(
        400,
        json!({"error": error, "error_description": description}).to_string(),
    )
}

async fn serve(
    Axum(fake): Axum<Fake>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    if fake.knobs.lock().unwrap().hang.contains(&path) {
        std::future::pending::<()>().await;
    }
    let body = String::from_utf8_lossy(&body).into_owned();
    if method == Method::POST && path.ends_with("/register") {
        return fake.register(&body);
    }
    if method == Method::POST && path.ends_with("/revoke") {
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        return fake.revoke(&body, auth);
    }
    if method == Method::POST && path.ends_with("/token") {
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let issuer = format!("{}{}", fake.base, path.trim_end_matches("/token"));
        fake.knobs.lock().unwrap().token_paths.push(path.clone());
        let answer = fake.token(&issuer, &body, &auth);
        let gate = fake.knobs.lock().unwrap().token_gate.clone();
        if let Some(g) = gate {
            g.arrived.add_permits(1);
            if let Ok(p) = g.release.acquire().await {
                p.forget();
            }
        }
        return answer;
    }
    match fake.knobs.lock().unwrap().docs.get(&path) {
        Some((status, text)) => json_answer(*status, text.clone()),
        None => json_answer(404, "{}".into()),
    }
}

impl Fake {
    pub(crate) async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let fake = Fake {
            base,
            knobs: Arc::default(),
        };
        let app = axum::Router::new().fallback(serve).with_state(fake.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let prm = json!({
            "resource": fake.upstream_url(),
            "authorization_servers": [fake.issuer("/as")],
            "scopes_supported": ["notes:read", "notes:write"],
        });
        fake.doc("/.well-known/oauth-protected-resource/mcp", 200, prm);
        fake.doc(
            "/.well-known/oauth-authorization-server/as",
            200,
            fake.meta("/as"),
        );
        fake.doc("/.well-known/oauth-authorization-server/b", 200, fake.meta("/b"));
        fake
    }

    pub(crate) fn upstream_url(&self) -> String {
        format!("{}/mcp", self.base)
    }

    pub(crate) fn issuer(&self, at: &str) -> String {
        format!("{}{at}", self.base)
    }

    /// The metadata of the server at `at`, as a well-behaved one states it.
    pub(crate) fn meta(&self, at: &str) -> Value {
        let i = self.issuer(at);
        json!({
            "issuer": i,
            "authorization_endpoint": format!("{i}/authorize"),
            "token_endpoint": format!("{i}/token"),
            "registration_endpoint": format!("{i}/register"),
            "revocation_endpoint": format!("{i}/revoke"),
            "code_challenge_methods_supported": ["S256"],
            "response_types_supported": ["code"],
            "authorization_response_iss_parameter_supported": true,
        })
    }

    pub(crate) fn doc(&self, path: &str, status: u16, body: impl ToString) {
        self.knobs
            .lock()
            .unwrap()
            .docs
            .insert(path.to_owned(), (status, body.to_string()));
    }

    pub(crate) fn set(&self, f: impl FnOnce(&mut Knobs)) {
        f(&mut self.knobs.lock().unwrap());
    }

    pub(crate) fn registrations(&self) -> usize {
        self.knobs.lock().unwrap().registrations
    }

    pub(crate) fn token_requests(&self) -> Vec<(String, String)> {
        self.knobs.lock().unwrap().token_requests.clone()
    }

    fn register(&self, body: &str) -> Response {
        let mut k = self.knobs.lock().unwrap();
        k.registrations += 1;
        if let Some((status, text)) = k.register_answer.clone() {
            return json_answer(status, text);
        }
        let asked: Value = serde_json::from_str(body).unwrap_or_default();
        if asked["token_endpoint_auth_method"] != "none" || asked["grant_types"][0] != "authorization_code" {
            return oauth_error("invalid_client_metadata", "want a public client using codes");
        }
        let id = format!("client-{}", k.registrations);
        k.clients.insert(id.clone(), None);
        k.redirects.insert(id.clone(), asked["redirect_uris"].clone());
        json_answer(
            201,
            json!({"client_id": id, "redirect_uris": asked["redirect_uris"], "token_endpoint_auth_method": "none"})
                .to_string(),
        )
    }

    /// The user signs in: the server reads the authorization request at `url` as a real one
    /// would, issues a code, and returns the query of its redirect back.
    pub(crate) fn login(&self, url: &str) -> String {
        self.login_as(url, "alice")
    }

    /// [`Fake::login`] as the user `sub`: a request with `nonce` gets an ID token
    /// `SUB.NONCE` with its code (tests verify it with a fake verifier).
    pub(crate) fn login_as(&self, url: &str, sub: &str) -> String {
        let (endpoint, query) = url.split_once('?').unwrap();
        let p: HashMap<String, String> = parse_query(query).unwrap().into_iter().collect();
        assert_eq!(p["response_type"], "code");
        assert_eq!(p["code_challenge_method"], "S256");
        let issuer = endpoint.trim_end_matches("/authorize").to_owned();
        let mut k = self.knobs.lock().unwrap();
        if let Some(registered) = k.redirects.get(&p["client_id"]) {
            assert!(registered.as_array().unwrap().contains(&json!(p["redirect_uri"])));
        }
        k.issued += 1;
        let code = format!("code-{}", k.issued);
        let issued = Issued {
            issuer: issuer.clone(),
            client_id: p["client_id"].clone(),
            redirect_uri: p["redirect_uri"].clone(),
            challenge: p["code_challenge"].clone(),
            resource: p.get("resource").cloned().unwrap_or_default(),
            scope: p.get("scope").cloned(),
            nonce: p.get("nonce").cloned(),
            sub: sub.to_owned(),
        };
        k.codes.insert(code.clone(), issued);
        form(&[("code", &code), ("state", &p["state"]), ("iss", &issuer)])
    }

    /// RFC 7009: the client authenticated as at the token endpoint; a refresh token revoked
    /// no longer refreshes.
    fn revoke(&self, body: &str, auth: String) -> Response {
        let mut k = self.knobs.lock().unwrap();
        if let Some((status, text)) = k.revoke_answer.clone() {
            return json_answer(status, text);
        }
        let p: HashMap<String, String> = parse_query(body).unwrap_or_default().into_iter().collect();
        let client_id = match auth.strip_prefix("Basic ") {
            Some(b) => String::from_utf8(STANDARD.decode(b).unwrap_or_default())
                .unwrap_or_default()
                .split(':')
                .next()
                .unwrap_or_default()
                .to_owned(),
            None => p.get("client_id").cloned().unwrap_or_default(),
        };
        if !k.clients.contains_key(&client_id) {
            return json_answer(401, json!({"error": "invalid_client"}).to_string());
        }
        let token = p.get("token").cloned().unwrap_or_default();
        k.refresh_tokens.remove(&token);
        let hint = p.get("token_type_hint").cloned().unwrap_or_default();
        k.revoked.push((token, hint, auth));
        json_answer(200, String::new())
    }

    fn token(&self, issuer: &str, body: &str, auth: &str) -> Response {
        let mut k = self.knobs.lock().unwrap();
        k.token_requests.push((body.to_owned(), auth.to_owned()));
        if let Some((status, text)) = k.token_answer.clone() {
            return json_answer(status, text);
        }
        let p: HashMap<String, String> = parse_query(body).unwrap_or_default().into_iter().collect();
        let (client_id, secret) = match auth.strip_prefix("Basic ") {
            Some(b) => {
                let pair = String::from_utf8(STANDARD.decode(b).unwrap_or_default()).unwrap_or_default();
                let (id, s) = pair.split_once(':').unwrap_or_default();
                (id.to_owned(), Some(s.to_owned()))
            }
            None => (
                p.get("client_id").cloned().unwrap_or_default(),
                p.get("client_secret").cloned(),
            ),
        };
        match k.clients.get(&client_id) {
            Some(want) if *want == secret || want.is_none() => {}
            _ => return json_answer(401, json!({"error": "invalid_client"}).to_string()),
        }
        let issued = match p.get("grant_type").map(String::as_str) {
            Some("authorization_code") => {
                let Some(i) = k.codes.remove(p.get("code").map_or("", String::as_str)) else {
                    return oauth_error("invalid_grant", "unknown or used code");
                };
                let verifier = p.get("code_verifier").map_or("", String::as_str);
                if i.issuer != issuer
                    || i.client_id != client_id
                    || Some(&i.redirect_uri) != p.get("redirect_uri")
                    || i.resource != p.get("resource").cloned().unwrap_or_default()
                    || !(43..=128).contains(&verifier.len())
                    || challenge_of(verifier) != i.challenge
                {
                    return oauth_error("invalid_grant", "the code was not issued for this request");
                }
                i
            }
            Some("refresh_token") => {
                let rt = p.get("refresh_token").map_or("", String::as_str);
                match k.refresh_tokens.get(rt).cloned() {
                    Some(i) if i.client_id == client_id && i.issuer == issuer => {
                        if k.rotate {
                            k.refresh_tokens.remove(rt);
                        }
                        i
                    }
                    _ => return oauth_error("invalid_grant", "unknown refresh token"),
                }
            }
            _ => return oauth_error("unsupported_grant_type", "no"),
        };
        k.issued += 1;
        let n = k.issued;
        let mut answer = json!({
            "access_token": format!("at-{n}"), "token_type": "bearer", "expires_in": 300,
            "scope": issued.scope,
        });
        if let Some(nonce) = &issued.nonce {
            answer["id_token"] = json!(format!("{}.{nonce}", issued.sub));
        }
        if p["grant_type"] == "authorization_code" || k.rotate {
            answer["refresh_token"] = json!(format!("rt-{n}"));
            k.refresh_tokens.insert(format!("rt-{n}"), issued);
        }
        json_answer(200, answer.to_string())
    }
}

pub(crate) fn keys(byte: u8) -> Arc<KeyRing> {
    Arc::new(KeyRing::parse(&format!("k{byte}:{}", STANDARD.encode([byte; 32]))).unwrap())
}

pub(crate) fn config() -> FlowConfig {
    let mut cfg = FlowConfig::new(CALLBACK);
    // The servers of these tests are on this host.
    cfg.guard_discovered = false;
    cfg.timeout = Duration::from_secs(2);
    cfg
}

pub(crate) fn flow_with(cfg: FlowConfig) -> Flow {
    Flow::new(cfg, HttpClient::new(), keys(1)).unwrap()
}

pub(crate) fn upstream(fake: &Fake) -> Upstream {
    Upstream {
        name: "notes".into(),
        url: fake.upstream_url(),
        issuer: None,
        client: None,
        scope: None,
    }
}

pub(crate) const ALICE: &str = "https://idp.example|alice";
/// The browser binding the tests' sign-ins begin and finish with.
pub(crate) const BH: &str = "browser-of-alice";

/// Begins a sign-in for alice and has the user sign in: the redirect's query.
pub(crate) async fn signed_in(flow: &Flow, fake: &Fake, up: &Upstream) -> String {
    let auth = flow.begin(ALICE, up, None, BH).await.unwrap();
    fake.login(&auth.url)
}

#[tokio::test]
async fn a_sign_in_discovers_registers_exchanges_the_code_and_refreshes() {
    let fake = Fake::start().await;
    let flow = flow_with(config());
    let up = upstream(&fake);
    let auth = flow.begin(ALICE, &up, None, BH).await.unwrap();
    assert_eq!(auth.issuer, fake.issuer("/as"));
    assert_eq!(auth.client_id, "client-1");
    let (endpoint, query) = auth.url.split_once('?').unwrap();
    assert_eq!(endpoint, format!("{}/authorize", fake.issuer("/as")));
    let p: HashMap<String, String> = parse_query(query).unwrap().into_iter().collect();
    assert_eq!(p["redirect_uri"], CALLBACK);
    assert_eq!(p["resource"], fake.upstream_url());
    assert_eq!(p["scope"], "notes:read notes:write");
    assert_eq!(p["code_challenge"].len(), 43);
    // The state is sealed: nothing of the caller or the verifier shows.
    assert!(!p["state"].contains("alice") && p["state"].starts_with("v1.k1."));

    let redirect = fake.login(&auth.url);
    let guard = MemoryGuard::default();
    let done = flow.finish(&redirect, &guard, &[BH]).await.unwrap();
    assert_eq!((done.subject.as_str(), done.upstream.as_str()), (ALICE, "notes"));
    let t = &done.tokens;
    assert_eq!(t.access_token, "at-2");
    assert_eq!(t.refresh_token.as_deref(), Some("rt-2"));
    assert_eq!(t.scope.as_deref(), Some("notes:read notes:write"));
    assert_eq!(t.issuer, fake.issuer("/as"));
    assert_eq!(t.token_endpoint, format!("{}/token", fake.issuer("/as")));
    assert_eq!(t.client_id, "client-1");
    assert!(t.expires_at.is_some_and(|e| e > std::time::SystemTime::now()));
    let shown = format!("{t:?}");
    assert!(!shown.contains("at-2") && !shown.contains("rt-2"), "{shown}");
    // The verifier went to the token endpoint: 43 characters of base64url.
    let (sent, _) = &fake.token_requests()[0];
    let sent: HashMap<String, String> = parse_query(sent).unwrap().into_iter().collect();
    assert_eq!(sent["code_verifier"].len(), 43);
    assert_eq!(sent["client_id"], "client-1");

    // A refresh without a new refresh token keeps the old one (RFC 6749 section 6).
    let renewed = flow.refresh(t, &up).await.unwrap();
    assert_eq!(renewed.access_token, "at-3");
    assert_eq!(renewed.refresh_token.as_deref(), Some("rt-2"));
    assert_eq!(renewed.scope, t.scope);
    // A rotating server's new one replaces it, and the old one no longer works.
    fake.set(|k| k.rotate = true);
    let rotated = flow.refresh(&renewed, &up).await.unwrap();
    assert_eq!(rotated.refresh_token.as_deref(), Some("rt-4"));
    let stale = flow.refresh(&renewed, &up).await.unwrap_err();
    assert!(
        matches!(&stale, Error::InvalidGrant(d) if d.starts_with("invalid_grant")),
        "{stale}"
    );
    // One registration for the server, reused by the next sign-in.
    flow.begin("https://idp.example|bob", &up, None, BH)
        .await
        .unwrap();
    assert_eq!(fake.registrations(), 1);
}

/// The error of `discover`, shown.
async fn discovery_error(flow: &Flow, up: &Upstream) -> Error {
    flow.discover(up, None).await.unwrap_err()
}

#[tokio::test]
async fn discovery_follows_the_challenge_then_the_well_known_urls_in_the_specified_order() {
    let fake = Fake::start().await;
    let mut up = upstream(&fake);
    // The challenge's metadata URL and scope come first.
    fake.doc(
        "/meta/notes",
        200,
        json!({"resource": up.url, "authorization_servers": [fake.issuer("/b")]}),
    );
    let challenge = format!(
        r#"Bearer error="invalid_token", resource_metadata="{}/meta/notes", scope="notes:admin""#,
        fake.base
    );
    let found = flow_with(config()).discover(&up, Some(&challenge)).await.unwrap();
    assert_eq!(found.server.issuer, fake.issuer("/b"));
    assert_eq!(found.scope.as_deref(), Some("notes:admin"));
    // The configured scope comes before both.
    up.scope = Some("notes:read".into());
    let found = flow_with(config()).discover(&up, Some(&challenge)).await.unwrap();
    assert_eq!(found.scope.as_deref(), Some("notes:read"));
    up.scope = None;

    // Without a challenge: the path-inserted URL, else the root one; a server whose
    // identifier has a path: RFC 8414's URL, else OpenID discovery inserted, else appended.
    fake.doc("/.well-known/oauth-protected-resource/mcp", 404, "{}");
    fake.doc(
        "/.well-known/oauth-protected-resource",
        200,
        json!({"resource": up.url, "authorization_servers": [fake.issuer("/c")]}),
    );
    fake.doc("/c/.well-known/openid-configuration", 200, fake.meta("/c"));
    let found = flow_with(config()).discover(&up, None).await.unwrap();
    assert_eq!(found.server.issuer, fake.issuer("/c"));
    assert_eq!(found.scope, None);
    fake.doc(
        "/.well-known/openid-configuration/c",
        200,
        json!({"issuer": "elsewhere"}),
    );
    let e = discovery_error(&flow_with(config()), &up).await;
    assert!(
        matches!(&e, Error::Discovery(m) if m.contains("another issuer")),
        "{e}"
    );

    // Nothing anywhere: every URL tried is named.
    fake.doc("/.well-known/oauth-protected-resource", 404, "{}");
    let e = discovery_error(&flow_with(config()), &up).await.to_string();
    assert!(
        e.contains("/.well-known/oauth-protected-resource/mcp answered 404"),
        "{e}"
    );
    assert!(
        e.contains("/.well-known/oauth-protected-resource answered 404"),
        "{e}"
    );
}

#[tokio::test]
async fn metadata_that_does_not_match_what_it_claims_to_be_is_refused() {
    let fake = Fake::start().await;
    let up = upstream(&fake);
    let prm = "/.well-known/oauth-protected-resource/mcp";
    let meta = "/.well-known/oauth-authorization-server/as";
    let good_prm = json!({"resource": up.url, "authorization_servers": [fake.issuer("/as")]});
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            prm,
            json!({"resource": "http://127.0.0.1:1/other", "authorization_servers": [fake.issuer("/as")]}),
            "RFC 9728",
        ),
        (
            prm,
            json!({"authorization_servers": [fake.issuer("/as")]}),
            "no `resource`",
        ),
        (
            prm,
            json!({"resource": up.url, "authorization_servers": []}),
            "authorization_servers",
        ),
        (
            prm,
            json!({"resource": up.url, "authorization_servers": ["not a url", 7, "ftp://x/y"]}),
            "authorization_servers",
        ),
        (prm, json!([1, 2]), "not a JSON object"),
        (meta, json!({"issuer": fake.issuer("/b")}), "RFC 8414"),
        (
            meta,
            {
                let mut m = fake.meta("/as");
                m.as_object_mut()
                    .unwrap()
                    .remove("code_challenge_methods_supported");
                m
            },
            "S256",
        ),
        (
            meta,
            {
                let mut m = fake.meta("/as");
                m["code_challenge_methods_supported"] = json!(["plain"]);
                m
            },
            "S256",
        ),
        (
            meta,
            {
                let mut m = fake.meta("/as");
                m["response_types_supported"] = json!(["token"]);
                m
            },
            "`code`",
        ),
        (
            meta,
            {
                let mut m = fake.meta("/as");
                m["token_endpoint"] = json!("javascript:alert(1)");
                m
            },
            "token_endpoint",
        ),
        (
            meta,
            {
                let mut m = fake.meta("/as");
                m.as_object_mut().unwrap().remove("authorization_endpoint");
                m
            },
            "authorization_endpoint",
        ),
    ];
    for (path, doc, want) in cases {
        fake.doc(prm, 200, &good_prm);
        fake.doc(meta, 200, fake.meta("/as"));
        fake.doc(path, 200, &doc);
        let e = discovery_error(&flow_with(config()), &up).await;
        assert!(matches!(e, Error::Discovery(_)), "{doc}: {e}");
        assert!(e.to_string().contains(want), "{doc}: {e}");
    }
    // Not JSON, larger than the bound, or no answer in time.
    fake.doc(meta, 200, fake.meta("/as"));
    fake.doc(prm, 200, "{not json");
    let e = discovery_error(&flow_with(config()), &up).await;
    assert!(e.to_string().contains("not a JSON object"), "{e}");
    let padded = json!({"resource": up.url, "authorization_servers": [fake.issuer("/as")], "pad": "x".repeat(MAX_ANSWER_BYTES)});
    fake.doc(prm, 200, padded);
    let e = discovery_error(&flow_with(config()), &up).await;
    assert!(
        e.to_string()
            .contains(&format!("larger than {MAX_ANSWER_BYTES} bytes")),
        "{e}"
    );
    fake.doc(prm, 200, &good_prm);
    fake.set(|k| k.hang.push(meta.into()));
    let mut cfg = config();
    cfg.timeout = Duration::from_millis(300);
    let e = discovery_error(&flow_with(cfg), &up).await;
    assert!(e.to_string().contains("did not answer within"), "{e}");
}

#[test]
fn endpoints_of_an_https_server_must_be_https() {
    let issuer = "https://as.example/t";
    let iu = wire::parse_url(issuer).unwrap();
    let doc = |token: &str| {
        json!({
            "issuer": issuer, "authorization_endpoint": "https://as.example/t/authorize",
            "token_endpoint": token, "code_challenge_methods_supported": ["S256"],
            "registration_endpoint": "http://as.example/t/register",
        })
        .to_string()
    };
    let e =
        discovery::read_server(doc("http://as.example/t/token").as_bytes(), "m", issuer, &iu).unwrap_err();
    assert!(e.to_string().contains("token_endpoint"), "{e}");
    let m = discovery::read_server(doc("https://as.example/t/token").as_bytes(), "m", issuer, &iu).unwrap();
    // A plain-http registration endpoint of an https server is not used.
    assert_eq!(m.registration_endpoint, None);
    // An https upstream naming an http authorization server: refused before any request.
    let up = wire::parse_url("https://r.example/mcp").unwrap();
    let prm = json!({"resource": "https://r.example/mcp", "authorization_servers": ["http://as.example"]});
    let rm = discovery::read_resource(prm.to_string().as_bytes(), "p", &up).unwrap();
    assert_eq!(rm.authorization_servers, ["http://as.example"]);
}

#[tokio::test]
async fn the_configured_server_is_used_or_the_first_that_answers_well() {
    let fake = Fake::start().await;
    let mut up = upstream(&fake);
    fake.doc(
        "/.well-known/oauth-protected-resource/mcp",
        200,
        json!({"resource": up.url, "authorization_servers": [fake.issuer("/gone"), fake.issuer("/as"), fake.issuer("/b")]}),
    );
    let found = flow_with(config()).discover(&up, None).await.unwrap();
    assert_eq!(found.server.issuer, fake.issuer("/as"));
    up.issuer = Some(fake.issuer("/b"));
    let found = flow_with(config()).discover(&up, None).await.unwrap();
    assert_eq!(found.server.issuer, fake.issuer("/b"));
    up.issuer = Some(fake.issuer("/elsewhere"));
    let e = discovery_error(&flow_with(config()), &up).await;
    assert!(
        e.to_string()
            .contains("does not name the configured authorization server"),
        "{e}"
    );
}

#[tokio::test]
async fn servers_a_document_chose_on_this_host_are_not_called_when_guarded() {
    let fake = Fake::start().await;
    let up = upstream(&fake);
    // The upstream (configured) is called on 127.0.0.1; the server its metadata names, on
    // `localhost`, is another origin that a document chose.
    let port = fake.base.rsplit(':').next().unwrap();
    let elsewhere = format!("http://localhost:{port}/as");
    fake.doc(
        "/.well-known/oauth-protected-resource/mcp",
        200,
        json!({"resource": up.url, "authorization_servers": [elsewhere]}),
    );
    let mut cfg = config();
    cfg.guard_discovered = true;
    let e = discovery_error(&flow_with(cfg), &up).await.to_string();
    assert!(e.contains("addresses it may not choose"), "{e}");
}

#[tokio::test]
async fn metadata_is_reused_until_its_time_to_live_ends() {
    let fake = Fake::start().await;
    let up = upstream(&fake);
    let cached = flow_with(config());
    let mut cfg = config();
    cfg.metadata_ttl = Duration::ZERO;
    let uncached = flow_with(cfg);
    cached.discover(&up, None).await.unwrap();
    uncached.discover(&up, None).await.unwrap();
    fake.doc("/.well-known/oauth-authorization-server/as", 500, "{}");
    cached.discover(&up, None).await.unwrap();
    assert!(uncached.discover(&up, None).await.is_err());
    // The caches are bounded: full, the entry nearest its end goes.
    let c: cache::Cache<u8> = cache::Cache::new(2, Duration::from_secs(60));
    for (i, k) in ["a", "b", "c"].into_iter().enumerate() {
        c.put(k.into(), i as u8);
    }
    assert_eq!((c.len(), c.get("a"), c.get("c")), (2, None, Some(2)));
    let forever: cache::Cache<u8> = cache::Cache::new(1, Duration::MAX);
    forever.put("k".into(), 1);
    assert_eq!(forever.get("k"), Some(1));
}

#[tokio::test]
async fn a_configured_client_comes_first_then_a_metadata_document_then_registration() {
    let fake = Fake::start().await;
    let mut up = upstream(&fake);
    up.issuer = Some(fake.issuer("/as"));
    up.client = Some(PreRegistered {
        client_id: "pre".into(),
        client_secret: Some("pre-secret-1234".into()),
    });
    fake.set(|k| {
        k.clients.insert("pre".into(), Some("pre-secret-1234".into()));
    });
    assert!(!format!("{:?}", up.client).contains("pre-secret"));
    let flow = flow_with(config());
    let redirect = signed_in(&flow, &fake, &up).await;
    let done = flow
        .finish(&redirect, &MemoryGuard::default(), &[BH])
        .await
        .unwrap();
    assert_eq!(done.tokens.client_id, "pre");
    let (body, auth) = fake.token_requests().pop().unwrap();
    assert_eq!(auth, format!("Basic {}", STANDARD.encode("pre:pre-secret-1234")));
    assert!(!body.contains("pre-secret"));
    // A server that takes the secret only in the body gets it there.
    let mut m = fake.meta("/as");
    m["token_endpoint_auth_methods_supported"] = json!(["client_secret_post"]);
    fake.doc("/.well-known/oauth-authorization-server/as", 200, &m);
    let flow = flow_with(config());
    let redirect = signed_in(&flow, &fake, &up).await;
    flow.finish(&redirect, &MemoryGuard::default(), &[BH])
        .await
        .unwrap();
    let (body, auth) = fake.token_requests().pop().unwrap();
    assert!(
        auth.is_empty() && body.contains("client_secret=pre-secret-1234"),
        "{body}"
    );
    assert_eq!(fake.registrations(), 0);

    // A metadata document when the server takes them and Quiver serves one.
    up.client = None;
    m["client_id_metadata_document_supported"] = json!(true);
    fake.doc("/.well-known/oauth-authorization-server/as", 200, &m);
    let mut cfg = config();
    cfg.client_metadata_url = Some("https://quiver.example/oauth/client".into());
    let auth = flow_with(cfg.clone()).begin(ALICE, &up, None, BH).await.unwrap();
    assert_eq!(auth.client_id, "https://quiver.example/oauth/client");
    assert_eq!(fake.registrations(), 0);
    let doc = client_metadata_document(&cfg).unwrap();
    assert_eq!(doc["client_id"], "https://quiver.example/oauth/client");
    assert_eq!(doc["redirect_uris"], json!([CALLBACK]));
    assert_eq!(doc["token_endpoint_auth_method"], "none");
    assert_eq!(doc["grant_types"], json!(["authorization_code", "refresh_token"]));
    assert_eq!(doc["response_types"], json!(["code"]));
    assert_eq!(doc["client_name"], "Quiver");
    assert_eq!(client_metadata_document(&config()), None);
    // Without a document of Quiver's own: registration.
    let auth = flow_with(config()).begin(ALICE, &up, None, BH).await.unwrap();
    assert_eq!((auth.client_id.as_str(), fake.registrations()), ("client-1", 1));
}

#[tokio::test]
async fn registration_answers_that_cannot_be_used_are_refused() {
    let fake = Fake::start().await;
    let up = upstream(&fake);
    for (status, answer, want) in [
        (
            400,
            json!({"error": "invalid_redirect_uri", "error_description": "no\u{7}pe"}),
            "invalid_redirect_uri: no pe",
        ),
        (201, json!({"client_secret": "s"}), "no usable `client_id`"),
        (201, json!({"client_id": "has space"}), "no usable `client_id`"),
        (
            201,
            json!({"client_id": "c", "redirect_uris": ["https://evil.example/cb"]}),
            "callback URL",
        ),
        (
            201,
            json!({"client_id": "c", "token_endpoint_auth_method": "private_key_jwt"}),
            "authentication method",
        ),
        (
            201,
            json!({"client_id": "c", "token_endpoint_auth_method": "client_secret_basic"}),
            "no `client_secret`",
        ),
        (
            201,
            json!({"client_id": "c", "client_secret": "s", "client_secret_expires_at": 1}),
            "expired",
        ),
        (201, json!("c"), "not a JSON object"),
    ] {
        fake.set(|k| k.register_answer = Some((status, answer.to_string())));
        let e = flow_with(config()).begin(ALICE, &up, None, BH).await.unwrap_err();
        assert!(matches!(e, Error::Registration(_)), "{answer}: {e}");
        assert!(e.to_string().contains(want), "{answer}: {e}");
    }
    // A confidential registration is kept with its secret, for refreshing.
    fake.set(|k| {
        k.register_answer = Some((
            201,
            json!({"client_id": "conf", "client_secret": "conf-secret-99"}).to_string(),
        ));
        k.clients.insert("conf".into(), Some("conf-secret-99".into()));
    });
    let flow = flow_with(config());
    let redirect = signed_in(&flow, &fake, &up).await;
    let done = flow
        .finish(&redirect, &MemoryGuard::default(), &[BH])
        .await
        .unwrap();
    assert_eq!(
        flow.registered(&done.tokens.issuer).unwrap().auth,
        AuthMethod::Basic
    );
    assert!(!format!("{:?}", flow.registered(&done.tokens.issuer)).contains("conf-secret"));
    flow.refresh(&done.tokens, &up).await.unwrap();
    // The registration is kept with the tokens (sealed in the vault), so that another
    // replica, which never registered, refreshes as that client too.
    assert_eq!(done.tokens.client_secret.as_deref(), Some("conf-secret-99"));
    assert!(!format!("{:?}", done.tokens).contains("conf-secret"));
    let other_replica = flow_with(config());
    assert_eq!(other_replica.registered(&done.tokens.issuer), None);
    let renewed = other_replica.refresh(&done.tokens, &up).await.unwrap();
    let (_, auth) = fake.token_requests().pop().unwrap();
    assert_eq!(auth, format!("Basic {}", STANDARD.encode("conf:conf-secret-99")));
    assert_eq!(renewed.client_secret.as_deref(), None, "completed by the vault");
    // No registration endpoint and no client configured.
    let mut m = fake.meta("/as");
    m.as_object_mut().unwrap().remove("registration_endpoint");
    fake.doc("/.well-known/oauth-authorization-server/as", 200, m);
    let e = flow_with(config()).begin(ALICE, &up, None, BH).await.unwrap_err();
    assert!(e.to_string().contains("configure a client"), "{e}");
}

#[test]
fn a_callback_url_that_could_leak_codes_is_refused_at_start() {
    for bad in [
        "http://quiver.example/oauth/callback",
        "https://quiver.example/oauth/callback#x",
        "/oauth/callback",
        "https://user@quiver.example/cb",
    ] {
        let e = Flow::new(FlowConfig::new(bad), HttpClient::new(), keys(1)).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{bad}: {e}");
    }
    Flow::new(
        FlowConfig::new("https://quiver.example/oauth/callback"),
        HttpClient::new(),
        keys(1),
    )
    .unwrap();
    let mut cfg = FlowConfig::new("https://quiver.example/oauth/callback");
    cfg.client_metadata_url = Some("http://quiver.example/client".into());
    assert!(Flow::new(cfg, HttpClient::new(), keys(1)).is_err());
}

/// A client registered at `/as` beforehand, with its secret.
fn pre_registered_at_as(fake: &Fake) -> Upstream {
    fake.set(|k| {
        k.clients.insert("pre".into(), Some("pre-secret-1234".into()));
    });
    let mut up = upstream(fake);
    up.issuer = Some(fake.issuer("/as"));
    up.client = Some(PreRegistered {
        client_id: "pre".into(),
        client_secret: Some("pre-secret-1234".into()),
    });
    up
}

#[tokio::test]
async fn a_configured_client_goes_only_to_the_server_issuer_names() {
    let fake = Fake::start().await;
    // A hostile upstream names its own server `/b`, which sends users to `/as`'s sign-in page
    // (so the user sees the real provider) and would collect the code and the secret.
    let mut evil = fake.meta("/b");
    evil["authorization_endpoint"] = json!(format!("{}/authorize", fake.issuer("/as")));
    fake.doc("/.well-known/oauth-authorization-server/b", 200, &evil);
    fake.doc(
        "/.well-known/oauth-protected-resource/mcp",
        200,
        json!({"resource": fake.upstream_url(), "authorization_servers": [fake.issuer("/b")]}),
    );
    let mut up = pre_registered_at_as(&fake);
    // With `issuer`: the upstream's choice is refused before anything is sent.
    let e = flow_with(config()).begin(ALICE, &up, None, BH).await.unwrap_err();
    assert!(matches!(e, Error::Discovery(_)), "{e}");
    // Without (a configuration the model refuses): the flow refuses the client there too.
    up.issuer = None;
    let e = flow_with(config()).begin(ALICE, &up, None, BH).await.unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("only at the authorization server `issuer` names")),
        "{e}"
    );
    let found = flow_with(config()).discover(&up, None).await.unwrap();
    assert_eq!(found.server.issuer, fake.issuer("/b"));
    assert!(flow_with(config()).client(&up, &found.server).await.is_err());
    assert!(fake.token_requests().is_empty() && fake.registrations() == 0);
}

#[tokio::test]
async fn a_configured_client_refreshes_only_at_its_servers_token_endpoint() {
    let fake = Fake::start().await;
    let up = pre_registered_at_as(&fake);
    let flow = flow_with(config());
    let redirect = signed_in(&flow, &fake, &up).await;
    let done = flow
        .finish(&redirect, &MemoryGuard::default(), &[BH])
        .await
        .unwrap();
    // The stored token endpoint is not where the refresh goes: the server's metadata says.
    let mut moved = done.tokens.clone();
    moved.token_endpoint = format!("{}/token", fake.issuer("/b"));
    flow.refresh(&moved, &up).await.unwrap();
    assert_eq!(
        fake.knobs.lock().unwrap().token_paths.last().map(String::as_str),
        Some("/as/token")
    );
    // Tokens of another server than `issuer` names: nothing is sent.
    let before = fake.token_requests().len();
    let mut other = done.tokens.clone();
    other.issuer = fake.issuer("/b");
    other.token_endpoint = format!("{}/token", fake.issuer("/b"));
    let e = flow.refresh(&other, &up).await.unwrap_err();
    assert!(matches!(e, Error::Issuer(_)), "{e}");
    let e = flow.revoke(&other, &up).await.unwrap_err();
    assert!(matches!(e, Error::Issuer(_)), "{e}");
    assert!(fake.knobs.lock().unwrap().revoked.is_empty());
    let mut unpinned = up.clone();
    unpinned.issuer = None;
    let e = flow.refresh(&done.tokens, &unpinned).await.unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e}");
    assert_eq!(fake.token_requests().len(), before);
    // Revoked at its server, as that client.
    assert!(flow.revoke(&done.tokens, &up).await.unwrap());
    let revoked = fake.knobs.lock().unwrap().revoked.clone();
    let basic = format!("Basic {}", STANDARD.encode("pre:pre-secret-1234"));
    assert_eq!(revoked.len(), 2);
    assert!(revoked.iter().all(|(_, _, auth)| *auth == basic), "{revoked:?}");
}

const PRM: &str = "/.well-known/oauth-protected-resource/mcp";

fn guarded() -> FlowConfig {
    let mut cfg = config();
    cfg.guard_discovered = true;
    cfg
}

#[tokio::test]
async fn servers_metadata_names_at_addresses_of_this_host_private_or_link_local_are_refused() {
    let fake = Fake::start().await;
    let up = upstream(&fake);
    // Literal addresses: the connector does not resolve them, so they are checked as such.
    for host in [
        "169.254.169.254",
        "127.0.0.1:1",
        "[::1]",
        "10.1.2.3",
        "172.16.0.9",
        "192.168.0.10",
        "100.64.0.1",
        "[fe80::1]",
        "[fd00::5]",
        "[::ffff:169.254.169.254]",
        "[::ffff:10.0.0.1]",
        "100.100.100.200",
        "0.0.0.0",
        "198.18.0.1",
        "240.0.0.1",
        "192.0.0.8",
        "[64:ff9b:1::a00:1]",
    ] {
        let issuer = format!("http://{host}/as");
        fake.doc(
            PRM,
            200,
            json!({"resource": up.url, "authorization_servers": [issuer]}),
        );
        let e = flow_with(guarded()).discover(&up, None).await.unwrap_err();
        assert!(matches!(e, Error::Discovery(_)), "{host}: {e}");
        let e = e.to_string();
        assert!(
            e.contains("a server an upstream's metadata chose is not called there")
                && e.contains(&format!("http://{host}/")),
            "{host}: {e}"
        );
    }
    // The endpoints a server's metadata names: registration, and the token endpoint.
    fake.doc(
        PRM,
        200,
        json!({"resource": up.url, "authorization_servers": [fake.issuer("/as")]}),
    );
    let mut m = fake.meta("/as");
    m["registration_endpoint"] = json!("http://10.0.0.1/register");
    m["token_endpoint"] = json!("http://169.254.169.254/latest/token");
    fake.doc("/.well-known/oauth-authorization-server/as", 200, &m);
    let e = flow_with(guarded())
        .begin(ALICE, &up, None, BH)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("10.0.0.1/register is a private address"),
        "{e}"
    );
    let pre = pre_registered_at_as(&fake);
    let flow = flow_with(guarded());
    let redirect = signed_in(&flow, &fake, &pre).await;
    let e = flow
        .finish(&redirect, &MemoryGuard::default(), &[BH])
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("169.254.169.254/latest/token is a link-local address"),
        "{e}"
    );
    assert!(fake.token_requests().is_empty() && fake.registrations() == 0);
}

#[tokio::test]
async fn servers_metadata_names_in_a_network_the_server_denies_are_refused() {
    let fake = Fake::start().await;
    let up = upstream(&fake);
    fake.doc(
        PRM,
        200,
        json!({"resource": up.url, "authorization_servers": ["http://11.1.2.3:8443/as"]}),
    );
    let http = HttpClient::new().deny_third_parties(vec!["11.0.0.0/8".parse().unwrap()]);
    let flow = Flow::new(guarded(), http, keys(1)).unwrap();
    let e = flow.discover(&up, None).await.unwrap_err();
    assert!(matches!(e, Error::Discovery(_)), "{e}");
    assert!(
        e.to_string()
            .contains("http://11.1.2.3:8443/.well-known/oauth-authorization-server/as is in a network this server denies"),
        "{e}"
    );
}

#[tokio::test]
async fn a_local_server_is_called_when_the_configuration_names_it() {
    let fake = Fake::start().await;
    let mut up = upstream(&fake);
    // `localhost` is another origin than the upstream's 127.0.0.1: a name of this host.
    let port = fake.base.rsplit(':').next().unwrap();
    let local = format!("http://localhost:{port}/local");
    let mut m = fake.meta("/local");
    for v in m.as_object_mut().unwrap().values_mut() {
        if let Some(s) = v.as_str() {
            *v = json!(s.replace("127.0.0.1", "localhost"));
        }
    }
    assert_eq!(m["issuer"], local);
    fake.doc("/.well-known/oauth-authorization-server/local", 200, &m);
    fake.doc(
        PRM,
        200,
        json!({"resource": up.url, "authorization_servers": [local]}),
    );
    let e = flow_with(guarded()).discover(&up, None).await.unwrap_err();
    assert!(e.to_string().contains("addresses it may not choose"), "{e}");
    up.issuer = Some(local.clone());
    let found = flow_with(guarded()).discover(&up, None).await.unwrap();
    assert_eq!(found.server.issuer, local);
}
