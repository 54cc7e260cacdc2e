//! Criterion benchmarks of the dispatch path, plus an allocation audit.
//!
//! - `lookup/N`: registry snapshot load + name lookup, at 10, 1,000 and 100,000 tools.
//! - `dispatch/N`: lookup + argument validation + running a builtin (`add`), no JSON framing.
//! - `message/*`: a whole JSON-RPC message, request bytes in, response bytes out, no socket.
//! - `compile/1000`: parse + validate + compile a 1,000-tool ToolSet and build its snapshot.
//! - `allocator/*`: alloc + free through jemalloc directly, through the binary's selectable
//!   allocator (jemalloc chosen), and through the system allocator.
//!
//! Before measuring, the allocations of one operation of each kind are counted with a
//! counting global allocator and printed (`allocs/op`). That allocator forwards to jemalloc,
//! the shipped binary's allocator, so the timings are those of the code as it ships.

#![allow(unsafe_code)] // The counting allocator below must implement `GlobalAlloc`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use quiver_server::config::{self, ToolSet};
use quiver_server::dispatch::{Ctx, Era, Server};
use quiver_server::metrics::Metrics;
use quiver_server::registry::Registry;
use serde_json::json;
use tikv_jemallocator::Jemalloc;

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to jemalloc unchanged; the counter is a relaxed atomic
// increment with no other effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { Jemalloc.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { Jemalloc.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { Jemalloc.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn toolset_yaml(n: usize) -> String {
    let mut y = String::from(
        "apiVersion: quiver.dev/v1alpha1\nkind: ToolSet\ntools:\n  - {name: add, handler: {builtin: add}}\n  - {name: greet, input: {name: string}, handler: {template: \"Hello {{name}}!\"}}\n",
    );
    for i in 2..n {
        y.push_str(&format!("  - {{name: tool-{i}, description: Tool number {i}, input: {{x: string}}, handler: {{template: \"{i}:{{{{x}}}}\"}}}}\n"));
    }
    y
}

/// The same ToolSet as `toolset_yaml`, built without YAML: 100,000 tools exceed the YAML
/// parser's node budget (250,000 nodes, a guard against YAML bombs).
fn toolset(n: usize) -> ToolSet {
    let mut tools = vec![
        json!({"name": "add", "handler": {"builtin": "add"}}),
        json!({"name": "greet", "input": {"name": "string"}, "handler": {"template": "Hello {{name}}!"}}),
    ];
    for i in 2..n {
        tools.push(json!({"name": format!("tool-{i}"), "description": format!("Tool number {i}"), "input": {"x": "string"}, "handler": {"template": format!("{i}:{{{{x}}}}")}}));
    }
    serde_json::from_value(json!({"tools": tools})).unwrap_or_else(|e| panic!("{e}"))
}

fn server(n: usize) -> Arc<Server> {
    let metrics = Metrics::new("bench", "system");
    let registry = Registry::new(&metrics);
    let compiled = config::compile(&toolset(n)).unwrap_or_else(|e| panic!("{e}"));
    registry.swap(compiled, &metrics);
    Server::new(registry, metrics)
}

const CALL_ADD: &[u8] =
    br#"{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"add","arguments":{"a":20,"b":22}}}"#;
const CALL_GREET: &[u8] = br#"{"jsonrpc":"2.0","id":"r-1","method":"tools/call","params":{"name":"greet","arguments":{"name":"Ada"}}}"#;
const LIST: &[u8] = br#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#;
const CTX: Ctx<'static> = Ctx {
    session: "",
    version: "2025-11-25",
    stream: false,
    era: Era::Legacy,
    caller: None,
};

/// Polls a future that completes without waiting (builtins, templates, lists) exactly once,
/// so the measurement is the dispatch code, not an executor's bookkeeping.
fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("this message should complete synchronously"),
    }
}

fn count<R>(f: impl Fn() -> R) -> u64 {
    f(); // warm caches and lazy statics
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..100 {
        black_box(f());
    }
    (ALLOCS.load(Ordering::Relaxed) - before) / 100
}

fn dispatch_once(server: &Server, name: &str, args: &serde_json::Value) -> bool {
    let snap = server.registry.load();
    let Some(i) = snap.tool_index(name) else {
        return false;
    };
    let tool = &snap.tools[i];
    let mut errs = Vec::new();
    tool.def.input.validate(args, &mut errs);
    server.exec.run_now(&snap, i, args).is_some_and(|o| !o.is_error)
}

fn audit() {
    let s = server(1000);
    let args = json!({"a": 20, "b": 22});
    println!("allocation audit (allocations per operation, 1,000-tool registry):");
    println!(
        "  lookup            {}",
        count(|| s.registry.load().tool_index("tool-500"))
    );
    println!(
        "  dispatch add      {}",
        count(|| dispatch_once(&s, "add", &args))
    );
    println!(
        "  message add       {}",
        count(|| ready(s.handle_one(CALL_ADD, CTX)).body)
    );
    println!(
        "  message greet     {}",
        count(|| ready(s.handle_one(CALL_GREET, CTX)).body)
    );
    println!(
        "  message tools/list {}",
        count(|| ready(s.handle_one(LIST, CTX)).body)
    );
}

fn bench_lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("lookup");
    for n in [10, 1_000, 100_000] {
        let s = server(n);
        let name = format!("tool-{}", n / 2);
        g.bench_with_input(BenchmarkId::from_parameter(n), &name, |b, name| {
            b.iter(|| s.registry.load().tool_index(black_box(name)))
        });
    }
    g.finish();
}

fn bench_dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch");
    let args = json!({"a": 20, "b": 22});
    for n in [10, 1_000, 100_000] {
        let s = server(n);
        g.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| dispatch_once(&s, black_box("add"), black_box(&args)))
        });
    }
    g.finish();
}

fn bench_message(c: &mut Criterion) {
    let mut g = c.benchmark_group("message");
    g.throughput(Throughput::Elements(1));
    for n in [10, 100_000] {
        let s = server(n);
        g.bench_function(BenchmarkId::new("call-add", n), |b| {
            b.iter(|| ready(s.handle_one(black_box(CALL_ADD), CTX)).body)
        });
    }
    let s = server(1000);
    g.bench_function("call-greet-template", |b| {
        b.iter(|| ready(s.handle_one(black_box(CALL_GREET), CTX)).body)
    });
    g.bench_function("tools-list-page", |b| {
        b.iter(|| ready(s.handle_one(black_box(LIST), CTX)).body)
    });
    g.finish();
}

fn bench_compile(c: &mut Criterion) {
    let yaml = toolset_yaml(1000);
    let metrics = Metrics::new("bench", "system");
    let mut g = c.benchmark_group("compile");
    g.sample_size(20);
    g.bench_function("1000", |b| {
        b.iter(|| {
            let ts: ToolSet = config::parse("bench", black_box(&yaml)).unwrap_or_else(|e| panic!("{e}"));
            let compiled = config::compile(&ts).unwrap_or_else(|e| panic!("{e}"));
            quiver_server::registry::Snapshot::build(compiled, 1, &metrics)
        })
    });
    g.finish();
}

/// One alloc/free pair per size, 16 B to 2 KiB, through `a`.
fn alloc_free<A: GlobalAlloc>(a: &A) {
    for shift in 4..=11 {
        let layout = Layout::from_size_align(1 << shift, 8).unwrap();
        // SAFETY: a non-zero-size layout; the block is freed with the layout it was made with.
        unsafe {
            let p = a.alloc(black_box(layout));
            assert!(!p.is_null());
            p.write(1);
            black_box(p);
            a.dealloc(p, layout);
        }
    }
}

fn bench_allocator(c: &mut Criterion) {
    let mut g = c.benchmark_group("allocator");
    g.throughput(Throughput::Elements(8));
    g.bench_function("jemalloc", |b| b.iter(|| alloc_free(&Jemalloc)));
    g.bench_function("selectable-jemalloc", |b| {
        b.iter(|| alloc_free(&quiver_server::alloc::Selectable))
    });
    g.bench_function("system", |b| b.iter(|| alloc_free(&System)));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(std::time::Duration::from_millis(500)).measurement_time(std::time::Duration::from_secs(2));
    targets = bench_lookup, bench_dispatch, bench_message, bench_compile, bench_allocator
}

fn main() {
    audit();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
