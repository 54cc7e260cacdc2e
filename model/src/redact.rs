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
//! 3. Control characters (newlines included), line and paragraph separators (U+2028,
//!    U+2029) and invisible format characters (bidi overrides and marks, zero-width spaces)
//!    become a space: one upstream line stays one log line and cannot forge another.
//! 4. The text is cut to a number of characters, marked with `…`.
//!
//! The work is bounded by the output, not the input: text far longer than the output is cut
//! before it is searched (at four bytes per output character, plus the longest known value
//! and a margin), and what a secret cut there could leave behind (the end of the searched
//! text, as long as the longest known value) is dropped after the search.
//!
//! A JSON value (an upstream's structured log data) is redacted string by string before it
//! is serialized ([`untrusted_json`]): escaping first would hide a known value that has a
//! quote, backslash or control character in it.
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
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
        )
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

/// Searched bytes beyond `max_chars * 4` and the longest known value, for the shapes: a
/// credential cut there is still matched by its prefix.
const SEARCH_MARGIN: usize = 256;

/// `text` with every value of `known` (see [`known_values`]) and every credential-shaped
/// word redacted, invisible characters turned into spaces, at most `max_chars` characters.
pub fn untrusted(text: &str, known: &[String], max_chars: usize) -> String {
    let longest = known.iter().map(String::len).max().unwrap_or(0);
    let budget = max_chars
        .saturating_mul(4)
        .saturating_add(longest)
        .saturating_add(SEARCH_MARGIN);
    let cut = text.len() > budget;
    let mut s = if cut {
        text[..floor_boundary(text, budget)].to_owned()
    } else {
        text.to_owned()
    };
    replace_known(&mut s, known);
    for shape in SHAPES.iter() {
        if let std::borrow::Cow::Owned(r) = shape.re.replace_all(&s, shape.with) {
            s = r;
        }
    }
    if cut {
        // A known value that began before the cut and went on past it was not found: its
        // beginning is in the last `longest` bytes. Those go (a marker shows the cut).
        s.truncate(floor_boundary(&s, s.len().saturating_sub(longest)));
    }
    let mut out = String::with_capacity(s.len().min(max_chars * 4));
    for (i, c) in s.chars().enumerate() {
        if i == max_chars {
            out.push('…');
            return out;
        }
        out.push(if invisible(c) { ' ' } else { c });
    }
    if cut {
        out.push('…');
    }
    out
}

/// The largest char boundary of `s` at or below `at` (`str::floor_char_boundary` is newer
/// than this crate's minimum Rust).
fn floor_boundary(s: &str, at: usize) -> usize {
    let mut at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// A JSON value as untrusted text: each string (and object key) redacted on its own first,
/// then the JSON text it serializes to, as [`untrusted`]. The work is bounded by the output:
/// the walk stops after `max_chars` strings, numbers and the like (what follows would be
/// cut anyway), and each string is searched only as far as [`untrusted`] would.
pub fn untrusted_json(value: &serde_json::Value, known: &[String], max_chars: usize) -> String {
    use serde_json::Value;
    /// Copies `v` with its strings redacted while `budget` lasts (one per scalar, string or
    /// key); what is left when it runs out is dropped.
    fn each(v: &Value, known: &[String], max_chars: usize, budget: &mut usize) -> Option<Value> {
        *budget = budget.checked_sub(1)?;
        Some(match v {
            Value::String(s) => Value::String(untrusted(s, known, max_chars)),
            Value::Array(a) => Value::Array(
                a.iter()
                    .map_while(|v| each(v, known, max_chars, budget))
                    .collect(),
            ),
            Value::Object(o) => Value::Object(
                o.iter()
                    .map_while(|(k, v)| {
                        *budget = budget.checked_sub(1)?;
                        Some((untrusted(k, known, max_chars), each(v, known, max_chars, budget)?))
                    })
                    .collect(),
            ),
            other => other.clone(),
        })
    }
    match value {
        Value::String(s) => untrusted(s, known, max_chars),
        v => {
            let mut budget = max_chars.max(1);
            let copy = each(v, known, max_chars, &mut budget).unwrap_or(Value::Null);
            untrusted(&copy.to_string(), known, max_chars)
        }
    }
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

    #[test]
    fn separators_and_format_marks_are_blanked() {
        for c in [
            '\u{2028}', '\u{2029}', '\u{061C}', '\u{00AD}', '\u{FFF9}', '\u{0085}', '\u{2066}',
        ] {
            let out = clean(&format!("a{c}b"));
            assert_eq!(out, "a b", "U+{:04X}", c as u32);
        }
    }

    #[test]
    fn work_is_bounded_by_the_output_and_a_secret_at_the_cut_leaves_nothing() {
        // A long secret, so that redacting copies of it before the cut pulls the cut's
        // neighbourhood into the output window.
        let secret: String = (0..200).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        let known = known_values([secret.as_str()]);
        let max = 64;
        for copies in 0..=4 {
            for filler in 0..800 {
                let text = format!(
                    "{}{}{secret}{}",
                    secret.repeat(copies),
                    "é".repeat(filler / 2) + &"x".repeat(filler % 2),
                    "z".repeat(1000)
                );
                let out = untrusted(&text, &known, max);
                assert!(
                    !out.contains(&secret[..8]),
                    "{copies} copies, {filler} filler: {out}"
                );
                assert!(out.chars().count() <= max + 1);
            }
        }
        // A megabyte is not searched whole.
        let out = untrusted(&"y".repeat(1 << 20), &known, max);
        assert_eq!(out.chars().count(), max + 1);
    }

    #[test]
    fn json_strings_are_redacted_before_they_are_escaped() {
        // A known value with a quote and a newline: its JSON escape is not the value.
        let secret = "pa\"ss\nword-1234";
        let known = known_values([secret]);
        let data =
            serde_json::json!({"msg": format!("login with {secret}"), "list": [secret], secret: 1, "n": 3});
        let out = untrusted_json(&data, &known, 4096);
        assert!(!out.contains("ss"), "{out}");
        assert_eq!(out.matches(REDACTED).count(), 3, "{out}");
        assert!(out.contains("\"n\":3"), "{out}");
        // Arrays of arrays of strings (the walk is cut after 64 items in all) come back cut
        // like any text, still JSON up to the cut.
        let wide = serde_json::Value::Array(vec![
            serde_json::Value::Array(vec![serde_json::json!(""); 4096]);
            256
        ]);
        let out = untrusted_json(&wide, &known, 64);
        assert_eq!(out.chars().count(), 65, "{out}");
        assert!(out.starts_with("[[\"\",\"\","), "{out}");
        // Strings stay strings.
        assert_eq!(
            untrusted_json(&serde_json::json!("x token=abc"), &known, 100),
            "x token=[redacted]"
        );
    }
}
