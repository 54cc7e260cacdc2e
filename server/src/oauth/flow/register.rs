//! The client Quiver is at an authorization server, in the MCP specification's order of
//! preference: a client registered out of band (config), a Client ID Metadata Document (the
//! client id is the HTTPS URL of a document Quiver serves), else Dynamic Client Registration
//! (RFC 7591), done once per server and kept.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::wire::{self, said_json};
use super::{Error, Flow, FlowConfig, PreRegistered, Result, ServerMetadata, Upstream};

/// How long a registered client is reused (unless its secret expires sooner).
pub(super) const REGISTRATION_TTL: Duration = Duration::from_secs(86_400);
/// Longest client id or client secret accepted from a registration.
const MAX_CLIENT_FIELD: usize = 512;

/// How the client authenticates at the token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthMethod {
    /// A public client: `client_id` in the request, no secret (PKCE protects the code).
    #[serde(rename = "none")]
    None,
    /// HTTP Basic with the form-encoded id and secret (RFC 6749 section 2.3.1).
    #[serde(rename = "client_secret_basic")]
    Basic,
    /// `client_id` and `client_secret` in the request body.
    #[serde(rename = "client_secret_post")]
    Post,
}

/// A client at one authorization server. `Debug` prints no secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Client {
    /// The client id.
    #[serde(rename = "id")]
    pub client_id: String,
    /// The secret of a confidential client.
    #[serde(rename = "secret", default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// How it authenticates.
    #[serde(rename = "auth")]
    pub auth: AuthMethod,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "…"))
            .field("auth", &self.auth)
            .finish()
    }
}

/// The Client ID Metadata Document Quiver serves at `client_metadata_url` (`None` without
/// one): the client id is that URL.
pub fn client_metadata_document(cfg: &FlowConfig) -> Option<Value> {
    let url = cfg.client_metadata_url.as_ref()?;
    let mut doc = registration_request(cfg);
    doc["client_id"] = json!(url);
    Some(doc)
}

/// What Quiver asks to be registered as: a public client using the code grant with PKCE.
fn registration_request(cfg: &FlowConfig) -> Value {
    json!({
        "client_name": cfg.client_name,
        "redirect_uris": [cfg.redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    })
}

/// A printable value without spaces, 1 to [`MAX_CLIENT_FIELD`] bytes.
fn field_ok(s: &str) -> bool {
    (1..=MAX_CLIENT_FIELD).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic())
}

/// The client a registration answer describes, and how long to keep it.
fn read_registration(body: &[u8], cfg: &FlowConfig) -> Result<(Client, Duration)> {
    let refuse = |why: &str| Error::Registration(format!("the registration answer {why}"));
    let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(body) else {
        return Err(refuse("is not a JSON object"));
    };
    let client_id = doc
        .get("client_id")
        .and_then(Value::as_str)
        .filter(|s| field_ok(s))
        .ok_or_else(|| refuse("has no usable `client_id`"))?;
    let secret = match doc.get("client_secret") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_str()
                .filter(|s| field_ok(s))
                .ok_or_else(|| refuse("has an unusable `client_secret`"))?,
        ),
    };
    let auth = match doc.get("token_endpoint_auth_method").and_then(Value::as_str) {
        Some("none") => AuthMethod::None,
        Some("client_secret_basic") => AuthMethod::Basic,
        Some("client_secret_post") => AuthMethod::Post,
        // RFC 7591 section 2: client_secret_basic when not said.
        None if secret.is_some() => AuthMethod::Basic,
        None => AuthMethod::None,
        Some(_) => return Err(refuse("names a client authentication method Quiver does not use")),
    };
    if auth != AuthMethod::None && secret.is_none() {
        return Err(refuse("names a client secret method but no `client_secret`"));
    }
    if let Some(uris) = doc.get("redirect_uris").and_then(Value::as_array)
        && !uris.iter().any(|u| u.as_str() == Some(cfg.redirect_uri.as_str()))
    {
        return Err(refuse(
            "does not keep Quiver's callback URL among the `redirect_uris`",
        ));
    }
    let mut keep = REGISTRATION_TTL;
    if let Some(at) = doc.get("client_secret_expires_at").and_then(Value::as_u64)
        && at > 0
        && secret.is_some()
    {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        keep = keep.min(Duration::from_secs(at).saturating_sub(now));
        if keep.is_zero() {
            return Err(refuse("holds a client secret that has expired"));
        }
    }
    let client = Client {
        client_id: client_id.to_owned(),
        client_secret: if auth == AuthMethod::None {
            None
        } else {
            secret.map(str::to_owned)
        },
        auth,
    };
    Ok((client, keep))
}

/// A client registered out of band: public without a secret, else HTTP Basic unless the
/// server only takes the secret in the body.
pub(super) fn pre_registered(pre: &PreRegistered, methods: &[String]) -> Client {
    let auth = match &pre.client_secret {
        None => AuthMethod::None,
        Some(_)
            if !methods.iter().any(|m| m == "client_secret_basic")
                && methods.iter().any(|m| m == "client_secret_post") =>
        {
            AuthMethod::Post
        }
        Some(_) => AuthMethod::Basic,
    };
    Client {
        client_id: pre.client_id.clone(),
        client_secret: pre.client_secret.clone(),
        auth,
    }
}

impl Flow {
    /// The client to sign `upstream`'s users in at `server` with.
    ///
    /// # Errors
    /// [`Error::Registration`]: the server offers no way to be a client and none is
    /// configured, or its registration endpoint refused or answered something unusable.
    pub async fn client(&self, upstream: &Upstream, server: &ServerMetadata) -> Result<Client> {
        if let Some(pre) = &upstream.client {
            if !field_ok(&pre.client_id) {
                return Err(Error::Config("the configured client id is not usable".into()));
            }
            // A client registered out of band belongs to one server: its secret and codes go
            // there, never to a server the upstream's metadata chose.
            if upstream.issuer.as_deref() != Some(server.issuer.as_str()) {
                return Err(Error::Config(
                    "a configured client is used only at the authorization server `issuer` names".into(),
                ));
            }
            return Ok(pre_registered(pre, &server.token_endpoint_auth_methods_supported));
        }
        if server.client_id_metadata_document_supported
            && let Some(url) = &self.cfg.client_metadata_url
        {
            return Ok(Client {
                client_id: url.clone(),
                client_secret: None,
                auth: AuthMethod::None,
            });
        }
        let Some(endpoint) = &server.registration_endpoint else {
            return Err(Error::Registration(
                "the authorization server offers neither client metadata documents (or none is \
                 configured) nor dynamic registration: configure a client for this upstream"
                    .into(),
            ));
        };
        self.register(&server.issuer, endpoint, &upstream.trusted()).await
    }

    /// The client registered at `issuer` by this replica, registering it first when there is
    /// none (one registration per server at a time).
    async fn register(&self, issuer: &str, endpoint: &str, trusted: &[String]) -> Result<Client> {
        if let Some(c) = self.clients.get(issuer) {
            return Ok(c);
        }
        let lock = self.registering.of(issuer);
        let _one = lock.lock().await;
        if let Some(c) = self.clients.get(issuer) {
            return Ok(c);
        }
        let u = wire::parse_url(endpoint).map_err(|e| Error::Registration(format!("the endpoint: {e}")))?;
        let body = registration_request(&self.cfg).to_string();
        let a = self
            .post(&u, "application/json", body, None, self.guard(&u, trusted))
            .await?;
        if !a.status.is_success() {
            return Err(Error::Registration(format!(
                "{} answered {}: {}",
                crate::net::http::redacted(&u),
                a.status,
                said_json(&a.body, &[])
            )));
        }
        let (client, keep) = read_registration(&a.body, &self.cfg)?;
        self.clients.put_for(issuer.to_owned(), client.clone(), keep);
        Ok(client)
    }

    /// The client this replica registered at `issuer`, if it still knows it (refreshing
    /// tokens that a confidential registered client obtained needs its secret).
    pub fn registered(&self, issuer: &str) -> Option<Client> {
        self.clients.get(issuer)
    }

    /// Forgets the client registered at `issuer` (the server no longer knows it: the next
    /// sign-in registers again).
    pub fn forget_registration(&self, issuer: &str) {
        self.clients.remove(issuer);
    }

    /// Forgets the client registered at `issuer` if it is `client_id` (the server refused
    /// it: `invalid_client`); a newer registration, or a configured client, stays.
    pub(super) fn forget_client(&self, issuer: &str, client_id: &str) {
        if self.registered(issuer).is_some_and(|c| c.client_id == client_id) {
            self.forget_registration(issuer);
        }
    }
}
