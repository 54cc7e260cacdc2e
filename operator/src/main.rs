//! quiver-operator: parse flags, start logging, run the controller next to the admin server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use quiver_operator::admin::{self, Health};
use quiver_operator::build::Defaults;
use quiver_operator::catalog::{self, Access, Catalog};
use quiver_operator::controller;
use quiver_operator::leader::{self, LeaseLock, Timing};

/// Reconciles McpServer objects into tuned quiver-server Deployments.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Image of quiver-server used when an McpServer names none.
    #[arg(long, env = "QUIVER_SERVER_IMAGE", default_value = "quiver-server:dev")]
    server_image: String,
    /// Pull policy used when an McpServer names none.
    #[arg(long, env = "QUIVER_SERVER_IMAGE_PULL_POLICY", default_value = "IfNotPresent")]
    image_pull_policy: String,
    /// Admin address (/metrics, /healthz, /readyz).
    #[arg(long, env = "QUIVER_OPERATOR_ADMIN_LISTEN", default_value = "0.0.0.0:8081")]
    admin_listen: SocketAddr,
    /// McpServers reconciled at once.
    #[arg(long, env = "QUIVER_OPERATOR_CONCURRENCY", default_value_t = 8)]
    concurrency: u16,
    /// Elect a leader on a Lease so several replicas can run (one reconciles).
    #[arg(long, env = "QUIVER_OPERATOR_LEADER_ELECT")]
    leader_elect: bool,
    /// Seconds a leader lease is valid without renewal.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    lease_duration_seconds: u64,
    /// Seconds a leader keeps acting without a successful renewal (less than the lease duration).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    renew_deadline_seconds: u64,
    /// Seconds between attempts to acquire or renew the lease.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=3600))]
    retry_period_seconds: u64,
    /// Ask ready server pods which config they serve, for status.configLoadedReplicas (the
    /// operator must reach pod IPs; turn off when it runs outside the cluster network).
    #[arg(long, env = "QUIVER_OPERATOR_PROBE_PODS", default_value_t = true, action = clap::ArgAction::Set)]
    probe_pods: bool,
    /// Namespace of the leader-election Lease (default: the pod's namespace, else "default").
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// Reconcile McpServers of these namespaces only (comma-separated), with namespaced
    /// watches that Roles in each can allow; empty: the whole cluster.
    #[arg(long, env = "QUIVER_WATCH_NAMESPACES", value_delimiter = ',')]
    watch_namespaces: Vec<String>,
    /// Give McpServers whose `monitoring.serviceMonitor` is unset a ServiceMonitor.
    #[arg(long, env = "QUIVER_DEFAULT_SERVICE_MONITOR", default_value_t = false, action = clap::ArgAction::Set)]
    default_service_monitor: bool,
    /// A label of every McpServer's ServiceMonitor, KEY=VALUE (repeat it, or separate with
    /// commas), e.g. `release=kube-prometheus-stack` for the Prometheus that selects by it.
    #[arg(long = "service-monitor-label", env = "QUIVER_SERVICE_MONITOR_LABELS", value_delimiter = ',', value_parser = service_monitor_label)]
    service_monitor_labels: Vec<(String, String)>,
    /// Serve the catalog (the MCP Registry API v0.1 over the McpServers) on this address;
    /// off when unset. Every replica serves it, leader or not: see docs/catalog.md.
    #[arg(long, env = "QUIVER_OPERATOR_CATALOG_LISTEN")]
    catalog_listen: Option<SocketAddr>,
    /// Who may read the catalog: `kubernetes` (a bearer token the API server accepts; each
    /// caller sees the McpServers of the namespaces where it may list them) or `none`
    /// (everyone sees every listed McpServer).
    #[arg(long, env = "QUIVER_OPERATOR_CATALOG_AUTH", default_value = "kubernetes", value_parser = ["kubernetes", "none"])]
    catalog_auth: String,
    /// An audience the catalog's callers' tokens must name (repeat it; none: the API
    /// server's own audiences).
    #[arg(
        long = "catalog-audience",
        env = "QUIVER_OPERATOR_CATALOG_AUDIENCES",
        value_delimiter = ','
    )]
    catalog_audiences: Vec<String>,
    /// The first half of every catalog name, `PREFIX.NAMESPACE/NAME` (reverse DNS, e.g.
    /// `com.example.mcp`; at most 60 characters).
    #[arg(long, env = "QUIVER_OPERATOR_CATALOG_PREFIX", default_value = "dev.quiver", value_parser = catalog_prefix)]
    catalog_prefix: String,
    /// Traces of reconciles (OTLP/HTTP; off without an endpoint): see docs/observability.md.
    #[command(flatten)]
    tracing: quiver_otel::TraceArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let traces = quiver_operator::telemetry::init(&args.tracing)?;
    let timing = Timing {
        lease: Duration::from_secs(args.lease_duration_seconds),
        renew_deadline: Duration::from_secs(args.renew_deadline_seconds),
        retry: Duration::from_secs(args.retry_period_seconds),
    }
    .validate()
    .map_err(anyhow::Error::msg)?;
    let client = kube::Client::try_default().await?;
    let health = Arc::new(Health::default());
    let listener = tokio::net::TcpListener::bind(args.admin_listen).await?;
    tracing::info!(addr = %listener.local_addr()?, "admin listening");
    let admin = tokio::spawn(axum::serve(listener, admin::router(health.clone())).into_future());
    let namespaces: Vec<String> = args
        .watch_namespaces
        .iter()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect();
    let catalog = match args.catalog_listen {
        Some(addr) => {
            let access = if args.catalog_auth == "none" {
                Access::Open
            } else {
                Access::kubernetes(client.clone(), args.catalog_audiences, health.metrics.clone())
            };
            let c = Catalog::watch(
                &client,
                &namespaces,
                args.catalog_prefix.clone(),
                access,
                health.metrics.clone(),
            );
            let listener = tokio::net::TcpListener::bind(addr).await?;
            tracing::info!(addr = %listener.local_addr()?, auth = %args.catalog_auth, "catalog listening");
            Some(tokio::spawn(
                axum::serve(listener, catalog::router(c)).into_future(),
            ))
        }
        None => None,
    };
    let defaults = Defaults {
        server_image: args.server_image,
        image_pull_policy: args.image_pull_policy,
        service_monitors: args.default_service_monitor,
        service_monitor_labels: args.service_monitor_labels.into_iter().collect(),
        catalog_prefix: args.catalog_prefix.clone(),
    };
    if !namespaces.is_empty() {
        tracing::info!(
            ?namespaces,
            "namespace-scoped: reconciling McpServers of these namespaces only"
        );
    }
    let run = controller::run(
        client.clone(),
        defaults,
        args.concurrency,
        args.probe_pods,
        health.clone(),
        &namespaces,
    );
    if args.leader_elect {
        let identity =
            std::env::var("POD_NAME").unwrap_or_else(|_| format!("quiver-operator-{}", std::process::id()));
        let lock = LeaseLock::new(
            client,
            &args.lease_namespace,
            "quiver-operator",
            &identity,
            timing,
        );
        if let Err(lost) = leader::lead(&lock, &health, run).await {
            // Another replica may already reconcile: stop at once and restart as a candidate.
            tracing::error!(?lost, "leader election lost; exiting");
            std::process::exit(1);
        }
    } else {
        health.set_leading(true);
        run.await;
    }
    admin.abort();
    if let Some(c) = catalog {
        c.abort();
    }
    if let Some(t) = traces {
        t.shutdown(Duration::from_secs(2)).await;
    }
    Ok(())
}

/// `--catalog-prefix`.
fn catalog_prefix(s: &str) -> Result<String, String> {
    if catalog::entry::valid_prefix(s) {
        Ok(s.to_owned())
    } else {
        Err("expected dot-separated labels of letters, digits and '-', at most 60 characters (e.g. com.example.mcp)".to_owned())
    }
}

/// One `--service-monitor-label` KEY=VALUE.
fn service_monitor_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or("expected KEY=VALUE")?;
    match quiver_operator::build::service_monitor_label_problem(k, v) {
        Some(why) => Err(why),
        None => Ok((k.to_owned(), v.to_owned())),
    }
}
