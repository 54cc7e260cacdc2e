//! quiver-operator: parse flags, start logging, run the controller next to the admin server.

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Parser;
use quiver_operator::build::Defaults;
use quiver_operator::controller::{self, Health};

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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let client = kube::Client::try_default().await?;
    let health = Arc::new(Health::default());
    let listener = tokio::net::TcpListener::bind(args.admin_listen).await?;
    tracing::info!(addr = %listener.local_addr()?, "admin listening");
    let admin = tokio::spawn(axum::serve(listener, controller::admin(health.clone())).into_future());
    let defaults = Defaults {
        server_image: args.server_image,
        image_pull_policy: args.image_pull_policy,
    };
    controller::run(client, defaults, args.concurrency, health).await;
    admin.abort();
    Ok(())
}
