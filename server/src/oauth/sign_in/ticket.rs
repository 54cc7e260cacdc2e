//! What a sign-in carries between its steps, each sealed by the key ring for a place of its
//! own (the additional data differs, so one never opens as another, nor as the flow's
//! `state` or a vault token):
//!
//! - the [`Ticket`] of a sign-in link: who asked, for which upstream, until when, a nonce;
//! - the [`Browser`] state of the sign-in at the client-facing issuer (the ticket's facts, the
//!   PKCE verifier, the OpenID `nonce`, the digest of the browser's secret).
//!
//! And the cookies a request carries, read within bounds: `__Host-` cookies holding a secret
//! drawn for the browser that opened a link, whose digest the browser state and then the
//! upstream flow's state carry.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::oauth::keyring::{KeyRing, OpenError};

/// The additional data of each kind.
pub(super) const TICKET_AAD: &[u8] = b"quiver-oauth-ticket";
pub(super) const BROWSER_AAD: &[u8] = b"quiver-oauth-browser";
/// Layout version of every kind.
const VERSION: u8 = 1;
/// Longest sealed value opened (ticket, state, cookie).
pub(super) const MAX_SEALED: usize = 8192;
/// How long a link and each step of the sign-in may take, in seconds.
pub(super) const LIFETIME: u64 = 600;
/// What a browser state is marked as, so the callback tells it from the flow's.
pub(super) const BROWSER_PREFIX: &str = "b.";
/// The names of the cookies of sign-ins in flight start with this. `__Host-`: browsers keep
/// such a cookie only when it is `Secure`, has `Path=/` and no `Domain`, set by this very
/// host, so a sibling subdomain cannot plant one (cookie tossing).
pub(super) const COOKIE_PREFIX: &str = "__Host-quiver-oauth-";
/// Most cookies read from one request, and the longest value read.
const MAX_COOKIES: usize = 16;

/// Seconds since the epoch.
pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The facts of a sign-in link.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Ticket {
    pub(super) v: u8,
    /// The caller: `iss|sub`.
    pub(super) s: String,
    /// The upstream.
    pub(super) u: String,
    /// Expiry (seconds since the epoch).
    pub(super) e: u64,
    /// The link's nonce: marked used when a browser completes the link.
    pub(super) n: String,
}

/// The sign-in of a browser at the client-facing issuer, in flight.
#[derive(Serialize, Deserialize)]
pub(super) struct Browser {
    pub(super) v: u8,
    pub(super) s: String,
    pub(super) u: String,
    /// The ticket's nonce and expiry.
    pub(super) n: String,
    pub(super) te: u64,
    pub(super) e: u64,
    /// PKCE code verifier.
    pub(super) pv: String,
    /// The OpenID `nonce` the ID token must carry.
    pub(super) on: String,
    /// SHA-256 (hex) of the secret set as a cookie when the link was opened.
    pub(super) bh: String,
}

/// A sealed kind with a version and an expiry.
pub(super) trait Sealed: Serialize + DeserializeOwned {
    fn version(&self) -> u8;
    fn expiry(&self) -> u64;
}

impl Sealed for Ticket {
    fn version(&self) -> u8 {
        self.v
    }
    fn expiry(&self) -> u64 {
        self.e
    }
}

impl Sealed for Browser {
    fn version(&self) -> u8 {
        self.v
    }
    fn expiry(&self) -> u64 {
        self.e
    }
}

impl Ticket {
    pub(super) fn new(subject: &str, upstream: &str, nonce: String) -> Self {
        Self {
            v: VERSION,
            s: subject.to_owned(),
            u: upstream.to_owned(),
            e: now() + LIFETIME,
            n: nonce,
        }
    }
}

impl Browser {
    pub(super) fn new(t: &Ticket, verifier: String, nonce: String, cookie: &str) -> Self {
        Self {
            v: VERSION,
            s: t.s.clone(),
            u: t.u.clone(),
            n: t.n.clone(),
            te: t.e,
            e: now() + LIFETIME,
            pv: verifier,
            on: nonce,
            bh: digest(cookie),
        }
    }
}

/// SHA-256 of `s`, in hex.
pub(super) fn digest(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Seals `v` for `aad`.
pub(super) fn seal<T: Sealed>(ring: &KeyRing, aad: &[u8], v: &T) -> Result<String, String> {
    let plain = serde_json::to_vec(v).map_err(|_| "a sign-in value does not serialize".to_owned())?;
    ring.seal(aad, &plain)
}

/// Why a sealed value was refused: worded for the user's page, naming nothing of the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// Not one this server sealed for this place (forged, altered, of another kind).
    Forged,
    /// Sealed under a key no longer in the ring.
    OldKey,
    /// Past its expiry.
    Expired,
}

impl Refused {
    pub(super) fn say(self) -> &'static str {
        match self {
            Self::Forged => "is not one this server made (altered, or of another step)",
            Self::OldKey => "was made under a key this server no longer has",
            Self::Expired => "has expired",
        }
    }
}

/// Opens what [`seal`] sealed for `aad`, current and of this layout.
pub(super) fn open<T: Sealed>(ring: &KeyRing, aad: &[u8], sealed: &str) -> Result<T, Refused> {
    if sealed.is_empty() || sealed.len() > MAX_SEALED {
        return Err(Refused::Forged);
    }
    let (plain, _) = ring.open(aad, sealed).map_err(|e| match e {
        OpenError::UnknownKey => Refused::OldKey,
        OpenError::Malformed | OpenError::Forged => Refused::Forged,
    })?;
    let v: T = serde_json::from_slice(&plain).map_err(|_| Refused::Forged)?;
    if v.version() != VERSION {
        return Err(Refused::Forged);
    }
    if now() >= v.expiry() {
        return Err(Refused::Expired);
    }
    Ok(v)
}

/// The sign-in cookies of a `Cookie` header (`__Host-quiver-oauth-*`; no other name is
/// read): at most a few, each value within [`MAX_SEALED`] bytes.
pub(super) fn cookies(header: Option<&str>) -> Vec<(&str, &str)> {
    header
        .unwrap_or_default()
        .split(';')
        .filter_map(|c| c.trim().split_once('='))
        .filter(|(k, v)| k.starts_with(COOKIE_PREFIX) && !v.is_empty() && v.len() <= MAX_SEALED)
        .take(MAX_COOKIES)
        .collect()
}

/// The name of the cookie of the sign-in of ticket nonce `n`.
pub(super) fn cookie_name(nonce: &str) -> String {
    let tag: String = nonce
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(16)
        .collect();
    format!("{COOKIE_PREFIX}{tag}")
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    use super::*;

    fn ring(b: u8) -> KeyRing {
        KeyRing::parse(&format!(
            "k:{}",
            base64::engine::general_purpose::STANDARD.encode([b; 32])
        ))
        .unwrap()
    }

    #[test]
    fn each_kind_opens_only_as_itself_under_its_ring_and_before_its_expiry() {
        let r = ring(1);
        let t = Ticket::new("https://idp|alice", "github", "n0nce".into());
        let sealed = seal(&r, TICKET_AAD, &t).unwrap();
        let back: Ticket = open(&r, TICKET_AAD, &sealed).unwrap();
        assert_eq!(
            (back.s.as_str(), back.u.as_str()),
            ("https://idp|alice", "github")
        );
        assert!(!sealed.contains("alice") && !sealed.contains("github"));
        // A ticket is not a browser state; another ring opens nothing.
        assert_eq!(
            open::<Browser>(&r, BROWSER_AAD, &sealed).err(),
            Some(Refused::Forged)
        );
        assert_eq!(
            open::<Ticket>(&ring(2), TICKET_AAD, &sealed).err(),
            Some(Refused::Forged)
        );
        let other = KeyRing::parse(&format!(
            "gone:{}",
            base64::engine::general_purpose::STANDARD.encode([3; 32])
        ))
        .unwrap();
        let by_gone = seal(&other, TICKET_AAD, &t).unwrap();
        assert_eq!(
            open::<Ticket>(&r, TICKET_AAD, &by_gone).err(),
            Some(Refused::OldKey)
        );
        // Expired, another layout, oversized, garbage.
        let mut old = t.clone();
        old.e = now() - 1;
        let sealed = seal(&r, TICKET_AAD, &old).unwrap();
        assert_eq!(
            open::<Ticket>(&r, TICKET_AAD, &sealed).err(),
            Some(Refused::Expired)
        );
        let mut future = t.clone();
        future.v = 2;
        let sealed = seal(&r, TICKET_AAD, &future).unwrap();
        assert_eq!(
            open::<Ticket>(&r, TICKET_AAD, &sealed).err(),
            Some(Refused::Forged)
        );
        let huge = "v1.k.".to_owned() + &"A".repeat(MAX_SEALED);
        assert_eq!(open::<Ticket>(&r, TICKET_AAD, &huge).err(), Some(Refused::Forged));
        for junk in ["", "v1", "v1.k.!!", "b.v1.k.AAAA"] {
            assert!(open::<Ticket>(&r, TICKET_AAD, junk).is_err(), "{junk}");
        }
    }

    #[test]
    fn only_sign_in_cookies_are_read_and_within_bounds() {
        let long = "x".repeat(MAX_SEALED + 1);
        let header = format!(
            "a=1; __Host-quiver-oauth-abc=v1; __Host-quiver-oauth-empty=; __Host-quiver-oauth-long={long};  __Host-quiver-oauth-d=two=parts"
        );
        assert_eq!(
            cookies(Some(&header)),
            vec![
                ("__Host-quiver-oauth-abc", "v1"),
                ("__Host-quiver-oauth-d", "two=parts")
            ]
        );
        assert!(cookies(None).is_empty());
        // Without the prefix (a sibling subdomain can set those for this host): not read.
        let tossed = "quiver-oauth-abc=v1; __Secure-quiver-oauth-x=v; __host-quiver-oauth-y=v";
        assert!(cookies(Some(tossed)).is_empty());
        let many: String = (0..40).map(|i| format!("__Host-quiver-oauth-{i}=v; ")).collect();
        assert_eq!(cookies(Some(&many)).len(), MAX_COOKIES);
        assert_eq!(
            cookie_name("a-b_c.DEF0123456789xyzXYZ"),
            "__Host-quiver-oauth-abcDEF0123456789"
        );
    }
}
