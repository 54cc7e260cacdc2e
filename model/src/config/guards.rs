//! Result guards (`resultGuards`, on the ToolSet, a tool, or an upstream's or OpenAPI
//! document's `tools`): what a tool's result is searched for ([`crate::guard`]) and what is
//! done with what is found.
//!
//! The nearest declaration wins: a tool's own (an imported tool's: its source's), else the
//! ToolSet's. `secrets: off` and `personalData: off` on a tool exempt it from the ToolSet's.

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
    #[serde(default, skip_serializing_if = "is_off")]
    pub secrets: GuardAction,
    /// Personal data: e-mail addresses, phone numbers, payment card numbers, IBANs.
    #[serde(default, skip_serializing_if = "is_off")]
    pub personal_data: GuardAction,
    /// Kinds not searched for, e.g. `[email]` for a directory tool whose answers are
    /// addresses (see docs/guards.md for the kinds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 21))]
    pub ignore: Vec<Kind>,
}

fn is_off(a: &GuardAction) -> bool {
    *a == GuardAction::Off
}

/// A compiled guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultGuard {
    secrets: GuardAction,
    personal: GuardAction,
    /// The kinds searched for.
    kinds: Kinds,
}

impl ResultGuard {
    /// The guard `spec` declares (an all-`off` one included: it exempts from the
    /// ToolSet's).
    pub fn compile(spec: &ResultGuardSpec) -> Arc<Self> {
        let mut kinds = Kinds::NONE;
        if spec.secrets != GuardAction::Off {
            kinds.0 |= Kinds::SECRETS.0;
        }
        if spec.personal_data != GuardAction::Off {
            kinds.0 |= Kinds::PERSONAL.0;
        }
        for k in &spec.ignore {
            kinds.0 &= !k.bit();
        }
        Arc::new(Self {
            secrets: spec.secrets,
            personal: spec.personal_data,
            kinds,
        })
    }

    /// Whether it searches for anything.
    pub fn active(&self) -> bool {
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
        if scan.overflowed && redact {
            // Not every finding is known: what cannot be redacted whole is withheld.
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

    /// Searches every string of `value` (not object keys), redacting in place.
    pub fn check_value(&self, value: &mut Value, scan: &mut Scan, v: &mut Verdict) {
        self.walk(value, scan, v, false);
    }

    /// Searches a content block's strings, except its base64 payloads (`data`, `blob`).
    pub fn check_block(&self, block: &mut Value, scan: &mut Scan, v: &mut Verdict) {
        self.walk(block, scan, v, true);
    }

    fn walk(&self, value: &mut Value, scan: &mut Scan, v: &mut Verdict, block: bool) {
        match value {
            Value::String(s) => {
                if let Some(r) = self.check_str(s, scan, v) {
                    *s = r;
                }
            }
            Value::Array(items) => {
                for x in items {
                    self.walk(x, scan, v, block);
                }
            }
            Value::Object(map) => {
                for (k, x) in map.iter_mut() {
                    if !(block && (k == "data" || k == "blob")) {
                        self.walk(x, scan, v, block);
                    }
                }
            }
            _ => {}
        }
    }
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

/// The guard of a tool or source that declares `own`, else the ToolSet's `fallback`;
/// `None` when neither searches for anything.
pub fn resolve(
    own: Option<&Arc<ResultGuard>>,
    fallback: Option<&Arc<ResultGuard>>,
) -> Option<Arc<ResultGuard>> {
    own.or(fallback).filter(|g| g.active()).cloned()
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
    fn flag_changes_nothing_and_blocks_keep_their_payloads() {
        let g = guard("{personalData: flag}");
        let (mut s, mut v) = (Scan::default(), Verdict::default());
        let mut block = serde_json::json!({"type": "text", "text": "jane@acme.io", "data": "jane@acme.io"});
        let before = block.clone();
        g.check_block(&mut block, &mut s, &mut v);
        assert_eq!(block, before);
        assert_eq!((v.count, v.action), (1, GuardAction::Flag));
    }

    #[test]
    fn the_nearest_declaration_wins_and_off_exempts() {
        let server = guard("{secrets: redact}");
        let off = guard("{secrets: off}");
        assert!(resolve(None, Some(&server)).is_some());
        assert!(resolve(Some(&off), Some(&server)).is_none());
        assert!(resolve(None, None).is_none());
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
