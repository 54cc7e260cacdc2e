//! An answer to send: its bytes, HTTP status and what the transport adds to it.

use crate::session::ClientCaps;

/// A JSON-RPC answer (one message's, or a batch's).
#[derive(Debug)]
pub struct Reply {
    /// The response bytes.
    pub body: Vec<u8>,
    /// Its HTTP status (transports without one ignore it).
    pub status: u16,
    /// The id of the session a successful `initialize` opened with a minted id
    /// ([`super::Opens::Minted`]): HTTP sends it as `Mcp-Session-Id`.
    pub session: Option<String>,
    /// For a refused call (403): the scopes of its `WWW-Authenticate` challenge, space
    /// separated (empty when only groups are missing).
    pub challenge: Option<String>,
    /// For a rate-limited call (429): seconds until a retry may succeed (`Retry-After`).
    pub retry_after: Option<u64>,
    /// The caps of a successful `initialize`, until dispatch opens its session.
    pub(super) opened: Option<ClientCaps>,
}

impl Reply {
    /// An answer with this status and nothing else.
    pub(super) fn new(body: Vec<u8>, status: u16) -> Self {
        Self {
            body,
            status,
            session: None,
            challenge: None,
            retry_after: None,
            opened: None,
        }
    }
}
