//! Result guards: finding secrets and personal data in the text of a tool's result.
//!
//! Each rule follows the format its issuer documents, not a loose shape: a fixed prefix
//! with an exact length and alphabet (cloud and SaaS keys), a structure that must decode
//! (a JWT's header), or a checksum (Luhn for payment cards, ISO 7064 mod 97 for IBANs).
//! What the issuers publish as examples (`AKIA...EXAMPLE`), reserved domains
//! (`example.com`, `.test`) and placeholders in URLs (`user:password@`) do not match. The
//! rules, and how well they do on the labeled corpus in `model/tests/guard_corpus`, are in
//! docs/guards.md.
//!
//! This differs from [`crate::redact`], which hides anything credential-shaped from logs on
//! the safe side (`tokens: 5` included): a guard acts on what a model reads, so a false
//! match costs the user an answer, and each rule must be precise.
//!
//! Work is linear in the text: one Aho-Corasick pass finds every secret rule's prefix, one
//! pass over the bytes finds the starts of numbers and IBANs, `memchr` finds every `@`;
//! each candidate is checked in a bounded number of bytes.

mod personal;
mod secrets;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a rule finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A PEM private key (`-----BEGIN ... PRIVATE KEY-----` to its `END` line).
    PrivateKey,
    /// An AWS access key ID (`AKIA`/`ASIA`/`ABIA`/`ACCA` and 16 base32 characters).
    AwsAccessKeyId,
    /// An AWS secret access key (40 characters after a `secret_access_key` key).
    AwsSecretAccessKey,
    /// A GitHub token (`ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_`, `github_pat_`).
    GithubToken,
    /// A GitLab personal access token (`glpat-`).
    GitlabToken,
    /// A Slack token (`xoxb-`, `xoxp-`, ...).
    SlackToken,
    /// A Slack incoming webhook URL.
    SlackWebhook,
    /// A Google API key (`AIza` and 35 characters).
    GoogleApiKey,
    /// A Stripe secret or restricted key (`sk_live_`, `rk_live_`, `sk_test_`, `rk_test_`).
    StripeKey,
    /// An OpenAI API key (`sk-proj-`, `sk-svcacct-`, `sk-admin-`, or `T3BlbkFJ` inside).
    OpenaiKey,
    /// An Anthropic API key (`sk-ant-`).
    AnthropicKey,
    /// An npm access token (`npm_` and 36 characters).
    NpmToken,
    /// A Hugging Face access token (`hf_` and 34 letters).
    HuggingfaceToken,
    /// A SendGrid API key (`SG.` and two dot-separated parts).
    SendgridKey,
    /// An Azure storage account key (`AccountKey=` and 88 base64 characters).
    AzureStorageKey,
    /// A JSON Web Token whose header decodes and names an `alg`.
    Jwt,
    /// A password in a URL (`scheme://user:password@host`).
    UrlCredentials,
    /// An e-mail address.
    Email,
    /// A phone number: international (`+` and 8-15 digits) or North American with its area
    /// code (`(415) 555-0132`, `415-555-0132`).
    Phone,
    /// A payment card number (13-19 digits of a card network's range, Luhn-valid).
    PaymentCard,
    /// An IBAN (its country's length, ISO 7064 mod 97 valid).
    Iban,
}

/// Every kind, in declaration order (`Kind as usize` indexes it).
pub const KINDS: [Kind; 21] = [
    Kind::PrivateKey,
    Kind::AwsAccessKeyId,
    Kind::AwsSecretAccessKey,
    Kind::GithubToken,
    Kind::GitlabToken,
    Kind::SlackToken,
    Kind::SlackWebhook,
    Kind::GoogleApiKey,
    Kind::StripeKey,
    Kind::OpenaiKey,
    Kind::AnthropicKey,
    Kind::NpmToken,
    Kind::HuggingfaceToken,
    Kind::SendgridKey,
    Kind::AzureStorageKey,
    Kind::Jwt,
    Kind::UrlCredentials,
    Kind::Email,
    Kind::Phone,
    Kind::PaymentCard,
    Kind::Iban,
];

/// The two families of rules, each with its own action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// Credentials.
    Secret,
    /// Data about a person.
    Personal,
}

impl Kind {
    /// Its name, as configured (`ignore`) and as metrics and audit records say it.
    pub fn name(self) -> &'static str {
        match self {
            Self::PrivateKey => "private_key",
            Self::AwsAccessKeyId => "aws_access_key_id",
            Self::AwsSecretAccessKey => "aws_secret_access_key",
            Self::GithubToken => "github_token",
            Self::GitlabToken => "gitlab_token",
            Self::SlackToken => "slack_token",
            Self::SlackWebhook => "slack_webhook",
            Self::GoogleApiKey => "google_api_key",
            Self::StripeKey => "stripe_key",
            Self::OpenaiKey => "openai_key",
            Self::AnthropicKey => "anthropic_key",
            Self::NpmToken => "npm_token",
            Self::HuggingfaceToken => "huggingface_token",
            Self::SendgridKey => "sendgrid_key",
            Self::AzureStorageKey => "azure_storage_key",
            Self::Jwt => "jwt",
            Self::UrlCredentials => "url_credentials",
            Self::Email => "email",
            Self::Phone => "phone",
            Self::PaymentCard => "payment_card",
            Self::Iban => "iban",
        }
    }

    /// Which family it belongs to.
    pub fn category(self) -> Category {
        match self {
            Self::Email | Self::Phone | Self::PaymentCard | Self::Iban => Category::Personal,
            _ => Category::Secret,
        }
    }

    /// Its bit in a [`Kinds`] set.
    pub const fn bit(self) -> u32 {
        1 << self as u32
    }
}

/// A set of kinds, as bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kinds(pub u32);

impl Kinds {
    /// No kind.
    pub const NONE: Self = Self(0);
    /// Every secret kind.
    pub const SECRETS: Self = Self((1 << 17) - 1);
    /// Every personal-data kind.
    pub const PERSONAL: Self = Self(((1 << 21) - 1) & !((1 << 17) - 1));

    /// Whether `k` is in the set.
    pub fn has(self, k: Kind) -> bool {
        self.0 & k.bit() != 0
    }

    /// Whether the set and `other` share a kind.
    pub fn meets(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }

    /// The kinds in the set, in declaration order.
    pub fn iter(self) -> impl Iterator<Item = Kind> {
        KINDS.into_iter().filter(move |k| self.has(*k))
    }
}

/// One thing a rule found: `text[start..end]` is a `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finding {
    /// Its kind.
    pub kind: Kind,
    /// Byte offset of its first byte.
    pub start: usize,
    /// Byte offset after its last byte.
    pub end: usize,
}

/// Most findings kept for one string: past this a scan stops and says so
/// ([`Scan::overflowed`]); a guard that must redact then withholds the result instead.
pub const MAX_FINDINGS: usize = 4096;

/// The findings of one string.
#[derive(Debug, Default)]
pub struct Scan {
    /// What was found, by start. Findings of different rules may overlap (a token inside a
    /// URL's password, an address running into a key): each is reported, and [`redact`]
    /// replaces their union.
    pub findings: Vec<Finding>,
    /// More than [`MAX_FINDINGS`] were found; the rest are not listed.
    pub overflowed: bool,
}

impl Scan {
    fn push(&mut self, f: Finding) -> bool {
        if self.findings.len() >= MAX_FINDINGS {
            self.overflowed = true;
            return false;
        }
        self.findings.push(f);
        true
    }
}

/// Finds the `kinds` in `text`, into `out` (cleared first), sorted by start. Both families
/// are searched even when the first fills the list (the caller learns of it from
/// [`Scan::overflowed`]).
pub fn scan(text: &str, kinds: Kinds, out: &mut Scan) {
    out.findings.clear();
    out.overflowed = false;
    let b = text.as_bytes();
    if kinds.meets(Kinds::SECRETS) {
        secrets::scan(b, kinds, out);
    }
    if kinds.meets(Kinds::PERSONAL) {
        personal::scan(b, kinds, out);
    }
    sort(&mut out.findings);
}

/// Sorts findings by start (at the same start, the longer first), unless they are already.
fn sort(f: &mut [Finding]) {
    if !f.is_sorted_by_key(|x| x.start) {
        f.sort_unstable_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    }
}

/// `text` with each finding replaced by `[redacted:KIND]`; findings that overlap (sorted by
/// start, as [`scan`] leaves them) are replaced as one, named by the first. A finding off a
/// character boundary (never made by [`scan`]) is left out.
pub fn redact(text: &str, findings: &[Finding]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for f in findings {
        if f.end <= at || !text.is_char_boundary(f.start) || !text.is_char_boundary(f.end) {
            continue;
        }
        if f.start >= at {
            out.push_str(&text[at..f.start]);
            out.push_str("[redacted:");
            out.push_str(f.kind.name());
            out.push(']');
        }
        at = f.end;
    }
    out.push_str(&text[at..]);
    out
}

/// Bytes of a word: ASCII letters and digits.
fn alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric()
}

/// How many bytes from `i` on satisfy `f`, counting at most `max`.
fn run(b: &[u8], i: usize, max: usize, f: impl Fn(u8) -> bool) -> usize {
    b.get(i..)
        .unwrap_or_default()
        .iter()
        .take(max)
        .take_while(|c| f(**c))
        .count()
}

/// Whether the byte before `i` is not one of `f`'s (or `i` is the start).
fn starts_word(b: &[u8], i: usize, f: impl Fn(u8) -> bool) -> bool {
    i == 0 || !f(b[i - 1])
}

/// Whether the byte at `i` is not one of `f`'s (or `i` is the end).
fn ends_word(b: &[u8], i: usize, f: impl Fn(u8) -> bool) -> bool {
    b.get(i).is_none_or(|c| !f(*c))
}

#[cfg(test)]
mod tests;
