//! `auth.upstreamSignIn`, each user's own sign-in to third-party upstreams: the server flags
//! (its Redis's through `governance.rs`), the Secrets the pods read for it, whether the
//! Ingress or HTTPRoute routes `/oauth`, and the checks of its URL.

use std::net::{IpAddr, Ipv6Addr};

use super::governance::{certificate_name, sign_in_redis_args};
use crate::crd::{McpServer, UpstreamSignIn};

/// Where it is in the spec (for problems).
const AT: &str = "spec.auth.upstreamSignIn";
/// The path prefix of the sign-in routes the pods serve.
pub(super) const OAUTH_PATH: &str = "/oauth";
/// Most characters of a spec value repeated in a problem.
const SHOWN: usize = 120;

/// `auth.upstreamSignIn`, when set.
pub(super) fn sign_in(mcp: &McpServer) -> Option<&UpstreamSignIn> {
    mcp.spec.auth.as_ref()?.upstream_sign_in.as_ref()
}

/// `--upstream-sign-in-*` for the spec (none without `auth.upstreamSignIn`). The key ring
/// and the browser client's secret go by reference (`SECRET.KEY`, read through `--secrets`):
/// their values are never in the pod spec.
pub(super) fn args(mcp: &McpServer) -> Vec<String> {
    let Some(s) = sign_in(mcp) else {
        return Vec::new();
    };
    let mut args = vec![
        format!("--upstream-sign-in-url={}", s.url.trim_end_matches('/')),
        format!(
            "--upstream-sign-in-keys={}.{}",
            s.keys_secret_ref.name, s.keys_secret_ref.key
        ),
        format!("--upstream-sign-in-client-id={}", s.browser_client.client_id),
        format!(
            "--upstream-sign-in-client-secret={}.{}",
            s.browser_client.client_secret_ref.name, s.browser_client.client_secret_ref.key
        ),
    ];
    args.extend(s.max_users.map(|n| format!("--upstream-sign-in-max-users={n}")));
    args.extend(
        s.max_per_user
            .map(|n| format!("--upstream-sign-in-max-per-user={n}")),
    );
    args.extend(
        s.denied_networks
            .iter()
            .map(|n| format!("--upstream-sign-in-deny-cidr={}", n.trim())),
    );
    args.extend(sign_in_redis_args(mcp));
    args
}

/// The Secrets the pods read for it: the key ring's and the browser client's.
pub(super) fn secret_names(mcp: &McpServer) -> impl Iterator<Item = &str> {
    sign_in(mcp).into_iter().flat_map(|s| {
        [
            s.keys_secret_ref.name.as_str(),
            s.browser_client.client_secret_ref.name.as_str(),
        ]
    })
}

/// The host of a sign-in URL, and whether it is loopback.
#[derive(Debug, PartialEq, Eq)]
struct Origin {
    host: String,
    loopback: bool,
}

/// Reads `url` as the server is to serve it: `https://HOST[:PORT][/]`, or `http://` to a
/// loopback host; the problem otherwise.
fn origin(url: &str) -> Result<Origin, &'static str> {
    let (https, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
        (Some(r), _) => (true, r),
        (None, Some(r)) => (false, r),
        (None, None) => return Err("must start with https:// (or http:// for a loopback host)"),
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() {
        return Err("has no host");
    }
    if authority.contains(['/', '?', '#', '@', '\\']) || authority.chars().any(char::is_whitespace) {
        return Err(
            "must be the origin alone, without a path, query, fragment or user name: the pods serve /oauth/ at the root",
        );
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (inside, after) = v6.split_once(']').ok_or("has an unclosed [")?;
        let ip: Ipv6Addr = inside
            .parse()
            .map_err(|_| "has a bracketed host that is not an IPv6 address")?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or("has text after its IPv6 address")?),
        };
        (ip.to_string(), port)
    } else if authority.matches(':').count() > 1 {
        return Err("has an IPv6 address without brackets");
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (authority.to_owned(), None),
        }
    };
    if let Some(p) = port
        && !(p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok_and(|n| n > 0))
    {
        return Err("has a port that is not 1 to 65535");
    }
    if !certificate_name(&host) {
        return Err("has a host that is not a DNS name or an IP address");
    }
    let loopback =
        host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !https && !loopback {
        return Err(
            "is http to a host that is not loopback: use https (browsers carry users' authorization codes to it)",
        );
    }
    Ok(Origin { host, loopback })
}

/// Whether a host name of an Ingress rule or an HTTPRoute (exact, or `*.SUFFIX` for one or
/// more labels) serves `host`.
fn serves(name: &str, host: &str) -> bool {
    let (name, host) = (name.to_ascii_lowercase(), host.to_ascii_lowercase());
    match name.strip_prefix('*') {
        Some(suffix) if suffix.starts_with('.') => {
            host.strip_suffix(suffix).is_some_and(|head| !head.is_empty())
        }
        _ => name == host,
    }
}

/// When the McpServer routes itself (Ingress, HTTPRoute) but for none of them at the
/// sign-in URL's host: the upstreams' redirects would not reach the pods.
fn unrouted(mcp: &McpServer, host: &str) -> Option<String> {
    let ingress = mcp.spec.ingress.as_ref().map(|i| vec![i.host.as_str()]);
    let route = mcp
        .spec
        .http_route
        .as_ref()
        .map(|r| r.hostnames.iter().map(String::as_str).collect::<Vec<_>>());
    if ingress.is_none() && route.is_none() {
        return None;
    }
    // An HTTPRoute without host names answers for its listeners' names, which are not known here.
    if route.as_ref().is_some_and(Vec::is_empty) {
        return None;
    }
    let names: Vec<&str> = ingress.into_iter().chain(route).flatten().collect();
    (!names.iter().any(|n| serves(n, host))).then(|| {
        format!(
            "{AT}.url: host `{}` is not one the McpServer's Ingress or HTTPRoute serves ({}): they route /oauth for those hosts only, so browsers coming back from an upstream's sign-in would not reach the pods",
            shown(host),
            names.iter().map(|n| shown(n)).collect::<Vec<_>>().join(", ")
        )
    })
}

/// At most [`SHOWN`] characters of a spec value.
fn shown(s: &str) -> String {
    s.chars().take(SHOWN).collect()
}

/// What keeps `auth.upstreamSignIn` from working, each naming its field (its Redis's are in
/// `governance::problems`).
pub fn problems(mcp: &McpServer) -> Vec<String> {
    let Some(s) = sign_in(mcp) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if mcp.spec.auth.as_ref().is_none_or(|a| a.oidc.is_none()) {
        out.push(format!(
            "{AT}: needs spec.auth.oidc: each user's upstream tokens are kept under the identity of their validated access token"
        ));
    }
    match origin(&s.url) {
        Err(why) => out.push(format!("{AT}.url: `{}` {why}", shown(&s.url))),
        // A loopback URL is reached through a port-forward, not the Ingress.
        Ok(o) if o.loopback => {}
        Ok(o) => out.extend(unrouted(mcp, &o.host)),
    }
    // The server's own reading of the flag, so that what the operator accepts starts.
    for (i, n) in s.denied_networks.iter().enumerate() {
        if let Err(why) = n.trim().parse::<quiver_flags::values::Cidr>() {
            out.push(format!("{AT}.deniedNetworks[{i}]: {why}"));
        }
    }
    if s.keys_secret_ref == s.browser_client.client_secret_ref {
        out.push(format!(
            "{AT}.keysSecretRef: names the same Secret key as browserClient.clientSecretRef: the key ring and the client secret are different values"
        ));
    }
    out
}

#[cfg(test)]
#[path = "sign_in_tests.rs"]
mod tests;
