//! The authorization request: PKCE S256 (RFC 7636), the RFC 8707 `resource`, and a `state`
//! sealed by the key ring that carries everything the callback needs, so that any replica
//! can finish the sign-in without storage shared between replicas.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use super::register::Client;
use super::wire::{self, form};
use super::{Discovered, Error, Flow, Result, STATE_LIFETIME, Upstream};

/// The additional data `state` is sealed for: a sealed token does not open as a state.
pub(super) const STATE_AAD: &[u8] = b"oauth-state";
/// Version of the sealed state's layout.
const STATE_VERSION: u8 = 1;
/// Longest subject (the caller's `issuer|sub`) and upstream name a state carries.
pub(super) const MAX_SUBJECT: usize = 1024;
const MAX_UPSTREAM: usize = 256;
/// Longest browser binding.
const MAX_BROWSER: usize = 128;
/// Parameters Quiver sets in the authorization request: an endpoint that already carries
/// one of them is refused (a parameter must not be sent twice, RFC 6749 section 3.1).
const PARAMS: [&str; 8] = [
    "response_type",
    "client_id",
    "redirect_uri",
    "code_challenge",
    "code_challenge_method",
    "state",
    "resource",
    "scope",
];

/// What a sign-in in flight remembers, sealed into its `state`.
#[derive(Serialize, Deserialize)]
pub(super) struct State {
    #[serde(rename = "v")]
    pub(super) version: u8,
    /// The caller: `issuer|sub` of its client-facing token.
    #[serde(rename = "s")]
    pub(super) subject: String,
    /// The upstream's name.
    #[serde(rename = "u")]
    pub(super) upstream: String,
    /// The PKCE code verifier.
    #[serde(rename = "pv")]
    pub(super) verifier: String,
    /// Marks the state used (once).
    #[serde(rename = "n")]
    pub(super) nonce: String,
    /// Seconds since the epoch when the sign-in began, and when it expires.
    #[serde(rename = "t")]
    pub(super) created: u64,
    #[serde(rename = "e")]
    pub(super) expiry: u64,
    #[serde(rename = "r")]
    pub(super) redirect_uri: String,
    #[serde(rename = "i")]
    pub(super) issuer: String,
    /// Whether the configuration pinned that server (`identity.issuer`): its origin is then
    /// one the configuration named, called unguarded.
    #[serde(rename = "ip", default)]
    pub(super) pinned: bool,
    /// Whether the server said it puts `iss` in its redirects.
    #[serde(rename = "ir")]
    pub(super) iss_required: bool,
    #[serde(rename = "te")]
    pub(super) token_endpoint: String,
    /// The upstream's canonical URL (RFC 8707 `resource`).
    #[serde(rename = "res")]
    pub(super) resource: String,
    #[serde(rename = "c")]
    pub(super) client: Client,
    /// Whether the flow registered that client itself (RFC 7591): its secret is then kept
    /// with the tokens (a configured client's is read from its Secret).
    #[serde(rename = "cr", default)]
    pub(super) registered: bool,
    #[serde(rename = "sc", default, skip_serializing_if = "Option::is_none")]
    pub(super) scope: Option<String>,
    /// The browser the sign-in was begun in: the digest of a secret only it holds (a
    /// cookie); the redirect is finished only where that secret is presented.
    #[serde(rename = "bh")]
    pub(super) browser: String,
}

/// Where to send the user to sign in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization {
    /// The authorization server's URL with the request's parameters.
    pub url: String,
    /// The server the user signs in at.
    pub issuer: String,
    /// The client id the request names.
    pub client_id: String,
    /// When the sign-in expires (its `state` is refused after).
    pub expires_at: SystemTime,
}

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

fn random(rng: &SystemRandom, bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    rng.fill(&mut buf)
        .map_err(|_| Error::Config("the system's random source failed".into()))?;
    Ok(URL_SAFE_NO_PAD.encode(&buf))
}

/// The S256 challenge of a verifier.
pub(super) fn challenge_of(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes()))
}

impl Flow {
    /// Discovers `upstream`'s authorization server, takes a client there, and returns where
    /// to send `subject` (the caller's `issuer|sub`) to sign in, in the browser `browser`
    /// names (see [`State`]: the same value must be given to [`finish`](Self::finish)).
    /// `challenge`: the `WWW-Authenticate` value of the upstream's `401`, when there was one.
    ///
    /// # Errors
    /// As [`discover`](Self::discover), [`client`](Self::client) and
    /// [`authorize`](Self::authorize).
    pub async fn begin(
        &self,
        subject: &str,
        upstream: &Upstream,
        challenge: Option<&str>,
        browser: &str,
    ) -> Result<Authorization> {
        let found = self.discover(upstream, challenge).await?;
        let client = self.client(upstream, &found.server).await?;
        self.authorize((subject, browser), upstream, &found, &client)
    }

    /// The authorization request for `subject` in `browser` at a discovered server with
    /// `client`.
    ///
    /// # Errors
    /// [`Error::Config`]: the subject, browser or upstream name is empty or too long, the
    /// authorization endpoint already carries one of the request's parameters, or no
    /// randomness.
    pub fn authorize(
        &self,
        (subject, browser): (&str, &str),
        upstream: &Upstream,
        found: &Discovered,
        client: &Client,
    ) -> Result<Authorization> {
        if subject.is_empty()
            || subject.len() > MAX_SUBJECT
            || upstream.name.len() > MAX_UPSTREAM
            || !(1..=MAX_BROWSER).contains(&browser.len())
        {
            return Err(Error::Config(
                "the subject, the browser or the upstream name is empty or too long".into(),
            ));
        }
        let endpoint = wire::parse_url(&found.server.authorization_endpoint)
            .map_err(|e| Error::Discovery(format!("the authorization endpoint: {e}")))?;
        let given = wire::parse_query(endpoint.query().unwrap_or_default())
            .map_err(|e| Error::Discovery(format!("the authorization endpoint's query: {e}")))?;
        if given.iter().any(|(k, _)| PARAMS.contains(&k.as_str())) {
            return Err(Error::Discovery(
                "the authorization endpoint already carries a parameter of the request".into(),
            ));
        }
        let rng = SystemRandom::new();
        // 32 random bytes: a 43-character verifier (RFC 7636 section 4.1).
        let verifier = random(&rng, 32)?;
        let created = now_secs();
        let state = State {
            version: STATE_VERSION,
            subject: subject.to_owned(),
            upstream: upstream.name.clone(),
            nonce: random(&rng, 16)?,
            created,
            expiry: created + STATE_LIFETIME.as_secs(),
            redirect_uri: self.cfg.redirect_uri.clone(),
            issuer: found.server.issuer.clone(),
            pinned: upstream.issuer.is_some(),
            iss_required: found.server.authorization_response_iss_parameter_supported,
            token_endpoint: found.server.token_endpoint.clone(),
            resource: found.resource.resource.clone(),
            client: client.clone(),
            registered: upstream.client.is_none() && client.client_secret.is_some(),
            scope: found.scope.clone(),
            verifier,
            browser: browser.to_owned(),
        };
        let plain =
            serde_json::to_vec(&state).map_err(|_| Error::Config("the state does not serialize".into()))?;
        let sealed = self.keys.load().seal(STATE_AAD, &plain).map_err(Error::Config)?;
        let challenge = challenge_of(&state.verifier);
        let mut params = vec![
            ("response_type", "code"),
            ("client_id", client.client_id.as_str()),
            ("redirect_uri", self.cfg.redirect_uri.as_str()),
            ("code_challenge", challenge.as_str()),
            ("code_challenge_method", "S256"),
            ("state", sealed.as_str()),
            ("resource", state.resource.as_str()),
        ];
        if let Some(scope) = &state.scope {
            params.push(("scope", scope));
        }
        let base = &found.server.authorization_endpoint;
        let joint = if endpoint.query().is_some() { '&' } else { '?' };
        Ok(Authorization {
            url: format!("{base}{joint}{}", form(&params)),
            issuer: state.issuer,
            client_id: client.client_id.clone(),
            expires_at: UNIX_EPOCH + Duration::from_secs(state.expiry),
        })
    }
}
