//! The rules of documents that describe a server to anyone who asks (the operator's catalog
//! entries, quiver-server's server card): tenant text made one line and cut to the
//! registry's limits, the strong ETags their `If-None-Match` requests are answered by, and
//! the HTML escape of pages that show such text to people.

use sha2::{Digest, Sha256};

/// `s` cut to at most `max` characters (on a character boundary), with `…` as the last
/// character when something was cut.
pub fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Characters that reorder or hide text (bidirectional controls, zero-width marks).
pub fn hidden(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// A one-line text: control characters (new lines included) become spaces, characters
/// that reorder or hide text are dropped, runs of spaces become one, and the ends are
/// trimmed.
pub fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars().filter(|c| !hidden(*c)) {
        let c = if c.is_control() { ' ' } else { c };
        if c == ' ' && (out.is_empty() || out.ends_with(' ')) {
            continue;
        }
        out.push(c);
    }
    out.trim_end().to_owned()
}

/// `s` escaped for HTML text and attribute values (quoted with `"` or `'`).
pub fn html(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The strong ETag of `body`: the first 128 bits of its SHA-256, quoted.
pub fn etag(body: &[u8]) -> String {
    let digest = Sha256::digest(body);
    let mut tag = String::with_capacity(34);
    tag.push('"');
    for b in &digest[..16] {
        tag.push_str(&format!("{b:02x}"));
    }
    tag.push('"');
    tag
}

/// Whether `If-None-Match` values (each a comma-separated list) name `tag`, weakly or
/// strongly, or are `*`: the client holds the body and gets 304.
pub fn held<'a>(if_none_match: impl IntoIterator<Item = &'a str>, tag: &str) -> bool {
    if_none_match
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|t| t == "*" || t.trim_start_matches("W/") == tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_one_line_cut_on_characters() {
        assert_eq!(one_line(" a\n\tb\u{202e}c  d \u{7}"), "a bc d");
        assert_eq!(cut("éééé", 3), "éé…");
        assert_eq!(cut("éé", 2), "éé");
        assert_eq!(
            html("<a href=\"x\" title='y'>&\n"),
            "&lt;a href=&quot;x&quot; title=&#39;y&#39;&gt;&amp;\n"
        );
    }

    #[test]
    fn an_etag_is_held_by_its_strong_or_weak_form_or_a_star() {
        let tag = etag(b"body");
        assert_eq!(tag.len(), 34);
        assert_ne!(tag, etag(b"other"));
        assert!(held([format!("\"x\", W/{tag}").as_str()], &tag));
        assert!(held(["*"], &tag));
        assert!(!held(["\"x\""], &tag));
        assert!(!held([], &tag));
    }
}
