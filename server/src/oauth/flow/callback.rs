//! The redirect back from the authorization server: the `state` opened (forged, expired, for
//! another callback URL: refused) and its browser checked, before anything the redirect says
//! is read; an `error` answer refused with its (sanitized) reason; the issuer checked (RFC
//! 9207: the mix-up defence); the state used once; the code exchanged with the PKCE
//! verifier, and the tokens checked.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::authorize::{STATE_AAD, State, now_secs};
use super::register::AuthMethod;
use super::token::{Asked, read_tokens};
use super::wire::{self, known_error, parse_query};
use super::{Error, Flow, Result, Tokens};
use crate::oauth::keyring::OpenError;

/// Longest `state` opened.
const MAX_STATE: usize = 8192;
/// Longest authorization code accepted.
const MAX_CODE: usize = 4096;
/// A used state is remembered this much longer than it lives (clocks of replicas differ).
const USED_MARGIN: Duration = Duration::from_secs(60);

/// Marks the state of a sign-in used, so that a redirect cannot be replayed. Backed by
/// memory ([`MemoryGuard`], one replica) or by a store every replica shares.
pub trait StateGuard: Send + Sync {
    /// `true` the first time `nonce` is presented within `ttl`, `false` after, and `false`
    /// when it cannot tell (a store that failed, or one full, refuses rather than allow a
    /// replay). `subject`: the caller the sign-in was begun for (`iss|sub`), whose states a
    /// guard may bound.
    fn first_use(&self, nonce: &str, subject: &str, ttl: Duration) -> impl Future<Output = bool> + Send;
}

/// States one caller may hold in a [`MemoryGuard`] at once (each sign-in marks two, each
/// for at most half an hour).
pub const MAX_USED_PER_SUBJECT: usize = 32;
/// Expired states a [`MemoryGuard`] forgets per use, at most: the work of one request is
/// bounded, and each use frees more than it takes.
const PRUNE_PER_USE: usize = 64;

/// A [`StateGuard`] in one replica's memory, bounded in all and per caller: full of states
/// that have not yet expired (or the caller holding its share), it refuses new ones rather
/// than forget a used one. States expire in the order of their deadlines, a few per use.
#[derive(Debug)]
pub struct MemoryGuard {
    max: usize,
    per_subject: usize,
    used: Mutex<Used>,
}

/// What a [`MemoryGuard`] remembers.
#[derive(Debug, Default)]
struct Used {
    /// Each state's deadline.
    seen: HashMap<String, Instant>,
    /// States by deadline, the nearest first: one per mark (a state marked again after it
    /// expired has an older entry whose deadline is no longer its own).
    queue: BinaryHeap<Reverse<(Instant, String, Arc<str>)>>,
    /// Entries of `queue` per caller.
    per_subject: HashMap<Arc<str>, usize>,
}

impl Used {
    /// Forgets at most [`PRUNE_PER_USE`] states expired at `now`, nearest deadline first.
    fn prune(&mut self, now: Instant) {
        for _ in 0..PRUNE_PER_USE {
            match self.queue.peek() {
                Some(Reverse((until, _, _))) if *until <= now => {}
                _ => return,
            }
            let Some(Reverse((until, nonce, subject))) = self.queue.pop() else {
                return;
            };
            if self.seen.get(&nonce) == Some(&until) {
                self.seen.remove(&nonce);
            }
            if let Some(n) = self.per_subject.get_mut(&subject) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.per_subject.remove(&subject);
                }
            }
        }
    }
}

impl MemoryGuard {
    /// A guard remembering at most `max` states, [`MAX_USED_PER_SUBJECT`] of one caller.
    pub fn new(max: usize) -> Self {
        Self::bounded(max, MAX_USED_PER_SUBJECT)
    }

    /// A guard remembering at most `max` states, `per_subject` of one caller.
    pub fn bounded(max: usize, per_subject: usize) -> Self {
        Self {
            max: max.max(1),
            per_subject: per_subject.max(1),
            used: Mutex::default(),
        }
    }

    /// [`StateGuard::first_use`] at the instant `now`.
    fn first_use_at(&self, nonce: &str, subject: &str, ttl: Duration, now: Instant) -> bool {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        used.prune(now);
        if used.seen.get(nonce).is_some_and(|until| *until > now) {
            return false;
        }
        let held = used.per_subject.get(subject).copied().unwrap_or(0);
        if used.queue.len() >= self.max || held >= self.per_subject {
            return false;
        }
        let until = super::cache::later(now, ttl);
        let subject: Arc<str> = match used.per_subject.get_key_value(subject) {
            Some((s, _)) => s.clone(),
            None => subject.into(),
        };
        used.seen.insert(nonce.to_owned(), until);
        used.queue
            .push(Reverse((until, nonce.to_owned(), subject.clone())));
        *used.per_subject.entry(subject).or_default() += 1;
        true
    }

    /// States remembered now (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .queue
            .len()
    }
}

impl Default for MemoryGuard {
    fn default() -> Self {
        Self::new(100_000)
    }
}

impl StateGuard for MemoryGuard {
    fn first_use(&self, nonce: &str, subject: &str, ttl: Duration) -> impl Future<Output = bool> + Send {
        std::future::ready(self.first_use_at(nonce, subject, ttl, Instant::now()))
    }
}

/// A finished sign-in: whose tokens, for which upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// The caller the sign-in began for (`issuer|sub`).
    pub subject: String,
    /// The upstream's name.
    pub upstream: String,
    /// The browser binding it was begun and finished with.
    pub browser: String,
    /// What the authorization server issued.
    pub tokens: Tokens,
}

impl Flow {
    /// Opens a `state` this server sealed and checks it is current and for this callback.
    fn open_state(&self, sealed: &str) -> Result<State> {
        if sealed.len() > MAX_STATE {
            return Err(Error::State("is not one this server began"));
        }
        let (plain, _) = self.keys.load().open(STATE_AAD, sealed).map_err(|e| match e {
            OpenError::UnknownKey => {
                Error::State("was sealed under a key no longer in the ring: sign in again")
            }
            OpenError::Malformed | OpenError::Forged => {
                Error::State("is not one this server began (forged or altered)")
            }
        })?;
        let state: State =
            serde_json::from_slice(&plain).map_err(|_| Error::State("is not one this server began"))?;
        if state.version != 1 {
            return Err(Error::State(
                "is of a layout this server does not read: sign in again",
            ));
        }
        if now_secs() >= state.expiry {
            return Err(Error::State("has expired: sign in again"));
        }
        if state.redirect_uri != self.cfg.redirect_uri {
            return Err(Error::State("was begun for another callback URL"));
        }
        Ok(state)
    }

    /// Finishes a sign-in from the query of the redirect to the callback URL (with or without
    /// its `?`), in a browser presenting the bindings `browser` (one must be the one the
    /// sign-in began with); `guard` marks its state used. The state and the browser are
    /// checked before anything else, and the state is marked used before the code is sent.
    ///
    /// # Errors
    /// [`Error::State`]: missing, forged, expired, used; [`Error::Browser`]: another browser;
    /// [`Error::Denied`]: the server (or the user) refused; [`Error::Redirect`]: a malformed
    /// redirect; [`Error::Issuer`]: another server's answer; then as the token endpoint's
    /// exchange.
    pub async fn finish<G: StateGuard>(&self, query: &str, guard: &G, browser: &[&str]) -> Result<Completed> {
        let params = parse_query(query).map_err(Error::Redirect)?;
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let (sealed, code) = (get("state").unwrap_or_default(), get("code").unwrap_or_default());
        if sealed.is_empty() {
            return Err(Error::State("is missing from the redirect"));
        }
        let state = self.open_state(sealed)?;
        if !browser.contains(&state.browser.as_str()) {
            return Err(Error::Browser(
                "it was begun in another browser (or that browser's cookie is gone)",
            ));
        }
        if let Some(error) = get("error") {
            // Its words are anyone's (a crafted link): the code only, if it is one.
            return Err(Error::Denied(known_error(error).to_owned()));
        }
        match get("iss") {
            Some(iss) if iss != state.issuer => {
                return Err(Error::Issuer(
                    "the redirect comes from another authorization server than the sign-in began at",
                ));
            }
            None if state.iss_required => {
                return Err(Error::Issuer(
                    "the authorization server says it names itself in redirects, and this one has no `iss`",
                ));
            }
            _ => {}
        }
        if !(1..=MAX_CODE).contains(&code.len()) || !code.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Error::Redirect("the redirect has no usable `code`"));
        }
        let ttl = Duration::from_secs(state.expiry.saturating_sub(now_secs())) + USED_MARGIN;
        if !guard.first_use(&state.nonce, &state.subject, ttl).await {
            return Err(Error::State("was used already (or cannot be marked used)"));
        }
        let tokens = self.redeem(&state, code).await?;
        Ok(Completed {
            subject: state.subject,
            upstream: state.upstream,
            browser: state.browser,
            tokens,
        })
    }

    /// The code exchanged for tokens at the token endpoint the state names.
    async fn redeem(&self, state: &State, code: &str) -> Result<Tokens> {
        let asked = Asked {
            resource: &state.resource,
            issuer: &state.issuer,
            token_endpoint: &state.token_endpoint,
            client_id: &state.client.client_id,
            scope: state.scope.as_deref(),
            refresh_token: None,
            account: None,
        };
        let params = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", state.redirect_uri.as_str()),
            ("code_verifier", state.verifier.as_str()),
            ("resource", state.resource.as_str()),
        ];
        // The origins the configuration named: the upstream's, and a pinned server's.
        let named = [Some(&state.resource), state.pinned.then_some(&state.issuer)];
        let trusted: Vec<String> = named
            .into_iter()
            .flatten()
            .filter_map(|u| wire::parse_url(u).ok())
            .map(|u| wire::origin(&u))
            .collect();
        let sent = self
            .token_request(&asked, &state.client, params, &trusted, &[code, &state.verifier])
            .await;
        if let Err(Error::InvalidClient(_)) = &sent {
            // A registration the server forgot: the next sign-in registers again.
            self.forget_client(&state.issuer, &state.client.client_id);
        }
        let body = sent?;
        let mut tokens = read_tokens(&body, &asked)?;
        if state.registered {
            tokens.client_secret.clone_from(&state.client.client_secret);
            tokens.client_auth = Some(
                match state.client.auth {
                    AuthMethod::Post => "client_secret_post",
                    _ => "client_secret_basic",
                }
                .to_owned(),
            );
        }
        Ok(tokens)
    }
}

#[cfg(test)]
#[path = "callback_tests.rs"]
mod tests;
