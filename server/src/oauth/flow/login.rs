//! The browser's OpenID Connect sign-in at the client-facing issuer (the one that issues
//! callers' access tokens, `--auth-issuer`), which binds a sign-in link to the caller it was
//! made for: the authorization request (PKCE S256, `nonce`, a `state` the caller seals) and
//! the code exchanged for an ID token. The ID token's signature, issuer, audience and expiry
//! are checked by the caller with the issuer's key set; its `nonce` and subject too.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::Value;

use super::authorize::challenge_of;
use super::register::Client;
use super::token::Asked;
use super::wire::{self, form, origin, parse_url};
use super::{Error, Flow, MAX_TOKEN_BYTES, Result};

/// What the browser's authorization request carries.
#[derive(Debug)]
pub struct LoginRequest<'a> {
    /// The client-facing issuer.
    pub issuer: &'a str,
    /// This server's browser client there.
    pub client_id: &'a str,
    /// The `state` (sealed by the caller).
    pub state: &'a str,
    /// The `nonce` the ID token must carry.
    pub nonce: &'a str,
    /// The PKCE code verifier (its S256 challenge is sent).
    pub verifier: &'a str,
}

/// An ID token the issuer's token endpoint answered, not yet verified. `Debug` hides it.
pub struct Login {
    /// The compact JWT.
    pub id_token: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Login { id_token: <redacted> }")
    }
}

/// A random URL-safe value of `bytes` random bytes (a PKCE verifier, a nonce).
///
/// # Errors
/// The system's random source failed.
pub fn random(bytes: usize) -> Result<String> {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut buf = vec![0u8; bytes];
    SystemRandom::new()
        .fill(&mut buf)
        .map_err(|_| Error::Config("the system's random source failed".into()))?;
    Ok(URL_SAFE_NO_PAD.encode(&buf))
}

impl Flow {
    /// The URL of the issuer's authorization endpoint for `req`: code flow, scope `openid`,
    /// PKCE S256, back to this server's callback URL.
    ///
    /// # Errors
    /// The issuer's metadata cannot be read or is refused ([`Error::Discovery`]), or its
    /// authorization endpoint already carries a parameter of the request.
    pub async fn login_url(&self, req: &LoginRequest<'_>) -> Result<String> {
        let iu = parse_url(req.issuer).map_err(|e| Error::Config(format!("the issuer: {e}")))?;
        let server = self.server_metadata(req.issuer, &iu, &[origin(&iu)]).await?;
        let endpoint = parse_url(&server.authorization_endpoint)
            .map_err(|e| Error::Discovery(format!("the authorization endpoint: {e}")))?;
        let challenge = challenge_of(req.verifier);
        let params = [
            ("response_type", "code"),
            ("client_id", req.client_id),
            ("redirect_uri", self.cfg.redirect_uri.as_str()),
            ("scope", "openid"),
            ("state", req.state),
            ("nonce", req.nonce),
            ("code_challenge", challenge.as_str()),
            ("code_challenge_method", "S256"),
        ];
        let given = wire::parse_query(endpoint.query().unwrap_or_default())
            .map_err(|e| Error::Discovery(format!("the authorization endpoint's query: {e}")))?;
        if given.iter().any(|(k, _)| params.iter().any(|(p, _)| p == k)) {
            return Err(Error::Discovery(
                "the authorization endpoint already carries a parameter of the request".into(),
            ));
        }
        let joint = if endpoint.query().is_some() { '&' } else { '?' };
        Ok(format!(
            "{}{joint}{}",
            server.authorization_endpoint,
            form(&params)
        ))
    }

    /// Exchanges the `code` of the browser's redirect at `issuer` as `client` for an ID token.
    ///
    /// # Errors
    /// [`Error::Denied`] for an OAuth error answer, [`Error::Token`] for an answer without a
    /// usable `id_token`, otherwise as discovery and the token endpoint.
    pub async fn login_exchange(
        &self,
        issuer: &str,
        client: &Client,
        code: &str,
        verifier: &str,
    ) -> Result<Login> {
        let iu = parse_url(issuer).map_err(|e| Error::Config(format!("the issuer: {e}")))?;
        let server = self.server_metadata(issuer, &iu, &[origin(&iu)]).await?;
        // This server's own identity provider is the configuration's choice, and so is the
        // token endpoint its metadata names, wherever it is (a host inside the network):
        // not guarded like a server an upstream's metadata chose.
        let configured: Vec<String> = [
            Some(origin(&iu)),
            parse_url(&server.token_endpoint).ok().map(|u| origin(&u)),
        ]
        .into_iter()
        .flatten()
        .collect();
        let asked = Asked {
            resource: "",
            issuer,
            token_endpoint: &server.token_endpoint,
            client_id: &client.client_id,
            scope: None,
            refresh_token: None,
            account: None,
        };
        let params = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", self.cfg.redirect_uri.as_str()),
            ("code_verifier", verifier),
        ];
        let body = self
            .token_request(&asked, client, params, &configured, &[code, verifier])
            .await?;
        let doc: Value = serde_json::from_slice(&body)
            .map_err(|_| Error::Token("the answer is not a JSON object".into()))?;
        let id_token = doc
            .get("id_token")
            .and_then(Value::as_str)
            .filter(|t| (1..=MAX_TOKEN_BYTES).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| {
                Error::Token(
                    "the answer has no usable `id_token` (is `openid` a scope of the client?)".into(),
                )
            })?;
        Ok(Login {
            id_token: id_token.to_owned(),
        })
    }
}
