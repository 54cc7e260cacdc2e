//! Result guards (`resultGuards`, on the ToolSet, a tool, or an upstream's or OpenAPI
//! document's `tools`): what a tool's result is searched for ([`crate::guard`]) and what is
//! done with what is found.
//!
//! The nearest declaration wins, field by field: what a tool (an imported tool: its source)
//! sets, else what the ToolSet sets. `secrets: off` and `personalData: off` on a tool exempt
//! it from the ToolSet's; an `ignore` list replaces the ToolSet's.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::guard::{Category, Kind, Kinds, Scan};

/// What a guard does with what it finds, from least to most.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum GuardAction {
    /// Not searched for.
    #[default]
    Off,
    /// Passed on unchanged; counted in the metric and noted in the audit record.
    Flag,
    /// Each finding replaced by `[redacted:KIND]`; counted and noted.
    Redact,
    /// The whole result withheld: the caller gets a tool error naming the kinds found
    /// (never the values); counted and noted.
    Refuse,
}

impl GuardAction {
    /// The metric label and audit field.
    pub fn label(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Flag => "flag",
            Self::Redact => "redact",
            Self::Refuse => "refuse",
        }
    }
}

/// What a tool's results are searched for, and what is done with each family of findings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResultGuardSpec {
    /// Credentials: private keys, cloud and SaaS keys and tokens, JWTs, passwords in URLs.
    /// Unset: the ToolSet's (`off` when it sets none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<GuardAction>,
    /// Personal data: e-mail addresses, phone numbers, payment card numbers, IBANs. Unset:
    /// the ToolSet's (`off` when it sets none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub personal_data: Option<GuardAction>,
    /// Kinds not searched for, e.g. `[email]` for a directory tool whose answers are
    /// addresses (see docs/guards.md for the kinds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 21))]
    pub ignore: Vec<Kind>,
    /// A budget on the tokens of a result, and their metering (see docs/guards.md). Unset:
    /// the ToolSet's; each of its fields unset: the ToolSet's too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenSpec>,
}

/// The OpenAI byte-pair encoding a result is counted in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TokenEncoding {
    /// GPT-4o, GPT-4.1, GPT-5 and the o-series models.
    #[default]
    #[serde(rename = "o200k_base")]
    O200kBase,
    /// GPT-4 and GPT-3.5.
    #[serde(rename = "cl100k_base")]
    Cl100kBase,
}

/// What is done with a result over its token budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OverBudget {
    /// Cut at a token boundary, with a note at the end saying so and how large it was
    /// (a tool with an `outputSchema` is refused instead: a cut result cannot meet it).
    #[default]
    Truncate,
    /// Withheld: the caller gets a tool error saying how large it was.
    Refuse,
}

impl OverBudget {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Truncate => "truncate",
            Self::Refuse => "refuse",
        }
    }
}

/// A result's tokens: counted, bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenSpec {
    /// The most tokens a result may have (its text or its structured content, as a client
    /// hands it to a model), at least 100 (a smaller value counts as 100: the note of a
    /// cut takes about 40); larger results are cut or withheld (`onExceed`). Unset: no
    /// budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100, max = 10_000_000))]
    pub max_result_tokens: Option<u32>,
    /// What is done with a result over `maxResultTokens`: `truncate` (default) or `refuse`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exceed: Option<OverBudget>,
    /// Count every result's tokens into the metrics (per tool and per caller) and the audit
    /// record, also without a budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meter: Option<bool>,
    /// The encoding counted in: `o200k_base` (default) or `cl100k_base`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<TokenEncoding>,
}

impl TokenSpec {
    fn within(&self, outer: &Self) -> Self {
        Self {
            max_result_tokens: self.max_result_tokens.or(outer.max_result_tokens),
            on_exceed: self.on_exceed.or(outer.on_exceed),
            meter: self.meter.or(outer.meter),
            encoding: self.encoding.or(outer.encoding),
        }
    }
}

/// A compiled token budget: what a result's tokens are counted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBudget {
    /// The most tokens a result may have.
    pub max: Option<u64>,
    /// What is done with a result over `max`.
    pub over: OverBudget,
    /// Every result's tokens are counted into the metrics and the audit record.
    pub meter: bool,
    /// The encoding counted in.
    pub encoding: TokenEncoding,
}

impl TokenBudget {
    fn compile(spec: &TokenSpec) -> Option<Self> {
        let b = Self {
            // Below 100 a cut result would hold little more than its note (about 40).
            max: spec.max_result_tokens.map(|m| u64::from(m.max(100))),
            over: spec.on_exceed.unwrap_or_default(),
            meter: spec.meter.unwrap_or(false),
            encoding: spec.encoding.unwrap_or_default(),
        };
        (b.max.is_some() || b.meter).then_some(b)
    }
}

impl ResultGuardSpec {
    /// This spec with what it leaves unset taken from `outer` (the ToolSet's).
    fn within(&self, outer: &Self) -> Self {
        Self {
            secrets: self.secrets.or(outer.secrets),
            personal_data: self.personal_data.or(outer.personal_data),
            ignore: if self.ignore.is_empty() {
                outer.ignore.clone()
            } else {
                self.ignore.clone()
            },
            tokens: match (&self.tokens, &outer.tokens) {
                (Some(own), Some(o)) => Some(own.within(o)),
                (own, o) => own.clone().or_else(|| o.clone()),
            },
        }
    }
}

/// A compiled guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultGuard {
    /// What was declared (a tool's own is completed by the ToolSet's).
    spec: ResultGuardSpec,
    secrets: GuardAction,
    personal: GuardAction,
    /// The kinds searched for.
    kinds: Kinds,
    /// The result's token budget, when its tokens are counted.
    pub tokens: Option<TokenBudget>,
}

impl ResultGuard {
    /// The guard `spec` declares (an all-`off` one included: it exempts from the
    /// ToolSet's).
    pub fn compile(spec: &ResultGuardSpec) -> Arc<Self> {
        let secrets = spec.secrets.unwrap_or_default();
        let personal = spec.personal_data.unwrap_or_default();
        let mut kinds = Kinds::NONE;
        if secrets != GuardAction::Off {
            kinds.0 |= Kinds::SECRETS.0;
        }
        if personal != GuardAction::Off {
            kinds.0 |= Kinds::PERSONAL.0;
        }
        for k in &spec.ignore {
            kinds.0 &= !k.bit();
        }
        Arc::new(Self {
            spec: spec.clone(),
            secrets,
            personal,
            kinds,
            tokens: spec.tokens.as_ref().and_then(TokenBudget::compile),
        })
    }

    /// The strongest action of a family it searches for.
    fn strongest(&self) -> GuardAction {
        let on = |a: GuardAction, family: Kinds| {
            if self.kinds.meets(family) {
                a
            } else {
                GuardAction::Off
            }
        };
        on(self.secrets, Kinds::SECRETS).max(on(self.personal, Kinds::PERSONAL))
    }

    /// Whether it searches for anything or counts tokens.
    pub fn active(&self) -> bool {
        self.searches() || self.tokens.is_some()
    }

    /// Whether it searches for anything.
    pub fn searches(&self) -> bool {
        self.kinds != Kinds::NONE
    }

    /// What is done with a finding of `kind`.
    pub fn action(&self, kind: Kind) -> GuardAction {
        match kind.category() {
            Category::Secret => self.secrets,
            Category::Personal => self.personal,
        }
    }

    /// Searches `text`; returns it redacted when a finding must be redacted, noting every
    /// finding in `v`. Stops searching once the result is to be withheld.
    pub fn check_str(&self, text: &str, scan: &mut Scan, v: &mut Verdict) -> Option<String> {
        if v.action == GuardAction::Refuse || text.is_empty() {
            return None;
        }
        crate::guard::scan(text, self.kinds, scan);
        if scan.findings.is_empty() {
            return None;
        }
        let mut redact = false;
        for f in &scan.findings {
            let a = self.action(f.kind);
            v.note(f.kind, a);
            redact |= a == GuardAction::Redact;
        }
        if scan.overflowed && self.strongest() >= GuardAction::Redact {
            // Not every finding is known (one family may not have been searched at all):
            // what cannot be redacted or refused whole is withheld.
            v.action = GuardAction::Refuse;
            v.overflowed = true;
            return None;
        }
        if !redact || v.action == GuardAction::Refuse {
            return None;
        }
        scan.findings
            .retain(|f| self.action(f.kind) == GuardAction::Redact);
        Some(crate::guard::redact(text, &scan.findings))
    }

    /// Searches every string, object key and long integer of `value`, redacting strings and
    /// numbers in place. A key cannot be rewritten: a finding there that must be redacted
    /// withholds the result.
    pub fn check_value(&self, value: &mut Value, scan: &mut Scan, v: &mut Verdict) {
        match value {
            Value::String(s) => {
                if let Some(r) = self.check_str(s, scan, v) {
                    *s = r;
                }
            }
            Value::Number(n) => {
                // A card number written as a JSON number (13-19 digits).
                let long = n.as_u64().is_some_and(|x| x >= 1_000_000_000_000);
                if long && self.kinds.has(Kind::PaymentCard) {
                    let text = n.to_string();
                    if let Some(r) = self.check_str(&text, scan, v) {
                        *value = Value::String(r);
                    }
                }
            }
            Value::Array(items) => {
                for x in items {
                    self.check_value(x, scan, v);
                }
            }
            Value::Object(map) => {
                for (k, x) in map.iter_mut() {
                    self.check_key(k, scan, v);
                    self.check_value(x, scan, v);
                }
            }
            Value::Bool(_) | Value::Null => {}
        }
    }

    /// Searches a content block: every string and key but the base64 payload of an image or
    /// audio block (`data`) and of a binary embedded resource (`blob`, decoded and searched
    /// when its `mimeType` is text).
    pub fn check_block(&self, block: &mut Value, scan: &mut Scan, v: &mut Verdict) {
        let Value::Object(map) = block else {
            return self.check_value(block, scan, v);
        };
        let media = matches!(map.get("type").and_then(Value::as_str), Some("image" | "audio"));
        for (k, x) in map.iter_mut() {
            match (k.as_str(), x) {
                ("data", _) if media => {}
                ("resource", Value::Object(r)) => {
                    let text = r.get("mimeType").and_then(Value::as_str).is_some_and(textual);
                    for (k, x) in r.iter_mut() {
                        match (k.as_str(), x) {
                            ("blob", Value::String(b)) if text => self.check_blob(b, scan, v),
                            ("blob", _) => {}
                            (_, x) => self.check_value(x, scan, v),
                        }
                    }
                }
                (_, x) => self.check_value(x, scan, v),
            }
        }
    }

    /// A base64 blob of text: decoded, searched, encoded again when redacted. One that does
    /// not decode to UTF-8 is binary and left alone.
    fn check_blob(&self, blob: &mut String, scan: &mut Scan, v: &mut Verdict) {
        use base64::Engine as _;
        let engine = &base64::engine::general_purpose::STANDARD;
        let Some(text) = engine
            .decode(blob.as_bytes())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
        else {
            return;
        };
        if let Some(r) = self.check_str(&text, scan, v) {
            *blob = engine.encode(r);
        }
    }

    fn check_key(&self, key: &str, scan: &mut Scan, v: &mut Verdict) {
        let mut here = Verdict::default();
        if self.check_str(key, scan, &mut here).is_some() || here.action == GuardAction::Refuse {
            here.action = GuardAction::Refuse;
        }
        if here.count > 0 {
            v.found.0 |= here.found.0;
            v.count = v.count.saturating_add(here.count);
            v.action = v.action.max(here.action);
            v.overflowed |= here.overflowed;
        }
    }
}

/// Whether a MIME type is text (`text/*`, JSON, XML, YAML, and their `+json`-style kin).
fn textual(mime: &str) -> bool {
    let m = mime
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    m.starts_with("text/")
        || ["json", "xml", "yaml", "x-yaml", "javascript", "x-sh"]
            .iter()
            .any(|t| m == format!("application/{t}"))
        || m.ends_with("+json")
        || m.ends_with("+xml")
}

/// What a guard found in one result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The kinds found.
    pub found: Kinds,
    /// How many findings.
    pub count: u32,
    /// The strongest action a finding called for (`off`: nothing found).
    pub action: GuardAction,
    /// More was found in one string than can be listed (the result is withheld).
    pub overflowed: bool,
}

impl Verdict {
    fn note(&mut self, kind: Kind, a: GuardAction) {
        self.found.0 |= kind.bit();
        self.count = self.count.saturating_add(1);
        self.action = self.action.max(a);
    }

    /// The message of a withheld result: the kinds found, never the values.
    pub fn refusal(&self) -> String {
        let kinds: Vec<&str> = self.found.iter().map(Kind::name).collect();
        format!(
            "the server withheld this result: it contained {} ({}). Ask for less, or ask the server's operators to review the tool",
            if self.overflowed {
                "more findings than can be redacted"
            } else {
                "data its result guard refuses to pass on"
            },
            kinds.join(", ")
        )
    }
}

/// The guard of a tool or source: what it declares (`own`), completed field by field by the
/// ToolSet's (`outer`); `None` when the result searches for nothing.
pub fn resolve(own: Option<&Arc<ResultGuard>>, outer: Option<&Arc<ResultGuard>>) -> Option<Arc<ResultGuard>> {
    let g = match (own, outer) {
        (Some(o), Some(s)) => ResultGuard::compile(&o.spec.within(&s.spec)),
        (Some(g), None) | (None, Some(g)) => g.clone(),
        (None, None) => return None,
    };
    g.active().then_some(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(yaml: &str) -> Arc<ResultGuard> {
        let spec: ResultGuardSpec = serde_saphyr::from_str(yaml).expect("spec");
        ResultGuard::compile(&spec)
    }

    #[test]
    fn actions_per_family_and_ignored_kinds() {
        let g = guard("{secrets: refuse, personalData: redact, ignore: [phone]}");
        let (mut s, mut v) = (Scan::default(), Verdict::default());
        let out = g.check_str("jane@acme.io +44 20 7946 0958", &mut s, &mut v);
        assert_eq!(out.as_deref(), Some("[redacted:email] +44 20 7946 0958"));
        assert_eq!((v.count, v.action), (1, GuardAction::Redact));
        let mut value = serde_json::json!({"a": ["x jane@acme.io", {"k": "AKIAZ2QXLMN7ORP4VWTY"}], "n": 4});
        g.check_value(&mut value, &mut s, &mut v);
        assert_eq!(value["a"][0], "x [redacted:email]");
        assert_eq!(v.action, GuardAction::Refuse);
        assert!(v.found.has(Kind::AwsAccessKeyId) && v.found.has(Kind::Email));
        assert!(
            v.refusal().contains("aws_access_key_id, email"),
            "{}",
            v.refusal()
        );
        assert!(!v.refusal().contains("AKIA"));
    }

    #[test]
    fn keys_numbers_and_text_blobs_are_searched_media_payloads_are_not() {
        let g = guard("{secrets: redact, personalData: redact}");
        let (mut s, mut v) = (Scan::default(), Verdict::default());
        let mut value = serde_json::json!({"card": 4111111111111111u64, "n": 12});
        g.check_value(&mut value, &mut s, &mut v);
        assert_eq!(
            value,
            serde_json::json!({"card": "[redacted:payment_card]", "n": 12})
        );
        let mut keyed = serde_json::json!({"jane@acme.io": 1});
        g.check_value(&mut keyed, &mut s, &mut v);
        assert_eq!(
            v.action,
            GuardAction::Refuse,
            "a key that must be redacted withholds the result"
        );
        use base64::Engine as _;
        let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
        let (mut s, mut v) = (Scan::default(), Verdict::default());
        let mut block = serde_json::json!({"type": "resource", "resource": {"uri": "file:///.env", "mimeType": "text/plain", "blob": b64("KEY=AKIAZ2QXLMN7ORP4VWTY")}});
        g.check_block(&mut block, &mut s, &mut v);
        assert_eq!(block["resource"]["blob"], b64("KEY=[redacted:aws_access_key_id]"));
        let mut image = serde_json::json!({"type": "image", "mimeType": "image/png", "data": "AKIAZ2QXLMN7ORP4VWTY", "_meta": {"data": "AKIAZ2QXLMN7ORP4VWTY"}});
        g.check_block(&mut image, &mut s, &mut v);
        assert_eq!(
            image["data"], "AKIAZ2QXLMN7ORP4VWTY",
            "a media payload is not text"
        );
        assert_eq!(image["_meta"]["data"], "[redacted:aws_access_key_id]");
    }

    #[test]
    fn flag_changes_nothing_and_blocks_keep_their_payloads() {
        let g = guard("{personalData: flag}");
        let (mut s, mut v) = (Scan::default(), Verdict::default());
        let mut block = serde_json::json!({"type": "image", "mimeType": "image/png", "data": "jane@acme.io", "_meta": {"note": "jane@acme.io"}});
        let before = block.clone();
        g.check_block(&mut block, &mut s, &mut v);
        assert_eq!(block, before);
        assert_eq!(
            (v.count, v.action),
            (1, GuardAction::Flag),
            "the address in _meta, not in data"
        );
    }

    #[test]
    fn the_nearest_declaration_wins_field_by_field_and_off_exempts() {
        let server = guard("{secrets: refuse, personalData: redact}");
        let off = guard("{secrets: off, personalData: off}");
        assert!(resolve(None, Some(&server)).is_some());
        assert!(resolve(Some(&off), Some(&server)).is_none());
        assert!(resolve(None, None).is_none());
        // `ignore` alone keeps the ToolSet's actions; one family set keeps the other's.
        let g = resolve(Some(&guard("{ignore: [email]}")), Some(&server)).expect("a guard");
        assert_eq!(
            (g.secrets, g.personal),
            (GuardAction::Refuse, GuardAction::Redact)
        );
        assert!(!g.kinds.has(Kind::Email) && g.kinds.has(Kind::Phone));
        let g = resolve(Some(&guard("{personalData: flag}")), Some(&server)).expect("a guard");
        assert_eq!((g.secrets, g.personal), (GuardAction::Refuse, GuardAction::Flag));
    }

    #[test]
    fn token_budgets_inherit_field_by_field_and_alone_make_a_guard() {
        let server = guard("{tokens: {maxResultTokens: 25000, onExceed: refuse}}");
        let g = resolve(None, Some(&server)).expect("a budget alone is a guard");
        assert!(!g.searches());
        let b = g.tokens.expect("a budget");
        assert_eq!((b.max, b.over, b.meter), (Some(25000), OverBudget::Refuse, false));
        let own = guard("{tokens: {meter: true, encoding: cl100k_base}}");
        let b = resolve(Some(&own), Some(&server))
            .and_then(|g| g.tokens)
            .expect("a budget");
        assert_eq!(
            (b.max, b.over, b.meter, b.encoding),
            (Some(25000), OverBudget::Refuse, true, TokenEncoding::Cl100kBase)
        );
        let metered = guard("{tokens: {meter: true}}");
        assert_eq!(
            metered.tokens.map(|b| (b.max, b.over)),
            Some((None, OverBudget::Truncate))
        );
        assert!(
            guard("{tokens: {meter: false}}").tokens.is_none(),
            "counts nothing"
        );
        assert_eq!(
            guard("{tokens: {maxResultTokens: 3}}").tokens.and_then(|b| b.max),
            Some(100)
        );
        let bad: Result<ResultGuardSpec, _> = serde_saphyr::from_str("{tokens: {maxResult: 3}}");
        assert!(bad.is_err(), "unknown fields are refused");
    }

    #[test]
    fn an_overflow_of_one_family_withholds_what_the_other_would_refuse() {
        let g = guard("{secrets: flag, personalData: refuse}");
        let text = format!(
            "{} bob@corp.io",
            "AKIAZ2QXLMN7ORP4VWTY ".repeat(crate::guard::MAX_FINDINGS + 1)
        );
        let (mut s, mut v) = (Scan::default(), Verdict::default());
        g.check_str(&text, &mut s, &mut v);
        assert_eq!(v.action, GuardAction::Refuse);
    }

    #[test]
    fn an_overflow_that_must_be_redacted_is_withheld() {
        let g = guard("{personalData: redact}");
        let text = "x@acme.io ".repeat(crate::guard::MAX_FINDINGS + 1);
        let (mut s, mut v) = (Scan::default(), Verdict::default());
        assert!(g.check_str(&text, &mut s, &mut v).is_none());
        assert_eq!(v.action, GuardAction::Refuse);
        assert!(v.overflowed);
    }
}
