//! How tracing is configured: flags, and the standard `OTEL_*` environment variables.
//!
//! Tracing is on when an OTLP endpoint is given: `--otlp-endpoint` (`QUIVER_OTLP_ENDPOINT`),
//! or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL), or `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (a base URL, `/v1/traces` appended). `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` turn it off whatever else is set. The exporter also reads
//! `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS` and `_TIMEOUT`; the resource reads
//! `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`; without `--trace-sample-ratio` the
//! sampler is `OTEL_TRACES_SAMPLER`/`OTEL_TRACES_SAMPLER_ARG` (default
//! `parentbased_always_on`).

/// Tracing options of the server.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TraceArgs {
    /// Export traces to this OTLP/HTTP endpoint (e.g. http://otel-collector:4318; the path
    /// `/v1/traces` is added unless given). Default: the OTEL_EXPORTER_OTLP_* variables;
    /// without any, tracing is off.
    #[arg(long, env = "QUIVER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Parent-based sampling: a request without a sampled parent starts a trace with this
    /// probability (0 to 1); one whose client sampled it is always traced when that client's
    /// flag is trusted (--trace-trust-client-sampling), else with this probability. Default:
    /// OTEL_TRACES_SAMPLER/OTEL_TRACES_SAMPLER_ARG, else every request.
    #[arg(long, env = "QUIVER_TRACE_SAMPLE_RATIO")]
    pub trace_sample_ratio: Option<f64>,
    /// Finished spans waiting for export at most; more are dropped (and counted in
    /// quiver_trace_spans_dropped_total) rather than slowing requests.
    #[arg(long, env = "QUIVER_TRACE_QUEUE", default_value_t = 4096)]
    pub trace_queue: usize,
}

/// Whose `traceparent` sampled flag decides whether a request is traced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TrustSampling {
    /// No client's: the server decides from the trace id, as for a request without parent.
    Never,
    /// Callers that authenticated (and stdio's client, which started the server); the
    /// server decides for the others.
    #[default]
    Authenticated,
    /// Every client's (anyone who reaches the server may make it export spans).
    Always,
}

/// How far the server follows what a client's trace context says.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientTraceArgs {
    /// Whose sampled flag (in `traceparent`) is obeyed: `never`, `authenticated` (callers
    /// that presented valid credentials, and stdio's client) or `always`. Any other request
    /// with a trace context continues its trace id, but whether it is traced is the server's
    /// own decision (--trace-sample-ratio applied to that trace id).
    #[arg(long, env = "QUIVER_TRACE_TRUST_CLIENT_SAMPLING", value_enum, default_value_t = TrustSampling::Authenticated)]
    pub trace_trust_client_sampling: TrustSampling,
    /// Keep a client's `tracestate` and pass it on to upstreams and http tools' APIs (and
    /// into exported spans). Off: it is dropped as it arrives.
    #[arg(long, env = "QUIVER_TRACE_FORWARD_TRACESTATE")]
    pub trace_forward_tracestate: bool,
}

/// The resolved settings of tracing when it is on.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The full URL spans are POSTed to.
    pub endpoint: http::Uri,
    /// The ratio of a parent-based ratio sampler, when given by flag.
    pub ratio: Option<f64>,
    /// The ratio of the sampler in force (the flag's, else what OTEL_TRACES_SAMPLER and
    /// OTEL_TRACES_SAMPLER_ARG select): the server's own decision for a request whose
    /// client's sampled flag it does not trust.
    pub own_ratio: f64,
    /// Bound of the export queue.
    pub queue: usize,
}

impl Resolved {
    /// The endpoint as logged: scheme, host and path (never userinfo or query).
    pub fn endpoint_shown(&self) -> String {
        let u = &self.endpoint;
        format!(
            "{}://{}{}",
            u.scheme_str().unwrap_or("http"),
            u.host().unwrap_or(""),
            u.port().map(|p| format!(":{p}")).unwrap_or_default()
        ) + u.path()
    }

    /// The sampler as logged.
    pub fn sampler_shown(&self) -> String {
        match self.ratio {
            Some(r) => format!("parentbased_traceidratio {r}"),
            None => match std::env::var("OTEL_TRACES_SAMPLER") {
                Ok(s) => format!("{s} (OTEL_TRACES_SAMPLER)"),
                Err(_) => "parentbased_always_on".to_owned(),
            },
        }
    }
}

/// Longest endpoint URL accepted.
const MAX_ENDPOINT: usize = 2048;

impl TraceArgs {
    /// The settings in force (flags first, then the environment), or `None` when off.
    ///
    /// # Errors
    /// An endpoint that is not an http(s) URL, or a ratio outside 0..=1.
    pub fn resolve(&self) -> anyhow::Result<Option<Resolved>> {
        self.resolve_with(|k| std::env::var(k).ok())
    }

    /// [`Self::resolve`] with the environment given (tests).
    pub fn resolve_with(&self, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<Resolved>> {
        let truthy = |k: &str| env(k).is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        if truthy("OTEL_SDK_DISABLED")
            || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"))
        {
            return Ok(None);
        }
        let nonempty = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
        let (url, full) = if let Some(u) = nonempty(self.otlp_endpoint.clone()) {
            (u, false)
        } else if let Some(u) = nonempty(env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) {
            (u, true)
        } else if let Some(u) = nonempty(env("OTEL_EXPORTER_OTLP_ENDPOINT")) {
            (u, false)
        } else {
            return Ok(None);
        };
        if let Some(p) =
            env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
            && p.trim() != "http/protobuf"
        {
            anyhow::bail!(
                "OTLP protocol `{}` is not supported: quiver-server exports http/protobuf (the collector's port 4318)",
                p.chars().take(32).collect::<String>()
            );
        }
        let endpoint = endpoint(url.trim(), full)?;
        if let Some(r) = self.trace_sample_ratio
            && !(0.0..=1.0).contains(&r)
        {
            anyhow::bail!("--trace-sample-ratio must be between 0 and 1, not {r}");
        }
        let queue = match env("OTEL_BSP_MAX_QUEUE_SIZE").and_then(|v| v.trim().parse::<usize>().ok()) {
            Some(n) if self.trace_queue == 4096 => n,
            _ => self.trace_queue,
        };
        Ok(Some(Resolved {
            endpoint,
            ratio: self.trace_sample_ratio,
            own_ratio: self.trace_sample_ratio.unwrap_or_else(|| sampler_ratio(&env)),
            queue: queue.clamp(16, 1 << 20),
        }))
    }
}

/// The share of traces the SDK's sampler from OTEL_TRACES_SAMPLER (and its argument) keeps,
/// read as the SDK reads them: `*always_on` 1, `*always_off` 0, `*traceidratio` its argument
/// (1 when missing or not in 0..=1); anything else falls back to `parentbased_always_on`.
fn sampler_ratio(env: &impl Fn(&str) -> Option<String>) -> f64 {
    let sampler = env("OTEL_TRACES_SAMPLER").unwrap_or_default();
    match sampler.trim().trim_start_matches("parentbased_") {
        "always_off" => 0.0,
        "traceidratio" => env("OTEL_TRACES_SAMPLER_ARG")
            .and_then(|a| a.trim().parse::<f64>().ok())
            .filter(|r| (0.0..=1.0).contains(r))
            .unwrap_or(1.0),
        _ => 1.0,
    }
}

/// The traces URL: `full` is used as given; otherwise `/v1/traces` is appended to the path
/// unless it ends so already.
fn endpoint(url: &str, full: bool) -> anyhow::Result<http::Uri> {
    if url.len() > MAX_ENDPOINT {
        anyhow::bail!("the OTLP endpoint is longer than {MAX_ENDPOINT} bytes");
    }
    let uri: http::Uri = url
        .parse()
        .map_err(|_| anyhow::anyhow!("the OTLP endpoint is not a URL"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => anyhow::bail!("the OTLP endpoint must be an http:// or https:// URL"),
    }
    if uri.host().is_none_or(str::is_empty) {
        anyhow::bail!("the OTLP endpoint has no host");
    }
    if full || uri.path().ends_with("/v1/traces") {
        return Ok(uri);
    }
    let base = url.split(['?', '#']).next().unwrap_or(url).trim_end_matches('/');
    format!("{base}/v1/traces")
        .parse()
        .map_err(|_| anyhow::anyhow!("the OTLP endpoint is not a URL"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(args: &TraceArgs, env: &[(&str, &str)]) -> anyhow::Result<Option<Resolved>> {
        args.resolve_with(|k| env.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned()))
    }

    #[test]
    fn off_without_an_endpoint_and_when_disabled() {
        let args = TraceArgs::default();
        assert!(resolve(&args, &[]).unwrap().is_none());
        assert!(resolve(&args, &[("OTEL_SERVICE_NAME", "x")]).unwrap().is_none());
        let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
        assert!(resolve(&args, &on).unwrap().is_some());
        let off = [on[0], ("OTEL_SDK_DISABLED", "true")];
        assert!(resolve(&args, &off).unwrap().is_none());
        let none = [on[0], ("OTEL_TRACES_EXPORTER", "none")];
        assert!(resolve(&args, &none).unwrap().is_none());
    }

    #[test]
    fn endpoints_get_their_traces_path_once() {
        let args = TraceArgs::default();
        let base = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")];
        assert_eq!(
            resolve(&args, &base).unwrap().unwrap().endpoint,
            "http://c:4318/v1/traces"
        );
        let full = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:9/custom"),
        ];
        assert_eq!(
            resolve(&args, &full).unwrap().unwrap().endpoint,
            "http://t:9/custom"
        );
        let flag = TraceArgs {
            otlp_endpoint: Some("https://c/v1/traces".into()),
            ..TraceArgs::default()
        };
        let r = resolve(&flag, &full).unwrap().unwrap();
        assert_eq!(r.endpoint, "https://c/v1/traces");
        assert_eq!(r.endpoint_shown(), "https://c/v1/traces");
    }

    #[test]
    fn bad_settings_are_refused() {
        for url in [
            "not a url",
            "ftp://c:21",
            "unix:/x",
            "http://",
            &format!("http://c/{}", "a".repeat(3000)),
        ] {
            let args = TraceArgs {
                otlp_endpoint: Some(url.to_owned()),
                ..TraceArgs::default()
            };
            assert!(resolve(&args, &[]).is_err(), "{url}");
        }
        for r in [-0.1, 1.5, f64::NAN] {
            let args = TraceArgs {
                otlp_endpoint: Some("http://c:4318".into()),
                trace_sample_ratio: Some(r),
                ..TraceArgs::default()
            };
            assert!(resolve(&args, &[]).is_err(), "{r}");
        }
        let grpc = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ];
        assert!(resolve(&TraceArgs::default(), &grpc).is_err());
    }

    #[test]
    fn userinfo_and_query_are_not_shown() {
        let args = TraceArgs {
            otlp_endpoint: Some("http://user:secret@c:4318/v1/traces?token=x".into()),
            ..TraceArgs::default()
        };
        let r = resolve(&args, &[]).unwrap().unwrap();
        assert_eq!(r.endpoint_shown(), "http://c:4318/v1/traces");
    }

    #[test]
    fn the_own_ratio_is_the_flags_else_the_environments_sampler() {
        let on = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        let own = |args: &TraceArgs, env: &[(&str, &str)]| {
            let mut all = vec![on];
            all.extend_from_slice(env);
            resolve(args, &all).unwrap().unwrap().own_ratio
        };
        let none = TraceArgs::default();
        assert_eq!(own(&none, &[]), 1.0);
        let flag = TraceArgs {
            trace_sample_ratio: Some(0.25),
            ..TraceArgs::default()
        };
        assert_eq!(own(&flag, &[("OTEL_TRACES_SAMPLER", "always_off")]), 0.25);
        for (sampler, arg, want) in [
            ("always_on", None, 1.0),
            ("parentbased_always_on", None, 1.0),
            ("always_off", None, 0.0),
            ("parentbased_always_off", None, 0.0),
            ("traceidratio", Some("0.1"), 0.1),
            ("parentbased_traceidratio", Some(" 0.5 "), 0.5),
            ("parentbased_traceidratio", Some("7"), 1.0),
            ("traceidratio", None, 1.0),
            ("xray", None, 1.0),
        ] {
            let mut env = vec![("OTEL_TRACES_SAMPLER", sampler)];
            env.extend(arg.map(|a| ("OTEL_TRACES_SAMPLER_ARG", a)));
            assert_eq!(own(&none, &env), want, "{sampler} {arg:?}");
        }
    }

    #[test]
    fn client_trace_settings_default_to_authenticated_and_no_tracestate() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            client: ClientTraceArgs,
        }
        use clap::Parser as _;
        let c = Cli::try_parse_from(["x"]).unwrap().client;
        assert_eq!(c.trace_trust_client_sampling, TrustSampling::Authenticated);
        assert!(!c.trace_forward_tracestate);
        let c = Cli::try_parse_from([
            "x",
            "--trace-trust-client-sampling",
            "never",
            "--trace-forward-tracestate",
        ])
        .unwrap()
        .client;
        assert_eq!(c.trace_trust_client_sampling, TrustSampling::Never);
        assert!(c.trace_forward_tracestate);
        assert!(Cli::try_parse_from(["x", "--trace-trust-client-sampling", "sometimes"]).is_err());
    }
}
