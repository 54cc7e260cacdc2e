//! Criterion benchmarks of the dispatch path, plus an allocation audit.
//!
//! - `lookup/N`: registry snapshot load + name lookup, at 10, 1,000 and 100,000 tools.
//! - `dispatch/N`: lookup + argument validation + running a builtin (`add`), no JSON framing.
//! - `message/*`: a whole JSON-RPC message, request bytes in, response bytes out, no socket.
//! - `compile/1000`: parse + validate + compile a 1,000-tool ToolSet and build its snapshot;
//!   `/operator-json` the same from the JSON document the operator writes; `/parse`,
//!   `/compile`, `/snapshot` the stages.
//! - `governed/*`: the `greet` call of a 10-tool registry with nothing on (`plain`), a
//!   typical policy (`policy`), a per-caller rate limit that never refuses (`limit`), the
//!   audit trail to /dev/null (`audit`), and all three (`all`): the request's thread only (the
//!   audit writer runs on its own thread; its share is in the `governance` audit below).
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
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use quiver_server::config::{self, ToolSet};
use quiver_server::dispatch::{Ctx, Era, Opens, Server};
use quiver_server::metrics::Metrics;
use quiver_server::registry::Registry;
use serde_json::json;
use tikv_jemallocator::Jemalloc;

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
/// Bytes allocated and not yet freed (requested sizes).
static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: every method forwards to jemalloc unchanged; the counter is a relaxed atomic
// increment with no other effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        MINE.with(|m| m.set(m.get() + 1));
        LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        unsafe { Jemalloc.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as i64, Ordering::Relaxed);
        unsafe { Jemalloc.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        MINE.with(|m| m.set(m.get() + 1));
        LIVE.fetch_add(n as i64 - l.size() as i64, Ordering::Relaxed);
        unsafe { Jemalloc.realloc(p, l, n) }
    }
}

thread_local! {
    /// Allocations made by this thread (the audit writer's are not the request's).
    static MINE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
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
    serde_json::from_value(toolset_value(n)).unwrap_or_else(|e| panic!("{e}"))
}

/// [`toolset`] as JSON.
fn toolset_value(n: usize) -> serde_json::Value {
    let mut tools = vec![
        json!({"name": "add", "handler": {"builtin": "add"}}),
        json!({"name": "greet", "input": {"name": "string"}, "handler": {"template": "Hello {{name}}!"}}),
    ];
    for i in 2..n {
        tools.push(json!({"name": format!("tool-{i}"), "description": format!("Tool number {i}"), "input": {"x": "string"}, "handler": {"template": format!("{i}:{{{{x}}}}")}}));
    }
    json!({"tools": tools})
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
    era: Era::Handshake,
    caller: None,
    opens: Opens::Minted,
    client: None,
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

/// [`count`] of this thread's allocations alone.
fn count_mine<R>(f: impl Fn() -> R) -> u64 {
    f();
    let before = MINE.with(std::cell::Cell::get);
    for _ in 0..100 {
        black_box(f());
    }
    (MINE.with(std::cell::Cell::get) - before) / 100
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
        count(|| ready(s.handle_one(CALL_ADD, CTX)).into_body())
    );
    println!(
        "  message greet     {}",
        count(|| ready(s.handle_one(CALL_GREET, CTX)).into_body())
    );
    println!(
        "  message tools/list {}",
        count(|| ready(s.handle_one(LIST, CTX)).into_body())
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
            b.iter(|| ready(s.handle_one(black_box(CALL_ADD), CTX)).into_body())
        });
    }
    let s = server(1000);
    g.bench_function("call-greet-template", |b| {
        b.iter(|| ready(s.handle_one(black_box(CALL_GREET), CTX)).into_body())
    });
    g.bench_function("tools-list-page", |b| {
        b.iter(|| ready(s.handle_one(black_box(LIST), CTX)).into_body())
    });
    g.finish();
}

/// The governed configurations: (name, policy on, limit on, audit on).
const GOVERNED: [(&str, bool, bool, bool); 5] = [
    ("plain", false, false, false),
    ("policy", true, false, false),
    ("limit", false, true, false),
    ("audit", false, false, true),
    ("all", true, true, true),
];

/// A 10-tool server with a typical policy, a rate limit (never refusing) and the audit
/// trail (to /dev/null), as asked.
fn governed(policy: bool, limit: bool, audit: bool) -> Arc<Server> {
    let mut set = toolset_value(10);
    if policy {
        set["policies"] =
            json!([{"name": "typical", "expression": "'sre' in caller.groups || args.name != 'prod'"}]);
    }
    if limit {
        set["limits"] = json!([{"rate": "1000000/s", "burst": 1_000_000}]);
    }
    let set: ToolSet = serde_json::from_value(set).unwrap_or_else(|e| panic!("{e}"));
    let metrics = Metrics::new("bench", "system");
    let registry = Registry::new(&metrics);
    registry.swap(config::compile(&set).unwrap_or_else(|e| panic!("{e}")), &metrics);
    let gov = metrics.gov.clone();
    let log = audit.then(|| {
        let sink = quiver_server::audit::Sink::File("/dev/null".into());
        quiver_server::audit::AuditLog::start(
            &sink,
            1 << 16,
            quiver_server::audit::OnFull::Drop,
            quiver_server::secrets::Secrets::new(),
            gov.clone(),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    });
    let limiter = quiver_server::limits::Limiter::new(quiver_server::limits::DEFAULT_MAX_KEYS, None, gov);
    Server::builder(registry, metrics)
        .limiter(limiter)
        .audit(log)
        .build()
}

/// This process's CPU time (user + system) so far, from /proc (clock ticks).
fn process_cpu() -> std::time::Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat(5) (the first after the `)` is field 3): utime, stime, in 1/100 s.
    let field = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    let ticks = field(11) + field(12);
    std::time::Duration::from_millis(ticks * 10)
}

/// Process CPU per governed call (every thread: the audit writer's serializing and writing
/// included) and allocations per call on the request's thread, for each configuration.
fn audit_governed() {
    const CALLS: u64 = 400_000;
    println!("governance (process CPU per `greet` call, every thread, and allocations per call):");
    for (name, policy, limit, audit) in GOVERNED {
        let s = governed(policy, limit, audit);
        let allocs = count_mine(|| ready(s.handle_one(CALL_GREET, CTX)).into_body());
        let written = || s.metrics.gov.audit_records.get() + s.metrics.gov.audit_dropped.get();
        let before = (written(), process_cpu());
        let t = std::time::Instant::now();
        for i in 0..CALLS {
            black_box(ready(s.handle_one(black_box(CALL_GREET), CTX)).into_body());
            // Paced so that the writer's queue never fills (a dropped record costs less).
            if audit && i % 8192 == 8191 {
                while written() + 16_384 < before.0 + i {
                    std::thread::yield_now();
                }
            }
        }
        if audit {
            while written() < before.0 + CALLS {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let cpu = process_cpu() - before.1;
        println!(
            "  {name:<7} {:>6.0} ns CPU/call ({:>6.0} ns wall), {allocs} allocations/call, {} audit records dropped",
            cpu.as_nanos() as f64 / CALLS as f64,
            t.elapsed().as_nanos() as f64 / CALLS as f64,
            s.metrics.gov.audit_dropped.get()
        );
    }
}

fn bench_governed(c: &mut Criterion) {
    let mut g = c.benchmark_group("governed");
    g.throughput(Throughput::Elements(1));
    for (name, policy, limit, audit) in GOVERNED {
        let s = governed(policy, limit, audit);
        g.bench_function(name, |b| {
            b.iter(|| ready(s.handle_one(black_box(CALL_GREET), CTX)).into_body())
        });
    }
    g.finish();
}

/// A tools/call (or other) request as raw HTTP/1.1 bytes, keep-alive.
fn http_post(body: &str) -> Vec<u8> {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends `req` and reads one whole response into `buf` without allocating (the client's
/// side adds nothing to the count); returns the status line's code and the body.
fn exchange<'b>(c: &mut std::net::TcpStream, req: &[u8], buf: &'b mut [u8]) -> (u16, &'b [u8]) {
    use std::io::{Read, Write};
    c.write_all(req).unwrap_or_else(|e| panic!("{e}"));
    let mut got = 0;
    loop {
        let n = c.read(&mut buf[got..]).unwrap_or_else(|e| panic!("{e}"));
        assert!(n > 0, "the server closed the connection");
        got += n;
        let Some(end) = buf[..got].windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = std::str::from_utf8(&buf[..end]).unwrap_or("");
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no content-length in {head}"));
        if got >= end + 4 + len {
            let code = head[9..12].parse().unwrap_or(0);
            return (code, &buf[end + 4..end + 4 + len]);
        }
    }
}

/// Allocations per request from socket read to socket write: the real accept loop, hyper,
/// the axum app and dispatch, for every handler kind, counted over 200 requests on one
/// keep-alive connection (the client reads into a fixed buffer and allocates nothing).
fn audit_wire() {
    use quiver_server::admin::{self, AdminState};
    use quiver_server::reload::Reloader;
    use quiver_server::transport::http::{HttpOptions, HttpState, app};
    use quiver_server::transport::limits::Connections;
    use quiver_server::transport::listen::{ConnOptions, serve};

    let mcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let adm = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let (mcp_addr, adm_addr) = (
        mcp.local_addr().unwrap_or_else(|e| panic!("{e}")),
        adm.local_addr().unwrap_or_else(|e| panic!("{e}")),
    );
    let yaml = format!(
        r#"
tools:
  - {{name: add, handler: {{builtin: add}}}}
  - {{name: greet, input: {{name: string}}, handler: {{template: "Hello {{{{name}}}}!"}}}}
  - name: add-then-greet
    input: {{a: number, b: number}}
    handler:
      pipeline:
        - {{tool: add, input: {{a: "{{{{a}}}}", b: "{{{{b}}}}"}}}}
        - {{tool: greet, input: {{name: "{{{{steps.0.text}}}}"}}}}
  - {{name: status, handler: {{http: {{method: GET, url: "http://{adm_addr}/healthz", timeout: 2s}}}}}}
  - {{name: word-count, input: {{text: string}}, handler: {{exec: {{command: [/usr/bin/wc, -w], stdin: "{{{{text}}}}", timeout: 2s}}}}}}
resources:
  - {{uri: "quiver://readme", name: readme, text: "A resource."}}
prompts:
  - {{name: hello, arguments: [{{name: who, required: true}}], messages: [{{role: user, text: "Say hello to {{{{who}}}}."}}]}}
"#
    );
    let metrics = Metrics::new("bench", "system");
    let server = Server::new(Registry::new(&metrics), metrics);
    Reloader::new(server.clone())
        .apply(&[("bench.yaml".into(), yaml)])
        .unwrap_or_else(|e| panic!("{e}"));
    let stop = tokio_util::sync::CancellationToken::new();
    let state = HttpState::new(server.clone(), HttpOptions::default(), stop.clone());
    let load = state.load();
    let admin_state = Arc::new(AdminState {
        server: server.clone(),
        source: "bench".into(),
        tuning: quiver_server::tuning::plan(1, false),
        started: std::time::Instant::now(),
        load: load.clone(),
        auth: "none",
    });
    let serving = stop.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        rt.block_on(async move {
            mcp.set_nonblocking(true).unwrap_or_else(|e| panic!("{e}"));
            adm.set_nonblocking(true).unwrap_or_else(|e| panic!("{e}"));
            let (mcp, adm) = (
                tokio::net::TcpListener::from_std(mcp),
                tokio::net::TcpListener::from_std(adm),
            );
            let (mcp, adm) = (
                mcp.unwrap_or_else(|e| panic!("{e}")),
                adm.unwrap_or_else(|e| panic!("{e}")),
            );
            tokio::spawn(serve(
                adm,
                admin::app(admin_state),
                Connections::new(admin::MAX_CONNECTIONS),
                admin::CONN_OPTIONS,
                serving.clone(),
                None,
            ));
            serve(
                mcp,
                app(state),
                load.connections.clone(),
                ConnOptions::default(),
                serving,
                None,
            )
            .await;
        });
    });
    let mut c = std::net::TcpStream::connect(mcp_addr).unwrap_or_else(|e| panic!("{e}"));
    c.set_nodelay(true).ok();
    let mut buf = vec![0u8; 1 << 16];
    let call = |tool: &str, args: &str| {
        http_post(&format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
        ))
    };
    let rpc = |method: &str, params: &str| {
        http_post(&format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"{method}","params":{params}}}"#
        ))
    };
    let cases = [
        (
            "tools/call add (builtin)",
            call("add", r#"{"a":20,"b":22}"#),
            "42",
        ),
        (
            "tools/call greet (template)",
            call("greet", r#"{"name":"Ada"}"#),
            "Hello Ada!",
        ),
        (
            "tools/call add-then-greet (pipeline)",
            call("add-then-greet", r#"{"a":1,"b":2}"#),
            "Hello 3!",
        ),
        ("tools/call status (http)", call("status", "{}"), "ok"),
        (
            "tools/call word-count (exec)",
            call("word-count", r#"{"text":"a b c"}"#),
            "3",
        ),
        ("tools/list", rpc("tools/list", "{}"), "add-then-greet"),
        (
            "resources/read",
            rpc("resources/read", r#"{"uri":"quiver://readme"}"#),
            "A resource.",
        ),
        (
            "prompts/get",
            rpc("prompts/get", r#"{"name":"hello","arguments":{"who":"Ada"}}"#),
            "Say hello to Ada.",
        ),
        ("ping", rpc("ping", "{}"), "{}"),
    ];
    println!(
        "allocation audit over the socket (allocations per request, HTTP/1.1 keep-alive, socket read to socket write):"
    );
    for (what, req, expect) in &cases {
        for _ in 0..10 {
            let (code, body) = exchange(&mut c, req, &mut buf);
            let text = String::from_utf8_lossy(body);
            assert!(
                code == 200 && text.contains(expect) && !text.contains("\"isError\":true"),
                "{what}: {code} {text}"
            );
        }
        let before = ALLOCS.load(Ordering::Relaxed);
        for _ in 0..200 {
            black_box(exchange(&mut c, req, &mut buf));
        }
        println!("  {what:<38} {}", (ALLOCS.load(Ordering::Relaxed) - before) / 200);
    }
    stop.cancel();
}

/// Heap bytes kept per tool, by stage, from the growth between 1,000 and 10,000 tools
/// (so fixed costs cancel out): the parsed ToolSet, the compiled tools, the registry
/// snapshot, and the whole server after a real reload (snapshot, metrics series, the
/// sources kept for upstream refreshes).
fn audit_memory() {
    use quiver_server::reload::Reloader;
    fn kept<T>(f: impl FnOnce() -> T) -> (T, i64) {
        let before = LIVE.load(Ordering::Relaxed);
        let v = f();
        (v, LIVE.load(Ordering::Relaxed) - before)
    }
    let sources = |n: usize| -> Vec<(String, String)> {
        (0..n)
            .step_by(1000)
            .map(|f| {
                let mut y = String::from("tools:\n");
                for i in f..(f + 1000).min(n) {
                    y.push_str(&format!("  - {{name: tool-{i}, description: Tool number {i}, input: {{x: string}}, handler: {{template: \"{i}:{{{{x}}}}\"}}}}\n"));
                }
                (format!("part-{f}.yaml"), y)
            })
            .collect()
    };
    let metrics = Metrics::new("bench", "system");
    let mut rows = Vec::new();
    for n in [1000, 10_000] {
        let src = sources(n);
        let (sets, parsed) = kept(|| {
            src.iter()
                .map(|(name, y)| config::parse(name, y).unwrap_or_else(|e| panic!("{e}")))
                .collect::<Vec<ToolSet>>()
        });
        let (compiled, compiled_bytes) = kept(|| {
            sets.iter()
                .map(|t| config::compile(t).unwrap_or_else(|e| panic!("{e}")))
                .collect::<Vec<_>>()
        });
        drop(sets);
        let (snaps, snapshot) = kept(|| {
            compiled
                .into_iter()
                .map(|c| quiver_server::registry::Snapshot::build(c, 1, &metrics))
                .collect::<Vec<_>>()
        });
        drop(snaps);
        let (server, whole) = kept(|| {
            let metrics = Metrics::new("bench", "system");
            let server = Server::new(Registry::new(&metrics), metrics);
            Reloader::new(server.clone())
                .apply(&src)
                .unwrap_or_else(|e| panic!("{e}"));
            server
        });
        drop(server);
        rows.push((parsed, compiled_bytes, snapshot, whole));
    }
    let per = |f: fn(&(i64, i64, i64, i64)) -> i64| (f(&rows[1]) - f(&rows[0])) / 9000;
    println!("heap bytes kept per tool (growth from 1,000 to 10,000 tools, per tool):");
    println!("  parsed ToolSet           {}", per(|r| r.0));
    println!("  compiled tools           {}", per(|r| r.1));
    println!(
        "  registry snapshot        {} (the compiled tools moved in, plus its index and pages)",
        per(|r| r.2)
    );
    println!(
        "  server after a reload    {} (snapshot, metric series, kept sources)",
        per(|r| r.3)
    );
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
    // The same ToolSet as the operator writes it (JSON, which the server reads faster).
    let json_doc = config::write_document(&config::parse("bench", &yaml).unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{e}"));
    g.bench_function("1000/operator-json", |b| {
        b.iter(|| {
            let ts: ToolSet = config::parse("bench", black_box(&json_doc)).unwrap_or_else(|e| panic!("{e}"));
            let compiled = config::compile(&ts).unwrap_or_else(|e| panic!("{e}"));
            quiver_server::registry::Snapshot::build(compiled, 1, &metrics)
        })
    });
    g.bench_function("1000/parse-json", |b| {
        b.iter(|| config::parse("bench", black_box(&json_doc)).unwrap_or_else(|e| panic!("{e}")))
    });
    // The same work by stage, so a regression or a target names its stage.
    g.bench_function("1000/parse", |b| {
        b.iter(|| config::parse("bench", black_box(&yaml)).unwrap_or_else(|e| panic!("{e}")))
    });
    let ts: ToolSet = config::parse("bench", &yaml).unwrap_or_else(|e| panic!("{e}"));
    g.bench_function("1000/compile", |b| {
        b.iter(|| config::compile(black_box(&ts)).unwrap_or_else(|e| panic!("{e}")))
    });
    g.bench_function("1000/snapshot", |b| {
        b.iter_batched(
            || config::compile(&ts).unwrap_or_else(|e| panic!("{e}")),
            |compiled| quiver_server::registry::Snapshot::build(compiled, 1, &metrics),
            criterion::BatchSize::LargeInput,
        )
    });
    let yaml = toolset_yaml(10_000);
    g.sample_size(10);
    g.bench_function("10000", |b| {
        b.iter(|| {
            let ts: ToolSet = config::parse("bench", black_box(&yaml)).unwrap_or_else(|e| panic!("{e}"));
            let compiled = config::compile(&ts).unwrap_or_else(|e| panic!("{e}"));
            quiver_server::registry::Snapshot::build(compiled, 1, &metrics)
        })
    });
    let json_doc = config::write_document(&config::parse("bench", &yaml).unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{e}"));
    g.bench_function("10000/operator-json", |b| {
        b.iter(|| {
            let ts: ToolSet = config::parse("bench", black_box(&json_doc)).unwrap_or_else(|e| panic!("{e}"));
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
    targets = bench_lookup, bench_dispatch, bench_message, bench_governed, bench_compile, bench_allocator
}

fn main() {
    audit_governed();
    audit();
    audit_memory();
    audit_wire();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
