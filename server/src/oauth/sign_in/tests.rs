//! The sign-in against the flow's in-test authorization server (one loopback port): it plays
//! the client-facing issuer (`/as`, with the browser client `quiver-browser`) and the
//! upstream's authorization server (`/as` too, where Quiver registers itself). ID tokens are
//! `SUB.NONCE`, checked by a fake verifier; everything else is the real code. Each hostile
//! input is refused with nothing stored.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

use super::*;
use crate::oauth::flow::tests::Fake;
use crate::secrets::Presence;
use crate::spec::identity::IdentityMode;

const BROWSER: &str = "quiver-browser";
const BROWSER_SECRET: &str = "browser-secret-0123456789";

#[derive(Debug)]
struct FakeIdTokens(String);

impl IdTokens for FakeIdTokens {
    fn issuer(&self) -> &str {
        &self.0
    }

    fn verify<'a>(&'a self, token: &'a str, audience: &'a str) -> Verified<'a> {
        let r = match token.split_once('.') {
            Some((sub, nonce)) if audience == BROWSER => {
                Ok(json!({"iss": self.0, "sub": sub, "nonce": nonce}))
            }
            _ => Err("bad signature".to_owned()),
        };
        Box::pin(std::future::ready(r))
    }
}

struct Setup {
    fake: Fake,
    sign_in: SignIn,
    secrets: Arc<Secrets>,
    metrics: Arc<OAuthMetrics>,
    id: Identity,
}

fn ring_text(keys: &[(&str, u8)]) -> String {
    keys.iter()
        .map(|(k, b)| format!("{k}:{}\n", STANDARD.encode([*b; 32])))
        .collect()
}

fn set_ring(secrets: &Secrets, text: &str) {
    secrets.set(
        "signin",
        Some(vec![
            ("keys".into(), text.as_bytes().to_vec()),
            ("browser".into(), BROWSER_SECRET.as_bytes().to_vec()),
        ]),
        Presence::Loaded,
    );
}

async fn setup() -> Setup {
    let fake = Fake::start().await;
    fake.set(|k| {
        k.clients.insert(BROWSER.into(), Some(BROWSER_SECRET.into()));
    });
    let secrets = Secrets::new();
    secrets.set_has_source();
    set_ring(&secrets, &ring_text(&[("k1", 1)]));
    let metrics = OAuthMetrics::unregistered();
    let cfg = SignInConfig {
        url: "http://127.0.0.1:9/".into(),
        keys: SecretRef {
            name: "signin".into(),
            key: "keys".into(),
        },
        client_id: BROWSER.into(),
        client_secret: Some(SecretRef {
            name: "signin".into(),
            key: "browser".into(),
        }),
        vault: vault::Options::default(),
        backend: vault::Backend::Memory,
        local_servers: true,
    };
    let verifier = Arc::new(FakeIdTokens(fake.issuer("/as")));
    let sign_in = SignIn::new(
        cfg,
        HttpClient::new(),
        secrets.clone(),
        verifier,
        metrics.clone(),
        None,
    )
    .unwrap();
    let id = Identity {
        mode: IdentityMode::User,
        audience: fake.upstream_url().into(),
        scopes: "".into(),
        issuer: None,
        client: None,
    };
    Setup {
        fake,
        sign_in,
        secrets,
        metrics,
        id,
    }
}

impl Setup {
    fn subject(&self, user: &str) -> String {
        format!("{}|{user}", self.fake.issuer("/as"))
    }

    /// The upstreams of mode `user` as configured.
    fn ids(&self) -> Vec<(String, Identity)> {
        vec![("notes".into(), self.id.clone())]
    }

    fn lookup(&self) -> impl Fn(&str) -> Option<Identity> + Sync + '_ {
        |name: &str| (name == "notes").then(|| self.id.clone())
    }

    /// A sign-in link for `user`: its query.
    async fn link(&self, user: &str) -> (SignInLink, String) {
        match self
            .sign_in
            .authorize(&self.subject(user), "notes", &self.id)
            .await
        {
            CallAuth::SignIn(l) => {
                let q = l.url.split_once('?').unwrap().1.to_owned();
                (l, q)
            }
            other => panic!("not a link: {other:?}"),
        }
    }

    /// Opens the link's query: the redirect to the issuer and the cookie set.
    async fn open(&self, query: &str) -> (String, String) {
        let find = self.lookup();
        let page = self.sign_in.start(query, &find).await;
        assert_eq!(page.status, 302, "{}", page.body);
        let cookie = page.cookies[0].split(';').next().unwrap().to_owned();
        (page.location.unwrap(), cookie)
    }

    async fn callback(&self, query: &str, cookie: Option<&str>) -> Page {
        let find = self.lookup();
        self.sign_in.callback(query, cookie, &find).await
    }

    /// The whole sign-in of `user` in one browser; the last page.
    async fn sign_in_as(&self, user: &str) -> Page {
        let (_, q) = self.link(user).await;
        let (to_issuer, cookie) = self.open(&q).await;
        let back = self.fake.login_as(&to_issuer, user);
        let bound = self.callback(&back, Some(&cookie)).await;
        assert_eq!(bound.status, 302, "{}", bound.body);
        let cookie = bound.cookies[0].split(';').next().unwrap().to_owned();
        let back = self.fake.login(bound.location.as_deref().unwrap());
        self.callback(&back, Some(&cookie)).await
    }

    async fn held(&self, user: &str) -> bool {
        self.sign_in
            .vault()
            .get(&self.subject(user), "notes")
            .await
            .unwrap()
            .is_some()
    }
}

fn params(query: &str) -> HashMap<String, String> {
    flow::parse_query(query.split_once('?').map_or(query, |(_, q)| q))
        .unwrap()
        .into_iter()
        .collect()
}

#[tokio::test]
async fn a_user_signs_in_through_the_link_and_calls_carry_their_token() {
    let s = setup().await;
    let (link, q) = s.link("alice").await;
    assert!(
        link.url.starts_with("http://127.0.0.1:9/oauth/start?t="),
        "{}",
        link.url
    );
    assert!(!link.url.contains("alice") && !link.url.contains(&link.id));
    let (to_issuer, cookie) = s.open(&q).await;
    let p = params(&to_issuer);
    assert!(to_issuer.starts_with(&format!("{}/authorize?", s.fake.issuer("/as"))));
    assert_eq!(
        (p["client_id"].as_str(), p["scope"].as_str()),
        (BROWSER, "openid")
    );
    assert_eq!(p["redirect_uri"], "http://127.0.0.1:9/oauth/callback");
    assert!(p["state"].starts_with("b.") && p.contains_key("nonce") && p.contains_key("code_challenge"));
    // The cookie: `__Host-` (Secure, Path=/, no Domain: loopback http too), HttpOnly, SameSite.
    let (_, q2) = s.link("alice").await;
    let find = s.lookup();
    let set = &s.sign_in.start(&q2, &find).await.cookies[0];
    assert!(
        set.starts_with("__Host-quiver-oauth-")
            && set.ends_with("; Path=/; Max-Age=600; HttpOnly; SameSite=Lax; Secure")
            && !set.contains("Domain"),
        "{set}"
    );

    let back = s.fake.login_as(&to_issuer, "alice");
    let bound = s.callback(&back, Some(&cookie)).await;
    assert_eq!(bound.status, 302, "{}", bound.body);
    let to_upstream = bound.location.clone().unwrap();
    let p = params(&to_upstream);
    assert!(
        !p["state"].starts_with("b."),
        "the upstream gets the flow's own state"
    );
    assert_eq!(p["resource"], s.fake.upstream_url());
    let bound_cookie = bound.cookies[0].split(';').next().unwrap().to_owned();
    assert_eq!(
        bound_cookie, cookie,
        "the same secret, kept for the flow's lifetime"
    );
    let back = s.fake.login(&to_upstream);
    let done = s.callback(&back, Some(&bound_cookie)).await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert!(done.body.contains("Signed in to notes"), "{}", done.body);
    assert!(done.cookies[0].contains("Max-Age=0"), "the cookie is cleared");
    assert_eq!(s.metrics.sign_ins("notes", "ok"), 1);

    match s.sign_in.authorize(&s.subject("alice"), "notes", &s.id).await {
        CallAuth::Bearer(h) => assert!(h.header.to_str().unwrap().starts_with("Bearer at-")),
        other => panic!("{other:?}"),
    }
    // Bob holds nothing: he gets a link of his own.
    assert!(matches!(
        s.sign_in.authorize(&s.subject("bob"), "notes", &s.id).await,
        CallAuth::SignIn(_)
    ));
    // Signed out, alice is asked again.
    assert!(
        s.sign_in
            .sign_out(&s.subject("alice"), "notes", &s.ids())
            .await
            .unwrap()
    );
    assert!(
        !s.sign_in
            .sign_out(&s.subject("alice"), "notes", &s.ids())
            .await
            .unwrap()
    );
    assert!(matches!(
        s.sign_in.authorize(&s.subject("alice"), "notes", &s.id).await,
        CallAuth::SignIn(_)
    ));
}

#[tokio::test]
async fn a_link_opened_by_another_user_or_browser_stores_nothing() {
    let s = setup().await;
    // Bob's browser opens alice's link and signs in as bob: refused.
    let (_, q) = s.link("alice").await;
    let (to_issuer, cookie) = s.open(&q).await;
    let back = s.fake.login_as(&to_issuer, "bob");
    let page = s.callback(&back, Some(&cookie)).await;
    assert_eq!(page.status, 403, "{}", page.body);
    assert!(page.body.contains("made for another user"), "{}", page.body);
    assert_eq!(s.metrics.sign_ins("notes", "wrong_user"), 1);
    // The link is spent (it is marked used before the issuer's code is exchanged): alice's
    // client gives her a new one.
    let (to_issuer, cookie) = s.open(&q).await;
    let back = s.fake.login_as(&to_issuer, "alice");
    let again = s.callback(&back, Some(&cookie)).await;
    assert!(
        again.status == 400 && again.body.contains("used already"),
        "{}",
        again.body
    );
    let (to_issuer, cookie) = s.open(&s.link("alice").await.1).await;
    let back = s.fake.login_as(&to_issuer, "alice");
    let bound = s.callback(&back, Some(&cookie)).await;
    assert_eq!(bound.status, 302, "{}", bound.body);
    let to_upstream = bound.location.unwrap();
    // The redirect back from the issuer in a browser without the cookie: refused.
    let (to_issuer, _) = s.open(&s.link("alice").await.1).await;
    let back = s.fake.login_as(&to_issuer, "alice");
    assert_eq!(s.callback(&back, None).await.status, 403);
    assert_eq!(
        s.callback(&back, Some("__Host-quiver-oauth-x=forged"))
            .await
            .status,
        403
    );
    // The upstream's authorization URL handed to bob: he finishes in his browser, with his
    // own bound cookie (for his own sign-in) or none: nothing stored for alice.
    let back = s.fake.login(&to_upstream);
    let page = s.callback(&back, None).await;
    assert_eq!(page.status, 403, "{}", page.body);
    assert!(!s.held("alice").await);
    // A page names nothing of what it was given.
    let code = params(&back)["code"].clone();
    for p in [&page.body, &s.callback(&back, Some("a=b")).await.body] {
        assert!(!p.contains(&code) && !p.contains(&q[2..]), "{p}");
    }
}

/// `user` signs in through a link up to the redirect back from the upstream's server: that
/// redirect's query, and the browser's cookie (`name=secret`).
async fn up_to_the_upstream(s: &Setup, user: &str) -> (String, String) {
    let (to_issuer, cookie) = s.open(&s.link(user).await.1).await;
    let bound = s
        .callback(&s.fake.login_as(&to_issuer, user), Some(&cookie))
        .await;
    assert_eq!(bound.status, 302, "{}", bound.body);
    (s.fake.login_as(bound.location.as_deref().unwrap(), user), cookie)
}

#[tokio::test]
async fn a_redirect_finishes_only_in_the_browser_that_began_it() {
    let s = setup().await;
    // Mallory's upstream redirect (her state, her code) lands in alice's browser, which holds
    // cookies of its own sign-in; or mallory planted her secret from a sibling subdomain,
    // where she cannot set a `__Host-` cookie (any other name is not read).
    let (mallorys, mallory_cookie) = up_to_the_upstream(&s, "mallory").await;
    let (alices, alice_cookie) = up_to_the_upstream(&s, "alice").await;
    let (name, secret) = mallory_cookie.split_once('=').unwrap();
    let tossed = [
        format!("{}={secret}", name.trim_start_matches("__Host-")),
        format!("__Secure-{}={secret}", name.trim_start_matches("__Host-")),
    ];
    let sent = s.fake.token_requests().len();
    for cookie in [
        Some(alice_cookie.as_str()),
        None,
        Some(&tossed[0]),
        Some(&tossed[1]),
    ] {
        let page = s.callback(&mallorys, cookie).await;
        assert_eq!(page.status, 403, "{cookie:?}: {}", page.body);
        assert!(page.body.contains("another browser"), "{}", page.body);
    }
    // Nothing was exchanged or stored, and nothing spent: each browser finishes its own.
    assert_eq!(s.fake.token_requests().len(), sent, "no code was sent");
    assert!(!s.held("mallory").await && !s.held("alice").await);
    let both = format!("{alice_cookie}; {mallory_cookie}");
    assert_eq!(s.callback(&mallorys, Some(&both)).await.status, 200);
    assert_eq!(s.callback(&alices, Some(&alice_cookie)).await.status, 200);
    assert!(s.held("mallory").await && s.held("alice").await);
    // A replay of a finished redirect is refused before its code is sent again.
    let sent = s.fake.token_requests().len();
    let page = s.callback(&alices, Some(&alice_cookie)).await;
    assert!(
        page.status == 400 && page.body.contains("used already"),
        "{}",
        page.body
    );
    assert_eq!(s.fake.token_requests().len(), sent);
}

#[tokio::test]
async fn a_callbacks_error_shows_only_a_code_oauth_defines_and_only_with_a_valid_state() {
    let s = setup().await;
    let enc = crate::template::percent_encode;
    let phish = "Your account is locked: call +1 555 0100 at https://evil.example <b>now</b>";
    let errors = [
        ("access_denied", "access_denied"),
        ("consent_required", "consent_required"),
        ("<script>alert(1)</script>", "an error code OAuth does not define"),
        (phish, "an error code OAuth does not define"),
        ("access_denied_or_call_555", "an error code OAuth does not define"),
    ];
    let clean = |page: &Page| {
        for word in ["locked", "555", "evil", "script", "<b>"] {
            assert!(!page.body.contains(word), "{word}: {}", page.body);
        }
    };
    // No state, a forged one, a forged browser state: nothing of the redirect is shown.
    for state in ["", "state=x&", "state=b.v1.k1.AAAA&", "state=v1.k1.AAAA&"] {
        for (error, _) in errors {
            let q = format!("{state}error={}&error_description={}", enc(error), enc(phish));
            let page = s.callback(&q, None).await;
            assert_eq!(page.status, 400, "{q}: {}", page.body);
            clean(&page);
            assert!(!page.body.contains("access_denied"), "{}", page.body);
        }
    }
    // The states of sign-ins in flight, in their browsers: the code if OAuth defines it.
    let (to_issuer, at_issuer) = s.open(&s.link("alice").await.1).await;
    let issuer_state = params(&to_issuer)["state"].clone();
    let (redirect, upstream_cookie) = up_to_the_upstream(&s, "alice").await;
    let upstream_state = params(&redirect)["state"].clone();
    for (state, cookie) in [(&issuer_state, &at_issuer), (&upstream_state, &upstream_cookie)] {
        for (error, shown) in errors {
            let q = format!(
                "state={}&error={}&error_description={}",
                enc(state),
                enc(error),
                enc(phish)
            );
            let page = s.callback(&q, Some(cookie)).await;
            assert_eq!(page.status, 400, "{error}: {}", page.body);
            assert!(page.body.contains(shown), "{error}: {}", page.body);
            clean(&page);
        }
    }
}

#[tokio::test]
async fn what_an_upstreams_metadata_says_reaches_no_page() {
    let s = setup().await;
    // The upstream names an authorization server whose identifier is a message of its own.
    let words = format!("call-555-0100-at-evil-example-{}", "x".repeat(1500));
    s.fake.doc(
        "/.well-known/oauth-protected-resource/mcp",
        200,
        json!({"resource": s.fake.upstream_url(), "authorization_servers": [s.fake.issuer(&format!("/{words}"))]}),
    );
    let (to_issuer, cookie) = s.open(&s.link("alice").await.1).await;
    let page = s
        .callback(&s.fake.login_as(&to_issuer, "alice"), Some(&cookie))
        .await;
    assert_eq!(page.status, 502, "{}", page.body);
    assert!(
        page.body.contains(
            "cannot be used: the metadata of the upstream or of its authorization server is missing or was refused."
        ) && !page.body.contains("555")
            && !page.body.contains("127.0.0.1")
            && page.body.len() < 1000,
        "{}",
        page.body
    );
    // A token endpoint that fails: its URL (the metadata's choice) is not shown either.
    let s = setup().await;
    let (redirect, cookie) = up_to_the_upstream(&s, "alice").await;
    s.fake.set(|k| k.token_answer = Some((500, "{}".into())));
    let page = s.callback(&redirect, Some(&cookie)).await;
    assert_eq!(page.status, 502, "{}", page.body);
    assert!(
        page.body
            .contains("the token endpoint&#39;s answer could not be used.")
            && !page.body.contains("/token"),
        "{}",
        page.body
    );
}

#[tokio::test]
async fn one_caller_cannot_fill_the_memory_of_used_links() {
    let s = setup().await;
    let enc = crate::template::percent_encode;
    // Mallory's client asks for link after link, opens each and comes back with a made-up
    // code: each spends a used link of hers, up to her share.
    let burn = |n: usize| {
        let s = &s;
        async move {
            let (to_issuer, cookie) = s.open(&s.link("mallory").await.1).await;
            let state = params(&to_issuer)["state"].clone();
            let page = s
                .callback(&format!("code=x&state={}", enc(&state)), Some(&cookie))
                .await;
            (n, page)
        }
    };
    for n in 0..crate::oauth::flow::MAX_USED_PER_SUBJECT {
        let (n, page) = burn(n).await;
        assert_eq!(page.status, 400, "{n}: {}", page.body);
        assert!(page.body.contains("answer was refused"), "{n}: {}", page.body);
    }
    let sent = s.fake.token_requests().len();
    let (_, page) = burn(0).await;
    assert!(
        page.status == 400 && page.body.contains("too many of your sign-ins are under way"),
        "{}",
        page.body
    );
    assert_eq!(
        s.fake.token_requests().len(),
        sent,
        "refused before its code was sent"
    );
    // Anyone else signs in as ever.
    assert_eq!(s.sign_in_as("alice").await.status, 200);
}

#[tokio::test]
async fn the_issuers_redirect_is_used_once_before_its_code_is_exchanged() {
    let s = setup().await;
    let (to_issuer, cookie) = s.open(&s.link("alice").await.1).await;
    let back = s.fake.login_as(&to_issuer, "alice");
    assert_eq!(s.callback(&back, Some(&cookie)).await.status, 302);
    let sent = s.fake.token_requests().len();
    let page = s.callback(&back, Some(&cookie)).await;
    assert!(
        page.status == 400 && page.body.contains("used already"),
        "{}",
        page.body
    );
    assert_eq!(
        s.fake.token_requests().len(),
        sent,
        "the replayed code was not sent"
    );
    // Without the browser's cookie, nothing is spent nor sent either.
    let (to_issuer, cookie) = s.open(&s.link("alice").await.1).await;
    let back = s.fake.login_as(&to_issuer, "alice");
    assert_eq!(s.callback(&back, None).await.status, 403);
    assert_eq!(s.fake.token_requests().len(), sent);
    assert_eq!(s.callback(&back, Some(&cookie)).await.status, 302);
}

#[tokio::test]
async fn forged_expired_replayed_and_swapped_states_are_refused() {
    let s = setup().await;
    let find = s.lookup();
    // Not a link, a forged one, one of another kind.
    for q in ["", "t=", "t=v1.k1.AAAA", "x=1", "t=a&t=b"] {
        let page = s.sign_in.start(q, &find).await;
        assert_eq!(page.status, 400, "{q}: {}", page.body);
        assert!(page.location.is_none() && page.cookies.is_empty());
    }
    let huge = format!("t={}", "A".repeat(20_000));
    assert_eq!(s.sign_in.start(&huge, &find).await.status, 400);
    // An expired ticket.
    let ring = s.sign_in.ring().unwrap();
    let mut t = ticket::Ticket::new(&s.subject("alice"), "notes", "n".into());
    t.e = ticket::now() - 1;
    let sealed = ticket::seal(&ring, ticket::TICKET_AAD, &t).unwrap();
    let page = s.sign_in.start(&format!("t={sealed}"), &find).await;
    assert!(
        page.status == 400 && page.body.contains("has expired"),
        "{}",
        page.body
    );
    // A ticket for an upstream no longer configured.
    let t = ticket::Ticket::new(&s.subject("alice"), "gone", "n2".into());
    let sealed = ticket::seal(&ring, ticket::TICKET_AAD, &t).unwrap();
    assert_eq!(s.sign_in.start(&format!("t={sealed}"), &find).await.status, 404);

    // A link used twice: the second binding is refused.
    let (_, q) = s.link("alice").await;
    let (first, c1) = s.open(&q).await;
    let (second, c2) = s.open(&q).await;
    let ok = s.callback(&s.fake.login_as(&first, "alice"), Some(&c1)).await;
    assert_eq!(ok.status, 302);
    let again = s.callback(&s.fake.login_as(&second, "alice"), Some(&c2)).await;
    assert!(
        again.status == 400 && again.body.contains("used already"),
        "{}",
        again.body
    );

    // The flow's state presented as a browser state, and a browser state as the flow's.
    let flow_state = params(ok.location.as_deref().unwrap())["state"].clone();
    let page = s
        .callback(&format!("code=c&state=b.{flow_state}"), Some(&c1))
        .await;
    assert_eq!(page.status, 400, "{}", page.body);
    let (to_issuer, c3) = s.open(&s.link("alice").await.1).await;
    let browser_state = params(&to_issuer)["state"].clone();
    let page = s
        .callback(&format!("code=c&state={}", &browser_state[2..]), Some(&c3))
        .await;
    assert_eq!(page.status, 400, "{}", page.body);
    // A callback with no sign-in in flight, or no state at all.
    for q in [
        "",
        "code=c",
        "code=c&state=nothing",
        "error=access_denied&state=x",
        "state=%zz",
    ] {
        let page = s.callback(q, None).await;
        assert_eq!(page.status, 400, "{q}: {}", page.body);
    }
    // The redirect of the issuer replayed after it bound the browser: refused.
    let back = s.fake.login_as(&to_issuer, "alice");
    assert_eq!(s.callback(&back, Some(&c3)).await.status, 302);
    assert_eq!(s.callback(&back, Some(&c3)).await.status, 400);
    // Mix-up at the issuer's step: the redirect names another issuer.
    let (to_issuer, c4) = s.open(&s.link("alice").await.1).await;
    let back = s.fake.login_as(&to_issuer, "alice");
    let mixed = back.replace("iss=", "iss=https%3A%2F%2Fevil.example&was=");
    let page = s.callback(&mixed, Some(&c4)).await;
    assert!(
        page.status == 400 && page.body.contains("another identity provider"),
        "{}",
        page.body
    );
    assert_eq!(s.metrics.sign_ins("notes", "issuer"), 1);
    assert!(!s.held("alice").await, "nothing stored by any of it");
}

#[tokio::test]
async fn a_ring_rotation_applies_on_the_next_use_and_no_ring_refuses() {
    let s = setup().await;
    let page = s.sign_in_as("alice").await;
    assert_eq!(page.status, 200, "{}", page.body);
    // A new first key, the old one kept: the token still opens (and is re-sealed).
    set_ring(&s.secrets, &ring_text(&[("k2", 2), ("k1", 1)]));
    assert!(matches!(
        s.sign_in.authorize(&s.subject("alice"), "notes", &s.id).await,
        CallAuth::Bearer(_)
    ));
    // A ring without the key the token is sealed under: it reads as absent, a link.
    set_ring(&s.secrets, &ring_text(&[("k3", 3)]));
    assert!(matches!(
        s.sign_in.authorize(&s.subject("alice"), "notes", &s.id).await,
        CallAuth::SignIn(_)
    ));
    // No ring, or a broken one: calls and pages say so, naming no key.
    set_ring(&s.secrets, "not a ring");
    let CallAuth::Refused(why) = s.sign_in.authorize(&s.subject("alice"), "notes", &s.id).await else {
        panic!("not refused");
    };
    assert!(why.contains("key ring (secret `signin` key `keys`)"), "{why}");
    let find = s.lookup();
    assert_eq!(s.sign_in.start("t=x", &find).await.status, 502);
}

#[tokio::test]
async fn an_expired_token_is_refreshed_and_a_refused_one_forgotten() {
    let s = setup().await;
    assert_eq!(s.sign_in_as("alice").await.status, 200);
    let alice = s.subject("alice");
    let v = s.sign_in.vault();
    let mut t = v.get(&alice, "notes").await.unwrap().unwrap();
    t.expires_at = Some(std::time::SystemTime::now());
    v.put(&alice, "notes", &t).await.unwrap();
    let CallAuth::Bearer(super::Bearer { header: fresh, .. }) =
        s.sign_in.authorize(&alice, "notes", &s.id).await
    else {
        panic!("not refreshed");
    };
    assert_ne!(fresh.to_str().unwrap(), format!("Bearer {}", t.access_token));
    assert_eq!(s.metrics.refreshes("notes", "ok"), 1);
    // The upstream refused the fresh token: refreshed once more.
    let CallAuth::Bearer(super::Bearer { header: again, .. }) =
        s.sign_in.rejected(&alice, "notes", &s.id, &fresh).await
    else {
        panic!("not refreshed");
    };
    assert_ne!(again, fresh);
    // Refused again: forgotten, and a link; but a token the call did not send (a newer one)
    // is kept.
    assert!(matches!(
        s.sign_in.refused_again(&alice, "notes", &fresh).await,
        CallAuth::Refused(_)
    ));
    assert!(s.held("alice").await);
    assert!(matches!(
        s.sign_in.refused_again(&alice, "notes", &again).await,
        CallAuth::SignIn(_)
    ));
    assert!(!s.held("alice").await);
    // Refusals that are not about the grant or the client (a scope, a malformed request)
    // keep the tokens for the next try.
    assert_eq!(s.sign_in_as("alice").await.status, 200);
    for (status, error) in [
        (400, "invalid_request"),
        (400, "invalid_scope"),
        (400, "unauthorized_client"),
        (503, "temporarily_unavailable"),
    ] {
        s.fake
            .set(|k| k.token_answer = Some((status, json!({"error": error}).to_string())));
        let held = v.get(&alice, "notes").await.unwrap().unwrap();
        let sent = http::HeaderValue::try_from(format!("Bearer {}", held.access_token)).unwrap();
        assert!(
            matches!(
                s.sign_in.rejected(&alice, "notes", &s.id, &sent).await,
                CallAuth::Refused(_)
            ),
            "{error}"
        );
        assert!(s.held("alice").await, "{error}: kept");
    }
    assert_eq!(s.metrics.refreshes("notes", "failed"), 4);
    // A refresh token the server no longer knows: revoked, a link.
    s.fake
        .set(|k| k.token_answer = Some((400, json!({"error": "invalid_grant"}).to_string())));
    let held = v.get(&alice, "notes").await.unwrap().unwrap();
    let sent = http::HeaderValue::try_from(format!("Bearer {}", held.access_token)).unwrap();
    assert!(matches!(
        s.sign_in.rejected(&alice, "notes", &s.id, &sent).await,
        CallAuth::SignIn(_)
    ));
    assert_eq!(s.metrics.refreshes("notes", "revoked"), 1);
    // An administrator revokes every upstream of a user.
    s.fake.set(|k| k.token_answer = None);
    assert_eq!(s.sign_in_as("alice").await.status, 200);
    assert_eq!(s.sign_in.revoke(&alice, None, &s.ids()).await.unwrap(), 1);
    assert_eq!(
        s.sign_in.revoke(&alice, Some("notes"), &s.ids()).await.unwrap(),
        0
    );
}

#[tokio::test]
async fn a_client_the_server_no_longer_knows_forgets_the_tokens_and_the_registration() {
    let s = setup().await;
    let alice = s.subject("alice");
    let v = s.sign_in.vault();
    assert_eq!(s.sign_in_as("alice").await.status, 200);
    assert_eq!(s.fake.registrations(), 1);
    // The server dropped the client it registered: every refresh answers invalid_client.
    s.fake
        .set(|k| k.token_answer = Some((401, json!({"error": "invalid_client"}).to_string())));
    let held = v.get(&alice, "notes").await.unwrap().unwrap();
    let sent = http::HeaderValue::try_from(format!("Bearer {}", held.access_token)).unwrap();
    assert!(matches!(
        s.sign_in.rejected(&alice, "notes", &s.id, &sent).await,
        CallAuth::SignIn(_)
    ));
    assert!(!s.held("alice").await, "forgotten: no refresh will ever work");
    assert_eq!(s.metrics.refreshes("notes", "revoked"), 1);
    // The next call gets a link at once, and the next sign-in registers again.
    assert!(matches!(
        s.sign_in.authorize(&alice, "notes", &s.id).await,
        CallAuth::SignIn(_)
    ));
    s.fake.set(|k| k.token_answer = None);
    assert_eq!(s.sign_in_as("alice").await.status, 200);
    assert_eq!(s.fake.registrations(), 2);
    // An expired token refreshed at a server that answers invalid_client: the same.
    let mut t = v.get(&alice, "notes").await.unwrap().unwrap();
    t.expires_at = Some(std::time::SystemTime::now());
    v.put(&alice, "notes", &t).await.unwrap();
    s.fake
        .set(|k| k.token_answer = Some((401, json!({"error": "invalid_client"}).to_string())));
    assert!(matches!(
        s.sign_in.authorize(&alice, "notes", &s.id).await,
        CallAuth::SignIn(_)
    ));
    assert!(!s.held("alice").await);
}

#[tokio::test]
async fn a_token_goes_only_to_the_url_and_server_it_was_obtained_for() {
    let s = setup().await;
    let alice = s.subject("alice");
    // What a call sends, by upstream configuration.
    let send = |id: Identity| {
        let (sign_in, alice) = (&s.sign_in, alice.clone());
        async move {
            match sign_in.authorize(&alice, "notes", &id).await {
                CallAuth::Bearer(h) => Some(h.header),
                CallAuth::SignIn(_) => None,
                CallAuth::Refused(e) => panic!("{e}"),
            }
        }
    };
    let moved = |url: String, issuer: Option<String>| Identity {
        audience: url.into(),
        issuer: issuer.map(Into::into),
        ..s.id.clone()
    };
    let elsewhere = [
        // Another path, host or port, or the same URL with another server pinned.
        moved(format!("{}/other/mcp", s.fake.base), None),
        moved(s.fake.upstream_url().replace("127.0.0.1", "localhost"), None),
        moved("https://evil.example/mcp".into(), None),
        moved(s.fake.upstream_url(), Some(s.fake.issuer("/b"))),
    ];
    for to in elsewhere {
        assert_eq!(s.sign_in_as("alice").await.status, 200);
        // Warm (read once) and cold alike: the reloaded configuration gets a link.
        assert!(send(s.id.clone()).await.is_some());
        assert_eq!(send(to.clone()).await, None, "{}", to.audience);
        assert!(!s.held("alice").await, "forgotten: {}", to.audience);
        assert_eq!(send(s.id.clone()).await, None, "nothing left to send");
        // After a 401, whether the token refused is the one held (a refresh) or not.
        for refused in ["held", "other"] {
            assert_eq!(s.sign_in_as("alice").await.status, 200);
            let requests = s.fake.token_requests().len();
            let held = s.sign_in.vault().get(&alice, "notes").await.unwrap().unwrap();
            let sent = match refused {
                "held" => format!("Bearer {}", held.access_token),
                _ => "Bearer at-0".to_owned(),
            };
            let sent = http::HeaderValue::try_from(sent).unwrap();
            assert!(matches!(
                s.sign_in.rejected(&alice, "notes", &to, &sent).await,
                CallAuth::SignIn(_)
            ));
            assert_eq!(s.fake.token_requests().len(), requests, "no refresh was sent");
            assert!(!s.held("alice").await);
        }
    }
    // The same URL spelled otherwise (case of scheme and host), or pinned to its own server.
    assert_eq!(s.sign_in_as("alice").await.status, 200);
    let same = moved(s.fake.upstream_url().replace("http://", "HTTP://"), None);
    assert!(send(same).await.is_some());
    assert!(
        send(moved(s.fake.upstream_url(), Some(s.fake.issuer("/as"))))
            .await
            .is_some()
    );
}

#[tokio::test]
async fn signing_out_and_revoking_revoke_at_the_authorization_server_best_effort() {
    let s = setup().await;
    let alice = s.subject("alice");
    assert_eq!(s.sign_in_as("alice").await.status, 200);
    let held = s.sign_in.vault().get(&alice, "notes").await.unwrap().unwrap();
    assert!(s.sign_in.sign_out(&alice, "notes", &s.ids()).await.unwrap());
    // The refresh token, then the access token, as the client that obtained them.
    let revoked = s.fake.knobs.lock().unwrap().revoked.clone();
    let rt = held.refresh_token.clone().unwrap();
    assert_eq!(
        revoked
            .iter()
            .map(|(t, hint, _)| (t.as_str(), hint.as_str()))
            .collect::<Vec<_>>(),
        [
            (rt.as_str(), "refresh_token"),
            (held.access_token.as_str(), "access_token")
        ]
    );
    assert_eq!(s.metrics.revocations("notes", "ok"), 1);
    // The server no longer refreshes it.
    let up = s.sign_in.upstream("notes", &s.id).unwrap();
    let e = s.sign_in.flow.refresh(&held, &up).await.unwrap_err();
    assert!(matches!(e, flow::Error::InvalidGrant(_)), "{e}");
    // A server that refuses (or is down): forgotten here all the same, counted.
    assert_eq!(s.sign_in_as("alice").await.status, 200);
    s.fake.set(|k| k.revoke_answer = Some((503, "{}".into())));
    assert!(s.sign_in.sign_out(&alice, "notes", &s.ids()).await.unwrap());
    assert!(!s.held("alice").await);
    assert_eq!(s.metrics.revocations("notes", "failed"), 1);
    // An administrator's revocation of every upstream revokes too, by what each token is
    // bound to.
    s.fake.set(|k| k.revoke_answer = None);
    assert_eq!(s.sign_in_as("alice").await.status, 200);
    assert_eq!(s.sign_in.revoke(&alice, None, &s.ids()).await.unwrap(), 1);
    assert_eq!(s.metrics.revocations("notes", "ok"), 2);
    // A server whose metadata names no revocation endpoint: forgotten here only.
    let t = setup().await;
    let mut m = t.fake.meta("/as");
    m.as_object_mut().unwrap().remove("revocation_endpoint");
    t.fake.doc("/.well-known/oauth-authorization-server/as", 200, m);
    assert_eq!(t.sign_in_as("alice").await.status, 200);
    assert!(
        t.sign_in
            .sign_out(&t.subject("alice"), "notes", &t.ids())
            .await
            .unwrap()
    );
    assert_eq!(t.metrics.revocations("notes", "none"), 1);
    assert!(t.fake.knobs.lock().unwrap().revoked.is_empty());
}

/// The tokens the fake revoked: each token and its hint.
fn revoked(s: &Setup) -> Vec<(String, String)> {
    let k = s.fake.knobs.lock().unwrap();
    k.revoked.iter().map(|(t, h, _)| (t.clone(), h.clone())).collect()
}

#[tokio::test]
async fn tokens_a_refresh_obtains_after_a_sign_out_are_revoked() {
    let s = setup().await;
    let alice = s.subject("alice");
    let v = s.sign_in.vault();
    assert_eq!(s.sign_in_as("alice").await.status, 200);
    let mut old = v.get(&alice, "notes").await.unwrap().unwrap();
    old.expires_at = Some(std::time::SystemTime::now());
    v.put(&alice, "notes", &old).await.unwrap();
    // The refresh's answer (a rotated refresh token) is made, then held back while alice
    // signs out.
    let gate = crate::oauth::flow::tests::Gate::new();
    s.fake.set(|k| {
        k.rotate = true;
        k.token_gate = Some(gate.clone());
    });
    let call = s.sign_in.authorize(&alice, "notes", &s.id);
    let sign_out = async {
        gate.arrived.acquire().await.unwrap().forget();
        assert!(s.sign_in.sign_out(&alice, "notes", &s.ids()).await.unwrap());
        gate.release.add_permits(1);
    };
    let (auth, ()) = tokio::join!(call, sign_out);
    assert!(matches!(auth, CallAuth::SignIn(_)), "{auth:?}");
    assert!(!s.held("alice").await, "the sign-out stands");
    s.sign_in.revocations_done().await;
    let all = revoked(&s);
    let rt = old.refresh_token.clone().unwrap();
    assert_eq!(
        all[..2],
        [
            (rt.clone(), "refresh_token".to_owned()),
            (old.access_token.clone(), "access_token".to_owned())
        ],
        "the sign-out's"
    );
    // Then, off the call's path, the tokens the refresh obtained and nothing holds.
    assert_eq!(all.len(), 4, "{all:?}");
    assert_eq!(all[2].1, "refresh_token");
    assert_eq!(all[3].1, "access_token");
    assert!(all[2].0 != rt && all[3].0 != old.access_token, "{all:?}");
    assert_eq!(s.metrics.revocations("notes", "ok"), 2);
}

#[tokio::test]
async fn a_token_forgotten_because_its_upstream_moved_is_revoked() {
    let s = setup().await;
    let alice = s.subject("alice");
    assert_eq!(s.sign_in_as("alice").await.status, 200);
    let held = s.sign_in.vault().get(&alice, "notes").await.unwrap().unwrap();
    let moved = Identity {
        audience: format!("{}/other/mcp", s.fake.base).into(),
        ..s.id.clone()
    };
    assert!(matches!(
        s.sign_in.authorize(&alice, "notes", &moved).await,
        CallAuth::SignIn(_)
    ));
    assert!(!s.held("alice").await);
    s.sign_in.revocations_done().await;
    assert_eq!(
        revoked(&s),
        [
            (held.refresh_token.clone().unwrap(), "refresh_token".to_owned()),
            (held.access_token.clone(), "access_token".to_owned())
        ]
    );
    assert_eq!(s.metrics.revocations("notes", "ok"), 1);
    // A client configured for the server still pinned revokes there as itself.
    let t = setup().await;
    t.fake.set(|k| {
        k.clients.insert("pre".into(), Some(BROWSER_SECRET.into()));
    });
    let pinned = Identity {
        issuer: Some(t.fake.issuer("/as").into()),
        client: Some(crate::spec::identity::UserClient {
            id: "pre".into(),
            secret: Some(SecretRef {
                name: "signin".into(),
                key: "browser".into(),
            }),
        }),
        ..t.id.clone()
    };
    let t_alice = t.subject("alice");
    let (to_issuer, cookie) = {
        let CallAuth::SignIn(l) = t.sign_in.authorize(&t_alice, "notes", &pinned).await else {
            panic!("no link")
        };
        t.open(l.url.split_once('?').unwrap().1).await
    };
    let find = |name: &str| (name == "notes").then(|| pinned.clone());
    let bound = t
        .sign_in
        .callback(&t.fake.login_as(&to_issuer, "alice"), Some(&cookie), &find)
        .await;
    assert_eq!(bound.status, 302, "{}", bound.body);
    let cookie = bound.cookies[0].split(';').next().unwrap().to_owned();
    let back = t.fake.login(bound.location.as_deref().unwrap());
    assert_eq!(t.sign_in.callback(&back, Some(&cookie), &find).await.status, 200);
    assert_eq!(
        t.sign_in
            .vault()
            .get(&t_alice, "notes")
            .await
            .unwrap()
            .unwrap()
            .client_id,
        "pre"
    );
    let elsewhere = Identity {
        audience: format!("{}/other/mcp", t.fake.base).into(),
        ..pinned.clone()
    };
    assert!(matches!(
        t.sign_in.authorize(&t_alice, "notes", &elsewhere).await,
        CallAuth::SignIn(_)
    ));
    t.sign_in.revocations_done().await;
    let basic = format!("Basic {}", STANDARD.encode(format!("pre:{BROWSER_SECRET}")));
    let k = t.fake.knobs.lock().unwrap();
    assert_eq!(k.revoked.len(), 2, "{:?}", k.revoked);
    assert!(
        k.revoked.iter().all(|(_, _, auth)| *auth == basic),
        "{:?}",
        k.revoked
    );
}

#[tokio::test]
async fn the_page_after_a_sign_in_names_only_a_plain_short_account_as_the_server_reports_it() {
    let issuer_of = |s: &Setup| s.fake.issuer("/as");
    let id_token = |claims: serde_json::Value| {
        format!(
            "e30.{}.sig",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims.to_string())
        )
    };
    let long = format!("{}@example.com", "a".repeat(53));
    assert_eq!(long.len(), 65);
    let cases = [
        (
            json!({"preferred_username": "alice.smith-2"}),
            Some("alice.smith-2"),
        ),
        (
            json!({"email": "a.b+tag_1@example.com"}),
            Some("a.b+tag_1@example.com"),
        ),
        (json!({}), Some("f3a1")),
        (
            json!({"preferred_username": "<img src=x onerror=alert(1)>"}),
            None,
        ),
        (
            json!({"preferred_username": "Your account is locked: call +1 555 0100"}),
            None,
        ),
        (json!({"preferred_username": "\u{430}lice"}), None),
        (json!({"preferred_username": "alice\u{202e}moc.live"}), None),
        (json!({"email": long.clone()}), None),
        (
            json!({"preferred_username": "", "email": "ok@example.com"}),
            Some("ok@example.com"),
        ),
    ];
    for (extra, shown) in cases {
        let s = setup().await;
        let (redirect, cookie) = up_to_the_upstream(&s, "alice").await;
        let mut claims = json!({"iss": issuer_of(&s), "aud": "client-1", "sub": "f3a1"});
        for (k, v) in extra.as_object().unwrap() {
            claims[k] = v.clone();
        }
        let answer = json!({"access_token": "at-x", "token_type": "Bearer", "id_token": id_token(claims)});
        s.fake.set(|k| k.token_answer = Some((200, answer.to_string())));
        let page = s.callback(&redirect, Some(&cookie)).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let held = s
            .sign_in
            .vault()
            .get(&s.subject("alice"), "notes")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(held.account.as_deref(), shown, "{extra}");
        match shown {
            Some(a) => assert!(
                page.body
                    .contains(&format!("Its authorization server reports the account {a}.")),
                "{}",
                page.body
            ),
            None => assert!(
                !page.body.contains("account ")
                    && !page.body.contains("img")
                    && !page.body.contains("555")
                    && page
                        .body
                        .contains("You are signed in to notes. Return to your client"),
                "{}",
                page.body
            ),
        }
    }
}

#[tokio::test]
async fn the_client_metadata_document_is_served_only_over_https() {
    let s = setup().await;
    assert!(s.sign_in.client_metadata().is_none(), "http: no document");
    let cfg = SignInConfig {
        url: "https://mcp.example.com/tools/".into(),
        keys: s.sign_in.keys.clone(),
        client_id: BROWSER.into(),
        client_secret: None,
        vault: vault::Options::default(),
        backend: vault::Backend::Memory,
        local_servers: true,
    };
    let verifier = Arc::new(FakeIdTokens(s.fake.issuer("/as")));
    let https = SignIn::new(
        cfg,
        HttpClient::new(),
        s.secrets.clone(),
        verifier,
        s.metrics.clone(),
        None,
    )
    .unwrap();
    let doc = https.client_metadata().unwrap();
    assert_eq!(
        doc["client_id"],
        "https://mcp.example.com/tools/oauth/client.json"
    );
    assert_eq!(
        doc["redirect_uris"],
        json!(["https://mcp.example.com/tools/oauth/callback"])
    );
    assert_eq!(doc["token_endpoint_auth_method"], "none");
    assert_eq!(
        https.cookie("__Host-quiver-oauth-x", Some("v")),
        "__Host-quiver-oauth-x=v; Path=/; Max-Age=600; HttpOnly; SameSite=Lax; Secure"
    );
}

#[tokio::test]
async fn a_loopback_url_does_not_turn_the_guard_of_discovered_servers_off() {
    let s = setup().await;
    assert!(!s.sign_in.flow.config().guard_discovered, "the tests' flag");
    let cfg = SignInConfig {
        url: "http://127.0.0.1:9/".into(),
        keys: s.sign_in.keys.clone(),
        client_id: BROWSER.into(),
        client_secret: None,
        vault: vault::Options::default(),
        backend: vault::Backend::Memory,
        local_servers: false,
    };
    let verifier = Arc::new(FakeIdTokens(s.fake.issuer("/as")));
    let local = SignIn::new(
        cfg,
        HttpClient::new(),
        s.secrets.clone(),
        verifier,
        s.metrics.clone(),
        None,
    )
    .unwrap();
    assert!(local.flow.config().guard_discovered);
    // Its sign-ins refuse the fake's servers on this host, a name other than the upstream's.
    let port = s.fake.base.rsplit(':').next().unwrap();
    s.fake.doc(
        "/.well-known/oauth-protected-resource/mcp",
        200,
        json!({"resource": s.fake.upstream_url(), "authorization_servers": [format!("http://localhost:{port}/as")]}),
    );
    let up = local.upstream("notes", &s.id).unwrap();
    let e = local.flow.begin("i|alice", &up, None, "b").await.unwrap_err();
    assert!(e.to_string().contains("may not choose"), "{e}");
}

#[tokio::test]
async fn this_servers_own_identity_provider_is_called_wherever_its_metadata_says() {
    let s = setup().await;
    // The identity provider of --auth-issuer (the fake's `/b`) names its token endpoint on
    // another origin of this host: a guarded call would refuse it.
    let port = s.fake.base.rsplit(':').next().unwrap();
    let mut m = s.fake.meta("/b");
    m["token_endpoint"] = json!(format!("http://localhost:{port}/b/token"));
    s.fake.doc("/.well-known/oauth-authorization-server/b", 200, &m);
    let cfg = SignInConfig {
        url: "http://127.0.0.1:9/".into(),
        keys: s.sign_in.keys.clone(),
        client_id: BROWSER.into(),
        client_secret: s.sign_in.client_secret.clone(),
        vault: vault::Options::default(),
        backend: vault::Backend::Memory,
        local_servers: false,
    };
    let verifier = Arc::new(FakeIdTokens(s.fake.issuer("/b")));
    let guarded = SignIn::new(
        cfg,
        HttpClient::new(),
        s.secrets.clone(),
        verifier,
        s.metrics.clone(),
        None,
    )
    .unwrap();
    assert!(guarded.flow.config().guard_discovered);
    let alice = format!("{}|alice", s.fake.issuer("/b"));
    let CallAuth::SignIn(link) = guarded.authorize(&alice, "notes", &s.id).await else {
        panic!("no link");
    };
    let find = s.lookup();
    let page = guarded.start(link.url.split_once('?').unwrap().1, &find).await;
    assert_eq!(page.status, 302, "{}", page.body);
    let cookie = page.cookies[0].split(';').next().unwrap().to_owned();
    let back = s.fake.login_as(page.location.as_deref().unwrap(), "alice");
    let bound = guarded.callback(&back, Some(&cookie), &find).await;
    assert_eq!(bound.status, 302, "{}", bound.body);
    assert_eq!(s.fake.knobs.lock().unwrap().token_paths, ["/b/token"]);
    // (Servers an upstream's metadata names there are still refused: see
    // `a_loopback_url_does_not_turn_the_guard_of_discovered_servers_off`.)
}

#[test]
fn the_public_url_must_be_https_or_loopback() {
    assert_eq!(
        check_url("https://mcp.example.com/").unwrap(),
        "https://mcp.example.com"
    );
    assert_eq!(
        check_url("http://127.0.0.1:8080").unwrap(),
        "http://127.0.0.1:8080"
    );
    assert_eq!(
        check_url("https://gw.example/tools/").unwrap(),
        "https://gw.example/tools"
    );
    for bad in [
        "http://mcp.example.com",
        "mcp.example.com",
        "https://x/?a=1",
        "https://x/#f",
        "ftp://x",
    ] {
        assert!(check_url(bad).is_err(), "{bad}");
    }
    let c = crate::spec::caller::Credential::new("t", json!({"iss": "https://idp", "sub": "alice"}));
    assert_eq!(subject_of(&c).as_deref(), Some("https://idp|alice"));
    let none = crate::spec::caller::Credential::new("t", json!({"sub": "alice"}));
    assert_eq!(subject_of(&none), None);
    let long = crate::spec::caller::Credential::new("t", json!({"iss": "i", "sub": "x".repeat(2000)}));
    assert_eq!(subject_of(&long), None);
}
