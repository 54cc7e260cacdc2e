//! The [`Reloader`]: turns new config text into a new registry generation, or keeps the
//! serving one when the text does not compile.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rustc_hash::FxHasher;

use crate::config::{self, ConfigError};
use crate::dispatch::Server;
use crate::registry::ReloadStatus;

/// What a reload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reloaded {
    /// A new generation is serving.
    Swapped(u64),
    /// The content is the same as what is serving.
    Unchanged,
}

/// Config documents by name, as read from a source.
type Sources = Vec<(String, String)>;

/// Applies config text to a server's registry.
#[derive(Debug)]
pub struct Reloader {
    server: Arc<Server>,
    last_input: Mutex<Option<u64>>,
    /// The sources serving now: an upstream whose tools change rebuilds from them.
    serving: Mutex<Option<Arc<Sources>>>,
    /// Held for the whole of a build (config reload or upstream refresh).
    building: Mutex<()>,
    /// The shortest `fetch.refresh` of the OpenAPI sources last loaded.
    openapi_refresh: Mutex<Option<std::time::Duration>>,
    /// Sources whose last apply failed only because an OpenAPI document could not be
    /// fetched: tried again by [`Reloader::follow_openapi`] (an API server that is briefly
    /// away at start does not leave the server unready for good).
    unfetched: Mutex<Option<Arc<Sources>>>,
    /// Whether the last build failed fetching an OpenAPI document.
    fetch_failed: std::sync::atomic::AtomicBool,
}

/// Upstream tool changes rebuild the registry at most once per this interval.
const UPSTREAM_REBUILD_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Reloader {
    /// A reloader for `server`.
    pub fn new(server: Arc<Server>) -> Arc<Self> {
        Arc::new(Self {
            server,
            last_input: Mutex::new(None),
            serving: Mutex::new(None),
            building: Mutex::new(()),
            openapi_refresh: Mutex::new(None),
            unfetched: Mutex::new(None),
            fetch_failed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Parses, validates and compiles `sources` and swaps the result in.
    ///
    /// # Errors
    /// The config is invalid; the serving registry is untouched.
    pub fn apply(&self, sources: &[(String, String)]) -> Result<Reloaded, ConfigError> {
        let mut h = FxHasher::default();
        sources.hash(&mut h);
        let input = h.finish();
        // Remembered whatever the outcome: the same text is not compiled again.
        if let Ok(mut last) = self.last_input.lock() {
            if *last == Some(input) {
                return Ok(Reloaded::Unchanged);
            }
            *last = Some(input);
        }
        // One build at a time, and the sources it served recorded before the next starts:
        // a refresh for an upstream's new tools never swaps back a config replaced meanwhile.
        let _one = self
            .building
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let r = self.traced_build(false, sources);
        if r.is_ok()
            && let Ok(mut s) = self.serving.lock()
        {
            *s = Some(Arc::new(sources.to_vec()));
        }
        if let Ok(mut u) = self.unfetched.lock() {
            let retry = r.is_err() && self.fetch_failed.load(std::sync::atomic::Ordering::Relaxed);
            *u = retry.then(|| Arc::new(sources.to_vec()));
        }
        r
    }

    /// Applies the sources whose documents could not be fetched, once more.
    pub(super) fn retry_unfetched(&self) -> Option<Result<Reloaded, ConfigError>> {
        let sources = self.unfetched.lock().ok()?.clone()?;
        let _one = self
            .building
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A newer apply may have come meanwhile.
        let still = self
            .unfetched
            .lock()
            .ok()?
            .as_ref()
            .is_some_and(|u| Arc::ptr_eq(u, &sources));
        if !still {
            return None;
        }
        let r = self.traced_build(false, &sources);
        if r.is_ok() {
            if let Ok(mut s) = self.serving.lock() {
                *s = Some(Arc::clone(&sources));
            }
            if let Ok(mut u) = self.unfetched.lock() {
                *u = None;
            }
        }
        Some(r)
    }

    /// Builds the registry again from the serving sources, with the tools the upstreams
    /// list now (called when an upstream's tool list changed).
    pub fn refresh(&self) -> Result<Reloaded, ConfigError> {
        let _one = self
            .building
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let sources = self.serving.lock().ok().and_then(|s| s.clone());
        match sources {
            Some(s) => self.traced_build(true, &s),
            None => Ok(Reloaded::Unchanged),
        }
    }

    /// Refreshes (see [`Reloader::refresh`]) each time an upstream's tool list changes, for
    /// as long as the server runs.
    pub fn follow_upstreams(self: &Arc<Self>) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                this.server.exec.upstreams.changed().notified().await;
                let r = Arc::clone(&this);
                match tokio::task::spawn_blocking(move || r.refresh()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "rebuilding with new upstream tools failed"),
                    Err(e) => tracing::error!(error = %e, "rebuilding with new upstream tools failed"),
                }
                // Upstreams that keep changing rebuild the registry at most this often (what
                // changed meanwhile is picked up by the next rebuild).
                tokio::time::sleep(UPSTREAM_REBUILD_INTERVAL).await;
            }
        });
    }

    /// Fetches the OpenAPI documents with a `fetch.refresh` again that often (sending their
    /// ETags: an unchanged document is not transferred again) and rebuilds from the serving
    /// sources; a changed document swaps the tools, a failed fetch keeps them. Sources
    /// refused only because a document could not be fetched are tried again every 10s, and
    /// at once when a Secret or ConfigMap a fetch reads changes (a document kept in a
    /// ConfigMap is read again when it is edited).
    pub fn follow_openapi(self: &Arc<Self>) {
        let this = Arc::clone(self);
        let mut changes = self.server.exec.secrets.fetched_changes();
        let mut open = true;
        tokio::spawn(async move {
            loop {
                let every = this.openapi_refresh.lock().ok().and_then(|r| *r);
                let retry = this.unfetched.lock().is_ok_and(|u| u.is_some());
                let wait = match every {
                    Some(e) if !retry => e,
                    _ => config::openapi::REFRESH_RANGE.0,
                };
                // A Secret or ConfigMap a fetch reads (a document in a ConfigMap) changed:
                // read it again now.
                let changed = tokio::select! {
                    () = tokio::time::sleep(wait) => false,
                    r = changes.changed(), if open => {
                        open = r.is_ok();
                        open
                    }
                };
                if every.is_none() && !retry && !changed {
                    continue;
                }
                let r = Arc::clone(&this);
                let again = move || r.retry_unfetched().unwrap_or_else(|| r.refresh());
                match tokio::task::spawn_blocking(again).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "refreshing OpenAPI documents failed; still serving the previous tools")
                    }
                    Err(e) => tracing::error!(error = %e, "refreshing OpenAPI documents failed"),
                }
            }
        });
    }

    /// [`Self::build`] in a span of its own when tracing is on (`rebuild`: for an
    /// upstream's tools, not new config text).
    fn traced_build(&self, rebuild: bool, sources: &[(String, String)]) -> Result<Reloaded, ConfigError> {
        let span = crate::otel::spans::reload(rebuild);
        let r = self.build(sources);
        if let Some(cx) = &span {
            let (result, generation, problems) = match &r {
                Ok(Reloaded::Swapped(g)) => ("success", Some(*g), 0),
                Ok(Reloaded::Unchanged) => ("unchanged", None, 0),
                Err(e) => ("invalid", None, e.problems.len()),
            };
            crate::otel::spans::end_reload(cx, result, generation, problems);
        }
        r
    }

    fn build(&self, sources: &[(String, String)]) -> Result<Reloaded, ConfigError> {
        let start = Instant::now();
        let metrics = &self.server.metrics;
        let registry = &self.server.registry;
        self.fetch_failed
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let loaded = config::load(sources).and_then(|mut ts| {
            config::openapi::read_files(&mut ts.openapi);
            let secrets = &self.server.exec.secrets;
            secrets.configure_fetches(&super::fetch::fetch_refs(&ts.openapi));
            let fetched = super::fetch::fetch_documents(&mut ts.openapi, &secrets.snapshot());
            self.fetch_failed
                .store(fetched.is_err(), std::sync::atomic::Ordering::Relaxed);
            if let Ok(mut r) = self.openapi_refresh.lock()
                && let Ok(refresh) = &fetched
            {
                *r = *refresh;
            }
            fetched.map(|_| ts)
        });
        let compiled = loaded
            .and_then(|ts| config::compile(&ts))
            .and_then(|c| self.served(c));
        let mut compiled = match compiled {
            Ok(c) => c,
            Err(e) => {
                self.record("invalid", e.problems.iter().map(ToString::to_string).collect());
                return Err(e);
            }
        };
        // The Secrets first: upstream processes start with their values.
        let refs: Vec<crate::config::SecretRef> = compiled
            .tools
            .iter()
            .flat_map(|t| t.handler.secrets().iter().cloned())
            .chain(compiled.upstreams.iter().flat_map(|u| u.secrets.iter().cloned()))
            .collect();
        self.server.exec.secrets.configure(&refs);
        let links = self.server.exec.upstreams.configure(&compiled.upstreams, metrics);
        self.server.exec.upstreams.expand(&mut compiled, &links, metrics);
        let prev = registry.load_full();
        if registry.is_ready()
            && prev.hash == compiled.hash
            && prev.config.upstream_digest == compiled.upstream_digest
        {
            self.record("unchanged", Vec::new());
            return Ok(Reloaded::Unchanged);
        }
        // The ToolSet's own, or what upstreams list (their entries as served). Subscribers
        // are told of the ToolSet's own (an upstream tells of its own resources).
        let own_resources_changed = prev.config.spec.resources != compiled.spec.resources;
        let resources_changed = own_resources_changed
            || !prev
                .config
                .resources
                .iter()
                .map(|r| &r.descriptor)
                .eq(compiled.resources.iter().map(|r| &r.descriptor));
        let prompts_changed = prev.config.spec.prompts != compiled.spec.prompts
            || !prev
                .config
                .prompts
                .iter()
                .map(|p| &p.descriptor)
                .eq(compiled.prompts.iter().map(|p| &p.descriptor));
        preload_encodings(&compiled);
        let next = registry.swap_linked(compiled, links, metrics);
        metrics.reload_duration.observe(start.elapsed());
        self.record("success", Vec::new());
        if prev.generation > 0 {
            self.server.notify("notifications/tools/list_changed");
            if resources_changed {
                self.server.notify("notifications/resources/list_changed");
            }
            if own_resources_changed {
                self.server.resources_updated(&prev, &next);
            }
            if prompts_changed {
                self.server.notify("notifications/prompts/list_changed");
            }
        }
        tracing::info!(generation = next.generation, hash = %next.hash, tools = next.tools.len(), elapsed_us = start.elapsed().as_micros() as u64, "config loaded");
        // The previous snapshot (unless a request still holds it) and the compile's garbage
        // are free now: give their pages back.
        drop(prev);
        #[cfg(feature = "jemalloc")]
        crate::alloc::release_free_memory();
        Ok(Reloaded::Swapped(next.generation))
    }

    /// Refuses what compiles but this server cannot serve: an upstream with
    /// `identity.mode: user` without the server's upstream sign-in.
    fn served(&self, c: config::CompiledToolSet) -> Result<config::CompiledToolSet, ConfigError> {
        if self.server.exec.identity.sign_in().is_some() {
            return Ok(c);
        }
        let problems: Vec<crate::spec::context::Problem> = c
            .upstreams
            .iter()
            .enumerate()
            .filter(|(_, u)| {
                u.identity
                    .as_ref()
                    .is_some_and(|i| i.mode == crate::spec::identity::IdentityMode::User)
            })
            .map(|(i, _)| crate::spec::context::Problem {
                path: format!("upstreams[{i}].identity.mode"),
                message: "`user` needs this server's upstream sign-in (--upstream-sign-in-url, --upstream-sign-in-keys and --upstream-sign-in-client-id, with --auth-issuer); see docs/upstreams.md".into(),
            })
            .collect();
        if problems.is_empty() {
            Ok(c)
        } else {
            Err(ConfigError { problems })
        }
    }

    /// Counts a reload outcome and keeps it for `/status`.
    fn record(&self, result: &'static str, problems: Vec<String>) {
        self.server.metrics.reload(result);
        self.server.registry.set_last_reload(ReloadStatus {
            result: result.into(),
            at_unix: now_unix(),
            problems,
        });
    }

    /// Applies and logs, for watchers.
    pub fn apply_logged(&self, origin: &str, sources: &[(String, String)]) {
        if let Err(e) = self.apply(sources) {
            tracing::warn!(source = origin, error = %e, "config rejected; still serving the previous tools");
        }
    }

    /// [`Reloader::apply_logged`] on a blocking thread: parsing and compiling a large ToolSet
    /// takes milliseconds of CPU that must not be taken from the request workers.
    pub async fn apply_off_workers(self: &Arc<Self>, origin: String, sources: Vec<(String, String)>) {
        let this = Arc::clone(self);
        if let Err(e) = tokio::task::spawn_blocking(move || this.apply_logged(&origin, &sources)).await {
            tracing::error!(error = %e, "config reload task failed; still serving the previous tools");
        }
    }
}

/// Loads the token encodings the tools' budgets count in (a vocabulary's index and its
/// expression: tens of milliseconds), so that no call waits for them.
fn preload_encodings(c: &config::CompiledToolSet) {
    let mut loaded = Vec::with_capacity(2);
    let budgets = c
        .tools
        .iter()
        .filter_map(|t| t.governance.result_guard.as_ref().and_then(|g| g.tokens));
    for b in budgets {
        let enc = crate::tokens::Encoding::from(b.encoding);
        if !loaded.contains(&enc) {
            enc.load();
            loaded.push(enc);
        }
    }
}
