//! Per-tool authorization: which authenticated callers may call a tool, from the scopes and
//! groups their credentials carry.
//!
//! A tool's `access` lists scopes (every one must be granted) and groups (the caller must be
//! in at least one). A pipeline needs what each of its steps needs as well, so composing
//! tools never widens who can run them. A caller with no credentials at all (client
//! authentication off, or stdio) has no scopes and no groups: a tool with `access` refuses it.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::context::Problems;

/// Most scopes or groups one `access` may list.
pub const MAX_ACCESS_ENTRIES: usize = 32;
/// Longest scope or group name.
pub const MAX_ACCESS_NAME: usize = 256;
/// Most scopes, and most groups, kept from one caller's credentials (the rest are ignored:
/// fewer grants, never more).
pub const MAX_PRINCIPAL_ENTRIES: usize = 256;
/// Most scopes, and most group requirements, a tool may need once the needs of the tools it
/// runs (a pipeline's steps) are added.
pub const MAX_COMBINED: usize = 64;

/// Who may call a tool. Enforced only where callers carry credentials: with client
/// authentication off (or over stdio) a tool with `access` cannot be called at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccessSpec {
    /// OAuth scopes the caller's token must carry, every one (`scope`/`scp` claims, or the
    /// scopes written after a static token). A caller that lacks some gets HTTP 403 with
    /// `WWW-Authenticate: Bearer error="insufficient_scope"` naming them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 256)))]
    pub scopes: Vec<String>,
    /// Groups allowed to call the tool: the caller must be in at least one (the token's
    /// groups claim, `groups` unless the server is told another).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 256)))]
    pub groups: Vec<String>,
}

/// A compiled `access`: scopes all required, and sets of groups of which each needs one
/// member (one set per tool whose access this one includes, e.g. a pipeline's steps).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    scopes: Vec<Box<str>>,
    any_of: Vec<Arc<[Box<str>]>>,
}

/// What an authenticated caller was granted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Principal {
    /// Granted scopes.
    pub scopes: Vec<Box<str>>,
    /// Groups the caller is in.
    pub groups: Vec<Box<str>>,
    /// Who the caller is, as a digest of its identity (never a credential): the same for
    /// every request with the same static token, or the same issuer and `sub`. Sessions and
    /// `requestState` are bound to it. Empty: not known.
    pub subject: Box<str>,
    /// Who the caller says it is, for the audit trail: the token's `sub`, `iss` and
    /// `azp`/`client_id` claims (each cut to [`MAX_ACCESS_NAME`] bytes); empty for static
    /// tokens, whose record names the [`Self::subject`] digest.
    pub identity: Identity,
    /// The validated access token it presented (OIDC only), for identity to upstreams.
    pub credential: Option<Arc<super::caller::Credential>>,
}

/// The claims that name a caller in the audit trail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// The `sub` claim.
    pub sub: Box<str>,
    /// The `iss` claim.
    pub issuer: Box<str>,
    /// The `azp` claim, or else `client_id`.
    pub client_id: Box<str>,
}

impl Principal {
    /// A principal from lists of names, each bounded by [`MAX_PRINCIPAL_ENTRIES`] and
    /// [`MAX_ACCESS_NAME`] (longer names can match nothing and are dropped).
    pub fn new<'a>(
        scopes: impl IntoIterator<Item = &'a str>,
        groups: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let keep = |it: &mut dyn Iterator<Item = &'a str>| -> Vec<Box<str>> {
            it.filter(|s| !s.is_empty() && s.len() <= MAX_ACCESS_NAME)
                .take(MAX_PRINCIPAL_ENTRIES)
                .map(Box::from)
                .collect()
        };
        Self {
            scopes: keep(&mut scopes.into_iter()),
            groups: keep(&mut groups.into_iter()),
            subject: Box::default(),
            identity: Identity::default(),
            credential: None,
        }
    }
}

/// Why a caller may not call a tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// The required scopes it lacks (empty when only the groups are wrong).
    pub missing_scopes: Vec<Box<str>>,
    /// Every scope the tool requires (what a client asks for when it steps up: asking for
    /// the missing ones alone could lose the others).
    pub required_scopes: Vec<Box<str>>,
    /// It is in none of the allowed groups of one requirement.
    pub not_in_groups: Option<Vec<Box<str>>>,
    /// It presented no credentials at all.
    pub anonymous: bool,
}

impl Denial {
    /// The error message for the client: what the tool needs, never what the caller holds.
    pub fn message(&self, tool: &str) -> String {
        let mut needs = Vec::new();
        if !self.missing_scopes.is_empty() {
            needs.push(format!("the scopes {}", list(&self.missing_scopes)));
        }
        if let Some(g) = &self.not_in_groups {
            needs.push(format!("membership of one of the groups {}", list(g)));
        }
        let mut m = format!("Forbidden: tool {tool} requires {}", needs.join(" and "));
        if self.anonymous {
            m.push_str("; this server does not authenticate its clients, so no caller has them");
        }
        m
    }

    /// The scopes to ask for in a `WWW-Authenticate` challenge (RFC 6750 `scope`).
    pub fn scope_challenge(&self) -> Option<String> {
        (!self.missing_scopes.is_empty()).then(|| self.required_scopes.join(" "))
    }
}

fn list(names: &[Box<str>]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A scope token as RFC 6749 section 3.3 defines it: printable ASCII but space, `"` and `\`.
fn valid_scope(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ACCESS_NAME
        && s.bytes().all(|b| matches!(b, 0x21 | 0x23..=0x5B | 0x5D..=0x7E))
}

fn valid_group(s: &str) -> bool {
    !s.trim().is_empty() && s.len() <= MAX_ACCESS_NAME && !s.chars().any(char::is_control)
}

impl AccessSpec {
    /// Checks and compiles it; `None` when it requires nothing.
    pub fn compile(&self, at: &str, p: &mut Problems) -> Option<Access> {
        if self.scopes.is_empty() && self.groups.is_empty() {
            p.push(
                at,
                "list `scopes`, `groups` or both (omit `access` to let every caller call it)",
            );
            return None;
        }
        let mut check = |field: &str, names: &[String], ok: fn(&str) -> bool, what: &str| -> Vec<Box<str>> {
            if names.len() > MAX_ACCESS_ENTRIES {
                p.push(
                    format!("{at}.{field}"),
                    format!("at most {MAX_ACCESS_ENTRIES} entries"),
                );
                // Not looked at further: the checks below are quadratic.
                return Vec::new();
            }
            let mut out: Vec<Box<str>> = Vec::new();
            for (i, n) in names.iter().enumerate() {
                if !ok(n) {
                    p.push(format!("{at}.{field}[{i}]"), what);
                } else if !out.iter().any(|o| **o == **n) {
                    out.push(n.as_str().into());
                }
            }
            out
        };
        let scopes = check(
            "scopes",
            &self.scopes,
            valid_scope,
            "a scope is 1-256 printable ASCII characters without spaces, `\"` or `\\`",
        );
        let groups = check(
            "groups",
            &self.groups,
            valid_group,
            "a group is 1-256 characters, not blank, without control characters",
        );
        Some(Access {
            scopes,
            any_of: if groups.is_empty() {
                Vec::new()
            } else {
                vec![groups.into()]
            },
        })
    }
}

impl Access {
    /// Adds what `other` requires (a pipeline and its step).
    ///
    /// # Errors
    /// The sum would need more than [`MAX_COMBINED`] scopes or group requirements.
    pub fn include(&mut self, other: &Self) -> Result<(), String> {
        for s in &other.scopes {
            if !self.scopes.contains(s) {
                if self.scopes.len() == MAX_COMBINED {
                    return Err(format!("it would need more than {MAX_COMBINED} scopes"));
                }
                self.scopes.push(s.clone());
            }
        }
        for g in &other.any_of {
            if !self.any_of.contains(g) {
                if self.any_of.len() == MAX_COMBINED {
                    return Err(format!(
                        "it would need membership of more than {MAX_COMBINED} sets of groups"
                    ));
                }
                self.any_of.push(Arc::clone(g));
            }
        }
        Ok(())
    }

    /// Every scope it requires (for the protected-resource metadata's `scopes_supported`).
    pub fn scopes(&self) -> impl Iterator<Item = &str> {
        self.scopes.iter().map(AsRef::as_ref)
    }

    /// Whether `caller` (`None`: no credentials) may call the tool.
    ///
    /// # Errors
    /// What it lacks.
    pub fn check(&self, caller: Option<&Principal>) -> Result<(), Denial> {
        let empty = Principal::default();
        let who = caller.unwrap_or(&empty);
        let missing_scopes: Vec<Box<str>> = self
            .scopes
            .iter()
            .filter(|s| !who.scopes.contains(s))
            .cloned()
            .collect();
        let not_in_groups = self
            .any_of
            .iter()
            .find(|set| !set.iter().any(|g| who.groups.contains(g)))
            .map(|set| set.to_vec());
        if missing_scopes.is_empty() && not_in_groups.is_none() {
            return Ok(());
        }
        Err(Denial {
            missing_scopes,
            required_scopes: self.scopes.clone(),
            not_in_groups,
            anonymous: caller.is_none(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(scopes: &[&str], groups: &[&str]) -> AccessSpec {
        AccessSpec {
            scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
            groups: groups.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn compiled(scopes: &[&str], groups: &[&str]) -> Access {
        let mut p = Problems::default();
        let a = spec(scopes, groups).compile("access", &mut p).unwrap();
        assert!(p.0.is_empty(), "{:?}", p.0);
        a
    }

    #[test]
    fn every_scope_and_one_group_per_requirement_are_needed() {
        let a = compiled(&["deploy:write", "read"], &["sre", "platform"]);
        let ok = Principal::new(["read", "deploy:write", "other"], ["platform"]);
        assert_eq!(a.check(Some(&ok)), Ok(()));
        let d = a
            .check(Some(&Principal::new(["read"], ["platform"])))
            .unwrap_err();
        assert_eq!(d.missing_scopes, vec![Box::from("deploy:write")]);
        assert_eq!(d.scope_challenge().as_deref(), Some("deploy:write read"));
        let d = a
            .check(Some(&Principal::new(["read", "deploy:write"], ["dev"])))
            .unwrap_err();
        assert!(d.missing_scopes.is_empty() && d.not_in_groups.is_some() && d.scope_challenge().is_none());
        assert!(
            d.message("deploy")
                .contains("one of the groups `sre`, `platform`"),
            "{}",
            d.message("deploy")
        );
    }

    #[test]
    fn no_credentials_means_no_grants() {
        let d = compiled(&["a"], &[]).check(None).unwrap_err();
        assert!(d.anonymous);
        assert!(
            d.message("t").contains("does not authenticate"),
            "{}",
            d.message("t")
        );
        assert!(compiled(&[], &["g"]).check(Some(&Principal::default())).is_err());
    }

    #[test]
    fn including_a_step_adds_its_requirements_without_widening() {
        let mut pipeline = compiled(&["a"], &["x"]);
        pipeline.include(&compiled(&["b", "a"], &["y"])).unwrap();
        assert_eq!(pipeline.scopes().collect::<Vec<_>>(), ["a", "b"]);
        // In x but not y: the step's group requirement still applies.
        assert!(pipeline.check(Some(&Principal::new(["a", "b"], ["x"]))).is_err());
        assert!(
            pipeline
                .check(Some(&Principal::new(["a", "b"], ["x", "y"])))
                .is_ok()
        );
    }

    #[test]
    fn combined_needs_are_bounded() {
        let mut all = Access::default();
        let mut failed = None;
        for i in 0..=MAX_COMBINED {
            if let Err(e) = all.include(&compiled(&[], &[&format!("g{i}")])) {
                failed = Some((i, e));
                break;
            }
        }
        let (at, e) = failed.expect("the 65th group requirement is refused");
        assert_eq!(at, MAX_COMBINED);
        assert!(e.contains("more than 64"), "{e}");
    }

    #[test]
    fn names_are_checked_bounded_and_deduplicated() {
        let mut p = Problems::default();
        assert!(AccessSpec::default().compile("a", &mut p).is_none());
        assert_eq!(p.0.len(), 1);
        let mut p = Problems::default();
        let long = "s".repeat(MAX_ACCESS_NAME + 1);
        let many: Vec<String> = (0..=MAX_ACCESS_ENTRIES).map(|i| format!("s{i}")).collect();
        let bad = AccessSpec {
            scopes: [
                "ok",
                "has space",
                "quote\"",
                "back\\slash",
                "",
                long.as_str(),
                "é",
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
            groups: vec![" ".into(), "ctl\u{7}".into(), "fine".into(), "fine".into()],
        };
        bad.compile("t.access", &mut p);
        let paths: Vec<&str> = p.0.iter().map(|x| x.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "t.access.scopes[1]",
                "t.access.scopes[2]",
                "t.access.scopes[3]",
                "t.access.scopes[4]",
                "t.access.scopes[5]",
                "t.access.scopes[6]",
                "t.access.groups[0]",
                "t.access.groups[1]",
            ]
        );
        let mut p = Problems::default();
        spec(&many.iter().map(String::as_str).collect::<Vec<_>>(), &[]).compile("a", &mut p);
        assert_eq!(p.0[0].path, "a.scopes");
        let a = compiled(&["x", "x"], &["g", "g"]);
        assert_eq!(a.scopes().count(), 1);
    }

    #[test]
    fn a_principal_keeps_a_bounded_number_of_sane_names() {
        let many: Vec<String> = (0..1000).map(|i| format!("s{i}")).collect();
        let long = "x".repeat(MAX_ACCESS_NAME + 1);
        let p = Principal::new(many.iter().map(String::as_str), ["", long.as_str(), "g"]);
        assert_eq!(p.scopes.len(), MAX_PRINCIPAL_ENTRIES);
        assert_eq!(p.groups, vec![Box::from("g")]);
    }
}
