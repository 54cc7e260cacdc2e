//! The server's command line: every flag of `quiver-server`, its defaults and environment
//! variables.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::values::{SecretSource, Source};

/// quiver-server: an MCP server whose tools are declared in YAML.
#[derive(Debug, Parser)]
#[command(
    name = "quiver-server",
    version,
    about = "Quiver's MCP server runtime and gateway: the compiled registry, dispatch, tool execution, Streamable HTTP and stdio, hot reload",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// A subcommand; none: serve.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The options of serving.
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a ToolSet and print every problem (exit 1 if any).
    Check {
        /// `file:PATH` of the ToolSet (file or directory).
        #[arg(long)]
        config: Source,
    },
    /// Serve a stdio MCP server program on a Unix socket, one process per connection (for
    /// an upstream in a sidecar container; see docs/upstreams.md).
    Bridge {
        /// The socket to create.
        #[arg(long)]
        socket: std::path::PathBuf,
        /// Processes running at once; more connections are refused.
        #[arg(long, default_value_t = 16)]
        max_processes: usize,
        /// The program and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Copy this binary into a directory (an init container's way to share it).
    Install {
        /// The directory.
        dir: std::path::PathBuf,
    },
}

/// `--admin-listen`: an address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminListen {
    /// No admin listener.
    Off,
    /// Listen here.
    At(SocketAddr),
}

impl std::str::FromStr for AdminListen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "off" {
            return Ok(Self::Off);
        }
        s.parse()
            .map(Self::At)
            .map_err(|e| format!("`{s}` is neither `off` nor an address like 0.0.0.0:9090: {e}"))
    }
}

/// Options of the server.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Tool config: `file:PATH` (file or directory, watched) or `configmap:NAMESPACE/NAME` (watched via the API).
    #[arg(long, env = "QUIVER_CONFIG")]
    pub config: Option<Source>,
    /// Where the pinned tool definitions of upstreams with `pin: warn|enforce` are kept:
    /// `configmap:NAMESPACE/NAME` (an existing ConfigMap the pod may get, watch and update;
    /// `kubectl quiver approve` edits it). Without it they are kept in memory: each start
    /// trusts the definitions it first sees (`GET /pins` on the admin port shows them).
    #[arg(long, env = "QUIVER_PINS")]
    pub pins: Option<Source>,
    /// MCP Streamable HTTP listen address.
    #[arg(long, env = "QUIVER_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Admin listen address (/metrics, /healthz, /readyz, /status), or `off`. Default:
    /// 0.0.0.0:9090 over HTTP; off with --stdio (a stdio server is a client's child process,
    /// which should not open a port nobody asked for).
    #[arg(long, env = "QUIVER_ADMIN_LISTEN")]
    pub admin_listen: Option<AdminListen>,
    /// Serve MCP over stdin/stdout instead of HTTP.
    #[arg(long)]
    pub stdio: bool,
    /// Where `{{secret.NAME.KEY}}` values come from: `kube:NAMESPACE` (each referenced Secret
    /// watched through the API), `dir:PATH` (`PATH/NAME/KEY` files, watched) or `env`
    /// (`QUIVER_SECRET_<NAME>_<KEY>` variables).
    #[arg(long, env = "QUIVER_SECRETS")]
    pub secrets: Option<SecretSource>,
    /// Require a bearer token on /mcp: the secret value `SECRET.KEY` (from `--secrets`) holds
    /// the accepted tokens, one per line; a rotation applies to the next request.
    #[arg(long, env = "QUIVER_AUTH_TOKENS_SECRET", value_parser = crate::values::parse_ref)]
    pub auth_tokens_secret: Option<quiver_model::spec::context::SecretRef>,
    /// Accept OAuth 2.1 / OIDC access tokens (JWT, RS256 or ES256) from this issuer on /mcp;
    /// its keys come from its discovery document (or --auth-jwks-url). Needs --auth-audience.
    #[arg(long, env = "QUIVER_AUTH_ISSUER")]
    pub auth_issuer: Option<String>,
    /// The audience accepted tokens must name: this server's canonical URL (RFC 8707).
    #[arg(long, env = "QUIVER_AUTH_AUDIENCE")]
    pub auth_audience: Option<String>,
    /// The issuer's JWK set URL, instead of discovering it.
    #[arg(long, env = "QUIVER_AUTH_JWKS_URL")]
    pub auth_jwks_url: Option<String>,
    /// The MCP endpoint's canonical URL in the protected-resource metadata (default: the
    /// audience when it is a URL, else `http://HOST/mcp` for the first --allowed-host; never
    /// taken from a request's Host header).
    #[arg(long, env = "QUIVER_AUTH_RESOURCE")]
    pub auth_resource: Option<String>,
    /// Clock difference tolerated in tokens' `exp` and `nbf`.
    #[arg(long, env = "QUIVER_AUTH_CLOCK_SKEW", default_value = "60s", value_parser = duration)]
    pub auth_clock_skew: Duration,
    /// The access-token claim listing the caller's groups, for tools with `access.groups`:
    /// a claim name, or a dotted path such as `realm_access.roles`.
    #[arg(long, env = "QUIVER_AUTH_GROUPS_CLAIM", default_value = "groups")]
    pub auth_groups_claim: String,
    /// A ConfigMap whose `ca.crt` holds the CAs trusted for the issuer's HTTPS (an issuer
    /// with a private CA), read from --secrets like `tls.caConfigMap`.
    #[arg(long, env = "QUIVER_AUTH_ISSUER_CA_CONFIGMAP")]
    pub auth_issuer_ca_configmap: Option<String>,
    /// RFC 8693 token exchange, for tools and upstreams with `identity.mode: exchange`: this
    /// server's client id at the issuer (of --auth-issuer). Needs
    /// --token-exchange-client-secret.
    #[arg(long, env = "QUIVER_TOKEN_EXCHANGE_CLIENT_ID")]
    pub token_exchange_client_id: Option<String>,
    /// The secret value `SECRET.KEY` (from `--secrets`) holding the token-exchange client's
    /// secret; a rotation applies to the next exchange.
    #[arg(long, env = "QUIVER_TOKEN_EXCHANGE_CLIENT_SECRET", value_parser = crate::values::parse_ref)]
    pub token_exchange_client_secret: Option<quiver_model::spec::context::SecretRef>,
    /// The issuer's token endpoint, instead of the `token_endpoint` of --auth-issuer's
    /// discovery document.
    #[arg(long, env = "QUIVER_TOKEN_EXCHANGE_ENDPOINT")]
    pub token_exchange_endpoint: Option<String>,
    /// Pin each worker thread to one CPU of the process's affinity mask.
    #[arg(long, env = "QUIVER_PIN_WORKERS")]
    pub pin_workers: bool,
    /// Worker threads (0 = one per CPU available to the process).
    #[arg(long, env = "QUIVER_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,
    /// Serve the MCP port from one single-threaded runtime per worker, each with its own
    /// listening socket on the port (SO_REUSEPORT: the kernel spreads new connections over
    /// them), instead of the shared work-stealing runtime. Cheaper per request; a
    /// connection stays on the thread that accepted it.
    #[arg(long, env = "QUIVER_PER_CORE_LISTENERS")]
    pub per_core_listeners: bool,
    /// Largest accepted request body (HTTP, else 413) or stdio line (else -32600), in bytes.
    #[arg(long, env = "QUIVER_MAX_BODY_BYTES", default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Largest response to one message or batch, in bytes; a larger one becomes a -32603 error.
    #[arg(long, env = "QUIVER_MAX_RESPONSE_BYTES", default_value_t = 8 << 20)]
    pub max_response_bytes: usize,
    /// Messages in one JSON-RPC batch (protocol 2025-03-26); a longer batch is refused with -32600.
    #[arg(long, env = "QUIVER_MAX_BATCH", default_value_t = 64)]
    pub max_batch: usize,
    /// Extra allowed Origin (repeatable; `*` allows all). Loopback origins are always allowed.
    #[arg(
        long = "allowed-origin",
        env = "QUIVER_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,
    /// Allowed `Host` header values (repeatable; `host` or `host:port`; `*` allows all).
    /// Default: loopback names only when --listen is a loopback address (DNS-rebinding
    /// protection for a server on a developer's machine); any host otherwise (in a cluster,
    /// clients use Service names, pod IPs and Ingress hosts).
    #[arg(long = "allowed-host", env = "QUIVER_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Serve a server card (the draft MCP server-card extension) at `/mcp/server-card` and
    /// list it in `/.well-known/ai-catalog.json`, under this name: reverse DNS with one
    /// slash, e.g. `com.example/weather` (3-200 characters). Off when unset. The card's
    /// version and title follow the served ToolSet's `server`.
    #[arg(long, env = "QUIVER_SERVER_CARD_NAME", value_parser = card_name)]
    pub server_card_name: Option<String>,
    /// The server card's one-line description (1-100 characters; default: the ToolSet's
    /// server title, else the card's name).
    #[arg(long, env = "QUIVER_SERVER_CARD_DESCRIPTION", value_parser = card_description)]
    pub server_card_description: Option<String>,
    /// A public URL of the MCP endpoint listed in the server card (repeatable; http or
    /// https). None: the card lists no endpoint (it never guesses one from a request).
    #[arg(long = "server-card-url", env = "QUIVER_SERVER_CARD_URLS", value_delimiter = ',', value_parser = card_url)]
    pub server_card_urls: Vec<String>,
    /// The server's documentation or home page, in the server card.
    #[arg(long, env = "QUIVER_SERVER_CARD_WEBSITE_URL", value_parser = card_url)]
    pub server_card_website_url: Option<String>,
    /// Networks of the proxies in front of the server (an Ingress controller, a gateway),
    /// comma-separated CIDRs such as 10.0.0.0/8: a caller without credentials reaching the
    /// server through one of them is counted by the client address that proxy appends to
    /// `X-Forwarded-For`, instead of by the proxy's. From any other peer the header is
    /// ignored. At most 64.
    #[arg(long, env = "QUIVER_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<crate::values::Cidr>,
    /// Requests handled at once: over HTTP more get 503; over stdio reading pauses.
    #[arg(long, env = "QUIVER_MAX_CONCURRENCY", default_value_t = 4096)]
    pub max_concurrency: usize,
    /// Connections to the MCP port; at the cap the server stops accepting and /readyz fails.
    /// Lowered at start to stay below the open-file limit with headroom.
    #[arg(long, env = "QUIVER_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,
    /// Open GET /mcp (SSE) streams; more get 503.
    #[arg(long, env = "QUIVER_MAX_STREAMS", default_value_t = 1024)]
    pub max_streams: usize,
    /// Answer tool calls of a session (protocol 2025-11-25) that run longer than this with a
    /// resumable SSE stream the server ends after this long; the client polls the rest with
    /// GET and Last-Event-ID (e.g. 30s). Unset: answer streams stay open and carry no ids.
    #[arg(long, env = "QUIVER_SSE_POLL_AFTER", value_parser = duration)]
    pub sse_poll_after: Option<Duration>,
    /// Time to send a request's headers, counted from when the connection is ready for a
    /// request, so also the keep-alive idle timeout (e.g. 10s, 500ms, 1m).
    #[arg(long, env = "QUIVER_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub header_read_timeout: Duration,
    /// Also serve HTTP/2 with prior knowledge (h2c) on the MCP port. Experimental: a client
    /// that stops reading can hold its HTTP/2 connection; see docs/protocol.md.
    #[arg(long, env = "QUIVER_HTTP2")]
    pub http2: bool,
    /// Time for a whole request body to arrive after its headers; then 408.
    #[arg(long, env = "QUIVER_BODY_READ_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub body_read_timeout: Duration,
    /// Longest a message may run; a tool call still running then ends with a tool error.
    #[arg(long, env = "QUIVER_REQUEST_TIMEOUT", default_value = "5m", value_parser = duration)]
    pub request_timeout: Duration,
    /// How long a 2026-07-28 client may reuse a list, read or discovery result without asking
    /// again (`ttlMs`). 0: always ask (listening clients also hear of every reload at once).
    #[arg(long, env = "QUIVER_CACHE_TTL", default_value = "0s", value_parser = duration)]
    pub cache_ttl: Duration,
    /// On SIGTERM, keep serving (with /readyz failing) this long so endpoints update before the
    /// listener closes. In Kubernetes set it to a few seconds (e.g. 5s).
    #[arg(long, env = "QUIVER_SHUTDOWN_DELAY", default_value = "0s", value_parser = duration)]
    pub shutdown_delay: Duration,
    /// Longest shutdown, from SIGTERM to exit (delay included): in-flight calls that have not
    /// finished by then are dropped. Keep it below the pod's terminationGracePeriodSeconds.
    #[arg(long, env = "QUIVER_SHUTDOWN_GRACE", default_value = "20s", value_parser = duration)]
    pub shutdown_grace: Duration,
    /// Tasks (of clients that declared the tasks extension, or asked for them in protocol
    /// 2025-11-25) one caller may hold at once.
    #[arg(long, env = "QUIVER_TASKS_PER_CALLER", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub tasks_per_caller: u32,
    /// Tasks all callers together may hold at once.
    #[arg(long, env = "QUIVER_TASKS_MAX", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub tasks_max: u32,
    /// Tasks all callers without credentials together may hold at once (each is counted by
    /// its address under --tasks-per-caller as well); default a quarter of --tasks-max, so
    /// that they can never take every place.
    #[arg(long, env = "QUIVER_TASKS_ANONYMOUS_MAX", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub tasks_anonymous_max: Option<u32>,
    /// How long a task and its result are kept after it was created (a task still running
    /// then is stopped); a 2025-11-25 client may ask for less.
    #[arg(long, env = "QUIVER_TASKS_TTL", default_value = "10m", value_parser = duration)]
    pub tasks_ttl: Duration,
    /// The largest result a task keeps, in bytes; a larger one fails the task (-32603). Also
    /// the most bytes of answers a task waiting for input keeps.
    #[arg(long, env = "QUIVER_TASKS_MAX_RESULT_BYTES", default_value_t = 1 << 20)]
    pub tasks_max_result_bytes: usize,
    /// The results of all tasks together, with the answers of tasks waiting for input, in
    /// bytes; a result that would go over fails its task, an answer is refused (-32004).
    #[arg(long, env = "QUIVER_TASKS_MAX_RESULTS_BYTES", default_value_t = 64 << 20)]
    pub tasks_max_results_bytes: usize,
    /// Redis `host:port` holding the tasks, shared by every replica: a task started through
    /// one replica is read, answered or cancelled through any other, and outlives the replica
    /// that ran it (password, if any, in the QUIVER_TASKS_REDIS_PASSWORD environment variable).
    #[arg(long, env = "QUIVER_TASKS_REDIS")]
    pub tasks_redis: Option<String>,
    /// Whose tasks these are, in a Redis several servers share: the start of every key.
    #[arg(long, env = "QUIVER_TASKS_REDIS_PREFIX", default_value = "")]
    pub tasks_redis_prefix: String,
    /// Longest wait for Redis per task operation (connecting included).
    #[arg(long, env = "QUIVER_TASKS_REDIS_TIMEOUT", default_value = "500ms", value_parser = duration)]
    pub tasks_redis_timeout: Duration,
    /// With --tasks-redis: connect over TLS, Redis's certificate checked against the public
    /// roots (or --tasks-redis-ca) for the address's host (or --tasks-redis-server-name). A
    /// failed handshake is a Redis that does not answer.
    #[arg(long, env = "QUIVER_TASKS_REDIS_TLS")]
    pub tasks_redis_tls: bool,
    /// With --tasks-redis-tls: a PEM file of the CAs to trust instead of the public roots.
    #[arg(long, env = "QUIVER_TASKS_REDIS_CA")]
    pub tasks_redis_ca: Option<std::path::PathBuf>,
    /// With --tasks-redis-tls: the name Redis's certificate must carry, when it is not the
    /// host of the address.
    #[arg(long, env = "QUIVER_TASKS_REDIS_SERVER_NAME")]
    pub tasks_redis_server_name: Option<String>,
    /// With --tasks-redis-tls: a PEM certificate chain presented to Redis (mutual TLS), with
    /// --tasks-redis-client-key.
    #[arg(long, env = "QUIVER_TASKS_REDIS_CLIENT_CERT")]
    pub tasks_redis_client_cert: Option<std::path::PathBuf>,
    /// The PEM private key of --tasks-redis-client-cert (hidden from stdio upstreams and exec
    /// tools).
    #[arg(long, env = "QUIVER_TASKS_REDIS_CLIENT_KEY")]
    pub tasks_redis_client_key: Option<std::path::PathBuf>,
    /// The ACL user (Redis 6 and later) to authenticate as, with the password in the
    /// QUIVER_TASKS_REDIS_PASSWORD environment variable (`AUTH user password`); without it,
    /// `AUTH password` (the `default` user).
    #[arg(long, env = "QUIVER_TASKS_REDIS_USERNAME")]
    pub tasks_redis_username: Option<String>,
    /// With --tasks-redis: on SIGTERM, how long the tasks this replica runs may go on; those
    /// still running then are recorded as failed, saying so.
    #[arg(long, env = "QUIVER_TASKS_DRAIN", default_value = "20s", value_parser = duration)]
    pub tasks_drain: Duration,
    /// Log format: text or json.
    #[arg(long, env = "QUIVER_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
    /// Stdio upstreams and exec tools run confined (Landlock) from the server's secrets: its
    /// environment and memory, the pod's credentials under /run/secrets, the `dir:` secrets
    /// tree, --hide-from-children paths. Where the kernel has no Landlock, `strict` refuses to
    /// start them and `best-effort` starts them unconfined (see docs/security.md).
    #[arg(long, env = "QUIVER_CHILD_ISOLATION", default_value = "strict")]
    pub child_isolation: crate::values::ChildIsolation,
    /// Another path (file or directory) that stdio upstreams and exec tools may not read
    /// (repeatable), e.g. a mounted key the server alone uses; a path inside a Kubernetes
    /// Secret, ConfigMap or projected volume hides the whole volume.
    #[arg(long, env = "QUIVER_HIDE_FROM_CHILDREN", value_delimiter = ',')]
    pub hide_from_children: Vec<std::path::PathBuf>,
    /// Write the audit trail (one JSON line per tool call, read, prompt and refusal) to
    /// `stdout` (the logs are on stderr) or `file:PATH`. Off when not set.
    #[arg(long, env = "QUIVER_AUDIT")]
    pub audit: Option<crate::values::AuditSink>,
    /// Audit records queued for the writer (at most 65536; each place is allocated at start,
    /// about 350 bytes); a record that finds the queue full is dropped and counted
    /// (quiver_audit_dropped_total), or with --audit-on-full refuse its call is refused.
    #[arg(
        long,
        env = "QUIVER_AUDIT_QUEUE",
        default_value_t = crate::values::DEFAULT_AUDIT_QUEUE,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::values::MAX_AUDIT_QUEUE))
    )]
    pub audit_queue: u32,
    /// What a call whose audit record cannot be queued gets: `drop` runs it and drops the
    /// record (counted in quiver_audit_dropped_total); `refuse` refuses it (-32004, counted in
    /// quiver_audit_refused_total), so that every call that ran has its record.
    #[arg(long, env = "QUIVER_AUDIT_ON_FULL", default_value = "drop")]
    pub audit_on_full: crate::values::OnFull,
    /// The McpServer this server runs for, NAMESPACE/NAME (the operator sets it): every
    /// audit record names it in `mcpServer`, so records of many servers in one log pipeline
    /// tell where they come from.
    #[arg(long, env = "QUIVER_INSTANCE")]
    pub instance: Option<crate::values::Instance>,
    /// Most (limit, caller) budgets kept in memory; idle ones are forgotten first.
    #[arg(long, env = "QUIVER_LIMITS_MAX_KEYS", default_value_t = crate::values::DEFAULT_MAX_LIMIT_KEYS)]
    pub limits_max_keys: usize,
    /// Redis `host:port` holding the budgets of `shared: true` limits (password, if any, in
    /// the QUIVER_LIMITS_REDIS_PASSWORD environment variable).
    #[arg(long, env = "QUIVER_LIMITS_REDIS")]
    pub limits_redis: Option<String>,
    /// Whose budgets these are, in a Redis several servers share: part of every key, so that
    /// servers with different prefixes never draw on each other's budgets (the operator sets
    /// NAMESPACE/NAME of the McpServer).
    #[arg(long, env = "QUIVER_LIMITS_REDIS_PREFIX", default_value = "")]
    pub limits_redis_prefix: String,
    /// Longest wait for Redis per call (connecting included).
    #[arg(long, env = "QUIVER_LIMITS_REDIS_TIMEOUT", default_value = "50ms", value_parser = duration)]
    pub limits_redis_timeout: Duration,
    /// When Redis does not answer: `open` counts the limit on this replica alone, `closed`
    /// refuses the call.
    #[arg(long, env = "QUIVER_LIMITS_REDIS_FAIL", default_value = "open")]
    pub limits_redis_fail: crate::values::FailMode,
    /// With --limits-redis: connect over TLS, Redis's certificate checked against the public
    /// roots (or --limits-redis-ca) for the address's host (or --limits-redis-server-name). A
    /// failed handshake is a Redis that does not answer.
    #[arg(long, env = "QUIVER_LIMITS_REDIS_TLS")]
    pub limits_redis_tls: bool,
    /// With --limits-redis-tls: a PEM file of the CAs to trust instead of the public roots.
    #[arg(long, env = "QUIVER_LIMITS_REDIS_CA")]
    pub limits_redis_ca: Option<std::path::PathBuf>,
    /// With --limits-redis-tls: the name Redis's certificate must carry, when it is not the
    /// host of the address.
    #[arg(long, env = "QUIVER_LIMITS_REDIS_SERVER_NAME")]
    pub limits_redis_server_name: Option<String>,
    /// With --limits-redis-tls: a PEM certificate chain presented to Redis (mutual TLS), with
    /// --limits-redis-client-key.
    #[arg(long, env = "QUIVER_LIMITS_REDIS_CLIENT_CERT")]
    pub limits_redis_client_cert: Option<std::path::PathBuf>,
    /// The PEM private key of --limits-redis-client-cert (hidden from stdio upstreams and exec
    /// tools).
    #[arg(long, env = "QUIVER_LIMITS_REDIS_CLIENT_KEY")]
    pub limits_redis_client_key: Option<std::path::PathBuf>,
    /// The ACL user (Redis 6 and later) to authenticate as, with the password in the
    /// QUIVER_LIMITS_REDIS_PASSWORD environment variable (`AUTH user password`); without it,
    /// `AUTH password` (the `default` user).
    #[arg(long, env = "QUIVER_LIMITS_REDIS_USERNAME")]
    pub limits_redis_username: Option<String>,
    /// Each user's own sign-in to upstreams with `identity.mode: user`: the public base URL
    /// browsers reach this server at (https; http only for a loopback host). The sign-in
    /// routes are under it: `/oauth/start`, `/oauth/callback` and `/oauth/client.json`.
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_URL")]
    pub upstream_sign_in_url: Option<String>,
    /// The secret value `SECRET.KEY` (from `--secrets`) holding the key ring that seals users'
    /// upstream tokens and sign-ins in flight: `KID:BASE64` lines of 32-byte AES keys, the
    /// first sealing, all opening; a rotation applies to the next read.
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_KEYS", value_parser = crate::values::parse_ref)]
    pub upstream_sign_in_keys: Option<quiver_model::spec::context::SecretRef>,
    /// This server's browser client id at the issuer of --auth-issuer: a user opening a
    /// sign-in link signs in there first, so that the link is completed only by the caller
    /// it was made for.
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_CLIENT_ID")]
    pub upstream_sign_in_client_id: Option<String>,
    /// The secret value `SECRET.KEY` (from `--secrets`) holding that browser client's secret.
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_CLIENT_SECRET", value_parser = crate::values::parse_ref)]
    pub upstream_sign_in_client_secret: Option<quiver_model::spec::context::SecretRef>,
    /// Users holding upstream tokens, at most.
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_MAX_USERS", default_value_t = 10_000)]
    pub upstream_sign_in_max_users: usize,
    /// Upstreams one user holds tokens for, at most.
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_MAX_PER_USER", default_value_t = 32)]
    pub upstream_sign_in_max_per_user: usize,
    /// Redis `host:port` holding users' upstream tokens (sealed) and used sign-in states,
    /// shared by every replica (password, if any, in the QUIVER_UPSTREAM_SIGN_IN_REDIS_PASSWORD
    /// environment variable); without it, they are in this replica's memory.
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_REDIS")]
    pub upstream_sign_in_redis: Option<String>,
    /// Whose tokens these are, in a Redis several servers share: its SHA-256 (hex) is in every
    /// key of the vault (`quiver:oauth:v1:HASH:`), so servers with different prefixes never
    /// see, count or remove each other's users, and a Redis ACL user limited to
    /// `~quiver:oauth:v1:HASH:*` reaches one prefix's keys only (the operator sets
    /// NAMESPACE/NAME/ of the McpServer).
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_REDIS_PREFIX", default_value = "")]
    pub upstream_sign_in_redis_prefix: String,
    /// Longest wait for Redis per vault operation (connecting included).
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_REDIS_TIMEOUT", default_value = "500ms", value_parser = duration)]
    pub upstream_sign_in_redis_timeout: Duration,
    /// With --upstream-sign-in-redis: connect over TLS, Redis's certificate checked against
    /// the public roots (or --upstream-sign-in-redis-ca) for the address's host (or
    /// --upstream-sign-in-redis-server-name).
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_REDIS_TLS")]
    pub upstream_sign_in_redis_tls: bool,
    /// With --upstream-sign-in-redis-tls: a PEM file of the CAs to trust instead of the public
    /// roots.
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_REDIS_CA")]
    pub upstream_sign_in_redis_ca: Option<std::path::PathBuf>,
    /// With --upstream-sign-in-redis-tls: the name Redis's certificate must carry, when it is
    /// not the host of the address.
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_REDIS_SERVER_NAME")]
    pub upstream_sign_in_redis_server_name: Option<String>,
    /// With --upstream-sign-in-redis-tls: a PEM certificate chain presented to Redis (mutual
    /// TLS), with --upstream-sign-in-redis-client-key.
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_REDIS_CLIENT_CERT")]
    pub upstream_sign_in_redis_client_cert: Option<std::path::PathBuf>,
    /// The PEM private key of --upstream-sign-in-redis-client-cert (hidden from stdio
    /// upstreams and exec tools).
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_REDIS_CLIENT_KEY")]
    pub upstream_sign_in_redis_client_key: Option<std::path::PathBuf>,
    /// The ACL user (Redis 6 and later) to authenticate as, with the password in the
    /// QUIVER_UPSTREAM_SIGN_IN_REDIS_PASSWORD environment variable; without it, `AUTH
    /// password` (the `default` user).
    #[arg(long, env = "QUIVER_UPSTREAM_SIGN_IN_REDIS_USERNAME")]
    pub upstream_sign_in_redis_username: Option<String>,
    /// Networks the authorization servers that upstreams' metadata names (and the endpoints
    /// their metadata names) may not be in, besides this host, private, link-local, cloud
    /// metadata and other addresses not reachable on the internet, which they never may:
    /// the cluster's pod and service networks when they are public addresses, other networks
    /// of the company's (repeatable or comma-separated CIDRs, at most 64). Servers the
    /// configuration names (an upstream's URL, its `identity.issuer`, --auth-issuer) are
    /// not limited by it.
    #[arg(
        long = "upstream-sign-in-deny-cidr",
        env = "QUIVER_UPSTREAM_SIGN_IN_DENY_CIDR",
        value_delimiter = ','
    )]
    pub upstream_sign_in_deny_cidrs: Vec<crate::values::Cidr>,
    /// Tests only: the authorization servers that upstreams' metadata names (and the
    /// endpoints their metadata names) may be on this host or a private address, as the
    /// tests' servers on loopback ports are. Off, such servers are refused.
    #[arg(long, hide = true)]
    pub upstream_sign_in_local_servers: bool,
    /// Traces of the server's own spans.
    #[command(flatten)]
    pub tracing: quiver_otel::TraceArgs,
    /// Traces of its outgoing calls.
    #[command(flatten)]
    pub client_tracing: quiver_otel::ClientTraceArgs,
}

/// A duration flag: `250ms`, `10s`, `1.5s`, `5m`, `1h`, in the grammar of every other
/// duration ([`quiver_model::config::parse_duration`]), so whatever an McpServer field
/// accepts, the flag it becomes accepts too.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    quiver_model::config::parse_duration(s)
}

/// Whether `s` is a name the MCP registry's schema admits (registry entries and server cards):
/// `^[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+$`, 3-200 characters.
pub fn is_registry_name(s: &str) -> bool {
    let ok = s.split_once('/').is_some_and(|(ns, rest)| {
        !ns.is_empty()
            && !rest.is_empty()
            && ns
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    });
    ok && (3..=200).contains(&s.len())
}

/// `--server-card-name`.
fn card_name(s: &str) -> Result<String, String> {
    if is_registry_name(s) {
        Ok(s.to_owned())
    } else {
        Err("expected reverse DNS with one slash, e.g. com.example/weather (letters, digits, '.', '-'; '_' after the slash; 3-200 characters)".to_owned())
    }
}

/// `--server-card-description`: one line of 1-100 characters.
fn card_description(s: &str) -> Result<String, String> {
    let n = s.chars().count();
    if (1..=100).contains(&n) && !s.chars().any(char::is_control) {
        Ok(s.to_owned())
    } else {
        Err("expected one line of 1-100 characters".to_owned())
    }
}

/// `--server-card-url`, `--server-card-website-url`: http(s), no white space, at most 2048
/// bytes.
fn card_url(s: &str) -> Result<String, String> {
    let rest = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .unwrap_or_default();
    if !rest.is_empty() && s.len() <= 2048 && !s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Ok(s.to_owned())
    } else {
        Err("expected an http:// or https:// URL without spaces (at most 2048 bytes)".to_owned())
    }
}
