//! The vault in a real Redis (Debian's redis-server: `QUIVER_REDIS_SERVER`, else
//! scripts/redis.sh), over TLS, each prefix as an ACL user allowed only [`ACL_COMMANDS`] on
//! [`acl_keys`] of its prefix: two vaults of one prefix are two replicas. What Redis holds is
//! read and written behind the vault's back with an administrator's connection, as an
//! attacker with access to Redis would.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::super::tests::{ACCESS, REFRESH, as_stored, expired, ring, tokens};
use super::super::{Backend, KeyRing, Options, Store, TokenSet, Vault, VaultError};
use super::*;
use crate::metrics::oauth::OAuthMetrics;
use crate::net::resp::{Client, Reply};
use crate::net::resp_tls::tests::TlsRedis;
use crate::oauth::vault::{RefreshError, RefreshFailure};

/// The prefixes of these tests, each with an ACL user of its own.
const PREFIXES: [&str; 4] = ["", "team-a", "payments/billing/", "shop/cart/"];

/// The ACL user of `prefix`.
fn user_of(prefix: &str) -> String {
    format!("vault-{}", &prefix_hash(prefix)[..12])
}

/// A TLS Redis with an ACL user per prefix, each limited to what the vault documents.
async fn redis() -> TlsRedis {
    let r = TlsRedis::start().await;
    for prefix in PREFIXES {
        let (user, keys) = (user_of(prefix), acl_keys(prefix));
        let mut acl = vec![
            "ACL",
            "SETUSER",
            &user,
            "on",
            ">vault-pw",
            "resetkeys",
            &keys,
            "resetchannels",
            "-@all",
        ];
        acl.extend(ACL_COMMANDS.split_whitespace());
        assert_eq!(r.admin(&acl).await, Reply::Status("OK".into()));
    }
    r
}

/// One replica's vault, as the ACL user of its prefix.
fn replica(r: &TlsRedis, ring: Arc<KeyRing>, opts: Options) -> (Arc<Vault>, Arc<OAuthMetrics>) {
    let m = OAuthMetrics::unregistered();
    let user = user_of(&opts.namespace);
    let backend = Backend::Redis(RedisOptions {
        endpoint: r.endpoint("ca.crt", false, Some((&user, "vault-pw"))),
        timeout: Duration::from_secs(5),
        max_connections: 4,
    });
    (Arc::new(Vault::new(ring, backend, opts, m.clone())), m)
}

/// The administrator's connection (every command, every key).
fn admin(r: &TlsRedis) -> Client {
    Client::new(crate::net::resp::Options {
        endpoint: r.endpoint("ca.crt", true, None),
        timeout: Duration::from_secs(5),
        max_connections: 1,
        max_reply: 1 << 20,
    })
}

async fn call(c: &Client, args: &[&[u8]]) -> Reply {
    c.call(args).await.unwrap()
}

async fn get(c: &Client, key: &str) -> Option<Vec<u8>> {
    match call(c, &[b"GET", key.as_bytes()]).await {
        Reply::Bulk(b) => Some(b),
        Reply::Nil => None,
        other => panic!("{other:?}"),
    }
}

async fn int(c: &Client, args: &[&[u8]]) -> i64 {
    match call(c, args).await {
        Reply::Int(n) => n,
        other => panic!("{args:?}: {other:?}"),
    }
}

async fn keys(c: &Client) -> Vec<String> {
    let Reply::Array(items) = call(c, &[b"KEYS", b"quiver:*"]).await else {
        panic!()
    };
    let mut out: Vec<String> = items.into_iter().filter_map(Reply::text).collect();
    out.sort();
    out
}

/// Waits (bounded: 10 s) until `cond` holds.
async fn eventually<F: Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    for _ in 0..2000 {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never: {what}");
}

fn index_of(v: &Vault, subject: &str) -> String {
    format!("{}user:{}", v.base, hex(&v.slot(subject, "any").user))
}

#[tokio::test]
async fn two_replicas_share_tokens_and_redis_holds_nothing_in_clear() {
    let r = redis().await;
    let c = admin(&r);
    let (a, ma) = replica(&r, ring(&[("k1", 1)]), Options::default());
    let (b, _) = replica(&r, ring(&[("k1", 1)]), Options::default());
    let (gh, gl, bob) = (tokens("gh"), tokens("gl"), tokens("bob"));
    a.put("idp|alice", "github", &gh).await.unwrap();
    assert_eq!(
        b.get("idp|alice", "github").await.unwrap(),
        Some(as_stored(gh.clone()))
    );
    b.put("idp|alice", "gitlab", &gl).await.unwrap();
    b.put("idp|bob", "github", &bob).await.unwrap();
    assert_eq!(a.count("idp|alice").await.unwrap(), 2);
    assert_eq!(ma.vault_tokens(), 0, "the gauge counts memory vaults only");

    // Three slots, two subject indexes, the set of subjects: hashed names, sealed values.
    let all = keys(&c).await;
    assert_eq!(all.len(), 6, "{all:?}");
    for k in &all {
        for clear in ["alice", "bob", "github", "gitlab"] {
            assert!(!k.contains(clear), "{k}");
        }
    }
    let slot = a.slot("idp|alice", "github").id;
    assert!(all.contains(&slot) && all.contains(&index_of(&a, "idp|alice")));
    let value = String::from_utf8(get(&c, &slot).await.unwrap()).unwrap();
    assert!(value.starts_with("v1.k1."), "{value}");
    for clear in [ACCESS, REFRESH, "octocat", "as.example"] {
        assert!(!value.contains(clear), "{clear} in {value}");
    }
    let ttl = int(&c, &[b"PTTL", slot.as_bytes()]).await;
    assert!(ttl > 89 * 86_400_000 && ttl <= 90 * 86_400_000, "{ttl}");
    let users = format!("{}users", a.base);
    assert_eq!(int(&c, &[b"ZCARD", users.as_bytes()]).await, 2);

    // An administrator revokes Alice everywhere, through either replica.
    let mut removed = a.remove_subject("idp|alice").await.unwrap();
    removed.sort_by(|x, y| x.access_token.cmp(&y.access_token));
    assert_eq!(removed, vec![as_stored(gh), as_stored(gl)]);
    assert_eq!(b.get("idp|alice", "github").await.unwrap(), None);
    assert_eq!(b.count("idp|alice").await.unwrap(), 0);
    assert_eq!(keys(&c).await.len(), 3, "Bob's slot and index, the subjects");
    assert_eq!(b.remove("idp|bob", "github").await.unwrap(), Some(as_stored(bob)));
    assert_eq!(keys(&c).await, Vec::<String>::new(), "nothing left behind");
}

#[tokio::test]
async fn a_token_under_the_old_key_is_resealed_under_the_new_first_key() {
    let r = redis().await;
    let c = admin(&r);
    let (old, m_old) = replica(&r, ring(&[("old", 1)]), Options::default());
    let t = tokens("t");
    old.put("idp|alice", "github", &t).await.unwrap();
    let slot = old.slot("idp|alice", "github").id;
    assert!(get(&c, &slot).await.unwrap().starts_with(b"v1.old."));
    let ttl = int(&c, &[b"PTTL", slot.as_bytes()]).await;

    // The Secret gains a new first key: the next read re-seals, keeping the expiry.
    let (rotated, m) = replica(&r, ring(&[("new", 2), ("old", 1)]), Options::default());
    assert_eq!(
        rotated.get("idp|alice", "github").await.unwrap(),
        Some(as_stored(t.clone()))
    );
    let now = get(&c, &slot).await.unwrap();
    assert!(now.starts_with(b"v1.new."), "{}", String::from_utf8_lossy(&now));
    let kept = int(&c, &[b"PTTL", slot.as_bytes()]).await;
    assert!(kept > 0 && kept <= ttl, "{kept} after {ttl}");
    assert_eq!(m.vault_errors("unknown_key") + m.vault_errors("forged"), 0);
    // Re-sealing never overwrites a newer write.
    let Store::Redis(store) = &rotated.store else {
        unreachable!()
    };
    let s = rotated.slot("idp|alice", "github");
    store
        .replace(&s, b"v1.old.what-was-read", b"v1.new.stale")
        .await
        .unwrap();
    assert_eq!(get(&c, &slot).await.unwrap(), now);

    // A replica that still has only the old key: unknown key, deleted; the user signs in again.
    assert_eq!(old.get("idp|alice", "github").await.unwrap(), None);
    assert_eq!(m_old.vault_errors("unknown_key"), 1);
    assert_eq!(get(&c, &slot).await, None);
    assert_eq!(rotated.count("idp|alice").await.unwrap(), 0);
}

#[tokio::test]
async fn bytes_copied_to_another_users_key_do_not_open_and_are_deleted() {
    let r = redis().await;
    let c = admin(&r);
    let (v, m) = replica(&r, ring(&[("k1", 1)]), Options::default());
    let alice = tokens("alice");
    v.put("idp|alice", "github", &alice).await.unwrap();
    v.put("idp|mallory", "github", &tokens("mallory")).await.unwrap();
    let (from, to) = (
        v.slot("idp|alice", "github").id,
        v.slot("idp|mallory", "github").id,
    );
    let stolen = get(&c, &from).await.unwrap();
    call(&c, &[b"SET", to.as_bytes(), &stolen]).await;
    assert_eq!(v.get("idp|mallory", "github").await.unwrap(), None);
    assert_eq!(m.vault_errors("forged"), 1);
    assert_eq!(get(&c, &to).await, None, "deleted");
    let mallory_index = index_of(&v, "idp|mallory");
    assert_eq!(int(&c, &[b"EXISTS", mallory_index.as_bytes()]).await, 0);
    assert_eq!(
        v.get("idp|alice", "github").await.unwrap(),
        Some(as_stored(alice))
    );

    // Written over the size bound: deleted unread. Not UTF-8: forged.
    let huge = format!("v1.k1.{}", "A".repeat(v.options().max_sealed));
    call(&c, &[b"SET", from.as_bytes(), huge.as_bytes()]).await;
    assert_eq!(v.get("idp|alice", "github").await.unwrap(), None);
    assert_eq!(m.vault_errors("too_large"), 1);
    assert_eq!(get(&c, &from).await, None);
    call(&c, &[b"SET", from.as_bytes(), &[0xff, 0xfe, 0x00]]).await;
    assert_eq!(v.get("idp|alice", "github").await.unwrap(), None);
    assert_eq!(m.vault_errors("forged"), 2);
    assert_eq!(keys(&c).await, Vec::<String>::new(), "nothing left behind");
}

#[tokio::test]
async fn users_and_upstreams_per_user_are_bounded_and_kept_only_while_usable() {
    let r = redis().await;
    let c = admin(&r);
    let (v, m) = replica(
        &r,
        ring(&[("k1", 1)]),
        Options {
            max_users: 2,
            max_per_user: 2,
            ..Options::default()
        },
    );
    v.put("idp|alice", "github", &tokens("a")).await.unwrap();
    v.put("idp|bob", "github", &tokens("b")).await.unwrap();
    let e = v.put("idp|carol", "github", &tokens("c")).await.unwrap_err();
    assert_eq!(
        e,
        VaultError::TooManyUsers {
            upstream: "github".into(),
            max: 2
        }
    );
    v.put("idp|alice", "gitlab", &tokens("a2")).await.unwrap();
    let e = v.put("idp|alice", "jira", &tokens("a3")).await.unwrap_err();
    assert_eq!(
        e,
        VaultError::TooManyUpstreams {
            upstream: "jira".into(),
            max: 2
        }
    );
    assert_eq!(m.vault_errors("over_bound"), 2);
    v.remove_subject("idp|bob").await.unwrap();
    v.put("idp|carol", "github", &tokens("c")).await.unwrap();

    // Without a refresh token, kept until its access token expires.
    let once = TokenSet {
        refresh_token: None,
        expires_at: Some(std::time::SystemTime::now() + Duration::from_secs(120)),
        ..tokens("once")
    };
    v.put("idp|carol", "github", &once).await.unwrap();
    let slot = v.slot("idp|carol", "github").id;
    let ttl = int(&c, &[b"PTTL", slot.as_bytes()]).await;
    assert!(ttl > 100_000 && ttl <= 120_000, "{ttl}");
    let index = index_of(&v, "idp|carol");
    let ttl = int(&c, &[b"PTTL", index.as_bytes()]).await;
    assert!(ttl > 100_000 && ttl <= 121_000, "{ttl}");
}

#[tokio::test]
async fn one_replica_refreshes_while_the_other_waits_for_its_tokens() {
    let r = redis().await;
    let c = admin(&r);
    let (a, _) = replica(&r, ring(&[("k1", 1)]), Options::default());
    let (b, _) = replica(&r, ring(&[("k1", 1)]), Options::default());
    a.put("idp|alice", "github", &expired("old")).await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let refresh = |tag: &'static str| {
        let (runs, gate) = (runs.clone(), gate.clone());
        move |old: TokenSet| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let _ = gate.acquire().await;
            assert_eq!(old.refresh_token, Some(format!("{REFRESH}-old")));
            Ok::<_, RefreshFailure>(tokens(tag))
        }
    };
    let first = {
        let (a, f) = (a.clone(), refresh("from-a"));
        tokio::spawn(async move { a.refresh_once("idp|alice", "github", None, f).await })
    };
    eventually("replica A refreshes", || async {
        runs.load(Ordering::SeqCst) == 1
    })
    .await;
    let lock = format!(
        "{}lock:{}",
        a.base,
        &a.slot("idp|alice", "github").id[a.base.len()..]
    );
    assert_eq!(
        int(&c, &[b"EXISTS", lock.as_bytes()]).await,
        1,
        "A holds the lock"
    );
    let second = {
        let (b, f) = (b.clone(), refresh("from-b"));
        tokio::spawn(async move { b.refresh_once("idp|alice", "github", None, f).await })
    };
    eventually("replica B waits for the lock", || async {
        b.flights.lock_waits() >= 1
    })
    .await;
    gate.close();
    let (ta, tb) = (first.await.unwrap().unwrap(), second.await.unwrap().unwrap());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one refresh across replicas");
    assert_eq!(ta.access_token, format!("{ACCESS}-from-a"));
    assert_eq!(tb, as_stored(ta.clone()));
    assert_eq!(
        int(&c, &[b"EXISTS", lock.as_bytes()]).await,
        0,
        "released by its owner"
    );
    assert_eq!(
        b.get("idp|alice", "github").await.unwrap().unwrap().access_token,
        ta.access_token
    );
}

#[tokio::test]
async fn the_refresh_lock_is_released_only_by_its_owner() {
    let r = redis().await;
    let c = admin(&r);
    let (v, _) = replica(&r, ring(&[("k1", 1)]), Options::default());
    let Store::Redis(store) = &v.store else {
        unreachable!()
    };
    let slot = v.slot("idp|alice", "github");
    let hold = Duration::from_secs(15);
    assert!(store.lock(&slot, "owner-a", hold).await.unwrap());
    assert!(!store.lock(&slot, "owner-b", hold).await.unwrap(), "held");
    assert!(
        !store.unlock(&slot, "owner-b").await.unwrap(),
        "not B's to release"
    );
    let key = store.lock_key(&slot);
    let ttl = int(&c, &[b"PTTL", &key]).await;
    assert!(ttl > 0 && ttl <= 15_000, "{ttl}");
    assert!(store.unlock(&slot, "owner-a").await.unwrap());
    assert!(store.lock(&slot, "owner-b", hold).await.unwrap(), "free again");
}

#[tokio::test]
async fn an_unreachable_redis_is_an_error_naming_the_upstream_and_counted() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let m = OAuthMetrics::unregistered();
    let backend = Backend::Redis(RedisOptions {
        endpoint: crate::net::resp::Endpoint::plain(addr),
        timeout: Duration::from_secs(2),
        max_connections: 1,
    });
    let v = Vault::new(ring(&[("k1", 1)]), backend, Options::default(), m.clone());
    let e = v.get("idp|alice", "github").await.unwrap_err();
    assert!(
        matches!(&e, VaultError::Unavailable { upstream, .. } if upstream == "github"),
        "{e}"
    );
    let e = v.put("idp|alice", "github", &tokens("t")).await.unwrap_err();
    assert!(!e.to_string().contains(ACCESS), "{e}");
    let e = v
        .refresh_once("idp|alice", "github", None, |t| async { Ok(t) })
        .await
        .unwrap_err();
    assert!(
        matches!(e, RefreshError::Vault(VaultError::Unavailable { .. })),
        "{e}"
    );
    assert_eq!(m.vault_errors("redis"), 3);
}

#[tokio::test]
async fn a_state_used_on_one_replica_is_used_on_every_replica_and_a_failing_redis_refuses() {
    let r = redis().await;
    let c = admin(&r);
    let opts = Options {
        namespace: "team-a".into(),
        ..Options::default()
    };
    let (a, _) = replica(&r, ring(&[("k1", 1)]), opts.clone());
    let (b, _) = replica(&r, ring(&[("k1", 1)]), opts);
    let ttl = Duration::from_secs(60);
    assert_eq!(a.mark_used("nonce-1", ttl).await, Some(true));
    assert_eq!(
        b.mark_used("nonce-1", ttl).await,
        Some(false),
        "replayed on another replica"
    );
    assert_eq!(a.mark_used("nonce-1", ttl).await, Some(false));
    assert_eq!(b.mark_used("nonce-2", ttl).await, Some(true));
    // Kept under the prefix, a hash of the nonce, for as long as asked.
    let pattern = format!("{}used:*", a.base);
    let Reply::Array(keys) = call(&c, &[b"KEYS", pattern.as_bytes()]).await else {
        panic!("no keys");
    };
    assert_eq!(keys.len(), 2);
    for k in &keys {
        let Reply::Bulk(k) = k else { panic!("{k:?}") };
        assert!(!String::from_utf8_lossy(k).contains("nonce"), "{k:?}");
        let Reply::Int(ms) = call(&c, &[b"PTTL", k]).await else {
            panic!("no ttl")
        };
        assert!((1..=60_000).contains(&ms), "{ms}");
    }
    // Memory: the caller keeps used states itself.
    let m = Vault::new(
        ring(&[("k1", 1)]),
        Backend::Memory,
        Options::default(),
        OAuthMetrics::unregistered(),
    );
    assert_eq!(m.mark_used("nonce-1", ttl).await, None);
    // A Redis that does not answer: the state is not used (refused, not allowed).
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let down = Vault::new(
        ring(&[("k1", 1)]),
        Backend::Redis(RedisOptions {
            endpoint: crate::net::resp::Endpoint::plain(addr),
            timeout: Duration::from_secs(2),
            max_connections: 1,
        }),
        Options::default(),
        OAuthMetrics::unregistered(),
    );
    assert_eq!(down.mark_used("nonce-3", ttl).await, Some(false));
}

#[tokio::test]
async fn two_prefixes_on_one_redis_neither_see_remove_nor_count_each_others_users() {
    let r = redis().await;
    let c = admin(&r);
    let opts = |prefix: &str| Options {
        namespace: prefix.into(),
        max_users: 2,
        ..Options::default()
    };
    let (x, _) = replica(&r, ring(&[("k1", 1)]), opts("payments/billing/"));
    let (y, _) = replica(&r, ring(&[("k1", 1)]), opts("shop/cart/"));
    // X at its bound of users; Y's users are counted against Y's bound alone.
    x.put("idp|alice", "github", &tokens("x-alice")).await.unwrap();
    x.put("idp|bob", "github", &tokens("x-bob")).await.unwrap();
    let e = x
        .put("idp|carol", "github", &tokens("x-carol"))
        .await
        .unwrap_err();
    assert!(matches!(e, VaultError::TooManyUsers { max: 2, .. }), "{e}");
    y.put("idp|carol", "github", &tokens("y-carol")).await.unwrap();
    y.put("idp|alice", "github", &tokens("y-alice")).await.unwrap();
    // Each sees its own tokens only.
    assert_eq!(
        x.get("idp|alice", "github").await.unwrap(),
        Some(as_stored(tokens("x-alice")))
    );
    assert_eq!(
        y.get("idp|alice", "github").await.unwrap(),
        Some(as_stored(tokens("y-alice")))
    );
    assert_eq!(y.get("idp|bob", "github").await.unwrap(), None);
    assert_eq!(x.count("idp|carol").await.unwrap(), 0);
    // Revoking alice on X leaves her tokens of Y, and Y's index of users.
    assert_eq!(x.remove_subject("idp|alice").await.unwrap().len(), 1);
    assert_eq!(x.get("idp|alice", "github").await.unwrap(), None);
    assert_eq!(y.count("idp|alice").await.unwrap(), 1);
    assert!(y.remove("idp|bob", "github").await.unwrap().is_none());
    assert!(x.get("idp|bob", "github").await.unwrap().is_some());
    // Used states are per prefix too.
    let ttl = Duration::from_secs(60);
    assert_eq!(x.mark_used("n1", ttl).await, Some(true));
    assert_eq!(y.mark_used("n1", ttl).await, Some(true));
    // Every key is under one prefix's hash (the ACL users could not have written others).
    let Reply::Array(all) = call(&c, &[b"KEYS", b"*"]).await else {
        panic!("no keys")
    };
    let keys: Vec<String> = all.into_iter().filter_map(Reply::text).collect();
    assert!(keys.len() >= 8, "{keys:?}");
    for k in &keys {
        assert!(k.starts_with(&x.base) || k.starts_with(&y.base), "{k}");
    }
    // X's ACL user cannot read or delete Y's keys.
    let as_x = Client::new(crate::net::resp::Options {
        endpoint: r.endpoint("ca.crt", false, Some((&user_of("payments/billing/"), "vault-pw"))),
        timeout: Duration::from_secs(5),
        max_connections: 1,
        max_reply: 1 << 20,
    });
    let ys = y.slot("idp|carol", "github").id;
    for cmd in [&b"GET"[..], b"DEL"] {
        match as_x.call(&[cmd, ys.as_bytes()]).await.unwrap() {
            Reply::Error(e) => assert!(e.starts_with("NOPERM"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
    assert!(y.get("idp|carol", "github").await.unwrap().is_some());
}

#[tokio::test]
async fn a_refresh_on_one_replica_never_undoes_a_change_made_through_another() {
    let r = redis().await;
    let (a, _) = replica(&r, ring(&[("k1", 1)]), Options::default());
    let (b, _) = replica(&r, ring(&[("k1", 1)]), Options::default());
    super::super::tests::a_refresh_never_undoes_what_happened_meanwhile(&a, &b).await;
}
