//! quiver-operator: parse flags, start logging, run the controller next to the admin server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use quiver_operator::admin::{self, Health};
use quiver_operator::build::Defaults;
use quiver_operator::catalog::{self, Access, Catalog};
use quiver_operator::console::{self, Console};
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
    /// Serve the console (read-only web pages over the catalog's McpServers, behind an
    /// OpenID Connect sign-in) on this address; off when unset. Needs --console-url and
    /// --console-issuer; see docs/console.md.
    #[arg(long, env = "QUIVER_OPERATOR_CONSOLE_LISTEN")]
    console_listen: Option<SocketAddr>,
    /// Where browsers reach the console (`https://console.example.com`); the sign-in returns
    /// to URL/callback, and cookies are `Secure` when it is https.
    #[arg(long, env = "QUIVER_OPERATOR_CONSOLE_URL", value_parser = console_url)]
    console_url: Option<String>,
    /// The OpenID provider users sign in at (its discovery document is read from
    /// ISSUER/.well-known/openid-configuration).
    #[arg(long, env = "QUIVER_OPERATOR_CONSOLE_ISSUER", value_parser = console_issuer)]
    console_issuer: Option<String>,
    /// The console's client id at the provider: a public client with PKCE (S256) whose
    /// access tokens the McpServers accept (their audience).
    #[arg(
        long,
        env = "QUIVER_OPERATOR_CONSOLE_CLIENT_ID",
        default_value = "quiver-console"
    )]
    console_client_id: String,
    /// Scopes the sign-in asks for (space-separated; `openid` is needed).
    #[arg(
        long,
        env = "QUIVER_OPERATOR_CONSOLE_SCOPES",
        default_value = "openid profile"
    )]
    console_scopes: String,
    /// The ID token claim that names the user to Kubernetes reviews (as the API server's
    /// own OpenID settings name it).
    #[arg(long, env = "QUIVER_OPERATOR_CONSOLE_USERNAME_CLAIM", default_value = "sub")]
    console_username_claim: String,
    /// Put before the user name in reviews.
    #[arg(
        long,
        env = "QUIVER_OPERATOR_CONSOLE_USERNAME_PREFIX",
        default_value = "oidc:"
    )]
    console_username_prefix: String,
    /// The ID token claim listing the user's groups (a dotted path is followed).
    #[arg(long, env = "QUIVER_OPERATOR_CONSOLE_GROUPS_CLAIM", default_value = "groups")]
    console_groups_claim: String,
    /// Put before each group in reviews.
    #[arg(long, env = "QUIVER_OPERATOR_CONSOLE_GROUPS_PREFIX", default_value = "oidc:")]
    console_groups_prefix: String,
    /// Which URL of a server the console lists tools and calls them at: `service` (its
    /// in-cluster Service) or `listed` (the first URL the catalog lists, e.g. its Ingress:
    /// for a console outside the cluster).
    #[arg(long, env = "QUIVER_OPERATOR_CONSOLE_REACH", default_value = "service", value_parser = ["service", "listed"])]
    console_reach: String,
    /// Prometheus (`http://prometheus-operated.monitoring:9090`), for each server's last
    /// hour on its console page: calls, errors and latency by tool, refusals, upstreams.
    #[arg(long, env = "QUIVER_OPERATOR_CONSOLE_PROMETHEUS", value_parser = console_url)]
    console_prometheus: Option<String>,
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
    let catalog = (args.catalog_listen.is_some() || args.console_listen.is_some())
        .then(|| catalog_of(&args, &client, &namespaces, &health));
    let mut servers = Vec::new();
    if let (Some(addr), Some(c)) = (args.catalog_listen, &catalog) {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        tracing::info!(addr = %listener.local_addr()?, auth = %args.catalog_auth, "catalog listening");
        servers.push(tokio::spawn(
            axum::serve(listener, catalog::router(c.clone())).into_future(),
        ));
    }
    if let (Some(addr), Some(c)) = (args.console_listen, &catalog) {
        let (console, url) = console_of(&args, c.clone())?;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        tracing::info!(addr = %listener.local_addr()?, %url, "console listening");
        servers.push(tokio::spawn(
            axum::serve(listener, console::router(console)).into_future(),
        ));
    }
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
    for s in servers {
        s.abort();
    }
    if let Some(t) = traces {
        t.shutdown(Duration::from_secs(2)).await;
    }
    Ok(())
}

/// The catalog the console and the Registry API serve: McpServers of `namespaces` (all
/// when empty), with the access `--catalog-auth` names.
fn catalog_of(args: &Args, client: &kube::Client, namespaces: &[String], health: &Health) -> Arc<Catalog> {
    let access = if args.catalog_auth == "none" {
        Access::Open
    } else {
        Access::kubernetes(
            client.clone(),
            args.catalog_audiences.clone(),
            health.metrics.clone(),
        )
    };
    Catalog::watch(
        client,
        namespaces,
        args.catalog_prefix.clone(),
        access,
        health.metrics.clone(),
    )
}

/// The console the `--console-*` flags describe, over `catalog`, and its public URL.
fn console_of(args: &Args, catalog: Arc<Catalog>) -> anyhow::Result<(Arc<Console>, String)> {
    let (Some(url), Some(issuer)) = (args.console_url.clone(), args.console_issuer.clone()) else {
        anyhow::bail!("--console-listen needs --console-url (where browsers reach it) and --console-issuer");
    };
    let config = console::oidc::OidcConfig {
        issuer,
        client_id: args.console_client_id.clone(),
        scopes: args.console_scopes.clone(),
        username_claim: args.console_username_claim.clone(),
        username_prefix: args.console_username_prefix.clone(),
        groups_claim: args.console_groups_claim.clone(),
        groups_prefix: args.console_groups_prefix.clone(),
    };
    let reach = if args.console_reach == "listed" {
        console::Reach::Listed
    } else {
        console::Reach::Service
    };
    let console = Arc::new(Console::new(
        catalog,
        config,
        &url,
        reach,
        args.console_prometheus.clone(),
    ));
    Ok((console, url))
}

/// `--console-url`, `--console-issuer`: an http(s) URL without white space, query or fragment.
fn console_url(s: &str) -> Result<String, String> {
    let ok = (s.starts_with("https://") || s.starts_with("http://"))
        && s.len() <= 2048
        && !s.contains(['?', '#'])
        && !s.chars().any(|c| c.is_whitespace() || c.is_control());
    if ok {
        Ok(s.trim_end_matches('/').to_owned())
    } else {
        Err("an http:// or https:// URL without query or fragment".to_owned())
    }
}

/// `--console-issuer`: as [`console_url`], kept exactly (the ID token must name it so).
fn console_issuer(s: &str) -> Result<String, String> {
    console_url(s).map(|_| s.to_owned())
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
