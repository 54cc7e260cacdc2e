//! The token endpoint: the code exchanged for tokens, tokens refreshed (RFC 6749 sections
//! 4.1.3 and 6), the client authenticated as it was registered, and every answer checked
//! before it is used.

use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::Value;

use super::challenge::scope_ok;
use super::register::{AuthMethod, Client};
use super::wire::{self, form, parse_url, said_json, scheme_ok};
use super::{Error, Flow, MAX_TOKEN_BYTES, Result, Tokens, Upstream};

/// Longest an access token is taken to live, whatever `expires_in` says.
pub const MAX_LIFETIME: Duration = Duration::from_secs(30 * 86_400);
/// Longest upstream account name kept (characters, all ASCII).
const MAX_ACCOUNT: usize = 64;

/// Who asked for the tokens, to check and complete the answer with.
pub(super) struct Asked<'a> {
    /// The RFC 8707 `resource` asked for (the upstream's canonical URL; empty: none).
    pub(super) resource: &'a str,
    pub(super) issuer: &'a str,
    pub(super) token_endpoint: &'a str,
    pub(super) client_id: &'a str,
    /// The scopes asked for: granted when the answer does not say (RFC 6749 section 5.1).
    pub(super) scope: Option<&'a str>,
    /// The refresh token kept when a refresh answer has none (RFC 6749 section 6).
    pub(super) refresh_token: Option<&'a str>,
    /// The account known before, kept when the answer does not name one.
    pub(super) account: Option<&'a str>,
}

fn token_ok(t: &str) -> bool {
    (1..=MAX_TOKEN_BYTES).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_graphic())
}

/// `expires_in`: seconds as a non-negative number (or a string of digits, as some servers
/// send), capped at [`MAX_LIFETIME`].
fn lifetime(v: &Value) -> Option<Duration> {
    let secs = match v {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0)
                .map(|f| f.min(u64::MAX as f64) as u64)
        })?,
        Value::String(s) if (1..=12).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse().ok()?
        }
        _ => return None,
    };
    Some(Duration::from_secs(secs).min(MAX_LIFETIME))
}

/// Whether `name` may be shown as an account: 1 to [`MAX_ACCOUNT`] characters a user name or
/// an email address is made of (ASCII letters and digits, `.`, `_`, `-`, `+`, `@`). The
/// name is the authorization server's word, shown on this server's page: no space, no
/// markup, no look-alike letter, nothing long enough to make a message of.
fn account_ok(name: &str) -> bool {
    (1..=MAX_ACCOUNT).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+' | b'@'))
}

/// The account an ID token from the token endpoint names, when it was issued by `issuer` to
/// `client_id`: its `preferred_username`, else its `email`, else its `sub`, when
/// [`account_ok`] allows it (else none: read for the audit trail and the user's page only,
/// unverified: the token came over the connection to the server, which says what it likes).
fn account_of(id_token: &str, issuer: &str, client_id: &str) -> Option<String> {
    if id_token.len() > MAX_TOKEN_BYTES {
        return None;
    }
    let payload = id_token.split('.').nth(1)?;
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
    let aud_ok = match claims.get("aud")? {
        Value::String(a) => a == client_id,
        Value::Array(a) => a.iter().any(|v| v.as_str() == Some(client_id)),
        _ => false,
    };
    if claims.get("iss")?.as_str()? != issuer || !aud_ok {
        return None;
    }
    ["preferred_username", "email", "sub"]
        .into_iter()
        .find_map(|k| claims.get(k)?.as_str().filter(|a| !a.is_empty()))
        .filter(|a| account_ok(a))
        .map(str::to_owned)
}

/// The tokens of a successful answer of the token endpoint.
pub(super) fn read_tokens(body: &[u8], asked: &Asked<'_>) -> Result<Tokens> {
    let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(body) else {
        return Err(Error::Token("the answer is not a JSON object".into()));
    };
    match doc.get("token_type").and_then(Value::as_str) {
        Some(t) if t.eq_ignore_ascii_case("bearer") => {}
        _ => return Err(Error::Token("the answer's `token_type` is not Bearer".into())),
    }
    let access_token = doc
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| token_ok(t))
        .ok_or_else(|| Error::Token("the answer has no usable `access_token`".into()))?;
    let now = SystemTime::now();
    let expires_at = match doc.get("expires_in") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            now + lifetime(v)
                .ok_or_else(|| Error::Token("the answer's `expires_in` is not a number of seconds".into()))?,
        ),
    };
    let refresh_token = match doc.get("refresh_token") {
        None | Some(Value::Null) => asked.refresh_token,
        Some(v) => Some(
            v.as_str()
                .filter(|t| token_ok(t))
                .ok_or_else(|| Error::Token("the answer has an unusable `refresh_token`".into()))?,
        ),
    };
    let scope = doc
        .get("scope")
        .and_then(Value::as_str)
        .filter(|s| scope_ok(s))
        .or(asked.scope);
    let account = doc
        .get("id_token")
        .and_then(Value::as_str)
        .and_then(|t| account_of(t, asked.issuer, asked.client_id))
        .or_else(|| asked.account.map(str::to_owned));
    Ok(Tokens {
        access_token: access_token.to_owned(),
        refresh_token: refresh_token.map(str::to_owned),
        expires_at,
        obtained_at: Some(now),
        scope: scope.map(str::to_owned),
        resource: asked.resource.to_owned(),
        issuer: asked.issuer.to_owned(),
        token_endpoint: asked.token_endpoint.to_owned(),
        client_id: asked.client_id.to_owned(),
        client_secret: None,
        client_auth: None,
        account,
    })
}

impl Flow {
    /// POSTs `params` to the token endpoint as `client` and returns the answer's body when it
    /// is a success. `known`: what was sent that must not come back in an error.
    ///
    /// # Errors
    /// [`Error::InvalidGrant`] for an `invalid_grant` answer (sign in again),
    /// [`Error::InvalidClient`] for `invalid_client`, [`Error::Denied`] for another OAuth
    /// error answer, [`Error::Token`] for another
    /// status, [`Error::Unreachable`].
    pub(super) async fn token_request(
        &self,
        asked: &Asked<'_>,
        client: &Client,
        mut params: Vec<(&str, &str)>,
        trusted: &[String],
        known: &[&str],
    ) -> Result<bytes::Bytes> {
        let plain_ok = asked.issuer.starts_with("http://");
        let u = parse_url(asked.token_endpoint)
            .ok()
            .filter(|u| scheme_ok(u, plain_ok))
            .ok_or_else(|| Error::Token("the token endpoint is not a usable URL".into()))?;
        let secret = client.client_secret.as_deref().unwrap_or_default();
        let mut authorization = None;
        match client.auth {
            AuthMethod::None => params.push(("client_id", &client.client_id)),
            AuthMethod::Post => {
                params.push(("client_id", &client.client_id));
                params.push(("client_secret", secret));
            }
            AuthMethod::Basic => {
                let pair = format!(
                    "{}:{}",
                    crate::template::percent_encode(&client.client_id),
                    crate::template::percent_encode(secret)
                );
                authorization = Some(format!("Basic {}", STANDARD.encode(pair)));
            }
        }
        let body = form(&params);
        let a = self
            .post(
                &u,
                "application/x-www-form-urlencoded",
                body,
                authorization,
                self.guard(&u, trusted),
            )
            .await?;
        if a.status.is_success() {
            return Ok(a.body);
        }
        let mut known = known.to_vec();
        known.push(secret);
        if matches!(a.status.as_u16(), 400 | 401) {
            let said = said_json(&a.body, &known);
            let code = serde_json::from_slice::<Value>(&a.body).ok();
            let code = code.as_ref().and_then(|d| d.get("error")).and_then(Value::as_str);
            return Err(match code {
                Some("invalid_grant") => Error::InvalidGrant(said),
                Some("invalid_client") => Error::InvalidClient(said),
                _ => Error::Denied(said),
            });
        }
        Err(Error::Token(format!(
            "{} answered {}",
            crate::net::http::redacted(&u),
            a.status
        )))
    }

    /// Renews `tokens` with their refresh token at the server that issued them. The refresh
    /// token is kept when the server issues no new one (RFC 6749 section 6). With a client
    /// registered out of band, only at the server `issuer` names, at the token endpoint its
    /// metadata names now.
    ///
    /// # Errors
    /// [`Error::InvalidGrant`]: there is no refresh token, or the server refused it (the
    /// user signs in again); [`Error::InvalidClient`]: the server does not know the client
    /// (a registration of this replica is forgotten; the user signs in again);
    /// [`Error::Issuer`]: the tokens are of another server than `issuer` names; otherwise as
    /// the code exchange.
    pub async fn refresh(&self, tokens: &Tokens, upstream: &Upstream) -> Result<Tokens> {
        let refresh_token = tokens.refresh_token.as_deref().ok_or_else(|| {
            Error::InvalidGrant("no refresh token was issued: the user signs in again".into())
        })?;
        let up = parse_url(&upstream.url).map_err(|e| Error::Config(format!("the upstream's URL: {e}")))?;
        if upstream.issuer.as_deref().is_some_and(|i| i != tokens.issuer) {
            return Err(Error::Issuer(
                "the tokens were issued by another authorization server than `issuer` names",
            ));
        }
        let resource = wire::canonical(&up);
        let (client, token_endpoint) = self.refreshing_client(tokens, upstream, &up).await?;
        let asked = Asked {
            resource: &resource,
            issuer: &tokens.issuer,
            token_endpoint: &token_endpoint,
            client_id: &tokens.client_id,
            scope: tokens.scope.as_deref(),
            refresh_token: Some(refresh_token),
            account: tokens.account.as_deref(),
        };
        let params = vec![
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh_token),
            ("resource", resource.as_str()),
        ];
        let sent = self
            .token_request(
                &asked,
                &client,
                params,
                &upstream.trusted(),
                &[refresh_token, &tokens.access_token],
            )
            .await;
        if let Err(Error::InvalidClient(_)) = &sent {
            self.forget_client(&tokens.issuer, &tokens.client_id);
        }
        read_tokens(&sent?, &asked)
    }

    /// Revokes `tokens` at the authorization server that issued them (RFC 7009): the refresh
    /// token, then the access token, as the client that obtained them. `Ok(false)`: the
    /// server names no revocation endpoint. Each request is timed out like every other.
    ///
    /// # Errors
    /// [`Error::Issuer`]: the tokens are of another server than `issuer` names (nothing is
    /// sent); otherwise as discovery and the token endpoint.
    pub async fn revoke(&self, tokens: &Tokens, upstream: &Upstream) -> Result<bool> {
        let up = parse_url(&upstream.url).map_err(|e| Error::Config(format!("the upstream's URL: {e}")))?;
        if upstream.issuer.as_deref().is_some_and(|i| i != tokens.issuer) {
            return Err(Error::Issuer(
                "the tokens were issued by another authorization server than `issuer` names",
            ));
        }
        let trusted = upstream.trusted();
        let meta = self.server_metadata(&tokens.issuer, &up, &trusted).await?;
        let Some(endpoint) = meta.revocation_endpoint.as_deref() else {
            return Ok(false);
        };
        let (client, _) = self.refreshing_client(tokens, upstream, &up).await?;
        let asked = Asked {
            resource: "",
            issuer: &tokens.issuer,
            token_endpoint: endpoint,
            client_id: &tokens.client_id,
            scope: None,
            refresh_token: None,
            account: None,
        };
        let access = tokens.access_token.as_str();
        let refresh = tokens.refresh_token.as_deref();
        let known = [access, refresh.unwrap_or_default()];
        let each = refresh
            .map(|r| (r, "refresh_token"))
            .into_iter()
            .chain([(access, "access_token")]);
        for (token, hint) in each {
            let params = vec![("token", token), ("token_type_hint", hint)];
            self.token_request(&asked, &client, params, &trusted, &known)
                .await?;
        }
        Ok(true)
    }

    /// The client that obtained `tokens` and the token endpoint to refresh them at: the
    /// configured one at its server's current token endpoint; else the registered one whose
    /// secret the tokens keep (any replica has it), the one this replica registered, or a
    /// public client by that id, at the endpoint the tokens came from.
    async fn refreshing_client(
        &self,
        tokens: &Tokens,
        upstream: &Upstream,
        up: &http::Uri,
    ) -> Result<(Client, String)> {
        if let Some(pre) = upstream
            .client
            .as_ref()
            .filter(|c| c.client_id == tokens.client_id)
        {
            let Some(issuer) = upstream.issuer.as_deref() else {
                return Err(Error::Config(
                    "a configured client is used only at the authorization server `issuer` names".into(),
                ));
            };
            let meta = self.server_metadata(issuer, up, &upstream.trusted()).await?;
            let client = super::register::pre_registered(pre, &meta.token_endpoint_auth_methods_supported);
            return Ok((client, meta.token_endpoint.clone()));
        }
        let kept = tokens.client_secret.as_ref().map(|secret| Client {
            client_id: tokens.client_id.clone(),
            client_secret: Some(secret.clone()),
            auth: match tokens.client_auth.as_deref() {
                Some("client_secret_post") => AuthMethod::Post,
                _ => AuthMethod::Basic,
            },
        });
        let client = kept
            .or_else(|| {
                self.registered(&tokens.issuer)
                    .filter(|c| c.client_id == tokens.client_id)
            })
            .unwrap_or_else(|| Client {
                client_id: tokens.client_id.clone(),
                client_secret: None,
                auth: AuthMethod::None,
            });
        Ok((client, tokens.token_endpoint.clone()))
    }
}
