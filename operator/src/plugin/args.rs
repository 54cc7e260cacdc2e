//! The command line of `kubectl quiver`, and tool arguments given as `key=value`, typed by
//! the tool's input schema.

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{Map, Value};

use super::Failure;

/// Most `key=value` arguments of one call.
pub const MAX_PAIRS: usize = 256;
/// Longest `--json` value or `key=value` argument, in bytes.
pub const MAX_ARGUMENT_BYTES: usize = 1 << 20;

/// kubectl quiver: the tools, calls and status of Quiver McpServers.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-quiver",
    bin_name = "kubectl quiver",
    version,
    about,
    after_help = "Exit codes: 0 success; 1 a negative answer (check found problems, the tool \
                  returned an error, status is not Ready); 2 usage (flags, arguments, unknown \
                  tool); 3 Kubernetes (kubeconfig, not found, forbidden, unreachable); 4 the MCP \
                  server (HTTP or JSON-RPC error, rejected token)."
)]
pub struct Cli {
    /// Namespace of the McpServer (default: the context's namespace, else `default`).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// kubeconfig context to use (default: the current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Path of the kubeconfig (default: `KUBECONFIG`, else ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List an McpServer's tools with their descriptions.
    Tools {
        /// McpServer name.
        name: String,
        /// How to reach the pods and what to send.
        #[command(flatten)]
        conn: Connect,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Call a tool: `kubectl quiver call calc add a=1 b=2`.
    Call {
        /// McpServer name.
        name: String,
        /// Tool name.
        tool: String,
        /// Arguments as `key=value`, typed by the tool's input schema (numbers, booleans,
        /// JSON objects and arrays; strings as given).
        #[arg(value_name = "KEY=VALUE")]
        pairs: Vec<String>,
        /// Arguments as one JSON object (`key=value` pairs are added to it).
        #[arg(long, value_name = "JSON")]
        json: Option<String>,
        /// How to reach the pods and what to send.
        #[command(flatten)]
        conn: Connect,
        /// Output format: the result's text, or the whole result as JSON.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Conditions, per-pod config hash, upstream health and the last reload's problems.
    Status {
        /// McpServer name.
        name: String,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Forget the upstream tokens a user got by signing in through an McpServer
    /// (`spec.auth.upstreamSignIn`), on every ready pod it owns: `kubectl quiver revoke
    /// github --subject 'https://login.example.com/realms/corp|8f2c0b9e'`.
    Revoke {
        /// McpServer name.
        name: String,
        /// The user: the issuer of their access tokens (`iss`, exactly), `|`, and their
        /// `sub` claim.
        #[arg(long, value_name = "ISSUER|SUBJECT")]
        subject: String,
        /// Only this upstream's tokens (default: every upstream the user signed in to).
        #[arg(long, value_name = "UPSTREAM")]
        upstream: Option<String>,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Approve tool definitions that await approval (an upstream or OpenAPI source with
    /// `pin: warn|enforce` listed a new tool or changed one): `kubectl quiver approve
    /// github search_issues`. `kubectl quiver status` shows what changed first.
    Approve {
        /// McpServer name.
        name: String,
        /// Tools to approve, by their names at the upstream, or the operations' keys
        /// (operationIds) of an OpenAPI source (default: every pending one).
        tools: Vec<String>,
        /// Only this source's tools: an upstream's name, or `openapi.NAME` for an OpenAPI
        /// source.
        #[arg(long, value_name = "UPSTREAM")]
        upstream: Option<String>,
    },
    /// Validate an McpServer manifest offline with the operator's own checks and the
    /// server's compiler (ConfigMaps in the same file serve its `toolsFrom`).
    Check {
        /// The manifest (`-` for stdin); may hold several documents.
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: String,
    },
}

/// How the MCP endpoint is reached, and the client's credentials.
#[derive(Debug, Clone, Args)]
pub struct Connect {
    /// Bearer token for the McpServer (a static token or an OIDC access token). Also read
    /// from `QUIVER_TOKEN`.
    #[arg(long, env = "QUIVER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the bearer token (first line).
    #[arg(long, conflicts_with = "token")]
    pub token_file: Option<std::path::PathBuf>,
    /// `proxy`: the API server's service proxy; `port-forward`: a port-forward to a ready
    /// pod; `auto`: the proxy, or a port-forward when a token is given (the API server
    /// removes the Authorization header before proxying).
    #[arg(long, value_enum, default_value_t = Via::Auto)]
    pub via: Via,
}

/// Ways to the pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Via {
    /// The proxy without a token, a port-forward with one.
    Auto,
    /// The API server's service proxy.
    Proxy,
    /// A port-forward to one ready pod.
    PortForward,
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// For people.
    Text,
    /// For programs.
    Json,
}

impl Connect {
    /// The bearer token, from `--token`, `QUIVER_TOKEN` or `--token-file`.
    ///
    /// # Errors
    /// An unreadable or empty token file, or a token that cannot be a header value.
    pub fn bearer(&self) -> Result<Option<String>, Failure> {
        let token = match (&self.token, &self.token_file) {
            (Some(t), _) => t.trim().to_owned(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| Failure::Usage(format!("--token-file {}: {e}", path.display())))?
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned(),
            (None, None) => return Ok(None),
        };
        if token.is_empty() {
            return Err(Failure::Usage("the token is empty".to_owned()));
        }
        if !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(Failure::Usage(
                "the token holds spaces or control characters; a bearer token is printable ASCII".to_owned(),
            ));
        }
        Ok(Some(token))
    }

    /// Whether to port-forward (else the service proxy).
    ///
    /// # Errors
    /// `--via proxy` with a token, which the proxy cannot carry.
    pub fn port_forward(&self, has_token: bool) -> Result<bool, Failure> {
        match (self.via, has_token) {
            (Via::Proxy, true) => Err(Failure::Usage(
                "--via proxy cannot carry a token: the API server removes the Authorization header after authenticating you; use --via port-forward (the default with a token)".to_owned(),
            )),
            (Via::Proxy, false) => Ok(false),
            (Via::PortForward, _) => Ok(true),
            (Via::Auto, t) => Ok(t),
        }
    }
}

/// The arguments of a call: `--json`'s object, then each `key=value` typed by the property's
/// schema in `input_schema`.
///
/// # Errors
/// [`Failure::Usage`] naming the argument: not `key=value`, given twice, not a property of
/// a schema that allows no others, or a value that is not of the property's type.
pub fn arguments(
    tool: &str,
    input_schema: &Value,
    json: Option<&str>,
    pairs: &[String],
) -> Result<Map<String, Value>, Failure> {
    let usage = |m: String| Failure::Usage(m);
    if pairs.len() > MAX_PAIRS {
        return Err(usage(format!("at most {MAX_PAIRS} key=value arguments")));
    }
    let mut args = match json {
        None => Map::new(),
        Some(text) if text.len() > MAX_ARGUMENT_BYTES => {
            return Err(usage(format!("--json: longer than {MAX_ARGUMENT_BYTES} bytes")));
        }
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(usage("--json: must be a JSON object".to_owned())),
            Err(e) => return Err(usage(format!("--json: not JSON: {e}"))),
        },
    };
    let properties = input_schema.get("properties").and_then(Value::as_object);
    let closed = input_schema.get("additionalProperties") == Some(&Value::Bool(false));
    let mut given = std::collections::BTreeSet::new();
    for pair in pairs {
        if pair.len() > MAX_ARGUMENT_BYTES {
            return Err(usage(format!(
                "an argument is longer than {MAX_ARGUMENT_BYTES} bytes"
            )));
        }
        let Some((key, raw)) = pair.split_once('=').filter(|(k, _)| !k.is_empty()) else {
            return Err(usage(format!(
                "`{}`: arguments are key=value",
                pair.chars().take(64).collect::<String>()
            )));
        };
        if !given.insert(key) {
            return Err(usage(format!("argument `{key}` is given twice")));
        }
        let schema = properties.and_then(|p| p.get(key));
        if schema.is_none() && closed {
            let known: Vec<&str> = properties
                .map(|p| p.keys().map(String::as_str).collect())
                .unwrap_or_default();
            return Err(usage(format!(
                "tool `{tool}` has no argument `{key}` (it takes: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            )));
        }
        let value = typed(raw, schema).map_err(|why| usage(format!("argument `{key}`: {why}")))?;
        args.insert(key.to_owned(), value);
    }
    Ok(args)
}

/// The JSON types a property schema allows (`type` as a string or a list); empty: any.
fn types(schema: Option<&Value>) -> Vec<&str> {
    match schema.and_then(|s| s.get("type")) {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// `raw` as a value of the property's type.
fn typed(raw: &str, schema: Option<&Value>) -> Result<Value, String> {
    let allowed = types(schema);
    if allowed.is_empty() {
        // No declared type: JSON when it reads as JSON (numbers, booleans, objects), else text.
        return Ok(serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned())));
    }
    // Non-text readings first, so `a=1` is the number 1 where both are allowed.
    for t in ["integer", "number", "boolean", "null", "object", "array"] {
        if !allowed.contains(&t) {
            continue;
        }
        let parsed = match t {
            "integer" => raw.trim().parse::<i64>().ok().map(Value::from),
            "number" => number(raw.trim()),
            "boolean" => match raw.trim() {
                "true" => Some(Value::Bool(true)),
                "false" => Some(Value::Bool(false)),
                _ => None,
            },
            "null" => (raw.trim() == "null").then_some(Value::Null),
            _ => serde_json::from_str::<Value>(raw).ok().filter(|v| {
                if t == "object" {
                    v.is_object()
                } else {
                    v.is_array()
                }
            }),
        };
        if let Some(v) = parsed {
            return Ok(v);
        }
    }
    if allowed.contains(&"string") {
        return Ok(Value::String(raw.to_owned()));
    }
    let shown: String = raw.chars().take(64).collect();
    Err(format!("`{shown}` is not {}", allowed.join(" or ")))
}

fn number(raw: &str) -> Option<Value> {
    if let Ok(i) = raw.parse::<i64>() {
        return Some(Value::from(i));
    }
    raw.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .and_then(serde_json::Number::from_f64)
        .map(Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "a": {"type": "number"}, "n": {"type": "integer"}, "flag": {"type": "boolean"},
            "name": {"type": "string"}, "tags": {"type": "array"}, "opts": {"type": "object"},
            "either": {"type": ["integer", "string"]}, "any": {}
        }, "additionalProperties": false})
    }

    fn call(pairs: &[&str], json: Option<&str>) -> Result<Value, String> {
        let pairs: Vec<String> = pairs.iter().map(|s| (*s).to_owned()).collect();
        arguments("t", &schema(), json, &pairs)
            .map(Value::Object)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn values_take_the_type_of_their_property() {
        let v = call(
            &[
                "a=1.5",
                "n=42",
                "flag=true",
                "name=007",
                "tags=[1,\"x\"]",
                "opts={\"k\":1}",
                "either=7",
                "any=false",
            ],
            None,
        )
        .unwrap();
        assert_eq!(
            v,
            json!({"a": 1.5, "n": 42, "flag": true, "name": "007", "tags": [1, "x"],
                "opts": {"k": 1}, "either": 7, "any": false})
        );
        // A number property given an integer stays an integer; a union falls back to text.
        assert_eq!(
            call(&["a=2", "either=x"], None).unwrap(),
            json!({"a": 2, "either": "x"})
        );
        // The first `=` splits: the rest is the value.
        assert_eq!(call(&["name=a=b"], None).unwrap(), json!({"name": "a=b"}));
        assert_eq!(call(&["name="], None).unwrap(), json!({"name": ""}));
    }

    #[test]
    fn json_gives_the_base_and_pairs_add_to_it() {
        let v = call(&["n=2"], Some(r#"{"name": "x", "n": 1}"#)).unwrap();
        assert_eq!(v, json!({"name": "x", "n": 2}));
        assert!(
            call(&[], Some("[1]"))
                .unwrap_err()
                .contains("must be a JSON object")
        );
        assert!(call(&[], Some("{")).unwrap_err().starts_with("--json: not JSON"));
    }

    #[test]
    fn bad_arguments_are_named() {
        for (pairs, want) in [
            (&["a=x"][..], "argument `a`: `x` is not number"),
            (&["n=1.5"][..], "argument `n`: `1.5` is not integer"),
            (&["flag=yes"][..], "argument `flag`: `yes` is not boolean"),
            (&["tags={}"][..], "argument `tags`: `{}` is not array"),
            (
                &["nope=1"][..],
                "tool `t` has no argument `nope` (it takes: a, any, either, flag, n, name, opts, tags)",
            ),
            (&["a"][..], "`a`: arguments are key=value"),
            (&["=1"][..], "`=1`: arguments are key=value"),
            (&["a=1", "a=2"][..], "argument `a` is given twice"),
        ] {
            assert_eq!(call(pairs, None).unwrap_err(), want, "{pairs:?}");
        }
        let many: Vec<String> = (0..=MAX_PAIRS).map(|i| format!("k{i}=1")).collect();
        assert!(arguments("t", &json!({}), None, &many).is_err());
    }

    #[test]
    fn an_open_schema_takes_any_key_reading_json_or_text() {
        let open = json!({"type": "object", "properties": {}});
        let pairs = vec!["x=1".to_owned(), "y=hello".to_owned()];
        let v = arguments("t", &open, None, &pairs).unwrap();
        assert_eq!(Value::Object(v), json!({"x": 1, "y": "hello"}));
    }

    #[test]
    fn the_command_line_parses_as_kubectl_users_expect() {
        let cli = Cli::try_parse_from([
            "kubectl-quiver",
            "call",
            "calc",
            "add",
            "a=1",
            "b=2",
            "-n",
            "demo",
            "--context",
            "kind",
            "--via",
            "port-forward",
            "-o",
            "json",
        ])
        .unwrap();
        assert_eq!(cli.namespace.as_deref(), Some("demo"));
        assert_eq!(cli.context.as_deref(), Some("kind"));
        let Command::Call {
            name,
            tool,
            pairs,
            conn,
            output,
            ..
        } = cli.command
        else {
            panic!("a call")
        };
        assert_eq!((name.as_str(), tool.as_str()), ("calc", "add"));
        assert_eq!(pairs, ["a=1", "b=2"]);
        assert_eq!((conn.via, output), (Via::PortForward, Output::Json));
        let cli = Cli::try_parse_from(["kubectl-quiver", "-n", "x", "check", "-f", "m.yaml"]).unwrap();
        assert!(matches!(cli.command, Command::Check { ref file } if file == "m.yaml"));
        assert!(
            Cli::try_parse_from(["kubectl-quiver", "call", "calc"]).is_err(),
            "needs a tool"
        );
        assert!(Cli::try_parse_from(["kubectl-quiver", "tools", "calc", "--via", "ssh"]).is_err());
        assert!(Cli::try_parse_from(["kubectl-quiver", "status", "calc", "--token", "x"]).is_err());
    }

    #[test]
    fn a_token_chooses_the_port_forward_and_the_proxy_refuses_one() {
        let conn = |via, token: Option<&str>| Connect {
            token: token.map(str::to_owned),
            token_file: None,
            via,
        };
        assert!(!conn(Via::Auto, None).port_forward(false).unwrap());
        assert!(conn(Via::Auto, None).port_forward(true).unwrap());
        assert!(conn(Via::PortForward, None).port_forward(false).unwrap());
        assert!(conn(Via::Proxy, None).port_forward(true).is_err());
        assert_eq!(
            conn(Via::Auto, Some(" tok-123 ")).bearer().unwrap().as_deref(),
            Some("tok-123")
        );
        assert!(conn(Via::Auto, Some("a b")).bearer().is_err());
        assert!(conn(Via::Auto, Some(" ")).bearer().is_err());
    }
}
