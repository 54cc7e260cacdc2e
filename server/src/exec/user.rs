//! The run step of a tool of an upstream with `identity.mode: user`: the call carries the
//! token the caller got by signing in at the upstream's own authorization server. Without
//! one the call answers with a sign-in link (and, to a client that declared URL-mode
//! elicitation, the dispatcher makes it a `URLElicitationRequired` error, or at 2026-07-28 a
//! URL-mode question of the call's input round); a token the
//! upstream refuses (`401`) is refreshed once and the call made once more; refused again,
//! it is forgotten and the user signs in again.

use serde_json::Value;

use super::Executor;
use crate::oauth::sign_in::{CallAuth, SignInLink, subject_of};
use crate::peer::{CallCtx, Opened, UrlNeeded};
use crate::protocol::output::ToolOutput;
use crate::spec::identity::Identity;
use crate::upstream::{CallError, Link};

/// The tool error of a call whose user must sign in first; the link goes to the dispatcher
/// too, for a client that opens URLs itself.
fn sign_in_first(link: &SignInLink, cx: &CallCtx<'_>) -> ToolOutput {
    let upstream = &link.upstream;
    let needed = || UrlNeeded {
        id: link.id.clone(),
        url: link.url.clone(),
        message: format!("Sign in to upstream `{upstream}` so that its tools act as you there."),
    };
    match cx.open_in_round(&round_key(upstream), &needed()) {
        // The round's InputRequiredResult replaces this output.
        Some(Opened::Asked) => return ToolOutput::error("sign-in asked for"),
        Some(Opened::Declined) => {
            return ToolOutput::error(format!(
                "you declined to sign in to upstream `{upstream}`, whose tools act as each user with their own account there; the call was not made"
            ));
        }
        None => cx.need_url(needed),
    }
    ToolOutput::error(format!(
        "upstream `{upstream}` acts as each user with their own account there, and you are not signed in to it (or your sign-in ended). Open this link in your browser to sign in, then retry the call: {}",
        link.url
    ))
}

/// The key of the sign-in question of a 2026-07-28 round: `sign-in-UPSTREAM`, within the
/// key's alphabet and length.
fn round_key(upstream: &str) -> String {
    "sign-in-"
        .chars()
        .chain(upstream.chars().map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        }))
        .take(crate::peer::MAX_KEY_LEN)
        .collect()
}

impl Executor {
    /// `sign_out_upstream`: forgets the caller's token for the upstream its arguments name.
    pub(super) async fn sign_out(&self, args: &Value, cx: &CallCtx<'_>) -> ToolOutput {
        let upstream = args.get("upstream").and_then(Value::as_str).unwrap_or_default();
        let Some(sign_in) = self.identity.sign_in() else {
            return ToolOutput::error("this server has no upstream sign-in");
        };
        let Some(subject) = cx.credential.and_then(subject_of) else {
            return ToolOutput::error(
                "signing out needs an OAuth/OIDC access token naming you (a static token or no authentication signs in nowhere)",
            );
        };
        let upstreams = self.upstreams.user_identities();
        match sign_in.sign_out(&subject, upstream, &upstreams).await {
            Ok(true) => ToolOutput::text(format!(
                "Signed out of upstream `{upstream}`: its tools no longer act as you, and the next call of one asks you to sign in again."
            )),
            Ok(false) => ToolOutput::text(format!("You were not signed in to upstream `{upstream}`.")),
            Err(e) => ToolOutput::error(format!("upstream `{upstream}`: {e}")),
        }
    }

    /// Calls `remote` of `link` (mode `user`, `id`) as the caller of `cx`.
    pub(super) async fn user_call(
        &self,
        link: &Link,
        id: &Identity,
        call: &crate::config::upstream::UpstreamCall,
        args: &Value,
        cx: &CallCtx<'_>,
    ) -> ToolOutput {
        let name = &link.name;
        let Some(sign_in) = self.identity.sign_in() else {
            return ToolOutput::error(format!(
                "upstream `{name}` needs each user's own sign-in, which this server is not configured for"
            ));
        };
        let Some(subject) = cx.credential.and_then(subject_of) else {
            return ToolOutput::error(format!(
                "upstream `{name}` acts as each signed-in user, and the caller presented no OAuth/OIDC access token naming one (a static token or no authentication cannot sign in); refused"
            ));
        };
        if let Some(why) = self.secrets.unavailable(&link.secrets) {
            return ToolOutput::error(why);
        }
        let refused = |e: String| ToolOutput::error(format!("upstream `{name}`: {e}"));
        let mut auth = match sign_in.authorize(&subject, name, id).await {
            CallAuth::Bearer(h) => h,
            CallAuth::SignIn(l) => return sign_in_first(&l, cx),
            CallAuth::Refused(e) => return refused(e),
        };
        let mut renewed = false;
        loop {
            match link.try_call_tool(call, args, cx, Some(&auth.header)).await {
                Ok(mut out) => {
                    if let Some(a) = &auth.account {
                        cx.acted_as(a);
                    }
                    self.secrets.redact(&link.secrets, &mut out);
                    crate::identity::redact(&mut out, &[super::executor::bearer_value(&auth.header)]);
                    return out;
                }
                Err(CallError::Unauthorized) if !renewed => {
                    renewed = true;
                    auth = match sign_in.rejected(&subject, name, id, &auth.header).await {
                        CallAuth::Bearer(h) => h,
                        CallAuth::SignIn(l) => return sign_in_first(&l, cx),
                        CallAuth::Refused(e) => return refused(e),
                    };
                }
                Err(CallError::Unauthorized) => {
                    return match sign_in.refused_again(&subject, name, &auth.header).await {
                        CallAuth::SignIn(l) => sign_in_first(&l, cx),
                        CallAuth::Refused(e) => refused(e),
                        CallAuth::Bearer(_) => refused("refused the token again".into()),
                    };
                }
                Err(e) => return refused(e.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::round_key;

    #[test]
    fn the_round_key_stays_within_the_keys_alphabet_and_length() {
        assert_eq!(round_key("notes"), "sign-in-notes");
        assert_eq!(round_key("a b/é"), "sign-in-a_b__");
        let long = round_key(&"x".repeat(300));
        assert_eq!(long.len(), crate::peer::MAX_KEY_LEN);
        assert!(long.starts_with("sign-in-x"));
    }
}
