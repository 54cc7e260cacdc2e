//! What differs between the protocol eras, as data: how a result is stamped, how an error
//! is reported and which HTTP status it gets. One router serves both with these.

use super::error::RpcError;
use crate::protocol::{self, FORBIDDEN, INVALID_PARAMS, RESOURCE_NOT_FOUND};

/// One protocol era's way of answering.
#[derive(Debug)]
pub(super) struct Revision {
    /// Stateless (2026-07-28): requests carry `_meta` (checked before routing), results are
    /// stamped, there is no `initialize` or session.
    pub stateless: bool,
    /// The code an unknown resource is reported with.
    unknown_resource: i32,
    /// Whether that error names the resource in `data`.
    unknown_resource_data: bool,
    /// The HTTP status of an error answer, by code.
    status: fn(i32) -> u16,
}

/// The handshake era (2025-03-26, 2025-06-18, 2025-11-25).
pub(super) const HANDSHAKE: Revision = Revision {
    stateless: false,
    unknown_resource: RESOURCE_NOT_FOUND,
    unknown_resource_data: false,
    status: handshake_status,
};

/// The stateless revision (2026-07-28).
pub(super) const STATELESS: Revision = Revision {
    stateless: true,
    unknown_resource: INVALID_PARAMS,
    unknown_resource_data: true,
    status: protocol::stateless_http_status,
};

/// Errors are answers (200), except a refused call (403, for its `WWW-Authenticate`) and a
/// rate-limited one (429, for its `Retry-After`).
fn handshake_status(code: i32) -> u16 {
    match code {
        FORBIDDEN => 403,
        protocol::RATE_LIMITED => 429,
        _ => 200,
    }
}

/// How a method's result is stamped under 2026-07-28.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stamp {
    /// `resultType` and the server's identity.
    Plain,
    /// Those and cache hints (lists, reads).
    Cached,
    /// The handler writes its answer stamped (or as an `InputRequiredResult`).
    Own,
}

impl Revision {
    /// The error as this era reports it.
    pub(super) fn refine(&self, mut e: RpcError) -> RpcError {
        if e.code == RESOURCE_NOT_FOUND {
            e.code = self.unknown_resource;
            if !self.unknown_resource_data {
                e.data = None;
            }
        }
        e
    }

    /// The HTTP status of an error answer with `code`.
    pub(super) fn status(&self, code: i32) -> u16 {
        (self.status)(code)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::dispatch::error::ErrorData;

    #[test]
    fn an_unknown_resource_is_reported_per_era() {
        let e = || RpcError::new(RESOURCE_NOT_FOUND, "Resource not found: x").with_data(json!({"uri": "x"}));
        let h = HANDSHAKE.refine(e());
        assert_eq!((h.code, h.data), (RESOURCE_NOT_FOUND, None));
        let s = STATELESS.refine(e());
        assert_eq!(
            (s.code, s.data),
            (INVALID_PARAMS, Some(ErrorData::Json(json!({"uri": "x"}))))
        );
        let other = RpcError::invalid_params("y");
        assert_eq!(HANDSHAKE.refine(other.clone()), other);
    }

    #[test]
    fn statuses_per_era() {
        assert_eq!(HANDSHAKE.status(INVALID_PARAMS), 200);
        assert_eq!(HANDSHAKE.status(protocol::METHOD_NOT_FOUND), 200);
        assert_eq!(HANDSHAKE.status(FORBIDDEN), 403);
        assert_eq!(STATELESS.status(INVALID_PARAMS), 400);
        assert_eq!(STATELESS.status(protocol::METHOD_NOT_FOUND), 404);
        assert_eq!(STATELESS.status(FORBIDDEN), 403);
        assert_eq!(STATELESS.status(protocol::INTERNAL_ERROR), 200);
    }
}
