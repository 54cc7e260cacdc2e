//! The command line: `quiver-server --config SRC [...]` and `quiver-server check --config SRC`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use tokio_util::sync::CancellationToken;

use quiver_flags::Command;
pub use quiver_flags::{AdminListen, Cli, ServeArgs};

use crate::admin::{self, AdminState};
use crate::dispatch::{Limits, Server, ServerBuilder};
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::reload::{self, Reloader, Source};
use crate::secrets::SecretSource;
use crate::transport::http::{self, HttpOptions, HttpState};
use crate::transport::limits::{Connections, Load};
use crate::transport::listen::{self, ConnOptions};
use crate::transport::stdio::{self, StdioOptions};
use crate::tuning::{self, Tuning};

/// `--allowed-host`, or its default for the listen address (see the flag).
fn host_policy(listen: SocketAddr, given: Vec<String>) -> Option<Vec<String>> {
    if !given.is_empty() {
        Some(given)
    } else if listen.ip().is_loopback() {
        Some(Vec::new())
    } else {
        None
    }
}

/// Where the admin listener goes when `--admin-listen` is not given.
fn admin_default(stdio: bool) -> AdminListen {
    if stdio {
        AdminListen::Off
    } else {
        AdminListen::At(SocketAddr::from(([0, 0, 0, 0], 9090)))
    }
}

/// Parses the command line and runs; returns the process exit code.
pub fn main(allocator: &'static str) -> anyhow::Result<i32> {
    // Before any secret is read: no process of this uid may read this one's memory.
    crate::sys::sandbox::deny_dumping();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Check { config }) => return Ok(check(&config)),
        Some(Command::Install { dir }) => {
            let to = crate::upstream::bridge::install(&dir)?;
            println!("installed {}", to.display());
            return Ok(0);
        }
        Some(Command::Bridge {
            socket,
            max_processes,
            command,
        }) => {
            init_logging("text", true);
            crate::sys::sandbox::init(crate::sys::sandbox::Policy::for_bridge());
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                crate::sys::process::start_reaper();
                crate::upstream::bridge::serve(&socket, &command, max_processes.max(1)).await
            })?;
            return Ok(0);
        }
        None => {}
    }
    let args = cli.serve;
    init_logging(&args.log_format, args.stdio);
    let mut hidden = args.hide_from_children.clone();
    // The Redis client keys are the server's alone.
    hidden.extend(args.limits_redis_client_key.iter().cloned());
    hidden.extend(args.tasks_redis_client_key.iter().cloned());
    hidden.extend(args.upstream_sign_in_redis_client_key.iter().cloned());
    if let Some(SecretSource::Dir(root)) = &args.secrets {
        hidden.push(root.clone());
    }
    crate::sys::sandbox::init(crate::sys::sandbox::Policy::new(args.child_isolation, &hidden));
    let source = args
        .config
        .clone()
        .context("--config is required (file:PATH or configmap:NAMESPACE/NAME)")?;
    let mut tuning = tuning::plan(args.worker_threads, args.pin_workers);
    tuning.per_core_listeners = args.per_core_listeners && !args.stdio;
    let rt = tuning::runtime(&tuning).context("building the tokio runtime")?;
    let result = rt.block_on(serve(args, source, tuning, allocator));
    // Tasks still running after the grace (and a blocked stdin read) must not hold up exit.
    rt.shutdown_timeout(Duration::from_millis(500));
    result.map(|()| 0)
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
    let loaded = crate::config::load(&sources).and_then(|mut ts| {
        crate::config::openapi::read_files(&mut ts.openapi);
        // Offline: no Secret is at hand, so a fetch that reads one is reported.
        crate::reload::fetch::fetch_documents(&mut ts.openapi, &serde_json::Value::Null)?;
        Ok(ts)
    });
    match loaded.and_then(|ts| crate::config::compile(&ts)) {
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
        // With tracing on, lines written under a sampled span name it (trace_id, span_id).
        builder
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(crate::otel::logs::WithTraceIds(
                tracing_subscriber::fmt::format().json(),
            ))
            .init()
    } else {
        builder.init()
    }
}

/// Environment variable holding the secret that signs 2026-07-28 `requestState` (at least
/// 16 bytes). Replicas of one server must share it, or a retry that reaches another replica
/// is asked its questions again; unset, each process draws a random key.
pub const STATE_KEY_ENV: &str = "QUIVER_STATE_KEY";

/// Client authentication from the flags (`None`: every caller is served).
fn client_auth(
    args: &ServeArgs,
    server: &Server,
) -> anyhow::Result<Option<Arc<crate::transport::auth::Auth>>> {
    use crate::transport::auth::{Auth, BearerAuth, Oidc, OidcConfig};
    let wanted = args.auth_tokens_secret.is_some() || args.auth_issuer.is_some();
    if wanted && args.stdio {
        anyhow::bail!(
            "--auth-tokens-secret and --auth-issuer are for HTTP: a stdio server has no credentials to check"
        );
    }
    let bearer = match &args.auth_tokens_secret {
        Some(_) if args.secrets.is_none() => {
            anyhow::bail!("--auth-tokens-secret needs --secrets to read the tokens from")
        }
        Some(r) => Some(BearerAuth::new(r.clone(), server.exec.secrets.clone())),
        None => None,
    };
    let oidc = match &args.auth_issuer {
        Some(issuer) => {
            let audience = args
                .auth_audience
                .clone()
                .context("--auth-issuer needs --auth-audience (this server's canonical URL)")?;
            let ca = match &args.auth_issuer_ca_configmap {
                None => None,
                Some(_) if args.secrets.is_none() => {
                    anyhow::bail!("--auth-issuer-ca-configmap needs --secrets to read the ConfigMap from")
                }
                Some(n) if !crate::config::valid_config_map_name(n) => {
                    anyhow::bail!("--auth-issuer-ca-configmap: `{n}` is not a ConfigMap name")
                }
                Some(n) => {
                    let r = crate::config::SecretRef {
                        name: format!("{}{n}", crate::config::CONFIG_MAP_PREFIX),
                        key: "ca.crt".to_owned(),
                    };
                    server.exec.secrets.pin(r.clone());
                    Some((r, server.exec.secrets.clone()))
                }
            };
            let oidc = Oidc::new(
                OidcConfig {
                    issuer: issuer.clone(),
                    audience,
                    jwks_url: args.auth_jwks_url.clone(),
                    resource: args.auth_resource.clone(),
                    leeway: args.auth_clock_skew,
                    groups_claim: args.auth_groups_claim.clone(),
                    ca,
                },
                crate::net::http::HttpClient::new(),
            );
            oidc.start();
            Some(oidc)
        }
        None => None,
    };
    Ok(wanted.then(|| Arc::new(Auth { bearer, oidc })))
}

/// The token-exchange client of `identity.mode: exchange`, when configured.
fn token_exchange(args: &ServeArgs, server: &Server) -> anyhow::Result<()> {
    let (Some(client_id), Some(secret)) =
        (&args.token_exchange_client_id, &args.token_exchange_client_secret)
    else {
        if args.token_exchange_client_id.is_some()
            || args.token_exchange_client_secret.is_some()
            || args.token_exchange_endpoint.is_some()
        {
            anyhow::bail!(
                "token exchange needs both --token-exchange-client-id and --token-exchange-client-secret"
            );
        }
        return Ok(());
    };
    if args.secrets.is_none() {
        anyhow::bail!("--token-exchange-client-secret needs --secrets to read the secret from");
    }
    if args.auth_issuer.is_none() {
        anyhow::bail!(
            "token exchange needs --auth-issuer: only callers' validated access tokens are exchanged"
        );
    }
    if client_id.is_empty() || client_id.len() > 1024 || client_id.chars().any(char::is_control) {
        anyhow::bail!("--token-exchange-client-id must be 1-1024 printable characters");
    }
    if let (Some(e), Some(issuer)) = (&args.token_exchange_endpoint, &args.auth_issuer)
        && !crate::spec::identity::same_origin(e, issuer)
    {
        // The endpoint receives callers' tokens: only the issuer's own host may.
        anyhow::bail!(
            "--token-exchange-endpoint must be an http(s) URL on the issuer's origin ({issuer}); leave it out to use the issuer's discovered token_endpoint"
        );
    }
    let ca = args
        .auth_issuer_ca_configmap
        .as_ref()
        .map(|n| crate::config::SecretRef {
            name: format!("{}{n}", crate::config::CONFIG_MAP_PREFIX),
            key: "ca.crt".to_owned(),
        });
    let exchanger = crate::identity::Exchanger::new(
        crate::identity::ExchangeConfig {
            endpoint: args.token_exchange_endpoint.clone(),
            issuer: args.auth_issuer.clone(),
            client_id: client_id.clone(),
            client_secret: secret.clone(),
            ca,
        },
        crate::net::http::HttpClient::new(),
        server.exec.secrets.clone(),
    );
    server
        .exec
        .identity
        .set_exchanger(exchanger)
        .map_err(anyhow::Error::msg)?;
    tracing::info!(client = %client_id, "token exchange (RFC 8693) configured for identity.mode: exchange");
    Ok(())
}

/// Each user's own sign-in to upstreams (`identity.mode: user`), when `--upstream-sign-in-url`
/// is set: checked whole here, so that a server that starts can sign users in.
fn upstream_sign_in(
    args: &ServeArgs,
    server: &Server,
    auth: Option<&crate::transport::auth::Auth>,
) -> anyhow::Result<()> {
    use crate::oauth::sign_in::{IdTokens, SignIn, SignInConfig};
    use crate::oauth::vault;
    let Some(url) = &args.upstream_sign_in_url else {
        if args.upstream_sign_in_keys.is_some()
            || args.upstream_sign_in_client_id.is_some()
            || args.upstream_sign_in_client_secret.is_some()
            || args.upstream_sign_in_redis.is_some()
            || !args.upstream_sign_in_deny_cidrs.is_empty()
        {
            anyhow::bail!(
                "the --upstream-sign-in-* flags need --upstream-sign-in-url (the URL browsers reach this server at)"
            );
        }
        return Ok(());
    };
    let keys = args
        .upstream_sign_in_keys
        .clone()
        .context("--upstream-sign-in-url needs --upstream-sign-in-keys (SECRET.KEY of the key ring that seals users' tokens)")?;
    if args.secrets.is_none() {
        anyhow::bail!("--upstream-sign-in-keys needs --secrets to read the key ring from");
    }
    let client_id = args
        .upstream_sign_in_client_id
        .clone()
        .context("--upstream-sign-in-url needs --upstream-sign-in-client-id (this server's browser client at --auth-issuer)")?;
    if client_id.is_empty() || client_id.len() > 1024 || client_id.chars().any(|c| c.is_control() || c == ' ')
    {
        anyhow::bail!("--upstream-sign-in-client-id must be 1-1024 printable characters without spaces");
    }
    let oidc: Arc<dyn IdTokens> = auth
        .and_then(|a| a.oidc.clone())
        .context("--upstream-sign-in-url needs --auth-issuer: a sign-in link is completed only by the caller it was made for, who signs in there")?;
    if args.upstream_sign_in_max_users == 0 || !(1..=512).contains(&args.upstream_sign_in_max_per_user) {
        anyhow::bail!(
            "--upstream-sign-in-max-users must be at least 1, --upstream-sign-in-max-per-user 1 to 512"
        );
    }
    let backend = match &args.upstream_sign_in_redis {
        None => vault::Backend::Memory,
        Some(addr) => vault::Backend::Redis(vault::RedisOptions {
            endpoint: redis_endpoint(addr, &sign_in_redis_flags(args))?,
            timeout: args.upstream_sign_in_redis_timeout,
            max_connections: 16,
        }),
    };
    let cfg = SignInConfig {
        url: url.clone(),
        keys,
        client_id,
        client_secret: args.upstream_sign_in_client_secret.clone(),
        vault: vault::Options {
            namespace: args.upstream_sign_in_redis_prefix.clone(),
            max_users: args.upstream_sign_in_max_users,
            max_per_user: args.upstream_sign_in_max_per_user,
            ..vault::Options::default()
        },
        backend,
        local_servers: args.upstream_sign_in_local_servers,
    };
    if cfg.local_servers {
        tracing::warn!(
            "--upstream-sign-in-local-servers: upstreams' metadata may send this server to authorization servers on this host and private addresses (for tests only)"
        );
    }
    let sign_in = SignIn::new(
        cfg,
        sign_in_http(args)?,
        server.exec.secrets.clone(),
        oidc,
        server.metrics.oauth.clone(),
        server.audit.clone(),
    )
    .map_err(|e| anyhow::anyhow!("--upstream-sign-in-url: {e}"))?;
    tracing::info!(url = %sign_in.url(), vault = if args.upstream_sign_in_redis.is_some() { "redis" } else { "memory" }, "each user's own sign-in to upstreams (identity.mode: user) configured");
    if args.upstream_sign_in_redis.is_some() {
        // What an administrator gives this server's Redis ACL user (and no other server's).
        tracing::info!(
            acl_keys = %vault::acl_keys(&args.upstream_sign_in_redis_prefix),
            "upstream sign-in: the token vault's Redis keys"
        );
    }
    server
        .exec
        .identity
        .set_sign_in(Arc::new(sign_in))
        .map_err(anyhow::Error::msg)
}

/// The HTTP client of the upstream sign-in: servers an upstream's metadata chose are denied
/// the `--upstream-sign-in-deny-cidr` networks too.
fn sign_in_http(args: &ServeArgs) -> anyhow::Result<crate::net::http::HttpClient> {
    use crate::net::http::{HttpClient, MAX_DENIED};
    let denied = &args.upstream_sign_in_deny_cidrs;
    if denied.len() > MAX_DENIED {
        anyhow::bail!("--upstream-sign-in-deny-cidr: at most {MAX_DENIED} networks");
    }
    Ok(HttpClient::new().deny_third_parties(denied.clone()))
}

async fn serve(
    mut args: ServeArgs,
    source: Source,
    tuning: Tuning,
    allocator: &'static str,
) -> anyhow::Result<()> {
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    // Exec tools' orphans are re-parented to this process (PID 1 in its image): reap them.
    crate::sys::process::start_reaper();
    let metrics = Metrics::new(profile, allocator);
    let dropped = metrics.trace_spans_dropped.clone();
    let traces = crate::otel::init(&args.tracing, &args.client_tracing, dropped)?;
    let server = dispatcher(&args, &metrics)?;
    let auth = client_auth(&args, &server)?;
    token_exchange(&args, &server)?;
    upstream_sign_in(&args, &server, auth.as_deref())?;
    let reloader = Reloader::new(server.clone());
    reloader.follow_upstreams();
    reloader.follow_openapi();
    // Cancelled when draining starts: stops accepting and ends GET streams (and stdio reads).
    let shutdown = CancellationToken::new();
    // Following the task store goes on while tasks drain.
    let tasks_stop = CancellationToken::new();
    tokio::spawn({
        let (server, stop) = (server.clone(), tasks_stop.clone());
        async move { server.follow_tasks(stop).await }
    });

    follow_pins(args.pins.as_ref(), &server)?;
    follow_source(&source, &reloader)?;

    let (options, max_connections) = http_options(&mut args, auth.clone())?;
    let state = HttpState::new(server.clone(), options, shutdown.clone());
    let load: Arc<Load> = state.load();

    let admin_state = Arc::new(AdminState {
        server: server.clone(),
        source: source.to_string(),
        tuning: tuning.clone(),
        started: Instant::now(),
        load: load.clone(),
        auth: auth_kind(auth.as_deref()),
    });
    let admin_stop = CancellationToken::new();
    // The MCP port is bound before the admin port answers /readyz: ready means reachable.
    let listener = if args.stdio {
        None
    } else {
        Some(bind_mcp(&args, &tuning, max_connections).await?)
    };
    let admin = start_admin(
        args.admin_listen.unwrap_or(admin_default(args.stdio)),
        admin_state,
        &admin_stop,
    )
    .await?;

    tracing::info!(workers = tuning.worker_threads, pinned = tuning.pinned, cpus = ?tuning.allowed_cpus, "runtime ready");
    let audit = server.audit.clone();
    match listener {
        None => serve_stdio(server, &args, &load, &shutdown).await?,
        Some(listener) => serve_http(listener, state, &server, &args, &tuning, &shutdown, metrics).await?,
    }
    // Under --audit-on-full refuse, the records of the calls that ran are written before exit.
    if let Some(a) = audit
        && !a.settle(Duration::from_secs(2)).await
    {
        tracing::warn!("shutdown: audit records still waiting for the sink are lost");
    }
    tasks_stop.cancel();
    admin_stop.cancel();
    if let Some(admin) = admin {
        let _ = tokio::time::timeout(Duration::from_secs(1), admin).await;
    }
    if let Some(t) = traces {
        t.shutdown(Duration::from_secs(2)).await;
    }
    Ok(())
}

/// The HTTP transport's options of `args` (taken out of it), and the connection cap in force.
fn http_options(
    args: &mut ServeArgs,
    auth: Option<Arc<crate::transport::auth::Auth>>,
) -> anyhow::Result<(HttpOptions, usize)> {
    let fd_limit = listen::fd_limit();
    let (max_connections, lowered) = listen::connection_cap(args.max_connections, fd_limit);
    if lowered {
        tracing::warn!(
            wanted = args.max_connections,
            used = max_connections,
            fd_limit = ?fd_limit,
            "--max-connections lowered to leave file descriptors for the admin port and tool calls"
        );
    }
    let options = HttpOptions {
        max_body_bytes: args.max_body_bytes,
        allowed_origins: std::mem::take(&mut args.allowed_origins),
        allowed_hosts: host_policy(args.listen, std::mem::take(&mut args.allowed_hosts)),
        max_concurrency: args.max_concurrency,
        max_streams: args.max_streams,
        max_connections,
        body_read_timeout: args.body_read_timeout,
        auth,
        resume: args
            .sse_poll_after
            .map(crate::transport::resume::ResumeOptions::with_poll),
        trusted_proxies: crate::transport::forwarded::TrustedProxies::new(std::mem::take(
            &mut args.trusted_proxies,
        ))
        .map_err(|e| anyhow::anyhow!("--trusted-proxies: {e}"))?,
        card: args.server_card_name.take().map(|name| {
            Arc::new(crate::transport::http::card::CardOptions {
                name,
                description: args.server_card_description.take(),
                urls: std::mem::take(&mut args.server_card_urls),
                website_url: args.server_card_website_url.take(),
            })
        }),
    };
    Ok((options, max_connections))
}

/// Tasks callers without credentials may hold together: `given`, else a quarter of `max`;
/// at least 1, at most `max`.
fn anonymous_tasks(max: u32, given: Option<u32>) -> usize {
    let max = max as usize;
    given.map_or(max / 4, |n| n as usize).clamp(1, max.max(1))
}

/// The dispatcher of `args`: its limits, request-state key, governance and secrets.
fn dispatcher(args: &ServeArgs, metrics: &Arc<Metrics>) -> anyhow::Result<Arc<Server>> {
    let registry = Registry::new(metrics);
    let limits = Limits {
        max_batch: args.max_batch,
        max_response_bytes: args.max_response_bytes,
        request_timeout: args.request_timeout,
        cache_ttl_ms: u64::try_from(args.cache_ttl.as_millis()).unwrap_or(u64::MAX),
    };
    if args.tasks_ttl.is_zero() {
        anyhow::bail!("--tasks-ttl must be above 0");
    }
    let bounds = crate::dispatch::TaskBounds {
        per_caller: args.tasks_per_caller as usize,
        total: args.tasks_max as usize,
        anonymous: anonymous_tasks(args.tasks_max, args.tasks_anonymous_max),
        ttl: args.tasks_ttl,
        max_result_bytes: args.tasks_max_result_bytes,
        total_result_bytes: args.tasks_max_results_bytes,
        ..crate::dispatch::TaskBounds::default()
    };
    let shared = args
        .tasks_redis
        .as_ref()
        .map(|addr| {
            anyhow::Ok(crate::dispatch::SharedOptions {
                endpoint: redis_endpoint(addr, &tasks_redis_flags(args))?,
                prefix: args.tasks_redis_prefix.clone(),
                timeout: args.tasks_redis_timeout,
            })
        })
        .transpose()?;
    let mut builder = Server::builder(registry, metrics.clone())
        .limits(limits)
        .tasks(bounds, shared);
    if let Ok(secret) = std::env::var(STATE_KEY_ENV) {
        let key = crate::dispatch::stateless::StateKey::from_secret(secret.as_bytes())
            .map_err(|e| anyhow::anyhow!("{STATE_KEY_ENV}: {e}"))?;
        builder = builder.state_key(key);
    }
    let server = governance(builder, args)?.build();
    start_secrets(args.secrets.clone(), &server)?;
    Ok(server)
}

/// The environment variable holding the password of `--tasks-redis`.
const TASKS_REDIS_PASSWORD_ENV: &str = "QUIVER_TASKS_REDIS_PASSWORD";

/// The environment variable holding the password of `--limits-redis`.
const REDIS_PASSWORD_ENV: &str = "QUIVER_LIMITS_REDIS_PASSWORD";

/// The environment variable holding the password of `--upstream-sign-in-redis`.
const SIGN_IN_REDIS_PASSWORD_ENV: &str = "QUIVER_UPSTREAM_SIGN_IN_REDIS_PASSWORD";

/// The flags of one Redis connection (`--limits-redis*`, `--tasks-redis*` or
/// `--upstream-sign-in-redis*`), as given.
#[derive(Debug)]
struct RedisFlags<'a> {
    /// What they start with (`--limits-redis`), for errors.
    flag: &'static str,
    /// The variable holding the password.
    password_env: &'static str,
    tls: bool,
    files: crate::net::resp::TlsFiles,
    username: Option<&'a str>,
}

/// The flags of the shared limits' Redis.
fn limits_redis_flags(args: &ServeArgs) -> RedisFlags<'_> {
    RedisFlags {
        flag: "--limits-redis",
        password_env: REDIS_PASSWORD_ENV,
        tls: args.limits_redis_tls,
        files: crate::net::resp::TlsFiles {
            ca: args.limits_redis_ca.clone(),
            server_name: args.limits_redis_server_name.clone(),
            client_cert: args.limits_redis_client_cert.clone(),
            client_key: args.limits_redis_client_key.clone(),
        },
        username: args.limits_redis_username.as_deref(),
    }
}

/// The flags of the shared tasks' Redis.
fn tasks_redis_flags(args: &ServeArgs) -> RedisFlags<'_> {
    RedisFlags {
        flag: "--tasks-redis",
        password_env: TASKS_REDIS_PASSWORD_ENV,
        tls: args.tasks_redis_tls,
        files: crate::net::resp::TlsFiles {
            ca: args.tasks_redis_ca.clone(),
            server_name: args.tasks_redis_server_name.clone(),
            client_cert: args.tasks_redis_client_cert.clone(),
            client_key: args.tasks_redis_client_key.clone(),
        },
        username: args.tasks_redis_username.as_deref(),
    }
}

/// The flags of the upstream sign-in's Redis (users' tokens and used sign-in states).
fn sign_in_redis_flags(args: &ServeArgs) -> RedisFlags<'_> {
    RedisFlags {
        flag: "--upstream-sign-in-redis",
        password_env: SIGN_IN_REDIS_PASSWORD_ENV,
        tls: args.upstream_sign_in_redis_tls,
        files: crate::net::resp::TlsFiles {
            ca: args.upstream_sign_in_redis_ca.clone(),
            server_name: args.upstream_sign_in_redis_server_name.clone(),
            client_cert: args.upstream_sign_in_redis_client_cert.clone(),
            client_key: args.upstream_sign_in_redis_client_key.clone(),
        },
        username: args.upstream_sign_in_redis_username.as_deref(),
    }
}

/// The Redis at `addr` as `f` describes it, its password from the environment and its TLS
/// files read now.
fn redis_endpoint(addr: &str, f: &RedisFlags<'_>) -> anyhow::Result<crate::net::resp::Endpoint> {
    let password = std::env::var(f.password_env).ok().filter(|p| !p.is_empty());
    redis_endpoint_with(addr, f, password)
}

fn redis_endpoint_with(
    addr: &str,
    f: &RedisFlags<'_>,
    password: Option<String>,
) -> anyhow::Result<crate::net::resp::Endpoint> {
    let flag = f.flag;
    if !f.tls && f.files != crate::net::resp::TlsFiles::default() {
        anyhow::bail!(
            "{flag}-ca, {flag}-server-name, {flag}-client-cert and {flag}-client-key need {flag}-tls"
        );
    }
    let username = f.username.filter(|u| !u.is_empty()).map(str::to_owned);
    if username.is_some() && password.is_none() {
        anyhow::bail!("{flag}-username needs the user's password in {}", f.password_env);
    }
    let tls = f
        .tls
        .then(|| crate::net::resp::Tls::load(addr, &f.files))
        .transpose()
        .map_err(|e| anyhow::anyhow!("{flag}-tls: {e}"))?;
    Ok(crate::net::resp::Endpoint {
        addr: addr.to_owned(),
        username,
        password,
        tls: tls.map(Arc::new),
    })
}

/// The limiter (with Redis, if configured) and the audit trail of `--limits-*` and `--audit`.
fn governance(server: ServerBuilder, args: &ServeArgs) -> anyhow::Result<ServerBuilder> {
    let gov = server.metrics().gov.clone();
    let shared = args
        .limits_redis
        .as_ref()
        .map(|addr| {
            anyhow::Ok(crate::limits::redis::Shared::new(
                crate::limits::redis::Options {
                    endpoint: redis_endpoint(addr, &limits_redis_flags(args))?,
                    prefix: args.limits_redis_prefix.clone(),
                    timeout: args.limits_redis_timeout,
                    max_connections: 16,
                    fail: args.limits_redis_fail,
                },
                gov.clone(),
            ))
        })
        .transpose()?;
    let limiter = crate::limits::Limiter::new(args.limits_max_keys, shared, gov.clone());
    let audit = match &args.audit {
        None => None,
        Some(crate::audit::Sink::Stdout) if args.stdio => {
            anyhow::bail!("--audit stdout: with --stdio, stdout carries the protocol; use file:PATH")
        }
        Some(sink) => Some(
            crate::audit::AuditLog::start(
                sink,
                args.audit_queue as usize,
                args.audit_on_full,
                server.secrets().clone(),
                gov,
            )
            .with_context(|| format!("--audit {sink:?}"))?,
        ),
    };
    if let (Some(log), Some(instance)) = (&audit, &args.instance) {
        log.name_instance(instance);
    }
    Ok(server.limiter(limiter).audit(audit))
}

/// How clients authenticate, as `/status` names it.
fn auth_kind(auth: Option<&crate::transport::auth::Auth>) -> &'static str {
    match auth {
        None => "none",
        Some(a) if a.oidc.is_some() && a.bearer.is_some() => "bearer+oidc",
        Some(a) if a.oidc.is_some() => "oidc",
        Some(_) => "bearer",
    }
}

/// Serves MCP over stdin/stdout until the input ends or a signal drains it.
async fn serve_stdio(
    server: Arc<Server>,
    args: &ServeArgs,
    load: &Load,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let grace = args.shutdown_grace;
    let options = StdioOptions {
        max_line_bytes: args.max_body_bytes,
        max_inflight: args.max_concurrency,
    };
    let mut stdio = tokio::spawn(stdio::serve(server, options, shutdown.clone()));
    tokio::select! {
        r = &mut stdio => r.context("stdio transport")?.context("stdio transport")?,
        () = signal() => {
            let deadline = tokio::time::Instant::now() + grace;
            load.start_draining();
            shutdown.cancel();
            if tokio::time::timeout_at(deadline, stdio).await.is_err() {
                tracing::warn!(grace = ?grace, "shutdown grace expired with stdio requests in flight");
            }
        }
    }
    Ok(())
}

/// The MCP port's listening sockets: one on the main runtime, or one per worker thread
/// (`--per-core-listeners`).
enum McpListener {
    Shared(tokio::net::TcpListener),
    PerCore(Vec<std::net::TcpListener>),
}

/// Binds the MCP port as `--per-core-listeners` asks.
async fn bind_mcp(args: &ServeArgs, tuning: &Tuning, max_connections: usize) -> anyhow::Result<McpListener> {
    let binding = || format!("binding {}", args.listen);
    let (listener, addr) = if tuning.per_core_listeners {
        let bound = crate::transport::per_core::bind(args.listen, tuning.worker_threads)
            .await
            .with_context(binding)?;
        let addr = bound[0].local_addr()?;
        (McpListener::PerCore(bound), addr)
    } else {
        let l = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(binding)?;
        let addr = l.local_addr()?;
        (McpListener::Shared(l), addr)
    };
    tracing::info!(%addr, max_connections, per_core = tuning.per_core_listeners, "MCP Streamable HTTP listening on /mcp");
    Ok(listener)
}

/// Serves MCP Streamable HTTP until a signal, then drains.
async fn serve_http(
    listener: McpListener,
    state: Arc<HttpState>,
    server: &Server,
    args: &ServeArgs,
    tuning: &Tuning,
    shutdown: &CancellationToken,
    metrics: Arc<Metrics>,
) -> anyhow::Result<()> {
    let load = state.load();
    let conn_options = ConnOptions {
        header_read_timeout: args.header_read_timeout,
        http2: args.http2,
    };
    let app = http::Mcp::new(state);
    let (shared, mut per_core) = match listener {
        McpListener::Shared(l) => {
            let serving = listen::serve(
                l,
                app,
                load.connections.clone(),
                conn_options,
                shutdown.clone(),
                Some(metrics),
            );
            (Some(tokio::spawn(serving)), None)
        }
        McpListener::PerCore(ls) => {
            let serve = crate::transport::per_core::Serve {
                app,
                conns: load.connections.clone(),
                options: conn_options,
                stop: shutdown.clone(),
                metrics: Some(metrics),
                cpus: if tuning.pinned {
                    tuning.allowed_cpus.clone()
                } else {
                    Vec::new()
                },
            };
            (
                None,
                Some(crate::transport::per_core::start(ls, &serve).context("starting per-core listeners")?),
            )
        }
    };
    let served = async {
        match (shared, per_core.as_mut()) {
            (Some(task), _) => drop(task.await),
            (None, Some(p)) => p.served().await,
            (None, None) => {}
        }
    };
    signal().await;
    let tasks = server.drain_tasks(args.tasks_drain);
    tokio::join!(
        drain(&load, shutdown, served, args.shutdown_delay, args.shutdown_grace),
        tasks
    );
    // Per-core runtimes end here, after the tasks they ran have drained.
    drop(per_core);
    Ok(())
}

/// Starts following the secret source, if one is configured.
fn start_secrets(source: Option<SecretSource>, server: &Server) -> anyhow::Result<()> {
    let secrets = server.exec.secrets.clone();
    match source {
        None => {}
        Some(SecretSource::Env) => secrets.use_env(),
        Some(SecretSource::Dir(path)) => {
            secrets.set_has_source();
            let s = secrets.clone();
            tokio::spawn(async move {
                if let Err(e) = crate::secrets::watch_dir(path, s).await {
                    tracing::error!(error = %e, "secret directory watch failed; secrets are not refreshed");
                }
            });
        }
        #[cfg(feature = "kube")]
        Some(SecretSource::Kube(ns)) => {
            secrets.set_has_source();
            let s = secrets.clone();
            tokio::spawn(async move {
                if let Err(e) = crate::secrets::watch_kube(ns, s).await {
                    tracing::error!(error = %e, "Secret watch failed; secrets are not read");
                }
            });
        }
        #[cfg(not(feature = "kube"))]
        Some(SecretSource::Kube(_)) => anyhow::bail!("this build has no Kubernetes support (feature `kube`)"),
    }
    Ok(())
}

/// Loads the tool configuration once (a file must load; a ConfigMap is awaited by its watch)
/// and keeps following it.
fn follow_source(source: &Source, reloader: &Arc<Reloader>) -> anyhow::Result<()> {
    match source {
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

    Ok(())
}

/// Keeps the pinned tool definitions where `--pins` says (memory without it).
fn follow_pins(pins: Option<&Source>, server: &Arc<crate::dispatch::Server>) -> anyhow::Result<()> {
    match pins {
        None => {}
        Some(Source::File(_)) => anyhow::bail!("--pins: expected configmap:NAMESPACE/NAME"),
        #[cfg(feature = "kube")]
        Some(Source::ConfigMap { namespace, name }) => {
            let hub = Arc::clone(&server.exec.upstreams);
            // Nothing pinned is approved from here until the ConfigMap is read.
            hub.pins.use_store(format!("configmap:{namespace}/{name}"));
            let (ns, n) = (namespace.clone(), name.clone());
            tokio::spawn(async move {
                if let Err(e) = crate::upstream::keep_pins_in_configmap(hub, ns, n).await {
                    tracing::error!(error = %e, "pin ConfigMap unreachable; enforced upstreams serve nothing");
                }
            });
        }
        #[cfg(not(feature = "kube"))]
        Some(Source::ConfigMap { .. }) => {
            anyhow::bail!("this build has no Kubernetes support (feature `kube`)")
        }
    }
    Ok(())
}

/// Binds and serves the admin listener unless it is off.
async fn start_admin(
    at: AdminListen,
    admin_state: Arc<AdminState>,
    admin_stop: &CancellationToken,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    Ok(match at {
        AdminListen::Off => {
            tracing::info!("admin listener off");
            None
        }
        AdminListen::At(addr) => {
            let admin_listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding admin {addr}"))?;
            tracing::info!(addr = %admin_listener.local_addr()?, "admin listening");
            Some(tokio::spawn(listen::serve(
                admin_listener,
                admin::app(admin_state),
                Connections::new(admin::MAX_CONNECTIONS),
                admin::CONN_OPTIONS,
                admin_stop.clone(),
                None,
            )))
        }
    })
}

/// The shutdown sequence after SIGTERM: readiness off, keep serving for `delay` so the pod
/// leaves its Service's endpoints, then stop accepting, end GET streams, let in-flight
/// requests finish, and give up at `grace` after the signal.
async fn drain(
    load: &Load,
    shutdown: &CancellationToken,
    mcp: impl Future<Output = ()>,
    delay: Duration,
    grace: Duration,
) {
    let deadline = tokio::time::Instant::now() + grace;
    load.start_draining();
    tracing::info!(delay = ?delay, grace = ?grace, "shutdown: readiness off");
    tokio::time::sleep(delay.min(grace)).await;
    shutdown.cancel();
    tracing::info!(
        connections = load.connections.open(),
        "shutdown: listener closed, draining connections"
    );
    match tokio::time::timeout_at(deadline, mcp).await {
        Ok(_) => tracing::info!("shutdown: every connection closed"),
        Err(_) => tracing::warn!(
            connections = load.connections.open(),
            "shutdown grace expired; dropping the remaining connections"
        ),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_connection_flags_make_an_endpoint_or_name_what_is_wrong() {
        use clap::Parser as _;
        let parse = |extra: &[&str]| {
            let mut argv = vec![
                "quiver-server",
                "--config=file:/t.yaml",
                "--limits-redis=redis.infra.svc:6380",
            ];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}")).serve
        };
        let pw = || Some("pw".to_owned());
        // Plain, as before: no TLS, `AUTH password` when there is one.
        let a = parse(&["--tasks-redis=t:6379"]);
        let e = redis_endpoint_with("redis.infra.svc:6380", &limits_redis_flags(&a), pw()).unwrap();
        assert!(e.tls.is_none() && e.username.is_none() && e.password.as_deref() == Some("pw"));
        // TLS with the public roots, an ACL user, a server name of its own.
        let a = parse(&[
            "--limits-redis-tls",
            "--limits-redis-username=quiver",
            "--limits-redis-server-name=cache.example",
        ]);
        let e = redis_endpoint_with("10.0.0.7:6380", &limits_redis_flags(&a), pw()).unwrap();
        assert_eq!(e.username.as_deref(), Some("quiver"));
        assert!(format!("{:?}", e.tls).contains("cache.example"), "{e:?}");
        assert!(!format!("{e:?}").contains("\"pw\""), "{e:?}");
        // Each mistake, named by its flag.
        let err = |extra: &[&str], password: Option<String>, flags: fn(&ServeArgs) -> RedisFlags<'_>| {
            let a = parse(extra);
            redis_endpoint_with("r:6379", &flags(&a), password)
                .unwrap_err()
                .to_string()
        };
        let limits: fn(&ServeArgs) -> RedisFlags<'_> = limits_redis_flags;
        let tasks: fn(&ServeArgs) -> RedisFlags<'_> = tasks_redis_flags;
        let e = err(&["--limits-redis-ca=/ca.pem"], None, limits);
        assert!(e.contains("need --limits-redis-tls"), "{e}");
        let e = err(
            &["--tasks-redis-tls", "--tasks-redis-username=quiver"],
            None,
            tasks,
        );
        assert!(
            e.contains("--tasks-redis-username needs") && e.contains("QUIVER_TASKS_REDIS_PASSWORD"),
            "{e}"
        );
        let e = err(
            &["--tasks-redis-tls", "--tasks-redis-client-cert=/c.pem"],
            None,
            tasks,
        );
        assert!(
            e.starts_with("--tasks-redis-tls: a client certificate needs its key"),
            "{e}"
        );
        let e = err(
            &["--limits-redis-tls", "--limits-redis-ca=/nonexistent/ca.pem"],
            None,
            limits,
        );
        assert!(
            e.starts_with("--limits-redis-tls: the CA file `/nonexistent/ca.pem`"),
            "{e}"
        );
        let e = err(
            &["--limits-redis-tls", "--limits-redis-server-name=not a name"],
            None,
            limits,
        );
        assert!(e.contains("`not a name` is not a DNS name"), "{e}");
    }

    #[test]
    fn hosts_are_checked_by_default_only_on_loopback() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(host_policy(at("127.0.0.1:8080"), vec![]), Some(vec![]));
        assert_eq!(host_policy(at("[::1]:8080"), vec![]), Some(vec![]));
        assert_eq!(host_policy(at("0.0.0.0:8080"), vec![]), None);
        assert_eq!(
            host_policy(at("0.0.0.0:8080"), vec!["mcp.example".into()]),
            Some(vec!["mcp.example".into()])
        );
    }

    #[test]
    fn callers_without_credentials_get_a_quarter_of_the_tasks_unless_told() {
        assert_eq!(anonymous_tasks(4096, None), 1024);
        assert_eq!(anonymous_tasks(3, None), 1);
        assert_eq!(anonymous_tasks(4096, Some(10)), 10);
        assert_eq!(anonymous_tasks(100, Some(5000)), 100);
    }

    #[test]
    fn admin_listen_is_off_under_stdio() {
        assert_eq!(admin_default(true), AdminListen::Off);
        assert_eq!(
            admin_default(false),
            AdminListen::At(SocketAddr::from(([0, 0, 0, 0], 9090)))
        );
    }
}
