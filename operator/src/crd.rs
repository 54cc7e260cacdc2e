//! The `McpServer` custom resource (`mcpservers.quiver.dev/v1alpha1`). Every field's doc
//! comment is what `kubectl explain mcpserver.spec.FIELD` prints.

// kube-derive's repeated `printcolumn(type_ = "string", ...)` arguments trip this lint.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, CSIVolumeSource, ConfigMapVolumeSource, DownwardAPIVolumeSource, EmptyDirVolumeSource,
    EnvFromSource, EnvVar, EphemeralVolumeSource, LocalObjectReference, PersistentVolumeClaimVolumeSource,
    ProjectedVolumeSource, ResourceRequirements, SecretVolumeSource, Toleration, TopologySpreadConstraint,
    VolumeMount,
};
use k8s_openapi::api::networking::v1::{NetworkPolicyEgressRule, NetworkPolicyPeer};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use quiver_model::config::governance::LimitSpec;
use quiver_model::config::upstream::UpstreamSpec;
use quiver_model::config::{PromptSpec, ResourceSpec, ServerInfo, ToolSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The schema's rule over `spec.ingress.annotations` (the operator's own check is
/// `raw_config_annotation` in `build::confine`, the same class).
pub const RAW_CONFIG_ANNOTATIONS: &str = "self.all(k, !(k.lowerAscii().contains('snippet') || k.lowerAscii().startsWith('config-') || k.lowerAscii().contains('/config-') || k.lowerAscii().contains('-config-') || k.lowerAscii().endsWith('-config')))";

/// Limits that keep the CEL rules' cost bounded.
pub const MAX_TOOLS: usize = 256;
/// Label a `toolsFrom` ConfigMap carries to be watched: its edits then propagate at once.
pub const TOOLS_LABEL: (&str, &str) = ("quiver.dev/tools", "true");
/// Annotation by which the owner of a ServiceAccount lets McpServers run as it
/// (`podTemplate.serviceAccountName`): their names, comma-separated, or `*` for every
/// McpServer of the namespace.
pub const ALLOWED_MCPSERVERS: &str = "quiver.dev/allowed-mcpservers";
/// SELinux types the restricted Pod Security profile allows (or none: the runtime's default).
pub const SELINUX_TYPES: [&str; 3] = ["container_t", "container_init_t", "container_kvm_t"];
/// Annotation prefixes that choose an AppArmor or seccomp profile (the restricted profile
/// allows only the runtime's default or a profile on the node).
pub const PROFILE_ANNOTATIONS: [&str; 3] = [
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
];

/// An MCP server deployed by Quiver: a Deployment of quiver-server serving the tools below,
/// hot-reloaded from a ConfigMap the operator keeps in sync.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "quiver.dev",
    version = "v1alpha1",
    kind = "McpServer",
    namespaced,
    status = "McpServerStatus",
    shortname = "qmcp",
    category = "quiver",
    doc = "An MCP server deployed by Quiver: a tuned Deployment of quiver-server serving YAML-declared tools",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Replicas", type_ = "string", json_path = ".status.replicasSummary"),
    printcolumn(name = "Tools", type_ = "integer", json_path = ".status.toolCount"),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".status.endpoint"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("!(has(self.replicas) && has(self.autoscaling))").message("set either replicas or autoscaling, not both"))]
#[serde(rename_all = "camelCase")]
pub struct McpServerSpec {
    /// Number of server pods. Omit when `autoscaling` is set (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: Option<i32>,
    /// quiver-server image; defaults to the operator's configured server image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// Image pull policy (Always, IfNotPresent, Never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["Always", "IfNotPresent", "Never"]))]
    pub image_pull_policy: Option<String>,
    /// Server identity reported to MCP clients (name, version, title, instructions, pageSize).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerInfo>,
    /// Tools, in the ToolSet format (see docs/toolset.md). Names are unique (a list map keyed
    /// by `name`, enforced by the API server). Editing them updates the ConfigMap only:
    /// running pods hot-reload it, nothing restarts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub tools: Vec<ToolSpec>,
    /// More tools from ConfigMap keys holding ToolSet documents. Label those ConfigMaps
    /// `quiver.dev/tools: "true"` and their edits propagate at once; unlabelled ones are re-read
    /// every 5 minutes (the McpServer gets a Warning event and `status.unwatchedConfigMaps`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub tools_from: Vec<ToolsFrom>,
    /// MCP resources (static or URI-templated text), in the ToolSet format.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub mcp_resources: Vec<ResourceSpec>,
    /// MCP prompt templates, in the ToolSet format.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub prompts: Vec<PromptSpec>,
    /// MCP servers whose tools this server serves as its own (the ToolSet `upstreams`
    /// format, see docs/upstreams.md): remote ones over Streamable HTTP, stdio programs in
    /// the server's container, or with `stdio.image` in a sidecar container of that image.
    /// Changing only an upstream's `tools` updates the ConfigMap: nothing restarts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub upstreams: Vec<UpstreamSpec>,
    /// OpenAPI documents whose operations this server serves as http tools (the ToolSet
    /// `openapi` format, see docs/openapi.md): inline (`document`), or fetched by the pods
    /// from a `url` when they load the config and every `fetch.refresh`. For the cluster's
    /// own API server: `url: https://kubernetes.default.svc/openapi/v3/api/v1` with
    /// `fetch.caFile` and `fetch.tokenFile` under
    /// `/var/run/secrets/kubernetes.io/serviceaccount/` (the server container's own
    /// ServiceAccount token and the cluster CA; reading `/openapi/*` is granted to every
    /// authenticated account by the default `system:discovery` role). Calls carry the
    /// source's `headers` or, with `identity.mode: forward`, the caller's own token.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub openapi: Vec<quiver_model::config::openapi::OpenApiSpec>,
    /// Named policies: CEL conditions on the caller, the request and its arguments that a
    /// tool call, resource read or prompt get must meet: without selectors on every one of
    /// them, else on the tools picked by `tools` (names, or prefixes ending in `*`) and
    /// `upstreams`, the resources picked by `resources` (their `uri` or `uriTemplate`) and
    /// the prompts picked by `prompts` (the ToolSet `policies` format, see
    /// docs/governance.md). An expression that does not compile makes `ConfigValid` false,
    /// naming the field, and the last good ConfigMap stays.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub policies: Vec<quiver_model::config::policy::PolicySpec>,
    /// Compute resources of the server container. With `tuning.cpuPinning`, CPU comes from
    /// `tuning.cpus` and requests are set equal to limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Scheduling overrides of the server pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<PodOverrides>,
    /// Performance tuning of the server pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<Tuning>,
    /// Horizontal autoscaling on CPU (creates a HorizontalPodAutoscaler). Exclusive with `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
    /// The Service in front of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceOptions>,
    /// Browser origins allowed to call the server besides loopback ones (`*` = any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 256)))]
    pub allowed_origins: Vec<String>,
    /// Prometheus integration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitoring: Option<Monitoring>,
    /// OpenTelemetry traces of every MCP request, exported by the pods over OTLP/HTTP (off
    /// when unset). See docs/observability.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<Tracing>,
    /// Client authentication on the MCP endpoint (off when unset: anyone who reaches the
    /// Service may call every tool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<Auth>,
    /// A NetworkPolicy for the pods (none when unset). Set (even `{}`), the pods accept
    /// connections only on the MCP and admin ports, from the peers listed, and connect only to
    /// DNS, the API server and the `egress` destinations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicyOptions>,
    /// Expose the MCP endpoint through an Ingress (paths `/mcp` and
    /// `/.well-known/oauth-protected-resource`). Turn on `auth` first: an exposed server
    /// without it serves anyone who reaches the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<IngressOptions>,
    /// Expose the MCP endpoint through a Gateway API HTTPRoute (same paths; applied only when
    /// the gateway.networking.k8s.io CRDs are installed, otherwise a Warning event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_route: Option<HttpRouteOptions>,
    /// Log filter of the server pods in `RUST_LOG` syntax: a level (`debug`) or
    /// comma-separated `target=level` directives (`info,quiver_server::upstream=debug`).
    /// Levels: off, error, warn, info, debug, trace. Default `info`; when unset, a `RUST_LOG`
    /// in `podTemplate.env` is used instead. The operator's own log level never applies here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[A-Za-z0-9_:=,.-]+$"))]
    pub log_level: Option<String>,
    /// Send each client's connections to the same pod (the Service's `ClientIP` affinity), for
    /// clients of the handshake-era revisions (2025-06-18, 2025-11-25) whose sampling or
    /// elicitation answers must reach the pod running the call. Clients behind one NAT or
    /// proxy (an Ingress controller) share an IP: use a sticky Ingress for those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<SessionAffinity>,
    /// Networks of the proxies in front of the pods (an Ingress controller, a gateway, a
    /// mesh ingress), as CIDRs such as `10.0.0.0/8` or single addresses; at most 64. Clients
    /// without credentials are counted by their address (their per-caller limits, tasks and
    /// task polling): one that reaches a pod through a listed proxy is counted by the
    /// address that proxy appends to `X-Forwarded-For` instead of by the proxy's own. From
    /// any other peer the header is ignored. Empty: every client is counted by the address
    /// its connection comes from (behind a proxy, all of them share the proxy's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(length(min = 2, max = 43), regex(pattern = r"^[0-9A-Fa-f:.]+(/[0-9]{1,3})?$"))
    )]
    pub trusted_proxies: Vec<String>,
    /// Rate and concurrency limits on every tool call of the server (tools and upstreams
    /// have `limits` of their own); see docs/governance.md.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub limits: Vec<LimitSpec>,
    /// Where `shared: true` limits are counted, so every replica shares one budget (without
    /// it, every limit counts per replica).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits_redis: Option<LimitsRedis>,
    /// Tasks: calls of slow tools answered with a task the client polls, whose result
    /// outlives the client's connection (see docs/protocol.md, Tasks). With `redis`, every
    /// replica serves every task and a stopping pod finishes its tasks first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<TasksSpec>,
    /// The audit trail: one JSON record per tool call, resource read, prompt and refusal,
    /// written to the container's stdout (the logs are on stderr). Off when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditOptions>,
    /// Tool search, for servers with many tools: `tools/list` shows only `coreTools` and a
    /// `find_tools` tool that returns the tools best matching a plain-language query, with
    /// their schemas; every tool stays callable by name under the same checks (see
    /// docs/toolset.md). A `toolsFrom` document's `toolSearch` applies when this is unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_search: Option<quiver_model::config::search::ToolSearchSpec>,
    /// What every tool's results are searched for (secrets: private keys, cloud and SaaS
    /// keys, tokens; personal data: e-mail addresses, phone, card and IBAN numbers) and
    /// whether each finding is flagged, redacted or the result withheld; a tool, upstream or
    /// OpenAPI source may declare its own `resultGuards` (see docs/guards.md). A `toolsFrom`
    /// document's `resultGuards` applies when this is unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_guards: Option<quiver_model::config::guards::ResultGuardSpec>,
    /// Guardrail webhooks: services (Open Policy Agent, or any that answers its Data API)
    /// asked about tool calls before they run (`on: arguments`) or about results before
    /// they are sent (`on: result`); each allows, refuses, or (`type: mutating`) rewrites,
    /// with a CA, a client certificate, an HMAC signature, a timeout and a `failurePolicy`
    /// (see docs/guards.md). A `toolsFrom` document's `webhooks` are added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub webhooks: Vec<quiver_model::config::webhooks::WebhookSpec>,
    /// How the server appears in the operator's catalog, the MCP Registry API that lists the
    /// McpServers a caller may see (see docs/catalog.md): listed or not, its one-line
    /// description, home page, the URL clients connect to, and a deprecation message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog: Option<CatalogOptions>,
}

/// An McpServer's entry in the catalog. Its registry name is derived, never chosen here
/// (`PREFIX.NAMESPACE/NAME`), so no McpServer can take the name of another namespace's.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CatalogOptions {
    /// List the server in the catalog (default true); false hides it from every caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listed: Option<bool>,
    /// What the server does, in one line (default: its title, else its name and namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub description: Option<String>,
    /// The server's documentation or home page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub website_url: Option<String>,
    /// The MCP URL clients connect to (default: `https://HOST/mcp` of the Ingress (`http`
    /// without its TLS Secret) or of the HTTPRoute's first hostname, else the Service's
    /// in-cluster URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub url: Option<String>,
    /// Marks the server deprecated in the catalog (status `deprecated`), with this message
    /// for its users (e.g. what replaces it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 500))]
    pub deprecated: Option<String>,
    /// Serve a server card (the draft MCP server-card extension) at `/mcp/server-card` and
    /// an AI Catalog at `/.well-known/ai-catalog.json`: this entry's name, description,
    /// website and public URL (never the in-cluster one), the server's version, title and
    /// protocol revisions. Off by default while the extension is a draft.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_card: Option<bool>,
}

/// Client-IP session affinity of the Service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionAffinity {
    /// How long a client stays on its pod after its last connection (default 10800: 3 hours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: Option<i32>,
}

/// An Ingress in front of the Service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct IngressOptions {
    /// Host name clients use.
    #[schemars(length(min = 1, max = 253))]
    pub host: String,
    /// IngressClass (default: the cluster's default class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub class_name: Option<String>,
    /// TLS Secret for `host` (terminated by the ingress controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub tls_secret_name: Option<String>,
    /// Annotations for the ingress controller. Keys that put raw configuration into a
    /// controller every tenant shares are refused: any key holding `snippet` (ingress-nginx's
    /// `configuration-snippet`, `server-snippet`, `auth-snippet`; NGINX Inc's
    /// `nginx.org/server-snippets`, `location-snippets`; HAProxy's `backend-config-snippet`,
    /// ...) and any key naming a raw configuration section (`config-*`, `*-config-*`,
    /// `*-config`, e.g. haproxy-ingress's `config-backend`), compared in lower case.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64, "additionalProperties" = {"type": "string", "maxLength": 4096}))]
    #[x_kube(validation = Rule::new(RAW_CONFIG_ANNOTATIONS).message("annotations holding snippet (ingress-nginx's *-snippet, nginx.org's *-snippets, HAProxy's *-config-snippet) or naming a raw configuration section (config-*, *-config-*, *-config) inject raw configuration into the shared ingress controller and are refused"))]
    pub annotations: BTreeMap<String, String>,
}

/// A Gateway API HTTPRoute to the Service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteOptions {
    /// Gateways (and listeners) the route attaches to.
    #[schemars(length(min = 1, max = 32))]
    pub parent_refs: Vec<ParentRef>,
    /// Host names the route answers for (empty: the listeners').
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 253)))]
    pub hostnames: Vec<String>,
}

/// A Gateway reference.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    /// Gateway name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Gateway namespace (default: the McpServer's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
    /// Listener name on the Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub section_name: Option<String>,
}

/// The pods' NetworkPolicy. It takes effect where the cluster's network plugin enforces
/// NetworkPolicies.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicyOptions {
    /// Who may reach the MCP port (pods, namespaces, CIDRs). Empty: every source.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub mcp_from: Vec<NetworkPolicyPeer>,
    /// Who may reach the admin port (metrics, `/status`; the kubelet's probes come from the
    /// node). Empty: every source.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub admin_from: Vec<NetworkPolicyPeer>,
    /// Where the pods may connect besides DNS (port 53) and the API server: the hosts (CIDRs)
    /// and Services (pod selectors) that http tools call. Empty: nowhere else.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub egress: Vec<NetworkPolicyEgressRule>,
    /// The DNS servers the pods may query (port 53). Empty: the cluster DNS, pods labelled
    /// `k8s-app: kube-dns` in namespace `kube-system`. Set it where DNS runs elsewhere, e.g. a
    /// node-local cache (`ipBlock: {cidr: 169.254.20.10/32}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub dns_peers: Vec<NetworkPolicyPeer>,
}

/// Client authentication.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.tokenExchange) || has(self.oidc)").message("tokenExchange needs oidc: only callers' validated access tokens are exchanged").field_path(".tokenExchange"))]
#[x_kube(validation = Rule::new("!has(self.upstreamSignIn) || has(self.oidc)").message("upstreamSignIn needs oidc: each user's upstream tokens are kept under the identity of their validated access token").field_path(".upstreamSignIn"))]
pub struct Auth {
    /// Require `Authorization: Bearer TOKEN`, with the accepted tokens (one per line, `#`
    /// comments allowed, at least 16 characters each) in this Secret key. Editing the Secret
    /// takes effect on the next request, without a restart; list old and new tokens together
    /// while clients move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_secret_ref: Option<SecretKey>,
    /// Accept OAuth 2.1 / OIDC access tokens (JWTs signed RS256 or ES256) of this issuer, as
    /// the MCP authorization specification describes: the pods publish the protected-resource
    /// metadata (`/.well-known/oauth-protected-resource`) and answer 401 with a
    /// `WWW-Authenticate` pointing at it. With `bearerTokenSecretRef` too, either is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oidc: Option<OidcAuth>,
    /// RFC 8693 token exchange at the OIDC issuer, for tools and upstreams with
    /// `identity.mode: exchange`: the pods exchange each caller's access token for one
    /// addressed to the upstream, as this client. Needs `oidc`. See docs/governance.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_exchange: Option<TokenExchange>,
    /// Each user's own sign-in to third-party upstreams (upstreams with `identity.mode:
    /// user`, such as a SaaS MCP server with its own OAuth authorization server): a caller
    /// without a token for such an upstream gets a sign-in link, signs in there in a browser,
    /// and the pods keep that user's tokens (sealed with the key ring) and refresh them.
    /// Needs `oidc`. See docs/upstreams.md and docs/operator.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_sign_in: Option<UpstreamSignIn>,
}

/// This server's client at the OIDC issuer, for token exchange. The client secret stays in
/// its Secret: the pods read it through the API (it is never in the pod spec).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenExchange {
    /// The client id (the issuer must allow it to exchange tokens for the upstreams'
    /// audiences).
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^[^\s]+$"))]
    pub client_id: String,
    /// The Secret key holding the client secret (HTTP Basic client authentication).
    pub client_secret_ref: SecretKey,
    /// The issuer's token endpoint (default: `token_endpoint` of its discovery document).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^https?://[^\s]+$"))]
    pub token_endpoint: Option<String>,
}

/// Where users sign in to upstreams, what seals their tokens, and where the tokens are kept.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamSignIn {
    /// The public base URL browsers reach this server at, without a path: `https://HOST` or
    /// `https://HOST:PORT` (`http` only for a loopback host: `localhost`, `127.x.x.x`,
    /// `[::1]`, e.g. through `kubectl port-forward`). Sign-in links and the upstreams'
    /// redirects go to `/oauth/start`, `/oauth/callback` and `/oauth/client.json` under it;
    /// the McpServer's Ingress or HTTPRoute routes `/oauth` to the pods, so with either, the
    /// host must be one it serves.
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^https?://[^\s/?#@]+/?$"))]
    #[x_kube(validation = Rule::new(SIGN_IN_URL_RULE).message("url must be https (http only for a loopback host: localhost, 127.x.x.x or [::1]): browsers carry users' authorization codes to it"))]
    pub url: String,
    /// The Secret key holding the key ring that seals users' upstream tokens: lines of
    /// `KID:BASE64`, each a 32-byte AES key in base64 under a short key id; the first line
    /// seals, every line opens. To rotate, add a new first line and keep the old ones until
    /// the tokens sealed under them are gone: the pods read the Secret through the API, so
    /// an edit applies without a restart. A token no key opens is dropped (its user signs
    /// in again).
    pub keys_secret_ref: SecretKey,
    /// This server's browser client at the `oidc` issuer: whoever opens a sign-in link signs
    /// in there first, so a link completes only for the caller it was made for.
    pub browser_client: BrowserClient,
    /// The Redis keeping users' upstream tokens (sealed) for every replica, and surviving
    /// pod restarts. Without it each pod keeps the tokens of the users it served in memory:
    /// a user signs in again on another replica or after a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<SignInRedis>,
    /// Users holding upstream tokens, at most (default 10000). In memory the least recently
    /// used user is forgotten for a new one; in Redis a new user is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub max_users: Option<u32>,
    /// Upstreams one user holds tokens for, at most (default 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 512))]
    pub max_per_user: Option<u32>,
    /// Networks (`ADDRESS/BITS`, or one address) the authorization servers an upstream's
    /// metadata names, and the endpoints their metadata names, may not be in, besides the
    /// private, loopback, link-local, metadata and other special-purpose addresses they
    /// never may be in. Name the cluster's pod and service networks here when they are
    /// public addresses, so that a third party's metadata cannot point the pods at the
    /// cluster's own services. At most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(length(min = 1, max = 64), regex(pattern = r"^[0-9A-Fa-f:.]+(/[0-9]{1,3})?$"))
    )]
    pub denied_networks: Vec<String>,
}

/// The rule of `upstreamSignIn.url` beyond its pattern: https, or http to a loopback host.
pub const SIGN_IN_URL_RULE: &str = r"self.startsWith('https://') || self.matches('^http://(localhost|127\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}|\\[::1\\])(:[0-9]{1,5})?/?$')";

/// The gateway's own client at the client-facing issuer, for sign-in links.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BrowserClient {
    /// The client id (a confidential client whose redirect URI is the sign-in `url`
    /// followed by `/oauth/callback`).
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^[^\s]+$"))]
    pub client_id: String,
    /// The Secret key holding the client secret; read through the API like the key ring.
    pub client_secret_ref: SecretKey,
}

/// The Redis keeping users' upstream tokens.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SignInRedis {
    /// Where Redis is, who the pods are to it, and TLS.
    #[serde(flatten)]
    pub connection: RedisConnection,
    /// Longest wait for Redis per token operation, e.g. `500ms` (default), at most `5s`;
    /// the TLS handshake included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([1-9][0-9]{0,3}ms|[1-5]s)$"))]
    pub timeout: Option<String>,
}

/// An OAuth 2.1 / OIDC issuer.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct OidcAuth {
    /// The issuer URL (`iss` of accepted tokens); its `/.well-known/openid-configuration` or
    /// `/.well-known/oauth-authorization-server` names the key set.
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^https?://[^\s]+$"))]
    pub issuer: String,
    /// The audience accepted tokens must name (`aud`): the URL clients use for this server,
    /// or another value the issuer puts there (e.g. `quiver`); with one that is not a URL,
    /// set `resource` so that clients that sign in by themselves find the issuer.
    #[schemars(length(min = 1, max = 1024))]
    pub audience: String,
    /// The issuer's JWK set URL, to skip discovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^https?://[^\s]+$"))]
    pub jwks_uri: Option<String>,
    /// The MCP endpoint's canonical URL in the protected-resource metadata (default: the
    /// audience when it is a URL, else `http://HOST/mcp` for the first allowed host; never
    /// taken from a request's Host header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^https?://[^\s]+$"))]
    pub resource: Option<String>,
    /// The access-token claim listing the caller's groups, for tools with `access.groups`
    /// (default `groups`): a claim name, or a dotted path such as `realm_access.roles`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[^\s=]+$"))]
    pub groups_claim: Option<String>,
    /// A ConfigMap of this namespace whose `ca.crt` holds the CAs to trust for the issuer's
    /// HTTPS instead of the public roots (an issuer with a private CA); watched, so an edit
    /// applies to the next fetch of its keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub ca_config_map: Option<String>,
}

/// A key of a Secret in the McpServer's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
pub struct SecretKey {
    /// Secret name (lower-case letters, digits and `-`).
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Key within the Secret (letters, digits, `-` and `_`).
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[A-Za-z0-9_-]+$"))]
    pub key: String,
}

/// A ConfigMap key holding a ToolSet document.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolsFrom {
    /// The ConfigMap (same namespace) and key.
    pub config_map_key_ref: ConfigMapKey,
}

/// A key of a ConfigMap in the McpServer's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
pub struct ConfigMapKey {
    /// ConfigMap name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key holding a ToolSet YAML document.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Scheduling overrides.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodOverrides {
    /// Node labels the pods must match.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64, "additionalProperties" = {"type": "string", "maxLength": 63}))]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub tolerations: Vec<Toleration>,
    /// Affinity of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Extra labels on the pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64, "additionalProperties" = {"type": "string", "maxLength": 63}))]
    pub labels: BTreeMap<String, String>,
    /// Extra annotations on the pods. AppArmor and seccomp annotations may only name the
    /// runtime's default (`runtime/default`) or a profile on the node (`localhost/...`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64, "additionalProperties" = {"type": "string", "maxLength": 4096}))]
    #[x_kube(validation = Rule::new("self.all(k, !(k.startsWith('container.apparmor.security.beta.kubernetes.io/') || k.startsWith('seccomp.security.alpha.kubernetes.io/') || k.startsWith('container.seccomp.security.alpha.kubernetes.io/')) || self[k] == 'runtime/default' || self[k].startsWith('localhost/'))").message("AppArmor and seccomp annotations may only name runtime/default or a localhost/ profile"))]
    pub annotations: BTreeMap<String, String>,
    /// Secrets for pulling the server image from a private registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Run the pods as this existing ServiceAccount (e.g. one bound to a cloud workload
    /// identity) instead of the one Quiver creates. Its owner must consent: the
    /// ServiceAccount carries the annotation `quiver.dev/allowed-mcpservers` listing this
    /// McpServer's name (comma-separated names, or `*`); otherwise the spec is invalid and the
    /// pods stay as they are. Quiver binds its config-reading Role to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub service_account_name: Option<String>,
    /// Extra environment variables of the server container (e.g. for exec tools' programs;
    /// exec tools themselves see only their own `env`). The operator sets `QUIVER_ALLOCATOR`,
    /// `QUIVER_SHUTDOWN_DELAY`, `QUIVER_SHUTDOWN_GRACE` and `QUIVER_STATE_KEY` after these, so
    /// its values win for those names; `RUST_LOG` here applies unless `logLevel` is set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub env: Vec<EnvVar>,
    /// Extra environment of the server container from ConfigMaps or Secrets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub env_from: Vec<EnvFromSource>,
    /// Extra volumes of the pods (e.g. programs or data for exec tools), of the kinds the
    /// restricted Pod Security profile allows: configMap, secret, emptyDir, projected,
    /// downwardAPI, persistentVolumeClaim, ephemeral, csi.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub volumes: Vec<PodVolume>,
    /// Where the server container mounts `volumes` (not over the ServiceAccount token at
    /// `/var/run/secrets/kubernetes.io`, nor under `/quiver`; mount propagation `None` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.all(m, !has(m.mountPropagation) || m.mountPropagation == 'None')").message("mountPropagation other than None needs a privileged container"))]
    pub volume_mounts: Vec<VolumeMount>,
    /// PriorityClass of the pods (not one of the `system-` classes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("!self.startsWith('system-')").message("the system- PriorityClasses are for cluster components"))]
    pub priority_class_name: Option<String>,
    /// How the pods spread across zones or nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// Security settings that stay within the Pod Security "restricted" profile (the pods
    /// always run as non-root, without privilege escalation, with every capability dropped
    /// and a read-only root filesystem; these fields cannot change that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<PodSecurity>,
}

/// Security settings of the server pods within the restricted profile.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSecurity {
    /// UID of the server process (default 65532); never 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2147483647))]
    pub run_as_user: Option<i64>,
    /// GID of the server process (default 65532); never 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2147483647))]
    pub run_as_group: Option<i64>,
    /// Group owning mounted volumes (default 65532).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2147483647))]
    pub fs_group: Option<i64>,
    /// Extra groups of the server process (e.g. to read a mounted volume).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(range(min = 1, max = 2147483647)))]
    pub supplemental_groups: Vec<i64>,
    /// A seccomp profile on the node (`Localhost`) instead of the runtime's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub seccomp_localhost_profile: Option<String>,
    /// SELinux context of the pods, within the restricted profile: a `type` of
    /// container_t, container_init_t or container_kvm_t, and a `level`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub se_linux_options: Option<SeLinux>,
}

/// An SELinux context the restricted Pod Security profile allows (no user or role).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SeLinux {
    /// SELinux type (default: the runtime's).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["container_t", "container_init_t", "container_kvm_t"]))]
    pub type_: Option<String>,
    /// SELinux level (MCS label, e.g. `s0:c123,c456`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub level: Option<String>,
}

/// A volume of the server pods: its name and exactly one source, of the kinds the restricted
/// Pod Security profile allows.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.configMap), has(self.secret), has(self.emptyDir), has(self.projected), has(self.downwardAPI), has(self.persistentVolumeClaim), has(self.ephemeral), has(self.csi)].filter(x, x).size() == 1").message("a volume sets exactly one of configMap, secret, emptyDir, projected, downwardAPI, persistentVolumeClaim, ephemeral, csi (the kinds the restricted Pod Security profile allows)"))]
pub struct PodVolume {
    /// Volume name (a DNS label), referred to by `volumeMounts`.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// A ConfigMap's keys as files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapVolumeSource>,
    /// A Secret's keys as files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretVolumeSource>,
    /// A directory that lives as long as the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<EmptyDirVolumeSource>,
    /// Several sources in one directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projected: Option<ProjectedVolumeSource>,
    /// Pod fields as files.
    #[serde(default, rename = "downwardAPI", skip_serializing_if = "Option::is_none")]
    pub downward_api: Option<DownwardAPIVolumeSource>,
    /// A PersistentVolumeClaim of the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    /// A volume claimed for the pod's lifetime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<EphemeralVolumeSource>,
    /// An inline CSI volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csi: Option<CSIVolumeSource>,
}

/// A tuning profile: defaults for sysctls and worker sizing.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// Defaults suitable for most servers.
    #[default]
    Balanced,
    /// Short keepalives and fast failure detection for interactive clients.
    Latency,
    /// Wide ephemeral port range and quick TIME_WAIT reuse for many upstream calls.
    Throughput,
}

/// The memory allocator of the server process.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Allocator {
    /// jemalloc (default): lower fragmentation and faster multi-threaded allocation.
    #[default]
    Jemalloc,
    /// The C library's malloc.
    System,
}

/// Performance tuning.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.cpuPinning) || !self.cpuPinning || has(self.cpus)").message("cpuPinning needs cpus: the whole number of exclusive CPUs each pod gets").field_path(".cpus"))]
pub struct Tuning {
    /// Profile whose sysctls apply unless overridden in `sysctls`.
    #[serde(default)]
    pub profile: Profile,
    /// Exclusive CPUs: Guaranteed QoS (requests = limits, `cpus` whole CPUs) so the kubelet's
    /// static CPU manager gives the pod dedicated cores, and each worker thread pinned to one
    /// of them. Requires `cpus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_pinning: Option<bool>,
    /// Whole CPUs per pod with `cpuPinning` (sets the container's CPU request and limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub cpus: Option<u32>,
    /// Memory allocator.
    #[serde(default)]
    pub allocator: Allocator,
    /// Worker threads; 0 or unset = one per CPU the pod gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 256))]
    pub worker_threads: Option<u32>,
    /// Serve the MCP port from one single-threaded runtime per worker thread, each with its
    /// own socket on the port (SO_REUSEPORT), instead of one work-stealing runtime: less CPU
    /// per call; a connection stays on the core that accepted it, so it suits many client
    /// connections (or a proxy in front) more than a few busy ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_core_listeners: Option<bool>,
    /// Namespaced sysctls from the kubelet's safe set (e.g. net.ipv4.ip_local_port_range,
    /// net.ipv4.tcp_keepalive_time). Overrides the profile's values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32, "additionalProperties" = {"type": "string", "maxLength": 256}))]
    pub sysctls: BTreeMap<String, String>,
    /// Namespaced sysctls outside the safe set (e.g. net.core.somaxconn). Pods using them are
    /// only admitted on nodes whose kubelet lists them in `allowedUnsafeSysctls`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32, "additionalProperties" = {"type": "string", "maxLength": 256}))]
    pub unsafe_sysctls: BTreeMap<String, String>,
}

/// Autoscaling on CPU utilization.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas").message("minReplicas must not exceed maxReplicas"))]
pub struct Autoscaling {
    /// Fewest pods.
    #[schemars(range(min = 1, max = 1000))]
    pub min_replicas: i32,
    /// Most pods.
    #[schemars(range(min = 1, max = 1000))]
    pub max_replicas: i32,
    /// Average CPU utilization (percent of requests) to aim for (default 70).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub target_cpu_utilization: Option<i32>,
}

/// Service options.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceOptions {
    /// Port of the MCP endpoint (default 8080).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// Service type: ClusterIP (default), NodePort or LoadBalancer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["ClusterIP", "NodePort", "LoadBalancer"]))]
    #[serde(rename = "type")]
    pub type_: Option<String>,
    /// Also expose the admin port (9090: metrics, `/status`, probes) through the Service. Off
    /// by default: the admin port never serves MCP, and only Prometheus and the kubelet need
    /// it (a ServiceMonitor turns it on, as it scrapes through the Service).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expose_admin: bool,
}

/// Prometheus integration.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Monitoring {
    /// Create a ServiceMonitor (only when the monitoring.coreos.com CRD exists). Unset: the
    /// operator's default (the chart's `mcpServerDefaults.serviceMonitor`, off unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_monitor: Option<bool>,
    /// Labels of the ServiceMonitor, added to the operator's default ones (the chart's
    /// `server.serviceMonitorLabels`); a key both set takes this value. A Prometheus picks
    /// its ServiceMonitors by label: kube-prometheus-stack's default selects
    /// `release: <its release name>`. Keys under `app.kubernetes.io/` and `quiver.dev/` are
    /// the operator's.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    pub service_monitor_labels: std::collections::BTreeMap<String, String>,
}

/// Where and how much the server pods trace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tracing {
    /// The collector's OTLP/HTTP endpoint (protobuf), e.g.
    /// `http://otel-collector.observability:4318` (`/v1/traces` is added).
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub endpoint: String,
    /// Probability that a request without a sampled parent starts a trace (0 to 1). A request
    /// whose client sampled it is always traced when `trustClientSampling` trusts that client;
    /// any other is traced with this probability, decided on its trace id. Default 1 (every
    /// request); lower it for busy servers (0.01 keeps one request in a hundred).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub sampling_ratio: Option<f64>,
    /// `service.name` of the spans (default: the McpServer's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_name: Option<String>,
    /// Headers sent with every export (e.g. a vendor's API key), from a Secret key holding
    /// them as `name=value` pairs separated by commas (the OTEL_EXPORTER_OTLP_HEADERS format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers_secret_ref: Option<SecretKey>,
    /// Whose `traceparent` sampled flag decides that a request is traced (and exported):
    /// `authenticated` (default: callers whose credentials `auth` accepted), `never` or
    /// `always` (anyone who reaches the Service may make the pods export spans). Any other
    /// request still continues its client's trace id; whether it is traced is decided by
    /// `samplingRatio` on that id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_client_sampling: Option<TrustClientSampling>,
    /// Pass clients' `tracestate` on to upstreams and http tools' APIs (and into the
    /// exported spans). Default false: it is dropped as it arrives, so a client's text does
    /// not travel verbatim to the services a call reaches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_trace_state: Option<bool>,
}

/// Whose `traceparent` sampled flag decides that a request is traced (and exported):
/// `authenticated` (default: callers whose credentials `auth` accepted), `never` or `always`
/// (anyone who reaches the Service may make the pods export spans). Any other request still
/// continues its client's trace id; whether it is traced is decided by `samplingRatio` on
/// that id.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrustClientSampling {
    /// No client's: the server decides from the trace id.
    Never,
    /// Callers that authenticated (the default).
    #[default]
    Authenticated,
    /// Every client's.
    Always,
}

/// Observed state.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpServerStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (every desired pod ready and up to date), `Progressing` (a rollout under
    /// way), `ConfigValid` (the spec renders to a valid config; when False its message lists
    /// the problems and the pods keep serving the last valid one), `Degraded` (the spec is
    /// invalid, pods cannot be created, the rollout stalled, or a child object belongs to
    /// someone else), and with `upstreams` `UpstreamsReady` (every upstream connected on the
    /// pods that answered).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Pods of the Deployment.
    #[serde(default)]
    pub replicas: i32,
    /// Ready pods.
    #[serde(default)]
    pub ready_replicas: i32,
    /// `ready/desired`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas_summary: Option<String>,
    /// Label selector of the pods (for the scale subresource and HPAs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Tools in the served config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_count: Option<i32>,
    /// Content hash of the served config (pods report it on /status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
    /// Ready pods that have loaded `configHash`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_loaded_replicas: Option<i32>,
    /// In-cluster MCP endpoint URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Keys of `tuning.sysctls` outside the kubelet's safe set (a Warning event is emitted when
    /// this list changes).
    // Serialized when empty too: the status is written as a merge patch, where an omitted
    // field would keep its old value.
    #[serde(default)]
    pub unsafe_sysctls: Vec<String>,
    /// `toolsFrom` ConfigMaps without the `quiver.dev/tools: "true"` label: their edits are
    /// picked up by the 5-minute re-read, not at once (a Warning event is emitted when this list
    /// changes).
    #[serde(default)]
    pub unwatched_config_maps: Vec<String>,
    /// The protocol revision each connected upstream is spoken to in, as the pods report it
    /// (with `upstreams`).
    #[serde(default)]
    pub upstream_revisions: Vec<UpstreamRevision>,
}

/// The protocol revision one upstream is spoken to in.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamRevision {
    /// The upstream's `name`.
    pub name: String,
    /// Its revision, e.g. `2025-06-18` or `2026-07-28` (two, comma-separated, while the pods
    /// differ).
    pub protocol_version: String,
}

/// The Redis holding the budgets of `shared: true` limits.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitsRedis {
    /// Where Redis is, who the pods are to it, and TLS.
    #[serde(flatten)]
    pub connection: RedisConnection,
    /// Longest wait for Redis per call, e.g. `50ms` (default), at most `5s`; the TLS
    /// handshake included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([1-9][0-9]{0,3}ms|[1-5]s)$"))]
    pub timeout: Option<String>,
    /// When Redis does not answer in time: `Open` (default) counts the limit on each replica
    /// alone, `Closed` refuses the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_mode: Option<FailMode>,
}

/// How the pods reach a Redis (the same for shared limits and shared tasks).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedisConnection {
    /// `host:port`, e.g. `redis.infra.svc:6379`: plain TCP, or TLS with `tls`.
    #[schemars(length(min = 3, max = 261), regex(pattern = r"^[A-Za-z0-9.-]+:[0-9]{1,5}$"))]
    pub address: String,
    /// The Redis ACL user (Redis 6 and later) the pods authenticate as, with the password
    /// of `passwordSecretRef` (`AUTH username password`); without it, the password is the
    /// `default` user's. A user name is not a secret (Redis shows it in `ACL LIST`, `CLIENT
    /// LIST` and its logs), so it is given here; the password stays in its Secret. See
    /// docs/governance.md for the commands and keys the user needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[!-~]+$"))]
    pub username: Option<String>,
    /// The Secret key holding Redis's password (`AUTH`), if it has one; read when a pod
    /// starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<SecretKey>,
    /// Connect over TLS (plain TCP when unset). Set (even `{}`), the pods check Redis's
    /// certificate against the public roots, or the CAs of `caSecret` or `caConfigMap`, for
    /// the host of `address` (or `serverName`). The Secrets and the ConfigMap it names are
    /// mounted into the server container and read when a pod starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<RedisTls>,
}

/// TLS to Redis.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.caSecret) && has(self.caConfigMap))").message("caSecret and caConfigMap both name the CAs to trust: set one"))]
pub struct RedisTls {
    /// A Secret of this namespace whose `ca.crt` key holds the PEM certificates of the CAs
    /// to trust instead of the public roots (e.g. the Secret cert-manager wrote for Redis's
    /// certificate). Exclusive with `caConfigMap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub ca_secret: Option<String>,
    /// A ConfigMap of this namespace whose `ca.crt` key holds the PEM certificates of the
    /// CAs to trust instead of the public roots: a CA bundle is not a secret (e.g. a
    /// trust-manager Bundle's target). Exclusive with `caSecret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub ca_config_map: Option<String>,
    /// The name Redis's certificate must carry, when it is not the host of `address` (e.g.
    /// an address by IP, or a Service name the certificate does not list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[A-Za-z0-9.:-]+$"))]
    pub server_name: Option<String>,
    /// A `kubernetes.io/tls` Secret of this namespace (keys `tls.crt` and `tls.key`, PEM)
    /// whose certificate the pods present to Redis, for a Redis that requires client
    /// certificates (`tls-auth-clients yes`). Hidden from stdio upstreams and exec tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub client_cert_secret: Option<String>,
}

/// Where tasks live and how long they last.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TasksSpec {
    /// The Redis shared by the replicas: a task started through one replica is read,
    /// answered or cancelled through any other, and its result outlives the pod that ran
    /// it. Without it each replica keeps its own tasks (a client must come back to the same
    /// pod: `sessionAffinity`), and a task ends with its pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<TasksRedis>,
    /// How long a stopping pod (a rolling update, a scale-down, a drained node) lets its
    /// running tasks finish, e.g. `5m`; at most `60m`, default `20s`. The pod's
    /// `terminationGracePeriodSeconds` grows to fit. A task still running then fails with
    /// an error saying so. Only with `redis` (without it, a pod's tasks end with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([1-9][0-9]{0,2}s|[1-9]m|[1-5][0-9]m|60m)$"))]
    pub drain: Option<String>,
    /// How long a task and its result are kept after it starts, e.g. `30m`; default `10m`,
    /// at most `24h`. A task still running then is stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([1-9][0-9]{0,3}(s|m)|[1-9]h|1[0-9]h|2[0-4]h)$"))]
    pub ttl: Option<String>,
    /// Tasks one caller may hold at once (running or finished, until their TTL ends);
    /// default 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub per_caller: Option<u32>,
    /// Tasks all clients without credentials together may hold at once (each is counted by
    /// its address under `perCaller` too); default 1024, a quarter of the server's 4096, so
    /// that they never take every place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub anonymous_max: Option<u32>,
}

/// The Redis holding the tasks of every replica.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TasksRedis {
    /// Where Redis is, who the pods are to it, and TLS.
    #[serde(flatten)]
    pub connection: RedisConnection,
    /// Longest wait for Redis per operation, e.g. `500ms` (default), at most `5s`; the TLS
    /// handshake included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([1-9][0-9]{0,3}ms|[1-5]s)$"))]
    pub timeout: Option<String>,
}

impl TasksSpec {
    /// `drain` in seconds (its pattern admits nothing else).
    pub fn drain_seconds(&self) -> Option<i64> {
        let d = self.drain.as_deref()?;
        let (n, unit) = d.split_at(d.len().checked_sub(1)?);
        let n: i64 = n.parse().ok()?;
        Some(if unit == "m" { n * 60 } else { n })
    }
}

/// What a shared limit does while its Redis is unavailable.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum FailMode {
    /// Count on each replica alone.
    Open,
    /// Refuse the call.
    Closed,
}

/// The audit trail of the pods.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditOptions {
    /// Records queued for the writer (default 8192, at most 65536; each place is allocated
    /// when the pod starts, about 350 bytes); a record that finds the queue full is dropped and
    /// counted in `quiver_audit_dropped_total`, or with `onFull: refuse` its call is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16, max = 65_536))]
    pub queue: Option<u32>,
    /// What a call whose record finds the queue full gets (`drop` or `refuse`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_full: Option<AuditOnFull>,
}

/// What a call whose audit record finds the queue full gets: `drop` (default) runs it and
/// drops the record (counted in `quiver_audit_dropped_total`); `refuse` refuses it before it
/// runs with `-32004` (HTTP 429, `data.audit: "queue_full"`, counted in
/// `quiver_audit_refused_total`), so that every call that ran has its record. With `refuse`
/// a record holds its place from the call's arrival until it is written: size `queue` above
/// the calls in flight at once.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AuditOnFull {
    /// The call runs; its record is dropped and counted.
    Drop,
    /// The call is refused before it runs.
    Refuse,
}
