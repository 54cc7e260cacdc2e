//! Each user's own authorization to upstreams that run their own OAuth authorization
//! server (an upstream with `auth: {mode: user}`): Quiver acts as the MCP specification's
//! OAuth client toward that server, per caller.
//!
//! - [`keyring`]: the AES-256-GCM key ring (from a Secret) that seals tokens at rest and
//!   the `state` of a sign-in in flight;
//! - [`vault`]: the tokens each caller holds for each upstream, encrypted, in memory or in
//!   Redis, bounded, refreshed before they expire;
//! - [`flow`]: discovery, client registration, authorization code with PKCE, the callback's
//!   checks, token refresh; the browser's sign-in at the client-facing issuer;
//! - [`sign_in`]: the three put together as the server runs them: sign-in links bound to
//!   their caller, the browser's routes, the authorization of calls, sign-out and revocation.
//!
//! Below dispatch, transports and upstreams (they call it); above `net/`, `secrets/` and
//! `audit/`.

pub mod flow;
pub mod keyring;
pub mod sign_in;
pub mod vault;
