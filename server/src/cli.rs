//! The command line: `quiver-server --config SRC [...]` and `quiver-server check --config SRC`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::admin::{self, AdminState};
use crate::dispatch::Server;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::reload::{self, Reloader, Source};
use crate::transport::{http::HttpOptions, stdio};
use crate::tuning::{self, Tuning};

/// quiver-server: an MCP server whose tools are declared in YAML.
#[derive(Debug, Parser)]
#[command(version, about, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a ToolSet and print every problem (exit 1 if any).
    Check {
        /// `file:PATH` of the ToolSet (file or directory).
        #[arg(long)]
        config: Source,
    },
}

/// Options of the server.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Tool config: `file:PATH` (file or directory, watched) or `configmap:NAMESPACE/NAME` (watched via the API).
    #[arg(long, env = "QUIVER_CONFIG")]
    config: Option<Source>,
    /// MCP Streamable HTTP listen address.
    #[arg(long, env = "QUIVER_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// Admin listen address (/metrics, /healthz, /readyz, /status).
    #[arg(long, env = "QUIVER_ADMIN_LISTEN", default_value = "0.0.0.0:9090")]
    admin_listen: SocketAddr,
    /// Serve MCP over stdin/stdout instead of HTTP (the admin listener still runs unless --admin-listen is off).
    #[arg(long)]
    stdio: bool,
    /// Pin each worker thread to one CPU of the process's affinity mask.
    #[arg(long, env = "QUIVER_PIN_WORKERS")]
    pin_workers: bool,
    /// Worker threads (0 = one per CPU available to the process).
    #[arg(long, env = "QUIVER_WORKER_THREADS", default_value_t = 0)]
    worker_threads: usize,
    /// Largest accepted request body in bytes.
    #[arg(long, env = "QUIVER_MAX_BODY_BYTES", default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Extra allowed Origin (repeatable; `*` allows all). Loopback origins are always allowed.
    #[arg(
        long = "allowed-origin",
        env = "QUIVER_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    allowed_origins: Vec<String>,
    /// Requests handled at once before new ones get 503.
    #[arg(long, env = "QUIVER_MAX_CONCURRENCY", default_value_t = 4096)]
    max_concurrency: usize,
    /// Log format: text or json.
    #[arg(long, env = "QUIVER_LOG_FORMAT", default_value = "text")]
    log_format: String,
}

/// Parses the command line and runs; returns the process exit code.
pub fn main(allocator: &'static str) -> anyhow::Result<i32> {
    let cli = Cli::parse();
    if let Some(Command::Check { config }) = cli.command {
        return Ok(check(&config));
    }
    let args = cli.serve;
    init_logging(&args.log_format, args.stdio);
    let source = args
        .config
        .clone()
        .context("--config is required (file:PATH or configmap:NAMESPACE/NAME)")?;
    let tuning = tuning::plan(args.worker_threads, args.pin_workers);
    let rt = tuning::runtime(&tuning).context("building the tokio runtime")?;
    rt.block_on(serve(args, source, tuning, allocator))?;
    Ok(0)
}

fn check(source: &Source) -> i32 {
    let Source::File(path) = source else {
        eprintln!("check reads a file: use --config file:PATH");
        return 2;
    };
    let sources = match reload::read_path(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot read {}: {e}", path.display());
            return 2;
        }
    };
    match crate::config::load(&sources).and_then(|ts| crate::config::compile(&ts)) {
        Ok(c) => {
            println!(
                "ok: {} tools, {} resources, {} prompts (config hash {})",
                c.tools.len(),
                c.resources.len(),
                c.prompts.len(),
                c.hash
            );
            0
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

fn init_logging(format: &str, stdio: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(!stdio);
    if format == "json" {
        builder.json().init()
    } else {
        builder.init()
    }
}

async fn serve(
    args: ServeArgs,
    source: Source,
    tuning: Tuning,
    allocator: &'static str,
) -> anyhow::Result<()> {
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let metrics = Metrics::new(profile, allocator);
    let registry = Registry::new(&metrics);
    let server = Server::new(registry, metrics);
    let reloader = Reloader::new(server.clone());
    let shutdown = CancellationToken::new();

    match &source {
        Source::File(path) => {
            let sources = reload::read_path(path).with_context(|| format!("reading {}", path.display()))?;
            reloader.apply(&sources).map_err(|e| anyhow::anyhow!("{e}"))?;
            let (p, r) = (path.clone(), reloader.clone());
            tokio::spawn(async move {
                if let Err(e) = reload::watch_path(p, r).await {
                    tracing::error!(error = %e, "config watch failed; hot reload is off");
                }
            });
        }
        #[cfg(feature = "kube")]
        Source::ConfigMap { namespace, name } => {
            let (ns, n, r) = (namespace.clone(), name.clone(), reloader.clone());
            tokio::spawn(async move {
                if let Err(e) = reload::watch_configmap(ns, n, r).await {
                    tracing::error!(error = %e, "ConfigMap watch failed; hot reload is off");
                }
            });
        }
        #[cfg(not(feature = "kube"))]
        Source::ConfigMap { .. } => anyhow::bail!("this build has no Kubernetes support (feature `kube`)"),
    }

    let admin_state = Arc::new(AdminState {
        server: server.clone(),
        source: source.to_string(),
        tuning: tuning.clone(),
        started: Instant::now(),
    });
    let admin_listener = tokio::net::TcpListener::bind(args.admin_listen)
        .await
        .with_context(|| format!("binding admin {}", args.admin_listen))?;
    tracing::info!(addr = %admin_listener.local_addr()?, "admin listening");
    let admin_shutdown = shutdown.clone();
    let admin = tokio::spawn(async move {
        axum::serve(admin_listener, admin::app(admin_state))
            .with_graceful_shutdown(admin_shutdown.cancelled_owned())
            .await
    });

    tracing::info!(workers = tuning.worker_threads, pinned = tuning.pinned, cpus = ?tuning.allowed_cpus, "runtime ready");
    if args.stdio {
        tokio::select! {
            r = stdio::serve(server) => r.context("stdio transport")?,
            () = signal() => {}
        }
    } else {
        let options = HttpOptions {
            max_body_bytes: args.max_body_bytes,
            allowed_origins: args.allowed_origins,
            max_concurrency: args.max_concurrency,
        };
        let state = crate::transport::http::HttpState::new(server, options, shutdown.clone());
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        tracing::info!(addr = %listener.local_addr()?, "MCP Streamable HTTP listening on /mcp");
        let stop = shutdown.clone();
        axum::serve(listener, crate::transport::http::app(state))
            .with_graceful_shutdown(async move {
                signal().await;
                stop.cancel();
            })
            .await?;
    }
    shutdown.cancel();
    let _ = admin.await;
    Ok(())
}

async fn signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
