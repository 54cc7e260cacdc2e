//! The callback's refusals: every way a redirect can be forged, replayed, mixed up or
//! answered badly, against the in-test servers of the flow's tests.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::json;

use super::super::authorize::{STATE_AAD, State, now_secs};
use super::super::tests::{ALICE, BH, CALLBACK, Fake, config, flow_with, keys, signed_in, upstream};
use super::super::wire::{form, parse_query};
use super::super::*;
use super::PRUNE_PER_USE;

/// The redirect query with `key` set to `value` (`None`: removed).
fn with(query: &str, key: &str, value: Option<&str>) -> String {
    let mut p: Vec<(String, String)> = parse_query(query)
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k != key)
        .collect();
    if let Some(v) = value {
        p.push((key.into(), v.into()));
    }
    let pairs: Vec<(&str, &str)> = p.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    form(&pairs)
}

fn param(query: &str, key: &str) -> String {
    let p: HashMap<String, String> = parse_query(query).unwrap().into_iter().collect();
    p[key].clone()
}

/// A state as this server would seal it, with `edit` applied.
fn sealed_state(fake: &Fake, edit: impl FnOnce(&mut State)) -> String {
    let issuer = fake.issuer("/as");
    let mut s = State {
        version: 1,
        subject: ALICE.into(),
        upstream: "notes".into(),
        verifier: "v".repeat(43),
        nonce: "n-1".into(),
        created: now_secs(),
        expiry: now_secs() + 600,
        redirect_uri: CALLBACK.into(),
        token_endpoint: format!("{issuer}/token"),
        issuer,
        pinned: false,
        iss_required: true,
        resource: fake.upstream_url(),
        client: Client {
            client_id: "client-1".into(),
            client_secret: None,
            auth: AuthMethod::None,
        },
        registered: false,
        scope: None,
        browser: BH.into(),
    };
    edit(&mut s);
    keys(1).seal(STATE_AAD, &serde_json::to_vec(&s).unwrap()).unwrap()
}

#[tokio::test]
async fn forged_altered_expired_foreign_and_replayed_states_are_refused() {
    let fake = Fake::start().await;
    let flow = flow_with(config());
    let up = upstream(&fake);
    let guard = MemoryGuard::default();
    let redirect = signed_in(&flow, &fake, &up).await;
    let state = param(&redirect, "state");
    let (head, body) = state.rsplit_once('.').unwrap();
    let mut raw = URL_SAFE_NO_PAD.decode(body).unwrap();
    raw[20] ^= 1;
    let altered = format!("{head}.{}", URL_SAFE_NO_PAD.encode(&raw));
    let other_ring = keys(2).seal(STATE_AAD, b"{}").unwrap();
    let wrong_place = keys(1)
        .seal(b"alice|notes", &keys(1).open(STATE_AAD, &state).unwrap().0)
        .unwrap();
    let cases = [
        (with(&redirect, "state", None), "is missing"),
        (with(&redirect, "state", Some("garbage")), "forged or altered"),
        (with(&redirect, "state", Some(&altered)), "forged or altered"),
        (
            with(&redirect, "state", Some(&other_ring)),
            "no longer in the ring",
        ),
        (with(&redirect, "state", Some(&wrong_place)), "forged or altered"),
        (
            with(&redirect, "state", Some(&"v1.k1.".repeat(2000))),
            "is not one this server began",
        ),
        (
            with(
                &redirect,
                "state",
                Some(&keys(1).seal(STATE_AAD, b"[1]").unwrap()),
            ),
            "is not one this server began",
        ),
        (
            with(
                &redirect,
                "state",
                Some(&sealed_state(&fake, |s| s.expiry = now_secs() - 1)),
            ),
            "has expired",
        ),
        (
            with(&redirect, "state", Some(&sealed_state(&fake, |s| s.version = 2))),
            "layout",
        ),
    ];
    for (query, want) in cases {
        let e = flow.finish(&query, &guard, &[BH]).await.unwrap_err();
        assert!(matches!(e, Error::State(_)), "{want}: {e}");
        assert!(e.to_string().contains(want), "{want}: {e}");
    }
    assert!(fake.token_requests().is_empty());
    // The real one works once; its replay is refused before the code is sent again.
    flow.finish(&redirect, &guard, &[BH]).await.unwrap();
    let e = flow.finish(&redirect, &guard, &[BH]).await.unwrap_err();
    assert_eq!(e, Error::State("was used already (or cannot be marked used)"));
    assert_eq!(fake.token_requests().len(), 1);
}

#[tokio::test]
async fn the_callback_url_is_the_configured_one_never_one_a_request_names() {
    let fake = Fake::start().await;
    let up = upstream(&fake);
    // A state begun under another callback URL (the same keys) is not finished here.
    let mut other = config();
    other.redirect_uri = "http://127.0.0.1:9/elsewhere".into();
    let redirect = signed_in(&flow_with(other), &fake, &up).await;
    let e = flow_with(config())
        .finish(&redirect, &MemoryGuard::default(), &[BH])
        .await
        .unwrap_err();
    assert_eq!(e, Error::State("was begun for another callback URL"));
    // A redirect naming its own `redirect_uri` changes nothing: the code is exchanged with
    // the configured one.
    let flow = flow_with(config());
    let redirect = signed_in(&flow, &fake, &up).await;
    let redirect = with(&redirect, "redirect_uri", Some("https://evil.example/steal"));
    flow.finish(&redirect, &MemoryGuard::default(), &[BH])
        .await
        .unwrap();
    let (sent, _) = fake.token_requests().pop().unwrap();
    assert_eq!(param(&sent, "redirect_uri"), CALLBACK);
    // An authorization endpoint that carries request parameters of its own is refused.
    let mut m = fake.meta("/as");
    m["authorization_endpoint"] = json!(format!(
        "{}/authorize?redirect_uri=https://evil.example",
        fake.issuer("/as")
    ));
    fake.doc("/.well-known/oauth-authorization-server/as", 200, m);
    let e = flow_with(config()).begin(ALICE, &up, None, BH).await.unwrap_err();
    assert!(e.to_string().contains("already carries a parameter"), "{e}");
}

#[tokio::test]
async fn the_issuer_of_the_redirect_must_be_the_server_the_sign_in_began_at() {
    let fake = Fake::start().await;
    let flow = flow_with(config());
    let up = upstream(&fake);
    let guard = MemoryGuard::default();
    let redirect = signed_in(&flow, &fake, &up).await;
    // The server promised `iss` (RFC 9207): missing, refused.
    let e = flow
        .finish(&with(&redirect, "iss", None), &guard, &[BH])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Issuer(_)), "{e}");
    // Mix-up: an answer naming a second server (the upstream lists it too) is refused before
    // any code is sent anywhere.
    let e = flow
        .finish(&with(&redirect, "iss", Some(&fake.issuer("/b"))), &guard, &[BH])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Issuer(_)), "{e}");
    assert!(fake.token_requests().is_empty());
    flow.finish(&redirect, &guard, &[BH]).await.unwrap();

    // A server that does not promise `iss`: its absence is accepted, a wrong one is not.
    let mut m = fake.meta("/as");
    m.as_object_mut()
        .unwrap()
        .remove("authorization_response_iss_parameter_supported");
    fake.doc("/.well-known/oauth-authorization-server/as", 200, m);
    let flow = flow_with(config());
    let redirect = signed_in(&flow, &fake, &up).await;
    let e = flow
        .finish(&with(&redirect, "iss", Some(&fake.issuer("/b"))), &guard, &[BH])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Issuer(_)), "{e}");
    flow.finish(&with(&redirect, "iss", None), &guard, &[BH])
        .await
        .unwrap();
}

#[tokio::test]
async fn error_answers_and_malformed_redirects_are_refused_with_nothing_secret_in_the_message() {
    let fake = Fake::start().await;
    let flow = flow_with(config());
    let up = upstream(&fake);
    let guard = MemoryGuard::default();
    let redirect = signed_in(&flow, &fake, &up).await;
    let state = param(&redirect, "state");
    let code = param(&redirect, "code");
    let description = format!(
        "you said no\u{1b}[31m to {code} with {state} {}",
        "and on ".repeat(100)
    );
    let denied = form(&[
        ("error", "access_denied"),
        ("error_description", &description),
        ("state", &state),
        ("code", &code),
    ]);
    let e = flow.finish(&denied, &guard, &[BH]).await.unwrap_err();
    assert_eq!(
        e,
        Error::Denied("access_denied".into()),
        "only the code OAuth defines"
    );
    let unknown = form(&[("error", &description), ("state", &state)]);
    let e = flow.finish(&unknown, &guard, &[BH]).await.unwrap_err();
    assert_eq!(e, Error::Denied("an error code OAuth does not define".into()));
    // An error without a state this server began says nothing of the error.
    let e = flow
        .finish(&form(&[("error", "access_denied")]), &guard, &[BH])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::State(_)), "{e}");
    for (query, want) in [
        (format!("{redirect}&state=again"), "repeats"),
        (with(&redirect, "code", None), "no usable `code`"),
        (with(&redirect, "code", Some("has space")), "no usable `code`"),
        (
            with(&redirect, "code", Some(&"c".repeat(5000))),
            "no usable `code`",
        ),
        ("code=%zz".to_owned(), "not well-formed"),
    ] {
        let e = flow.finish(&query, &guard, &[BH]).await.unwrap_err();
        assert!(matches!(e, Error::Redirect(_)), "{query}: {e}");
        assert!(e.to_string().contains(want), "{e}");
    }
    // None of these used the state.
    flow.finish(&redirect, &guard, &[BH]).await.unwrap();
}

#[tokio::test]
async fn token_answers_that_cannot_be_used_are_refused() {
    let fake = Fake::start().await;
    let flow = flow_with(config());
    let up = upstream(&fake);
    let big = json!({"access_token": "a", "token_type": "Bearer", "pad": "x".repeat(MAX_ANSWER_BYTES)});
    let cases: Vec<(u16, String, &str)> = vec![
        (200, "not json".into(), "not a JSON object"),
        (200, "[]".into(), "not a JSON object"),
        (200, json!({"access_token": "a"}).to_string(), "not Bearer"),
        (
            200,
            json!({"access_token": "a", "token_type": "mac"}).to_string(),
            "not Bearer",
        ),
        (
            200,
            json!({"token_type": "Bearer"}).to_string(),
            "no usable `access_token`",
        ),
        (
            200,
            json!({"access_token": "a b", "token_type": "Bearer"}).to_string(),
            "no usable `access_token`",
        ),
        (
            200,
            json!({"access_token": "a".repeat(MAX_TOKEN_BYTES + 1), "token_type": "Bearer"}).to_string(),
            "no usable `access_token`",
        ),
        (
            200,
            json!({"access_token": "a", "token_type": "Bearer", "expires_in": -5}).to_string(),
            "expires_in",
        ),
        (
            200,
            json!({"access_token": "a", "token_type": "Bearer", "expires_in": "soon"}).to_string(),
            "expires_in",
        ),
        (
            200,
            json!({"access_token": "a", "token_type": "Bearer", "refresh_token": 5}).to_string(),
            "refresh_token",
        ),
        (200, big.to_string(), "larger than"),
        (500, "{}".into(), "answered 500"),
        (
            400,
            r#"{"error":"invalid_grant","error_description":"CODE"}"#.into(),
            "invalid_grant: [redacted]",
        ),
    ];
    for (status, answer, want) in cases {
        let redirect = signed_in(&flow, &fake, &up).await;
        let code = param(&redirect, "code");
        fake.set(|k| k.token_answer = Some((status, answer.replace("CODE", &code))));
        let e = flow
            .finish(&redirect, &MemoryGuard::default(), &[BH])
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{answer:.80}: {e}");
        assert!(!e.contains(&code), "{e}");
        let (sent, _) = fake.token_requests().pop().unwrap();
        assert!(!e.contains(&param(&sent, "code_verifier")), "{e}");
    }
    // Lifetimes: a string of digits is read, a very long one capped, none is unknown.
    for (expires_in, want) in [
        (json!("3600"), Some(3600)),
        (json!(90.5), Some(90)),
        (json!(u64::MAX), Some(token::MAX_LIFETIME.as_secs())),
        (json!(null), None),
    ] {
        let redirect = signed_in(&flow, &fake, &up).await;
        let answer = json!({"access_token": "a", "token_type": "BEARER", "expires_in": expires_in});
        fake.set(|k| k.token_answer = Some((200, answer.to_string())));
        let t = flow
            .finish(&redirect, &MemoryGuard::default(), &[BH])
            .await
            .unwrap()
            .tokens;
        let left = t.expires_at.map(|e| {
            e.duration_since(std::time::SystemTime::now())
                .unwrap_or_default()
                .as_secs()
        });
        // Within a second or two of what was said (time passes between the answer and here).
        assert_eq!(
            left.map(|l| want.unwrap() - l <= 2),
            want.map(|_| true),
            "{expires_in}"
        );
    }
}

#[tokio::test]
async fn the_upstream_account_is_taken_from_an_id_token_issued_to_this_client_only() {
    let fake = Fake::start().await;
    let flow = flow_with(config());
    let up = upstream(&fake);
    let id_token =
        |claims: serde_json::Value| format!("e30.{}.sig", URL_SAFE_NO_PAD.encode(claims.to_string()));
    let issuer = fake.issuer("/as");
    for (claims, want) in [
        (
            json!({"iss": issuer, "aud": "client-1", "sub": "carol@upstream"}),
            Some("carol@upstream"),
        ),
        (
            json!({"iss": issuer, "aud": ["x", "client-1"], "sub": "carol"}),
            Some("carol"),
        ),
        (
            json!({"iss": issuer, "aud": "someone-else", "sub": "mallory"}),
            None,
        ),
        (
            json!({"iss": "https://other.example", "aud": "client-1", "sub": "mallory"}),
            None,
        ),
        (json!({"iss": issuer, "aud": "client-1", "sub": "x\ny"}), None),
        // A name a person recognizes comes first.
        (
            json!({"iss": issuer, "aud": "client-1", "sub": "f3a1-77", "email": "carol@example.com", "preferred_username": "carol"}),
            Some("carol"),
        ),
        // A name that is not plain and short names no account (not the next claim either).
        (
            json!({"iss": issuer, "aud": "client-1", "sub": "f3a1-77", "email": "carol@example.com", "preferred_username": "ca\u{7}rol"}),
            None,
        ),
        (
            json!({"iss": issuer, "aud": "client-1", "sub": "f3a1-77", "preferred_username": "carol smith"}),
            None,
        ),
        (
            json!({"iss": issuer, "aud": "client-1", "sub": "f3a1-77", "email": format!("{}@example.com", "c".repeat(53))}),
            None,
        ),
        (
            json!({"iss": issuer, "aud": "client-1", "sub": "f3a1-77", "email": format!("{}@example.com", "c".repeat(52))}),
            Some("cccccccccccccccccccccccccccccccccccccccccccccccccccc@example.com"),
        ),
        (
            json!({"iss": issuer, "aud": "client-1", "sub": "f3a1-77", "preferred_username": ""}),
            Some("f3a1-77"),
        ),
    ] {
        let redirect = signed_in(&flow, &fake, &up).await;
        let answer =
            json!({"access_token": "a", "token_type": "Bearer", "id_token": id_token(claims.clone())});
        fake.set(|k| k.token_answer = Some((200, answer.to_string())));
        let t = flow
            .finish(&redirect, &MemoryGuard::default(), &[BH])
            .await
            .unwrap()
            .tokens;
        assert_eq!(t.account.as_deref(), want, "{claims}");
    }
}

#[tokio::test]
async fn the_memory_guard_is_bounded_and_refuses_when_full_rather_than_forget() {
    let guard = MemoryGuard::new(2);
    let long = Duration::from_secs(60);
    assert!(guard.first_use("a", "s", long).await);
    assert!(!guard.first_use("a", "s", long).await);
    assert!(guard.first_use("b", "s", Duration::ZERO).await);
    // Full, but "b" has expired: it makes room.
    assert!(guard.first_use("c", "s", long).await);
    assert!(!guard.first_use("d", "s", long).await);
    assert!(!guard.first_use("a", "s", long).await && !guard.first_use("c", "s", long).await);
    // A time to live past what a clock can say is kept, not a panic.
    assert!(MemoryGuard::new(1).first_use("x", "s", Duration::MAX).await);
}

#[test]
fn one_caller_holds_a_bounded_share_of_the_memory_guard() {
    let guard = MemoryGuard::bounded(100, 3);
    let t0 = Instant::now();
    let ttl = Duration::from_secs(1800);
    for i in 0..3 {
        assert!(guard.first_use_at(&format!("m{i}"), "idp|mallory", ttl, t0));
    }
    // Her fourth link (a fresh one) is refused, not remembered; others are not affected.
    assert!(!guard.first_use_at("m3", "idp|mallory", ttl, t0));
    assert!(guard.first_use_at("a0", "idp|alice", ttl, t0));
    assert_eq!(guard.len(), 4);
    // What she marked stays used; when it expires, her share is hers again.
    assert!(!guard.first_use_at("m0", "idp|mallory", ttl, t0 + Duration::from_secs(60)));
    let later = t0 + ttl + Duration::from_secs(1);
    assert!(!guard.first_use_at("a0", "idp|alice", ttl, t0 + Duration::from_secs(60)));
    assert!(guard.first_use_at("m3", "idp|mallory", ttl, later));
    assert!(guard.first_use_at("m4", "idp|mallory", ttl, later));
}

#[test]
fn the_memory_guard_forgets_a_bounded_number_of_expired_states_per_use_nearest_first() {
    let max = 1000;
    let guard = MemoryGuard::bounded(max, max);
    let t0 = Instant::now();
    // Full: half expire after a second, half after an hour, marked alternately.
    for i in 0..max {
        let ttl = Duration::from_secs(if i % 2 == 0 { 1 } else { 3600 });
        assert!(guard.first_use_at(&format!("n{i}"), &format!("idp|u{i}"), ttl, t0));
    }
    assert!(!guard.first_use_at("full", "idp|x", Duration::from_secs(60), t0));
    // Later, one use forgets at most PRUNE_PER_USE expired states, not all of them at once,
    // and none that has not expired.
    let t1 = t0 + Duration::from_secs(2);
    assert!(guard.first_use_at("new", "idp|x", Duration::from_secs(60), t1));
    assert_eq!(guard.len(), max - PRUNE_PER_USE + 1);
    for _ in 0..max {
        guard.first_use_at("new", "idp|x", Duration::from_secs(60), t1);
    }
    assert_eq!(guard.len(), max / 2 + 1);
    for i in (1..max).step_by(2) {
        assert!(
            !guard.first_use_at(&format!("n{i}"), "idp|y", Duration::from_secs(60), t1),
            "n{i}"
        );
    }
    // Expired states may be marked again.
    assert!(guard.first_use_at("n0", "idp|u0", Duration::from_secs(60), t1));
}

#[tokio::test]
async fn a_redirect_in_another_browser_is_refused_before_its_state_is_used_or_its_code_sent() {
    let fake = Fake::start().await;
    let flow = flow_with(config());
    let up = upstream(&fake);
    let guard = MemoryGuard::default();
    let redirect = signed_in(&flow, &fake, &up).await;
    let other = BH.to_uppercase();
    for browsers in [&[][..], &["other"], &[other.as_str()]] {
        let e = flow.finish(&redirect, &guard, browsers).await.unwrap_err();
        assert!(matches!(e, Error::Browser(_)), "{browsers:?}: {e}");
    }
    assert!(fake.token_requests().is_empty());
    let done = flow.finish(&redirect, &guard, &["other", BH]).await.unwrap();
    assert_eq!((done.browser.as_str(), done.subject.as_str()), (BH, ALICE));
    // A state is begun for one browser: none is refused at the start.
    let e = flow.begin(ALICE, &up, None, "").await.unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e}");
}
