//! The `Bearer` challenge of an upstream's `401` (RFC 6750 section 3, RFC 9728 section 5.1):
//! where its protected resource metadata is and which scopes it asks for.

use super::MAX_SCOPE;

/// Longest `WWW-Authenticate` value read.
const MAX_HEADER: usize = 4096;

/// What a `Bearer` challenge says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Challenge {
    /// `resource_metadata`: the URL of the protected resource metadata.
    pub resource_metadata: Option<String>,
    /// `scope`: the scopes the request needs (well-formed scope tokens only).
    pub scope: Option<String>,
    /// `error`, e.g. `insufficient_scope`.
    pub error: Option<String>,
}

fn tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Whether `s` is a space-separated list of RFC 6749 scope tokens.
pub(super) fn scope_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_SCOPE
        && s.split(' ').all(|t| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b == 0x21 || (0x23..=0x5B).contains(&b) || (0x5D..=0x7E).contains(&b))
        })
}

struct Reader<'a> {
    s: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn skip(&mut self, set: &[u8]) {
        while self.s.get(self.at).is_some_and(|b| set.contains(b)) {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn token(&mut self) -> Option<String> {
        let start = self.at;
        while self.peek().is_some_and(tchar) {
            self.at += 1;
        }
        (self.at > start).then(|| String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
    }

    /// A quoted string (the opening quote next), unescaped.
    fn quoted(&mut self) -> Option<String> {
        self.at += 1;
        let mut out = Vec::new();
        loop {
            match self.peek()? {
                b'"' => {
                    self.at += 1;
                    return String::from_utf8(out).ok();
                }
                b'\\' => {
                    self.at += 1;
                    out.push(self.peek()?);
                }
                b if b < 0x20 && b != b'\t' => return None,
                b => out.push(b),
            }
            self.at += 1;
        }
    }
}

impl Challenge {
    /// The `Bearer` challenge among those of a `WWW-Authenticate` value (several may be
    /// joined by commas). `None`: no `Bearer` challenge, or a value that does not parse
    /// (too long, unterminated quotes, a parameter given twice).
    pub fn parse(header: &str) -> Option<Self> {
        if header.len() > MAX_HEADER {
            return None;
        }
        let mut r = Reader {
            s: header.as_bytes(),
            at: 0,
        };
        let mut params: Option<Vec<(String, String)>> = None;
        let mut in_bearer = false;
        loop {
            r.skip(b" \t,");
            if r.peek().is_none() {
                break;
            }
            let word = r.token()?;
            r.skip(b" \t");
            if r.peek() == Some(b'=') {
                r.at += 1;
                r.skip(b" \t");
                let value = match r.peek() {
                    Some(b'"') => r.quoted()?,
                    // token68 padding or an empty value: nothing of interest.
                    Some(b'=' | b',') | None => {
                        r.skip(b"=");
                        continue;
                    }
                    Some(_) => r.token()?,
                };
                if in_bearer && let Some(p) = params.as_mut() {
                    let name = word.to_ascii_lowercase();
                    if p.iter().any(|(k, _)| *k == name) {
                        return None;
                    }
                    p.push((name, value));
                }
            } else {
                // A new challenge: its scheme.
                in_bearer = word.eq_ignore_ascii_case("bearer") && params.is_none();
                if in_bearer {
                    params = Some(Vec::new());
                }
            }
        }
        let params = params?;
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        Some(Self {
            resource_metadata: get("resource_metadata"),
            scope: get("scope").filter(|s| scope_ok(s)),
            error: get("error").filter(|e| e.len() <= 64 && e.bytes().all(tchar)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_challenge_is_found_among_others_and_its_parameters_read() {
        let c = Challenge::parse(
            r#"DPoP algs="ES256", Bearer error="insufficient_scope", scope="files:read  files:write", resource_metadata="https://r.example/.well-known/oauth-protected-resource/mcp", Basic realm="x""#,
        )
        .unwrap();
        assert_eq!(
            c.resource_metadata.as_deref(),
            Some("https://r.example/.well-known/oauth-protected-resource/mcp")
        );
        // Two spaces in a row: not a scope list; dropped, not used.
        assert_eq!(c.scope, None);
        assert_eq!(c.error.as_deref(), Some("insufficient_scope"));
        let c = Challenge::parse(r#"bearer scope="a b", resource_metadata="https://r.example/prm""#).unwrap();
        assert_eq!(c.scope.as_deref(), Some("a b"));
        assert_eq!(c.resource_metadata.as_deref(), Some("https://r.example/prm"));
        // A URL is a quoted string; bare, it does not parse (and discovery falls back).
        assert_eq!(
            Challenge::parse("Bearer resource_metadata=https://r.example/prm"),
            None
        );
        let c = Challenge::parse(r#"Bearer realm="a \"quoted\" realm", scope="x""#).unwrap();
        assert_eq!(c.scope.as_deref(), Some("x"));
        assert_eq!(Challenge::parse("Bearer").unwrap(), Challenge::default());
        assert_eq!(
            Challenge::parse("Negotiate abc==, Bearer").unwrap(),
            Challenge::default()
        );
    }

    #[test]
    fn hostile_challenges_are_refused_without_panicking() {
        for bad in [
            "",
            "Basic realm=\"x\"",
            "Bearer scope=\"unterminated",
            "Bearer scope=\"a\", scope=\"b\"",
            "Bearer scope=\"a\u{1}b\"",
            "Bearer scope=\"trailing\\",
            "Bearer \u{e9}=1",
        ] {
            assert_eq!(Challenge::parse(bad).and_then(|c| c.scope), None, "{bad:?}");
        }
        assert_eq!(
            Challenge::parse(&format!("Bearer realm=\"{}\"", "a".repeat(MAX_HEADER))),
            None
        );
        let c = Challenge::parse("Bearer error=\"bad error\"").unwrap();
        assert_eq!(c.error, None);
        let long_scope = format!("Bearer scope=\"{}\"", "s".repeat(MAX_SCOPE + 1));
        assert_eq!(Challenge::parse(&long_scope).unwrap().scope, None);
    }
}
