//! The secret rules: each starts at a fixed prefix (found for all rules in one Aho-Corasick
//! pass) and is checked by the format its issuer documents.

use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, Input, MatchKind};
use base64::Engine as _;

use super::{Finding, Kind, Kinds, Scan, alnum, ends_word, run, starts_word};

/// What a prefix starts.
#[derive(Clone, Copy)]
enum Rule {
    PrivateKey,
    AwsKeyId,
    AwsSecret,
    Github,
    GithubPat,
    Gitlab,
    Slack,
    SlackWebhook,
    Google,
    Stripe,
    SkDash,
    Npm,
    HuggingFace,
    Sendgrid,
    Azure,
    Jwt,
    Url,
}

const PREFIXES: &[(&str, Rule)] = &[
    ("-----BEGIN ", Rule::PrivateKey),
    ("AKIA", Rule::AwsKeyId),
    ("ASIA", Rule::AwsKeyId),
    ("ABIA", Rule::AwsKeyId),
    ("ACCA", Rule::AwsKeyId),
    ("secret_access_key", Rule::AwsSecret),
    ("SECRET_ACCESS_KEY", Rule::AwsSecret),
    ("SecretAccessKey", Rule::AwsSecret),
    ("secretAccessKey", Rule::AwsSecret),
    ("secret-access-key", Rule::AwsSecret),
    ("ghp_", Rule::Github),
    ("gho_", Rule::Github),
    ("ghu_", Rule::Github),
    ("ghs_", Rule::Github),
    ("ghr_", Rule::Github),
    ("github_pat_", Rule::GithubPat),
    ("glpat-", Rule::Gitlab),
    ("xoxa-", Rule::Slack),
    ("xoxb-", Rule::Slack),
    ("xoxe-", Rule::Slack),
    ("xoxo-", Rule::Slack),
    ("xoxp-", Rule::Slack),
    ("xoxr-", Rule::Slack),
    ("xoxs-", Rule::Slack),
    ("hooks.slack.com/services/", Rule::SlackWebhook),
    ("AIza", Rule::Google),
    ("sk_live_", Rule::Stripe),
    ("sk_test_", Rule::Stripe),
    ("rk_live_", Rule::Stripe),
    ("rk_test_", Rule::Stripe),
    ("sk-", Rule::SkDash),
    ("npm_", Rule::Npm),
    ("hf_", Rule::HuggingFace),
    ("SG.", Rule::Sendgrid),
    ("AccountKey=", Rule::Azure),
    ("eyJ", Rule::Jwt),
    ("://", Rule::Url),
];

/// Every prefix, searched leftmost-first: the SIMD (Teddy) search, which a search reporting
/// overlapping matches could not use. A prefix that starts inside another's is found by
/// searching on from the byte after the other's start when its check fails.
static PREFIX_SET: LazyLock<Option<AhoCorasick>> = LazyLock::new(|| {
    AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostFirst)
        .build(PREFIXES.iter().map(|(p, _)| *p))
        .ok()
});

impl Rule {
    /// The kinds its check may find.
    fn kinds(self) -> Kinds {
        let k = match self {
            Self::PrivateKey => Kind::PrivateKey.bit(),
            Self::AwsKeyId => Kind::AwsAccessKeyId.bit(),
            Self::AwsSecret => Kind::AwsSecretAccessKey.bit(),
            Self::Github | Self::GithubPat => Kind::GithubToken.bit(),
            Self::Gitlab => Kind::GitlabToken.bit(),
            Self::Slack => Kind::SlackToken.bit(),
            Self::SlackWebhook => Kind::SlackWebhook.bit(),
            Self::Google => Kind::GoogleApiKey.bit(),
            Self::Stripe => Kind::StripeKey.bit(),
            Self::SkDash => Kind::OpenaiKey.bit() | Kind::AnthropicKey.bit(),
            Self::Npm => Kind::NpmToken.bit(),
            Self::HuggingFace => Kind::HuggingfaceToken.bit(),
            Self::Sendgrid => Kind::SendgridKey.bit(),
            Self::Azure => Kind::AzureStorageKey.bit(),
            Self::Jwt => Kind::Jwt.bit(),
            Self::Url => Kind::UrlCredentials.bit(),
        };
        Kinds(k)
    }
}

/// Token characters of most keys: letters, digits, `_`, `-`.
fn token(c: u8) -> bool {
    alnum(c) || c == b'_' || c == b'-'
}

fn base64_char(c: u8) -> bool {
    alnum(c) || c == b'+' || c == b'/'
}

/// Finds the secret `kinds` in `b` into `out`, by start.
pub(super) fn scan(b: &[u8], kinds: Kinds, out: &mut Scan) {
    let Some(ac) = PREFIX_SET.as_ref() else { return };
    let mut at = 0;
    while let Some(m) = ac.find(Input::new(b).range(at..)) {
        let rule = PREFIXES[m.pattern().as_usize()].1;
        let f = if kinds.meets(rule.kinds()) {
            check(b, m.start(), m.end(), rule)
        } else {
            None
        };
        match f {
            Some(f) if kinds.has(f.kind) => {
                if !out.push(f) {
                    return;
                }
                // A URL's password may be a token of its own: searched for, inside it.
                at = if f.kind == Kind::UrlCredentials {
                    f.start
                } else {
                    f.end
                };
            }
            _ => at = m.start() + 1,
        }
    }
}

fn found(kind: Kind, start: usize, end: usize) -> Option<Finding> {
    Some(Finding { kind, start, end })
}

/// The secret a prefix at `start..p` (`p`: after the prefix) begins, if the text there has
/// the rule's format.
fn check(b: &[u8], start: usize, p: usize, rule: Rule) -> Option<Finding> {
    match rule {
        Rule::PrivateKey => private_key(b, start, p),
        Rule::AwsKeyId => fixed(b, start, p, 16, aws_id_char, Kind::AwsAccessKeyId)
            .filter(|f| !b[f.start..f.end].ends_with(b"EXAMPLE")),
        Rule::AwsSecret => aws_secret(b, p),
        Rule::Github => fixed(b, start, p, 36, alnum, Kind::GithubToken),
        Rule::GithubPat => at_least(b, start, p, 60, 255, |c| alnum(c) || c == b'_', Kind::GithubToken),
        Rule::Gitlab => at_least(b, start, p, 0, 255, |c| token(c) || c == b'.', Kind::GitlabToken)
            .map(|f| trim_dots(b, f))
            .filter(|f| f.end - p >= 20),
        Rule::Slack => slack(b, start, p),
        Rule::SlackWebhook => slack_webhook(b, start, p),
        Rule::Google => fixed(b, start, p, 35, token, Kind::GoogleApiKey),
        Rule::Stripe => at_least(b, start, p, 24, 255, alnum, Kind::StripeKey),
        Rule::SkDash => sk_dash(b, start, p),
        Rule::Npm => fixed(b, start, p, 36, alnum, Kind::NpmToken),
        Rule::HuggingFace => fixed(
            b,
            start,
            p,
            34,
            |c| c.is_ascii_alphabetic(),
            Kind::HuggingfaceToken,
        ),
        Rule::Sendgrid => sendgrid(b, start, p),
        Rule::Azure => azure(b, p),
        Rule::Jwt => jwt(b, start),
        Rule::Url => url_credentials(b, start, p),
    }
}

/// Exactly `n` bytes of `f` after the prefix, which starts a word and is followed by none.
fn fixed(b: &[u8], start: usize, p: usize, n: usize, f: impl Fn(u8) -> bool, kind: Kind) -> Option<Finding> {
    if !starts_word(b, start, token) || run(b, p, n + 1, f) != n || !ends_word(b, p + n, token) {
        return None;
    }
    found(kind, start, p + n)
}

/// The 16 characters after an access key ID's prefix: base32 (`A-Z`, `2-7`).
fn aws_id_char(c: u8) -> bool {
    c.is_ascii_uppercase() || (b'2'..=b'7').contains(&c)
}

/// `min..=max` bytes of `f` after the prefix, which starts a word.
fn at_least(
    b: &[u8],
    start: usize,
    p: usize,
    min: usize,
    max: usize,
    f: impl Fn(u8) -> bool,
    kind: Kind,
) -> Option<Finding> {
    if !starts_word(b, start, token) {
        return None;
    }
    let n = run(b, p, max + 1, f);
    (min..=max).contains(&n).then(|| Finding {
        kind,
        start,
        end: p + n,
    })
}

fn trim_dots(b: &[u8], mut f: Finding) -> Finding {
    while f.end > f.start && b[f.end - 1] == b'.' {
        f.end -= 1;
    }
    f
}

/// `-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----` (or `PRIVATE KEY BLOCK`, PGP's) through the end
/// of its `-----END ...-----` line; with no END, to the end of the text (a cut key still
/// leaks).
fn private_key(b: &[u8], start: usize, p: usize) -> Option<Finding> {
    let label = run(b, p, 48, |c| {
        c.is_ascii_uppercase() || c.is_ascii_digit() || c == b' '
    });
    let rest = &b[p + label..];
    let head = &b[p..p + label];
    let is_private = (head.ends_with(b"PRIVATE KEY") || head.ends_with(b"PRIVATE KEY BLOCK"))
        && rest.starts_with(b"-----");
    if !is_private {
        return None;
    }
    let body = p + label + 5;
    let end = match memchr::memmem::find(&b[body..], b"-----END ") {
        None => b.len(),
        Some(i) => {
            let after = body + i + 9;
            match memchr::memmem::find(&b[after..], b"-----") {
                Some(j) if j <= 48 => after + j + 5,
                _ => b.len(),
            }
        }
    };
    found(Kind::PrivateKey, start, end)
}

/// The value of a `secret_access_key` key: `:` or `=` (quotes and spaces around), then 40
/// base64 characters, the key's exact length.
fn aws_secret(b: &[u8], p: usize) -> Option<Finding> {
    let skip = |i: usize| i + run(b, i, 8, |c| matches!(c, b'"' | b'\'' | b' ' | b'\t'));
    let i = skip(p);
    if !matches!(b.get(i), Some(b':' | b'=')) {
        return None;
    }
    let v = skip(i + 1);
    let n = run(b, v, 41, base64_char);
    if n != 40 || !ends_word(b, v + n, |c| base64_char(c) || c == b'=') {
        return None;
    }
    let value = &b[v..v + n];
    if memchr::memmem::find(value, b"EXAMPLE").is_some() {
        return None;
    }
    found(Kind::AwsSecretAccessKey, v, v + n)
}

/// `xox?-` then digits and dash-separated parts: at least 15 characters with a dash.
fn slack(b: &[u8], start: usize, p: usize) -> Option<Finding> {
    if !starts_word(b, start, token) || !b.get(p).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let n = run(b, p, 256, |c| alnum(c) || c == b'-');
    let has_dash = b[p..p + n].contains(&b'-');
    (n >= 15 && has_dash).then(|| Finding {
        kind: Kind::SlackToken,
        start,
        end: p + n,
    })
}

/// `hooks.slack.com/services/T.../B.../` and 24 letters and digits.
fn slack_webhook(b: &[u8], start: usize, p: usize) -> Option<Finding> {
    let id = |i: usize, lead: u8| {
        (b.get(i) == Some(&lead))
            .then(|| run(b, i + 1, 16, |c| c.is_ascii_uppercase() || c.is_ascii_digit()))
            .filter(|n| (8..=14).contains(n))
            .map(|n| i + 1 + n)
    };
    let team = id(p, b'T')?;
    let bot = id(team + 1, b'B').filter(|_| b.get(team) == Some(&b'/'))?;
    if b.get(bot) != Some(&b'/') || run(b, bot + 1, 25, alnum) != 24 {
        return None;
    }
    found(Kind::SlackWebhook, start, bot + 25)
}

/// `sk-ant-...` (Anthropic), `sk-proj-`, `sk-svcacct-`, `sk-admin-` (OpenAI), or `sk-` and a
/// key carrying OpenAI's `T3BlbkFJ` marker.
fn sk_dash(b: &[u8], start: usize, p: usize) -> Option<Finding> {
    if !starts_word(b, start, token) {
        return None;
    }
    let n = run(b, p, 512, token);
    let key = &b[p..p + n];
    if n >= 512 {
        return None;
    }
    if key.starts_with(b"ant-") {
        return (n >= 90).then(|| Finding {
            kind: Kind::AnthropicKey,
            start,
            end: p + n,
        });
    }
    let scoped = [&b"proj-"[..], b"svcacct-", b"admin-"]
        .iter()
        .any(|s| key.starts_with(s));
    let marked = memchr::memmem::find(key, b"T3BlbkFJ").is_some();
    ((scoped || marked) && n >= 40).then(|| Finding {
        kind: Kind::OpenaiKey,
        start,
        end: p + n,
    })
}

/// `SG.` + 22 + `.` + 43 token characters.
fn sendgrid(b: &[u8], start: usize, p: usize) -> Option<Finding> {
    if !starts_word(b, start, token) || run(b, p, 23, token) != 22 || b.get(p + 22) != Some(&b'.') {
        return None;
    }
    let q = p + 23;
    (run(b, q, 44, token) == 43).then(|| Finding {
        kind: Kind::SendgridKey,
        start,
        end: q + 43,
    })
}

/// `AccountKey=` and 86 base64 characters and `==`: the value only.
fn azure(b: &[u8], p: usize) -> Option<Finding> {
    let n = run(b, p, 87, base64_char);
    (n == 86 && b.get(p + 86..p + 88) == Some(b"==")).then(|| Finding {
        kind: Kind::AzureStorageKey,
        start: p,
        end: p + 88,
    })
}

/// Three base64url parts (header and payload starting `eyJ`, a signature of 16 or more)
/// whose header decodes to JSON naming an `alg`.
fn jwt(b: &[u8], start: usize) -> Option<Finding> {
    let url = |c: u8| alnum(c) || c == b'-' || c == b'_';
    if !starts_word(b, start, url) {
        return None;
    }
    let h = run(b, start, 4096, url);
    let p = start + h + 1;
    if h < 10 || b.get(start + h) != Some(&b'.') || !b[p..].starts_with(b"eyJ") {
        return None;
    }
    let n = run(b, p, 65536, url);
    let s = p + n + 1;
    if n < 10 || b.get(p + n) != Some(&b'.') {
        return None;
    }
    let sig = run(b, s, 4096, url);
    // A dot after it ends a sentence, unless a fourth part follows (not a JWT).
    let fourth = b.get(s + sig) == Some(&b'.') && b.get(s + sig + 1).is_some_and(|c| url(*c));
    if sig < 16 || fourth || !ends_word(b, s + sig, |c| url(c) || c == b'=') {
        return None;
    }
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&b[start..start + h])
        .ok()?;
    memchr::memmem::find(&header, b"\"alg\"")?;
    found(Kind::Jwt, start, s + sig)
}

/// Words that stand for a password in examples, not one.
const PLACEHOLDERS: &[&str] = &[
    "password", "passwd", "pass", "pwd", "secret", "changeme", "redacted",
];

/// `scheme://user:password@`: the `user:password` part, when the password is not a
/// placeholder (`password`, `<...>`, `${...}`, `{{...}}`, `***`, `xxxx`).
fn url_credentials(b: &[u8], start: usize, p: usize) -> Option<Finding> {
    let scheme = (0..start.min(32))
        .take_while(|k| {
            let c = b[start - 1 - k];
            alnum(c) || matches!(c, b'+' | b'.' | b'-')
        })
        .count();
    if scheme < 2 || !b[start - scheme].is_ascii_alphabetic() {
        return None;
    }
    let info = run(b, p, 257, |c| {
        !matches!(
            c,
            b'/' | b'?' | b'#' | b'@' | b'"' | b'\'' | b'<' | b'>' | b'\\' | b'`'
        ) && c > b' '
            && c != 0x7f
    });
    if info > 256 || b.get(p + info) != Some(&b'@') {
        return None;
    }
    let userinfo = &b[p..p + info];
    let colon = userinfo.iter().position(|c| *c == b':')?;
    let (user, pass) = (&userinfo[..colon], &userinfo[colon + 1..]);
    if user.is_empty() || pass.is_empty() || placeholder(pass) {
        return None;
    }
    found(Kind::UrlCredentials, p, p + info)
}

fn placeholder(pass: &[u8]) -> bool {
    let first = pass[0];
    matches!(first, b'$' | b'<' | b'{' | b'[' | b'*')
        || pass.iter().all(|c| c.eq_ignore_ascii_case(&b'x'))
        || PLACEHOLDERS
            .iter()
            .any(|w| w.as_bytes().eq_ignore_ascii_case(pass))
}
