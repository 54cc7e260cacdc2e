//! Leader election on a `coordination.k8s.io/v1` Lease, so several operator replicas can run
//! with one reconciling. Optimistic concurrency (resourceVersion) makes acquisition atomic.
//! A leader that cannot renew before its lease expires exits, and is restarted as a candidate.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};

/// A Lease held by one identity at a time.
#[derive(Clone)]
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    /// How long a lease is valid without renewal.
    pub duration: Duration,
}

impl LeaseLock {
    /// A lock on `namespace/name` for `identity`.
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str, duration: Duration) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
        }
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs() as i32),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// Acquires the lease if it is free or expired, or renews it if held. True when held.
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
        let held_by_me = spec.holder_identity.as_deref() == Some(&self.identity);
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(MicroTime(t)), Some(secs)) => *t + SignedDuration::from_secs(i64::from(secs)) < now,
            _ => true,
        };
        if !held_by_me && !expired {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!held_by_me);
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

    /// Waits until this identity holds the lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election: lease unavailable"),
            }
            tokio::time::sleep(self.duration / 3).await;
        }
    }

    /// Renews every third of the lease duration; returns when the lease is lost.
    pub async fn hold(&self) {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.duration / 3).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: renew failed");
                    if last_ok.elapsed() >= self.duration {
                        return;
                    }
                }
            }
        }
    }
}
