//! Token counts of text with OpenAI's byte-pair encodings (`o200k_base`, `cl100k_base`),
//! exactly as `tiktoken` counts them, fast enough to count every result.
//!
//! A BPE tokenizer first splits text into pieces with a regular expression, then encodes
//! each piece alone: the count of a text is the sum of its pieces' counts. Two things make
//! this cheap:
//! - ASCII text is split by hand ([`split`]), an exact transcription of each encoding's
//!   expression for ASCII input. Only the spans around other characters, from the word
//!   before them to the word after, go through the expression itself.
//! - A piece's count is looked up in a small per-thread cache before it is encoded
//!   ([`bpe`]): results repeat their words and punctuation, so most pieces are found there.
//!   A one-byte piece is one token (every byte is a token) and needs neither.
//!
//! The vocabularies are built into the binary (2.3 MB) and indexed on first use.

use std::cell::{Cell, RefCell};
use std::sync::LazyLock;

pub mod bpe;
pub mod split;

use self::bpe::Vocab;
use self::split::{Pattern, boundary, piece_cl100k, piece_o200k};

/// An OpenAI byte-pair encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// GPT-4o, GPT-4.1, GPT-5, o-series models.
    #[default]
    O200kBase,
    /// GPT-4, GPT-3.5.
    Cl100kBase,
}

/// An encoding's vocabulary and expression, made on first use.
struct Tables {
    vocab: Vocab,
    pattern: Pattern,
}

static O200K: LazyLock<Tables> = LazyLock::new(|| Tables {
    vocab: Vocab::load(include_bytes!("../../data/o200k_base.tokens")),
    pattern: Pattern::new(true),
});
static CL100K: LazyLock<Tables> = LazyLock::new(|| Tables {
    vocab: Vocab::load(include_bytes!("../../data/cl100k_base.tokens")),
    pattern: Pattern::new(false),
});

impl From<quiver_model::config::guards::TokenEncoding> for Encoding {
    fn from(e: quiver_model::config::guards::TokenEncoding) -> Self {
        use quiver_model::config::guards::TokenEncoding as T;
        match e {
            T::O200kBase => Self::O200kBase,
            T::Cl100kBase => Self::Cl100kBase,
        }
    }
}

impl Encoding {
    fn tables(self) -> &'static Tables {
        match self {
            Self::O200kBase => &O200K,
            Self::Cl100kBase => &CL100K,
        }
    }

    fn slot(self) -> usize {
        match self {
            Self::O200kBase => 0,
            Self::Cl100kBase => 1,
        }
    }

    /// Loads the encoding's tables now rather than in the first count (a server loads those
    /// its config names when it loads the config).
    pub fn load(self) -> usize {
        self.tables().vocab.len()
    }
}

/// The longest token of either encoding, in bytes: a piece of `n` bytes has at least
/// `n / 128` tokens.
const LONGEST_TOKEN: usize = 128;

/// The tokens of `text`.
pub fn count(enc: Encoding, text: &str) -> u64 {
    let mut n = 0u64;
    walk(enc, text, &Cell::new(u64::MAX), |tokens, _, _| {
        n += u64::from(tokens);
        true
    });
    n
}

/// The longest prefix of `text` of at most `max` tokens that ends between two pieces (so
/// on a token boundary): its length in bytes, its tokens, and whether it is shorter than
/// `text` (then `text` has more than `max` tokens). Stops at the cut: the work is bounded by
/// `max`, not by the text.
pub fn prefix(enc: Encoding, text: &str, max: u64) -> (usize, u64, bool) {
    let (mut n, mut cut) = (0u64, None);
    let room = Cell::new(max);
    let unfit = walk(enc, text, &room, |tokens, start, _| {
        let t = n + u64::from(tokens);
        if t > max {
            cut = Some(start);
            return false;
        }
        n = t;
        room.set(max - t);
        true
    });
    match cut.or(unfit) {
        None => (text.len(), n, false),
        Some(end) => (end, n, true),
    }
}

/// Calls `f(tokens, start, end)` for each piece of `text` in order (`start..end`: its
/// bytes) until it returns `false`. A piece too long to fit in `room` tokens (whatever it
/// encodes to: it has at least a token per [`LONGEST_TOKEN`] bytes) is not encoded: the
/// walk stops there and returns where it starts. Encoding one enormous piece costs about a
/// microsecond per byte; a walk to a budget never pays more than the budget's worth.
///
/// Text with other characters than ASCII is cut into spans at boundaries no piece crosses
/// (see [`boundary`]): the ASCII spans are split by hand, those with other characters by the
/// expression, each alone, with the same pieces as the whole.
fn walk(
    enc: Encoding,
    text: &str,
    room: &Cell<u64>,
    mut f: impl FnMut(u32, usize, usize) -> bool,
) -> Option<usize> {
    let fits = |start: usize, end: usize| {
        let len = end - start;
        len <= LONGEST_TOKEN || (len.div_ceil(LONGEST_TOKEN) as u64) <= room.get()
    };
    CACHE.with_borrow_mut(|caches| {
        let cache = &mut caches[enc.slot()];
        let tables = enc.tables();
        let b = text.as_bytes();
        let mut at = 0;
        while at < b.len() {
            let q = b[at..]
                .iter()
                .position(|&c| c >= 0x80)
                .map_or(b.len(), |k| at + k);
            // The span of ASCII before it, to the last boundary (all of it at the end).
            let p = if q == b.len() {
                q
            } else {
                (at + 1..=q).rev().find(|&p| boundary(b, p)).unwrap_or(at)
            };
            let mut i = at;
            while i < p {
                let end = match enc {
                    Encoding::O200kBase => piece_o200k(b, i),
                    Encoding::Cl100kBase => piece_cl100k(b, i),
                };
                if !fits(i, end) {
                    return Some(i);
                }
                if !f(cache.tokens(&tables.vocab, b, i, end), i, end) {
                    return None;
                }
                i = end;
            }
            if p == b.len() {
                return None;
            }
            let r = (q + 1..b.len()).find(|&r| boundary(b, r)).unwrap_or(b.len());
            let span = &text[..r];
            let mut start = p;
            while start < r {
                let end = tables.pattern.piece(span, start);
                if !fits(start, end) {
                    return Some(start);
                }
                if !f(cache.tokens(&tables.vocab, b, start, end), start, end) {
                    return None;
                }
                start = end;
            }
            at = r;
        }
        None
    })
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
const SLOTS: usize = 8192;

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
    fn tokens(&mut self, vocab: &Vocab, text: &[u8], start: usize, end: usize) -> u32 {
        let piece = &text[start..end];
        if piece.len() <= 1 {
            return piece.len() as u32;
        }
        if piece.len() > CACHED {
            return u32::try_from(vocab.count(piece)).unwrap_or(u32::MAX);
        }
        let key = key(text, start, piece.len());
        let h = (key[0] ^ key[1].rotate_left(29) ^ piece.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let slot = (h >> (64 - 13)) as usize;
        let (len, n) = self.vals[slot];
        if usize::from(len) == piece.len() && self.keys[slot] == key {
            return u32::from(n);
        }
        let n = vocab.count(piece) as u32;
        self.keys[slot] = key;
        self.vals[slot] = (piece.len() as u8, n as u8);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ENCODINGS: [Encoding; 2] = [Encoding::O200kBase, Encoding::Cl100kBase];

    /// The `bpe-openai` crate's tokenizer of `enc`: its own expression and encoder, an
    /// implementation independent of this one (tested by its authors against tiktoken).
    fn reference(enc: Encoding) -> &'static bpe_openai::Tokenizer {
        match enc {
            Encoding::O200kBase => bpe_openai::o200k_base(),
            Encoding::Cl100kBase => bpe_openai::cl100k_base(),
        }
    }

    /// Every text of the corpus counts exactly what tiktoken counts.
    #[test]
    fn the_corpus_counts_as_tiktoken_counts() {
        let corpus = include_str!("../../tests/token_corpus/corpus.jsonl");
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
                prop_assert_eq!(count(enc, &text) as usize, reference(enc).count(text.as_str()), "{:?} {:?}", enc, text);
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
                let tok = reference(enc);
                let base = text.as_ptr() as usize;
                let pieces: Vec<(usize, usize)> = tok
                    .split(&text)
                    .map(|p| (p.as_ptr() as usize - base + p.len(), tok.bpe.count(p.as_bytes())))
                    .collect();
                let within: usize = pieces.iter().filter(|p| p.0 <= end).map(|p| p.1).sum();
                prop_assert_eq!(used as usize, within);
                prop_assert!(end == text.len() || pieces.iter().any(|p| p.0 == end) || end == 0);
                if !over {
                    prop_assert!(whole <= max && end == text.len() && used == whole);
                } else {
                    {
                        prop_assert!(whole > max && used <= max);
                        // The next piece would not have fit.
                        let next = pieces.iter().find(|p| p.0 > end).map_or(0, |p| p.1);
                        prop_assert!(used + next as u64 > max);
                    }
                }
            }
        }
    }

    #[test]
    fn long_runs_of_one_class_count_as_the_reference() {
        // Digits (pieces of three), punctuation, spaces, letters: 256 KiB each (counting a
        // run of digits used to scan the rest of the run for each piece: minutes here).
        for text in [
            "1234567".repeat(37_000),
            "-=".repeat(1 << 17),
            " ".repeat(1 << 18),
            "ab".repeat(1 << 17),
        ] {
            for enc in ENCODINGS {
                assert_eq!(count(enc, &text) as usize, reference(enc).count(text.as_str()));
            }
        }
    }

    #[test]
    fn a_cut_never_encodes_a_piece_longer_than_the_budget_could_hold() {
        // 4 MiB of one word: at least 32,768 tokens, so no budget of 100 takes it; it is
        // not encoded at all (encoding it takes seconds).
        let word = "q".repeat(4 << 20);
        for enc in ENCODINGS {
            assert_eq!(prefix(enc, &word, 100), (0, 0, true));
            let text = format!("alpha beta {word}");
            assert_eq!(prefix(enc, &text, 100), (10, 2, true), "{enc:?}");
        }
        // One that may fit is encoded.
        let short = "q".repeat(1000);
        let n = count(Encoding::O200kBase, &short);
        assert_eq!(prefix(Encoding::O200kBase, &short, n), (1000, n, false));
    }

    #[test]
    fn a_piece_cache_collision_never_returns_another_piece_count() {
        // Many distinct pieces through one small cache: every count still matches.
        let text: String = (0..20_000).map(|i| format!(" w{i:x}q")).collect();
        for enc in ENCODINGS {
            assert_eq!(count(enc, &text) as usize, reference(enc).count(text.as_str()));
            assert_eq!(
                count(enc, &text) as usize,
                reference(enc).count(text.as_str()),
                "warm"
            );
        }
    }
}
