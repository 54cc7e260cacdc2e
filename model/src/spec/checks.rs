//! Checks of single values of a ToolSet that several compile steps share: durations, byte
//! limits, nesting depth, header and environment names, and URLs.

use std::time::Duration;

use serde_json::Value;

use super::context::Problems;
use super::json_field::{MAX_VALUE_DEPTH, too_deep};
use crate::template::{Template, depth};

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_TIMEOUT: Duration = Duration::from_secs(300);
const DEFAULT_MAX_BYTES: usize = 1 << 20;

/// Parses a duration such as `250ms`, `2s`, `1.5s`, `1m`, `24h`: the one grammar of every
/// duration of a ToolSet, a server flag and an McpServer field. Never panics: values too
/// large for a [`Duration`] are errors (callers then apply their own upper bound).
///
/// # Errors
/// Anything else, including more than 32 characters.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.len() > 32 {
        return Err("a duration has at most 32 characters (e.g. `250ms`, `2s`, `1m`, `1h`)".to_owned());
    }
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => return Err(format!("`{s}` has no unit (use ms, s, m or h)")),
    };
    let n: f64 = num.parse().map_err(|_| format!("`{s}` is not a duration"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{s}` is out of range"))
}

/// An HTTP header name (RFC 9110 token).
pub fn valid_header_name(k: &str) -> bool {
    !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_!#$%&'*+.^`|~".contains(&b))
}

/// Headers that frame the message or manage the connection: the client sets them, and a
/// configured one would contradict it (a second `Content-Length`, or `Transfer-Encoding`
/// beside it, is how requests are smuggled past a proxy).
const FRAMING_HEADERS: [&str; 8] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
];

/// What is wrong with a configured header name; `more` lists names reserved besides the
/// framing ones.
pub fn header_name_problem(k: &str, more: &[&str]) -> Option<String> {
    if !valid_header_name(k) {
        return Some("not a valid header name".into());
    }
    FRAMING_HEADERS
        .iter()
        .chain(more)
        .any(|r| r.eq_ignore_ascii_case(k))
        .then(|| format!("`{k}` is set by quiver-server and cannot be configured"))
}

pub fn duration(v: Option<&String>, path: &str, p: &mut Problems) -> Duration {
    duration_or(v, DEFAULT_TIMEOUT, path, p)
}

/// A time limit of at most 5 minutes, `default` when unset or invalid (which is reported).
pub fn duration_or(v: Option<&String>, default: Duration, path: &str, p: &mut Problems) -> Duration {
    match v.map(|s| parse_duration(s)) {
        None => default,
        Some(Ok(d)) if d.is_zero() || d > MAX_TIMEOUT => {
            p.push(path, "must be more than 0 and at most 5m");
            default
        }
        Some(Ok(d)) => d,
        Some(Err(e)) => {
            p.push(path, e);
            default
        }
    }
}

/// An environment variable name a process can be given.
pub fn valid_env_name(k: &str) -> bool {
    !k.is_empty() && !k.contains(['=', '\0'])
}

pub fn byte_cap(v: Option<u64>, path: &str, p: &mut Problems) -> usize {
    match v {
        None => DEFAULT_MAX_BYTES,
        Some(0) => {
            p.push(path, "must be more than 0");
            DEFAULT_MAX_BYTES
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    }
}

/// True when `v` nests at most [`MAX_VALUE_DEPTH`] deep; reports it otherwise.
pub fn shallow(v: &Value, path: &str, p: &mut Problems) -> bool {
    let d = too_deep(v).map_or_else(|| depth(v), |d| usize::try_from(d).unwrap_or(usize::MAX));
    if d > MAX_VALUE_DEPTH {
        p.push(
            path,
            format!("nests {d} deep; at most {MAX_VALUE_DEPTH} levels are accepted"),
        );
        return false;
    }
    true
}

/// The `scheme://authority` of an http tool's URL template, which must be literal and end
/// where the template's literal text still goes on (with `/`, `?` or `#`): a value can then
/// only change the path, query or fragment, never which server is called.
pub fn literal_origin(url: &Template) -> Result<String, &'static str> {
    let prefix = url.literal_prefix();
    let Some((scheme, rest)) = prefix.split_once("://") else {
        return Err("must start with http:// or https://");
    };
    if !matches!(scheme, "http" | "https") {
        return Err("must start with http:// or https://");
    }
    let end = match rest.find(['/', '?', '#']) {
        Some(end) => end,
        None if url.is_literal() => rest.len(),
        None => {
            return Err(
                "the scheme, host and port must be literal and followed by a literal `/`, `?` or `#` \
                 before the first `{{`: a value that could change the server called lets callers reach any server",
            );
        }
    };
    let authority = &rest[..end];
    let (userinfo, host) = authority.rsplit_once('@').unwrap_or(("", authority));
    if host.is_empty() || host.starts_with(':') {
        return Err("names no host");
    }
    if !userinfo
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=:".contains(&b))
    {
        return Err("the user information before `@` has a character URLs do not allow there");
    }
    if !valid_host_port(host) {
        return Err("the host part is not a valid host[:port]");
    }
    Ok(format!("{scheme}://{authority}"))
}

/// `host[:port]` of RFC 3986: a registered name or IPv4 address, or an IPv6 address in
/// brackets, and a port of at most 65535.
fn valid_host_port(s: &str) -> bool {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return false;
        };
        if v6.is_empty()
            || !v6
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return false;
        }
        match after {
            "" => return true,
            _ => match after.strip_prefix(':') {
                Some(port) => ("x", Some(port)),
                None => return false,
            },
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, port)) => (h, Some(port)),
            None => (s, None),
        }
    };
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=".contains(&b));
    let port_ok = port.is_none_or(|p| {
        p.is_empty() || (p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok())
    });
    host_ok && port_ok
}

/// The path of a URL or URL tail: what comes before its query or fragment.
pub fn path_of(url: &str) -> &str {
    url.split(['?', '#']).next().unwrap_or_default()
}

/// True when a URL path, once percent-decoded, has a `.` or `..` segment (with `/` or `\`
/// as separators, as servers that decode before normalising see it).
pub fn has_dot_segment(path: &str) -> bool {
    let decoded = percent_decode(path);
    decoded.split(['/', '\\']).any(|seg| seg == "." || seg == "..")
}

pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(v) = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("5").is_err());
        assert_eq!(parse_duration("5h").unwrap(), Duration::from_secs(5 * 3600));
        assert!(parse_duration("5d").is_err());
        // Out of range or malformed: errors, never a panic.
        for bad in [
            "99999999999999999999s",
            "99999999999999999999m",
            "1e400s",
            "..s",
            ".s",
            "1.2.3s",
            "-1s",
            "ms",
            "",
            &"9".repeat(400),
            &format!("{}s", "9".repeat(400)),
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(parse_duration(".5s").unwrap(), Duration::from_millis(500));
    }
}
