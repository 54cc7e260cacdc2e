//! A byte-pair encoding's vocabulary and the count of one piece's tokens, as tiktoken
//! encodes it: adjacent parts merged lowest rank first (the leftmost of equal ranks) until
//! no adjacent pair is a token.
//!
//! The vocabulary is built into the binary (`server/data/*.tokens`, see `vocab.py` there:
//! each token's bytes in rank order) and indexed by the first count that needs it: about
//! 10 ms and 6 MB for `o200k_base`.

use rustc_hash::FxHashMap;

/// Pieces up to this long are merged by scanning for the lowest pair each time (quadratic,
/// and fastest for short pieces); longer ones with a heap (n log n), so a hostile run of
/// letters or symbols costs no more than its length says.
const SHORT: usize = 24;

/// The ranks of a vocabulary's tokens.
#[derive(Debug)]
pub struct Vocab {
    ranks: FxHashMap<&'static [u8], u32>,
}

impl Vocab {
    /// Indexes `data`: tokens in rank order, each one length byte then its bytes.
    pub fn load(data: &'static [u8]) -> Self {
        let mut ranks = FxHashMap::default();
        ranks.reserve(data.len() / 8);
        let mut at = 0;
        let mut rank = 0u32;
        while let Some(&len) = data.get(at) {
            let Some(token) = data.get(at + 1..at + 1 + usize::from(len)) else {
                break;
            };
            ranks.insert(token, rank);
            rank += 1;
            at += 1 + usize::from(len);
        }
        Self { ranks }
    }

    /// Tokens in the vocabulary.
    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    /// Whether the vocabulary has no token.
    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }

    #[inline]
    fn rank(&self, bytes: &[u8]) -> u32 {
        self.ranks.get(bytes).copied().unwrap_or(u32::MAX)
    }

    /// The tokens of one piece.
    pub fn count(&self, piece: &[u8]) -> usize {
        match piece.len() {
            0 | 1 => piece.len(),
            _ if self.ranks.contains_key(piece) => 1,
            n if n <= SHORT => self.count_short(piece),
            _ => self.count_long(piece),
        }
    }

    /// `parts[i]`: where part `i` starts, and the rank of it merged with the next part.
    fn count_short(&self, piece: &[u8]) -> usize {
        let pair = |parts: &[(usize, u32)], i: usize| -> u32 {
            match parts.get(i + 2) {
                Some(&(end, _)) => self.rank(&piece[parts[i].0..end]),
                None => u32::MAX,
            }
        };
        let mut parts: Vec<(usize, u32)> = (0..=piece.len()).map(|i| (i, u32::MAX)).collect();
        for i in 0..parts.len().saturating_sub(2) {
            parts[i].1 = self.rank(&piece[i..i + 2]);
        }
        // The lowest rank, the leftmost of equals; none left: every pair is `u32::MAX`.
        let lowest = |parts: &[(usize, u32)]| {
            parts
                .iter()
                .enumerate()
                .map(|(i, p)| (p.1, i))
                .min()
                .filter(|&(rank, _)| rank != u32::MAX)
        };
        while let Some((_, i)) = lowest(&parts) {
            parts.remove(i + 1);
            parts[i].1 = pair(&parts, i);
            if i > 0 {
                parts[i - 1].1 = pair(&parts, i - 1);
            }
        }
        parts.len() - 1
    }

    /// The same merges over a linked list of parts with a heap of candidate pairs, each
    /// checked against the current list when it comes up. Offsets are `u32` (a piece is
    /// at most a response, far below 4 GiB) and a heap entry is its rank and offset in one
    /// `u64`: 17 bytes of memory per byte of the piece.
    fn count_long(&self, piece: &[u8]) -> usize {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let Ok(n) = u32::try_from(piece.len()) else {
            // Not a piece any response holds: at least a token per 128 bytes.
            return piece.len().div_ceil(128);
        };
        const END: u32 = u32::MAX;
        // Part `i` (a start offset) covers `i..next[i]`; `n` ends the list.
        let mut next: Vec<u32> = (1..=n).collect();
        let mut prev: Vec<u32> = (0..n).map(|i| i.checked_sub(1).unwrap_or(END)).collect();
        let mut cur = vec![u32::MAX; n as usize];
        let mut heap = BinaryHeap::with_capacity(n as usize);
        let entry = |rank: u32, i: u32| Reverse((u64::from(rank) << 32) | u64::from(i));
        // The rank of part `i` merged with the next (`u32::MAX`: none, or no token).
        let pair = |next: &[u32], i: u32| -> u32 {
            let j = next[i as usize];
            if j >= n {
                return u32::MAX;
            }
            let end = next[j as usize].min(n);
            self.rank(&piece[i as usize..end as usize])
        };
        for i in 0..n - 1 {
            let r = pair(&next, i);
            cur[i as usize] = r;
            if r != u32::MAX {
                heap.push(entry(r, i));
            }
        }
        let mut parts = piece.len();
        while let Some(Reverse(e)) = heap.pop() {
            let (rank, i) = ((e >> 32) as u32, e as u32);
            // A part merged into its left neighbour has `cur` of `u32::MAX`, which no entry
            // carries; a stale entry has a rank its part no longer has.
            if cur[i as usize] != rank {
                continue;
            }
            let j = next[i as usize];
            cur[j as usize] = u32::MAX;
            parts -= 1;
            next[i as usize] = next[j as usize];
            if next[j as usize] < n {
                prev[next[j as usize] as usize] = i;
            }
            for k in [Some(i), Some(prev[i as usize]).filter(|&p| p != END)]
                .into_iter()
                .flatten()
            {
                let r = pair(&next, k);
                cur[k as usize] = r;
                if r != u32::MAX {
                    heap.push(entry(r, k));
                }
            }
        }
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn o200k() -> &'static Vocab {
        &crate::tokens::O200K.vocab
    }

    #[test]
    fn the_vocabularies_load_whole() {
        assert_eq!(o200k().len(), 199_998);
        assert_eq!(crate::tokens::CL100K.vocab.len(), 100_256);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// The heap's merges are the scan's, and both are the reference encoder's, for any
        /// bytes (valid UTF-8 or not).
        #[test]
        fn both_merges_count_as_the_reference(bytes in prop::collection::vec(
            prop::sample::select(b"aeiouAEIOU stnrl.,-_/0123456789\xc3\xa9\xe6\x97\xa5\xf0\x9f".to_vec()),
            2..300,
        )) {
            let v = o200k();
            let reference = bpe_openai::o200k_base().bpe.count(&bytes);
            prop_assert_eq!(v.count_long(&bytes), reference);
            if bytes.len() <= 160 {
                prop_assert_eq!(v.count_short(&bytes), reference);
            }
            prop_assert_eq!(v.count(&bytes), reference);
        }
    }

    #[test]
    fn a_hostile_piece_costs_its_length() {
        // 256 KiB of one letter, of two alternating, of an emoji: one piece each, merged in
        // n log n (the scan alone would take minutes).
        for piece in [
            vec![b'a'; 1 << 18],
            b"ab".repeat(1 << 17),
            b"\xf0\x9f\x9a\x80".repeat(1 << 16),
        ] {
            let reference = bpe_openai::o200k_base().bpe.count(&piece);
            assert_eq!(o200k().count(&piece), reference);
        }
    }
}
