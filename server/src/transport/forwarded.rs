//! The client address of an HTTP request: the TCP peer, or, when the peer is a proxy the
//! operator trusts (`--trusted-proxies`), the client that proxy names in `X-Forwarded-For`.
//! A header from any other peer is the client's own claim and is ignored.

use std::net::IpAddr;

use axum::http::HeaderMap;

/// Most networks `--trusted-proxies` may list.
pub const MAX_TRUSTED: usize = 64;
/// Most `X-Forwarded-For` entries looked at, from the right (a chain of proxies longer than
/// this ends at the last one looked at).
const MAX_HOPS: usize = 16;

pub use quiver_flags::Cidr;

/// The proxies whose `X-Forwarded-For` names the client (none by default).
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<Cidr>);

impl TrustedProxies {
    /// The proxies in `nets`.
    ///
    /// # Errors
    /// More than [`MAX_TRUSTED`] networks.
    pub fn new(nets: Vec<Cidr>) -> Result<Self, String> {
        if nets.len() > MAX_TRUSTED {
            return Err(format!("at most {MAX_TRUSTED} trusted proxy networks"));
        }
        Ok(Self(nets))
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }

    /// The client of a request that came from `peer` with `headers`: `peer` itself unless it
    /// is a trusted proxy; then the nearest address in `X-Forwarded-For`, read from the
    /// right, that is not a trusted proxy (each proxy appends the address it was reached
    /// from, so everything left of the last untrusted one is that client's own claim). An
    /// entry that is not an address ends the walk at the proxy that sent it.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        let mut nearest = peer;
        let entries = headers
            .get_all("x-forwarded-for")
            .iter()
            .rev()
            .flat_map(|v| v.to_str().unwrap_or("\u{0}").rsplit(','))
            .take(MAX_HOPS);
        for entry in entries {
            let Some(ip) = address(entry.trim()) else {
                return nearest;
            };
            if !self.trusts(ip) {
                return ip;
            }
            nearest = ip;
        }
        nearest
    }
}

/// The address of an `X-Forwarded-For` entry: an address, or one with a port
/// (`1.2.3.4:80`, `[::1]:80`), as some proxies write it.
fn address(entry: &str) -> Option<IpAddr> {
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<std::net::SocketAddr>().ok().map(|s| s.ip()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn trusted(nets: &[&str]) -> TrustedProxies {
        TrustedProxies::new(nets.iter().map(|n| n.parse().unwrap()).collect()).unwrap()
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn networks_parse_and_contain_what_they_should() {
        let ten: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(ten.contains(ip("10.200.3.4")));
        assert!(
            ten.contains(ip("::ffff:10.1.2.3")),
            "an IPv4 client on an IPv6 socket"
        );
        assert!(!ten.contains(ip("11.0.0.1")));
        assert!(!ten.contains(ip("::a00:1")));
        let one: Cidr = "192.0.2.7".parse().unwrap();
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("203.0.113.9")));
        // Host bits are cleared, not refused.
        assert_eq!("10.1.2.3/8".parse::<Cidr>().unwrap(), ten);
        for bad in [
            "",
            "10.0.0.0/33",
            "::/129",
            "10.0.0/8",
            "x/8",
            "10.0.0.0/-1",
            "10.0.0.0/ 8x",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        let long = "9".repeat(10_000);
        assert!(long.parse::<Cidr>().unwrap_err().len() < 200);
        assert!(TrustedProxies::new(vec![ten; MAX_TRUSTED + 1]).is_err());
    }

    #[test]
    fn a_header_from_an_untrusted_peer_is_ignored() {
        let peer = ip("203.0.113.5");
        let spoofed = xff(&["198.51.100.1"]);
        assert_eq!(TrustedProxies::default().client(peer, &spoofed), peer);
        assert_eq!(trusted(&["10.0.0.0/8"]).client(peer, &spoofed), peer);
    }

    #[test]
    fn behind_trusted_proxies_the_nearest_untrusted_hop_is_the_client() {
        let proxies = trusted(&["10.0.0.0/8"]);
        let ingress = ip("10.0.0.7");
        // The client prepends what it likes; the proxy appends the address it saw.
        let h = xff(&["1.1.1.1, 198.51.100.20"]);
        assert_eq!(proxies.client(ingress, &h), ip("198.51.100.20"));
        // Two proxies, two header lines: read right to left across them.
        let h = xff(&["6.6.6.6, 198.51.100.20", "10.1.1.1"]);
        assert_eq!(proxies.client(ingress, &h), ip("198.51.100.20"));
        // Ports and IPv6.
        let h = xff(&["[2001:db8::1]:4711"]);
        assert_eq!(proxies.client(ingress, &h), ip("2001:db8::1"));
        let h = xff(&["198.51.100.20:80"]);
        assert_eq!(proxies.client(ingress, &h), ip("198.51.100.20"));
        // No header: the proxy itself. Garbage: the last trusted hop reached.
        assert_eq!(proxies.client(ingress, &HeaderMap::new()), ingress);
        let h = xff(&["1.1.1.1, garbage, 10.2.2.2"]);
        assert_eq!(proxies.client(ingress, &h), ip("10.2.2.2"));
        // Only trusted hops: the leftmost of them.
        let h = xff(&["10.3.3.3, 10.2.2.2"]);
        assert_eq!(proxies.client(ingress, &h), ip("10.3.3.3"));
        // A long chain of trusted hops is read only so far.
        let many = vec!["10.9.9.9"; 100].join(",");
        let h = xff(&[&format!("198.51.100.20,{many}")]);
        assert_eq!(proxies.client(ingress, &h), ip("10.9.9.9"));
        // Not visible ASCII: the proxy itself.
        let mut h = HeaderMap::new();
        h.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"1.2.3.4\xff").unwrap(),
        );
        assert_eq!(proxies.client(ingress, &h), ingress);
    }
}
