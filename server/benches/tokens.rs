//! Token counting of results (`resultGuards.tokens`), side by side with the `bpe-openai`
//! crate's own counting of the same text (its expression for every piece, no cache):
//! - `compact_json_4k`: a serialized JSON document (a dashboard), no whitespace;
//! - `prose_4k`: this project's documentation, Markdown with some non-ASCII punctuation;
//! - `cjk_4k`: Japanese text (every span goes through the expression);
//! - `cut_64k_at_25k`: the cut of a 64 KiB result to 25,000 tokens (`prefix`).
//!
//! The inputs repeat between iterations, so the piece cache is warm, as it is for a tool
//! whose results share their keys and words.
//!
//! Before measuring, the load of each encoding's tables (its vocabulary's index and its
//! expression) is timed once and its resident memory printed (`tables/...`).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use quiver_server::tokens::{Encoding, count, prefix};

/// The first `n` bytes of `s`, to a character boundary.
fn cut(s: String, n: usize) -> String {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn inputs() -> Vec<(&'static str, String)> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let read = |p: &str| std::fs::read_to_string(format!("{root}/{p}")).expect("an input");
    let dash: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/quiver-dispatch.json")).expect("json");
    vec![
        ("compact_json_4k", cut(dash.to_string(), 4096)),
        ("prose_4k", cut(read("docs/guards.md"), 4096)),
        (
            "cjk_4k",
            cut(
                "東京都は日本の首都です。人口は約1400万人で、世界有数の大都市です。".repeat(60),
                4096,
            ),
        ),
    ]
}

fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

fn benches(c: &mut Criterion) {
    for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
        let (before, start) = (resident_kib(), std::time::Instant::now());
        let tokens = enc.load();
        println!(
            "tables/{enc:?}: {tokens} tokens loaded in {:.1} ms, {:.1} MiB resident",
            start.elapsed().as_secs_f64() * 1e3,
            (resident_kib().saturating_sub(before)) as f64 / 1024.0
        );
    }
    let mut g = c.benchmark_group("tokens");
    for (name, text) in inputs() {
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_function(format!("{name}/quiver"), |b| {
            b.iter(|| count(Encoding::O200kBase, black_box(&text)));
        });
        let tok = bpe_openai::o200k_base();
        g.bench_function(format!("{name}/bpe_openai"), |b| {
            b.iter(|| tok.count(black_box(text.as_str())));
        });
    }
    let big = serde_json::to_string_pretty(
        &serde_json::from_str::<serde_json::Value>(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../deploy/grafana/quiver-dispatch.json"
            ))
            .expect("an input"),
        )
        .expect("json"),
    )
    .expect("json")
    .repeat(2);
    let big = &cut(big, 65536);
    g.throughput(Throughput::Bytes(big.len() as u64));
    g.bench_function("cut_64k_at_25k/quiver", |b| {
        b.iter(|| prefix(Encoding::O200kBase, black_box(big), 25_000));
    });
    g.finish();
}

criterion_group!(tokens_benches, benches);
criterion_main!(tokens_benches);
