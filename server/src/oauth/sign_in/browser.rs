//! The routes a user's browser takes: `GET /oauth/start?t=TICKET` and `GET /oauth/callback`
//! (twice: back from the client-facing issuer, then back from the upstream's authorization
//! server).
//!
//! 1. `start`: the ticket opened; a random secret set as a `__Host-` cookie for this browser;
//!    a redirect to the client-facing issuer (OpenID Connect code flow, PKCE, `nonce`) with a
//!    browser state that carries the ticket's facts and the secret's digest.
//! 2. `callback` with a browser state: the state opened and the secret must be there, then
//!    the ticket is marked used, then the code is exchanged, the ID token verified, and its
//!    `iss|sub` must be the ticket's caller (else 403: the link was made for another user);
//!    the flow begins for that caller and upstream, its state carrying the secret's digest;
//!    a redirect to the upstream's authorization server.
//! 3. `callback` with the flow's state: the flow finishes (state opened, the browser's
//!    secret checked against it, used once, issuer checked, then the code exchanged), and the
//!    tokens go to the vault. A cookie of another sign-in, or one a sibling subdomain tried
//!    to plant, completes nothing.
//!
//! The cookies are `Secure` even when the URL is plain http to a loopback host: browsers
//! treat loopback origins as secure contexts and keep them there; a client that does not
//! cannot complete a sign-in on such a URL (meant for tests and development anyway).

use super::pages::{Page, flow_error};
use super::ticket::{self, BROWSER_AAD, BROWSER_PREFIX, Browser, LIFETIME, TICKET_AAD, Ticket};
use super::{SignIn, flow};
use crate::oauth::flow::{AuthMethod, Client, LoginRequest, StateGuard};
use crate::spec::identity::{Identity, IdentityMode};

/// Finds the identity of an upstream by name in the configuration in force (`None`: no such
/// upstream, or not of mode `user`).
pub type Lookup<'a> = &'a (dyn Fn(&str) -> Option<Identity> + Sync);

/// A state guard over the sign-in's vault (Redis) or memory.
struct Used<'a>(&'a SignIn);

impl StateGuard for Used<'_> {
    async fn first_use(&self, nonce: &str, subject: &str, ttl: std::time::Duration) -> bool {
        self.0.first_use(nonce, subject, ttl).await
    }
}

/// The value of `name` in a query (`None`: absent or the query is malformed).
fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

impl SignIn {
    /// `Set-Cookie` of the `__Host-` cookie `name` holding `value` for the sign-in's
    /// lifetime (`None`: cleared): `Secure`, `Path=/` and no `Domain`, as the prefix needs.
    pub(super) fn cookie(&self, name: &str, value: Option<&str>) -> String {
        let (value, age) = value.map_or(("", 0), |v| (v, LIFETIME));
        format!("{name}={value}; Path=/; Max-Age={age}; HttpOnly; SameSite=Lax; Secure")
    }

    /// This server's browser client at the client-facing issuer.
    fn browser_client(&self) -> Result<Client, String> {
        let secret = match &self.client_secret {
            None => None,
            Some(r) => Some(self.secrets.get(r).ok_or_else(|| {
                format!("The sign-in client's secret ({r}) is not available to the server.")
            })?),
        };
        Ok(Client {
            client_id: self.client_id.clone(),
            auth: if secret.is_some() {
                AuthMethod::Basic
            } else {
                AuthMethod::None
            },
            client_secret: secret,
        })
    }

    /// `GET /oauth/start` with `query`.
    pub async fn start(&self, query: &str, lookup: Lookup<'_>) -> Page {
        let ring = match self.ring() {
            Ok(r) => r,
            Err(e) => return Page::failed(&format!("{e}.")),
        };
        let params = flow::parse_query(query).unwrap_or_default();
        let t: Ticket = match param(&params, "t").map(|t| ticket::open(&ring, TICKET_AAD, t)) {
            Some(Ok(t)) => t,
            Some(Err(why)) => return Page::refused(&format!("This sign-in link {}.", why.say())),
            None => return Page::refused("This address is not a sign-in link."),
        };
        if lookup(&t.u).is_none() {
            return Page::plain(
                404,
                "Unknown upstream",
                "This server no longer signs users in to this upstream.",
            );
        }
        let made = (|| {
            let verifier = flow::random(32).map_err(|e| e.to_string())?;
            let nonce = flow::random(16).map_err(|e| e.to_string())?;
            let cookie = flow::random(32).map_err(|e| e.to_string())?;
            let b = Browser::new(&t, verifier, nonce, &cookie);
            let sealed = ticket::seal(&ring, BROWSER_AAD, &b)?;
            Ok::<_, String>((b, format!("{BROWSER_PREFIX}{sealed}"), cookie))
        })();
        let (b, state, cookie) = match made {
            Ok(m) => m,
            Err(e) => return Page::failed(&format!("{e}.")),
        };
        let req = LoginRequest {
            issuer: self.id_tokens.issuer(),
            client_id: &self.client_id,
            state: &state,
            nonce: &b.on,
            verifier: &b.pv,
        };
        match self.flow.login_url(&req).await {
            Ok(url) => {
                Page::redirect(url).with_cookie(self.cookie(&ticket::cookie_name(&t.n), Some(&cookie)))
            }
            Err(e) => {
                tracing::warn!(error = %e, "upstream sign-in: the client-facing issuer cannot be used");
                Page::failed("The identity provider of this server cannot be reached.")
            }
        }
    }

    /// `GET /oauth/callback` with `query` and the request's `Cookie` header.
    pub async fn callback(&self, query: &str, cookie: Option<&str>, lookup: Lookup<'_>) -> Page {
        let params = match flow::parse_query(query) {
            Ok(p) => p,
            Err(why) => return Page::refused(&format!("The redirect is malformed ({why}).")),
        };
        match param(&params, "state") {
            Some(s) if s.starts_with(BROWSER_PREFIX) => self.bound(&params, cookie, lookup).await,
            _ => self.finished(query, cookie).await,
        }
    }

    /// Back from the client-facing issuer: the browser proves it is the ticket's caller.
    async fn bound(&self, params: &[(String, String)], cookie: Option<&str>, lookup: Lookup<'_>) -> Page {
        let ring = match self.ring() {
            Ok(r) => r,
            Err(e) => return Page::failed(&format!("{e}.")),
        };
        let sealed = param(params, "state").unwrap_or_default();
        let b: Browser = match ticket::open(&ring, BROWSER_AAD, &sealed[BROWSER_PREFIX.len()..]) {
            Ok(b) => b,
            Err(why) => {
                return self.refused("state", &Page::refused(&format!("This sign-in {}.", why.say())));
            }
        };
        let fail = |result: &'static str, page: Page| {
            self.metrics.sign_in(&b.u, result);
            self.audit(
                "oauth.sign_in",
                &b.s,
                &b.u,
                result,
                Some(format!("{}", page.status)),
            );
            page
        };
        let secret = ticket::cookies(cookie)
            .into_iter()
            .map(|(_, v)| v)
            .find(|v| ticket::digest(v) == b.bh);
        let Some(secret) = secret else {
            return fail(
                "wrong_user",
                Page::forbidden("This sign-in was started in another browser (or its cookie is gone)."),
            );
        };
        if let Some(e) = param(params, "error") {
            let why = flow::known_error(e);
            return fail(
                "denied",
                Page::refused(&format!("The identity provider refused the sign-in ({why}).")),
            );
        }
        if param(params, "iss").is_some_and(|iss| iss != self.id_tokens.issuer()) {
            return fail(
                "issuer",
                Page::refused("The redirect comes from another identity provider."),
            );
        }
        // Used before the code is sent anywhere: a replayed redirect exchanges nothing.
        let ttl = std::time::Duration::from_secs(b.te.saturating_sub(ticket::now()) + 2 * LIFETIME);
        if !self.first_use(&b.n, &b.s, ttl).await {
            return fail(
                "state",
                Page::refused(
                    "This sign-in link was used already (or too many of your sign-ins are under way: finish or wait for them).",
                ),
            );
        }
        let subject = match self.who(&b, param(params, "code").unwrap_or_default()).await {
            Ok(s) => s,
            Err((result, page)) => return fail(result, page),
        };
        if subject != b.s {
            tracing::warn!(upstream = %b.u, "upstream sign-in: a link was opened by another user than the one it was made for; refused");
            return fail(
                "wrong_user",
                Page::forbidden(
                    "This sign-in link was made for another user: open a link your own client gave you.",
                ),
            );
        }
        self.begin(&b, secret, lookup)
            .await
            .unwrap_or_else(|(r, p)| fail(r, p))
    }

    /// The caller the browser signed in as: the code exchanged, the ID token verified, its
    /// `nonce` checked; `iss|sub`.
    async fn who(&self, b: &Browser, code: &str) -> Result<String, (&'static str, Page)> {
        let client = self.browser_client().map_err(|e| ("config", Page::failed(&e)))?;
        let login = self
            .flow
            .login_exchange(self.id_tokens.issuer(), &client, code, &b.pv)
            .await
            .map_err(|e| {
                tracing::info!(upstream = %b.u, reason = e.kind(), error = %e, "upstream sign-in: the identity provider's code exchange failed");
                let why = flow_error(&e);
                (e.kind(), Page::refused(&format!("The identity provider's answer was refused: {why}.")))
            })?;
        let claims = self
            .id_tokens
            .verify(&login.id_token, &self.client_id)
            .await
            .map_err(|e| {
                (
                    "token",
                    Page::refused(&format!("The identity provider's ID token was refused ({e}).")),
                )
            })?;
        if claims.get("nonce").and_then(serde_json::Value::as_str) != Some(b.on.as_str()) {
            return Err((
                "state",
                Page::refused("The identity provider's ID token is not for this sign-in."),
            ));
        }
        let iss = claims
            .get("iss")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        let sub = claims
            .get("sub")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        Ok(format!("{iss}|{sub}"))
    }

    /// The flow begun for the bound caller in this browser (its `secret`): a redirect to the
    /// upstream's authorization server, the cookie kept for the sign-in's lifetime again.
    async fn begin(
        &self,
        b: &Browser,
        secret: &str,
        lookup: Lookup<'_>,
    ) -> Result<Page, (&'static str, Page)> {
        let id = lookup(&b.u)
            .filter(|i| i.mode == IdentityMode::User)
            .ok_or_else(|| {
                (
                    "config",
                    Page::plain(
                        404,
                        "Unknown upstream",
                        "This server no longer signs users in to this upstream.",
                    ),
                )
            })?;
        let up = self
            .upstream(&b.u, &id)
            .map_err(|e| ("config", Page::failed(&format!("{e}."))))?;
        let auth = self.flow.begin(&b.s, &up, None, &b.bh).await.map_err(|e| {
            tracing::warn!(upstream = %b.u, reason = e.kind(), error = %e, "upstream sign-in: cannot begin at the upstream's authorization server");
            let why = flow_error(&e);
            (e.kind(), Page::failed(&format!("The upstream's authorization server cannot be used: {why}.")))
        })?;
        Ok(Page::redirect(auth.url).with_cookie(self.cookie(&ticket::cookie_name(&b.n), Some(secret))))
    }

    /// Back from the upstream's authorization server: the flow finished in the browser it
    /// began in (a secret of this browser's cookies is the one its state names), the tokens
    /// kept.
    async fn finished(&self, query: &str, cookie: Option<&str>) -> Page {
        let held: Vec<(&str, String)> = ticket::cookies(cookie)
            .into_iter()
            .map(|(name, secret)| (name, ticket::digest(secret)))
            .collect();
        let digests: Vec<&str> = held.iter().map(|(_, d)| d.as_str()).collect();
        let done = match self.flow.finish(query, &Used(self), &digests).await {
            Ok(d) => d,
            Err(e) => {
                tracing::info!(reason = e.kind(), error = %e, "upstream sign-in: the redirect back from an upstream's authorization server was refused");
                let why = flow_error(&e);
                let page = match &e {
                    flow::Error::Browser(_) => {
                        tracing::warn!(
                            "upstream sign-in: a redirect came back to another browser than the one that began it; nothing stored"
                        );
                        Page::forbidden(
                            "This sign-in was finished in another browser than the one that began it.",
                        )
                    }
                    flow::Error::State(_)
                    | flow::Error::Redirect(_)
                    | flow::Error::Issuer(_)
                    | flow::Error::Denied(_)
                    | flow::Error::InvalidGrant(_)
                    | flow::Error::InvalidClient(_) => {
                        Page::refused(&format!("The upstream's answer was refused: {why}."))
                    }
                    _ => Page::failed(&format!("The upstream's sign-in failed: {why}.")),
                };
                return self.refused(e.kind(), &page);
            }
        };
        let (subject, upstream) = (done.subject.as_str(), done.upstream.as_str());
        let name = held
            .iter()
            .find(|(_, d)| *d == done.browser)
            .map_or("", |(n, _)| *n);
        let clear = self.cookie(name, None);
        self.warm.forget(subject, Some(upstream));
        if let Err(e) = self.vault.put(subject, upstream, &done.tokens).await {
            self.metrics.sign_in(upstream, "vault");
            self.audit("oauth.sign_in", subject, upstream, "vault", Some(e.to_string()));
            return Page::failed(&format!("{e}.")).with_cookie(clear);
        }
        self.metrics.sign_in(upstream, "ok");
        let account = done
            .tokens
            .account
            .as_deref()
            .map(|a| format!("upstream account {a}, as its authorization server reports it"));
        self.audit("oauth.sign_in", subject, upstream, "ok", account);
        tracing::info!(upstream, "upstream sign-in: a user signed in");
        // The account linked, so that a user who signed in as someone else upstream notices:
        // the server's word (an ID token not verified), in a few plain characters.
        let text = match &done.tokens.account {
            Some(a) => format!(
                "You are signed in to {upstream}. Its authorization server reports the account {a}. If that is not your account there, call sign_out_upstream now. Otherwise return to your client and retry: its calls now act as that account there."
            ),
            None => format!(
                "You are signed in to {upstream}. Return to your client and retry: its calls now act as you there."
            ),
        };
        Page::plain(200, &format!("Signed in to {upstream}"), &text).with_cookie(clear)
    }

    /// A refused redirect or state, counted (the upstream is not known when the state does
    /// not open).
    fn refused(&self, result: &'static str, page: &Page) -> Page {
        self.metrics.sign_in("unknown", result);
        page.clone()
    }
}
