//! The audit trail: one JSON line per `tools/call`, `resources/read`, `prompts/get`, refused
//! credential and refused call, written by a thread of its own to its own sink (stdout,
//! where the logs are not: they go to stderr; or a file).
//!
//! A request only hands its [`Record`] to a bounded queue ([`AuditLog::record`], which never
//! blocks); the writer thread serializes, scrubs and writes it ([`queue`]). What a full
//! queue means is [`OnFull`]: by default a record that finds the queue full, or that the
//! sink fails to take, is dropped: counted in `quiver_audit_dropped_total` and logged (at
//! most every [`DROP_LOG_EVERY`]), never silently; with `refuse` a call whose record has no
//! place is refused before it runs, and the sink's failures are retried.

mod queue;

use std::io::Write;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value, json};

pub use self::queue::{AuditLog, NoRoom, Place};
use crate::secrets::Secrets;
use crate::spec::access::Principal;

/// Records the queue holds by default.
pub use quiver_flags::DEFAULT_AUDIT_QUEUE as DEFAULT_QUEUE;
/// How long the writer sleeps when it finds the queue empty (records reach the sink within
/// about this long; the queue must hold what arrives meanwhile).
const POLL: Duration = Duration::from_millis(10);
/// How often at most a drop is logged.
pub const DROP_LOG_EVERY: Duration = Duration::from_secs(10);
/// Longest string kept in a record's arguments and reason, in characters.
const MAX_TEXT: usize = 1024;
/// Most values (strings, numbers, keys) of the arguments kept in one record.
const MAX_VALUES: usize = 256;

pub use quiver_flags::{AuditSink as Sink, OnFull};

/// Bytes a [`Text`] holds without allocating.
const INLINE: usize = 30;

/// A string of a record: kept inline when short (most request ids, tool names, upstream
/// names), so filling a record on the request's path allocates nothing for it; on the heap
/// otherwise.
#[derive(Clone, PartialEq, Eq)]
pub enum Text {
    /// Up to [`INLINE`] bytes of UTF-8.
    Inline(u8, [u8; INLINE]),
    /// A longer string.
    Heap(Box<str>),
}

impl Text {
    /// A copy of `s`.
    pub fn new(s: &str) -> Self {
        match u8::try_from(s.len()) {
            Ok(n) if s.len() <= INLINE => {
                let mut b = [0; INLINE];
                b[..s.len()].copy_from_slice(s.as_bytes());
                Self::Inline(n, b)
            }
            _ => Self::Heap(s.into()),
        }
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        match self {
            // Copied from a `str` whole: always UTF-8.
            Self::Inline(n, b) => std::str::from_utf8(&b[..usize::from(*n)]).unwrap_or(""),
            Self::Heap(s) => s,
        }
    }
}

impl Default for Text {
    fn default() -> Self {
        Self::Inline(0, [0; INLINE])
    }
}

impl std::ops::Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for Text {
    fn from(s: String) -> Self {
        Self::new(&s)
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Who made a call, as the record names it (the `caller` field of a record).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Actor {
    /// The token's `sub`, or for a static token the digest that stands for it.
    pub subject: Box<str>,
    /// The token's `azp` or `client_id`.
    pub client_id: Box<str>,
    /// The token's issuer.
    pub issuer: Box<str>,
}

impl Actor {
    /// The caller of `p`, if any.
    pub fn of(p: Option<&Principal>) -> Option<Self> {
        p.map(|p| Self {
            subject: if p.identity.sub.is_empty() {
                p.subject.clone()
            } else {
                p.identity.sub.clone()
            },
            client_id: p.identity.client_id.clone(),
            issuer: p.identity.issuer.clone(),
        })
    }
}

/// One audited event.
#[derive(Debug, Clone)]
pub struct Record {
    /// When it ended (the writer turns it into wall-clock time: one clock read per record
    /// on the request's path).
    pub end: Instant,
    /// `tools/call`, `resources/read`, `prompts/get`, `authentication` (a refused
    /// credential), or a user's upstream sign-in: `oauth.sign_in`, `oauth.refresh`,
    /// `oauth.sign_out`, `oauth.revoke`.
    pub event: &'static str,
    /// The JSON-RPC id, as sent (JSON text).
    pub request_id: Option<Text>,
    /// The session (empty: none).
    pub session: Text,
    /// The caller; `None` when the server does not authenticate clients.
    pub caller: Option<Actor>,
    /// The tool, resource URI or prompt name asked for.
    pub target: Option<Text>,
    /// `target` is the name of a tool the call resolved to (from the config, written as it
    /// is), not the client's words (scrubbed).
    pub target_resolved: bool,
    /// The upstream a tool call resolved to.
    pub upstream: Option<Text>,
    /// The account at the upstream the call acted as, where the user's own sign-in there
    /// named it (1-64 of `[A-Za-z0-9._+@-]`).
    pub upstream_account: Option<Text>,
    /// How it ended: `ok`, `tool_error`, `rate_limited`, `forbidden`, `unauthenticated`,
    /// or the JSON-RPC outcome of another error (`invalid_params`, `cancelled`, ...).
    pub outcome: &'static str,
    /// Why, when it was refused or failed (scrubbed before it is written).
    pub reason: Option<String>,
    /// From the request's arrival to its answer (or the refusal).
    pub duration: Duration,
    /// Bytes of the request message.
    pub bytes_in: usize,
    /// Bytes of the answer.
    pub bytes_out: usize,
    /// The arguments, for tools that opt in, with sensitive properties already replaced
    /// ([`redact_arguments`]); every string is scrubbed before it is written.
    pub arguments: Option<Value>,
    /// What the tool's result guard found in its result, and did.
    pub guard: Option<crate::config::guards::Verdict>,
    /// The tokens of the result, when its tool meters them (before a cut).
    pub result_tokens: Option<u64>,
    /// The trace and span ids (hex) of the request's span, when tracing sampled it.
    pub trace: Option<Box<(String, String)>>,
}

impl Record {
    /// A record of `event` ending now with `outcome`, everything else empty.
    pub fn new(event: &'static str, outcome: &'static str) -> Self {
        Self {
            end: Instant::now(),
            event,
            request_id: None,
            session: Text::default(),
            caller: None,
            target: None,
            target_resolved: false,
            upstream: None,
            upstream_account: None,
            outcome,
            reason: None,
            duration: Duration::ZERO,
            bytes_in: 0,
            bytes_out: 0,
            arguments: None,
            guard: None,
            result_tokens: None,
            trace: None,
        }
    }
}

/// The arguments of a call as they may be recorded: top-level properties named in
/// `sensitive` (the schema's `writeOnly`) replaced by `[redacted]`.
pub fn redact_arguments(args: &Value, sensitive: &[Box<str>]) -> Value {
    // The copy waits in the queue until the writer scrubs and cuts it: arguments too big
    // to keep that long are not copied at all.
    let (mut bytes, mut nodes) = (MAX_QUEUED_ARGUMENT_BYTES, MAX_VALUES * 4);
    if !fits(args, &mut bytes, &mut nodes) {
        return Value::String(format!(
            "[omitted: over {} KiB or {} values]",
            MAX_QUEUED_ARGUMENT_BYTES >> 10,
            MAX_VALUES * 4
        ));
    }
    match args {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    if sensitive.iter().any(|s| **s == **k) {
                        (k.clone(), Value::String(crate::redact::REDACTED.to_owned()))
                    } else {
                        (k.clone(), v.clone())
                    }
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Most bytes of strings (and keys) in the arguments a record keeps.
const MAX_QUEUED_ARGUMENT_BYTES: usize = 64 << 10;

/// Whether `v` has at most `bytes` of strings and keys and `nodes` values (both counted
/// down; the walk stops as soon as either runs out).
fn fits(v: &Value, bytes: &mut usize, nodes: &mut usize) -> bool {
    let Some(n) = nodes.checked_sub(1) else {
        return false;
    };
    *nodes = n;
    let take = |bytes: &mut usize, len: usize| match bytes.checked_sub(len) {
        Some(b) => {
            *bytes = b;
            true
        }
        None => false,
    };
    match v {
        Value::String(s) => take(bytes, s.len()),
        Value::Array(a) => a.iter().all(|x| fits(x, bytes, nodes)),
        Value::Object(m) => m
            .iter()
            .all(|(k, x)| take(bytes, k.len()) && fits(x, bytes, nodes)),
        _ => true,
    }
}

/// Whether a property name says its value is a credential.
fn names_a_credential(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "secret",
        "token",
        "apikey",
        "api_key",
        "api-key",
        "authorization",
        "cookie",
        "private_key",
        "privatekey",
    ]
    .iter()
    .any(|w| k.contains(w))
}

/// A copy of `v` fit to write: credentials by name redacted, every string and key scrubbed,
/// at most [`MAX_VALUES`] values (the rest dropped, marked by `"…": true`).
fn scrub(v: &Value, secrets: &Secrets, budget: &mut usize) -> Value {
    match v {
        Value::String(s) => Value::String(secrets.scrub(s, MAX_TEXT)),
        Value::Array(a) => {
            let mut out = Vec::with_capacity(a.len().min(*budget));
            for x in a {
                if *budget == 0 {
                    out.push(json!("…"));
                    break;
                }
                *budget -= 1;
                out.push(scrub(x, secrets, budget));
            }
            Value::Array(out)
        }
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, x) in m {
                if *budget == 0 {
                    out.insert("…".to_owned(), Value::Bool(true));
                    break;
                }
                *budget -= 1;
                let key = secrets.scrub(k, MAX_TEXT);
                let value = if names_a_credential(k) && !x.is_null() {
                    Value::String(crate::redact::REDACTED.to_owned())
                } else {
                    scrub(x, secrets, budget)
                };
                out.insert(key, value);
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// A JSON string.
fn string(out: &mut Vec<u8>, s: &str) {
    let _ = serde_json::to_writer(&mut *out, s);
}

/// `,"key":` (keys are literals of this module).
fn key(out: &mut Vec<u8>, k: &str) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(k.as_bytes());
    out.extend_from_slice(b"\":");
}

/// Wall-clock time for the records' `end` instants: both clocks read once per batch, and
/// the date and time of day formatted once per second.
struct Clock {
    wall: SystemTime,
    mono: Instant,
    /// The second `prefix` shows (seconds since the epoch), and `YYYY-MM-DDTHH:MM:SS`.
    second: Option<u64>,
    prefix: String,
}

impl Clock {
    fn new() -> Self {
        Self {
            wall: SystemTime::now(),
            mono: Instant::now(),
            second: None,
            prefix: String::new(),
        }
    }

    /// Reads both clocks again (each batch: the wall clock may have been set meanwhile).
    fn reset(&mut self) {
        self.wall = SystemTime::now();
        self.mono = Instant::now();
    }

    /// `t` as an RFC 3339 JSON string with milliseconds, appended to `out`.
    fn write(&mut self, t: Instant, out: &mut Vec<u8>) {
        let at = if t >= self.mono {
            self.wall + (t - self.mono)
        } else {
            self.wall - (self.mono - t)
        };
        let d = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        if self.second != Some(d.as_secs()) {
            let whole = std::time::UNIX_EPOCH + Duration::from_secs(d.as_secs());
            let mut full = crate::net::time::rfc3339(whole);
            full.truncate(full.rfind('.').unwrap_or(full.len()));
            self.prefix = full;
            self.second = Some(d.as_secs());
        }
        out.push(b'"');
        out.extend_from_slice(self.prefix.as_bytes());
        let _ = write!(out, ".{:03}Z\"", d.subsec_millis());
    }
}

/// Longest numeric request id copied as it was sent (a longer one is read as a number).
const MAX_RAW_ID: usize = 32;

/// A record as its JSON line (without the newline), appended to `out`, naming `instance`
/// when the server names its McpServer. What a client chose (a string request id, a name
/// that did not resolve, a reason quoting the request, the arguments) is scrubbed; what the
/// server or a verified token says (the session id it minted, the resolved tool, the
/// caller's claims) is only escaped.
fn line(r: &Record, instance: Option<&[u8]>, secrets: &Secrets, clock: &mut Clock, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"time\":");
    clock.write(r.end, out);
    key(out, "event");
    string(out, r.event);
    if let Some(id) = &r.request_id {
        key(out, "requestId");
        // The id was read as JSON by dispatch: a short number is copied as it is (JSON
        // number text), a long one read as a number, a string scrubbed.
        let raw = id.as_bytes();
        if raw.len() <= MAX_RAW_ID && raw.first().is_some_and(|b| *b == b'-' || b.is_ascii_digit()) {
            out.extend_from_slice(raw);
        } else {
            match serde_json::from_str::<Value>(id) {
                Ok(Value::String(s)) => string(out, &secrets.scrub(&s, MAX_TEXT)),
                Ok(n @ Value::Number(_)) => {
                    let _ = serde_json::to_writer(&mut *out, &n);
                }
                _ => out.extend_from_slice(b"null"),
            }
        }
    }
    if !r.session.is_empty() {
        // A keyed tag, never the id: on Streamable HTTP the id is a bearer capability.
        key(out, "session");
        string(out, &crate::session::tag(&r.session));
    }
    if let Some(c) = &r.caller {
        out.extend_from_slice(b",\"caller\":{\"subject\":");
        string(out, &c.subject);
        if !c.client_id.is_empty() {
            key(out, "clientId");
            string(out, &c.client_id);
        }
        if !c.issuer.is_empty() {
            key(out, "issuer");
            string(out, &c.issuer);
        }
        out.push(b'}');
    }
    if let Some(t) = &r.target {
        key(
            out,
            match r.event {
                "tools/call" => "tool",
                "resources/read" => "uri",
                "prompts/get" => "prompt",
                _ => "target",
            },
        );
        if r.target_resolved {
            string(out, t);
        } else {
            string(out, &secrets.scrub(t, MAX_TEXT));
        }
    }
    if let Some(u) = &r.upstream {
        key(out, "upstream");
        string(out, u);
    }
    if let Some(a) = &r.upstream_account {
        key(out, "upstreamAccount");
        string(out, a);
    }
    key(out, "outcome");
    string(out, r.outcome);
    if let Some(why) = &r.reason {
        key(out, "reason");
        string(out, &secrets.scrub(why, MAX_TEXT));
    }
    let micros = u64::try_from(r.duration.as_micros()).unwrap_or(u64::MAX);
    key(out, "durationMs");
    let _ = write!(out, "{}.{:03}", micros / 1000, micros % 1000);
    key(out, "bytesIn");
    let _ = write!(out, "{}", r.bytes_in);
    key(out, "bytesOut");
    let _ = write!(out, "{}", r.bytes_out);
    if let Some(a) = &r.arguments {
        key(out, "arguments");
        let _ = serde_json::to_writer(&mut *out, &scrub(a, secrets, &mut MAX_VALUES.clone()));
    }
    if let Some(v) = &r.guard {
        guard_field(out, v);
    }
    if let Some(n) = r.result_tokens {
        key(out, "resultTokens");
        let _ = write!(out, "{n}");
    }
    if let Some(ids) = &r.trace {
        key(out, "traceId");
        string(out, &ids.0);
        key(out, "spanId");
        string(out, &ids.1);
    }
    // The server's McpServer ([`instance_field`]), the same in every record.
    out.extend_from_slice(instance.unwrap_or_default());
    out.push(b'}');
}

pub use quiver_flags::Instance;

/// `,"guard":{"action":..,"findings":N,"kinds":[..]}`: the kinds a result guard found and
/// what it did (never what it found).
fn guard_field(out: &mut Vec<u8>, v: &crate::config::guards::Verdict) {
    key(out, "guard");
    out.extend_from_slice(b"{\"action\":");
    string(out, v.action.label());
    let _ = write!(out, ",\"findings\":{},\"kinds\":[", v.count);
    for (i, k) in v.found.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string(out, k.name());
    }
    out.extend_from_slice(b"]}");
}

/// The record field naming `instance`: `,"mcpServer":{"namespace":..,"name":..}`.
fn instance_field(instance: &Instance) -> Vec<u8> {
    let mut out = b",\"mcpServer\":{\"namespace\":".to_vec();
    string(&mut out, &instance.namespace);
    key(&mut out, "name");
    string(&mut out, &instance.name);
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_too_big_to_queue_are_not_copied() {
        let sensitive: Vec<Box<str>> = vec!["password".into()];
        let small = json!({"user": "ann", "password": "hunter2", "tags": ["a", "b"]});
        let kept = redact_arguments(&small, &sensitive);
        assert_eq!(
            kept,
            json!({"user": "ann", "password": "[redacted]", "tags": ["a", "b"]})
        );
        // One big string, many small values, many keys: each over a bound, none copied.
        let many: Vec<Value> = (0..2000).map(|i| json!(i)).collect();
        let keys: Map<String, Value> = (0..2000).map(|i| (format!("k{i}"), json!(null))).collect();
        for big in [
            json!({"blob": "x".repeat(MAX_QUEUED_ARGUMENT_BYTES + 1)}),
            json!({"list": many}),
            Value::Object(keys),
        ] {
            let r = redact_arguments(&big, &sensitive);
            assert!(r.as_str().is_some_and(|t| t.starts_with("[omitted")), "{r}");
        }
    }

    #[test]
    fn a_record_names_its_session_by_a_keyed_tag_never_by_its_id() {
        let id = crate::session::mint("");
        let mut r = Record::new("tools/call", "ok");
        r.session = id.as_str().into();
        let mut out = Vec::new();
        line(&r, None, &Secrets::new(), &mut Clock::new(), &mut out);
        let text = String::from_utf8(out).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["session"], crate::session::tag(&id));
        let nonce = id.split('.').next().unwrap();
        assert!(!text.contains(nonce), "{text}");
        // No session, no field.
        let mut out = Vec::new();
        line(
            &Record::new("authentication", "unauthenticated"),
            None,
            &Secrets::new(),
            &mut Clock::new(),
            &mut out,
        );
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert!(v.get("session").is_none(), "{v}");
    }

    #[test]
    fn sinks_parse() {
        assert_eq!("stdout".parse::<Sink>(), Ok(Sink::Stdout));
        assert_eq!("file:/a/b".parse::<Sink>(), Ok(Sink::File("/a/b".into())));
        assert!("file:".parse::<Sink>().is_err());
        assert!("stderr".parse::<Sink>().is_err());
    }

    #[test]
    fn arguments_lose_sensitive_and_credential_values_and_secrets() {
        let secrets = Secrets::new();
        secrets.set(
            "db",
            Some(vec![("pw".to_owned(), b"hunter2-very-secret".to_vec())]),
            crate::secrets::Presence::Loaded,
        );
        let args = json!({
            "user": "ann",
            "pin": "1234",
            "apiToken": "abc",
            "note": "the password is hunter2-very-secret, Bearer eyJabc.def",
            "nested": {"Password": "p", "list": [1, "x"]},
        });
        let kept = redact_arguments(&args, &[Box::from("pin")]);
        let mut r = Record::new("tools/call", "ok");
        r.arguments = Some(kept);
        r.request_id = Some("\"req-1\"".into());
        r.target = Some("login".into());
        let mut out = Vec::new();
        line(&r, None, &secrets, &mut Clock::new(), &mut out);
        let v: Value = serde_json::from_slice(&out).unwrap();
        let a = &v["arguments"];
        assert_eq!(a["user"], "ann");
        assert_eq!(a["pin"], "[redacted]");
        assert_eq!(a["apiToken"], "[redacted]");
        assert_eq!(a["nested"]["Password"], "[redacted]");
        assert_eq!(a["nested"]["list"], json!([1, "x"]));
        let note = a["note"].as_str().unwrap();
        assert!(!note.contains("hunter2") && !note.contains("eyJabc"), "{note}");
        assert_eq!(v["requestId"], "req-1");
        assert_eq!(v["tool"], "login");
        assert_eq!(v["event"], "tools/call");
        assert!(v["time"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn texts_keep_short_strings_inline_and_long_ones_whole() {
        let short = Text::new("tools-42");
        assert!(matches!(short, Text::Inline(..)));
        assert_eq!(&*short, "tools-42");
        let edge = "x".repeat(INLINE);
        assert_eq!(&*Text::new(&edge), edge);
        let long = "é".repeat(INLINE);
        let t = Text::new(&long);
        assert!(matches!(t, Text::Heap(_)));
        assert_eq!(&*t, long);
        assert_eq!(&*Text::default(), "");
    }

    /// Seconds since midnight of an RFC 3339 time (`...THH:MM:SS.mmmZ`).
    fn time_of_day(t: &str) -> f64 {
        let (_, clock) = t.split_once('T').unwrap();
        let f: Vec<f64> = clock
            .trim_end_matches('Z')
            .split(':')
            .map(|x| x.parse().unwrap())
            .collect();
        f[0] * 3600.0 + f[1] * 60.0 + f[2]
    }

    #[test]
    fn times_are_wall_clock_and_request_ids_stay_bounded() {
        let secrets = Secrets::new();
        let mut clock = Clock::new();
        let now = crate::net::time::rfc3339(SystemTime::now());
        let mut lines = Vec::new();
        for (ago, id) in [
            (1500, "12345".to_owned()),
            (0, "-7".to_owned()),
            (0, "9".repeat(40)),
            (0, "9".repeat(400)),
        ] {
            let mut r = Record::new("tools/call", "ok");
            r.end = Instant::now() - Duration::from_millis(ago);
            r.request_id = Some(Text::new(&id));
            let mut out = Vec::new();
            line(&r, None, &secrets, &mut clock, &mut out);
            assert!(out.len() < 300, "{}", String::from_utf8_lossy(&out));
            lines.push(serde_json::from_slice::<Value>(&out).unwrap());
        }
        let day = 86_400.0;
        let off = |t: &Value| {
            let d = (time_of_day(t.as_str().unwrap()) - time_of_day(&now)).rem_euclid(day);
            if d > day / 2.0 { d - day } else { d }
        };
        assert!((off(&lines[0]["time"]) + 1.5).abs() < 1.0, "{lines:?}");
        assert!(off(&lines[1]["time"]).abs() < 1.0, "{lines:?}");
        assert_eq!(lines[0]["requestId"], 12345);
        assert_eq!(lines[1]["requestId"], -7);
        // A long number is read as one, not copied digit by digit; one too large to read is
        // null (the line stays short either way).
        assert!(lines[2]["requestId"].is_f64(), "{lines:?}");
        assert!(lines[3]["requestId"].is_null(), "{lines:?}");
    }

    #[test]
    fn huge_arguments_are_cut() {
        let secrets = Secrets::new();
        let args = Value::Array((0..10_000).map(Value::from).collect());
        let mut r = Record::new("tools/call", "ok");
        r.arguments = Some(args);
        let mut out = Vec::new();
        line(&r, None, &secrets, &mut Clock::new(), &mut out);
        let v: Value = serde_json::from_slice(&out).unwrap();
        let a = v["arguments"].as_array().unwrap();
        assert_eq!(a.len(), MAX_VALUES + 1);
        assert_eq!(a[MAX_VALUES], "…");
    }
}
