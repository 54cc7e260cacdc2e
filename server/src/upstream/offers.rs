//! An upstream's resources and prompts: `resources/read` and `prompts/get` forwarded, their
//! answers checked (shape, URIs, Secret values, the result guard) before a client sees them.

use std::time::Instant;

use serde_json::{Map, Value, json};

use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwapOption;
use rustc_hash::FxHashSet;

use rustc_hash::FxHasher;

use super::{CallError, Link, MAX_STATUS_REASON};
use crate::config::guards::{GuardAction, Verdict};
use crate::config::upstream::offers::Offered;
use crate::config::upstream::{CompiledUpstream, ImportReport};
use crate::guard::Scan;
use crate::peer::CallCtx;

/// What the upstream offers, as its `initialize` result says (bits of [`Shared::offered`](super::Shared)).
pub(super) const RESOURCES: u8 = 1;
pub(super) const PROMPTS: u8 = 2;
pub(super) const SUBSCRIBE: u8 = 4;
pub(super) const COMPLETIONS: u8 = 8;

/// The capabilities of an `initialize` result that this server imports from.
pub(super) fn offered(initialized: &Value) -> u8 {
    let caps = initialized.get("capabilities");
    let has = |k: &str| caps.and_then(|c| c.get(k)).is_some_and(Value::is_object);
    let mut bits = 0;
    if has("resources") {
        bits |= RESOURCES;
    }
    if has("prompts") {
        bits |= PROMPTS;
    }
    if has("completions") {
        bits |= COMPLETIONS;
    }
    let subscribe = caps
        .and_then(|c| c.get("resources"))
        .and_then(|r| r.get("subscribe"))
        .and_then(Value::as_bool);
    if subscribe == Some(true) {
        bits |= SUBSCRIBE;
    }
    bits
}

/// Subscribed URIs of one upstream kept (more are refused).
const MAX_WATCHED: usize = 1024;
/// Values of one upstream completion passed on (the protocol's limit), and the longest.
const MAX_COMPLETIONS: usize = 100;
const MAX_COMPLETION_CHARS: usize = 1024;

/// A callback of the served URI of an updated resource.
type Tell = Box<dyn Fn(&str) + Send + Sync>;

/// What is told the served URI of an updated resource (set by the server), shared by the
/// hub and its links.
#[derive(Clone, Default)]
pub(super) struct OnUpdate(Arc<ArcSwapOption<Tell>>);

impl std::fmt::Debug for OnUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnUpdate").finish_non_exhaustive()
    }
}

impl OnUpdate {
    pub(super) fn set(&self, f: Tell) {
        self.0.store(Some(Arc::new(f)));
    }
}

/// An upstream's resource URIs that clients subscribed to (its own URIs), kept as long as
/// the link: the upstream is subscribed once per URI, again after each new handshake.
pub(super) struct Watches {
    uris: Mutex<(FxHashSet<String>, u64)>,
    tell: OnUpdate,
    /// Updates passed on per second (a flood of them is dropped, not fanned out).
    budget: super::LogBudget,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches").finish_non_exhaustive()
    }
}

impl Watches {
    pub(super) fn new(tell: &OnUpdate) -> Self {
        Self {
            uris: Mutex::default(),
            tell: tell.clone(),
            budget: super::LogBudget::new("resource updates"),
        }
    }

    /// The watched URIs (the upstream's own).
    pub(super) fn uris(&self) -> Vec<String> {
        self.uris
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .iter()
            .cloned()
            .collect()
    }

    /// An upstream's `notifications/resources/updated` for `uri`: passed on (as served by
    /// upstream `name`) when a client subscribed to it, else dropped.
    pub(super) fn updated(&self, name: &str, uri: &str) {
        if !self.budget.take() {
            return;
        }
        let known = self
            .uris
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .contains(uri);
        if known && let Some(tell) = &*self.tell.0.load() {
            tell(&format!("{name}+{uri}"));
        }
    }
}

impl Link {
    /// Subscribes to the upstream's resource `remote` (unless already subscribed): its
    /// updates reach the server's subscribers from now on. The request goes out in the
    /// background; a failure is logged.
    ///
    /// # Errors
    /// The upstream does not offer subscriptions, or already has [`MAX_WATCHED`] that a
    /// session or listen (`live`, by served URI) still watches.
    pub fn watch(self: &Arc<Self>, remote: &str, live: &dyn Fn(&str) -> bool) -> Result<(), String> {
        let stateless = self.shared.stateless.load(Ordering::Relaxed);
        let offered = self.shared.offered.load(Ordering::Relaxed);
        // 2026-07-28 watches resources with the listen every upstream of it has.
        if offered & SUBSCRIBE == 0 && !(stateless && offered & RESOURCES != 0) {
            return Err(format!(
                "upstream `{}` does not offer resource subscriptions",
                self.name
            ));
        }
        {
            let mut w = self
                .shared
                .watches
                .uris
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if w.0.contains(remote) {
                return Ok(());
            }
            if w.0.len() >= MAX_WATCHED {
                let name = &self.name;
                w.0.retain(|u| live(&format!("{name}+{u}")));
            }
            if w.0.len() >= MAX_WATCHED {
                return Err(format!(
                    "upstream `{}` already has {MAX_WATCHED} subscribed resources",
                    self.name
                ));
            }
            w.0.insert(remote.to_owned());
        }
        if self.shared.stateless.load(Ordering::Relaxed) {
            // 2026-07-28 has no resources/subscribe: the listen is opened again with it.
            self.shared.relisten.notify_one();
            return Ok(());
        }
        let (link, uri) = (Arc::clone(self), remote.to_owned());
        tokio::spawn(async move { link.subscribe(&uri).await });
        Ok(())
    }

    async fn subscribe(&self, uri: &str) {
        if let Err(e) = self
            .request("resources/subscribe", &json!({"uri": uri}), super::LogSink::NONE)
            .await
        {
            let error = self.describe(&e.to_string());
            tracing::warn!(upstream = %self.name, error, "resources/subscribe failed");
        }
    }

    /// Subscribes again to every watched URI after a new handshake (a new session or
    /// process knows none of them).
    pub(super) async fn resubscribe(&self) {
        if self.shared.stateless.load(Ordering::Relaxed) {
            return;
        }
        let epoch = self.shared.epoch.load(Ordering::Relaxed);
        let uris: Vec<String> = {
            let w = self
                .shared
                .watches
                .uris
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if w.1 == epoch {
                return;
            }
            w.0.iter().cloned().collect()
        };
        for uri in uris {
            self.subscribe(&uri).await;
        }
        // Only once every one was sent: a listing cut short sends them again.
        self.shared
            .watches
            .uris
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1 = epoch;
    }

    /// `text` of the upstream's (an error message) as a client may see it: naming the
    /// upstream, bounded, its Secret values redacted.
    pub fn describe(&self, text: &str) -> String {
        self.shared.secrets.scrub(
            &format!("upstream `{}`: {text}", self.name),
            super::MAX_STATUS_ERROR,
        )
    }

    /// What the upstream (`u`, at `index`) lists of its resources, templates and prompts,
    /// compiled (its lists folded into `h`).
    pub(super) fn offered(&self, u: &CompiledUpstream, index: usize, h: &mut FxHasher) -> Offered {
        let mut out = Offered {
            upstream: index,
            ..Offered::default()
        };
        let [resources, templates, prompts] = &self.offers;
        for (slot, templated) in [(resources, false), (templates, true)] {
            let listed = slot.load();
            listed.hash.hash(h);
            u.import_resources(index, &listed.tools, templated, &mut out);
            if listed.cut {
                out.skipped.push(format!(
                    "its {} list was cut after {} entries",
                    if templated {
                        "resource template"
                    } else {
                        "resource"
                    },
                    listed.tools.len()
                ));
            }
        }
        let listed = prompts.load();
        listed.hash.hash(h);
        u.import_prompts(index, &listed.tools, &mut out);
        // What they say of themselves reaches every client: without the connection's Secrets.
        let secrets = &self.shared.secrets;
        for r in &mut out.resources {
            secrets.redact_json(&self.secrets, &mut r.descriptor);
        }
        for p in &mut out.prompts {
            secrets.redact_json(&self.secrets, &mut p.descriptor);
            p.description = p
                .descriptor
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_owned);
        }
        if listed.cut {
            out.skipped.push(format!(
                "its prompt list was cut after {} entries",
                listed.tools.len()
            ));
        }
        out
    }

    /// Adds what importing its resources and prompts did to its `/status` report.
    pub(super) fn add_to_report(&self, mut r: ImportReport) {
        for why in &mut r.skipped {
            *why = self.shared.secrets.scrub(why, MAX_STATUS_REASON);
        }
        if !r.skipped.is_empty() {
            let first: Vec<&String> = r.skipped.iter().take(3).collect();
            tracing::warn!(upstream = %self.name, count = r.skipped.len(), first = ?first, "upstream resources or prompts not served (all on /status)");
        }
        let mut report = self
            .report
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        report.resources = r.resources;
        report.prompts = r.prompts;
        report.skipped.extend(r.skipped);
    }

    /// Reads the upstream's resource `remote` (served as `served`): its contents, each
    /// named by its served URI, Secret values redacted, through the result guard.
    ///
    /// # Errors
    /// The upstream failed, answered something that is not a `ReadResourceResult`, or the
    /// result guard withheld the contents.
    pub async fn read_resource(&self, remote: &str, cx: Option<&CallCtx<'_>>) -> Result<Value, CallError> {
        let r = self
            .forwarded("resources/read", &json!({"uri": remote}), cx)
            .await?;
        let Some(Value::Array(contents)) = r.get("contents") else {
            return Err(CallError::Protocol(
                "a resources/read result without a contents array".into(),
            ));
        };
        let mut out = Vec::with_capacity(contents.len());
        for c in contents {
            let Some(c) = c.as_object() else {
                return Err(CallError::Protocol(
                    "a resource's contents that are not an object".into(),
                ));
            };
            let mut kept = Map::new();
            let uri = c.get("uri").and_then(Value::as_str).unwrap_or(remote);
            kept.insert("uri".into(), Value::String(format!("{}+{uri}", self.name)));
            for f in ["mimeType", "text", "blob"] {
                if let Some(v @ Value::String(_)) = c.get(f) {
                    kept.insert(f.into(), v.clone());
                }
            }
            if kept.contains_key("text") == kept.contains_key("blob") {
                return Err(CallError::Protocol(
                    "a resource's contents need exactly one of text and blob".into(),
                ));
            }
            out.push(Value::Object(kept));
        }
        let mut result = json!({"contents": out});
        self.checked(&mut result)?;
        Ok(result)
    }

    /// Gets the upstream's prompt `remote` with `arguments`: its description and messages,
    /// URIs of embedded resources as served, Secret values redacted, through the result
    /// guard.
    ///
    /// # Errors
    /// The upstream failed, answered something that is not a `GetPromptResult`, or the
    /// result guard withheld it.
    pub async fn get_prompt(
        &self,
        remote: &str,
        arguments: &Value,
        cx: Option<&CallCtx<'_>>,
    ) -> Result<Value, CallError> {
        let r = self
            .forwarded(
                "prompts/get",
                &json!({"name": remote, "arguments": arguments}),
                cx,
            )
            .await?;
        let Some(Value::Array(messages)) = r.get("messages") else {
            return Err(CallError::Protocol(
                "a prompts/get result without a messages array".into(),
            ));
        };
        let mut out = Vec::with_capacity(messages.len());
        for m in messages {
            let role = m.get("role").and_then(Value::as_str);
            let Some(role @ ("user" | "assistant")) = role else {
                return Err(CallError::Protocol(
                    "a prompt message whose role is not user or assistant".into(),
                ));
            };
            let Some(mut content) = m
                .get("content")
                .filter(|c| c.get("type").is_some_and(Value::is_string))
                .cloned()
            else {
                return Err(CallError::Protocol(
                    "a prompt message without a typed content block".into(),
                ));
            };
            self.serve_uris(&mut content);
            out.push(json!({"role": role, "content": content}));
        }
        let mut result = json!({"messages": out});
        if let Some(d) = r.get("description").filter(|d| d.is_string()) {
            result["description"] = d.clone();
        }
        self.checked(&mut result)?;
        Ok(result)
    }

    /// Completes an argument of the upstream's prompt or resource template (`reference`, in
    /// the upstream's own names), as `completion/complete` asks: its values checked (at most
    /// [`MAX_COMPLETIONS`] strings of at most [`MAX_COMPLETION_CHARS`] characters), Secret
    /// values redacted, through the result guard. An upstream that offers no completions
    /// completes nothing.
    ///
    /// # Errors
    /// The upstream failed, answered something that is not a `CompleteResult`, or the result
    /// guard withheld it.
    pub async fn complete(
        &self,
        reference: Value,
        argument: Value,
        context: Option<Value>,
    ) -> Result<Value, CallError> {
        if self.shared.offered.load(Ordering::Relaxed) & COMPLETIONS == 0 {
            return Ok(json!({"completion": {"values": [], "total": 0, "hasMore": false}}));
        }
        let mut params = json!({"ref": reference, "argument": argument});
        if let Some(c) = context {
            params["context"] = c;
        }
        let mut r = self.forwarded("completion/complete", &params, None).await?;
        // Before values are cut: a Secret cut in two would no longer be found whole.
        self.shared.secrets.redact_json(&self.secrets, &mut r);
        let mut result = completion_of(&r)?;
        self.checked(&mut result)?;
        Ok(result)
    }

    /// The URI of a resource a content block embeds or links, as this server serves it.
    pub(super) fn serve_uris(&self, block: &mut Value) {
        let uri = match block.get("type").and_then(Value::as_str) {
            Some("resource") => block.get_mut("resource").and_then(|r| r.get_mut("uri")),
            Some("resource_link") => block.get_mut("uri"),
            _ => None,
        };
        if let Some(Value::String(u)) = uri {
            *u = format!("{}+{u}", self.name);
        }
    }

    /// A request of the upstream's own session, timed and its failures counted as its
    /// calls are.
    /// With `cx` (a 2026-07-28 client's request), the upstream's questions are relayed to
    /// that client as its input round.
    async fn forwarded(
        &self,
        method: &str,
        params: &Value,
        cx: Option<&CallCtx<'_>>,
    ) -> Result<Value, CallError> {
        let start = Instant::now();
        let asked = super::relay::Questions::default();
        let r = match cx {
            Some(cx) => {
                let relay = |m: String, p: Value| -> super::relay::Asking<'_> {
                    Box::pin(self.relay(m, p, cx, &asked))
                };
                let log = super::LogSink {
                    ask: Some(&relay),
                    caps: cx.caps,
                    ..super::LogSink::NONE
                };
                self.request(method, params, log).await
            }
            None => self.request(method, params, super::LogSink::NONE).await,
        };
        self.shared.metrics.requests.observe(start.elapsed());
        if let Err(e) = &r {
            self.shared.metrics.error(e.kind());
        }
        r
    }

    /// Redacts the upstream's Secret values from `v` and passes it through its result
    /// guard.
    fn checked(&self, v: &mut Value) -> Result<(), CallError> {
        self.shared.secrets.redact_json(&self.secrets, v);
        if let Some(g) = &*self.guard.load() {
            let (mut scan, mut verdict) = (Scan::default(), Verdict::default());
            g.check_value(v, &mut scan, &mut verdict);
            if verdict.action == GuardAction::Refuse {
                return Err(CallError::Withheld(verdict.refusal()));
            }
        }
        Ok(())
    }
}

/// An upstream's `CompleteResult`, checked: `completion.values` strings (at most
/// [`MAX_COMPLETIONS`] kept, each cut at [`MAX_COMPLETION_CHARS`] characters, `hasMore` set
/// when some were left out), `total` and `hasMore` kept when well formed.
fn completion_of(r: &Value) -> Result<Value, CallError> {
    let c = r.get("completion");
    let Some(Value::Array(values)) = c.and_then(|c| c.get("values")) else {
        return Err(CallError::Protocol(
            "a completion/complete result without completion.values".into(),
        ));
    };
    let mut kept = Vec::with_capacity(values.len().min(MAX_COMPLETIONS));
    for v in values.iter().take(MAX_COMPLETIONS) {
        let Some(v) = v.as_str() else {
            return Err(CallError::Protocol(
                "a completion value that is not a string".into(),
            ));
        };
        kept.push(Value::String(v.chars().take(MAX_COMPLETION_CHARS).collect()));
    }
    let cut = values.len() > kept.len();
    let mut completion = Map::new();
    completion.insert("values".into(), Value::Array(kept));
    if let Some(t) = c.and_then(|c| c.get("total")).and_then(Value::as_u64) {
        completion.insert("total".into(), json!(t));
    }
    let more = c.and_then(|c| c.get("hasMore")).and_then(Value::as_bool);
    if cut || more.is_some() {
        completion.insert("hasMore".into(), json!(cut || more == Some(true)));
    }
    Ok(json!({"completion": completion}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_say_what_is_imported() {
        assert_eq!(offered(&json!({})), 0);
        assert_eq!(offered(&json!({"capabilities": {"tools": {}}})), 0);
        assert_eq!(
            offered(&json!({"capabilities": {"resources": {}, "prompts": {}}})),
            RESOURCES | PROMPTS
        );
        assert_eq!(
            offered(&json!({"capabilities": {"resources": {"subscribe": true}}})),
            RESOURCES | SUBSCRIBE
        );
        assert_eq!(
            offered(&json!({"capabilities": {"completions": {}}})),
            COMPLETIONS
        );
        // Not an object: not declared.
        assert_eq!(
            offered(&json!({"capabilities": {"resources": true, "prompts": "yes"}})),
            0
        );
    }

    #[test]
    fn an_upstreams_completions_are_checked_and_bounded() {
        let ok = completion_of(&json!({"completion": {"values": ["a", "b"], "total": 9, "hasMore": true}}))
            .unwrap();
        assert_eq!(
            ok,
            json!({"completion": {"values": ["a", "b"], "total": 9, "hasMore": true}})
        );
        // Too many: the first 100, and hasMore; overlong values cut; a bad total dropped.
        let many: Vec<String> = (0..1000).map(|i| format!("v{i}")).collect();
        let c = completion_of(&json!({"completion": {"values": many, "total": -3}})).unwrap();
        assert_eq!(
            c["completion"]["values"].as_array().unwrap().len(),
            MAX_COMPLETIONS
        );
        assert_eq!(c["completion"]["hasMore"], true);
        assert!(c["completion"].get("total").is_none());
        let long = completion_of(&json!({"completion": {"values": ["é".repeat(5000)]}})).unwrap();
        assert_eq!(
            long["completion"]["values"][0].as_str().unwrap().chars().count(),
            MAX_COMPLETION_CHARS
        );
        for bad in [
            json!({}),
            json!({"completion": {"values": "a"}}),
            json!({"completion": {"values": [1]}}),
            json!([]),
        ] {
            assert!(
                matches!(completion_of(&bad), Err(CallError::Protocol(_))),
                "{bad}"
            );
        }
    }
}
