//! Criterion benchmarks of result guards: searching a tool's result for secrets and
//! personal data.
//!
//! - `guards/clean_4k`: a 4 KiB JSON-shaped result (a list of deployments: names, images,
//!   timestamps, UIDs, counts, URLs) with nothing to find, every rule on.
//! - `guards/redact_4k`: the same with an e-mail address, a card number and an AWS key ID in
//!   it, redacted (the search plus the rewritten string).
//! - `guards/clean_64k`: 64 KiB of the clean result, every rule on (per KiB: divide by 64).
//! - `guards/secrets_only_4k` and `guards/personal_only_4k`: one family of rules each.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use quiver_model::config::guards::{GuardAction, ResultGuard, ResultGuardSpec, Verdict};
use quiver_model::guard::Scan;

/// A JSON-shaped result of about `bytes` bytes with nothing a guard finds.
fn clean(bytes: usize) -> String {
    let mut out = String::from("{\"items\":[");
    let mut i = 0u64;
    while out.len() < bytes {
        out.push_str(&format!(
            "{{\"name\":\"checkout-{i}\",\"namespace\":\"shop\",\"image\":\"registry.internal/shop/checkout:1.{i}.3\",\
\"uid\":\"6f1c2a9e-4b7d-4e21-9c3a-{i:012}\",\"replicas\":{},\"created\":\"2026-11-{:02}T10:15:3{}Z\",\
\"url\":\"https://checkout.shop.svc:8443/healthz\",\"note\":\"Rolled out by the pipeline at build {}.\"}},",
            i % 5 + 1,
            i % 28 + 1,
            i % 10,
            1_000_000 + i * 7919
        ));
        i += 1;
    }
    out.truncate(bytes);
    out
}

fn guard(secrets: GuardAction, personal: GuardAction) -> std::sync::Arc<ResultGuard> {
    ResultGuard::compile(&ResultGuardSpec {
        secrets: Some(secrets),
        personal_data: Some(personal),
        ignore: Vec::new(),
        tokens: None,
    })
}

fn run(g: &ResultGuard, text: &str, scan: &mut Scan) -> Option<String> {
    let mut v = Verdict::default();
    g.check_str(black_box(text), scan, &mut v)
}

fn benches(c: &mut Criterion) {
    let both = guard(GuardAction::Redact, GuardAction::Redact);
    let secrets = guard(GuardAction::Redact, GuardAction::Off);
    let personal = guard(GuardAction::Off, GuardAction::Redact);
    let clean_4k = clean(4096);
    let clean_64k = clean(65536);
    let mut dirty = clean(4096 - 80);
    dirty.insert_str(900, " owner jane.doe@acme.io ");
    dirty.insert_str(2000, " card 4111 1111 1111 1111 ");
    dirty.insert_str(3000, " AKIAZ2QXLMN7ORP4VWTY ");
    let mut scan = Scan::default();
    assert!(
        run(&both, &clean_4k, &mut scan).is_none(),
        "the clean result has findings"
    );
    assert!(
        run(&both, &clean_64k, &mut scan).is_none(),
        "the clean result has findings"
    );
    let redacted = run(&both, &dirty, &mut scan).expect("findings");
    assert_eq!(redacted.matches("[redacted:").count(), 3, "{redacted}");

    let mut g = c.benchmark_group("guards");
    g.bench_function("clean_4k", |b| b.iter(|| run(&both, &clean_4k, &mut scan)));
    g.bench_function("redact_4k", |b| b.iter(|| run(&both, &dirty, &mut scan)));
    g.bench_function("clean_64k", |b| b.iter(|| run(&both, &clean_64k, &mut scan)));
    g.bench_function("secrets_only_4k", |b| {
        b.iter(|| run(&secrets, &clean_4k, &mut scan))
    });
    g.bench_function("personal_only_4k", |b| {
        b.iter(|| run(&personal, &clean_4k, &mut scan))
    });
    g.finish();
}

criterion_group!(guards, benches);
criterion_main!(guards);
