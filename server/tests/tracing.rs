//! What a client's trace context may make the real binary do, with its defaults: an
//! anonymous client's sampled flag does not decide whether its request is exported (the
//! server's ratio applied to the trace id does), its `tracestate` is not passed on, and a
//! tools/call for a name the registry does not hold is a span named `tools/call unknown`,
//! never the client's string. A stand-in collector records what the server exports
//! (OTLP/HTTP protobuf, searched for raw bytes: strings and trace ids are stored as they are).

mod real_binary;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use real_binary::*;

/// A loopback HTTP/1.1 server that records every request (head and body) and answers each
/// with `reply`.
struct Sink {
    port: u16,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Sink {
    fn start(reply: &'static str) -> Sink {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let record = record.clone();
                std::thread::spawn(move || {
                    let mut w = conn.try_clone().unwrap();
                    let mut r = BufReader::new(conn);
                    // Keep-alive: requests one after another until the client closes.
                    while let Some(request) = read_request(&mut r) {
                        record.lock().unwrap().push(request);
                        if w.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Sink { port, seen }
    }

    fn all(&self) -> Vec<u8> {
        self.seen.lock().unwrap().concat()
    }
}

fn read_request(r: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().ok()?;
        }
        head.extend_from_slice(line.as_bytes());
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0u8; length];
    r.read_exact(&mut body).ok()?;
    head.extend(body);
    Some(head)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn id_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// Trace ids the server's ratio (0.5, on the low 63 bits as the SDK's rule) keeps, and one
/// it does not.
const KEEP_UNSAMPLED: &str = "7e57c0de000000010000000000000abc";
const KEEP_UNKNOWN: &str = "7e57c0de000000020000000000000abc";
const KEEP_STATE: &str = "7e57c0de000000030000000000000abc";
const DROP_SAMPLED: &str = "7e57c0de00000004fffffffffffffff0";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn call(p: &Proc, trace_id: &str, flags: &str, extra: &str, tool: &str, args: &str) -> String {
    let headers = format!(
        "MCP-Protocol-Version: 2025-06-18\r\ntraceparent: 00-{trace_id}-{CLIENT_SPAN}-{flags}\r\n{extra}"
    );
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
    );
    http_with(p.mcp, "POST", "/mcp", &headers, &body).expect("an answer")
}

#[test]
fn an_anonymous_clients_trace_context_neither_forces_sampling_nor_travels_nor_names_spans() {
    let collector =
        Sink::start("HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n");
    let api = Sink::start(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}",
    );
    let tools = format!(
        "tools:\n  - {{name: greet, input: {{name: string}}, handler: {{template: 'Hello {{{{name}}}}!'}}}}\n  \
         - {{name: weather, handler: {{http: {{url: 'http://127.0.0.1:{}/w', timeout: 5s}}}}}}\n",
        api.port
    );
    let endpoint = format!("http://127.0.0.1:{}", collector.port);
    let mut p = start_http_with(
        &tools,
        &["--otlp-endpoint", &endpoint, "--trace-sample-ratio", "0.5"],
    );

    // Sampled by the client, not by the server's ratio: not exported.
    assert!(call(&p, DROP_SAMPLED, "01", "", "greet", r#"{"name":"a"}"#).contains("Hello a!"));
    // Not sampled by the client, kept by the server's ratio: exported, in the client's trace.
    assert!(call(&p, KEEP_UNSAMPLED, "00", "", "greet", r#"{"name":"b"}"#).contains("Hello b!"));
    // A tool name the registry does not hold.
    let unknown = format!("no-such-tool-{}", "x".repeat(40));
    assert!(call(&p, KEEP_UNKNOWN, "01", "", &unknown, "{}").contains("Unknown tool"));
    // The client's tracestate goes nowhere.
    let state = "tracestate: vendor=cl1ent-state\r\n";
    assert!(call(&p, KEEP_STATE, "01", state, "weather", "{}").contains("ok"));

    terminate(&p);
    wait_exit(&mut p, PATIENCE).expect("the server exits on SIGTERM");

    let api_seen = String::from_utf8_lossy(&api.all()).to_lowercase();
    assert!(
        api_seen.contains(&format!("traceparent: 00-{KEEP_STATE}-")),
        "the API continues the client's trace: {api_seen}"
    );
    assert!(!api_seen.contains("cl1ent-state"), "{api_seen}");

    let exported = collector.all();
    for (what, id) in [
        ("the server's own decision", KEEP_UNSAMPLED),
        ("the unknown tool's call", KEEP_UNKNOWN),
        ("the http tool's call", KEEP_STATE),
    ] {
        assert!(contains(&exported, &id_bytes(id)), "{what} ({id}) is exported");
    }
    assert!(
        !contains(&exported, &id_bytes(DROP_SAMPLED)),
        "a request only the client sampled is not exported"
    );
    assert!(contains(&exported, b"tools/call unknown"));
    assert!(
        !contains(&exported, unknown.as_bytes()),
        "the client's tool name is not exported"
    );
    assert!(
        !contains(&exported, b"cl1ent-state"),
        "the client's tracestate is not exported"
    );
}

fn with_tokens(args: &[&str], tools: &str) -> (Proc, tempfile::TempDir) {
    let secrets = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(secrets.path().join("clients")).unwrap();
    std::fs::write(secrets.path().join("clients/tokens"), "client-token-0123456789\n").unwrap();
    let source = format!("--secrets=dir:{}", secrets.path().display());
    let mut all = vec![source.as_str(), "--auth-tokens-secret=clients.tokens"];
    all.extend_from_slice(args);
    (start_http_with(tools, &all), secrets)
}

const TOKEN: &str = "Authorization: Bearer client-token-0123456789\r\n";
const TRUSTED: &str = "7e57c0de00000005fffffffffffffff0";
const NEVER: &str = "7e57c0de00000006fffffffffffffff0";

/// A trace collector, an API answering `{"ok":true}`, the ToolSet of a `weather` tool
/// calling it, and the collector's OTLP endpoint.
fn weather_behind_a_collector() -> (Sink, Sink, String, String) {
    let collector =
        Sink::start("HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n");
    let api = Sink::start(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}",
    );
    let tools = format!(
        "tools:\n  - {{name: weather, handler: {{http: {{url: 'http://127.0.0.1:{}/w', timeout: 5s}}}}}}\n",
        api.port
    );
    let endpoint = format!("http://127.0.0.1:{}", collector.port);
    (collector, api, tools, endpoint)
}

#[test]
fn an_authenticated_clients_flag_decides_and_its_tracestate_travels_when_configured() {
    let (collector, api, tools, endpoint) = weather_behind_a_collector();
    // Ratio 0: the server itself would trace nothing.
    let common = ["--otlp-endpoint", &endpoint, "--trace-sample-ratio", "0"];
    let mut forwarding = common.to_vec();
    forwarding.push("--trace-forward-tracestate");
    let (mut p, _secrets) = with_tokens(&forwarding, &tools);
    let extra = format!("{TOKEN}tracestate: vendor=kept-state\r\n");
    assert!(call(&p, TRUSTED, "01", &extra, "weather", "{}").contains("ok"));
    terminate(&p);
    wait_exit(&mut p, PATIENCE).expect("the server exits on SIGTERM");

    // Trusting no client: the same authenticated call is the server's to decide (ratio 0).
    let mut never = common.to_vec();
    never.extend(["--trace-trust-client-sampling", "never"]);
    let (mut q, _secrets) = with_tokens(&never, &tools);
    assert!(call(&q, NEVER, "01", TOKEN, "weather", "{}").contains("ok"));
    terminate(&q);
    wait_exit(&mut q, PATIENCE).expect("the server exits on SIGTERM");

    let api_seen = String::from_utf8_lossy(&api.all()).to_lowercase();
    assert!(api_seen.contains("tracestate: vendor=kept-state"), "{api_seen}");
    let exported = collector.all();
    assert!(
        contains(&exported, &id_bytes(TRUSTED)),
        "the authenticated client's sampled call"
    );
    assert!(contains(&exported, b"vendor=kept-state"));
    assert!(contains(&exported, b"tools/call weather"));
    assert!(
        !contains(&exported, &id_bytes(NEVER)),
        "`never` trusts no client's flag"
    );
}

#[test]
fn an_audit_record_names_its_mcp_server_and_the_trace_of_its_call() {
    let (_collector, _api, tools, endpoint) = weather_behind_a_collector();
    let dir = tempfile::tempdir().unwrap();
    let audit = format!("file:{}", dir.path().join("audit.jsonl").display());
    let args = [
        "--otlp-endpoint",
        &endpoint,
        "--trace-sample-ratio",
        "0",
        "--audit",
        &audit,
        "--instance",
        "team-a/weather",
    ];
    let (mut p, _secrets) = with_tokens(&args, &tools);
    // Sampled by the authenticated client; then one the client did not sample (ratio 0).
    assert!(call(&p, TRUSTED, "01", TOKEN, "weather", "{}").contains("ok"));
    assert!(call(&p, NEVER, "00", TOKEN, "weather", "{}").contains("ok"));
    // The writer drains its queue on its own beat: wait for both records, then stop.
    let path = dir.path().join("audit.jsonl");
    wait_for("both audit records", || {
        std::fs::read_to_string(&path).is_ok_and(|t| t.lines().count() >= 2)
    });
    terminate(&p);
    wait_exit(&mut p, PATIENCE).expect("the server exits on SIGTERM");
    let text = std::fs::read_to_string(&path).unwrap();
    let records: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 2, "{text}");
    for r in &records {
        assert_eq!(r["mcpServer"]["namespace"], "team-a", "{r}");
        assert_eq!(r["mcpServer"]["name"], "weather", "{r}");
    }
    assert_eq!(records[0]["traceId"], TRUSTED, "{}", records[0]);
    assert_eq!(
        records[0]["spanId"].as_str().map(str::len),
        Some(16),
        "{}",
        records[0]
    );
    assert!(
        records[1].get("traceId").is_none(),
        "an unsampled call names no trace: {}",
        records[1]
    );
}
