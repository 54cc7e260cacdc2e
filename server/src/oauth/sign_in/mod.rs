//! Each user's own sign-in to upstreams with `identity.mode: user`, put together from the
//! [`flow`](super::flow) and the [`vault`](super::vault): what the server runs when
//! `--upstream-sign-in-url` is set.
//!
//! - A call by a user without a usable token answers with a sign-in link
//!   (`{URL}/oauth/start?t=TICKET`): the ticket is sealed by the key ring and names the
//!   caller (`iss|sub` of its access token), the upstream, an expiry and a nonce
//!   ([`calls`]).
//! - The link binds the browser to that caller ([`browser`]): the browser signs in at the
//!   client-facing issuer (OpenID Connect, PKCE, `nonce`) and the ID token must name the
//!   ticket's caller; a secret set as a `__Host-` cookie when the link is opened, whose digest
//!   every later state carries, ties every later step to that browser, so a link, a redirect
//!   or an authorization URL handed to someone else completes nothing. Then the upstream's own authorization server, and the tokens go to
//!   the vault under the caller.
//! - Calls use the tokens, refresh them before they expire and once when the upstream
//!   refuses one; sign-out and an administrator's revocation forget them.
//!
//! Nothing of a token, a code, a state, a ticket or a cookie reaches logs, errors, pages,
//! audit records or metrics.

mod browser;
mod calls;
mod pages;
mod ticket;
mod warm;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use serde_json::Value;

pub use calls::{Bearer, CallAuth, SignInLink};
pub use pages::Page;

use super::flow::{self, Flow, FlowConfig, MemoryGuard, PreRegistered, StateGuard};
use super::keyring::KeyRing;
use super::vault::{self, Vault};
use crate::audit::{Actor, AuditLog, Record, Text};
use crate::metrics::oauth::OAuthMetrics;
use crate::net::http::HttpClient;
use crate::secrets::Secrets;
use crate::spec::caller::Credential;
use crate::spec::context::SecretRef;
use crate::spec::identity::Identity;

/// Longest caller subject (`iss|sub`) a ticket names.
const MAX_SUBJECT: usize = 1024;

/// A boxed future of an ID token check.
pub type Verified<'a> = std::pin::Pin<Box<dyn Future<Output = Result<Value, String>> + Send + 'a>>;

/// Checks ID tokens of the client-facing issuer: the signature with the issuer's key set,
/// `iss`, `aud` and expiry (the server's client authentication does it, with its keys).
pub trait IdTokens: Send + Sync + std::fmt::Debug {
    /// The issuer whose ID tokens are checked.
    fn issuer(&self) -> &str;
    /// The claims of `token` when it is valid and addressed to `audience`.
    fn verify<'a>(&'a self, token: &'a str, audience: &'a str) -> Verified<'a>;
}

/// What the server's upstream sign-in is configured with (its flags).
#[derive(Debug)]
pub struct SignInConfig {
    /// The public base URL browsers reach this server at (https; http only for a loopback
    /// host): the routes are `URL/oauth/start`, `URL/oauth/callback`, `URL/oauth/client.json`.
    pub url: String,
    /// The Secret value holding the key ring.
    pub keys: SecretRef,
    /// This server's browser client at the client-facing issuer.
    pub client_id: String,
    /// That client's secret (`None`: a public client).
    pub client_secret: Option<SecretRef>,
    /// The vault's bounds.
    pub vault: vault::Options,
    /// Where the vault keeps tokens.
    pub backend: vault::Backend,
    /// Authorization servers that upstreams' metadata names may be on this host or a
    /// private address (tests, which run them on loopback ports; a hidden flag). Never
    /// inferred from the URL.
    pub local_servers: bool,
}

/// The key ring as last read from the secret store.
struct Loaded {
    /// The secret store's values it was read from.
    from: Arc<Value>,
    /// The ring, or `None` when the value is missing or not a key ring.
    ring: Option<Arc<KeyRing>>,
}

/// The upstream sign-in of a server: one per process, shared by calls and routes.
pub struct SignIn {
    base: String,
    keys: SecretRef,
    client_id: String,
    client_secret: Option<SecretRef>,
    secrets: Arc<Secrets>,
    ring: ArcSwapOption<Loaded>,
    flow: Arc<Flow>,
    vault: Vault,
    /// Revocations of tokens nothing holds any longer, run off the caller's path: at most
    /// [`calls::MAX_BACKGROUND_REVOCATIONS`] at once.
    revoking: Arc<tokio::sync::Semaphore>,
    /// Used states and links, when the vault is in memory.
    used: MemoryGuard,
    /// The `Authorization` of tokens read lately.
    warm: warm::Warm,
    /// The vault is shared by replicas (Redis): warm values live at most a few seconds.
    shared: bool,
    id_tokens: Arc<dyn IdTokens>,
    metrics: Arc<OAuthMetrics>,
    audit: Option<Arc<AuditLog>>,
}

impl std::fmt::Debug for SignIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignIn")
            .field("base", &self.base)
            .field("keys", &self.keys)
            .field("client_id", &self.client_id)
            .field("vault", &self.vault)
            .finish_non_exhaustive()
    }
}

/// Checks the public base URL: absolute, https (http only to a loopback host), no query or
/// fragment; answers it without a trailing `/`.
///
/// # Errors
/// What is wrong with it.
pub fn check_url(url: &str) -> Result<String, String> {
    let u = flow::parse_url(url).map_err(|e| format!("`{url}`: {e}"))?;
    if u.scheme_str() != Some("https") && !flow::is_loopback(&u) {
        return Err(format!(
            "`{url}` must be https (browsers send sign-in codes to it); plain http only to a loopback host"
        ));
    }
    if u.query().is_some() {
        return Err(format!("`{url}` must not have a query"));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// The caller whose tokens a call uses: `iss|sub` of its validated access token (`None`
/// without either claim, or when they are too long).
pub fn subject_of(c: &Credential) -> Option<String> {
    let claims = c.claims();
    let iss = claims.get("iss").and_then(Value::as_str)?;
    let sub = claims.get("sub").and_then(Value::as_str)?;
    let ok = !iss.is_empty() && !sub.is_empty() && iss.len() + sub.len() < MAX_SUBJECT;
    ok.then(|| format!("{iss}|{sub}"))
}

/// A ring of one random key that nothing is sealed under: the flow and the vault need one
/// before the configured ring is read.
fn placeholder_ring() -> Result<KeyRing, String> {
    use base64::Engine;
    use ring::rand::{SecureRandom, SystemRandom};
    let mut key = [0u8; 32];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| "the system's random source failed".to_owned())?;
    KeyRing::parse(&format!(
        "unused:{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    ))
}

impl SignIn {
    /// The sign-in of `cfg`: its flow (callback `URL/oauth/callback`, a Client ID Metadata
    /// Document at `URL/oauth/client.json` when the URL is https), its vault, the browser
    /// check by `id_tokens`. The key ring is read from `secrets` when first needed (and again
    /// when the store changes).
    ///
    /// # Errors
    /// The URL is unusable, or no randomness for the placeholder ring.
    pub fn new(
        cfg: SignInConfig,
        http: HttpClient,
        secrets: Arc<Secrets>,
        id_tokens: Arc<dyn IdTokens>,
        metrics: Arc<OAuthMetrics>,
        audit: Option<Arc<AuditLog>>,
    ) -> Result<Self, String> {
        let base = check_url(&cfg.url)?;
        let secure = base.starts_with("https://");
        let mut fc = FlowConfig::new(format!("{base}/oauth/callback"));
        fc.client_metadata_url = secure.then(|| format!("{base}/oauth/client.json"));
        fc.guard_discovered = !cfg.local_servers;
        // Nothing is sealed before the configured ring is read: this one only fills the place.
        let placeholder = Arc::new(placeholder_ring()?);
        let flow = Flow::new(fc, http, placeholder.clone()).map_err(|e| e.to_string())?;
        let shared = matches!(cfg.backend, vault::Backend::Redis(_));
        let vault = Vault::new(placeholder, cfg.backend, cfg.vault, metrics.clone());
        secrets.pin(cfg.keys.clone());
        if let Some(s) = &cfg.client_secret {
            secrets.pin(s.clone());
        }
        Ok(Self {
            base,
            keys: cfg.keys,
            client_id: cfg.client_id,
            client_secret: cfg.client_secret,
            secrets,
            ring: ArcSwapOption::empty(),
            flow: Arc::new(flow),
            vault,
            revoking: Arc::new(tokio::sync::Semaphore::new(calls::MAX_BACKGROUND_REVOCATIONS)),
            used: MemoryGuard::default(),
            warm: warm::Warm::default(),
            shared,
            id_tokens,
            metrics,
            audit,
        })
    }

    /// The public base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// The vault (tests, the admin endpoint).
    pub fn vault(&self) -> &Vault {
        &self.vault
    }

    /// The Client ID Metadata Document, when the URL is https.
    pub fn client_metadata(&self) -> Option<Value> {
        flow::client_metadata_document(self.flow.config())
    }

    /// The key ring in force: read again when the secret store changed (a rotation applies
    /// to the next use), and handed to the flow and the vault.
    ///
    /// # Errors
    /// The Secret value is missing or is not a key ring (the error names the line, never a
    /// key).
    fn ring(&self) -> Result<Arc<KeyRing>, String> {
        let now = self.secrets.snapshot();
        if let Some(l) = self.ring.load_full()
            && Arc::ptr_eq(&l.from, &now)
        {
            return l.ring.clone().ok_or_else(|| self.no_ring());
        }
        // Tokens under a key the new ring dropped must not be used from memory.
        self.warm.clear();
        let ring = match self.secrets.get(&self.keys).map(|t| KeyRing::parse(&t)) {
            Some(Ok(r)) => {
                let r = Arc::new(r);
                self.flow.set_ring(r.clone());
                self.vault.set_ring(r.clone());
                Some(r)
            }
            Some(Err(e)) => {
                tracing::warn!(secret = %self.keys, error = %e, "upstream sign-in: the key ring is unusable; sign-ins and upstream tokens wait for a good one");
                None
            }
            None => None,
        };
        self.ring.store(Some(Arc::new(Loaded {
            from: now,
            ring: ring.clone(),
        })));
        ring.ok_or_else(|| self.no_ring())
    }

    fn no_ring(&self) -> String {
        format!(
            "upstream sign-in is unavailable: the key ring ({}) is missing or unusable",
            self.keys
        )
    }

    /// The flow's view of upstream `name` with `id` (mode `user`): its URL, the one
    /// authorization server to accept, its client (the secret read now) and scopes.
    ///
    /// # Errors
    /// The client's secret is not available.
    fn upstream(&self, name: &str, id: &Identity) -> Result<flow::Upstream, String> {
        let client = match &id.client {
            None => None,
            Some(c) => Some(PreRegistered {
                client_id: c.id.to_string(),
                client_secret: match &c.secret {
                    None => None,
                    Some(r) => Some(self.secrets.get(r).ok_or_else(|| {
                        format!("upstream `{name}`: the client secret ({r}) is not available")
                    })?),
                },
            }),
        };
        Ok(flow::Upstream {
            name: name.to_owned(),
            url: id.audience.to_string(),
            issuer: id.issuer.as_deref().map(str::to_owned),
            client,
            scope: (!id.scopes.is_empty()).then(|| id.scopes.to_string()),
        })
    }

    /// Marks a state or link nonce of a sign-in for `subject` used where the vault is:
    /// every replica sees Redis; in memory, each caller holds a bounded share.
    async fn first_use(&self, nonce: &str, subject: &str, ttl: Duration) -> bool {
        match self.vault.mark_used(nonce, ttl).await {
            Some(fresh) => fresh,
            None => self.used.first_use(nonce, subject, ttl).await,
        }
    }

    /// An audit record of `event` (`oauth.sign_in`, ...) for `subject` and `upstream`.
    fn audit(
        &self,
        event: &'static str,
        subject: &str,
        upstream: &str,
        outcome: &'static str,
        reason: Option<String>,
    ) {
        let Some(log) = &self.audit else { return };
        let (issuer, sub) = subject.split_once('|').unwrap_or(("", subject));
        let mut r = Record::new(event, outcome);
        r.caller = Some(Actor {
            subject: sub.into(),
            client_id: "".into(),
            issuer: issuer.into(),
        });
        r.upstream = Some(Text::new(upstream));
        r.reason = reason;
        log.record(r);
    }
}

#[cfg(test)]
mod tests;
