//! Token counts of text with OpenAI's byte-pair encodings (`o200k_base`, `cl100k_base`),
//! exactly as `tiktoken` counts them, fast enough to count every result.
//!
//! A BPE tokenizer first splits text into pieces with a regular expression, then encodes
//! each piece alone: the count of a text is the sum of its pieces' counts. Two things make
//! this cheap:
//! - ASCII text is split by hand ([`split_ascii`]), an exact transcription of each
//!   encoding's expression for ASCII input; text with other characters goes through the
//!   expression itself (`bpe-openai`'s), slower but the same pieces.
//! - A piece's count is looked up in a small per-thread cache before it is encoded: results
//!   repeat their words and punctuation, so most pieces are found there. A one-byte piece is
//!   one token (every byte is a token) and needs neither.

use std::cell::RefCell;

/// An OpenAI byte-pair encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// GPT-4o, GPT-4.1, GPT-5, o-series models.
    #[default]
    O200kBase,
    /// GPT-4, GPT-3.5.
    Cl100kBase,
}

impl Encoding {
    fn tokenizer(self) -> &'static bpe_openai::Tokenizer {
        match self {
            Self::O200kBase => bpe_openai::o200k_base(),
            Self::Cl100kBase => bpe_openai::cl100k_base(),
        }
    }

    fn slot(self) -> usize {
        match self {
            Self::O200kBase => 0,
            Self::Cl100kBase => 1,
        }
    }
}

/// The tokens of `text`.
pub fn count(enc: Encoding, text: &str) -> u64 {
    let mut n = 0u64;
    walk(enc, text, |tokens, _, _| {
        n += u64::from(tokens);
        true
    });
    n
}

/// The longest prefix of `text` of at most `max` tokens that ends between two pieces (so
/// on a token boundary): its length in bytes and its tokens, and the tokens of the whole
/// text when that is more than `max` (`None`: the prefix is the whole text).
pub fn prefix(enc: Encoding, text: &str, max: u64) -> (usize, u64, Option<u64>) {
    let (mut n, mut cut) = (0u64, None);
    walk(enc, text, |tokens, start, _| {
        let t = n + u64::from(tokens);
        if cut.is_none() && t > max {
            cut = Some((start, n));
        }
        n = t;
        true
    });
    match cut {
        None => (text.len(), n, None),
        Some((end, at)) => (end, at, Some(n)),
    }
}

/// Calls `f(tokens, start, end)` for each piece of `text` in order (`start..end`: its
/// bytes) until it returns `false`.
fn walk(enc: Encoding, text: &str, mut f: impl FnMut(u32, usize, usize) -> bool) {
    CACHE.with_borrow_mut(|caches| {
        let cache = &mut caches[enc.slot()];
        let tok = enc.tokenizer();
        if text.is_ascii() {
            let b = text.as_bytes();
            let mut i = 0;
            while i < b.len() {
                let end = match enc {
                    Encoding::O200kBase => piece_o200k(b, i),
                    Encoding::Cl100kBase => piece_cl100k(b, i),
                };
                let tokens = cache.tokens(tok, b, i, end);
                if !f(tokens, i, end) {
                    return;
                }
                i = end;
            }
        } else {
            let base = text.as_ptr() as usize;
            for piece in tok.split(text) {
                let start = piece.as_ptr() as usize - base;
                let end = start + piece.len();
                if !f(cache.tokens(tok, text.as_bytes(), start, end), start, end) {
                    return;
                }
            }
        }
    });
}

/// The bytes of a piece of 2 to 16 bytes as two words, zero past its end: read from the
/// text in two loads where 16 bytes remain, else copied.
#[inline]
fn key(text: &[u8], start: usize, len: usize) -> [u64; 2] {
    let word = |at: usize| -> u64 {
        let mut w = [0u8; 8];
        match text.get(at..at + 8) {
            Some(b) => w.copy_from_slice(b),
            None => {
                let rest = &text[at.min(text.len())..];
                w[..rest.len()].copy_from_slice(rest);
            }
        }
        u64::from_le_bytes(w)
    };
    let mask = |n: usize| if n >= 8 { u64::MAX } else { (1u64 << (8 * n)) - 1 };
    let lo = word(start) & mask(len);
    let hi = if len > 8 {
        word(start + 8) & mask(len - 8)
    } else {
        0
    };
    [lo, hi]
}

thread_local! {
    static CACHE: RefCell<[Cache; 2]> = RefCell::new([Cache::new(), Cache::new()]);
}

/// Pieces of up to this many bytes are cached.
const CACHED: usize = 16;
const SLOTS: usize = 4096;

/// A direct-mapped cache of pieces' token counts: a piece replaces whatever shared its slot.
struct Cache {
    keys: Box<[[u64; 2]]>,
    /// The piece's length (0: empty slot) and its tokens.
    vals: Box<[(u8, u8)]>,
}

impl Cache {
    fn new() -> Self {
        Self {
            keys: vec![[0; 2]; SLOTS].into_boxed_slice(),
            vals: vec![(0, 0); SLOTS].into_boxed_slice(),
        }
    }

    #[inline]
    fn tokens(&mut self, tok: &bpe_openai::Tokenizer, text: &[u8], start: usize, end: usize) -> u32 {
        let piece = &text[start..end];
        if piece.len() <= 1 {
            return piece.len() as u32;
        }
        if piece.len() > CACHED {
            return tok.bpe.count(piece) as u32;
        }
        let key = key(text, start, piece.len());
        let h = (key[0] ^ key[1].rotate_left(29) ^ piece.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let slot = (h >> (64 - 12)) as usize;
        let (len, n) = self.vals[slot];
        if usize::from(len) == piece.len() && self.keys[slot] == key {
            return u32::from(n);
        }
        let n = tok.bpe.count(piece) as u32;
        self.keys[slot] = key;
        self.vals[slot] = (piece.len() as u8, n as u8);
        n
    }
}

const SPACE: u8 = 1;
const BREAK: u8 = 2;
const UPPER: u8 = 4;
const LOWER: u8 = 8;
const DIGIT: u8 = 16;
const PUNCT: u8 = 32;
const LETTER: u8 = UPPER | LOWER;

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
fn class(c: u8) -> u8 {
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

/// The end of the `o200k_base` piece at `i` of ASCII text `b`.
fn piece_o200k(b: &[u8], i: usize) -> usize {
    let c = b[i];
    // An optional character that is no line break, letter or digit, then letters: upper
    // case then lower case (`[A-Z]*[a-z]+`), else upper case alone; then a contraction.
    let j = if class(c) & (BREAK | LETTER | DIGIT) != 0 {
        i
    } else {
        i + 1
    };
    if j < b.len() && class(b[j]) & LETTER != 0 {
        let u = run(b, j, |c| class(c) & UPPER != 0);
        let l = run(b, u, |c| class(c) & LOWER != 0);
        return contraction(b, l);
    }
    if class(c) & DIGIT != 0 {
        return run(b, i, |c| class(c) & DIGIT != 0).min(i + 3);
    }
    let p = if c == b' ' && b.get(i + 1).is_some_and(|&c| is_punct(c)) {
        i + 1
    } else {
        i
    };
    if is_punct(b[p]) {
        let e = run(b, p, is_punct);
        return run(b, e, |c| class(c) & BREAK != 0 || c == b'/');
    }
    spaces(b, i)
}

/// The end of the `cl100k_base` piece at `i` of ASCII text `b`.
fn piece_cl100k(b: &[u8], i: usize) -> usize {
    let c = b[i];
    let k = contraction(b, i);
    if k > i {
        return k;
    }
    let j = if class(c) & (BREAK | LETTER | DIGIT) != 0 {
        i
    } else {
        i + 1
    };
    if j < b.len() && class(b[j]) & LETTER != 0 {
        return run(b, j, |c| class(c) & LETTER != 0);
    }
    if class(c) & DIGIT != 0 {
        return run(b, i, |c| class(c) & DIGIT != 0).min(i + 3);
    }
    let p = if c == b' ' && b.get(i + 1).is_some_and(|&c| is_punct(c)) {
        i + 1
    } else {
        i
    };
    if is_punct(b[p]) {
        let e = run(b, p, is_punct);
        return run(b, e, |c| class(c) & BREAK != 0);
    }
    spaces(b, i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ENCODINGS: [Encoding; 2] = [Encoding::O200kBase, Encoding::Cl100kBase];

    /// Every text of the corpus counts exactly what tiktoken counts.
    #[test]
    fn the_corpus_counts_as_tiktoken_counts() {
        let corpus = include_str!("../tests/token_corpus/corpus.jsonl");
        let mut wrong = Vec::new();
        let mut n = 0;
        for line in corpus.lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("a corpus line");
            let text = v["text"].as_str().expect("text");
            for (enc, label) in [
                (Encoding::O200kBase, "o200k_base"),
                (Encoding::Cl100kBase, "cl100k_base"),
            ] {
                let want = v[label].as_u64().expect("a count");
                let got = count(enc, text);
                if got != want {
                    wrong.push(format!("{} ({label}): {got}, tiktoken {want}", v["name"]));
                }
                n += 1;
            }
        }
        assert!(n >= 120, "the corpus has its texts ({n} counts)");
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    fn piece() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "a",
            "b",
            "Z",
            "Q",
            "'",
            "s",
            "t",
            "S",
            "re",
            "LL",
            "ve",
            "m",
            "d",
            " ",
            "  ",
            "\t",
            "\n",
            "\r",
            "\r\n",
            "1",
            "23",
            "4567",
            "{",
            "}",
            "\"",
            ":",
            ",",
            "/",
            "//",
            "-",
            "(",
            "\u{b}",
            "\u{c}",
            "\u{1c}",
            "\u{7f}",
            "\u{0}",
            "é",
            "日本",
            "\u{a0}",
            "\u{85}",
            "hello",
            "World",
            "HTTPServer",
            "don't",
            "I'M",
            "\n\n",
            "!?",
            "ß",
            "\u{301}",
            "🚀",
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        /// The hand-written split of ASCII text, and the cache, count what the encoding's
        /// own expression and encoder count, in both encodings, for any text.
        #[test]
        fn counts_match_the_reference_encoder(parts in prop::collection::vec(piece(), 1..16)) {
            let text: String = parts.concat();
            for enc in ENCODINGS {
                prop_assert_eq!(count(enc, &text) as usize, enc.tokenizer().count(text.as_str()), "{:?} {:?}", enc, text);
            }
        }

        /// A prefix ends on a piece boundary, holds at most `max` tokens (as counted within
        /// the whole), and is the longest such.
        #[test]
        fn prefixes_fit_their_budget(parts in prop::collection::vec(piece(), 1..16), max in 0u64..12) {
            let text: String = parts.concat();
            for enc in ENCODINGS {
                let whole = count(enc, &text);
                let (end, used, over) = prefix(enc, &text, max);
                let tok = enc.tokenizer();
                let base = text.as_ptr() as usize;
                let pieces: Vec<(usize, usize)> = tok
                    .split(&text)
                    .map(|p| (p.as_ptr() as usize - base + p.len(), tok.bpe.count(p.as_bytes())))
                    .collect();
                let within: usize = pieces.iter().filter(|p| p.0 <= end).map(|p| p.1).sum();
                prop_assert_eq!(used as usize, within);
                prop_assert!(end == text.len() || pieces.iter().any(|p| p.0 == end) || end == 0);
                match over {
                    None => prop_assert!(whole <= max && end == text.len()),
                    Some(w) => {
                        prop_assert_eq!(w, whole);
                        prop_assert!(used <= max);
                        // The next piece would not have fit.
                        let next = pieces.iter().find(|p| p.0 > end).map_or(0, |p| p.1);
                        prop_assert!(used + next as u64 > max);
                    }
                }
            }
        }
    }

    #[test]
    fn a_piece_cache_collision_never_returns_another_piece_count() {
        // Many distinct pieces through one small cache: every count still matches.
        let text: String = (0..20_000).map(|i| format!(" w{i:x}q")).collect();
        for enc in ENCODINGS {
            assert_eq!(count(enc, &text) as usize, enc.tokenizer().count(text.as_str()));
            assert_eq!(
                count(enc, &text) as usize,
                enc.tokenizer().count(text.as_str()),
                "warm"
            );
        }
    }
}
