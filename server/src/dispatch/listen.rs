//! `subscriptions/listen` (2026-07-28): the stream a listen opens, what it asked for, and
//! how each event becomes its tagged notification.

use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::cancel::CancelEntry;
use super::server::{Event, EventKind};
use crate::protocol;

/// Most resource URIs one listen may watch.
pub const MAX_LISTEN_URIS: usize = 1_024;

/// An accepted `subscriptions/listen`: the transport opens its stream with
/// [`Listen::acknowledgement`], then sends the events [`Listen::wants`], each tagged with
/// the subscription's id; until the client goes away, [`Listen::cancellation`] fires, or the server
/// stops (then [`Listen::closing`] ends it).
#[derive(Debug)]
pub struct Listen {
    /// The request's id: the subscription's id.
    pub id: Box<RawValue>,
    /// What it asked for (all of which this server honours).
    pub filter: ListenFilter,
    /// The registration of its resource URIs, removed when the listen ends.
    pub registration: Option<ListenRegistration>,
    /// In a session: what `notifications/cancelled` naming the listen's id cancels,
    /// registered while the listen lives.
    pub(super) cancel: Option<(CancellationToken, CancelEntry)>,
}

/// The notification filter of a `subscriptions/listen`.
#[derive(Debug, Default, Clone, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenFilter {
    /// `notifications/tools/list_changed`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tools_list_changed: bool,
    /// `notifications/prompts/list_changed`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prompts_list_changed: bool,
    /// `notifications/resources/list_changed`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resources_list_changed: bool,
    /// `notifications/resources/updated` for these URIs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_subscriptions: Vec<String>,
}

/// Resource URIs watched by open listens, counted, so that a reload knows which resources to
/// compare. Dropped with its listen.
#[derive(Debug)]
pub struct ListenRegistration {
    watched: Arc<Mutex<FxHashMap<Box<str>, usize>>>,
    uris: Vec<String>,
}

impl ListenRegistration {
    /// Counts `uris` as watched in `watched` until dropped.
    pub(super) fn new(watched: &Arc<Mutex<FxHashMap<Box<str>, usize>>>, uris: &[String]) -> Self {
        if let Ok(mut w) = watched.lock() {
            for u in uris {
                *w.entry(u.as_str().into()).or_default() += 1;
            }
        }
        Self {
            watched: watched.clone(),
            uris: uris.to_vec(),
        }
    }
}

impl Drop for ListenRegistration {
    fn drop(&mut self) {
        if let Ok(mut w) = self.watched.lock() {
            for u in &self.uris {
                if let Some(n) = w.get_mut(u.as_str()) {
                    *n -= 1;
                    if *n == 0 {
                        w.remove(u.as_str());
                    }
                }
            }
        }
    }
}

impl Listen {
    fn tagged(&self, method: &str, extra: Option<(&str, Value)>) -> Vec<u8> {
        let mut params = Map::new();
        params.insert(
            "_meta".into(),
            json!({"io.modelcontextprotocol/subscriptionId": serde_json::from_str::<Value>(self.id.get()).unwrap_or(Value::Null)}),
        );
        if let Some((k, v)) = extra {
            params.insert(k.into(), v);
        }
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "method": method, "params": params})).unwrap_or_default()
    }

    /// `notifications/subscriptions/acknowledged`, the stream's first message.
    pub fn acknowledgement(&self) -> Vec<u8> {
        self.tagged(
            "notifications/subscriptions/acknowledged",
            Some((
                "notifications",
                serde_json::to_value(&self.filter).unwrap_or_default(),
            )),
        )
    }

    /// The event as this subscription's notification, if it asked for it.
    pub fn wants(&self, e: &Event) -> Option<Vec<u8>> {
        let f = &self.filter;
        match &e.kind {
            EventKind::ToolsChanged if f.tools_list_changed => {
                Some(self.tagged("notifications/tools/list_changed", None))
            }
            EventKind::PromptsChanged if f.prompts_list_changed => {
                Some(self.tagged("notifications/prompts/list_changed", None))
            }
            EventKind::ResourcesChanged if f.resources_list_changed => {
                Some(self.tagged("notifications/resources/list_changed", None))
            }
            EventKind::ResourceUpdated(uri)
                if e.session.is_none() && f.resource_subscriptions.iter().any(|u| u == &**uri) =>
            {
                Some(self.tagged("notifications/resources/updated", Some(("uri", json!(&**uri)))))
            }
            _ => None,
        }
    }

    /// The graceful end of the subscription (server shutdown): its response.
    pub fn closing(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        protocol::write_result(
            &mut out,
            &self.id,
            format!(
                "{{\"resultType\":\"complete\",\"_meta\":{{\"io.modelcontextprotocol/subscriptionId\":{}}}}}",
                self.id.get()
            )
            .as_bytes(),
        );
        out
    }

    /// What ends the listen early: a `notifications/cancelled` naming its id in its session
    /// (a listen without a session ends only when its stream does). Never fires otherwise.
    pub fn cancellation(&self) -> CancellationToken {
        self.cancel.as_ref().map(|(t, _)| t.clone()).unwrap_or_default()
    }
}
