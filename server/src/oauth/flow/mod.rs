//! The sign-in flow toward an upstream's authorization server (see [`super`]): Quiver as the
//! MCP specification's OAuth client, one caller at a time.
//!
//! 1. [`Flow::discover`]: the upstream's protected resource metadata (RFC 9728), one of its
//!    authorization servers and that server's metadata (RFC 8414 or OpenID discovery), each
//!    checked against what it claims to be, cached with a bound and a time to live.
//! 2. [`Flow::client`]: the client Quiver is at that server: pre-registered by config, a
//!    Client ID Metadata Document ([`client_metadata_document`]), or Dynamic Client
//!    Registration (RFC 7591), in that order.
//! 3. [`Flow::begin`]: the authorization request (PKCE S256, RFC 8707 `resource`); its
//!    `state` is sealed by the [`KeyRing`](crate::oauth::keyring::KeyRing), so any replica can
//!    finish the sign-in without storage shared between them, and names the browser it was
//!    begun in (the digest of a secret that browser holds).
//! 4. [`Flow::finish`]: the redirect back: the state opened, its browser checked, used once,
//!    the issuer checked (RFC 9207), the code exchanged, the tokens checked.
//!    [`Flow::refresh`] renews them.
//!
//! Everything read from the network is hostile: sizes are bounded, every exchange is timed
//! out, and no error names a token, a code, a verifier or a client secret.

mod authorize;
mod cache;
mod callback;
mod challenge;
mod discovery;
mod login;
mod register;
mod token;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::net::http::HttpClient;
use crate::oauth::keyring::KeyRing;

pub use authorize::Authorization;
pub use callback::{Completed, MAX_USED_PER_SUBJECT, MemoryGuard, StateGuard};
pub use challenge::Challenge;
pub use discovery::{Discovered, ResourceMetadata, ServerMetadata};
pub use login::{Login, LoginRequest, random};
pub use register::{AuthMethod, Client, client_metadata_document};
pub(crate) use wire::{canonical, is_loopback, known_error, parse_query, parse_url};

/// Largest JSON answer read from an upstream or an authorization server.
pub const MAX_ANSWER_BYTES: usize = 64 << 10;
/// Longest token (access, refresh, id) accepted from a token endpoint.
pub const MAX_TOKEN_BYTES: usize = 8192;
/// How long a sign-in may take, from [`Flow::begin`] to [`Flow::finish`].
pub const STATE_LIFETIME: Duration = Duration::from_secs(600);
/// Longest URL read from a document or accepted from the configuration.
const MAX_URL: usize = 2048;
/// Longest scope string requested or kept.
const MAX_SCOPE: usize = 1024;
/// An authorization server's words in an error are cut to this many characters.
const MAX_DESCRIPTION: usize = 200;

/// Why a step of the flow failed. Messages name URLs without their query and carry no
/// token, code, verifier or client secret; what a server said is cut short and redacted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The flow's or the upstream's settings are unusable.
    #[error("oauth settings: {0}")]
    Config(String),
    /// A server could not be reached in time, or its answer could not be read.
    #[error("{0}")]
    Unreachable(String),
    /// The upstream's or the authorization server's metadata is missing or refused.
    #[error("discovery: {0}")]
    Discovery(String),
    /// No client could be registered at the authorization server.
    #[error("client registration: {0}")]
    Registration(String),
    /// The authorization server (or the user) said no: an `error` answer.
    #[error("the authorization server refused: {0}")]
    Denied(String),
    /// The token endpoint refused the grant itself (`invalid_grant`: the code or refresh
    /// token is expired, revoked, used or not this client's): the user signs in again.
    /// Other refusals (`invalid_request`, `invalid_scope`, ...) are [`Error::Denied`].
    #[error("the authorization server refused the grant: {0}")]
    InvalidGrant(String),
    /// The token endpoint does not know the client (`invalid_client`: a registration it
    /// dropped or another replica made, a secret it no longer takes): a registration of this
    /// replica is forgotten, and the user signs in again.
    #[error("the authorization server refused the client: {0}")]
    InvalidClient(String),
    /// The redirect back is malformed: its query, or no usable `code`.
    #[error("the redirect: {0}")]
    Redirect(&'static str),
    /// The `state` of the redirect is not one this server began, has expired or was used.
    #[error("sign-in state {0}")]
    State(&'static str),
    /// The redirect came back to another browser than the one the sign-in began in.
    #[error("sign-in browser: {0}")]
    Browser(&'static str),
    /// The redirect names another authorization server than the one the sign-in began at.
    #[error("issuer check (RFC 9207): {0}")]
    Issuer(&'static str),
    /// The token endpoint answered something unusable.
    #[error("token endpoint: {0}")]
    Token(String),
}

impl Error {
    /// A bounded label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Config(_) => "config",
            Self::Unreachable(_) => "unreachable",
            Self::Discovery(_) => "discovery",
            Self::Registration(_) => "registration",
            Self::Denied(_) | Self::InvalidGrant(_) | Self::InvalidClient(_) => "denied",
            Self::Redirect(_) => "redirect",
            Self::State(_) => "state",
            Self::Browser(_) => "wrong_user",
            Self::Issuer(_) => "issuer",
            Self::Token(_) => "token",
        }
    }
}

/// The flow's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A client registered out of band for one upstream's authorization server.
#[derive(Clone, PartialEq, Eq)]
pub struct PreRegistered {
    /// The client id.
    pub client_id: String,
    /// The client secret, for a confidential client.
    pub client_secret: Option<String>,
}

impl std::fmt::Debug for PreRegistered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreRegistered")
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "…"))
            .finish()
    }
}

/// One upstream whose users sign in at its own authorization server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// The upstream's name in the ToolSet.
    pub name: String,
    /// Its MCP endpoint: the protected resource, and the `resource` tokens are asked for.
    pub url: String,
    /// The authorization server to use, when the upstream names several (or to refuse any
    /// other): an issuer identifier.
    pub issuer: Option<String>,
    /// A client registered out of band; without one, the flow registers itself.
    pub client: Option<PreRegistered>,
    /// The scopes to ask for (space-separated); without, those the upstream asks for.
    pub scope: Option<String>,
}

impl Upstream {
    /// The origins the configuration named: the upstream's, and the pinned authorization
    /// server's. Calls elsewhere are guarded ([`FlowConfig::guard_discovered`]).
    pub(super) fn trusted(&self) -> Vec<String> {
        [Some(self.url.as_str()), self.issuer.as_deref()]
            .into_iter()
            .flatten()
            .filter_map(|u| wire::parse_url(u).ok())
            .map(|u| wire::origin(&u))
            .collect()
    }
}

/// What the flow is configured with, the same on every replica.
#[derive(Debug, Clone)]
pub struct FlowConfig {
    /// Where authorization servers send the user back (Quiver's callback route). Fixed here:
    /// never taken from a request.
    pub redirect_uri: String,
    /// The HTTPS URL at which Quiver serves [`client_metadata_document`]; without, Client ID
    /// Metadata Documents are not used.
    pub client_metadata_url: Option<String>,
    /// The name authorization servers show users.
    pub client_name: String,
    /// Servers that documents chose (an authorization server an upstream names, the
    /// endpoints its metadata names) are called on public addresses only: not this host's,
    /// private, link-local or cloud metadata addresses, whether named or literal. Off only
    /// where such a server is meant to be local (tests).
    pub guard_discovered: bool,
    /// Limit of each HTTP exchange (connect, send, read the answer).
    pub timeout: Duration,
    /// How long discovered metadata is reused.
    pub metadata_ttl: Duration,
}

impl FlowConfig {
    /// Defaults for everything but the callback URL.
    pub fn new(redirect_uri: impl Into<String>) -> Self {
        Self {
            redirect_uri: redirect_uri.into(),
            client_metadata_url: None,
            client_name: "Quiver".to_owned(),
            guard_discovered: true,
            timeout: Duration::from_secs(5),
            metadata_ttl: Duration::from_secs(300),
        }
    }
}

/// Tokens one user holds for one upstream: the vault's [`TokenSet`](super::vault::TokenSet),
/// what a finished sign-in or a refresh hands it.
pub use super::vault::TokenSet as Tokens;

/// The flow: shared by every sign-in of a server.
#[derive(Debug)]
pub struct Flow {
    cfg: FlowConfig,
    http: HttpClient,
    keys: ArcSwap<KeyRing>,
    /// Protected resource metadata by the URL it was read from.
    resources: cache::Cache<Arc<ResourceMetadata>>,
    /// Authorization server metadata by issuer.
    servers: cache::Cache<Arc<ServerMetadata>>,
    /// Clients registered by this replica (RFC 7591), by issuer.
    clients: cache::Cache<Client>,
    /// One registration per issuer at a time.
    registering: cache::Locks,
}

impl Flow {
    /// A flow; `keys` seals the sign-in state.
    ///
    /// # Errors
    /// The callback URL or the client metadata URL is unusable: not an absolute URL, with a
    /// fragment, or plain `http` to anything but a loopback address.
    pub fn new(cfg: FlowConfig, http: HttpClient, keys: Arc<KeyRing>) -> Result<Self> {
        let redirect = wire::parse_url(&cfg.redirect_uri)
            .map_err(|e| Error::Config(format!("the callback URL: {e}")))?;
        if redirect.scheme_str() != Some("https") && !wire::is_loopback(&redirect) {
            return Err(Error::Config(
                "the callback URL must be https (plain http only to a loopback address)".into(),
            ));
        }
        if let Some(url) = &cfg.client_metadata_url {
            let u =
                wire::parse_url(url).map_err(|e| Error::Config(format!("the client metadata URL: {e}")))?;
            if u.scheme_str() != Some("https") || u.path().len() <= 1 {
                return Err(Error::Config(
                    "the client metadata URL must be https with a path (it is the client id)".into(),
                ));
            }
        }
        let ttl = cfg.metadata_ttl;
        Ok(Self {
            cfg,
            http,
            keys: ArcSwap::new(keys),
            resources: cache::Cache::new(cache::MAX_ENTRIES, ttl),
            servers: cache::Cache::new(cache::MAX_ENTRIES, ttl),
            clients: cache::Cache::new(cache::MAX_ENTRIES, register::REGISTRATION_TTL),
            registering: cache::Locks::default(),
        })
    }

    /// The flow's settings.
    pub fn config(&self) -> &FlowConfig {
        &self.cfg
    }

    /// Seals the state of sign-ins begun from now on with `keys`, and opens with it (the
    /// key ring's Secret changed): a sign-in in flight sealed under a key `keys` dropped is
    /// refused, and the user starts again.
    pub fn set_ring(&self, keys: Arc<KeyRing>) {
        self.keys.store(keys);
    }
}

#[cfg(test)]
pub(crate) mod tests;
