//! What the sign-in routes answer a browser: a redirect (to a URL this server built, never
//! one taken from the request), or a plain page whose every word from elsewhere is escaped.
//! No page names a token, a code, a state, a ticket or a cookie.

/// What a page says of an error of the flow: a fixed sentence of its kind, the fixed words
/// this server's own checks chose (a state, a redirect, a browser or an issuer refused), or
/// of a server's refusal its error code only (one OAuth defines). Nothing a server or a
/// document wrote reaches a page of this origin (the URLs an upstream's metadata names, an
/// `error_description`, a registration answer): the log has the detail.
pub fn flow_error(e: &crate::oauth::flow::Error) -> String {
    use crate::oauth::flow::{Error, known_error};
    match e {
        Error::Denied(m) | Error::InvalidGrant(m) | Error::InvalidClient(m) => {
            let code = m.split([':', ' ']).next().unwrap_or_default();
            format!("the authorization server refused ({})", known_error(code))
        }
        Error::State(_) | Error::Redirect(_) | Error::Browser(_) | Error::Issuer(_) => e.to_string(),
        Error::Config(_)
        | Error::Unreachable(_)
        | Error::Discovery(_)
        | Error::Registration(_)
        | Error::Token(_) => sentence(e.kind()).to_owned(),
    }
}

/// The sentence a page shows for an error of `kind` ([`crate::oauth::flow::Error::kind`])
/// whose own words came from elsewhere.
fn sentence(kind: &str) -> &'static str {
    match kind {
        "config" => "the sign-in settings of this server or of the upstream are unusable",
        "unreachable" => "a server the sign-in needs did not answer in time, or its answer could not be read",
        "discovery" => {
            "the metadata of the upstream or of its authorization server is missing or was refused"
        }
        "registration" => "the authorization server did not register this server as a client",
        "token" => "the token endpoint's answer could not be used",
        _ => "the sign-in failed",
    }
}

/// An answer of a sign-in route. The transport adds `Cache-Control: no-store`,
/// `Referrer-Policy: no-referrer` and a content security policy that allows nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// HTTP status.
    pub status: u16,
    /// `Location` of a redirect.
    pub location: Option<String>,
    /// `Set-Cookie` values.
    pub cookies: Vec<String>,
    /// The HTML (empty for a redirect).
    pub body: String,
}

/// `s` for HTML text and attribute values, on one line (control characters become spaces).
pub fn escape(s: &str) -> String {
    let flat: String = s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    quiver_model::published::html(&flat)
}

impl Page {
    /// A page with `title` and `text` (escaped here).
    pub fn plain(status: u16, title: &str, text: &str) -> Self {
        let (title, text) = (escape(title), escape(text));
        Self {
            status,
            location: None,
            cookies: Vec::new(),
            body: format!(
                "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
                 <meta name=\"viewport\" content=\"width=device-width\"><title>{title}</title></head>\n\
                 <body><h1>{title}</h1>\n<p>{text}</p></body></html>\n"
            ),
        }
    }

    /// A redirect to `url` (a URL this server built).
    pub fn redirect(url: String) -> Self {
        Self {
            status: 302,
            location: Some(url),
            cookies: Vec::new(),
            body: String::new(),
        }
    }

    /// The same answer, setting `cookie` too.
    pub fn with_cookie(mut self, cookie: String) -> Self {
        self.cookies.push(cookie);
        self
    }

    /// 400: a link, state or answer that cannot be used; the user starts again.
    pub fn refused(what: &str) -> Self {
        Self::plain(
            400,
            "Sign-in not completed",
            &format!("{what} Nothing was stored. Retry the call in your client to get a new sign-in link."),
        )
    }

    /// 403: the browser is not the caller's.
    pub fn forbidden(what: &str) -> Self {
        Self::plain(403, "Sign-in refused", &format!("{what} Nothing was stored."))
    }

    /// 502: a server the sign-in needs failed.
    pub fn failed(what: &str) -> Self {
        Self::plain(
            502,
            "Sign-in failed",
            &format!("{what} Nothing was stored. Retry the call in your client to try again."),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oauth::flow::Error;

    #[test]
    fn a_flow_error_shows_fixed_words_only() {
        let hostile = format!("https://evil.example/<b>{}", "x".repeat(2000));
        for e in [
            Error::Config(hostile.clone()),
            Error::Unreachable(hostile.clone()),
            Error::Discovery(hostile.clone()),
            Error::Registration(hostile.clone()),
            Error::Token(hostile.clone()),
            Error::Denied(format!("invalid_scope: {hostile}")),
            Error::InvalidGrant(hostile.clone()),
        ] {
            let shown = flow_error(&e);
            assert!(
                !shown.contains("evil") && !shown.contains('<') && shown.len() < 120,
                "{}: {shown}",
                e.kind()
            );
        }
        assert_eq!(
            flow_error(&Error::Discovery(hostile.clone())),
            "the metadata of the upstream or of its authorization server is missing or was refused"
        );
        assert_eq!(
            flow_error(&Error::Denied(format!("invalid_scope: {hostile}"))),
            "the authorization server refused (invalid_scope)"
        );
        assert_eq!(
            flow_error(&Error::State("was used already (or cannot be marked used)")),
            "sign-in state was used already (or cannot be marked used)"
        );
    }

    #[test]
    fn every_word_from_elsewhere_is_escaped() {
        let p = Page::plain(400, "<t>", "a <script>alert('x')</script> & \"q\"\u{7}");
        assert!(
            !p.body.contains("<script>") && !p.body.contains("<t>"),
            "{}",
            p.body
        );
        assert!(
            p.body
                .contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot; ")
        );
        assert_eq!(p.status, 400);
        let r = Page::redirect("https://as.example/authorize?x=1".into()).with_cookie("c=v".into());
        assert_eq!(
            (r.status, r.location.as_deref(), r.cookies.len()),
            (302, Some("https://as.example/authorize?x=1"), 1)
        );
    }
}
