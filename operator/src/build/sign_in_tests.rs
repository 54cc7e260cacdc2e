//! `auth.upstreamSignIn`: what reaches the pods, the Role, the Ingress and the HTTPRoute,
//! and every class of value refused before anything is applied.

use serde_json::{Value, json};

use super::origin;
use crate::build::tests::{children_of, mcp};
use crate::build::{Children, server_args_problems};
use crate::render::{Invalid, render};

const SIGN_IN: &str = r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: github}
spec:
  auth:
    oidc: {issuer: "https://login.example.com/realms/corp", audience: quiver}
    upstreamSignIn:
      url: "https://mcp.example.com/"
      keysSecretRef: {name: sign-in-keys, key: ring}
      browserClient: {clientId: quiver-browser, clientSecretRef: {name: browser-client, key: secret}}
      maxUsers: 500
      maxPerUser: 4
      deniedNetworks: ["34.118.224.0/20", "2600:1900:4000::/44", "35.1.2.3"]
      redis:
        address: "redis.infra.svc:6380"
        username: quiver-sign-in
        passwordSecretRef: {name: sign-in-redis, key: password}
        timeout: 2s
        tls: {caSecret: redis-ca, clientCertSecret: redis-client}
  ingress: {host: mcp.example.com, tlsSecretName: mcp-tls}
  httpRoute: {parentRefs: [{name: public}], hostnames: ["*.example.com"]}
  tools:
    - {name: add, handler: {builtin: add}}
"#;

fn built(yaml: &str) -> Children {
    let m = mcp(yaml);
    let r = render(&m, &Vec::new()).unwrap_or_else(|e| panic!("{e:?}"));
    children_of(&m, &r)
}

fn server(c: &Children) -> Value {
    serde_json::to_value(&c.deployment).unwrap()["spec"]["template"]["spec"]["containers"][0].clone()
}

fn args(c: &Children) -> Vec<String> {
    server(c)["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect()
}

fn refused(yaml: &str) -> Invalid {
    let m = mcp(yaml);
    render(&m, &Vec::new()).expect_err("refused")
}

#[test]
fn sign_in_reaches_the_pods_by_reference_with_its_redis_and_its_routes() {
    let c = built(SIGN_IN);
    let args = args(&c);
    let sign_in: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| a.starts_with("--upstream-sign-in"))
        .collect();
    assert_eq!(
        sign_in,
        [
            "--upstream-sign-in-url=https://mcp.example.com",
            "--upstream-sign-in-keys=sign-in-keys.ring",
            "--upstream-sign-in-client-id=quiver-browser",
            "--upstream-sign-in-client-secret=browser-client.secret",
            "--upstream-sign-in-max-users=500",
            "--upstream-sign-in-max-per-user=4",
            "--upstream-sign-in-deny-cidr=34.118.224.0/20",
            "--upstream-sign-in-deny-cidr=2600:1900:4000::/44",
            "--upstream-sign-in-deny-cidr=35.1.2.3",
            "--upstream-sign-in-redis=redis.infra.svc:6380",
            "--upstream-sign-in-redis-prefix=ns/github/",
            "--upstream-sign-in-redis-timeout=2s",
            "--upstream-sign-in-redis-username=quiver-sign-in",
            "--upstream-sign-in-redis-tls",
            "--upstream-sign-in-redis-ca=/quiver/redis/sign-in/ca.crt",
            "--upstream-sign-in-redis-client-cert=/quiver/redis/sign-in/tls.crt",
            "--upstream-sign-in-redis-client-key=/quiver/redis/sign-in/tls.key",
        ]
    );
    assert!(args.contains(&"--secrets=kube:ns".to_owned()), "{args:?}");
    assert_eq!(server_args_problems(&c.deployment), Vec::<String>::new());

    // The key ring and the client secret are read through the API by name, never put in the
    // pod spec; the Redis password is the one Secret value the kubelet passes in.
    let ctr = server(&c);
    let env = ctr["env"].as_array().unwrap();
    let refs: Vec<&Value> = env.iter().filter(|e| e.get("valueFrom").is_some()).collect();
    assert_eq!(refs.len(), 1, "{refs:?}");
    assert_eq!(refs[0]["name"], "QUIVER_UPSTREAM_SIGN_IN_REDIS_PASSWORD");
    assert_eq!(
        refs[0]["valueFrom"]["secretKeyRef"],
        json!({"name": "sign-in-redis", "key": "password"})
    );
    let rules = serde_json::to_value(&c.role).unwrap()["rules"].clone();
    assert_eq!(rules[1]["resources"], json!(["secrets"]), "{rules}");
    assert_eq!(
        rules[1]["resourceNames"],
        json!(["browser-client", "sign-in-keys"]),
        "{rules}"
    );

    // The Redis TLS files: one projected volume, mounted read-only in the server container.
    let pod = &serde_json::to_value(&c.deployment).unwrap()["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "quiver-sign-in-redis-tls")
        .unwrap();
    assert_eq!(
        volume["projected"]["sources"],
        json!([
            {"secret": {"name": "redis-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"secret": {"name": "redis-client", "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]}},
        ])
    );
    let mount = ctr["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "quiver-sign-in-redis-tls")
        .unwrap();
    assert_eq!(
        (&mount["mountPath"], &mount["readOnly"]),
        (&json!("/quiver/redis/sign-in"), &json!(true))
    );

    // Browsers come back from upstreams to /oauth/callback: the Ingress and the HTTPRoute
    // route /oauth beside /mcp.
    let ingress = serde_json::to_value(&c.ingress).unwrap();
    let paths: Vec<&Value> = ingress["spec"]["rules"][0]["http"]["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["path"])
        .collect();
    assert_eq!(
        paths,
        [
            &json!("/mcp"),
            &json!("/.well-known/oauth-protected-resource"),
            &json!("/oauth")
        ]
    );
    let route = serde_json::to_value(&c.http_route).unwrap();
    let matches = &route["spec"]["rules"][0]["matches"];
    assert_eq!(
        matches[2],
        json!({"path": {"type": "PathPrefix", "value": "/oauth"}}),
        "{matches}"
    );
}

#[test]
fn without_sign_in_nothing_of_it_reaches_the_pods_or_the_routes() {
    let start = SIGN_IN.find("    upstreamSignIn:").unwrap();
    let end = SIGN_IN.find("  ingress:").unwrap();
    let yaml = format!("{}{}", &SIGN_IN[..start], &SIGN_IN[end..]);
    let c = built(&yaml);
    let args = args(&c).join(" ");
    assert!(!args.contains("--upstream-sign-in"), "{args}");
    let role = serde_json::to_value(&c.role).unwrap().to_string();
    assert!(!role.contains("secrets"), "{role}");
    let ingress = serde_json::to_value(&c.ingress).unwrap().to_string();
    let route = serde_json::to_value(&c.http_route).unwrap().to_string();
    assert!(
        ingress.contains("\"/mcp\"") && !ingress.contains("/oauth\""),
        "{ingress}"
    );
    assert!(
        route.contains("\"/mcp\"") && !route.contains("/oauth\""),
        "{route}"
    );
    let pod = serde_json::to_value(&c.deployment).unwrap().to_string();
    assert!(!pod.contains("sign-in"), "{pod}");
}

#[test]
fn the_smallest_sign_in_renders_four_flags_and_defaults_the_rest() {
    let yaml = SIGN_IN
        .replace("      maxUsers: 500\n      maxPerUser: 4\n", "")
        .replace(
            &SIGN_IN[SIGN_IN.find("      deniedNetworks").unwrap()..SIGN_IN.find("      redis:").unwrap()],
            "",
        )
        .replace(
            &SIGN_IN[SIGN_IN.find("      redis:").unwrap()..SIGN_IN.find("  ingress:").unwrap()],
            "",
        )
        .replace("https://mcp.example.com/", "http://127.0.0.1:8080");
    let c = built(&yaml);
    let sign_in: Vec<String> = args(&c).into_iter().filter(|a| a.contains("sign-in")).collect();
    assert_eq!(
        sign_in,
        [
            "--upstream-sign-in-url=http://127.0.0.1:8080",
            "--upstream-sign-in-keys=sign-in-keys.ring",
            "--upstream-sign-in-client-id=quiver-browser",
            "--upstream-sign-in-client-secret=browser-client.secret",
        ]
    );
    assert!(!server(&c).to_string().contains("SIGN_IN_REDIS"));
    assert_eq!(server_args_problems(&c.deployment), Vec::<String>::new());
}

#[test]
fn each_class_of_bad_url_is_an_invalid_spec_naming_the_field() {
    for (url, why) in [
        ("http://mcp.example.com", "is http to a host that is not loopback"),
        ("http://10.0.0.7:8080", "is http to a host that is not loopback"),
        ("ftp://mcp.example.com", "must start with https://"),
        ("HTTPS://mcp.example.com", "must start with https://"),
        ("https://", "has no host"),
        ("https://mcp.example.com/team", "must be the origin alone"),
        ("https://mcp.example.com/?next=x", "must be the origin alone"),
        ("https://mcp.example.com#top", "must be the origin alone"),
        ("https://user@mcp.example.com", "must be the origin alone"),
        ("https://mcp.example.com:0", "has a port that is not 1 to 65535"),
        (
            "https://mcp.example.com:65536",
            "has a port that is not 1 to 65535",
        ),
        (
            "https://mcp.example.com:+443",
            "has a port that is not 1 to 65535",
        ),
        ("https://mcp.example.com:", "has a port that is not 1 to 65535"),
        ("https://2001:db8::1", "has an IPv6 address without brackets"),
        ("https://[2001:db8::1", "has an unclosed ["),
        ("https://[mcp.example.com]", "is not an IPv6 address"),
        ("https://[::1]x", "has text after its IPv6 address"),
        ("https://-mcp.example.com", "is not a DNS name or an IP address"),
        ("https://mcp..example.com", "is not a DNS name or an IP address"),
        ("https://mcp_example.com", "is not a DNS name or an IP address"),
    ] {
        let e = refused(&SIGN_IN.replace("https://mcp.example.com/", url));
        assert_eq!(e.reason, "InvalidUpstreamSignIn", "{url}: {e:?}");
        let want = format!("spec.auth.upstreamSignIn.url: `{url}` ");
        assert!(
            e.message().starts_with(&want) && e.message().contains(why),
            "{url}: {}",
            e.message()
        );
    }
}

#[test]
fn loopback_and_bracketed_addresses_are_accepted_and_read_as_the_server_would() {
    for (url, host, loopback) in [
        ("https://mcp.example.com", "mcp.example.com", false),
        ("https://mcp.example.com:8443/", "mcp.example.com", false),
        ("https://[2001:db8::1]:8443", "2001:db8::1", false),
        ("http://localhost:8080/", "localhost", true),
        ("http://127.0.0.1", "127.0.0.1", true),
        ("http://127.9.9.9:9", "127.9.9.9", true),
        ("http://[::1]:8080", "::1", true),
        ("https://[0:0:0:0:0:0:0:1]", "::1", true),
    ] {
        let o = origin(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!((o.host.as_str(), o.loopback), (host, loopback), "{url}");
    }
}

/// The CRD's CEL rule (what the API server runs) and the operator's check agree on which
/// URLs may be http: the rule's regular expression, read out of the rule, compiled by the
/// same RE2 syntax.
#[test]
fn the_crds_rule_and_the_operators_check_agree_on_http() {
    let rule = crate::crd::SIGN_IN_URL_RULE;
    let quoted = rule.split("matches('").nth(1).unwrap();
    let pattern = quoted.rsplit_once("')").unwrap().0.replace("\\\\", "\\");
    let re = regex::Regex::new(&pattern).unwrap();
    for url in [
        "http://localhost",
        "http://localhost:8080/",
        "http://127.0.0.1:9",
        "http://127.255.0.1",
        "http://[::1]:8080",
        "http://mcp.example.com",
        "http://128.0.0.1",
        "http://localhost.evil.example",
        "http://127.0.0.1.evil.example",
        "http://10.0.0.1:80",
    ] {
        let cel = re.is_match(url);
        let operator = origin(url).is_ok();
        assert_eq!(cel, operator, "{url}: CEL {cel}, operator {operator}");
    }
    assert!(rule.starts_with("self.startsWith('https://') || "));
}

#[test]
fn a_host_the_mcpservers_routes_do_not_serve_is_refused() {
    let with = |url: &str, ingress: &str, route: &str| {
        let yaml = SIGN_IN
            .replace("https://mcp.example.com/", url)
            .replace(
                "  ingress: {host: mcp.example.com, tlsSecretName: mcp-tls}\n",
                ingress,
            )
            .replace(
                "  httpRoute: {parentRefs: [{name: public}], hostnames: [\"*.example.com\"]}\n",
                route,
            );
        let m = mcp(&yaml);
        render(&m, &Vec::new())
    };
    let ingress = "  ingress: {host: mcp.example.com}\n";
    let route =
        |names: &str| format!("  httpRoute: {{parentRefs: [{{name: public}}], hostnames: {names}}}\n");
    // Served: the Ingress's host (any case), a wildcard of the route, a route without host
    // names (its listeners'), no route at all, or a loopback URL (a port-forward).
    for (url, ingress, route) in [
        ("https://MCP.example.com", ingress, String::new()),
        ("https://eu.mcp.example.com", "", route("[\"*.example.com\"]")),
        (
            "https://other.example.org",
            ingress,
            route("[\"other.example.org\"]"),
        ),
        ("https://other.example.org", "", route("[]")),
        ("https://other.example.org", "", String::new()),
        ("http://127.0.0.1:8080", ingress, String::new()),
    ] {
        with(url, ingress, &route).unwrap_or_else(|e| panic!("{url}: {e:?}"));
    }
    for (url, ingress, route, names) in [
        (
            "https://other.example.com",
            ingress,
            String::new(),
            "mcp.example.com",
        ),
        (
            "https://example.com",
            "",
            route("[\"*.example.com\"]"),
            "*.example.com",
        ),
        (
            "https://mcp.example.com.evil.example",
            ingress,
            route("[\"a.example.com\"]"),
            "mcp.example.com, a.example.com",
        ),
    ] {
        let e = with(url, ingress, &route).unwrap_err();
        assert_eq!(e.reason, "InvalidUpstreamSignIn");
        let host = url.trim_start_matches("https://");
        assert_eq!(
            e.message(),
            format!(
                "spec.auth.upstreamSignIn.url: host `{host}` is not one the McpServer's Ingress or HTTPRoute serves ({names}): they route /oauth for those hosts only, so browsers coming back from an upstream's sign-in would not reach the pods"
            )
        );
    }
}

#[test]
fn sign_in_without_oidc_one_secret_for_two_values_and_a_bad_redis_are_refused() {
    let e = refused(&SIGN_IN.replace(
        "    oidc: {issuer: \"https://login.example.com/realms/corp\", audience: quiver}\n",
        "",
    ));
    assert_eq!(e.reason, "InvalidUpstreamSignIn");
    assert!(
        e.message()
            .starts_with("spec.auth.upstreamSignIn: needs spec.auth.oidc"),
        "{}",
        e.message()
    );
    let e = refused(&SIGN_IN.replace(
        "clientSecretRef: {name: browser-client, key: secret}",
        "clientSecretRef: {name: sign-in-keys, key: ring}",
    ));
    assert_eq!(e.reason, "InvalidUpstreamSignIn");
    assert!(
        e.message()
            .starts_with("spec.auth.upstreamSignIn.keysSecretRef: names the same Secret key"),
        "{}",
        e.message()
    );
    // The same Secret with another key is two values: accepted.
    built(&SIGN_IN.replace(
        "clientSecretRef: {name: browser-client, key: secret}",
        "clientSecretRef: {name: sign-in-keys, key: client}",
    ));
    // Its Redis is checked as the others are.
    let e = refused(&SIGN_IN.replace(
        "        passwordSecretRef: {name: sign-in-redis, key: password}\n",
        "",
    ));
    assert_eq!(e.reason, "InvalidRedis");
    assert_eq!(
        e.message(),
        "spec.auth.upstreamSignIn.redis.username: an ACL user needs its password: set passwordSecretRef"
    );
    let e = refused(&SIGN_IN.replace(
        "tls: {caSecret: redis-ca,",
        "tls: {serverName: \"redis..svc\", caSecret: redis-ca,",
    ));
    assert_eq!(e.reason, "InvalidRedis");
    assert!(
        e.message()
            .starts_with("spec.auth.upstreamSignIn.redis.tls.serverName: `redis..svc`"),
        "{}",
        e.message()
    );
}

#[test]
fn each_class_of_bad_denied_network_is_an_invalid_spec_naming_its_entry() {
    let line = &SIGN_IN[SIGN_IN.find("      deniedNetworks").unwrap()..SIGN_IN.find("      redis:").unwrap()];
    for bad in ["10.0.0.0/33", "2600::/129", "pods", "10.0.0", "1.2.3.4/", "::g"] {
        let e = refused(&SIGN_IN.replace(
            line,
            &format!("      deniedNetworks: [\"8.8.8.0/24\", \"{bad}\"]\n"),
        ));
        assert_eq!(e.reason, "InvalidUpstreamSignIn", "{bad}");
        assert!(
            e.message()
                .starts_with("spec.auth.upstreamSignIn.deniedNetworks[1]: `"),
            "{bad}: {}",
            e.message()
        );
    }
}
