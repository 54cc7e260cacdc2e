//! Protocol revision 2026-07-28, the stateless one, served beside the handshake-era revisions.
//!
//! Every request carries what a session used to hold: `_meta` names its protocol version,
//! the client's capabilities and (optionally) a log level. There is no `initialize`, no
//! session and no server-to-client request: a tool that needs the model, the user or the
//! client's roots answers with an `InputRequiredResult` (`resultType: "input_required"`)
//! listing what it needs, and the client retries the call with `inputResponses`. What the
//! server must remember between those rounds travels with the client as `requestState`,
//! signed here (HMAC-SHA256) so that it cannot be forged, replayed on another call, or used
//! after [`STATE_TTL`].
//!
//! This module holds the revision's envelope: reading and checking `_meta`, stamping results
//! (`resultType`, `serverInfo`, cache hints) and sealing/opening `requestState`. Dispatch
//! ([`crate::dispatch`]) routes the methods; its method table says which ones this revision
//! removed (the handshake-only entries: `Method not found`, over HTTP 404). The transports
//! choose the era per request.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::dispatch::error::RpcError;
use crate::protocol::{self, HEADER_MISMATCH, UNSUPPORTED_VERSION};
use crate::session::{ClientCaps, LogLevel};

/// `_meta` key of the request's protocol version.
pub const VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
/// How long a `requestState` this server issued stays valid.
pub const STATE_TTL: Duration = Duration::from_secs(600);
/// Longest `requestState` accepted, in characters.
pub const MAX_STATE_LEN: usize = 256 << 10;

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<RawMeta<'a>>,
}

#[derive(Deserialize)]
struct RawMeta<'a> {
    #[serde(borrow, default, rename = "io.modelcontextprotocol/protocolVersion")]
    version: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/clientCapabilities")]
    caps: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/logLevel")]
    level: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "progressToken")]
    progress: Option<&'a RawValue>,
}

/// What a client declared (present means supported).
#[derive(Deserialize, Default)]
struct CapsParams<'a> {
    #[serde(default, deserialize_with = "present")]
    sampling: bool,
    #[serde(borrow, default)]
    elicitation: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    roots: bool,
    #[serde(default)]
    extensions: Option<ExtensionsParams>,
}

/// The modes of elicitation a client declared besides form (`capabilities.elicitation`).
#[derive(Deserialize, Default)]
struct ElicitationParams {
    #[serde(default, deserialize_with = "present")]
    url: bool,
}

/// The extensions a client declared (`capabilities.extensions`).
#[derive(Deserialize, Default)]
struct ExtensionsParams {
    #[serde(
        default,
        deserialize_with = "present",
        rename = "io.modelcontextprotocol/tasks"
    )]
    tasks: bool,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| true)
}

/// Reads declared client capabilities from a `capabilities` object (of `initialize`, or of
/// a request's `_meta`); anything unreadable declares nothing.
pub fn client_caps(raw: Option<&RawValue>) -> ClientCaps {
    let c: CapsParams<'_> = raw
        .and_then(|r| serde_json::from_str(r.get()).ok())
        .unwrap_or_default();
    ClientCaps {
        sampling: c.sampling,
        elicitation: c.elicitation.is_some(),
        elicitation_url: c
            .elicitation
            .and_then(|e| serde_json::from_str::<ElicitationParams>(e.get()).ok())
            .is_some_and(|e| e.url),
        roots: c.roots,
        tasks: c.extensions.is_some_and(|e| e.tasks),
        core_tasks: false,
    }
}

/// A request's per-request protocol fields, checked.
#[derive(Debug, Clone, Copy)]
pub struct Meta<'a> {
    /// The revision in force (one of [`protocol::STATELESS_VERSIONS`]).
    pub version: &'static str,
    /// What the client can answer.
    pub caps: ClientCaps,
    /// Log messages at or above this level may be sent; `None`: none at all.
    pub level: Option<LogLevel>,
    /// `_meta.progressToken`, raw.
    pub progress: Option<&'a RawValue>,
}

/// Whether a request's params name a protocol version in `_meta` (how a stdio message shows
/// it speaks this revision rather than the handshake era's).
pub fn names_version(params: Option<&RawValue>) -> bool {
    params
        .and_then(|p| serde_json::from_str::<Envelope<'_>>(p.get()).ok())
        .and_then(|e| e.meta)
        .is_some_and(|m| m.version.is_some())
}

/// Reads and checks `_meta`. `header` is the `MCP-Protocol-Version` the request came with
/// (HTTP), which the body must repeat.
///
/// # Errors
/// `-32602` when `_meta`, its protocol version or its client capabilities are missing or
/// malformed, `-32020` when the body's version differs from the header's, `-32022` when
/// the version is not one this server speaks.
pub fn meta<'a>(params: Option<&'a RawValue>, header: Option<&str>) -> Result<Meta<'a>, RpcError> {
    let invalid = |m: &str| RpcError::invalid_params(format!("Invalid params: {m}"));
    let env: Envelope<'a> = match params {
        None => Envelope { meta: None },
        Some(p) => serde_json::from_str(p.get()).map_err(|e| invalid(&format!("`_meta`: {e}")))?,
    };
    let Some(m) = env.meta else {
        return Err(invalid(
            "`params._meta` is required (protocol version and client capabilities)",
        ));
    };
    let Some(version) = m.version else {
        return Err(invalid(&format!("`_meta` must carry `{VERSION_KEY}`")));
    };
    let Some(caps) = m.caps.filter(|c| c.get().starts_with('{')) else {
        return Err(invalid(
            "`_meta` must carry `io.modelcontextprotocol/clientCapabilities` (an object)",
        ));
    };
    if let Some(h) = header
        && h != version
    {
        return Err(RpcError::new(
            HEADER_MISMATCH,
            format!(
                "Header mismatch: MCP-Protocol-Version is {h:?} but the body's `{VERSION_KEY}` is {:?}",
                clip(&version)
            ),
        ));
    }
    let Some(v) = protocol::stateless(&version) else {
        return Err(unsupported(&version));
    };
    let level = match m.level {
        None => None,
        Some(l) => Some(LogLevel::parse(&l).ok_or_else(|| {
            invalid(&format!(
                "unknown `io.modelcontextprotocol/logLevel` {:?}",
                clip(&l)
            ))
        })?),
    };
    Ok(Meta {
        version: v,
        caps: client_caps(Some(caps)),
        level,
        progress: m.progress,
    })
}

/// The `UnsupportedProtocolVersionError` for `requested`.
pub fn unsupported(requested: &str) -> RpcError {
    RpcError::new(
        UNSUPPORTED_VERSION,
        format!(
            "Unsupported protocol version {:?}; supported: {}",
            clip(requested),
            protocol::ALL_VERSIONS.join(", ")
        ),
    )
    .with_data(protocol::unsupported_version_data(clip(requested)))
}

fn clip(s: &str) -> &str {
    let end = s.char_indices().nth(64).map_or(s.len(), |(i, _)| i);
    &s[..end]
}

/// Inserts `fields` (`"k":v,...`, no braces) into the result object of a response already in
/// `out` (`{"jsonrpc":"2.0","id":..,"result":{..}}`); callers stamp only result responses.
pub fn stamp(out: &mut Vec<u8>, fields: &[u8]) {
    if out.len() < 3 || !out.ends_with(b"}}") {
        return;
    }
    // The closing `}}` is cut and written again after the fields: no second buffer, and
    // nothing moved but those two bytes.
    let at = out.len() - 2;
    let empty = out[at - 1] == b'{';
    out.truncate(at);
    out.reserve(fields.len() + 3);
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(fields);
    out.extend_from_slice(b"}}");
}

/// The cache hints of a cacheable result (lists, reads, discovery).
pub fn cache_fields(ttl_ms: u64) -> Vec<u8> {
    format!(",\"ttlMs\":{ttl_ms},\"cacheScope\":\"public\"").into_bytes()
}

/// Turns the cache hints at the end of `fields` ([`cache_fields`]) private: for a result
/// rendered for one caller.
pub fn make_private(fields: &mut Vec<u8>) {
    if fields.ends_with(b"\"public\"") {
        fields.truncate(fields.len() - b"\"public\"".len());
        fields.extend_from_slice(b"\"private\"");
    }
}

/// The key that signs `requestState`. Replicas behind one Service must share it (set
/// `QUIVER_STATE_KEY`); otherwise each process draws its own, and a retry that reaches
/// another replica is asked its questions again.
#[derive(Clone)]
pub struct StateKey([u8; 32]);

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateKey(..)")
    }
}

impl StateKey {
    /// A key derived from secret material of any length (at least 16 bytes).
    ///
    /// # Errors
    /// Material shorter than 16 bytes.
    pub fn from_secret(secret: &[u8]) -> Result<Self, String> {
        if secret.len() < 16 {
            return Err("the requestState key must be at least 16 bytes".to_owned());
        }
        Ok(Self(Sha256::digest(secret).into()))
    }

    /// A random key for this process.
    pub fn random() -> Self {
        let mut k = [0u8; 32];
        if getrandom::getrandom(&mut k).is_err() {
            // Not reachable on Linux; a time-derived key still differs per process.
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            k = Sha256::digest(t.to_le_bytes()).into();
        }
        Self(k)
    }

    fn mac(&self, data: &[u8]) -> [u8; 32] {
        // HMAC (RFC 2104) over SHA-256: the key is 32 bytes, shorter than the 64-byte block.
        let mut ipad = [0x36u8; 64];
        let mut opad = [0x5cu8; 64];
        for (i, b) in self.0.iter().enumerate() {
            ipad[i] ^= b;
            opad[i] ^= b;
        }
        let inner = Sha256::new().chain_update(ipad).chain_update(data).finalize();
        Sha256::new()
            .chain_update(opad)
            .chain_update(inner)
            .finalize()
            .into()
    }

    /// Seals the answers gathered so far for `call` (method, name, arguments, caller).
    pub fn seal(&self, call: &CallId, answers: &Map<String, Value>) -> String {
        let expires = now_secs() + STATE_TTL.as_secs();
        let payload = json!({"v": 1, "c": call.call, "u": call.caller, "x": expires, "a": answers});
        let payload = serde_json::to_vec(&payload).unwrap_or_default();
        let mac = self.mac(&payload);
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(&payload),
            URL_SAFE_NO_PAD.encode(mac)
        )
    }

    /// Opens a `requestState`, checking its signature, its age and that it belongs to `call`
    /// (and so to the caller it was issued to).
    ///
    /// # Errors
    /// A message saying why the state is refused.
    pub fn open(&self, state: &str, call: &CallId) -> Result<Map<String, Value>, String> {
        if state.len() > MAX_STATE_LEN {
            return Err(format!("requestState is longer than {MAX_STATE_LEN} characters"));
        }
        let bad = || {
            "requestState failed its integrity check (it was not issued by this server, or was altered)"
                .to_owned()
        };
        let (p, m) = state.split_once('.').ok_or_else(bad)?;
        let payload = URL_SAFE_NO_PAD.decode(p).map_err(|_| bad())?;
        let mac = URL_SAFE_NO_PAD.decode(m).map_err(|_| bad())?;
        if !constant_time_eq(&self.mac(&payload), &mac) {
            return Err(bad());
        }
        #[derive(Deserialize)]
        struct Payload {
            v: u32,
            c: String,
            #[serde(default)]
            u: String,
            x: u64,
            a: Map<String, Value>,
        }
        let p: Payload = serde_json::from_slice(&payload).map_err(|_| bad())?;
        if p.v != 1 {
            return Err(bad());
        }
        if p.x < now_secs() {
            return Err("requestState has expired; call again without it".to_owned());
        }
        if p.u != call.caller {
            return Err("requestState was issued to another caller; call again without it".to_owned());
        }
        if p.c != call.call {
            return Err(
                "requestState belongs to another request (method, name or arguments differ)".to_owned(),
            );
        }
        Ok(p.a)
    }
}

/// What a `requestState` is bound to: a digest of the method, the tool/prompt name and the
/// arguments, so that state from one call cannot be presented on another, and a digest of
/// the caller's identity, so that one caller's state (its answers) cannot be presented by
/// another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallId {
    call: String,
    caller: String,
}

impl CallId {
    /// The identity of `method` on `name` with `args`, called by `caller` (a
    /// [`crate::spec::access::Principal::subject`]; empty when the caller is not known).
    pub fn new(method: &str, name: &str, args: &Value, caller: &str) -> Self {
        let mut h = Sha256::new();
        h.update(method.as_bytes());
        h.update([0]);
        h.update(name.as_bytes());
        h.update([0]);
        h.update(serde_json::to_vec(args).unwrap_or_default());
        let d = h.finalize();
        let caller = if caller.is_empty() {
            String::new()
        } else {
            let who = Sha256::new()
                .chain_update(b"quiver requestState caller\0")
                .chain_update(caller.as_bytes())
                .finalize();
            URL_SAFE_NO_PAD.encode(&who[..12])
        };
        Self {
            call: URL_SAFE_NO_PAD.encode(&d[..18]),
            caller,
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::INVALID_PARAMS;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn url_elicitation_is_declared_by_elicitation_url() {
        let caps = |s: &str| client_caps(Some(&raw(s)));
        let both = caps(r#"{"elicitation":{"form":{},"url":{}}}"#);
        assert!(both.elicitation && both.elicitation_url);
        let form = caps(r#"{"elicitation":{}}"#);
        assert!(form.elicitation && !form.elicitation_url);
        assert!(!caps(r#"{"sampling":{}}"#).elicitation_url);
        // Anything unreadable declares no URL mode.
        assert!(!caps(r#"{"elicitation":true}"#).elicitation_url);
    }

    #[test]
    fn meta_is_required_and_checked_against_the_header() {
        let ok = raw(
            r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"sampling":{}},"io.modelcontextprotocol/logLevel":"warning"}}"#,
        );
        let m = meta(Some(&ok), Some("2026-07-28")).unwrap();
        assert!(m.caps.sampling && !m.caps.elicitation);
        assert_eq!(m.level, Some(LogLevel::Warning));
        let code = |p: &str, h: Option<&str>| meta(Some(&raw(p)), h).unwrap_err().code;
        assert_eq!(meta(None, None).unwrap_err().code, INVALID_PARAMS);
        assert_eq!(code("{}", None), INVALID_PARAMS);
        assert_eq!(code(r#"{"_meta":5}"#, None), INVALID_PARAMS);
        assert_eq!(
            code(
                r#"{"_meta":{"io.modelcontextprotocol/clientCapabilities":{}}}"#,
                None
            ),
            INVALID_PARAMS
        );
        assert_eq!(
            code(
                r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}"#,
                None
            ),
            INVALID_PARAMS
        );
        assert_eq!(
            code(
                r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":[]}}"#,
                None
            ),
            INVALID_PARAMS
        );
        let v999 = r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"v999","io.modelcontextprotocol/clientCapabilities":{}}}"#;
        assert_eq!(code(v999, Some("2026-07-28")), HEADER_MISMATCH);
        let RpcError { code: c, data, .. } = meta(Some(&raw(v999)), None).unwrap_err();
        assert_eq!(c, UNSUPPORTED_VERSION);
        assert_eq!(data.unwrap().to_json()["requested"], "v999");
        assert_eq!(
            code(
                r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/logLevel":"loud"}}"#,
                None
            ),
            INVALID_PARAMS
        );
        assert!(names_version(Some(&ok)));
        assert!(!names_version(Some(&raw(r#"{"_meta":{"progressToken":1}}"#))));
        assert!(!names_version(None));
    }

    #[test]
    fn stamps_result_objects() {
        let mut out = br#"{"jsonrpc":"2.0","id":1,"result":{}}"#.to_vec();
        stamp(&mut out, br#""a":1"#);
        assert_eq!(out, br#"{"jsonrpc":"2.0","id":1,"result":{"a":1}}"#);
        let mut out = br#"{"jsonrpc":"2.0","id":1,"result":{"x":[]}}"#.to_vec();
        stamp(&mut out, br#""a":1"#);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["result"], json!({"x": [], "a": 1}));
        assert_eq!(
            String::from_utf8_lossy(&out),
            r#"{"jsonrpc":"2.0","id":1,"result":{"x":[],"a":1}}"#
        );
        // Anything that does not end as a result object is left as it is.
        for other in [&b"}}"[..], b"{\"a\":[1]}", b""] {
            let mut out = other.to_vec();
            stamp(&mut out, br#""a":1"#);
            assert_eq!(out, other);
        }
    }

    #[test]
    fn request_state_is_bound_signed_and_tamper_evident() {
        let key = StateKey::random();
        let call = CallId::new("tools/call", "t", &json!({"x": 1}), "");
        let mut answers = Map::new();
        answers.insert("k".into(), json!({"action": "accept"}));
        let s = key.seal(&call, &answers);
        assert_eq!(key.open(&s, &call).unwrap(), answers);
        // Another call, another key, any altered byte, garbage: refused.
        let other = CallId::new("tools/call", "t", &json!({"x": 2}), "");
        assert!(key.open(&s, &other).is_err());
        assert!(StateKey::random().open(&s, &call).is_err());
        assert!(key.open(&format!("{s}-TAMPERED"), &call).is_err());
        let mut b = s.clone().into_bytes();
        b[3] = if b[3] == b'A' { b'B' } else { b'A' };
        assert!(key.open(&String::from_utf8(b).unwrap(), &call).is_err());
        for junk in ["", ".", "a.b", "!!.??", &"x".repeat(MAX_STATE_LEN + 1)] {
            assert!(key.open(junk, &call).is_err(), "{junk:.20}");
        }
        // A shared key opens state sealed by another process.
        let a = StateKey::from_secret(b"0123456789abcdef-shared").unwrap();
        let b = StateKey::from_secret(b"0123456789abcdef-shared").unwrap();
        assert_eq!(b.open(&a.seal(&call, &answers), &call).unwrap(), answers);
        assert!(StateKey::from_secret(b"short").is_err());
    }

    #[test]
    fn request_state_is_bound_to_its_caller() {
        let key = StateKey::random();
        let args = json!({"x": 1});
        let alice = CallId::new("tools/call", "t", &args, "alice-digest");
        let mut answers = Map::new();
        answers.insert(
            "k".into(),
            json!({"action": "accept", "content": {"secret": "A's"}}),
        );
        let s = key.seal(&alice, &answers);
        assert_eq!(key.open(&s, &alice).unwrap(), answers);
        for other in ["bob-digest", ""] {
            let err = key
                .open(&s, &CallId::new("tools/call", "t", &args, other))
                .unwrap_err();
            assert!(err.contains("issued to another caller"), "{err}");
        }
        // Nor does a caller take state sealed for nobody in particular.
        let anonymous = key.seal(&CallId::new("tools/call", "t", &args, ""), &answers);
        assert!(key.open(&anonymous, &alice).is_err());
    }
}
