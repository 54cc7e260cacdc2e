//! Criterion benchmarks of tool search over 10,000 synthetic tools, plus an allocation count.
//!
//! - `search/10k/*`: one `find_tools` ranking (top 5) for a short, a typical and a long query.
//! - `search/build_10k`: building the index of the 10,000 tools (what a reload pays).
//!
//! The tools are camelCase operation names over 25 verbs, 80 resources and 5 API groups, with
//! a sentence of description and 3-8 parameter names each. Before measuring, the allocations
//! of one warm query are counted and printed.

#![allow(unsafe_code)] // The counting allocator below must implement `GlobalAlloc`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use quiver_server::search::{Doc, Index, Scratch};

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

const VERBS: [&str; 25] = [
    "list", "get", "create", "delete", "update", "patch", "replace", "watch", "search", "export", "import",
    "archive", "restore", "approve", "reject", "assign", "close", "open", "sync", "validate", "rotate",
    "enable", "disable", "count", "describe",
];
const RESOURCES: [&str; 80] = [
    "Pod",
    "Service",
    "Deployment",
    "Secret",
    "ConfigMap",
    "Node",
    "Volume",
    "Claim",
    "Account",
    "Role",
    "Binding",
    "Policy",
    "Ingress",
    "Route",
    "Gateway",
    "Certificate",
    "Issuer",
    "Job",
    "CronJob",
    "Event",
    "Alert",
    "Rule",
    "Dashboard",
    "Panel",
    "Metric",
    "Trace",
    "Span",
    "Log",
    "Bucket",
    "Object",
    "Table",
    "Row",
    "Column",
    "Index",
    "Query",
    "View",
    "User",
    "Group",
    "Team",
    "Project",
    "Issue",
    "Comment",
    "Label",
    "Milestone",
    "Release",
    "Tag",
    "Branch",
    "Commit",
    "PullRequest",
    "Review",
    "Invoice",
    "Payment",
    "Customer",
    "Order",
    "Product",
    "Cart",
    "Coupon",
    "Refund",
    "Subscription",
    "Plan",
    "Ticket",
    "Agent",
    "Queue",
    "Message",
    "Topic",
    "Channel",
    "Thread",
    "File",
    "Folder",
    "Document",
    "Page",
    "Calendar",
    "Meeting",
    "Contact",
    "Lead",
    "Deal",
    "Campaign",
    "Segment",
    "Report",
    "Forecast",
];
const GROUPS: [&str; 5] = ["Core", "Apps", "Billing", "Crm", "Ops"];
const PARAMS: [&str; 16] = [
    "namespace",
    "name",
    "id",
    "limit",
    "cursor",
    "labelSelector",
    "fieldSelector",
    "body",
    "dryRun",
    "force",
    "owner",
    "since",
    "until",
    "status",
    "priority",
    "region",
];

fn tools() -> Vec<(String, String, Vec<&'static str>)> {
    let mut out = Vec::with_capacity(10_000);
    'all: for g in GROUPS {
        for r in RESOURCES {
            for v in VERBS {
                if out.len() == 10_000 {
                    break 'all;
                }
                let name = format!("{v}{g}V1{r}");
                let description = format!(
                    "{v} the {} of the {} API: {} one or more {r} objects and return them",
                    r.to_lowercase(),
                    g.to_lowercase(),
                    v
                );
                let n = 3 + out.len() % 6;
                let params = (0..n)
                    .map(|k| PARAMS[(out.len() + k * 5) % PARAMS.len()])
                    .collect();
                out.push((name, description, params));
            }
        }
    }
    // 5 x 80 x 25 = 10,000.
    assert_eq!(out.len(), 10_000);
    out
}

fn build(tools: &[(String, String, Vec<&'static str>)]) -> Index {
    Index::build(tools.iter().map(|(name, description, params)| {
        let doc = Doc {
            name,
            title: None,
            description,
        };
        (doc, params.clone())
    }))
}

const QUERIES: [(&str, &str); 3] = [
    ("short", "invoices"),
    ("typical", "list the pods in a namespace"),
    (
        "long",
        "I need to find every open support ticket assigned to my team in the EU region since last week, ordered by priority",
    ),
];

fn bench(c: &mut Criterion) {
    let tools = tools();
    let index = build(&tools);
    let mut scratch = Scratch::default();
    let mut hits = Vec::with_capacity(8);
    for (label, q) in QUERIES {
        index.search(q, 5, &mut scratch, |_| true, &mut hits);
        let before = ALLOCS.load(Ordering::Relaxed);
        index.search(q, 5, &mut scratch, |_| true, &mut hits);
        let n = ALLOCS.load(Ordering::Relaxed) - before;
        let top: Vec<&str> = hits.iter().map(|(i, _)| tools[*i].0.as_str()).collect();
        println!("search/10k/{label}: {n} allocations per warm query; top {top:?}");
    }
    let mut g = c.benchmark_group("search");
    for (label, q) in QUERIES {
        g.bench_function(format!("10k/{label}"), |b| {
            b.iter(|| {
                index.search(black_box(q), 5, &mut scratch, |_| true, &mut hits);
                black_box(hits.len())
            })
        });
    }
    g.sample_size(10);
    g.bench_function("build_10k", |b| b.iter(|| black_box(build(&tools)).len()));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
