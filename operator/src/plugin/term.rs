//! What the plugin prints comes from pods, tool descriptions, tool results and servers: text
//! a tenant or an upstream controls. Before it reaches the user's terminal, control
//! characters that could move the cursor, rewrite lines, set the window title or write the
//! clipboard (ESC sequences, C1 controls), the bidirectional and invisible controls that
//! reorder or hide what is shown, and line breaks other than `\n` are made visible instead
//! of obeyed. A field printed on one line ([`line`]) escapes `\n` too, so it cannot end its
//! line and forge the next one.

use std::borrow::Cow;

/// Whether `c` is obeyed by terminals (or reorders or hides text) rather than shown. `\n`
/// and `\t` are not: multi-line text keeps its lines.
fn hazardous(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(
            c,
            // Bidirectional marks, embeddings, overrides and isolates (U+061C is the Arabic
            // letter mark).
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
            // Interlinear annotation anchors: what lies between them may not be shown.
            | '\u{FFF9}'..='\u{FFFB}'
            // Line and paragraph separators (the other line breaks are controls).
            | '\u{2028}' | '\u{2029}'
            // Invisible characters a model reads and a terminal does not show: soft hyphen,
            // zero-width space, joiners and the like, word joiner and invisible operators,
            // the byte order mark, tag characters, variation selectors (which can carry
            // hidden bytes).
            | '\u{00AD}' | '\u{180E}' | '\u{200B}'..='\u{200D}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}'
            | '\u{E0000}'..='\u{E007F}' | '\u{FE00}'..='\u{FE0F}' | '\u{E0100}'..='\u{E01EF}'
        )
}

/// Whether `c` is hazardous in a field printed on one line: a hazardous character or any
/// line break (`\n`, `\r`, VT, FF, U+0085, U+2028, U+2029).
fn hazardous_in_line(c: char) -> bool {
    c == '\n' || hazardous(c)
}

fn shown(c: char) -> String {
    format!("\\u{{{:x}}}", u32::from(c))
}

/// `s` with every hazardous character written as `\u{XX}` (multi-line text output).
pub fn text(s: &str) -> Cow<'_, str> {
    escape(s, hazardous, shown)
}

/// `s`, a field printed within one line (a name, a reason, a message, an error), with every
/// hazardous character and every line break written as `\u{XX}`.
pub fn line(s: &str) -> Cow<'_, str> {
    escape(s, hazardous_in_line, shown)
}

/// `s`, a JSON document, with every hazardous character that can only stand inside one of
/// its strings written as a JSON `\uXXXX` escape: the document means the same.
pub fn json(s: &str) -> Cow<'_, str> {
    escape(s, hazardous, |c| {
        let mut buf = [0u16; 2];
        c.encode_utf16(&mut buf)
            .iter()
            .map(|u| format!("\\u{u:04x}"))
            .collect()
    })
}

fn escape(s: &str, hazard: fn(char) -> bool, with: impl Fn(char) -> String) -> Cow<'_, str> {
    if !s.chars().any(hazard) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| if hazard(c) { with(c) } else { c.to_string() })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_controls_are_shown_not_obeyed() {
        assert!(matches!(text("plain\ttext\n"), Cow::Borrowed(_)));
        // Clipboard write (OSC 52), title, cursor movement, C1 CSI, bidi override.
        let hostile = "a\u{1b}]52;c;ZXZpbA==\u{7}b\u{1b}[2Jc\u{9b}31md\u{202e}e\r";
        let shown = text(hostile);
        assert!(!shown.chars().any(hazardous), "{shown}");
        assert_eq!(
            shown,
            "a\\u{1b}]52;c;ZXZpbA==\\u{7}b\\u{1b}[2Jc\\u{9b}31md\\u{202e}e\\u{d}"
        );
    }

    #[test]
    fn json_stays_the_same_document() {
        let doc = serde_json::json!({"text": "x\u{9b}y\u{202e}z\u{1b}", "n": 1});
        let printed = serde_json::to_string_pretty(&doc).unwrap();
        let safe = json(&printed);
        assert!(!safe.chars().any(hazardous), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, doc);
    }

    /// Every line break a terminal or pager may honour, and every bidirectional or invisible
    /// control that reorders or hides text.
    const LINE_BREAKS: [char; 7] = ['\n', '\r', '\u{b}', '\u{c}', '\u{85}', '\u{2028}', '\u{2029}'];
    const BIDI_AND_INVISIBLE: [char; 17] = [
        '\u{61c}', '\u{200e}', '\u{200f}', '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}',
        '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}', '\u{fff9}', '\u{fffa}', '\u{fffb}', '\u{1b}',
        '\u{9b}',
    ];

    #[test]
    fn single_line_fields_escape_every_line_break_and_the_whole_bidi_set() {
        for c in LINE_BREAKS.iter().chain(&BIDI_AND_INVISIBLE) {
            let hostile = format!("ok{c}Forged: line");
            let shown = line(&hostile);
            let escaped = format!("ok\\u{{{:x}}}Forged: line", u32::from(*c));
            assert_eq!(shown, escaped, "U+{:04X} in a single-line field", u32::from(*c));
            // Multi-line text keeps `\n` and escapes every other member of the class.
            let shown = text(&hostile);
            if *c == '\n' {
                assert_eq!(shown, hostile);
            } else {
                assert_eq!(shown, escaped, "U+{:04X} in text", u32::from(*c));
            }
            // JSON: the same document, nothing of the class left raw.
            let doc = serde_json::json!({ "s": hostile });
            let printed = serde_json::to_string(&doc).unwrap();
            let safe = json(&printed);
            assert!(
                !safe.contains(*c) || *c == '\n',
                "U+{:04X} in JSON",
                u32::from(*c)
            );
            assert_eq!(serde_json::from_str::<serde_json::Value>(&safe).unwrap(), doc);
        }
        // Plain text is borrowed, tabs included.
        assert!(matches!(line("name\twith tab"), Cow::Borrowed(_)));
        assert!(matches!(line("naïve ✓ 名前"), Cow::Borrowed(_)));
    }
}
