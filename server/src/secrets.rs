//! Secret values tools read through `{{secret.NAME.KEY}}`, and the bearer tokens clients
//! present: one store, filled by one source and swapped whole on every change, so a rotated
//! value is what the next call uses.
//!
//! Sources (`--secrets`):
//! - `kube:NAMESPACE`: a watch on each Secret the serving ToolSet references (and the one
//!   holding client tokens), by name. The set follows reloads; the pod's Role grants exactly
//!   those names.
//! - `dir:PATH`: `PATH/NAME/KEY` files (the layout of Secret volumes mounted under `PATH`),
//!   watched with inotify.
//! - `env`: `QUIVER_SECRET_<NAME>_<KEY>` variables (upper-cased, `-` as `_`), read at start.
//!
//! Values never reach logs, errors, `/status` or metrics: only names and keys do, and what a
//! tool returns has the values it used replaced by [`REDACTED`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde_json::{Map, Value};
use tokio::sync::watch;

use crate::config::SecretRef;
use crate::handlers::ToolOutput;

pub use crate::config::{CONFIG_MAP_PREFIX, valid_config_map_name};

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

/// Where secret values come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// Secrets of this namespace, watched through the Kubernetes API.
    Kube(String),
    /// `PATH/NAME/KEY` files.
    Dir(PathBuf),
    /// `QUIVER_SECRET_<NAME>_<KEY>` environment variables.
    Env,
}

impl FromStr for SecretSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            Some(("kube", ns)) if !ns.is_empty() => Ok(Self::Kube(ns.to_owned())),
            Some(("dir", p)) if !p.is_empty() => Ok(Self::Dir(PathBuf::from(p))),
            None if s == "env" => Ok(Self::Env),
            _ => Err(format!("`{s}`: expected kube:NAMESPACE, dir:PATH or env")),
        }
    }
}

/// A `NAME.KEY` flag value naming one secret value (e.g. `--auth-tokens-secret`).
pub fn parse_ref(s: &str) -> Result<SecretRef, String> {
    match s.split_once('.') {
        Some((name, key)) if !name.is_empty() && !key.is_empty() => Ok(SecretRef {
            name: name.to_owned(),
            key: key.to_owned(),
        }),
        _ => Err(format!("`{s}`: expected SECRET.KEY")),
    }
}

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

    /// Replaces every secret at once (the `dir:` and `env` sources).
    pub fn replace_all(&self, all: Vec<(String, Keys)>) {
        let mut next = Map::new();
        let mut presence = std::collections::BTreeMap::new();
        for (name, data) in all {
            let keys = keys_map(&name, data);
            presence.insert(name.clone(), Presence::Loaded);
            next.insert(name, Value::Object(keys));
        }
        self.values.store(Arc::new(Value::Object(next)));
        if let Ok(mut p) = self.presence.lock() {
            *p = presence;
        }
        self.refresh_known();
    }

    /// Marks that a source fills this store.
    pub fn set_has_source(&self) {
        self.has_source.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Fills the store from `QUIVER_SECRET_<NAME>_<KEY>` variables from now on.
    pub fn use_env(&self) {
        self.set_has_source();
        self.from_env.store(true, std::sync::atomic::Ordering::Relaxed);
        self.configure(&[]);
    }

    /// Keeps `r` wanted whatever the ToolSet references.
    pub fn pin(&self, r: SecretRef) {
        if let Ok(mut p) = self.pinned.lock() {
            p.push(r);
        }
        self.configure(&[]);
    }

    /// Sets the references the serving config makes (the pinned ones are added): sources
    /// that fetch by name follow the names.
    pub fn configure(&self, refs: &[SecretRef]) {
        let mut all: Vec<SecretRef> = refs.to_vec();
        if let Ok(p) = self.pinned.lock() {
            all.extend(p.iter().cloned());
        }
        if self.from_env.load(std::sync::atomic::Ordering::Relaxed) {
            load_env(self, &all);
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

/// The values of `refs` long enough to redact, longest first (so a value that contains
/// another is replaced whole).
fn redacted_values<'a>(values: &'a Value, refs: &[SecretRef]) -> Vec<&'a str> {
    let mut secrets: Vec<&str> = refs
        .iter()
        .filter_map(|r| values.get(&r.name)?.get(&r.key)?.as_str())
        .filter(|v| v.len() >= MIN_REDACTED_LEN)
        .collect();
    secrets.sort_by_key(|v| std::cmp::Reverse(v.len()));
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

/// The variable of `QUIVER_SECRET_<NAME>_<KEY>`'s scheme for one reference.
pub fn env_var(r: &SecretRef) -> String {
    let up = |s: &str| s.to_ascii_uppercase().replace(['-', ':'], "_");
    format!("QUIVER_SECRET_{}_{}", up(&r.name), up(&r.key))
}

/// Fills the store from the environment for `refs`: the variable names need the keys, which
/// only the ToolSet knows, so this runs after every reload.
fn load_env(secrets: &Secrets, refs: &[SecretRef]) {
    let mut by_name: std::collections::BTreeMap<String, Keys> = Default::default();
    for r in refs {
        if let Some(v) = std::env::var_os(env_var(r)) {
            by_name
                .entry(r.name.clone())
                .or_default()
                .push((r.key.clone(), v.into_encoded_bytes()));
        }
    }
    secrets.replace_all(by_name.into_iter().collect());
}

fn read_dir_source(root: &Path) -> std::io::Result<Vec<(String, Keys)>> {
    let visible = |e: &std::fs::DirEntry| !e.file_name().to_string_lossy().starts_with('.');
    let mut out = Vec::new();
    for secret in std::fs::read_dir(root)?
        .filter_map(Result::ok)
        .filter(visible)
        .take(MAX_DIR_SECRETS)
    {
        let path = secret.path();
        if !path.is_dir() {
            continue;
        }
        let name = secret.file_name().to_string_lossy().into_owned();
        let mut keys = Vec::new();
        for key in std::fs::read_dir(&path)?
            .filter_map(Result::ok)
            .filter(visible)
            .take(MAX_KEYS)
        {
            let p = key.path();
            let Ok(meta) = std::fs::metadata(&p) else { continue };
            if !meta.is_file() || meta.len() > MAX_VALUE_BYTES as u64 {
                continue;
            }
            if let Ok(bytes) = std::fs::read(&p) {
                keys.push((key.file_name().to_string_lossy().into_owned(), bytes));
            }
        }
        out.push((name, keys));
    }
    Ok(out)
}

/// `dir:PATH`: reads the tree now, then again on every change under it, until the process ends.
///
/// # Errors
/// The directory cannot be read or watched.
pub async fn watch_dir(root: PathBuf, secrets: Arc<Secrets>) -> anyhow::Result<()> {
    use notify::{RecursiveMode, Watcher};
    secrets.set_has_source();
    secrets.replace_all(read_dir_source(&root)?);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        // A value written in place is read once closed, never half-written.
        if let Some(signal) = ev.ok().and_then(|ev| crate::reload::file::classify(&ev.kind)) {
            let _ = tx.send(signal);
        }
    })?;
    watcher.watch(&root, RecursiveMode::Recursive)?;
    tracing::info!(path = %root.display(), "watching secrets");
    while let Some(first) = rx.recv().await {
        // The burst of events one rotation (a symlink swap) or write makes is one change.
        if !crate::reload::file::settle(first, &mut rx).await {
            break;
        }
        let (dir, store) = (root.clone(), Arc::clone(&secrets));
        let read = tokio::task::spawn_blocking(move || read_dir_source(&dir)).await;
        match read {
            Ok(Ok(all)) => {
                store.replace_all(all);
                tracing::info!(path = %root.display(), "secrets re-read");
            }
            Ok(Err(e)) => {
                tracing::warn!(path = %root.display(), error = %e, "cannot read secrets; keeping the previous values")
            }
            Err(e) => tracing::error!(error = %e, "secret read task failed"),
        }
        // A Secret volume mounted afresh replaces directories: watch what is there now.
        let _ = watcher.watch(&root, RecursiveMode::Recursive);
    }
    drop(watcher);
    Ok(())
}

#[cfg(feature = "kube")]
pub use self::kube_source::watch_kube;

#[cfg(feature = "kube")]
mod kube_source {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use futures_util::StreamExt;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::Api;
    use kube::runtime::WatchStreamExt;
    use kube::runtime::watcher::{self, Event};

    use super::{CONFIG_MAP_PREFIX, Presence, Secrets};

    /// The keys and values of a watched object.
    trait Keyed: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static {
        fn keys(&self) -> Vec<(String, Vec<u8>)>;
    }

    impl Keyed for Secret {
        fn keys(&self) -> Vec<(String, Vec<u8>)> {
            // stringData is write-only: the API server folds it into data.
            let mut out: Vec<(String, Vec<u8>)> = self
                .data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect();
            out.sort();
            out
        }
    }

    impl Keyed for ConfigMap {
        fn keys(&self) -> Vec<(String, Vec<u8>)> {
            let text = self
                .data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone().into_bytes()));
            let binary = self
                .binary_data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.0.clone()));
            let mut out: Vec<(String, Vec<u8>)> = text.chain(binary).collect();
            out.sort();
            out
        }
    }

    /// Keeps the store's entry `name` (the object's name, prefixed for a ConfigMap) equal to
    /// the object `object` of `api`.
    async fn watch_one<K: Keyed>(api: Api<K>, name: String, object: String, secrets: Arc<Secrets>) {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={object}"));
        let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
        let mut seen = false;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Apply(s) | Event::InitApply(s)) => {
                    seen = true;
                    secrets.set(&name, Some(s.keys()), Presence::Loaded);
                    tracing::info!(secret = %name, "secret loaded");
                }
                Ok(Event::Delete(_)) => {
                    seen = false;
                    secrets.set(&name, None, Presence::Missing);
                    tracing::warn!(secret = %name, "secret deleted; tools that use it fail until it exists");
                }
                Ok(Event::Init) => seen = false,
                Ok(Event::InitDone) if !seen => {
                    secrets.set(&name, None, Presence::Missing);
                    tracing::warn!(secret = %name, "secret not found; tools that use it fail until it exists");
                }
                Ok(Event::InitDone) => {}
                Err(e) => {
                    if !seen {
                        secrets.set(&name, None, Presence::Unreadable);
                    }
                    tracing::warn!(secret = %name, error = %e, "secret watch error; retrying with backoff");
                }
            }
        }
    }

    /// `kube:NAMESPACE`: one watch per wanted Secret, started and stopped as the wanted set
    /// changes, until the process ends.
    ///
    /// # Errors
    /// No Kubernetes client configuration (in-cluster or KUBECONFIG) was found.
    pub async fn watch_kube(namespace: String, secrets: Arc<Secrets>) -> anyhow::Result<()> {
        secrets.set_has_source();
        let client = kube::Client::try_default().await?;
        let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
        let maps: Api<ConfigMap> = Api::namespaced(client, &namespace);
        let mut wanted = secrets.wanted();
        let mut running: BTreeMap<String, tokio::task::JoinHandle<()>> = BTreeMap::new();
        loop {
            let now = wanted.borrow_and_update().clone();
            running.retain(|name, task| {
                let keep = now.contains(name);
                if !keep {
                    task.abort();
                    secrets.set(name, None, Presence::Pending);
                }
                keep
            });
            for name in now {
                running.entry(name.clone()).or_insert_with(|| {
                    let store = Arc::clone(&secrets);
                    match name.strip_prefix(CONFIG_MAP_PREFIX) {
                        Some(map) => {
                            tokio::spawn(watch_one(maps.clone(), name.clone(), map.to_owned(), store))
                        }
                        None => tokio::spawn(watch_one(api.clone(), name.clone(), name, store)),
                    }
                });
            }
            if wanted.changed().await.is_err() {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str, key: &str) -> SecretRef {
        SecretRef {
            name: name.into(),
            key: key.into(),
        }
    }

    #[test]
    fn sources_parse() {
        assert_eq!("kube:ns".parse(), Ok(SecretSource::Kube("ns".into())));
        assert_eq!("dir:/s".parse(), Ok(SecretSource::Dir("/s".into())));
        assert_eq!("env".parse(), Ok(SecretSource::Env));
        for bad in ["kube:", "dir:", "file:/x", "", "envx"] {
            assert!(bad.parse::<SecretSource>().is_err(), "{bad}");
        }
        assert_eq!(parse_ref("api.token"), Ok(r("api", "token")));
        assert!(parse_ref("api").is_err());
        assert!(parse_ref(".k").is_err());
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

    #[test]
    fn a_dir_source_reads_name_key_files_and_skips_hidden_and_large() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("api/..data")).unwrap();
        std::fs::write(d.path().join("api/token"), "abc").unwrap();
        std::fs::write(d.path().join("api/.hidden"), "x").unwrap();
        std::fs::write(d.path().join("loose-file"), "x").unwrap();
        let all = read_dir_source(d.path()).unwrap();
        assert_eq!(
            all,
            vec![("api".to_owned(), vec![("token".to_owned(), b"abc".to_vec())])]
        );
    }

    #[test]
    fn env_names_follow_the_scheme() {
        assert_eq!(env_var(&r("my-api", "token")), "QUIVER_SECRET_MY_API_TOKEN");
    }
}
