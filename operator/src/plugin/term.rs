//! What the plugin prints comes from pods, tool descriptions, tool results and servers: text
//! a tenant or an upstream controls. Before it reaches the user's terminal, control
//! characters that could move the cursor, rewrite lines, set the window title or write the
//! clipboard (ESC sequences, C1 controls) and the bidirectional overrides that reorder what
//! is shown are made visible instead of obeyed.

use std::borrow::Cow;

/// Whether `c` is obeyed by terminals (or reorders text) rather than shown.
fn hazardous(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}')
}

/// `s` with every hazardous character written as `\u{XX}` (text output).
pub fn text(s: &str) -> Cow<'_, str> {
    escape(s, |c| format!("\\u{{{:x}}}", u32::from(c)))
}

/// `s`, a JSON document, with every hazardous character that can only stand inside one of
/// its strings written as a JSON `\uXXXX` escape: the document means the same.
pub fn json(s: &str) -> Cow<'_, str> {
    escape(s, |c| {
        let mut buf = [0u16; 2];
        c.encode_utf16(&mut buf)
            .iter()
            .map(|u| format!("\\u{u:04x}"))
            .collect()
    })
}

fn escape(s: &str, with: impl Fn(char) -> String) -> Cow<'_, str> {
    if !s.chars().any(hazardous) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| if hazardous(c) { with(c) } else { c.to_string() })
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
}
