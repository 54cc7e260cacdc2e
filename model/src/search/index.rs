//! The index: for each word, the tools that hold it with a precomputed BM25F impact, so a
//! query is a sum over a few posting lists and a top-k pass, without allocating.

use rustc_hash::FxHashMap;

use super::words::{self, MAX_WORD};

/// Query words looked up at most (more are ignored).
pub const MAX_QUERY_TERMS: usize = 32;
/// Query bytes read at most (the rest is ignored).
pub const MAX_QUERY_BYTES: usize = 1024;
/// Description bytes indexed per tool.
const MAX_DESCRIPTION_BYTES: usize = 4096;
/// Parameter names indexed per tool.
const MAX_PARAMS: usize = 128;

/// BM25 term-frequency saturation.
const K1: f32 = 1.2;
/// Per field: weight and length normalization (BM25F).
const FIELDS: [(f32, f32); 3] = [(3.0, 0.5), (1.0, 0.75), (0.6, 0.3)];
/// Weight of a word a query word stands for ([`words::also`]) and of two adjacent query
/// words joined (`config map` also looks up `configmap`).
const EXPANDED: f32 = 0.5;
const JOINED: f32 = 0.8;

/// What one tool offers the index.
#[derive(Debug, Clone, Copy)]
pub struct Doc<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its title, when set.
    pub title: Option<&'a str>,
    /// Its description.
    pub description: &'a str,
}

/// An immutable lexical index over tools, by position.
#[derive(Debug, Default)]
pub struct Index {
    terms: FxHashMap<Box<str>, u32>,
    /// Posting list of term `t`: `starts[t]..starts[t + 1]` of `docs` and `impacts`.
    starts: Box<[u32]>,
    docs: Box<[u32]>,
    impacts: Box<[f32]>,
    len: usize,
}

/// Reusable query state: grows to the largest index it served, then allocates no more.
#[derive(Debug, Default)]
pub struct Scratch {
    scores: Vec<f32>,
    touched: Vec<u32>,
    terms: Vec<(u32, f32)>,
    word: String,
    prev: String,
    joined: String,
}

impl Scratch {
    /// Terms the last query looked up.
    pub fn term_count(&self) -> usize {
        self.terms.len()
    }
}

/// Term counts of one tool, per field.
type Counts = FxHashMap<u32, [u16; 3]>;

struct Builder {
    terms: FxHashMap<Box<str>, u32>,
    per_doc: Vec<(Counts, [u32; 3])>,
    buf: String,
}

impl Builder {
    fn term(&mut self, w: &str) -> u32 {
        if let Some(&id) = self.terms.get(w) {
            return id;
        }
        let id = self.terms.len() as u32;
        self.terms.insert(w.into(), id);
        id
    }

    fn count(&mut self, counts: &mut Counts, lens: &mut [u32; 3], field: usize, w: &str) {
        let id = self.term(w);
        let c = &mut counts.entry(id).or_default()[field];
        *c = c.saturating_add(1);
        lens[field] += 1;
    }

    /// Counts the folded words of `text` in `field`; with `joins`, also each run of two and
    /// three adjacent words written together (`ConfigMap` is also `configmap`).
    fn text(&mut self, counts: &mut Counts, lens: &mut [u32; 3], field: usize, text: &str, joins: bool) {
        let mut raw: Vec<String> = Vec::new();
        words::split(text, |w| raw.push(w.to_ascii_lowercase()));
        let mut buf = std::mem::take(&mut self.buf);
        for (i, w) in raw.iter().enumerate() {
            words::normalize(w, &mut buf);
            if words::is_stop(&buf) {
                continue;
            }
            words::canonical(&mut buf);
            self.count(counts, lens, field, &buf);
            if !joins {
                continue;
            }
            for n in 2..=3 {
                if i + 1 >= n {
                    let joined = raw[i + 1 - n..=i].concat();
                    words::normalize(&joined, &mut buf);
                    self.count(counts, lens, field, &buf);
                }
            }
        }
        self.buf = buf;
    }
}

impl Index {
    /// Indexes `docs`, each with its parameter names.
    pub fn build<'a>(docs: impl IntoIterator<Item = (Doc<'a>, Vec<&'a str>)>) -> Self {
        let mut b = Builder {
            terms: FxHashMap::default(),
            per_doc: Vec::new(),
            buf: String::new(),
        };
        for (doc, params) in docs {
            let mut counts = Counts::default();
            let mut lens = [0u32; 3];
            b.text(&mut counts, &mut lens, 0, doc.name, true);
            if let Some(t) = doc.title {
                b.text(&mut counts, &mut lens, 0, t, false);
            }
            let d = cut(doc.description, MAX_DESCRIPTION_BYTES);
            b.text(&mut counts, &mut lens, 1, d, false);
            for p in params.into_iter().take(MAX_PARAMS) {
                b.text(&mut counts, &mut lens, 2, p, true);
            }
            b.per_doc.push((counts, lens));
        }
        Self::weigh(b)
    }

    /// Turns term counts into posting lists of BM25F impacts.
    fn weigh(b: Builder) -> Self {
        let n = b.per_doc.len();
        let mut avg = [0f32; 3];
        for (_, lens) in &b.per_doc {
            for f in 0..3 {
                avg[f] += lens[f] as f32;
            }
        }
        let avg = avg.map(|s| (s / n.max(1) as f32).max(1.0));
        let mut df = vec![0u32; b.terms.len()];
        for (counts, _) in &b.per_doc {
            for id in counts.keys() {
                df[*id as usize] += 1;
            }
        }
        let mut starts = Vec::with_capacity(df.len() + 1);
        let mut at = 0u32;
        for d in &df {
            starts.push(at);
            at += d;
        }
        starts.push(at);
        let mut fill: Vec<u32> = starts[..df.len()].to_vec();
        let mut docs = vec![0u32; at as usize];
        let mut impacts = vec![0f32; at as usize];
        for (doc, (counts, lens)) in b.per_doc.iter().enumerate() {
            for (id, tf) in counts {
                let mut t = 0f32;
                for (f, &(w, bf)) in FIELDS.iter().enumerate() {
                    let norm = 1.0 - bf + bf * lens[f] as f32 / avg[f];
                    t += w * f32::from(tf[f]) / norm;
                }
                let d = df[*id as usize] as f32;
                let idf = (1.0 + (n as f32 - d + 0.5) / (d + 0.5)).ln();
                let slot = &mut fill[*id as usize];
                docs[*slot as usize] = doc as u32;
                impacts[*slot as usize] = idf * t * (K1 + 1.0) / (K1 + t);
                *slot += 1;
            }
        }
        Self {
            terms: b.terms,
            starts: starts.into(),
            docs: docs.into(),
            impacts: impacts.into(),
            len: n,
        }
    }

    /// How many tools it indexes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it indexes no tool.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The best `limit` tools for `query` that `keep` accepts, best first, into `out` (as
    /// positions with their scores). Tools matching no word of the query are never returned.
    /// `keep` is asked only about tools that would make the list.
    pub fn search(
        &self,
        query: &str,
        limit: usize,
        scratch: &mut Scratch,
        mut keep: impl FnMut(usize) -> bool,
        out: &mut Vec<(usize, f32)>,
    ) {
        out.clear();
        if limit == 0 || self.len == 0 {
            return;
        }
        self.query_terms(cut(query, MAX_QUERY_BYTES), scratch);
        let Scratch {
            scores,
            touched,
            terms,
            ..
        } = scratch;
        if scores.len() < self.len {
            scores.resize(self.len, 0.0);
        }
        touched.clear();
        for &(t, w) in terms.iter() {
            let (s, e) = (
                self.starts[t as usize] as usize,
                self.starts[t as usize + 1] as usize,
            );
            for (d, i) in self.docs[s..e].iter().zip(&self.impacts[s..e]) {
                let slot = &mut scores[*d as usize];
                if *slot == 0.0 {
                    touched.push(*d);
                }
                *slot += w * i;
            }
        }
        for &d in touched.iter() {
            let s = std::mem::take(&mut scores[d as usize]);
            let d = d as usize;
            let better = |o: &(usize, f32)| s > o.1 || (s == o.1 && d < o.0);
            if out.len() == limit && !out.last().is_some_and(better) {
                continue;
            }
            if !keep(d) {
                continue;
            }
            let at = out.iter().position(better).unwrap_or(out.len());
            if out.len() == limit {
                out.pop();
            }
            out.insert(at, (d, s));
        }
    }

    /// Fills `scratch.terms` with the query's term ids and weights (each term once, at its
    /// largest weight).
    fn query_terms(&self, query: &str, scratch: &mut Scratch) {
        let Scratch {
            terms,
            word,
            prev,
            joined,
            ..
        } = scratch;
        terms.clear();
        prev.clear();
        let add = |terms: &mut Vec<(u32, f32)>, w: &str, weight: f32| {
            let Some(&id) = self.terms.get(w) else {
                return;
            };
            if let Some(t) = terms.iter_mut().find(|(t, _)| *t == id) {
                t.1 = t.1.max(weight);
            } else if terms.len() < MAX_QUERY_TERMS {
                terms.push((id, weight));
            }
        };
        words::split(query, |raw| {
            if !prev.is_empty() && prev.len() + raw.len() <= MAX_WORD {
                joined.clear();
                joined.push_str(prev);
                joined.extend(raw.bytes().map(|b| char::from(b.to_ascii_lowercase())));
                words::normalize(joined, word);
                add(terms, word, JOINED);
            }
            prev.clear();
            prev.extend(
                raw.bytes()
                    .take(MAX_WORD)
                    .map(|b| char::from(b.to_ascii_lowercase())),
            );
            words::normalize(raw, word);
            if words::is_stop(word) {
                prev.clear();
                return;
            }
            words::canonical(word);
            add(terms, word, 1.0);
            for more in words::also(word) {
                add(terms, more, EXPANDED);
            }
        });
    }
}

/// `s` cut to at most `max` bytes, at a char boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
