//! Text split into the pieces a byte-pair encoding encodes alone, as each encoding's
//! expression splits it: ASCII by hand ([`piece_o200k`], [`piece_cl100k`], exact
//! transcriptions of the expressions for ASCII input), other text by the expression
//! ([`Pattern`]), one span at a time between [`boundary`] positions.

use regex_automata::meta::Regex;
use regex_automata::{Anchored, Input};

/// An encoding's expression, for spans with other characters than ASCII.
///
/// The expressions' `\s+(?!\S)` (whitespace not followed by anything else) needs a look-ahead
/// the regex engine does not have. It is written as two patterns: `\s+$` among the first,
/// and `\s+\s`, whose match is taken without its last character. Whitespace then goes to the
/// last pattern, `\s+`, only when it is one character.
#[derive(Debug)]
pub struct Pattern {
    regex: Regex,
}

/// The pieces' expressions of tiktoken's `o200k_base` and `cl100k_base`, up to the
/// whitespace alternatives (see [`Pattern`]).
const O200K: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+$",
);
const CL100K: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+$",
);

impl Pattern {
    /// The expression of `o200k_base` (`true`) or `cl100k_base`.
    pub fn new(o200k: bool) -> Self {
        let first = if o200k { O200K } else { CL100K };
        let regex = Regex::new_many(&[first, r"\s+\s", r"\s+"]).expect("the encodings' expressions compile");
        Self { regex }
    }

    /// The end of the piece at `at` of `span` (which must not be empty there).
    pub fn piece(&self, span: &str, at: usize) -> usize {
        let input = Input::new(span).range(at..).anchored(Anchored::Yes);
        let Some(m) = self.regex.find(input) else {
            // Every character is in some alternative; one that were not would be its own
            // piece.
            return at + span[at..].chars().next().map_or(1, char::len_utf8);
        };
        let end = m.end();
        if m.pattern().as_usize() == 1 {
            let last = span[..end].chars().next_back().map_or(0, char::len_utf8);
            return end - last;
        }
        end
    }
}

/// Whether no piece crosses `p`, in either encoding, whatever the text around it: an ASCII
/// letter before it (which only a letter piece or a contraction holds, and those end at the
/// first character that is no letter) and, at it, an ASCII character that is neither a
/// letter nor the apostrophe of a contraction. A piece starts at `p`, as it would after any
/// piece that ends there.
#[inline]
pub fn boundary(b: &[u8], p: usize) -> bool {
    p > 0
        && p < b.len()
        && b[p - 1] < 0x80
        && class(b[p - 1]) & LETTER != 0
        && b[p] < 0x80
        && class(b[p]) & LETTER == 0
        && b[p] != b'\''
}

const SPACE: u8 = 1;
const BREAK: u8 = 2;
const UPPER: u8 = 4;
const LOWER: u8 = 8;
const DIGIT: u8 = 16;
const PUNCT: u8 = 32;
pub const LETTER: u8 = UPPER | LOWER;

/// Each ASCII byte's class: whitespace (line breaks also `BREAK`), a letter by case, a
/// digit, or anything else (`PUNCT`, control characters included).
static CLASS: [u8; 128] = {
    let mut t = [PUNCT; 128];
    let mut c = 0;
    while c < 128 {
        let b = c as u8;
        t[c] = match b {
            b'\n' | b'\r' => SPACE | BREAK,
            b' ' | b'\t' | 0x0B | 0x0C => SPACE,
            b'A'..=b'Z' => UPPER,
            b'a'..=b'z' => LOWER,
            b'0'..=b'9' => DIGIT,
            _ => PUNCT,
        };
        c += 1;
    }
    t
};

#[inline]
pub fn class(c: u8) -> u8 {
    CLASS[usize::from(c & 0x7F)]
}

#[inline]
fn is_space(c: u8) -> bool {
    class(c) & SPACE != 0
}

/// Neither whitespace, nor a letter, nor a digit.
#[inline]
fn is_punct(c: u8) -> bool {
    class(c) & PUNCT != 0
}

#[inline]
fn run(b: &[u8], mut i: usize, class: impl Fn(u8) -> bool) -> usize {
    while i < b.len() && class(b[i]) {
        i += 1;
    }
    i
}

/// The end of a contraction (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`, any case) at `i`,
/// or `i`.
#[inline]
fn contraction(b: &[u8], i: usize) -> usize {
    if b.get(i) != Some(&b'\'') {
        return i;
    }
    let lower = |k: usize| b.get(k).map(u8::to_ascii_lowercase);
    match (lower(i + 1), lower(i + 2)) {
        (Some(b's' | b't' | b'm' | b'd'), _) => i + 2,
        (Some(b'r'), Some(b'e')) | (Some(b'v'), Some(b'e')) | (Some(b'l'), Some(b'l')) => i + 3,
        _ => i,
    }
}

/// The end of a run of whitespace at `i`: through its last line break, else to the end of
/// the text, else all but its last character (which starts the next piece), else the one
/// character.
#[inline]
fn spaces(b: &[u8], i: usize) -> usize {
    let e = run(b, i, is_space);
    if let Some(k) = b[i..e].iter().rposition(|&c| class(c) & BREAK != 0) {
        i + k + 1
    } else if e == b.len() || e - i == 1 {
        e
    } else {
        e - 1
    }
}

/// Where a letter piece at `i` starts its letters: after an optional character that is no
/// line break, letter or digit. `None`: no letter there.
#[inline]
fn letters_at(b: &[u8], i: usize) -> Option<usize> {
    let j = if class(b[i]) & (BREAK | LETTER | DIGIT) != 0 {
        i
    } else {
        i + 1
    };
    (j < b.len() && class(b[j]) & LETTER != 0).then_some(j)
}

/// The end of a piece at `i` that is no letter piece, alike in both encodings: up to three
/// digits; punctuation (after an optional space), then line breaks (and, in `o200k_base`,
/// slashes: `slash`); else whitespace.
#[inline]
fn other_piece(b: &[u8], i: usize, slash: bool) -> usize {
    let c = b[i];
    if class(c) & DIGIT != 0 {
        // At most three digits: the run is not scanned past them (a long run of digits
        // would otherwise be scanned again for each piece of it).
        return run(&b[..b.len().min(i + 3)], i, |c| class(c) & DIGIT != 0);
    }
    let p = if c == b' ' && b.get(i + 1).is_some_and(|&c| is_punct(c)) {
        i + 1
    } else {
        i
    };
    if is_punct(b[p]) {
        let e = run(b, p, is_punct);
        return run(b, e, |c| class(c) & BREAK != 0 || (slash && c == b'/'));
    }
    spaces(b, i)
}

/// The end of the `o200k_base` piece at `i` of ASCII text `b`.
pub fn piece_o200k(b: &[u8], i: usize) -> usize {
    // Letters: upper case then lower case (`[A-Z]*[a-z]+`), else upper case alone; then a
    // contraction.
    if let Some(j) = letters_at(b, i) {
        let u = run(b, j, |c| class(c) & UPPER != 0);
        let l = run(b, u, |c| class(c) & LOWER != 0);
        return contraction(b, l);
    }
    other_piece(b, i, true)
}

/// The end of the `cl100k_base` piece at `i` of ASCII text `b`.
pub fn piece_cl100k(b: &[u8], i: usize) -> usize {
    let k = contraction(b, i);
    if k > i {
        return k;
    }
    if let Some(j) = letters_at(b, i) {
        return run(b, j, |c| class(c) & LETTER != 0);
    }
    other_piece(b, i, false)
}
