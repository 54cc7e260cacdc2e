use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::json;

use super::oidc::{self, OidcConfig};
use super::*;

fn config() -> OidcConfig {
    OidcConfig {
        issuer: "https://id.example.com/realms/a".into(),
        client_id: "console".into(),
        scopes: "openid profile".into(),
        username_claim: "preferred_username".into(),
        username_prefix: "oidc:".into(),
        groups_claim: "realm_access.roles".into(),
        groups_prefix: "oidc:".into(),
    }
}

fn jwt(claims: &Value) -> String {
    format!(
        "{}.{}.sig",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    )
}

fn answer(claims: &Value) -> Value {
    json!({"access_token": "at-123", "expires_in": 300, "id_token": jwt(claims)})
}

fn good() -> Value {
    json!({"iss": "https://id.example.com/realms/a", "aud": ["console", "other"], "exp": 2000, "nonce": "n1",
           "azp": "console", "preferred_username": "alice", "realm_access": {"roles": ["dev", "ops"]}})
}

/// [`good`] with an expiry an hour from now (for sessions opened against the clock).
fn good_now() -> Value {
    let mut c = good();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    c["exp"] = json!(now + 3600);
    c
}

#[test]
fn the_pkce_challenge_is_rfc_7636s() {
    assert_eq!(
        oidc::challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
        "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
    );
    let a = oidc::random(32).unwrap();
    assert_eq!(a.len(), 43);
    assert_ne!(Some(a), oidc::random(32));
}

#[test]
fn a_sign_in_rides_in_its_cookie_and_only_its_own_state_completes_it() {
    let p = oidc::Pending::new().unwrap();
    let cookie = p.cookie();
    assert_eq!(oidc::Pending::from_cookie(&cookie), Some(p.clone()));
    assert_eq!(oidc::began_here(&p.state, Some(&cookie)), Ok(p.clone()));
    let other = oidc::Pending::new().unwrap();
    for (state, cookie) in [
        (p.state.as_str(), None),
        (p.state.as_str(), Some(other.cookie())),
        (other.state.as_str(), Some(cookie.clone())),
        ("", Some(cookie.clone())),
        (p.state.as_str(), Some(format!("{cookie}.x"))),
        (p.state.as_str(), Some(format!("{}.{}", p.state, p.verifier))),
        (p.state.as_str(), Some(cookie.replace('.', ";"))),
        (p.state.as_str(), Some("é".repeat(40))),
    ] {
        assert!(
            oidc::began_here(state, cookie.as_deref()).is_err(),
            "{state} {cookie:?}"
        );
    }
}

#[test]
fn tokens_travel_over_https_or_to_this_machine_only() {
    for ok in [
        "https://id.example.com/realms/a",
        "http://127.0.0.1:8080/realms/a",
        "http://localhost/x",
        "http://[::1]:80/",
        "http://127.9.9.9",
    ] {
        assert!(oidc::secure_or_loopback(ok), "{ok}");
    }
    for bad in [
        "http://id.example.com",
        "http://127.0.0.1.evil.com/",
        "http://localhost.evil.com",
        "http://[::2]/",
        "ftp://127.0.0.1",
        "javascript:alert(1)",
        "http://evil.com/127.0.0.1",
        "http://evil@127.0.0.1.nip.io/",
        "http://127.0.0.1:80@evil.com/mcp",
        "http://localhost:1@evil.com/",
        "http://[::1]@evil.com/",
        "https://user@evil.com/",
    ] {
        assert!(!oidc::secure_or_loopback(bad), "{bad}");
    }
}

#[test]
fn the_authorization_url_asks_for_a_code_with_pkce() {
    let u = oidc::authorization_url(
        "https://id/auth?kc=1",
        &config(),
        "https://c/callback",
        "s t",
        "ch",
        "nn",
    );
    assert!(u.starts_with("https://id/auth?kc=1&response_type=code&client_id=console&redirect_uri=https%3A%2F%2Fc%2Fcallback"), "{u}");
    assert!(
        u.contains("&state=s+t&nonce=nn&code_challenge=ch&code_challenge_method=S256"),
        "{u}"
    );
    assert!(u.contains("scope=openid+profile"));
}

#[test]
fn discovery_must_name_the_issuer_and_both_endpoints() {
    let c = config();
    let doc = json!({"issuer": c.issuer, "authorization_endpoint": "https://id/a", "token_endpoint": "https://id/t"});
    let e = oidc::discovered(&doc, &c.issuer).unwrap();
    assert_eq!(
        (e.authorization.as_str(), e.token.as_str()),
        ("https://id/a", "https://id/t")
    );
    let other = json!({"issuer": "https://evil", "authorization_endpoint": "https://id/a", "token_endpoint": "https://id/t"});
    assert!(
        oidc::discovered(&other, &c.issuer)
            .unwrap_err()
            .contains("another issuer")
    );
    let js = json!({"issuer": c.issuer, "authorization_endpoint": "javascript:alert(1)", "token_endpoint": "https://id/t"});
    assert!(
        oidc::discovered(&js, &c.issuer)
            .unwrap_err()
            .contains("authorization_endpoint")
    );
}

#[test]
fn a_session_takes_prefixed_names_from_a_checked_id_token() {
    let s = oidc::session_of(&answer(&good()), &config(), "n1", 1000).unwrap();
    assert_eq!(s.shown, "alice");
    assert_eq!(s.username, "oidc:alice");
    assert_eq!(s.groups, ["oidc:dev", "oidc:ops"]);
    assert_eq!(s.access_token, "at-123");
    assert_eq!(s.audiences, None, "an opaque token names no audience");
    let mut jwt_answer = answer(&good());
    jwt_answer["access_token"] = json!(jwt(&json!({"aud": ["quiver", "account"]})));
    let s = oidc::session_of(&jwt_answer, &config(), "n1", 1000).unwrap();
    assert_eq!(s.audiences, Some(vec!["quiver".to_owned(), "account".to_owned()]));
    assert!(!s.csrf.is_empty());
}

#[test]
fn an_id_token_that_does_not_hold_opens_no_session() {
    let cases: [(&str, Value, &str); 8] = [
        ("iss", json!("https://id.example.com/realms/b"), "another issuer"),
        ("aud", json!("someone-else"), "not addressed"),
        // Several audiences: issued to another party.
        ("azp", json!("other"), "not addressed"),
        ("azp", Value::Null, "not addressed"),
        ("exp", json!(999), "expired"),
        ("nonce", json!("n2"), "not the answer"),
        ("preferred_username", json!("ali\u{7}ce"), "no usable"),
        ("preferred_username", json!("a".repeat(300)), "no usable"),
    ];
    for (k, v, why) in cases {
        let mut c = good();
        c[k] = v;
        let e = oidc::session_of(&answer(&c), &config(), "n1", 1000).unwrap_err();
        assert!(e.contains(why), "{k}: {e}");
    }
    // Named by email: only a verified address names anyone.
    let by_email = OidcConfig {
        username_claim: "email".into(),
        ..config()
    };
    let mut c = good();
    c["email"] = json!("alice@example.com");
    let e = oidc::session_of(&answer(&c), &by_email, "n1", 1000).unwrap_err();
    assert!(e.contains("not verified"), "{e}");
    c["email_verified"] = json!(true);
    assert_eq!(
        oidc::session_of(&answer(&c), &by_email, "n1", 1000)
            .unwrap()
            .shown,
        "alice@example.com"
    );
    // One audience, no azp: fine.
    let mut c = good();
    c["aud"] = json!("console");
    c.as_object_mut().unwrap().remove("azp");
    assert!(oidc::session_of(&answer(&c), &config(), "n1", 1000).is_ok());
    let e = oidc::session_of(&json!({"access_token": "x"}), &config(), "n1", 1000).unwrap_err();
    assert!(e.contains("no ID token"), "{e}");
    let e = oidc::session_of(&json!({"id_token": jwt(&good())}), &config(), "n1", 1000).unwrap_err();
    assert!(e.contains("no access token"), "{e}");
}

#[tokio::test]
async fn a_callback_must_come_back_to_the_browser_that_began_it() {
    // A provider nobody listens for: port 1 of this machine.
    let closed = OidcConfig {
        issuer: "http://127.0.0.1:1/realms/a".into(),
        ..config()
    };
    let s = oidc::SignIn::new(closed, "https://c/callback".into(), client::Http::new());
    let refused = |e: oidc::Failed| match e {
        oidc::Failed::Refused(w) => w,
        oidc::Failed::Unavailable(w) => panic!("not a refusal: {w}"),
    };
    assert!(refused(s.complete("st", None, "code").await.unwrap_err()).contains("not begun in this browser"));
    assert!(
        refused(s.complete("st", Some("other"), "code").await.unwrap_err())
            .contains("not begun in this browser")
    );
    // Unavailable, not refused.
    let p = oidc::Pending::new().unwrap();
    assert!(matches!(
        s.complete(&p.state, Some(&p.cookie()), "code").await,
        Err(oidc::Failed::Unavailable(_))
    ));
    assert!(s.session("nothing").is_none());
    // A provider over plain http elsewhere than this machine is not trusted at all.
    let plain = OidcConfig {
        issuer: "http://id.example.com/realms/a".into(),
        ..config()
    };
    let s = oidc::SignIn::new(plain, "https://c/callback".into(), client::Http::new());
    assert!(s.begin().await.unwrap_err().contains("not https"));
}

fn console(url: &str) -> Console {
    let catalog = Arc::new(Catalog::new(
        "dev.quiver".into(),
        crate::catalog::Access::Open,
        vec![],
        Arc::default(),
    ));
    Console::new(catalog, config(), url, Reach::Service, None)
}

#[test]
fn over_https_cookies_are_host_only_and_the_same_site_one_is_strict() {
    let c = console("https://console.example.com/");
    let v = c.set_cookie(SITE_COOKIE, "id9", 60, true);
    assert_eq!(
        v.to_str().unwrap(),
        "__Host-quiver_console_site=id9; Path=/; Max-Age=60; HttpOnly; SameSite=Strict; Secure"
    );
    let v = c.set_cookie(LOGIN_COOKIE, "p", 600, false);
    assert_eq!(
        v.to_str().unwrap(),
        "__Host-quiver_console_login=p; Path=/; Max-Age=600; HttpOnly; SameSite=Lax; Secure"
    );
    assert_eq!(c.origin, "https://console.example.com");
    let plain = console("http://127.0.0.1:8083");
    assert_eq!(plain.name(SESSION_COOKIE), "quiver_console");
    // The origin as browsers send it: lower case, no default port.
    assert_eq!(
        console("https://Console.Example.com:443/base").origin,
        "https://console.example.com"
    );
    assert_eq!(console("http://127.0.0.1:80").origin, "http://127.0.0.1");
}

#[tokio::test]
async fn only_a_request_from_the_consoles_own_pages_is_here() {
    let c = console("https://console.example.com");
    let id = c.sign_in.open(&answer(&good_now()), "n1").unwrap();
    let headers = |site: Option<&str>, strict: bool| {
        let mut h = HeaderMap::new();
        let mut jar = format!("__Host-quiver_console={id}");
        if strict {
            jar.push_str(&format!("; __Host-quiver_console_site={id}"));
        }
        h.insert(header::COOKIE, HeaderValue::from_str(&jar).unwrap());
        if let Some(site) = site {
            h.insert("sec-fetch-site", HeaderValue::from_str(site).unwrap());
        }
        h
    };
    let here = async |h: HeaderMap| c.session(&h).await.map(|(_, _, here)| here);
    assert_eq!(here(headers(Some("same-origin"), true)).await, Some(true));
    assert_eq!(here(headers(Some("none"), true)).await, Some(true));
    assert_eq!(here(headers(None, true)).await, Some(true));
    // A sibling host of the same site sends the Strict cookie, and says where it comes from.
    assert_eq!(here(headers(Some("same-site"), true)).await, Some(false));
    assert_eq!(here(headers(Some("cross-site"), true)).await, Some(false));
    // Another site's link: no Strict cookie.
    assert_eq!(here(headers(Some("cross-site"), false)).await, Some(false));
}

/// A provider on this machine: its token endpoint renews any refresh token but `revoked`
/// (refused with `invalid_grant`), and records each request's form.
async fn provider() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer = format!("http://{}/realms/a", listener.local_addr().unwrap());
    let doc = json!({"issuer": issuer, "authorization_endpoint": format!("{issuer}/auth"),
                     "token_endpoint": format!("{issuer}/token")});
    let log = seen.clone();
    let token = move |body: Bytes| {
        let log = log.clone();
        async move {
            let form: std::collections::HashMap<String, String> =
                form_urlencoded::parse(&body).into_owned().collect();
            log.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&body).into_owned());
            let rt = form.get("refresh_token").cloned().unwrap_or_default();
            if rt == "revoked" {
                return (
                    StatusCode::BAD_REQUEST,
                    axum::Json(json!({"error": "invalid_grant"})),
                );
            }
            (
                StatusCode::OK,
                axum::Json(json!({"access_token": format!("at-after-{rt}"),
                "expires_in": 300, "refresh_token": format!("{rt}+")})),
            )
        }
    };
    let app = axum::Router::new()
        .route(
            "/realms/a/.well-known/openid-configuration",
            axum::routing::get(move || async move { axum::Json(doc) }),
        )
        .route("/realms/a/token", axum::routing::post(token));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (issuer, seen)
}

#[tokio::test]
async fn a_session_renews_its_access_token_before_it_expires_once_and_ends_when_refused() {
    let (issuer, seen) = provider().await;
    let c = OidcConfig {
        issuer: issuer.clone(),
        ..config()
    };
    let s = oidc::SignIn::new(c, "https://c/callback".into(), client::Http::new());
    let mut claims = good_now();
    claims["iss"] = json!(issuer);
    let open = |expires_in: u64, refresh: Option<&str>| {
        let mut a = json!({"access_token": "at-0", "expires_in": expires_in, "id_token": jwt(&claims)});
        if let Some(r) = refresh {
            a["refresh_token"] = json!(r);
        }
        s.open(&a, "n1").unwrap()
    };
    let calls = || seen.lock().unwrap().len();

    // Its token expires within the minute: renewed on its next use, for the same user.
    let id = open(30, Some("rt-1"));
    let v = s.live(&id).await.unwrap();
    assert_eq!(
        (v.access_token.as_str(), v.shown.as_str()),
        ("at-after-rt-1", "alice")
    );
    let form = seen.lock().unwrap()[0].clone();
    for part in [
        "grant_type=refresh_token",
        "refresh_token=rt-1",
        "client_id=console",
    ] {
        assert!(form.contains(part), "{form}");
    }
    // Good for five minutes now: used as it is.
    assert_eq!(s.live(&id).await.unwrap().access_token, "at-after-rt-1");
    assert_eq!(calls(), 1);

    // Already expired, with a refresh token: renewed, not ended.
    let late = open(0, Some("rt-2"));
    assert!(
        s.session(&late).is_none(),
        "its access token alone is no longer valid"
    );
    assert_eq!(s.live(&late).await.unwrap().access_token, "at-after-rt-2");

    // Refused: the session goes on with its token while it lasts, and asks no more.
    let refused = open(30, Some("revoked"));
    assert_eq!(s.live(&refused).await.unwrap().access_token, "at-0");
    assert_eq!(s.live(&refused).await.unwrap().access_token, "at-0");
    assert_eq!(calls(), 3, "a refused refresh is not tried again");
    let gone = open(0, Some("revoked"));
    assert!(s.live(&gone).await.is_none(), "nothing left to use: signed out");

    // No refresh token: nothing is asked; signed out: nothing is given.
    let plain = open(30, None);
    assert_eq!(s.live(&plain).await.unwrap().access_token, "at-0");
    assert_eq!(calls(), 4);
    s.end(&id);
    assert!(s.live(&id).await.is_none());
}

#[test]
fn only_a_server_checking_the_consoles_issuer_gets_the_users_token() {
    let c = console("https://console.example.com");
    let session = oidc::session_of(&answer(&good()), &config(), "n1", 1000).unwrap();
    let server = |auth: Value| -> McpServer {
        serde_json::from_value(json!({
            "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer",
            "metadata": {"name": "s", "namespace": "n"}, "spec": {"auth": auth}}))
        .unwrap()
    };
    let ours = server(json!({"oidc": {"issuer": "https://id.example.com/realms/a/", "audience": "quiver"}}));
    assert_eq!(
        c.token_for(&ours, &session, "http://s.n.svc:8080/mcp"),
        Some("at-123")
    );
    // Listed URLs: https only.
    let listed = Console {
        reach: Reach::Listed,
        ..console("https://console.example.com")
    };
    assert_eq!(
        listed.token_for(&ours, &session, "https://s.example.com/mcp"),
        Some("at-123")
    );
    assert_eq!(
        listed.token_for(&ours, &session, "http://s.example.com/mcp"),
        None
    );
    // A token that names its audiences goes only to servers of one of them.
    let mut jwt_session = session.clone();
    jwt_session.audiences = Some(vec!["quiver".into(), "docs".into()]);
    assert_eq!(
        c.token_for(&ours, &jwt_session, "http://s.n.svc:8080/mcp"),
        Some("at-123")
    );
    let elsewhere =
        server(json!({"oidc": {"issuer": "https://id.example.com/realms/a", "audience": "team-b"}}));
    assert_eq!(
        c.token_for(&elsewhere, &jwt_session, "http://s.n.svc:8080/mcp"),
        None
    );
    let theirs =
        server(json!({"oidc": {"issuer": "https://evil.example.com/realms/a", "audience": "quiver"}}));
    assert_eq!(c.token_for(&theirs, &session, "http://s.n.svc:8080/mcp"), None);
    let none = server(Value::Null);
    assert_eq!(c.token_for(&none, &session, "http://s.n.svc:8080/mcp"), None);
    let shared = server(json!({"bearerTokenSecretRef": {"name": "t", "key": "token"}}));
    assert_eq!(c.token_for(&shared, &session, "http://s.n.svc:8080/mcp"), None);
}

#[test]
fn cookies_are_read_by_exact_name() {
    let mut h = HeaderMap::new();
    h.append(
        header::COOKIE,
        HeaderValue::from_static("a=1; quiver_console_login=st; quiver_console=id9"),
    );
    assert_eq!(cookie(&h, SESSION_COOKIE), Some("id9"));
    assert_eq!(cookie(&h, LOGIN_COOKIE), Some("st"));
    assert_eq!(cookie(&h, "quiver"), None);
}

#[test]
fn rules_summarize_access_policies_and_upstreams() {
    let m: McpServer = serde_json::from_value(json!({
        "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer",
        "metadata": {"name": "s", "namespace": "n"},
        "spec": {
            "tools": [
                {"name": "deploy", "access": {"scopes": ["deploy:write"], "groups": ["sre", "platform"]}, "handler": {"builtin": "echo"}},
                {"name": "echo", "handler": {"builtin": "echo"}},
            ],
            "upstreams": [{"name": "gh", "http": {"url": "https://gh.example.com/mcp"}, "tools": {"access": {"groups": ["dev"]}}}],
            "policies": [{"name": "no-prod", "expression": "args.env != 'prod'", "tools": ["deploy"]}],
        }
    }))
    .unwrap();
    assert_eq!(
        rules(&m),
        [
            (
                "deploy".to_owned(),
                "callers with scopes deploy:write, a member of sre or platform".to_owned()
            ),
            (
                "every tool of upstream gh".to_owned(),
                "callers with a member of dev".to_owned()
            ),
            (
                "deploy".to_owned(),
                "policy no-prod: when args.env != 'prod'".to_owned()
            ),
        ]
    );
}

#[test]
fn the_console_knows_its_origin_and_whether_cookies_are_secure() {
    let catalog = Arc::new(Catalog::new(
        "dev.quiver".into(),
        crate::catalog::Access::Open,
        vec![],
        Arc::default(),
    ));
    let c = Console::new(
        catalog.clone(),
        config(),
        "https://console.example.com/",
        Reach::Service,
        None,
    );
    assert_eq!(c.origin, "https://console.example.com");
    assert!(c.secure);
    let v = c.set_cookie(SESSION_COOKIE, "x", 10, false);
    assert_eq!(
        v.to_str().unwrap(),
        "__Host-quiver_console=x; Path=/; Max-Age=10; HttpOnly; SameSite=Lax; Secure"
    );
    let c = Console::new(
        catalog,
        config(),
        "http://127.0.0.1:9000/base",
        Reach::Listed,
        None,
    );
    assert_eq!(c.origin, "http://127.0.0.1:9000");
    assert!(!c.secure);
}
