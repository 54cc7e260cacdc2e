//! Credentials an http tool builds per call from Secrets (an imported OpenAPI operation's
//! security scheme): HTTP basic from a user name and password, and OAuth2 client credentials,
//! whose token quiver-server fetches, keeps until shortly before it expires, and fetches
//! again on expiry or when the API answers 401.

use crate::spec::context::SecretRef;

/// A credential sent as `Authorization`.
#[derive(Debug, Clone)]
pub enum Auth {
    /// `Basic base64(user:password)`.
    Basic {
        /// The user name.
        user: SecretRef,
        /// The password.
        password: SecretRef,
    },
    /// `Bearer TOKEN` of a client credentials grant, shared by the operations of a source.
    OAuth2(std::sync::Arc<OAuth2>),
}

impl Auth {
    /// The Secret values it reads.
    pub fn secrets(&self) -> Vec<SecretRef> {
        match self {
            Self::Basic { user, password } => vec![user.clone(), password.clone()],
            Self::OAuth2(o) => vec![o.client_id.clone(), o.client_secret.clone()],
        }
    }
}

/// An OAuth2 client credentials grant and its current token.
#[derive(Debug)]
pub struct OAuth2 {
    /// The token endpoint.
    pub token_url: String,
    /// The client id.
    pub client_id: SecretRef,
    /// The client secret.
    pub client_secret: SecretRef,
    /// Space-separated scopes requested (empty: none sent).
    pub scope: String,
    /// The server's token cache for this grant (set on first use).
    pub token: crate::slot::RuntimeSlot,
}

impl OAuth2 {
    /// A grant with no token yet.
    pub fn new(token_url: String, client_id: SecretRef, client_secret: SecretRef, scope: String) -> Self {
        Self {
            token_url,
            client_id,
            client_secret,
            scope,
            token: crate::slot::RuntimeSlot::default(),
        }
    }

    /// Whether `other` asks the same endpoint for the same token.
    pub fn same_grant(&self, other: &Self) -> bool {
        self.token_url == other.token_url
            && self.client_id == other.client_id
            && self.client_secret == other.client_secret
            && self.scope == other.scope
    }
}
