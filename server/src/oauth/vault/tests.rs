//! The vault in memory: sealing per slot, key rotation, forged and moved bytes, bounds,
//! redaction, and one refresh per slot at a time. The Redis store's tests are in
//! `redis_tests.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::*;

pub(super) const ACCESS: &str = "at-SECRET-4f1c";
pub(super) const REFRESH: &str = "rt-SECRET-9b2e";

/// A ring of `(kid, byte)` keys, each 32 times that byte; the first seals.
pub(super) fn ring(keys: &[(&str, u8)]) -> Arc<KeyRing> {
    let text: String = keys
        .iter()
        .map(|(kid, b)| format!("{kid}:{}\n", STANDARD.encode([*b; 32])))
        .collect();
    Arc::new(KeyRing::parse(&text).unwrap())
}

/// Tokens valid for an hour, with a refresh token; `tag` makes them distinct.
pub(super) fn tokens(tag: &str) -> TokenSet {
    TokenSet {
        access_token: format!("{ACCESS}-{tag}"),
        refresh_token: Some(format!("{REFRESH}-{tag}")),
        expires_at: Some(SystemTime::now() + Duration::from_secs(3600)),
        obtained_at: None,
        scope: Some("repo read:user".into()),
        resource: "https://api.example/mcp".into(),
        issuer: "https://as.example".into(),
        token_endpoint: "https://as.example/token".into(),
        client_id: "quiver-client".into(),
        client_secret: None,
        client_auth: None,
        account: Some("octocat".into()),
    }
}

/// Tokens that expired a minute ago (refreshable).
pub(super) fn expired(tag: &str) -> TokenSet {
    TokenSet {
        expires_at: Some(SystemTime::now() - Duration::from_secs(60)),
        ..tokens(tag)
    }
}

/// `t` as stored (whole seconds).
pub(super) fn as_stored(mut t: TokenSet) -> TokenSet {
    let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    t.expires_at = t
        .expires_at
        .map(|e| SystemTime::UNIX_EPOCH + Duration::from_secs(secs(e)));
    t.obtained_at = t
        .obtained_at
        .map(|e| SystemTime::UNIX_EPOCH + Duration::from_secs(secs(e)));
    t
}

fn memory(opts: Options) -> (Vault, Arc<OAuthMetrics>) {
    let m = OAuthMetrics::unregistered();
    (
        Vault::new(ring(&[("k1", 1)]), Backend::Memory, opts, m.clone()),
        m,
    )
}

async fn sealed(v: &Vault, subject: &str, upstream: &str) -> Option<Vec<u8>> {
    match v.store.load(&v.slot(subject, upstream)).await.unwrap() {
        Loaded::Sealed(b) => Some(b),
        _ => None,
    }
}

#[tokio::test]
async fn tokens_are_kept_per_user_and_upstream_and_counted() {
    let (v, m) = memory(Options::default());
    let (gh, gl) = (tokens("gh"), tokens("gl"));
    v.put("idp|alice", "github", &gh).await.unwrap();
    assert_eq!(
        v.get("idp|alice", "github").await.unwrap(),
        Some(as_stored(gh.clone()))
    );
    assert_eq!(v.get("idp|alice", "gitlab").await.unwrap(), None);
    assert_eq!(v.get("idp|mallory", "github").await.unwrap(), None);
    v.put("idp|alice", "gitlab", &gl).await.unwrap();
    v.put("idp|bob", "github", &tokens("bob")).await.unwrap();
    assert_eq!((v.count("idp|alice").await.unwrap(), m.vault_tokens()), (2, 3));
    // Replacing keeps the count.
    v.put("idp|alice", "github", &tokens("gh2")).await.unwrap();
    assert_eq!(m.vault_tokens(), 3);
    // Stored sealed: no token, subject or upstream in the bytes.
    let bytes = String::from_utf8(sealed(&v, "idp|alice", "github").await.unwrap()).unwrap();
    assert!(bytes.starts_with("v1.k1."), "{bytes}");
    for clear in [ACCESS, REFRESH, "alice", "github", "octocat"] {
        assert!(!bytes.contains(clear), "{clear} in {bytes}");
    }
    let removed = v.remove("idp|alice", "github").await.unwrap();
    assert_eq!(removed.map(|t| t.access_token), Some(format!("{ACCESS}-gh2")));
    assert_eq!(v.get("idp|alice", "github").await.unwrap(), None);
    assert_eq!(v.remove("idp|alice", "github").await.unwrap(), None);
    assert_eq!(m.vault_tokens(), 2);
    let all = v.remove_subject("idp|alice").await.unwrap();
    assert_eq!(all, vec![as_stored(gl)]);
    assert_eq!((v.count("idp|alice").await.unwrap(), m.vault_tokens()), (0, 1));
    assert!(
        v.get("idp|bob", "github").await.unwrap().is_some(),
        "another user's tokens stay"
    );
    drop(v);
    assert_eq!(m.vault_tokens(), 0, "a dropped vault holds nothing");
}

#[tokio::test]
async fn the_slot_id_starts_with_the_hash_of_the_prefix() {
    let (a, _) = memory(Options::default());
    let (b, _) = memory(Options {
        namespace: "team-b/tools".into(),
        ..Options::default()
    });
    let (sa, sb) = (a.slot("idp|alice", "github"), b.slot("idp|alice", "github"));
    assert_eq!((sa.user, sa.upstream), (sb.user, sb.upstream));
    assert_ne!(
        sa.id, sb.id,
        "a token sealed for one prefix does not open under another"
    );
    for (s, prefix) in [(&sa, ""), (&sb, "team-b/tools")] {
        let base = format!("{KEY_PREFIX}{}:", prefix_hash(prefix));
        assert!(
            s.id.starts_with(&base) && s.id.len() == base.len() + 64 + 1 + 64,
            "{}",
            s.id
        );
        assert_eq!(acl_keys(prefix), format!("~{base}*"));
    }
    assert!(!sb.id.contains("alice") && !sb.id.contains("github") && !sb.id.contains("team-b"));
}

#[tokio::test]
async fn a_token_under_an_old_key_is_resealed_and_one_under_a_dropped_key_is_deleted() {
    let m = OAuthMetrics::unregistered();
    let v = Vault::new(
        ring(&[("old", 1)]),
        Backend::Memory,
        Options::default(),
        m.clone(),
    );
    v.put("idp|alice", "github", &tokens("a")).await.unwrap();
    v.set_ring(ring(&[("new", 2), ("old", 1)]));
    let before = sealed(&v, "idp|alice", "github").await.unwrap();
    assert!(before.starts_with(b"v1.old."));
    assert!(v.get("idp|alice", "github").await.unwrap().is_some());
    let after = sealed(&v, "idp|alice", "github").await.unwrap();
    assert!(after.starts_with(b"v1.new."), "re-sealed under the first key");
    // The old key may go now; a ring without "new" reads the token as absent and deletes it.
    v.set_ring(ring(&[("new", 2)]));
    assert!(v.get("idp|alice", "github").await.unwrap().is_some());
    v.set_ring(ring(&[("newer", 3)]));
    assert_eq!(v.get("idp|alice", "github").await.unwrap(), None);
    assert_eq!(m.vault_errors("unknown_key"), 1);
    assert_eq!(sealed(&v, "idp|alice", "github").await, None, "deleted");
    assert_eq!(m.vault_tokens(), 0);
}

#[tokio::test]
async fn bytes_moved_to_another_slot_or_altered_do_not_open_and_are_deleted() {
    let (v, m) = memory(Options::default());
    v.put("idp|alice", "github", &tokens("alice")).await.unwrap();
    v.put("idp|mallory", "github", &tokens("mallory")).await.unwrap();
    let alice = sealed(&v, "idp|alice", "github").await.unwrap();
    let opts = v.options().clone();
    let ttl = Duration::from_secs(60);
    // Moved to Mallory's slot, to Alice's slot of another upstream, altered in place.
    let mut altered = alice.clone();
    let mid = altered.len() - 10;
    altered[mid] = if altered[mid] == b'A' { b'B' } else { b'A' };
    let cases = [
        ("idp|mallory", "github", alice.clone()),
        ("idp|alice", "gitlab", alice.clone()),
        ("idp|alice", "github", altered),
        ("idp|bob", "github", b"v1.k1.not-base64!".to_vec()),
        ("idp|carol", "github", vec![0xff, 0xfe]),
    ];
    for (n, (subject, upstream, bytes)) in cases.into_iter().enumerate() {
        let slot = v.slot(subject, upstream);
        let Store::Memory(mem) = &v.store else {
            unreachable!()
        };
        let text = String::from_utf8_lossy(&bytes).into_owned();
        assert!(mem.store(&slot, text, (ttl, None), &opts).is_ok());
        assert_eq!(v.get(subject, upstream).await.unwrap(), None, "case {n}");
        assert_eq!(m.vault_errors("forged"), n as u64 + 1);
        assert_eq!(sealed(&v, subject, upstream).await, None, "case {n}: deleted");
    }
    assert_eq!(m.vault_errors("unknown_key"), 0);
}

#[tokio::test]
async fn fields_sealed_size_upstreams_per_user_are_bounded() {
    let (v, m) = memory(Options {
        max_per_user: 2,
        max_sealed: 1024,
        ..Options::default()
    });
    let long = TokenSet {
        access_token: "x".repeat(8 * 1024 + 1),
        ..tokens("a")
    };
    let e = v.put("idp|alice", "github", &long).await.unwrap_err();
    assert!(
        matches!(
            e,
            VaultError::BadField {
                field: "access_token",
                ..
            }
        ),
        "{e}"
    );
    let e = v
        .put(
            "idp|alice",
            "github",
            &TokenSet {
                access_token: String::new(),
                ..tokens("a")
            },
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("access_token is 0 bytes"), "{e}");
    let e = v
        .put(
            "idp|alice",
            "github",
            &TokenSet {
                scope: Some("s".repeat(2049)),
                ..tokens("a")
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            VaultError::BadField {
                field: "scope",
                len: 2049,
                max: 2048,
                ..
            }
        ),
        "{e}"
    );
    // Every field within its bound, the whole over the sealed bound.
    let big = TokenSet {
        access_token: "y".repeat(1000),
        ..tokens("a")
    };
    let e = v.put("idp|alice", "github", &big).await.unwrap_err();
    assert!(matches!(e, VaultError::TooLarge { max: 1024, .. }), "{e}");
    assert_eq!(m.vault_errors("too_large"), 4);
    assert_eq!(v.count("idp|alice").await.unwrap(), 0, "nothing refused is kept");

    v.put("idp|alice", "github", &tokens("a")).await.unwrap();
    v.put("idp|alice", "gitlab", &tokens("b")).await.unwrap();
    let e = v.put("idp|alice", "jira", &tokens("c")).await.unwrap_err();
    assert_eq!(
        e,
        VaultError::TooManyUpstreams {
            upstream: "jira".into(),
            max: 2
        }
    );
    assert_eq!(m.vault_errors("over_bound"), 1);
    // Replacing one held is no new upstream.
    v.put("idp|alice", "gitlab", &tokens("b2")).await.unwrap();
    assert_eq!(v.count("idp|alice").await.unwrap(), 2);
}

#[tokio::test]
async fn past_the_bound_of_users_the_least_recently_used_is_forgotten_whole() {
    let (v, m) = memory(Options {
        max_users: 3,
        ..Options::default()
    });
    for user in ["u1", "u2", "u3"] {
        v.put(user, "github", &tokens(user)).await.unwrap();
        v.put(user, "gitlab", &tokens(user)).await.unwrap();
    }
    // u1 read last: u2 is the least recently used.
    assert!(v.get("u1", "github").await.unwrap().is_some());
    v.put("u4", "github", &tokens("u4")).await.unwrap();
    assert_eq!(v.count("u2").await.unwrap(), 0);
    for user in ["u1", "u3", "u4"] {
        assert!(v.get(user, "github").await.unwrap().is_some(), "{user}");
    }
    assert_eq!(m.vault_tokens(), 5);
    assert_eq!(
        m.vault_errors("over_bound"),
        0,
        "memory forgets, it does not refuse"
    );
    for n in 0..200 {
        v.put(&format!("many{n}"), "github", &tokens("m")).await.unwrap();
        assert!(m.vault_tokens() <= 3 * 2, "{} tokens after {n}", m.vault_tokens());
    }
}

#[test]
fn usable_keeps_a_margin_before_expiry_and_the_kept_time_follows_the_refresh_token() {
    let now = SystemTime::now();
    let skew = Duration::from_secs(60);
    let at = |secs: i64| TokenSet {
        expires_at: Some(if secs >= 0 {
            now + Duration::from_secs(secs.unsigned_abs())
        } else {
            now - Duration::from_secs(secs.unsigned_abs())
        }),
        ..tokens("t")
    };
    assert!(usable(&at(120), now, skew));
    assert!(!usable(&at(60), now, skew));
    assert!(!usable(&at(30), now, skew));
    assert!(!usable(&at(-5), now, skew));
    assert!(usable(
        &TokenSet {
            expires_at: None,
            ..tokens("t")
        },
        now,
        skew
    ));
    // A short-lived token: the margin is at most a quarter of its lifetime, so a token of
    // 30 s (or 60 s, or 2 s) is sent for most of its life rather than refreshed at every use.
    let lived = |ago: u64, left: u64| TokenSet {
        obtained_at: Some(now - Duration::from_secs(ago)),
        expires_at: Some(now + Duration::from_secs(left)),
        ..tokens("t")
    };
    for (life, ago) in [(30, 0), (30, 20), (60, 0), (60, 40), (2, 1), (240, 100)] {
        let left = life - ago;
        let t = lived(ago, left);
        let margin = Duration::from_secs(60).min(Duration::from_secs(life) / 4);
        assert_eq!(t.refresh_at(skew), Some(now + Duration::from_secs(left) - margin));
        assert!(usable(&t, now, skew), "{life} s, {ago} s old");
    }
    for (life, ago) in [(30, 23), (60, 46), (2, 2), (240, 181), (3600, 3541)] {
        assert!(
            !usable(&lived(ago, life - ago), now, skew),
            "{life} s, {ago} s old"
        );
    }
    // Not knowing when it was issued: the whole margin, as before.
    assert!(!usable(
        &TokenSet {
            obtained_at: None,
            ..at(30)
        },
        now,
        skew
    ));

    let max = Duration::from_secs(90 * 86_400);
    assert_eq!(at(120).keep_for(now, max), max, "refreshable: kept the longest");
    let once = |t: TokenSet| TokenSet {
        refresh_token: None,
        ..t
    };
    assert_eq!(once(at(120)).keep_for(now, max), Duration::from_secs(120));
    assert_eq!(once(at(-5)).keep_for(now, max), Duration::from_millis(1));
    assert_eq!(once(at(200 * 86_400)).keep_for(now, max), max);
    assert_eq!(
        once(TokenSet {
            expires_at: None,
            ..tokens("t")
        })
        .keep_for(now, max),
        max
    );
}

#[tokio::test]
async fn a_token_that_can_no_longer_be_used_nor_refreshed_goes_with_its_expiry() {
    let (v, m) = memory(Options::default());
    let spent = TokenSet {
        refresh_token: None,
        expires_at: Some(SystemTime::now() - Duration::from_secs(1)),
        ..tokens("t")
    };
    v.put("idp|alice", "github", &spent).await.unwrap();
    // Kept 1 ms: wait (bounded) until it reads as absent.
    let mut gone = false;
    for _ in 0..2000 {
        if v.get("idp|alice", "github").await.unwrap().is_none() {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(gone);
    assert_eq!((v.count("idp|alice").await.unwrap(), m.vault_tokens()), (0, 0));
}

#[test]
fn the_sealed_form_is_compact_json_and_debug_shows_no_token() {
    let t = as_stored(tokens("t"));
    let json = serde_json::to_string(&t).unwrap();
    let back: TokenSet = serde_json::from_str(&json).unwrap();
    assert_eq!(back, t);
    let bare = TokenSet {
        refresh_token: None,
        expires_at: None,
        scope: None,
        account: None,
        ..t.clone()
    };
    let json = serde_json::to_string(&bare).unwrap();
    assert!(
        !json.contains("refresh_token") && !json.contains("expires_at"),
        "{json}"
    );
    assert_eq!(serde_json::from_str::<TokenSet>(&json).unwrap(), bare);
    assert!(serde_json::from_str::<TokenSet>(r#"{"access_token":1}"#).is_err());
    let shown = format!("{t:?} {t:#?}");
    assert!(!shown.contains(ACCESS) && !shown.contains(REFRESH), "{shown}");
    assert!(
        shown.contains("octocat") && shown.contains("<redacted>"),
        "{shown}"
    );
}

/// Every error and `Debug` the vault shows, formatted, holds no token and no subject.
#[tokio::test]
async fn errors_logs_and_debug_name_the_upstream_never_a_token_or_the_subject() {
    use std::io::Write;

    #[derive(Clone, Default)]
    struct Buf(Arc<std::sync::Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let logs = Buf::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let (v, _) = memory(Options {
        max_per_user: 1,
        max_sealed: 256,
        ..Options::default()
    });
    let subject = "idp|alice-SUBJECT";
    let mut shown = Vec::new();
    let t = tokens("t");
    for bad in [
        TokenSet {
            access_token: format!("{ACCESS}{}", "x".repeat(9000)),
            ..t.clone()
        },
        TokenSet {
            refresh_token: Some(format!("{REFRESH}{}", "x".repeat(9000))),
            ..t.clone()
        },
        TokenSet {
            access_token: String::new(),
            ..t.clone()
        },
        t.clone(),
    ] {
        shown.push(v.put(subject, "github", &bad).await.unwrap_err().to_string());
    }
    let (small, _) = memory(Options {
        max_per_user: 1,
        ..Options::default()
    });
    small.put(subject, "github", &t).await.unwrap();
    shown.push(small.put(subject, "gitlab", &t).await.unwrap_err().to_string());
    small.set_ring(ring(&[("other", 9)]));
    assert_eq!(small.get(subject, "github").await.unwrap(), None);
    small.put(subject, "github", &t).await.unwrap();
    let failing = [
        RefreshFailure::Other(format!("refused at {}", t.token_endpoint)),
        RefreshFailure::InvalidGrant("invalid_grant".into()),
    ];
    for fail in failing {
        let gone = TokenSet {
            expires_at: Some(SystemTime::now()),
            ..t.clone()
        };
        small.put(subject, "github", &gone).await.unwrap();
        let e = small
            .refresh_once(subject, "github", None, |_| async move { Err(fail) })
            .await
            .unwrap_err();
        shown.push(e.to_string());
    }
    shown.push(
        small
            .refresh_once(subject, "github", None, |t| async { Ok(t) })
            .await
            .unwrap_err()
            .to_string(),
    );
    for e in [
        VaultError::Unavailable {
            upstream: "github".into(),
            reason: "redis: no answer in time".into(),
        },
        VaultError::TooManyUsers {
            upstream: "github".into(),
            max: 3,
        },
        VaultError::Seal {
            upstream: "github".into(),
        },
    ] {
        shown.push(e.to_string());
        shown.push(format!("{:?}", RefreshError::from(e)));
    }
    shown.push(
        RefreshError::Busy {
            upstream: "github".into(),
        }
        .to_string(),
    );
    shown.push(format!("{t:?} {v:?} {small:?}"));
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("did not open") && logs.contains("github"), "{logs}");
    shown.push(logs);
    for s in &shown {
        for secret in [ACCESS, REFRESH, "SUBJECT", "alice"] {
            assert!(!s.contains(secret), "{secret} in: {s}");
        }
    }
    for s in &shown[..shown.len() - 2] {
        assert!(
            s.contains("github") || s.contains("gitlab"),
            "names the upstream: {s}"
        );
    }
}

/// A memory vault to share between calls, and a count of refreshes run.
fn stale() -> (Arc<Vault>, Arc<AtomicUsize>) {
    let (v, _) = memory(Options::default());
    (Arc::new(v), Arc::new(AtomicUsize::new(0)))
}

/// Polls `cond` (yielding between tries) until it holds; at most 100,000 tries.
pub(super) async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..100_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never: {what}");
}

#[tokio::test]
async fn fifty_concurrent_refreshes_of_one_slot_run_the_refresh_once_and_share_its_result() {
    let (v, runs) = stale();
    v.put("idp|alice", "github", &expired("old")).await.unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let key = v.slot("idp|alice", "github").id;
    let calls = (0..50).map(|_| {
        let (runs, gate) = (runs.clone(), gate.clone());
        v.refresh_once("idp|alice", "github", None, move |old| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let _ = gate.acquire().await;
            assert_eq!(
                old.refresh_token.as_deref(),
                Some(format!("{REFRESH}-old").as_str())
            );
            // No new refresh token: the old one stays.
            Ok(TokenSet {
                refresh_token: None,
                ..tokens("new")
            })
        })
    });
    let release = async {
        until("49 callers wait for the leader", || v.flights.waiting(&key) == 49).await;
        gate.close();
    };
    let (results, ()) = tokio::join!(futures_util::future::join_all(calls), release);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    for r in &results {
        let t = r.as_ref().unwrap();
        assert_eq!(t.access_token, format!("{ACCESS}-new"));
        assert_eq!(
            t.refresh_token.as_deref(),
            Some(format!("{REFRESH}-old").as_str())
        );
        assert_eq!(t.account.as_deref(), Some("octocat"));
    }
    let held = v.get("idp|alice", "github").await.unwrap().unwrap();
    assert_eq!(held.access_token, format!("{ACCESS}-new"));
    assert_eq!(v.flights.waiting(&key), 0);
    // Usable now: a later refresh answers it without running.
    let again = v
        .refresh_once("idp|alice", "github", None, |_| async {
            panic!("refreshed a usable token")
        })
        .await
        .unwrap();
    assert_eq!(again.access_token, held.access_token);
}

#[tokio::test]
async fn a_failed_refresh_is_shared_too_and_a_refused_grant_forgets_the_tokens() {
    let (v, runs) = stale();
    v.put("idp|alice", "github", &expired("old")).await.unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let key = v.slot("idp|alice", "github").id;
    let calls = (0..50).map(|_| {
        let (runs, gate) = (runs.clone(), gate.clone());
        v.refresh_once("idp|alice", "github", None, move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let _ = gate.acquire().await;
            Err(RefreshFailure::Other(
                "the authorization server answered 503".into(),
            ))
        })
    });
    let release = async {
        until("49 callers wait", || v.flights.waiting(&key) == 49).await;
        gate.close();
    };
    let (results, ()) = tokio::join!(futures_util::future::join_all(calls), release);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let want = RefreshError::Failed {
        upstream: "github".into(),
        reason: "the authorization server answered 503".into(),
    };
    assert!(results.iter().all(|r| r.as_ref().unwrap_err() == &want));
    assert!(
        v.get("idp|alice", "github").await.unwrap().is_some(),
        "kept after a failure"
    );

    let e = v
        .refresh_once("idp|alice", "github", None, |_| async {
            Err(RefreshFailure::InvalidGrant("x".repeat(1000)))
        })
        .await
        .unwrap_err();
    let RefreshError::Revoked { reason, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(reason.len(), 256, "the reason is bounded");
    assert_eq!(v.get("idp|alice", "github").await.unwrap(), None);
    let e = v
        .refresh_once("idp|alice", "github", None, |_| async {
            panic!("nothing to refresh")
        })
        .await
        .unwrap_err();
    assert_eq!(
        e,
        RefreshError::SignIn {
            upstream: "github".into()
        }
    );
}

#[tokio::test]
async fn a_rejected_token_is_refreshed_even_before_expiry_and_one_without_refresh_token_is_forgotten() {
    let (v, runs) = stale();
    v.put("idp|alice", "github", &tokens("live")).await.unwrap();
    let refresh = |tag: &'static str| {
        let runs = runs.clone();
        move |_: TokenSet| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(tokens(tag))
        }
    };
    // Usable and not the one refused: answered as it is.
    let other = format!("{ACCESS}-other");
    let t = v
        .refresh_once("idp|alice", "github", Some(&other), refresh("n1"))
        .await
        .unwrap();
    assert_eq!(
        (t.access_token.as_str(), runs.load(Ordering::SeqCst)),
        (format!("{ACCESS}-live").as_str(), 0)
    );
    let live = format!("{ACCESS}-live");
    let t = v
        .refresh_once("idp|alice", "github", Some(&live), refresh("n2"))
        .await
        .unwrap();
    assert_eq!(
        (t.access_token, runs.load(Ordering::SeqCst)),
        (format!("{ACCESS}-n2"), 1)
    );

    let once = TokenSet {
        refresh_token: None,
        ..expired("once")
    };
    v.put("idp|alice", "gitlab", &once).await.unwrap();
    let e = v
        .refresh_once("idp|alice", "gitlab", None, refresh("n3"))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        RefreshError::SignIn {
            upstream: "gitlab".into()
        }
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(v.count("idp|alice").await.unwrap(), 1);
}

#[tokio::test]
async fn a_refresh_that_does_not_answer_in_time_fails_and_keeps_the_tokens() {
    let (v, _) = memory(Options {
        refresh_timeout: Duration::from_millis(50),
        ..Options::default()
    });
    v.put("idp|alice", "github", &expired("old")).await.unwrap();
    let e = v
        .refresh_once("idp|alice", "github", None, |_| std::future::pending())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, RefreshError::Failed { reason, .. } if reason == "no answer in time"),
        "{e:?}"
    );
    assert!(v.get("idp|alice", "github").await.unwrap().is_some());
}

#[tokio::test]
async fn when_the_leading_call_is_cancelled_a_waiting_one_refreshes() {
    let (v, runs) = stale();
    v.put("idp|alice", "github", &expired("old")).await.unwrap();
    let key = v.slot("idp|alice", "github").id;
    let leader = {
        let (v, runs) = (v.clone(), runs.clone());
        tokio::spawn(async move {
            v.refresh_once("idp|alice", "github", None, move |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                std::future::pending().await
            })
            .await
        })
    };
    until("the leader refreshes", || runs.load(Ordering::SeqCst) == 1).await;
    let follower = {
        let v = v.clone();
        tokio::spawn(async move {
            v.refresh_once("idp|alice", "github", None, |_| async { Ok(tokens("next")) })
                .await
        })
    };
    until("one caller waits", || v.flights.waiting(&key) == 1).await;
    leader.abort();
    let t = follower.await.unwrap().unwrap();
    assert_eq!(t.access_token, format!("{ACCESS}-next"));
}

/// A refresh whose answer comes after the slot changed (through `b`, the same vault or
/// another replica) never undoes the change: a sign-out, a revocation, a newer sign-in. The
/// refreshed tokens it drops are handed over (to be revoked), unless what the slot holds
/// shares them.
pub(super) async fn a_refresh_never_undoes_what_happened_meanwhile(a: &Vault, b: &Vault) {
    const ALICE: &str = "idp|alice";
    let refreshed = |t: &str| Ok::<_, RefreshFailure>(tokens(t));
    let dropped = std::sync::Mutex::new(Vec::new());
    let keep = |t: TokenSet| dropped.lock().unwrap().push(t.access_token);
    let taken = || std::mem::take(&mut *dropped.lock().unwrap());
    // Signed out, or revoked by an administrator, while the refresh ran.
    for revoke in [false, true] {
        a.put(ALICE, "github", &expired("old")).await.unwrap();
        let r = a
            .refresh_once_dropping(
                ALICE,
                "github",
                None,
                |_| async {
                    match revoke {
                        true => drop(b.remove_subject(ALICE).await.unwrap()),
                        false => drop(b.remove(ALICE, "github").await.unwrap()),
                    }
                    refreshed("late")
                },
                keep,
            )
            .await;
        assert_eq!(
            r,
            Err(RefreshError::SignIn {
                upstream: "github".into()
            }),
            "revoke: {revoke}"
        );
        assert_eq!(a.get(ALICE, "github").await.unwrap(), None);
        assert_eq!(b.count(ALICE).await.unwrap(), 0);
        assert_eq!(taken(), [format!("{ACCESS}-late")], "revoke: {revoke}");
    }
    // Signed in again while the refresh ran: the newer sign-in stays, and is what the call
    // gets.
    a.put(ALICE, "github", &expired("old")).await.unwrap();
    let r = a
        .refresh_once_dropping(
            ALICE,
            "github",
            None,
            |_| async {
                b.put(ALICE, "github", &tokens("newer")).await.unwrap();
                refreshed("late")
            },
            keep,
        )
        .await;
    assert_eq!(r, Ok(as_stored(tokens("newer"))));
    assert_eq!(
        a.get(ALICE, "github").await.unwrap(),
        Some(as_stored(tokens("newer")))
    );
    assert_eq!(taken(), [format!("{ACCESS}-late")]);
    // Held meanwhile: tokens sharing the refresh token the server kept, or the very tokens
    // refreshed, sealed anew under a rotated key: nothing is handed over.
    let kept_refresh = |tag: &str| TokenSet {
        refresh_token: tokens("newer").refresh_token,
        ..tokens(tag)
    };
    a.put(ALICE, "github", &expired("old")).await.unwrap();
    let r = a
        .refresh_once_dropping(
            ALICE,
            "github",
            None,
            |_| async {
                b.put(ALICE, "github", &kept_refresh("other")).await.unwrap();
                Ok(kept_refresh("late"))
            },
            keep,
        )
        .await;
    assert!(r.is_ok(), "{r:?}");
    assert!(taken().is_empty());
    a.put(ALICE, "github", &expired("old")).await.unwrap();
    let rotated = ring(&[("k2", 2), ("k1", 1)]);
    let r = a
        .refresh_once_dropping(
            ALICE,
            "github",
            None,
            |_| async {
                a.set_ring(rotated.clone());
                b.set_ring(rotated.clone());
                // Read through `b`: sealed anew under k2.
                assert!(b.get(ALICE, "github").await.unwrap().is_some());
                refreshed("late")
            },
            keep,
        )
        .await;
    assert!(r.is_err(), "{r:?}");
    assert!(taken().is_empty(), "the tokens refreshed are still held");
    assert!(a.get(ALICE, "github").await.unwrap().is_some());
    // A refused grant forgets only the tokens it was about.
    a.put(ALICE, "github", &expired("old")).await.unwrap();
    let r = a
        .refresh_once(ALICE, "github", None, |_| async {
            b.put(ALICE, "github", &tokens("newest")).await.unwrap();
            Err(RefreshFailure::InvalidGrant("invalid_grant".into()))
        })
        .await;
    assert!(matches!(r, Err(RefreshError::Revoked { .. })), "{r:?}");
    assert_eq!(
        b.get(ALICE, "github").await.unwrap(),
        Some(as_stored(tokens("newest")))
    );
    b.remove_subject(ALICE).await.unwrap();
}

#[tokio::test]
async fn a_refresh_never_undoes_a_sign_out_a_revocation_or_a_newer_sign_in() {
    let (v, _) = memory(Options::default());
    a_refresh_never_undoes_what_happened_meanwhile(&v, &v).await;
}
