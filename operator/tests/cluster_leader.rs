//! Two and three operator processes with `--leader-elect` against a real kube-apiserver: a
//! rolling update done by hand. Every replica reports `/readyz` 200 while exactly one leads
//! (`quiver_operator_leader`); a replacement joins as a Ready standby; the leader stopped
//! with SIGTERM hands over at once (it releases the Lease); a leader killed with SIGKILL is
//! replaced once its lease expires; and the new leader reconciles.
//!
//! Run by `scripts/operator-it.sh` before the shared operator starts: while these replicas
//! lead they reconcile every McpServer of the cluster, so no other operator may run.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use quiver_operator::crd::McpServer;
use serde_json::json;
use tokio::process::{Child, Command};

/// Lease timing of the replicas (seconds): short, so the test is quick.
const LEASE: u64 = 4;
const RENEW_DEADLINE: u64 = 3;
const RETRY: u64 = 1;

struct Replica {
    identity: String,
    admin: u16,
    child: Child,
}

impl Replica {
    fn start(identity: &str, lease_ns: &str) -> Self {
        let admin = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_quiver-operator"))
            .args([
                "--leader-elect",
                "--probe-pods=false",
                &format!("--admin-listen=127.0.0.1:{admin}"),
                &format!("--lease-namespace={lease_ns}"),
                &format!("--lease-duration-seconds={LEASE}"),
                &format!("--renew-deadline-seconds={RENEW_DEADLINE}"),
                &format!("--retry-period-seconds={RETRY}"),
            ])
            .env("POD_NAME", identity)
            .env("RUST_LOG", "info,kube=warn")
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("the quiver-operator binary runs");
        Self {
            identity: identity.to_owned(),
            admin,
            child,
        }
    }

    async fn get(&self, path: &str) -> Option<(u16, String)> {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-m",
                "2",
                "-w",
                "\n%{http_code}",
                &format!("http://127.0.0.1:{}{path}", self.admin),
            ])
            .output()
            .await
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n')?;
        Some((code.parse().ok()?, body.to_owned()))
    }

    /// `/readyz` answers 200.
    async fn ready(&self) -> bool {
        self.get("/readyz").await.is_some_and(|(code, _)| code == 200)
    }

    /// The `quiver_operator_leader` gauge.
    async fn leads(&self) -> Option<bool> {
        let (_, metrics) = self.get("/metrics").await?;
        let value = metrics
            .lines()
            .find_map(|l| l.strip_prefix("quiver_operator_leader "))?;
        Some(value.trim() == "1")
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("still running").to_string();
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    }
}

/// Waits until every replica is Ready and exactly one leads, and the Lease names it; returns
/// the leader's identity.
async fn one_leader(ns: &TempNs, replicas: &[&Replica], secs: u64) -> String {
    eventually(secs, "every replica Ready and exactly one leader", || async {
        let mut leaders = Vec::new();
        for r in replicas {
            if !r.ready().await {
                return None;
            }
            if r.leads().await? {
                leaders.push(*r);
            }
        }
        let [leader] = leaders[..] else { return None };
        let lease = ns.api::<Lease>().get_opt("quiver-operator").await.ok()??;
        let holder = lease.spec?.holder_identity?;
        (holder == leader.identity).then_some(holder)
    })
    .await
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn replicas_are_ready_while_one_leads_and_a_standby_takes_over() {
    with_ns("q-replicas", |ns| async move {
        let a = Replica::start("replica-a", &ns.name);
        let b = Replica::start("replica-b", &ns.name);
        let first = one_leader(&ns, &[&a, &b], 60).await;
        println!("{first} leads; both replicas Ready");

        // The leader reconciles.
        ns.apply_yaml(&sample("calculator.yaml")).await;
        ns.wait_condition("calculator", "Ready", "True", 90).await;

        // Rolling update: a replacement joins as a Ready standby next to the leader...
        let c = Replica::start("replica-c", &ns.name);
        let leader = one_leader(&ns, &[&a, &b, &c], 30).await;
        assert_eq!(leader, first, "a new replica does not take the lease");
        // ...then the old leader gets SIGTERM: it releases the lease and exits cleanly.
        let (mut old, rest) = if a.identity == first { (a, b) } else { (b, a) };
        old.signal("-TERM");
        let start = Instant::now();
        let exit = tokio::time::timeout(Duration::from_secs(30), old.child.wait())
            .await
            .expect("the leader exits after SIGTERM")
            .unwrap();
        assert!(exit.success(), "a graceful shutdown exits 0: {exit:?}");
        let second = one_leader(&ns, &[&rest, &c], 15).await;
        let handover = start.elapsed();
        println!("SIGTERM: {second} leads {handover:?} after the signal");
        assert!(
            handover < Duration::from_secs(LEASE + 2 * RETRY + 3),
            "a released lease is taken without waiting for it to expire: {handover:?}"
        );

        // A crash (SIGKILL) releases nothing: the standby waits out the lease, no longer.
        let (mut crashed, standby) = if rest.identity == second {
            (rest, c)
        } else {
            (c, rest)
        };
        crashed.signal("-KILL");
        let start = Instant::now();
        crashed.child.wait().await.unwrap();
        let third = one_leader(&ns, &[&standby], 2 * LEASE + 20).await;
        let takeover = start.elapsed();
        println!("SIGKILL: {third} leads {takeover:?} after the crash");
        assert_eq!(third, standby.identity);
        assert!(
            takeover < Duration::from_secs(LEASE + 2 * RETRY + 5),
            "the standby takes over once the lease expires: {takeover:?}"
        );

        // The new leader acts: a tools edit reaches the rendered ConfigMap.
        let patch = json!({"spec": {"tools": [{"name": "after-takeover", "handler": {"builtin": "now"}}]}});
        ns.api::<McpServer>()
            .patch("calculator", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        eventually(30, "the new leader renders the edit", || async {
            let cm = ns.api::<ConfigMap>().get("calculator-tools").await.ok()?;
            cm.data?
                .get("tools.yaml")?
                .contains("after-takeover")
                .then_some(())
        })
        .await;
        drop(standby);
    })
    .await;
}
