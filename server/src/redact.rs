//! Redaction of text that comes from outside the server (an upstream's stderr, its log
//! notifications, its error messages and server info) before it is logged, stored, shown on
//! `/status` or copied by the operator into conditions and events.
//!
//! The rule, applied in this order by [`untrusted`]:
//! 1. Every known value (the secrets store's values, and each line of a multi-line value
//!    such as the client token list) of at least [`MIN_KNOWN_LEN`] bytes becomes
//!    [`REDACTED`].
//! 2. Credentials by their shape, configured or not:
//!    - the word after `Bearer` or `Basic` (any case);
//!    - everything after `Authorization:` / `Proxy-Authorization:` (or `=`) up to the end
//!      of the line or a quote;
//!    - the value after a key naming a credential (a key containing `token`, `secret`,
//!      `password`, `passwd`, `api_key`/`api-key`/`apikey`, `cookie` or `private_key`, any
//!      case) and `:` or `=`, up to a space, quote, `,`, `;` or `&`;
//!    - tokens with a well-known prefix (`ghp_` and the other GitHub kinds, `github_pat_`,
//!      `glpat-`, `xoxb-`-style Slack tokens, `sk-`, `sk_live_`, `rk_live_`, `AKIA`/`ASIA`,
//!      `AIza`) followed by at least 8 token characters, and JWTs (`eyJ…`);
//!    - the user part of a URL (`https://user:pass@host` → `https://[redacted]@host`).
//!
//!    This may hide a harmless word (`tokens: 5`): the safe side.
//! 3. Control characters (newlines included) and invisible format characters (bidi
//!    overrides, zero-width spaces) become a space: one upstream line stays one log line and
//!    cannot forge another.
//! 4. The text is cut to a number of characters, marked with `…`.
//!
//! Text that encodes a secret (base64 of it, split by other characters) is not recognized.

use std::sync::LazyLock;

use regex::Regex;

/// What replaces a secret.
pub const REDACTED: &str = "[redacted]";
/// Known values shorter than this are not searched for (every `a` would go).
pub const MIN_KNOWN_LEN: usize = 4;

struct Shape {
    re: Regex,
    with: &'static str,
}

static SHAPES: LazyLock<Vec<Shape>> = LazyLock::new(|| {
    let shape = |re: &str, with: &'static str| Regex::new(re).map(|re| Shape { re, with }).ok();
    [
        shape(r"(?i)\b((?:proxy-)?authorization[\x22']?\s*[:=]\s*[\x22']?)[^\r\n\x22']+", "${1}[redacted]"),
        shape(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=-]+", "${1}${2}[redacted]"),
        shape(
            r"(?i)\b([A-Za-z0-9_.-]*(?:token|secret|password|passwd|api[_-]?key|cookie|private[_-]?key)[A-Za-z0-9_.-]*[\x22']?\s*[:=]\s*[\x22']?)[^\s\x22',;&]+",
            "${1}[redacted]",
        ),
        shape(
            r"\b(?:gh[pousr]_|github_pat_|glpat-|xox[abposr]-|sk-|sk_live_|sk_test_|rk_live_|AKIA|ASIA|AIza)[A-Za-z0-9_-]{8,}",
            "[redacted]",
        ),
        shape(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*", "[redacted]"),
        shape(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@", "${1}[redacted]@"),
    ]
    .into_iter()
    .flatten()
    .collect()
});

/// Characters that do not print but change how text reads: control characters, bidi
/// controls, zero-width characters.
fn invisible(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{206F}' | '\u{FEFF}')
}

/// The values to look for in untrusted text, from secret values: each value and each line
/// of a multi-line value, at least [`MIN_KNOWN_LEN`] bytes, longest first (a value that
/// contains another is replaced whole), without duplicates.
pub fn known_values<'a>(values: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for v in values {
        out.push(v.to_owned());
        if v.contains('\n') {
            out.extend(v.lines().map(|l| l.trim().to_owned()));
        }
    }
    out.retain(|v| v.len() >= MIN_KNOWN_LEN);
    out.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    out.dedup();
    out
}

/// Replaces each of `known` (longest first) found in `s` with [`REDACTED`].
pub fn replace_known<S: AsRef<str>>(s: &mut String, known: &[S]) {
    for v in known {
        let v = v.as_ref();
        if s.contains(v) {
            *s = s.replace(v, REDACTED);
        }
    }
}

/// `text` with every value of `known` (see [`known_values`]) and every credential-shaped
/// word redacted, invisible characters turned into spaces, at most `max_chars` characters.
pub fn untrusted(text: &str, known: &[String], max_chars: usize) -> String {
    let mut s = text.to_owned();
    replace_known(&mut s, known);
    for shape in SHAPES.iter() {
        if let std::borrow::Cow::Owned(r) = shape.re.replace_all(&s, shape.with) {
            s = r;
        }
    }
    let mut out = String::with_capacity(s.len().min(max_chars * 4));
    for (i, c) in s.chars().enumerate() {
        if i == max_chars {
            out.push('…');
            break;
        }
        out.push(if invisible(c) { ' ' } else { c });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        untrusted(s, &[], 4096)
    }

    #[test]
    fn every_shape_compiles() {
        assert_eq!(SHAPES.len(), 6);
    }

    #[test]
    fn known_values_go_whole_and_line_by_line() {
        let known = known_values([
            "tok-123456",
            "tok-123456-extended",
            "ab",
            "client-one\nclient-two\n",
        ]);
        assert_eq!(
            untrusted(
                "a tok-123456-extended b tok-123456 c ab d client-two",
                &known,
                1000
            ),
            "a [redacted] b [redacted] c ab d [redacted]"
        );
        assert!(!known.iter().any(|v| v == "ab"));
    }

    #[test]
    fn credentials_by_shape_are_redacted() {
        let cases = [
            ("invalid credentials: Bearer ghp_abcdefghijklmnop1234", "ghp_"),
            ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpw"),
            ("got header authorization: token deadbeefcafe1234", "deadbeef"),
            ("{\"Authorization\":\"Custom k=v-secret-thing\"}", "secret-thing"),
            ("request failed: api_key=abc123xyz&x=1", "abc123xyz"),
            ("X-Api-Key: k3y-value-123", "k3y-value"),
            ("{\"password\": \"hunter22\"}", "hunter22"),
            ("client_secret=s3cr3tvalue", "s3cr3tvalue"),
            ("OpenAI says sk-proj-AbCdEfGh12345678 is wrong", "AbCdEfGh"),
            ("slack xoxb-1234567890-abcdefghij", "1234567890"),
            ("aws AKIAIOSFODNN7EXAMPLE denied", "IOSFODNN"),
            ("glpat-abcdefghij1234567890 expired", "abcdefghij"),
            ("github_pat_11ABCDEFG0123456789_abcdef revoked", "11ABCDEFG"),
            (
                "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl rejected",
                "c2lnbmF0dXJl",
            ),
            ("fetching https://user:p4ssw0rd@example.com/x failed", "p4ssw0rd"),
            ("clone https://ghtoken123456@github.com/o/r", "ghtoken123456"),
            ("Set-Cookie: session=abcdef0123456789", "abcdef0123"),
        ];
        for (text, secret) in cases {
            let out = clean(text);
            assert!(!out.contains(secret), "{text:?} became {out:?}");
            assert!(out.contains(REDACTED), "{text:?} became {out:?}");
        }
    }

    #[test]
    fn ordinary_text_is_kept() {
        for text in [
            "connection refused (os error 111)",
            "tools/list took 3s; task-runner ready on disk-usage",
            "error -32602: unknown tool `get_issue`",
            "https://example.com/mcp answered 503",
        ] {
            assert_eq!(clean(text), text);
        }
    }

    #[test]
    fn control_and_invisible_characters_cannot_forge_lines() {
        let out = clean("ok\nERROR forged line\r\x1b[31mred\u{202E}txt\u{200B}\0end");
        assert!(!out.chars().any(invisible), "{out:?}");
        assert_eq!(out, "ok ERROR forged line  [31mred txt  end");
    }

    #[test]
    fn the_length_is_bounded_in_characters_after_redaction() {
        let known = known_values(["0123456789-secret"]);
        // A secret at the cut is redacted first, never cut in half and shown.
        let text = format!("{}0123456789-secret", "é".repeat(5));
        let out = untrusted(&text, &known, 8);
        assert_eq!(out, "ééééé[re…");
        assert!(!out.contains("0123"));
        let long = "x".repeat(100_000);
        assert_eq!(untrusted(&long, &[], 10).chars().count(), 11);
    }
}
