//! Criterion benchmarks of policy evaluation (CEL), plus an allocation count.
//!
//! - `policy/typical`: `'sre' in caller.groups && args.namespace != 'prod'` on a caller in
//!   4 groups and 3 arguments, allowed.
//! - `policy/claims`: a rule over a claim, an annotation and a list literal.
//! - `policy/exists`: `exists` over 32 items of an argument.
//! - `policy/compile`: parse, check and compile the typical rule.
//!
//! Before measuring, the allocations of one evaluation of each rule are counted and printed.

#![allow(unsafe_code)] // The counting allocator below must implement `GlobalAlloc`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use quiver_server::config::policy::{Policy, ToolFacts, Verdict};
use quiver_server::spec::access::Principal;
use serde_json::{Value, json};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to the system allocator unchanged; the counter is a relaxed
// atomic increment with no other effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const TYPICAL: &str = "'sre' in caller.groups && args.namespace != 'prod'";
const CLAIMS: &str = "caller.claims.department in ['platform', 'sre'] && tool.annotations.readOnlyHint != true && caller.clientId == 'cli'";
const EXISTS: &str = "!args.items.exists(i, i.kind == 'Secret')";

fn benches(c: &mut Criterion) {
    let mut who = Principal::new(["read", "deploy:write"], ["dev", "ops", "oncall", "sre"]);
    who.credential = Some(Arc::new(quiver_server::spec::caller::Credential::new(
        "token",
        json!({"sub": "alice", "iss": "https://idp.example", "azp": "cli", "department": "sre"}),
    )));
    let annotations = json!({"readOnlyHint": false, "destructiveHint": true});
    let facts = ToolFacts {
        name: "restart",
        upstream: "",
        annotations: &annotations,
    };
    let args = json!({"namespace": "dev", "name": "api", "replicas": 3,
        "items": (0..32).map(|i| json!({"kind": format!("Kind{i}")})).collect::<Vec<Value>>()});
    let mut g = c.benchmark_group("policy");
    for (name, src) in [("typical", TYPICAL), ("claims", CLAIMS), ("exists", EXISTS)] {
        let p = Policy::compile(name, false, src).expect("compiles");
        assert_eq!(
            p.evaluate(Some(&who), facts, Some(&args)),
            Verdict::Allow,
            "{src}"
        );
        let before = ALLOCS.load(Ordering::Relaxed);
        black_box(p.evaluate(Some(&who), facts, Some(&args)));
        println!(
            "policy/{name}: {} allocs/op",
            ALLOCS.load(Ordering::Relaxed) - before
        );
        g.bench_function(name, |b| {
            b.iter(|| p.evaluate(black_box(Some(&who)), facts, black_box(Some(&args))));
        });
    }
    g.bench_function("compile", |b| {
        b.iter(|| Policy::compile("p", false, black_box(TYPICAL)).is_ok());
    });
    g.finish();
}

criterion_group!(group, benches);
criterion_main!(group);
