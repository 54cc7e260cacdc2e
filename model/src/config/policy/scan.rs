//! The bounds checked on a policy's text before the parser sees it: its size, and how deep
//! brackets and runs of prefix operators nest (each is a level of recursion in the parser).
//!
//! To count only the brackets the parser will see, the scan splits the text the way CEL's
//! lexer does: string literals in every form (`'…'`, `"…"`, `'''…'''`, `"""…"""`, each
//! optionally raw with an `r`/`R` prefix, or bytes with `b`/`B`), `//` comments, numbers
//! and identifiers (so that `xr'…'` is an identifier and a plain string, while `1r'…'` is a
//! number and a raw one). Any text whose splitting is in doubt (an unterminated string, an
//! escape the lexer does not know) is refused here: the lexer would not read it as a string
//! either, and the brackets it would then see must not go uncounted.

/// Checks that `src` is at most `max_bytes` long and nests at most `max_depth` deep.
///
/// # Errors
/// Empty, too long, nested too deep, or an unterminated string or unknown escape.
pub(super) fn prescan(src: &str, max_bytes: usize, max_depth: usize) -> Result<(), String> {
    if src.trim().is_empty() {
        return Err("must not be empty".to_owned());
    }
    if src.len() > max_bytes {
        return Err(format!("is {} bytes long; at most {max_bytes}", src.len()));
    }
    let s = src.as_bytes();
    let (mut i, mut depth, mut run) = (0, 0usize, 0usize);
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        let end = match c {
            b'/' if next == Some(b'/') => {
                // A comment is like whitespace: it neither ends a run of `!` nor hides one.
                i = s[i..].iter().position(|&b| b == b'\n').map_or(s.len(), |n| i + n);
                continue;
            }
            b'\'' | b'"' => string_end(s, i, false)?,
            b'`' => escaped_ident_end(s, i),
            b'A'..=b'Z' | b'a'..=b'z' | b'_' => {
                let word_end = ident_end(s, i);
                match (string_prefix(&s[i..word_end]), s.get(word_end)) {
                    (Some(raw), Some(b'\'' | b'"')) => string_end(s, word_end, raw)?,
                    _ => word_end,
                }
            }
            b'0'..=b'9' => number_end(s, i),
            b'.' if next.is_some_and(|b| b.is_ascii_digit()) => number_end(s, i),
            b'(' | b'[' | b'{' => {
                depth += 1;
                i + 1
            }
            b')' | b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i + 1
            }
            _ => i + 1,
        };
        run = if matches!(c, b'!' | b'-') {
            run + 1
        } else if c.is_ascii_whitespace() {
            run
        } else {
            0
        };
        if depth > max_depth || run > max_depth {
            return Err(format!("nests deeper than {max_depth} levels"));
        }
        i = end;
    }
    Ok(())
}

/// Whether an identifier right before a quote is a string prefix, and if so whether raw.
fn string_prefix(word: &[u8]) -> Option<bool> {
    match word {
        b"r" | b"R" => Some(true),
        b"b" | b"B" => Some(false),
        [b'b' | b'B', b'r' | b'R'] => Some(true),
        _ => None,
    }
}

fn ident_end(s: &[u8], mut i: usize) -> usize {
    while s.get(i).is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_') {
        i += 1;
    }
    i
}

/// A backquoted identifier, or just the backquote when none is there.
fn escaped_ident_end(s: &[u8], i: usize) -> usize {
    let body = |b: &u8| b.is_ascii_alphanumeric() || b"_.-/ ".contains(b);
    let n = s[i + 1..].iter().take_while(|b| body(b)).count();
    if n > 0 && s.get(i + 1 + n) == Some(&b'`') {
        i + n + 2
    } else {
        i + 1
    }
}

/// A number: `0x` and hex digits, or digits with a fraction and an exponent, and a `u`.
fn number_end(s: &[u8], i: usize) -> usize {
    let at = |j: usize| s.get(j).copied().unwrap_or(0);
    let digits = |mut j: usize, hex: bool| {
        while at(j).is_ascii_digit() || (hex && at(j).is_ascii_hexdigit()) {
            j += 1;
        }
        j
    };
    let unsigned = |j: usize| if matches!(at(j), b'u' | b'U') { j + 1 } else { j };
    if at(i) == b'0' && at(i + 1) == b'x' && at(i + 2).is_ascii_hexdigit() {
        return unsigned(digits(i + 2, true));
    }
    let mut j = digits(i, false);
    let mut float = false;
    if at(j) == b'.' && at(j + 1).is_ascii_digit() {
        j = digits(j + 1, false);
        float = true;
    }
    if matches!(at(j), b'e' | b'E') {
        let k = j + 1 + usize::from(matches!(at(j + 1), b'+' | b'-'));
        if at(k).is_ascii_digit() {
            j = digits(k, false);
            float = true;
        }
    }
    if float { j } else { unsigned(j) }
}

/// The end of the string literal whose opening quote is at `i`.
fn string_end(s: &[u8], i: usize, raw: bool) -> Result<usize, String> {
    let q = s[i];
    let unterminated = || Err("a string literal is not terminated".to_owned());
    let triple = s.get(i + 1) == Some(&q) && s.get(i + 2) == Some(&q);
    let mut j = if triple { i + 3 } else { i + 1 };
    loop {
        let Some(&c) = s.get(j) else {
            return unterminated();
        };
        if !raw && c == b'\\' {
            j = escape_end(s, j)?;
        } else if triple && s[j..].starts_with(&[q, q, q]) {
            return Ok(j + 3);
        } else if !triple && c == q {
            return Ok(j + 1);
        } else if !triple && matches!(c, b'\n' | b'\r') {
            return unterminated();
        } else {
            j += 1;
        }
    }
}

/// The end of the escape sequence at `j` (a backslash) in a string that is not raw.
fn escape_end(s: &[u8], j: usize) -> Result<usize, String> {
    let hex = |from: usize, n: usize| {
        s.get(from..from + n)
            .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    };
    let oct = |b: Option<&u8>| b.is_some_and(|b| (b'0'..=b'7').contains(b));
    let len = match s.get(j + 1) {
        Some(b'a' | b'b' | b'f' | b'n' | b'r' | b't' | b'v' | b'"' | b'\'' | b'\\' | b'?' | b'`') => 2,
        Some(b'x' | b'X') if hex(j + 2, 2) => 4,
        Some(b'u') if hex(j + 2, 4) => 6,
        Some(b'U') if hex(j + 2, 8) => 10,
        Some(b'0'..=b'3') if oct(s.get(j + 2)) && oct(s.get(j + 3)) => 4,
        _ => return Err("a string literal holds an unknown escape sequence".to_owned()),
    };
    Ok(j + len)
}

#[cfg(test)]
mod tests {
    use super::super::expr::{MAX_DEPTH, compile};
    use proptest::prelude::*;

    fn deep(n: usize) -> String {
        format!("{}true{}", "(".repeat(n), ")".repeat(n))
    }

    #[test]
    fn strings_of_every_form_cannot_hide_nesting() {
        let d = deep(MAX_DEPTH + 6);
        for head in [
            r"r'\' == args.x",
            r#"R"\" == args.x"#,
            r"br'\' == args.x",
            r"args.x == 1r'\'",
            r"args.x == 0xbr'\'",
            r"args.x == 1.5e3r'\'",
            "'''it's''' == args.x",
            r#""""a"b""" == args.x"#,
            r"r'''\''' == args.x",
            r#"r"""a\""" == args.x"#,
            "true // it's a comment\n",
            "true // \"\n",
            "`a.b` == args.x",
        ] {
            let e = compile(&format!("{head} || {d}")).map(|_| ()).expect_err(head);
            assert!(e.contains("nests deeper"), "{head}: {e}");
        }
        // A run of `!` split by comments is still one run.
        let e = compile(&"!//\n".repeat(300)).map(|_| ()).expect_err("nots");
        assert!(e.contains("nests deeper"), "{e}");
        // Text the lexer would not read as a string is refused, not skipped.
        for (src, want) in [
            ("'\\q' == args.x", "escape"),
            ("'\\x4' == args.x", "escape"),
            ("'abc\n|| true", "not terminated"),
            ("args.x == 'abc", "not terminated"),
            ("args.x == '''abc''", "not terminated"),
            ("args.x == r'''abc", "not terminated"),
        ] {
            let e = compile(src).map(|_| ()).expect_err(src);
            assert!(e.contains(want), "{src:?}: {e}");
        }
    }

    #[test]
    fn brackets_inside_strings_and_comments_are_not_counted() {
        let b = "([{".repeat(12);
        for src in [
            format!("args.x == '''it's {b}'''"),
            format!(r"args.x == r'C:\{b}'"),
            format!(r#"args.x == """{b}""""#),
            format!(r#"args.x == r"""\"{b}""""#),
            format!(r"args.x == r'''\''' && args.y == '{b}'"),
            format!("true // {b}\n && args.x == 'x'"),
            format!("args.xr == '{b}' && args.r == 1"),
            format!("args.x == 'a\\u00e9\\x41\\101\\'{b}'"),
        ] {
            compile(&src).unwrap_or_else(|e| panic!("{src}: {e}"));
        }
    }

    /// `content` written as a literal of one of CEL's forms, as the lexer reads it.
    fn literal(content: &str, form: u8) -> String {
        let esc = |q: char| {
            content
                .chars()
                .map(|c| match c {
                    '\\' => "\\\\".to_owned(),
                    '\n' => "\\n".to_owned(),
                    c if c == q => format!("\\{q}"),
                    c => c.to_string(),
                })
                .collect::<String>()
        };
        let no = |bad: &[char]| content.replace(bad, "");
        match form % 6 {
            0 => format!("'{}'", esc('\'')),
            1 => format!("\"{}\"", esc('"')),
            2 => format!("'''{}'''", esc('\'')),
            3 => format!("r'{}'", no(&['\'', '\n', '\r'])),
            4 => format!("R\"\"\"{}\"\"\"", no(&['"'])),
            _ => format!("r'''{}'''", no(&['\''])),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn any_literal_is_one_token_to_the_scan_and_the_parser(
            content in "[()\\[\\]{}'\"\\\\ \nab/]{0,80}",
            form in 0u8..6,
        ) {
            let lit = literal(&content, form);
            let ok = format!("args.x == {lit}");
            prop_assert!(compile(&ok).is_ok(), "{ok:?}: {:?}", compile(&ok).err());
            let hidden = format!("{lit} == args.x || {}", deep(MAX_DEPTH + 1));
            let e = compile(&hidden).err().unwrap_or_default();
            prop_assert!(e.contains("nests deeper"), "{hidden:?}: {e}");
        }
    }
}
