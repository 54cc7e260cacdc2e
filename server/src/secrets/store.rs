//! The store: every secret value the server holds, swapped whole on each change, with the
//! reasons a reference cannot be resolved and the redaction of values from tool output.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde_json::{Map, Value};
use tokio::sync::watch;

use crate::protocol::output::ToolOutput;
pub use crate::spec::context::value_in;
use crate::spec::context::{CONFIG_MAP_PREFIX, SECRET_ROOT, SecretRef};

/// Values shorter than this are not searched for in outputs (every `a` would go).
pub use crate::redact::MIN_KNOWN_LEN as MIN_REDACTED_LEN;
/// What replaces a secret value found in a tool's output.
pub use crate::redact::REDACTED;
/// Largest value kept per key (a Kubernetes Secret holds at most 1 MiB in all).
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// Most keys kept per secret.
pub const MAX_KEYS: usize = 256;
/// Most secrets a `dir:` source reads.
pub const MAX_DIR_SECRETS: usize = 1024;

/// A secret's keys and raw values.
pub type Keys = Vec<(String, Vec<u8>)>;

/// Whether a secret could be read, for `/status` (names only, never values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Not read yet.
    Pending,
    /// Read; its keys are in the store.
    Loaded,
    /// It does not exist (or was deleted).
    Missing,
    /// It could not be read (e.g. the pod may not read it yet).
    Unreadable,
}

/// What the templates of an http request or an exec environment see: the arguments, and
/// the secret store under `secret` (which no argument can shadow).
pub struct WithSecrets<'a> {
    pub args: &'a Value,
    pub secrets: &'a Value,
}

impl crate::template::Scope for WithSecrets<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        if name == SECRET_ROOT {
            Some(self.secrets)
        } else {
            self.args.get(name)
        }
    }
}

/// The store.
#[derive(Debug)]
pub struct Secrets {
    /// `{NAME: {KEY: "value"}}`: what templates see under `secret`.
    values: ArcSwap<Value>,
    presence: Mutex<std::collections::BTreeMap<String, Presence>>,
    /// Secrets the serving config (and client auth) need; sources that fetch by name follow it.
    wanted: watch::Sender<BTreeSet<String>>,
    /// Always wanted, whatever the ToolSet says (the client token secret).
    pinned: Mutex<Vec<SecretRef>>,
    /// Read by the fetches of OpenAPI documents, which run before the config compiles.
    fetching: Mutex<Vec<SecretRef>>,
    /// The references of the serving config, as last configured.
    configured: Mutex<Vec<SecretRef>>,
    /// Bumped when a Secret or ConfigMap that a fetch reads changes.
    fetched_changed: watch::Sender<u64>,
    /// Whether a source is configured at all (errors say so when none is).
    has_source: std::sync::atomic::AtomicBool,
    /// The `env` source: values are looked up per reference when the references change.
    from_env: std::sync::atomic::AtomicBool,
    /// Every value (and line of a value) to redact from untrusted text, longest first.
    known: ArcSwap<Vec<String>>,
}

impl Default for Secrets {
    fn default() -> Self {
        Self {
            values: ArcSwap::from_pointee(Value::Object(Map::new())),
            presence: Mutex::default(),
            wanted: watch::Sender::new(BTreeSet::new()),
            pinned: Mutex::default(),
            fetching: Mutex::default(),
            configured: Mutex::default(),
            fetched_changed: watch::Sender::new(0),
            has_source: false.into(),
            from_env: false.into(),
            known: ArcSwap::from_pointee(Vec::new()),
        }
    }
}

/// A secret's keys as the store keeps them: at most [`MAX_KEYS`], UTF-8 values only.
fn keys_map(name: &str, data: Keys) -> Map<String, Value> {
    data.into_iter()
        .take(MAX_KEYS)
        .filter_map(|(k, v)| utf8(name, &k, v).map(|v| (k, v)))
        .collect()
}

fn utf8(name: &str, key: &str, bytes: Vec<u8>) -> Option<Value> {
    if bytes.len() > MAX_VALUE_BYTES {
        tracing::warn!(secret = name, key, "secret value over 1 MiB; ignored");
        return None;
    }
    match String::from_utf8(bytes) {
        Ok(s) => Some(Value::String(s)),
        Err(_) => {
            tracing::warn!(secret = name, key, "secret value is not UTF-8 text; ignored");
            None
        }
    }
}

impl Secrets {
    /// An empty store.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// What templates see under `secret` right now.
    #[inline]
    pub fn snapshot(&self) -> Arc<Value> {
        self.values.load_full()
    }

    /// The value of one reference, if present.
    pub fn get(&self, r: &SecretRef) -> Option<String> {
        self.values
            .load()
            .get(&r.name)
            .and_then(|s| s.get(&r.key))
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    /// Replaces a secret's keys (`None`: it is gone).
    pub fn set(&self, name: &str, data: Option<Keys>, presence: Presence) {
        let keys = data.map(|d| keys_map(name, d));
        self.values.rcu(|cur| {
            let mut next = cur.as_object().cloned().unwrap_or_default();
            match &keys {
                Some(k) => next.insert(name.to_owned(), Value::Object(k.clone())),
                None => next.remove(name),
            };
            Value::Object(next)
        });
        if let Ok(mut p) = self.presence.lock() {
            p.insert(name.to_owned(), presence);
        }
        self.refresh_known();
        if self
            .fetching
            .lock()
            .is_ok_and(|f| f.iter().any(|r| r.name == name))
        {
            self.fetched_changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Changes each time a Secret or ConfigMap that an OpenAPI fetch reads (a document in a
    /// ConfigMap, a CA, a header's value) is set, so the fetch runs again.
    pub fn fetched_changes(&self) -> watch::Receiver<u64> {
        self.fetched_changed.subscribe()
    }

    /// Recomputes [`Self::known`] from the values.
    fn refresh_known(&self) {
        let values = self.values.load();
        let all = values
            .as_object()
            .into_iter()
            .flat_map(|o| o.iter())
            // ConfigMaps (CA bundles) are not secret.
            .filter(|(name, _)| !name.starts_with(CONFIG_MAP_PREFIX))
            .filter_map(|(_, keys)| keys.as_object())
            .flat_map(|keys| keys.values())
            .filter_map(Value::as_str);
        self.known.store(Arc::new(crate::redact::known_values(all)));
    }

    /// Text from outside the server (an upstream's stderr, log message, error, server info)
    /// made fit to log, store and show: every secret value this server holds (client tokens
    /// included) and anything shaped like a credential redacted, control characters removed,
    /// at most `max_chars` characters (see [`crate::redact`]).
    pub fn scrub(&self, text: &str, max_chars: usize) -> String {
        crate::redact::untrusted(text, &self.known.load(), max_chars)
    }

    /// [`Self::scrub`] for a JSON value (an upstream's structured log data): each string is
    /// redacted before the value is serialized, so escaping cannot hide a secret.
    pub fn scrub_json(&self, value: &serde_json::Value, max_chars: usize) -> String {
        crate::redact::untrusted_json(value, &self.known.load(), max_chars)
    }

    /// Replaces every secret at once (the `dir:` and `env` sources).
    pub fn replace_all(&self, all: Vec<(String, Keys)>) {
        let mut next = Map::new();
        let mut presence = std::collections::BTreeMap::new();
        for (name, data) in all {
            let keys = keys_map(&name, data);
            presence.insert(name.clone(), Presence::Loaded);
            next.insert(name, Value::Object(keys));
        }
        let before = self.values.load_full();
        self.values.store(Arc::new(Value::Object(next)));
        if let Ok(mut p) = self.presence.lock() {
            *p = presence;
        }
        self.refresh_known();
        let now = self.values.load();
        let changed = self
            .fetching
            .lock()
            .is_ok_and(|f| f.iter().any(|r| before.get(&r.name) != now.get(&r.name)));
        if changed {
            self.fetched_changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Marks that a source fills this store.
    pub fn set_has_source(&self) {
        self.has_source.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Fills the store from `QUIVER_SECRET_<NAME>_<KEY>` variables from now on.
    pub fn use_env(&self) {
        self.set_has_source();
        self.from_env.store(true, std::sync::atomic::Ordering::Relaxed);
        self.refollow();
    }

    /// Wants the serving config's references again, with the pinned and the fetches' ones.
    fn refollow(&self) {
        let serving = self.configured.lock().map(|c| c.clone()).unwrap_or_default();
        self.follow(serving);
    }

    /// Keeps `r` wanted whatever the ToolSet references.
    pub fn pin(&self, r: SecretRef) {
        if let Ok(mut p) = self.pinned.lock() {
            p.push(r);
        }
        self.refollow();
    }

    /// Sets the references the serving config makes (the pinned ones are added): sources
    /// that fetch by name follow the names.
    pub fn configure(&self, refs: &[SecretRef]) {
        if let Ok(mut c) = self.configured.lock() {
            refs.clone_into(&mut c);
        }
        self.follow(refs.to_vec());
    }

    /// Sets the references the fetches of the next config's OpenAPI documents make, wanted
    /// beside the serving config's (a fetch waits for them: it is retried until they are read).
    pub fn configure_fetches(&self, refs: &[SecretRef]) {
        if let Ok(mut f) = self.fetching.lock() {
            if *f == refs {
                return;
            }
            refs.clone_into(&mut f);
        }
        self.refollow();
    }

    /// Wants `refs`, the pinned and the fetches' references, and nothing else.
    fn follow(&self, mut all: Vec<SecretRef>) {
        for extra in [&self.pinned, &self.fetching] {
            if let Ok(p) = extra.lock() {
                all.extend(p.iter().cloned());
            }
        }
        if self.from_env.load(std::sync::atomic::Ordering::Relaxed) {
            self.replace_all(super::env::read(&all));
        }
        let set: BTreeSet<String> = all.into_iter().map(|r| r.name).collect();
        self.wanted.send_if_modified(|cur| {
            if *cur == set {
                return false;
            }
            *cur = set;
            true
        });
    }

    /// Follows the wanted set.
    pub fn wanted(&self) -> watch::Receiver<BTreeSet<String>> {
        self.wanted.subscribe()
    }

    /// Why `refs` cannot all be resolved now, naming the first that is not (never a value).
    pub fn unavailable(&self, refs: &[SecretRef]) -> Option<String> {
        let values = self.values.load();
        let r = refs
            .iter()
            .find(|r| values.get(&r.name).and_then(|s| s.get(&r.key)).is_none())?;
        if !self.has_source.load(std::sync::atomic::Ordering::Relaxed) {
            return Some(format!(
                "{r} is not available: the server has no secret source (--secrets)"
            ));
        }
        let presence = self
            .presence
            .lock()
            .ok()
            .and_then(|p| p.get(&r.name).copied())
            .unwrap_or(Presence::Pending);
        Some(match presence {
            Presence::Loaded => format!("{r} is not available: the secret has no such key"),
            Presence::Missing => format!("{r} is not available: the secret does not exist"),
            Presence::Unreadable => format!("{r} is not available: the secret cannot be read"),
            Presence::Pending => format!("{r} is not available yet"),
        })
    }

    /// For `/status`: each wanted or known secret and whether it was read (no values).
    pub fn status(&self) -> Value {
        let wanted = self.wanted.borrow().clone();
        let presence = self.presence.lock().map(|p| p.clone()).unwrap_or_default();
        let mut out = Map::new();
        for name in wanted.iter().chain(presence.keys()) {
            let p = presence.get(name).copied().unwrap_or(Presence::Pending);
            let s = match p {
                Presence::Pending => "pending",
                Presence::Loaded => "loaded",
                Presence::Missing => "missing",
                Presence::Unreadable => "unreadable",
            };
            out.insert(name.clone(), Value::String(s.to_owned()));
        }
        Value::Object(out)
    }

    /// Replaces the values of `refs` found in any string or key of `v` with [`REDACTED`].
    pub fn redact_json(&self, refs: &[SecretRef], v: &mut Value) {
        let values = self.values.load();
        let secrets = redacted_values(&values, refs);
        if !secrets.is_empty() {
            redact_value(v, &secrets);
        }
    }

    /// Replaces the values of `refs` found in `out` with [`REDACTED`].
    pub fn redact(&self, refs: &[SecretRef], out: &mut ToolOutput) {
        let values = self.values.load();
        let secrets = redacted_values(&values, refs);
        if secrets.is_empty() {
            return;
        }
        redact_str(&mut out.text, &secrets);
        if let Some(s) = &mut out.structured {
            redact_value(s, &secrets);
        }
        if let Some(blocks) = &mut out.content {
            blocks.iter_mut().for_each(|b| redact_value(b, &secrets));
        }
    }
}

/// The values of `refs` (as stored and trimmed) long enough to redact, longest first (so a
/// value that contains another is replaced whole).
fn redacted_values<'a>(values: &'a Value, refs: &[SecretRef]) -> Vec<&'a str> {
    let mut secrets: Vec<&str> = refs
        .iter()
        .filter_map(|r| values.get(&r.name)?.get(&r.key)?.as_str())
        // A request sends a value trimmed (`| trim`, a security scheme's credential): a
        // Secret read from a file ends with a line break the echoed text does not have.
        .flat_map(|v| [v, v.trim()])
        .filter(|v| v.len() >= MIN_REDACTED_LEN)
        .collect();
    secrets.sort_by_key(|v| std::cmp::Reverse(v.len()));
    secrets.dedup();
    secrets
}

fn redact_str(s: &mut String, secrets: &[&str]) {
    crate::redact::replace_known(s, secrets);
}

/// Redacts every string (and object key) of a JSON value, without recursion.
fn redact_value(v: &mut Value, secrets: &[&str]) {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => redact_str(s, secrets),
            Value::Array(a) => stack.extend(a.iter_mut()),
            Value::Object(o) => {
                if o.keys().any(|k| secrets.iter().any(|s| k.contains(s))) {
                    let old = std::mem::take(o);
                    for (mut k, x) in old {
                        redact_str(&mut k, secrets);
                        o.insert(k, x);
                    }
                }
                stack.extend(o.values_mut());
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::context::SecretRef;

    fn r(name: &str, key: &str) -> SecretRef {
        SecretRef {
            name: name.into(),
            key: key.into(),
        }
    }

    #[test]
    fn set_get_and_reasons_name_no_value() {
        let s = Secrets::new();
        assert!(
            s.unavailable(&[r("api", "token")])
                .unwrap()
                .contains("no secret source")
        );
        s.set_has_source();
        assert!(
            s.unavailable(&[r("api", "token")])
                .unwrap()
                .ends_with("not available yet")
        );
        s.set(
            "api",
            Some(vec![("token".into(), b"s3cr3t-value".to_vec())]),
            Presence::Loaded,
        );
        assert_eq!(s.get(&r("api", "token")).as_deref(), Some("s3cr3t-value"));
        assert_eq!(s.unavailable(&[r("api", "token")]), None);
        let why = s.unavailable(&[r("api", "token"), r("api", "other")]).unwrap();
        assert!(why.contains("no such key") && why.contains("`other`"), "{why}");
        s.set("api", None, Presence::Missing);
        assert!(
            s.unavailable(&[r("api", "token")])
                .unwrap()
                .contains("does not exist")
        );
        assert!(!s.status().to_string().contains("s3cr3t"));
    }

    #[test]
    fn non_utf8_and_oversized_values_are_dropped() {
        let s = Secrets::new();
        s.set(
            "x",
            Some(vec![
                ("bin".into(), vec![0xff, 0xfe]),
                ("big".into(), vec![b'a'; MAX_VALUE_BYTES + 1]),
                ("ok".into(), b"fine".to_vec()),
            ]),
            Presence::Loaded,
        );
        assert_eq!(s.get(&r("x", "bin")), None);
        assert_eq!(s.get(&r("x", "big")), None);
        assert_eq!(s.get(&r("x", "ok")).as_deref(), Some("fine"));
    }

    #[test]
    fn redaction_covers_text_structured_content_and_keys() {
        let s = Secrets::new();
        s.set(
            "api",
            Some(vec![
                ("token".into(), b"tok-123456".to_vec()),
                ("short".into(), b"ab".to_vec()),
                ("long".into(), b"tok-123456-extended".to_vec()),
            ]),
            Presence::Loaded,
        );
        let refs = [r("api", "token"), r("api", "short"), r("api", "long")];
        let mut out = ToolOutput {
            text: "auth tok-123456 and tok-123456-extended, ab stays".into(),
            structured: Some(serde_json::json!({"h": ["Bearer tok-123456"], "tok-123456": 1})),
            content: Some(vec![serde_json::json!({"type": "text", "text": "x tok-123456"})]),
            is_error: false,
        };
        s.redact(&refs, &mut out);
        assert_eq!(out.text, "auth [redacted] and [redacted], ab stays");
        assert_eq!(
            out.structured,
            Some(serde_json::json!({"h": ["Bearer [redacted]"], "[redacted]": 1}))
        );
        assert_eq!(out.content.unwrap()[0]["text"], "x [redacted]");
    }

    /// A Secret written from a file usually ends with a line break, and what a request sends
    /// is trimmed (`| trim`, a security scheme's credential): that is the text an API echoes.
    #[test]
    fn a_value_is_redacted_as_it_is_sent_trimmed_too() {
        let s = Secrets::new();
        s.set(
            "api",
            Some(vec![
                ("token".into(), b"tok-123456\n".to_vec()),
                ("padded".into(), b"  pw-98765 \r\n".to_vec()),
            ]),
            Presence::Loaded,
        );
        let mut out = ToolOutput {
            text: "x-api-key: tok-123456; pw-98765".into(),
            structured: Some(serde_json::json!({"h": "Bearer tok-123456", "k": "pw-98765"})),
            content: None,
            is_error: false,
        };
        s.redact(&[r("api", "token"), r("api", "padded")], &mut out);
        assert_eq!(out.text, "x-api-key: [redacted]; [redacted]");
        assert_eq!(
            out.structured,
            Some(serde_json::json!({"h": "Bearer [redacted]", "k": "[redacted]"}))
        );
    }

    #[test]
    fn the_wanted_set_includes_pinned_names_and_changes_only_on_change() {
        let s = Secrets::new();
        let mut rx = s.wanted();
        s.pin(r("tokens", "list"));
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), BTreeSet::from(["tokens".to_owned()]));
        let refs = [r("api", "a"), r("api", "b")];
        s.configure(&refs);
        assert_eq!(rx.borrow_and_update().len(), 2);
        s.configure(&refs[..1]);
        assert!(!rx.has_changed().unwrap());
    }
}
