//! What dispatch decided a transport message comes to: the one thing the transport then
//! carries out.

use super::listen::Listen;
use super::reply::Reply;
use super::tools::Deferred;

/// What to do with a transport message.
#[derive(Debug)]
pub enum Outcome {
    /// Send this answer.
    Reply(Reply),
    /// Nothing to answer (notifications, answers to the server's requests): HTTP 202.
    Accepted,
    /// A slow tool call: run it ([`Deferred::run`]) where its answer can be streamed. Boxed:
    /// the other outcomes (every fast answer) are moved through the transports' futures, and
    /// a deferred call is several times their size.
    Deferred(Box<Deferred>),
    /// A `subscriptions/listen`: serve its notification stream.
    Listen(Listen),
}

impl Outcome {
    /// The answer's bytes, if this is an answer.
    pub fn into_body(self) -> Option<Vec<u8>> {
        match self {
            Outcome::Reply(r) => Some(r.body),
            _ => None,
        }
    }
}
