//! Where a call may go when a fetched document, not the ToolSet's author, chose its server:
//! never to this host (loopback, the unspecified address, or an address of its own
//! interfaces), never to a link-local address (cloud metadata endpoints live there), never to
//! a multicast or broadcast address. Names are checked after they resolve, when the
//! connection is made (the server's guarded resolver, `quiver_server::net::http`); literal
//! addresses are also refused when the document is compiled.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Metadata endpoints outside the link-local ranges (AWS's IPv6 one, Alibaba Cloud's, and
/// Azure's WireServer, which hands a node's provisioning data, bootstrap tokens included, to
/// whoever on the node asks).
const METADATA: [IpAddr; 3] = [
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V4(Ipv4Addr::new(168, 63, 129, 16)),
];

/// Why a call chosen by a document may not go to `ip` (`None`: it may). Addresses of this
/// host's own interfaces are told by [`is_own`], which needs the system.
pub fn refused(ip: IpAddr) -> Option<&'static str> {
    let ip = unmapped(ip);
    if METADATA.contains(&ip) {
        return Some("a cloud metadata address");
    }
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            if v4.is_loopback() || v4.is_unspecified() || o[0] == 0 {
                Some("a loopback or unspecified address (this host)")
            } else if v4.is_link_local() {
                Some("a link-local address (where cloud metadata endpoints are)")
            } else if v4.is_multicast() || v4.is_broadcast() {
                Some("a multicast or broadcast address")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6.is_loopback() || v6.is_unspecified() {
                Some("a loopback or unspecified address (this host)")
            } else if first & 0xffc0 == 0xfe80 {
                Some("a link-local address (where cloud metadata endpoints are)")
            } else if v6.is_multicast() {
                Some("a multicast or broadcast address")
            } else {
                None
            }
        }
    }
}

/// The address `ip` reaches: `::ffff:127.0.0.1`, `::127.0.0.1` and the translated forms
/// reach what their IPv4 part reaches.
fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .or_else(|| compat(v6))
            .or_else(|| translated(v6))
            .map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The address `ip` reaches, as [`is_private`] and deny lists judge it: the IPv4 address of
/// an IPv4-mapped, IPv4-compatible, NAT64 (`64:ff9b::/96`) or 6to4 address, else `ip`.
pub fn reached(ip: IpAddr) -> IpAddr {
    unmapped(ip)
}

/// IPv4 blocks of the IANA IPv4 Special-Purpose Address Registry that are not globally
/// reachable, besides those [`refused`] and [`is_private`] tell otherwise (this host,
/// link-local, RFC 1918, shared address space, broadcast): a network, its prefix length.
/// Clusters use some of them for pods and services (198.18/15, 240/4).
const SPECIAL_V4: [([u8; 4], u8); 6] = [
    // IETF Protocol Assignments (RFC 6890); its two globally reachable anycast addresses
    // (192.0.0.9, 192.0.0.10) serve no authorization server.
    ([192, 0, 0, 0], 24),
    // Documentation (RFC 5737).
    ([192, 0, 2, 0], 24),
    ([198, 51, 100, 0], 24),
    ([203, 0, 113, 0], 24),
    // Benchmarking (RFC 2544).
    ([198, 18, 0, 0], 15),
    // Reserved, formerly class E (RFC 1112).
    ([240, 0, 0, 0], 4),
];

/// IPv6 blocks of the IANA IPv6 Special-Purpose Address Registry that are not globally
/// reachable, besides loopback, unspecified, link-local and the IPv4 forms (told apart
/// elsewhere): a network, its prefix length.
const SPECIAL_V6: [([u16; 8], u8); 7] = [
    // Local-use IPv4/IPv6 translation (RFC 8215): a NAT64 of this network, whose IPv4
    // address's place depends on its prefix length.
    ([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),
    // Discard-only (RFC 6666).
    ([0x100, 0, 0, 0, 0, 0, 0, 0], 64),
    // IETF Protocol Assignments (RFC 2928), Teredo and benchmarking among them; its
    // globally reachable exceptions (anycast services, AMT, AS112, ORCHIDv2) serve no
    // authorization server.
    ([0x2001, 0, 0, 0, 0, 0, 0, 0], 23),
    // Documentation (RFC 3849, RFC 9637).
    ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
    ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
    // Segment Routing SIDs (RFC 9602).
    ([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16),
    // Site-local, deprecated (RFC 3879) but still routed by some networks.
    ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
];

/// Whether `ip` is a private or otherwise not globally reachable address, in any spelling:
/// RFC 1918 (`10/8`, `172.16/12`, `192.168/16`), shared address space (`100.64/10`, RFC
/// 6598), an IPv6 unique local address (`fc00::/7`), and the blocks of the IANA
/// special-purpose registries that are not globally reachable (`SPECIAL_V4`, `SPECIAL_V6`). Servers inside the cluster or the company's network live there; a server
/// chosen by a third party's document (an upstream's authorization server) may not.
pub fn is_private(ip: IpAddr) -> bool {
    match unmapped(ip) {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_private()
                || (o[0] == 100 && (64..128).contains(&o[1]))
                || SPECIAL_V4
                    .iter()
                    .any(|(net, bits)| in_v4(u32::from(v4), u32::from(Ipv4Addr::from(*net)), *bits))
        }
        IpAddr::V6(v6) => {
            v6.segments()[0] & 0xfe00 == 0xfc00
                || SPECIAL_V6
                    .iter()
                    .any(|(net, bits)| in_v6(u128::from(v6), u128::from(Ipv6Addr::from(*net)), *bits))
        }
    }
}

/// Whether `ip` is in `net/bits` (IPv4, `bits` at most 32).
fn in_v4(ip: u32, net: u32, bits: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
    ip & mask == net & mask
}

/// Whether `ip` is in `net/bits` (IPv6, `bits` at most 128).
fn in_v6(ip: u128, net: u128, bits: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
    ip & mask == net & mask
}

/// The IPv4 address of an IPv4-compatible IPv6 address (`::a.b.c.d`, deprecated but still
/// routed by some stacks to the IPv4 host), except `::` and `::1`.
fn compat(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    (s[..6].iter().all(|x| *x == 0) && (s[6] != 0 || s[7] > 1))
        .then(|| Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8))
}

/// The IPv4 address a translator reaches for an IPv6 address: the well-known NAT64 prefix
/// `64:ff9b::/96` (RFC 6052; a NAT64 on the node reaches the node's own link-local metadata
/// endpoint) and 6to4 `2002::/16` (RFC 3056).
fn translated(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        Some(v4(s[6], s[7]))
    } else if s[0] == 0x2002 {
        Some(v4(s[1], s[2]))
    } else {
        None
    }
}

/// Whether `ip` is an address of this host's own interfaces (the pod's own address): a
/// socket can be bound to it. Costs a system call; used only when a connection is made.
pub fn is_own(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// Why the host of `origin` (`scheme://host[:port]`) may not be called when a document chose
/// it: a literal address that [`refused`] refuses, or a name that always means this host.
pub fn host_refused(origin: &str) -> Option<&'static str> {
    let authority = origin.split_once("://").map_or(origin, |(_, a)| a);
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return Some("a loopback or unspecified address (this host)");
    }
    host.parse::<IpAddr>().ok().and_then(refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_host_link_local_and_metadata_are_refused_in_every_spelling() {
        for origin in [
            "http://127.0.0.1",
            "http://127.1.2.3:8080",
            "https://localhost",
            "https://LOCALHOST.:443",
            "http://api.localhost",
            "http://0.0.0.0",
            "http://0.1.2.3",
            "http://[::1]:80",
            "http://[::]",
            "http://[::ffff:127.0.0.1]",
            "http://[::ffff:169.254.169.254]",
            "http://[::127.0.0.1]",
            "http://169.254.169.254",
            "http://169.254.0.1:80",
            "http://[fe80::1]",
            "http://[fd00:ec2::254]",
            "http://100.100.100.200",
            "http://168.63.129.16:32526",
            "http://224.0.0.1",
            "http://255.255.255.255",
            "http://user@127.0.0.1:9",
            "http://[64:ff9b::7f00:1]",
            "http://[64:ff9b::169.254.169.254]",
            "http://[64:ff9b::6464:64c8]",
            "http://[2002:a9fe:a9fe::1]",
            "http://[2002:7f00:1::]",
        ] {
            assert!(host_refused(origin).is_some(), "{origin} was allowed");
        }
    }

    #[test]
    fn other_hosts_and_names_pass_the_literal_check() {
        for origin in [
            "https://api.example.com",
            "https://10.0.0.5:8443",
            "http://[2001:db8::1]",
            "http://[::2.2.2.2]",
            "http://[64:ff9b::808:808]",
            "http://[2002:808:808::1]",
            "https://127.example.com",
            "https://kubernetes.default.svc",
        ] {
            assert_eq!(host_refused(origin), None, "{origin}");
        }
    }

    #[test]
    fn private_addresses_are_told_in_every_spelling() {
        for ip in [
            "10.0.0.5",
            "10.255.255.255",
            "172.16.0.1",
            "172.31.255.254",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "fc00::1",
            "fd12:3456::1",
            "::ffff:10.1.2.3",
            "::10.1.2.3",
            "64:ff9b::a01:203",
            "2002:c0a8:101::1",
            // The IANA special-purpose blocks that are not globally reachable.
            "192.0.0.1",
            "192.0.0.255",
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.200",
            "198.18.0.1",
            "198.19.255.254",
            "240.0.0.1",
            "254.255.255.255",
            "::ffff:198.18.3.4",
            "64:ff9b::c612:1",
            "64:ff9b:1::a00:1",
            "64:ff9b:1:ffff::1",
            "100::1",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:2::1",
            "2001:1ff::1",
            "2001:db8::1",
            "3fff::1",
            "3fff:fff::1",
            "5f00::1",
            "fec0::1",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "172.32.0.1",
            "172.15.255.255",
            "100.128.0.1",
            "100.63.255.255",
            "8.8.8.8",
            "191.255.255.255",
            "192.0.1.1",
            "192.0.3.1",
            "198.17.255.255",
            "198.20.0.1",
            "198.51.101.1",
            "203.0.112.1",
            "239.255.255.255",
            "2001:200::1",
            "2001:4860:4860::8888",
            "2001:db9::1",
            "3fff:1000::1",
            "5f01::1",
            "64:ff9b:2::1",
            "101::1",
            "fe80::1",
            "::ffff:8.8.8.8",
        ] {
            assert!(!is_private(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn loopback_is_an_own_address_and_a_documentation_address_is_not() {
        assert!(is_own(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert!(!is_own(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))));
    }
}
