use super::*;

fn kinds_in(text: &str) -> Vec<(Kind, &str)> {
    let mut s = Scan::default();
    scan(text, Kinds(u32::MAX), &mut s);
    s.findings
        .iter()
        .map(|f| (f.kind, &text[f.start..f.end]))
        .collect()
}

#[test]
fn secrets_by_their_issuers_formats() {
    let key_id = "AKIAZ2QXLMN7ORP4VWTY";
    assert_eq!(
        kinds_in(&format!("id={key_id};")),
        [(Kind::AwsAccessKeyId, key_id)]
    );
    // AWS's documentation example, and a key ID inside a longer word.
    assert!(kinds_in("AKIAIOSFODNN7EXAMPLE").is_empty());
    assert!(kinds_in(&format!("X{key_id}")).is_empty());
    let secret = "k3Jq9Zr0VbW8yT1uXc2Ls5Hn7Mo4Pe6Ra9Sd0Fg1";
    assert_eq!(
        kinds_in(&format!("{{\"SecretAccessKey\": \"{secret}\"}}")),
        [(Kind::AwsSecretAccessKey, secret)]
    );
    let gh = format!("ghp_{}", "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5");
    assert_eq!(
        kinds_in(&format!("token {gh} ok")),
        [(Kind::GithubToken, gh.as_str())]
    );
    assert!(kinds_in(&format!("{gh}x")).is_empty(), "one character too many");
    let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg";
    assert_eq!(kinds_in(&format!("Bearer {jwt}")), [(Kind::Jwt, jwt)]);
    // A header that decodes but names no `alg`.
    assert!(kinds_in("eyJ0eXAiOiJ4eXoifQ.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg").is_empty());
    assert_eq!(
        kinds_in("postgres://app:Xk82-lq9@db:5432/x"),
        [(Kind::UrlCredentials, "app:Xk82-lq9")]
    );
    assert!(kinds_in("postgres://USER:PASSWORD@db/x https://${U}:${P}@h/ https://me@h.io/").is_empty());
    let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----";
    assert_eq!(kinds_in(&format!("a\n{pem}\nb")), [(Kind::PrivateKey, pem)]);
    assert!(kinds_in("-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----").is_empty());
}

#[test]
fn personal_data_with_checks() {
    assert_eq!(
        kinds_in("mail jane.doe+x@mail.acme.io."),
        [(Kind::Email, "jane.doe+x@mail.acme.io")]
    );
    for not in [
        "icon@2x.png",
        "lodash@4.17.21",
        "ops@example.com",
        "git@github.com:org/repo.git",
        "@types/node",
        "a@localhost",
    ] {
        assert!(kinds_in(not).is_empty(), "{not}");
    }
    assert_eq!(
        kinds_in("card 4111 1111 1111 1111 ok"),
        [(Kind::PaymentCard, "4111 1111 1111 1111")]
    );
    assert!(kinds_in("4111 1111 1111 1112").is_empty(), "Luhn");
    assert!(
        kinds_in("1700000000000").is_empty(),
        "a timestamp in ms: no network"
    );
    assert_eq!(
        kinds_in("IBAN GB82 WEST 1234 5698 7654 32."),
        [(Kind::Iban, "GB82 WEST 1234 5698 7654 32")]
    );
    assert!(kinds_in("GB82 WEST 1234 5698 7654 33").is_empty(), "mod 97");
    assert_eq!(
        kinds_in("call +44 20 7946 0958 now"),
        [(Kind::Phone, "+44 20 7946 0958")]
    );
    assert_eq!(kinds_in("(415) 555-0132"), [(Kind::Phone, "(415) 555-0132")]);
    for not in [
        "2026-11-30",
        "10.0.0.1",
        "v1.2.3",
        "+05:30",
        "3+4",
        "123-45-6789",
        "978-3-16-148410-0",
    ] {
        assert!(kinds_in(not).is_empty(), "{not}");
    }
}

#[test]
fn redaction_names_the_kind() {
    let text = "a jane@acme.io b 4111-1111-1111-1111 c";
    let mut s = Scan::default();
    scan(text, Kinds::PERSONAL, &mut s);
    assert_eq!(
        redact(text, &s.findings),
        "a [redacted:email] b [redacted:payment_card] c"
    );
    scan(text, Kinds(Kind::Email.bit()), &mut s);
    assert_eq!(
        redact(text, &s.findings),
        "a [redacted:email] b 4111-1111-1111-1111 c"
    );
}

#[test]
fn findings_are_bounded() {
    let text = "x@acme.io ".repeat(MAX_FINDINGS + 10);
    let mut s = Scan::default();
    scan(&text, Kinds::PERSONAL, &mut s);
    assert!(s.overflowed);
    assert_eq!(s.findings.len(), MAX_FINDINGS);
}

#[test]
fn kind_sets_split_by_category() {
    for k in KINDS {
        let secret = k.category() == Category::Secret;
        assert_eq!(Kinds::SECRETS.has(k), secret, "{k:?}");
        assert_eq!(Kinds::PERSONAL.has(k), !secret, "{k:?}");
        assert_eq!(KINDS[k as usize], k);
    }
}

proptest::proptest! {
    #[test]
    fn never_panics_and_spans_are_in_order(text in "\\PC{0,200}") {
        let mut s = Scan::default();
        scan(&text, Kinds(u32::MAX), &mut s);
        let mut end = 0;
        for f in &s.findings {
            proptest::prop_assert!(f.start >= end && f.end > f.start && f.end <= text.len());
            proptest::prop_assert!(text.is_char_boundary(f.start) && text.is_char_boundary(f.end));
            end = f.end;
        }
        let _ = redact(&text, &s.findings);
    }

    #[test]
    fn never_panics_on_rule_alphabets(text in "[-+() .@:/=_A-Za-z0-9\"']{0,120}") {
        let mut s = Scan::default();
        scan(&text, Kinds(u32::MAX), &mut s);
        let _ = redact(&text, &s.findings);
    }
}
