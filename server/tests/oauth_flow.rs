//! A user's sign-in to an upstream through Quiver's OAuth flow, against a real authorization
//! server: Keycloak's realm `upstream` (scripts/idp.sh, scripts/idp/upstream-realm.json). A
//! stand-in upstream on a loopback port answers `401` with a `Bearer` challenge naming its
//! protected resource metadata, which names the realm. The flow discovers the realm,
//! registers itself there (RFC 7591, anonymously: the realm trusts 127.0.0.1), builds the
//! authorization URL; the user signs in through Keycloak's login form (plain HTTP, no
//! browser); the flow finishes with the redirect, and the tokens it got are accepted by the
//! realm's userinfo endpoint, before and after a refresh.
//!
//! The provider is started for the test (one instance, a few seconds warm; installed by
//! `scripts/idp.sh install` when not yet); set QUIVER_IDP_ENV to the `env` file of an
//! instance started with `scripts/idp.sh start DIR` to reuse it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::{BodyExt, Full};
use quiver_server::net::http::HttpClient;
use quiver_server::oauth::flow::{Error, Flow, FlowConfig, MemoryGuard, Upstream};
use quiver_server::oauth::keyring::KeyRing;
use serde_json::{Value, json};

/// The browser the sign-ins are begun and finished in (the digest of its cookie's secret).
const BROWSER: &str = "digest-of-carols-browser";

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
                let dir = std::env::temp_dir().join(format!("quiver-oauth-flow-{}", std::process::id()));
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

/// The stand-in upstream: `401` with a challenge on `/mcp`, its metadata naming the realm.
async fn upstream(issuer: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let resource = format!("{base}/mcp");
    let metadata = format!("{base}/.well-known/oauth-protected-resource/mcp");
    let prm = json!({
        "resource": resource,
        "authorization_servers": [issuer],
        "scopes_supported": ["openid", "profile"],
    })
    .to_string();
    let challenge = format!(r#"Bearer error="invalid_token", resource_metadata="{metadata}""#);
    let app = axum::Router::new()
        .route(
            "/mcp",
            axum::routing::post(move || async move {
                (
                    http::StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, challenge)],
                    "",
                )
            }),
        )
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            axum::routing::get(move || async move { ([(header::CONTENT_TYPE, "application/json")], prm) }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    resource
}

/// One request through the server's HTTP client; the answer with its body read.
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

/// The cookies an answer sets, as a `Cookie` value.
fn cookies(resp: &Response<Bytes>) -> String {
    resp.headers()
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok()?.split(';').next())
        .filter(|c| !c.ends_with('='))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The user signs in at `url` as a browser would: the login page's form is posted with the
/// user's credentials; the answer redirects to the callback. Returns the redirect's query.
async fn sign_in(http: &HttpClient, url: &str, user: &str, password: &str, callback: &str) -> String {
    let page = send(http, Request::get(url).body(Full::default()).unwrap()).await;
    assert_eq!(page.status(), 200, "the login page");
    let html = String::from_utf8_lossy(page.body()).into_owned();
    let form = html.find("id=\"kc-form-login\"").expect("Keycloak's login form");
    let action = html[form..]
        .split("action=\"")
        .nth(1)
        .and_then(|a| a.split('"').next())
        .expect("its action");
    let action = action.replace("&amp;", "&");
    let body = format!("username={user}&password={password}&credentialId=");
    let req = Request::post(action)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::COOKIE, cookies(&page))
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let done = send(http, req).await;
    assert_eq!(done.status(), 302, "{}", String::from_utf8_lossy(done.body()));
    let location = done.headers()[header::LOCATION].to_str().unwrap().to_owned();
    let query = location
        .strip_prefix(&format!("{callback}?"))
        .expect("a redirect to the callback");
    query.to_owned()
}

/// The realm's userinfo for an access token.
async fn userinfo(http: &HttpClient, issuer: &str, token: &str) -> (u16, Value) {
    let req = Request::get(format!("{issuer}/protocol/openid-connect/userinfo"))
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Full::default())
        .unwrap();
    let resp = send(http, req).await;
    let status = resp.status().as_u16();
    (status, serde_json::from_slice(resp.body()).unwrap_or_default())
}

#[test]
fn a_user_signs_in_to_an_upstream_at_keycloak_and_the_tokens_work_and_refresh() {
    let idp = Idp::get();
    let issuer = idp.env["QUIVER_IDP_UPSTREAM_ISSUER"].clone();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(sign_in_and_refresh(issuer));
}

async fn sign_in_and_refresh(issuer: String) {
    let http = HttpClient::new();
    let url = upstream(issuer.clone()).await;
    // Nothing listens there: the redirect is read from Keycloak's answer.
    let callback = "http://127.0.0.1:9/oauth/callback";
    let mut cfg = FlowConfig::new(callback);
    cfg.guard_discovered = false; // Keycloak is on this host
    cfg.client_name = "Quiver (oauth_flow test)".into();
    let keys = KeyRing::parse(&format!("t:{}", STANDARD.encode([3u8; 32]))).unwrap();
    let flow = Flow::new(cfg, http.clone(), Arc::new(keys)).unwrap();
    let up = Upstream {
        name: "notes".into(),
        url: url.clone(),
        issuer: None,
        client: None,
        scope: None,
    };

    // The upstream's 401 says where its metadata is.
    let probe = Request::post(&url).body(Full::default()).unwrap();
    let answer = send(&http, probe).await;
    assert_eq!(answer.status(), 401);
    let challenge = answer.headers()[header::WWW_AUTHENTICATE]
        .to_str()
        .unwrap()
        .to_owned();

    let found = flow.discover(&up, Some(&challenge)).await.unwrap();
    assert_eq!(found.server.issuer, issuer);
    assert!(found.server.authorization_response_iss_parameter_supported);
    assert!(found.server.registration_endpoint.is_some());
    assert_eq!(found.scope.as_deref(), Some("openid profile"));

    let subject = "https://idp.example|carol-at-quiver";
    let auth = flow.begin(subject, &up, Some(&challenge), BROWSER).await.unwrap();
    assert!(
        auth.url
            .starts_with(&format!("{issuer}/protocol/openid-connect/auth?")),
        "{}",
        auth.url
    );
    let redirect = sign_in(&http, &auth.url, "carol", "carol-password", callback).await;

    let guard = MemoryGuard::default();
    let done = flow.finish(&redirect, &guard, &[BROWSER]).await.unwrap();
    assert_eq!(
        (done.subject.as_str(), done.upstream.as_str()),
        (subject, "notes")
    );
    let tokens = done.tokens;
    assert_eq!(tokens.issuer, issuer);
    assert_eq!(tokens.client_id, auth.client_id);
    assert!(tokens.refresh_token.is_some() && tokens.expires_at.is_some());
    let (status, me) = userinfo(&http, &issuer, &tokens.access_token).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["preferred_username"], "carol");
    // The account is the one the ID token names, as the userinfo endpoint names it.
    assert_eq!(tokens.account.as_deref(), me["preferred_username"].as_str());
    // The same redirect again: refused before the (used) code is sent.
    let again = flow.finish(&redirect, &guard, &[BROWSER]).await.unwrap_err();
    assert!(matches!(again, Error::State(_)), "{again}");

    let renewed = flow.refresh(&tokens, &up).await.unwrap();
    assert_ne!(renewed.access_token, tokens.access_token);
    assert_eq!(renewed.account, tokens.account);
    let (status, me) = userinfo(&http, &issuer, &renewed.access_token).await;
    assert_eq!((status, me["preferred_username"].as_str()), (200, Some("carol")));

    // A second sign-in whose redirect is altered to name another server is refused (mix-up);
    // Keycloak's own answer is then accepted: registration was kept, not repeated.
    let auth2 = flow.begin(subject, &up, None, BROWSER).await.unwrap();
    assert_eq!(auth2.client_id, auth.client_id);
    let redirect = sign_in(&http, &auth2.url, "carol", "carol-password", callback).await;
    let forged = redirect.replace("iss=", "iss=https%3A%2F%2Fevil.example&was=");
    let e = flow.finish(&forged, &guard, &[BROWSER]).await.unwrap_err();
    assert!(matches!(e, Error::Issuer(_)), "{e}");
    // In another browser, Keycloak's own answer is refused before its code is sent.
    let e = flow.finish(&redirect, &guard, &["another"]).await.unwrap_err();
    assert!(matches!(e, Error::Browser(_)), "{e}");
    flow.finish(&redirect, &guard, &[BROWSER]).await.unwrap();

    // Revoked at the realm (RFC 7009): its userinfo refuses the token, and it no longer
    // refreshes (invalid_grant).
    assert!(flow.revoke(&renewed, &up).await.unwrap());
    let (status, _) = userinfo(&http, &issuer, &renewed.access_token).await;
    assert_eq!(status, 401);
    let e = flow.refresh(&renewed, &up).await.unwrap_err();
    assert!(matches!(e, Error::InvalidGrant(_)), "{e}");
}
