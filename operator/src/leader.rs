//! Leader election on a `coordination.k8s.io/v1` Lease, so several operator replicas can run
//! with one reconciling (the scheme of client-go's leaderelection):
//!
//! - Optimistic concurrency (resourceVersion) makes taking the lease atomic.
//! - A candidate judges expiry by its own monotonic clock: the lease is free once its record
//!   has not changed for a lease duration since this candidate first saw that record (no
//!   comparison of wall clocks across machines). A released lease (no holder) is free at once.
//! - The leader renews every retry period and stops leading (the process exits) when no
//!   renewal succeeded for the renew deadline, which is shorter than the lease duration: it
//!   has stopped acting before any candidate can consider the lease expired.
//! - On a graceful shutdown the leader releases the lease, so a standby takes over at its next
//!   attempt instead of after a lease duration.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use crate::admin::Health;

/// Timing of the election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long a lease is valid without renewal.
    pub lease: Duration,
    /// How long a leader keeps acting without a successful renewal (less than `lease`).
    pub renew_deadline: Duration,
    /// Time between attempts to acquire or renew.
    pub retry: Duration,
}

impl Timing {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry period.
    pub const DEFAULT: Self = Self {
        lease: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry: Duration::from_secs(2),
    };

    /// Checks `retry < renew_deadline < lease`.
    ///
    /// # Errors
    /// A message naming the violated order.
    pub fn validate(self) -> Result<Self, String> {
        if self.retry.is_zero() || self.retry >= self.renew_deadline || self.renew_deadline >= self.lease {
            return Err(format!(
                "leader election needs 0 < retry period ({:?}) < renew deadline ({:?}) < lease duration ({:?})",
                self.retry, self.renew_deadline, self.lease
            ));
        }
        Ok(self)
    }
}

/// Why a leader stopped leading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// Another identity holds the lease.
    Taken,
    /// No renewal succeeded within the renew deadline.
    RenewDeadline,
}

/// A Lease held by one identity at a time.
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    /// The lease record (resourceVersion) last seen, and when this process first saw it.
    observed: Mutex<Option<(String, Instant)>>,
}

impl std::fmt::Debug for LeaseLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseLock")
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("timing", &self.timing)
            .finish_non_exhaustive()
    }
}

impl LeaseLock {
    /// A lock on `namespace/name` for `identity`.
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str, timing: Timing) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            timing,
            observed: Mutex::new(None),
        }
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.timing.lease.as_secs().max(1)).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// Whether the lease record `rv` has gone unchanged for a lease duration, as measured
    /// from when this process first saw it.
    fn unchanged_for_a_lease(&self, rv: &str) -> bool {
        let mut observed = self.observed.lock().unwrap_or_else(PoisonError::into_inner);
        match &*observed {
            Some((seen, since)) if seen == rv => since.elapsed() >= self.timing.lease,
            _ => {
                *observed = Some((rv.to_owned(), Instant::now()));
                false
            }
        }
    }

    /// Acquires the lease if it is free, released or expired, or renews it if held. True when held.
    ///
    /// # Errors
    /// API errors other than losing a race (409), which reads as "not held".
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let Some(current) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(now, None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty());
        let held_by_me = holder == Some(self.identity.as_str());
        let rv = current.metadata.resource_version.clone().unwrap_or_default();
        let free = holder.is_none() || self.unchanged_for_a_lease(&rv);
        if !held_by_me && !free {
            return Ok(false);
        }
        let transitions = spec
            .lease_transitions
            .unwrap_or(0)
            .saturating_add(i32::from(!held_by_me));
        let acquired = if held_by_me {
            spec.acquire_time.clone()
        } else {
            None
        };
        let mut next = current;
        next.spec = Some(self.spec(now, acquired, transitions));
        match self.api.replace(&self.name, &PostParams::default(), &next).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until this identity holds the lease. `health.lease_ok` follows whether the API
    /// server answers: a standby that can reach it is ready to take over.
    pub async fn acquire(&self, health: &Health) {
        let mut last_answer = Instant::now();
        loop {
            match self.try_acquire_or_renew().await {
                Ok(held) => {
                    last_answer = Instant::now();
                    health.lease_ok.store(true, Ordering::Release);
                    if held {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: lease unavailable");
                    if last_answer.elapsed() >= self.timing.lease {
                        health.lease_ok.store(false, Ordering::Release);
                    }
                }
            }
            tokio::time::sleep(self.timing.retry).await;
        }
    }

    /// Renews every retry period; returns when the lease was taken or no renewal succeeded
    /// within the renew deadline (each attempt is cut off at the deadline too).
    pub async fn hold(&self) -> Lost {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.timing.retry).await;
            let left = self.timing.renew_deadline.saturating_sub(renewed.elapsed());
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => renewed = Instant::now(),
                Ok(Ok(false)) => return Lost::Taken,
                Ok(Err(e)) => tracing::warn!(error = %e, "leader election: renew failed"),
                Err(_) => tracing::warn!("leader election: renew timed out"),
            }
            if renewed.elapsed() >= self.timing.renew_deadline {
                return Lost::RenewDeadline;
            }
        }
    }

    /// Gives the lease up (graceful shutdown), so a standby takes it at its next attempt.
    ///
    /// # Errors
    /// API errors; a lease held by someone else is left alone.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut current) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = current.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.api
            .replace(&self.name, &PostParams::default(), &current)
            .await
            .map(drop)
    }
}

/// Resolves on SIGTERM or SIGINT sent after this call. The listeners are registered here,
/// not at the first poll: a signal sent before the future is polled is not lost.
fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let (term, int) = (
        signal(SignalKind::terminate()).ok(),
        signal(SignalKind::interrupt()).ok(),
    );
    async move {
        let recv = |s: Option<tokio::signal::unix::Signal>| async move {
            match s {
                Some(mut s) => drop(s.recv().await),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = recv(term) => {}
            () = recv(int) => {}
        }
    }
}

/// Stands by until `lock` is held, then runs `work` while renewing it. Returns when `work`
/// ends (a graceful shutdown: the lease is released) or when a standby is asked to shut down.
///
/// A signal is listened for from the start, also while `work` starts: the controller's own
/// listener exists only once it runs, and a leader that missed the signal would keep
/// renewing the lease. On a signal `work` gets the renew deadline to finish its reconciles
/// (the lease is renewed meanwhile); then the lease is released.
///
/// # Errors
/// The lease was lost while leading: the caller must stop acting at once (exit), since
/// another replica may already reconcile.
pub async fn lead(lock: &LeaseLock, health: &Health, work: impl Future<Output = ()>) -> Result<(), Lost> {
    let mut stop = std::pin::pin!(shutdown_signal());
    health.set_leading(false);
    tracing::info!(identity = %lock.identity, "standing by for the leader lease");
    tokio::select! {
        () = lock.acquire(health) => {}
        () = &mut stop => return Ok(()),
    }
    health.set_leading(true);
    tracing::info!(identity = %lock.identity, "leading");
    let mut work = Box::pin(work);
    let finished = tokio::select! {
        () = &mut work => Ok(()),
        () = &mut stop => tokio::select! {
            _ = tokio::time::timeout(lock.timing.renew_deadline, &mut work) => Ok(()),
            lost = lock.hold() => Err(lost),
        },
        lost = lock.hold() => Err(lost),
    };
    // Whatever is left of it (a signal it missed) stops before another replica may lead.
    drop(work);
    match finished {
        Ok(()) => {
            if let Err(e) = lock.release().await {
                tracing::warn!(error = %e, "could not release the leader lease; a standby takes over when it expires");
            }
            Ok(())
        }
        Err(lost) => {
            health.set_leading(false);
            Err(lost)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_renew_deadline_must_end_before_the_lease() {
        assert_eq!(Timing::DEFAULT.validate(), Ok(Timing::DEFAULT));
        let s = Duration::from_secs;
        for (lease, renew, retry) in [(10, 10, 2), (10, 12, 2), (10, 5, 5), (10, 5, 0)] {
            let t = Timing {
                lease: s(lease),
                renew_deadline: s(renew),
                retry: s(retry),
            };
            assert!(t.validate().is_err(), "{t:?}");
        }
    }
}
