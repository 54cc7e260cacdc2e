//! The key ring that seals what Quiver keeps of a user's upstream authorization: tokens at
//! rest and the `state` of a sign-in in flight. AES-256-GCM (ring), a random 96-bit nonce
//! per seal, and additional data naming where the sealed bytes belong (a ciphertext moved
//! to another slot does not open).
//!
//! The ring comes from one Secret key, one key per line, `KID:BASE64` of 32 bytes. The first
//! key seals; every key opens. Rotation: put the new key first and keep the old ones until
//! everything sealed under them has been re-sealed (a token read under an old key is
//! re-written under the first); bytes sealed under a key no longer in the ring read as
//! absent, and the user signs in again.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// Longest key id.
const MAX_KID: usize = 32;
/// Most keys in a ring.
const MAX_KEYS: usize = 16;
/// Sealed form: `v1.KID.BASE64URL(nonce || ciphertext || tag)`.
const VERSION: &str = "v1";

/// Keys to seal and open with; the first seals.
pub struct KeyRing {
    keys: Vec<(String, LessSafeKey)>,
    rng: SystemRandom,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kids: Vec<&str> = self.keys.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("KeyRing").field("kids", &kids).finish()
    }
}

/// Why sealed bytes did not open. Says nothing about the key or the plaintext.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Not of the sealed form.
    #[error("not sealed by this server")]
    Malformed,
    /// Sealed under a key no longer in the ring.
    #[error("sealed under a key that is no longer in the ring")]
    UnknownKey,
    /// The key is known but the bytes, or the slot they were sealed for, differ.
    #[error("does not open: altered, or sealed for another place")]
    Forged,
}

impl KeyRing {
    /// Parses a ring: one `KID:BASE64` per line (standard base64 of exactly 32 bytes; blank
    /// lines and lines starting with `#` are skipped). Errors name the line, never a key.
    ///
    /// # Errors
    /// No key, too many, a malformed line, a key id that repeats or is not 1-32 of
    /// `[A-Za-z0-9_-]`, a key that is not 32 bytes.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut keys: Vec<(String, LessSafeKey)> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = format!("key ring line {}", n + 1);
            let (kid, b64) = line
                .split_once(':')
                .ok_or_else(|| format!("{at}: want KID:BASE64"))?;
            let kid_ok = !kid.is_empty()
                && kid.len() <= MAX_KID
                && kid
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !kid_ok {
                return Err(format!("{at}: the key id must be 1-{MAX_KID} of A-Z a-z 0-9 _ -"));
            }
            if keys.iter().any(|(k, _)| k == kid) {
                return Err(format!("{at}: key id {kid} repeats"));
            }
            let bytes = STANDARD
                .decode(b64.trim())
                .map_err(|_| format!("{at}: the key is not base64"))?;
            if bytes.len() != 32 {
                return Err(format!(
                    "{at}: the key must be 32 bytes (AES-256), it is {}",
                    bytes.len()
                ));
            }
            let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| format!("{at}: unusable key"))?;
            keys.push((kid.to_owned(), LessSafeKey::new(key)));
            if keys.len() > MAX_KEYS {
                return Err(format!("more than {MAX_KEYS} keys in the ring"));
            }
        }
        if keys.is_empty() {
            return Err("the key ring holds no key".into());
        }
        Ok(Self {
            keys,
            rng: SystemRandom::new(),
        })
    }

    /// The id of the key that seals.
    pub fn current(&self) -> &str {
        &self.keys[0].0
    }

    /// Seals `plaintext` for the place `aad` names, under the first key.
    ///
    /// # Errors
    /// The system's random source failed (no nonce: nothing is sealed).
    pub fn seal(&self, aad: &[u8], plaintext: &[u8]) -> Result<String, String> {
        let (kid, key) = &self.keys[0];
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .map_err(|_| "the system's random source failed".to_owned())?;
        let mut buf = Vec::with_capacity(NONCE_LEN + plaintext.len() + AES_256_GCM.tag_len());
        buf.extend_from_slice(&nonce);
        buf.extend_from_slice(plaintext);
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut buf[NONCE_LEN..],
            )
            .map_err(|_| "sealing failed".to_owned())?;
        buf.extend_from_slice(tag.as_ref());
        Ok(format!("{VERSION}.{kid}.{}", URL_SAFE_NO_PAD.encode(&buf)))
    }

    /// Opens what [`seal`](Self::seal) sealed for `aad`; also says whether it was sealed
    /// under a key other than the current one (re-seal it).
    ///
    /// # Errors
    /// See [`OpenError`].
    pub fn open(&self, aad: &[u8], sealed: &str) -> Result<(Vec<u8>, bool), OpenError> {
        let mut parts = sealed.splitn(3, '.');
        let (Some(VERSION), Some(kid), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(OpenError::Malformed);
        };
        let index = self
            .keys
            .iter()
            .position(|(k, _)| k == kid)
            .ok_or(OpenError::UnknownKey)?;
        let mut buf = URL_SAFE_NO_PAD.decode(body).map_err(|_| OpenError::Malformed)?;
        if buf.len() < NONCE_LEN + AES_256_GCM.tag_len() {
            return Err(OpenError::Malformed);
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&buf[..NONCE_LEN]);
        let plain = self.keys[index]
            .1
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut buf[NONCE_LEN..],
            )
            .map_err(|_| OpenError::Forged)?;
        Ok((plain.to_vec(), index != 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> String {
        STANDARD.encode([b; 32])
    }

    #[test]
    fn sealed_bytes_open_only_for_their_place_and_under_a_known_key() {
        let ring = KeyRing::parse(&format!("# rotated 2026-11\nnew:{}\n\nold:{}\n", key(1), key(2))).unwrap();
        assert_eq!(ring.current(), "new");
        let sealed = ring.seal(b"alice|github", b"token").unwrap();
        assert!(sealed.starts_with("v1.new."));
        assert!(!sealed.contains("token"));
        assert_eq!(
            ring.open(b"alice|github", &sealed),
            Ok((b"token".to_vec(), false))
        );
        // Moved to another user's slot: does not open.
        assert_eq!(ring.open(b"mallory|github", &sealed), Err(OpenError::Forged));
        // Two seals of the same bytes differ (fresh nonce).
        assert_ne!(sealed, ring.seal(b"alice|github", b"token").unwrap());
        // Every single-byte change of the body is caught.
        let (head, body) = sealed.rsplit_once('.').unwrap();
        let raw = URL_SAFE_NO_PAD.decode(body).unwrap();
        for i in 0..raw.len() {
            let mut bad = raw.clone();
            bad[i] ^= 1;
            let forged = format!("{head}.{}", URL_SAFE_NO_PAD.encode(&bad));
            assert_eq!(
                ring.open(b"alice|github", &forged),
                Err(OpenError::Forged),
                "byte {i}"
            );
        }
        // Sealed under the old key: opens, and says to re-seal.
        let old_only = KeyRing::parse(&format!("old:{}", key(2))).unwrap();
        let by_old = old_only.seal(b"slot", b"x").unwrap();
        assert_eq!(ring.open(b"slot", &by_old), Ok((b"x".to_vec(), true)));
        // Under a key that left the ring: unknown.
        let gone = KeyRing::parse(&format!("gone:{}", key(3)))
            .unwrap()
            .seal(b"slot", b"x")
            .unwrap();
        assert_eq!(ring.open(b"slot", &gone), Err(OpenError::UnknownKey));
        // The same id with other key bytes: forged, not opened.
        let impostor = KeyRing::parse(&format!("new:{}", key(9)))
            .unwrap()
            .seal(b"slot", b"x")
            .unwrap();
        assert_eq!(ring.open(b"slot", &impostor), Err(OpenError::Forged));
    }

    #[test]
    fn malformed_sealed_bytes_are_refused_without_panicking() {
        let ring = KeyRing::parse(&format!("k:{}", key(1))).unwrap();
        for bad in [
            "",
            ".",
            "v1",
            "v1.k",
            "v1.k.",
            "v2.k.AAAA",
            "v1.k.!!!!",
            "v1.k.AAAAAAAA",
            "v1..AAAA",
            "v1.k.AAAA.BBBB",
        ] {
            assert!(ring.open(b"slot", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_bad_ring_is_refused_with_its_line_and_no_key_material() {
        let secret = key(7);
        for (text, want) in [
            (String::new(), "holds no key"),
            ("# only a comment\n".into(), "holds no key"),
            (secret.clone(), "line 1: want KID:BASE64"),
            (format!("a:{secret}\nb c:{secret}"), "line 2: the key id"),
            (format!("a:{secret}\na:{}", key(8)), "line 2: key id a repeats"),
            ("a:not-base64!".into(), "line 1: the key is not base64"),
            (
                format!("a:{}", STANDARD.encode([1u8; 16])),
                "must be 32 bytes (AES-256), it is 16",
            ),
            (
                (0..17).map(|i| format!("k{i}:{secret}\n")).collect(),
                "more than 16 keys",
            ),
        ] {
            let e = KeyRing::parse(&text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains(&secret), "{e}");
        }
    }
}
