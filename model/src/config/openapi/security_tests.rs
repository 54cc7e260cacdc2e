use serde_json::{Value, json};

use crate::config::{CompiledHandler, CompiledToolSet, ToolSet, compile};
use crate::handlers::http::HttpCall;
use crate::handlers::http::auth::Auth;

/// An API with a scheme of every kind Quiver applies, and one it does not.
fn api() -> Value {
    let op = |id: &str, security: Option<Value>| {
        let mut o = json!({"operationId": id, "responses": {"200": {"description": "ok"}}});
        if let Some(s) = security {
            o["security"] = s;
        }
        o
    };
    json!({
        "openapi": "3.1.0",
        "info": {"title": "secured", "version": "1"},
        "servers": [{"url": "https://api.example"}],
        "security": [{"bearer": []}],
        "paths": {
            "/default": {"get": op("inherits", None)},
            "/none": {"get": op("open", Some(json!([])))},
            "/alt": {"get": op("firstConfigured", Some(json!([{"oidc": []}, {"query": []}, {"bearer": []}])))},
            "/both": {"get": op("headerAndCookie", Some(json!([{"header": [], "cookie": []}])))},
            "/basic": {"get": op("basic", Some(json!([{"basic": []}])))},
            "/oauth": {"get": op("oauthRead", Some(json!([{"cc": ["read"]}])))},
            "/oauth2": {"get": op("oauthWrite", Some(json!([{"cc": ["read", "write"]}])))},
            "/oauth3": {"get": op("oauthReadToo", Some(json!([{"cc": ["read"]}])))},
            "/optional": {"get": op("optional", Some(json!([{"oidc": []}, {}])))},
        },
        "components": {"securitySchemes": {
            "bearer": {"type": "http", "scheme": "Bearer"},
            "basic": {"type": "http", "scheme": "basic"},
            "header": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
            "query": {"type": "apiKey", "in": "query", "name": "api key"},
            "cookie": {"type": "apiKey", "in": "cookie", "name": "sid"},
            "cc": {"type": "oauth2", "flows": {"clientCredentials": {"tokenUrl": "https://idp.example/token", "scopes": {}}}},
            "oidc": {"type": "openIdConnect", "openIdConnectUrl": "https://idp.example/.well-known/openid-configuration"}
        }}
    })
}

fn credentials() -> Value {
    json!({
        "bearer": {"secret": "api", "key": "token"},
        "basic": {"secret": "api", "usernameKey": "user", "passwordKey": "password"},
        "header": {"secret": "api", "key": "key"},
        "query": {"secret": "api", "key": "key"},
        "cookie": {"secret": "api", "key": "key"},
        "cc": {"secret": "oauth", "clientIdKey": "id", "clientSecretKey": "secret"}
    })
}

fn compiled(doc: &Value, security: Value) -> Result<CompiledToolSet, Vec<String>> {
    let ts: ToolSet = serde_json::from_value(json!({"openapi": [
        {"name": "api", "document": doc.to_string(), "security": security}
    ]}))
    .unwrap();
    compile(&ts).map_err(|e| e.problems.iter().map(ToString::to_string).collect())
}

fn call<'a>(c: &'a CompiledToolSet, name: &str) -> &'a HttpCall {
    let t = c.tools.iter().find(|t| t.name == name).unwrap();
    match &t.handler {
        CompiledHandler::Http(h) => h,
        _ => panic!("{name} is not http"),
    }
}

/// Secret values as the store holds them (with a file's trailing newline).
fn secrets() -> Value {
    json!({"secret": {"api": {"token": "t0k\n", "key": "k&v; x\n", "user": "u", "password": "p"}}})
}

fn header(h: &HttpCall, name: &str) -> Option<String> {
    let (_, t) = h.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name))?;
    Some(t.render(&secrets()).unwrap())
}

fn url(h: &HttpCall) -> String {
    h.url.render_url(&secrets()).unwrap()
}

#[test]
fn each_operation_carries_the_first_alternative_it_is_given_credentials_for() {
    let c = compiled(&api(), credentials()).unwrap();
    // The document's requirement applies where the operation states none.
    let h = call(&c, "inherits");
    assert_eq!(header(h, "Authorization").as_deref(), Some("Bearer t0k"));
    assert_eq!(url(h), "https://api.example/default");
    // `security: []`: nothing, even though the document requires bearer.
    let h = call(&c, "open");
    assert!(h.headers.is_empty() && h.auth.is_none());
    assert_eq!(url(h), "https://api.example/none");
    // `oidc` has no credential: the next alternative, an API key in the query.
    let h = call(&c, "firstConfigured");
    assert_eq!(url(h), "https://api.example/alt?api%20key=k%26v%3B%20x");
    assert!(header(h, "Authorization").is_none());
    // Both schemes of one alternative; the cookie value is percent-encoded.
    let h = call(&c, "headerAndCookie");
    assert_eq!(header(h, "X-Api-Key").as_deref(), Some("k&v; x"));
    assert_eq!(header(h, "Cookie").as_deref(), Some("sid=k%26v%3B%20x"));
    // The empty alternative: served without a credential.
    let h = call(&c, "optional");
    assert!(h.headers.is_empty() && h.auth.is_none());
    // The Secrets read are redacted and granted like any http tool's.
    assert!(
        c.secrets.contains("api") && c.secrets.contains("oauth"),
        "{:?}",
        c.secrets
    );
}

#[test]
fn basic_and_client_credentials_are_built_per_call_and_one_grant_shares_its_token() {
    let c = compiled(&api(), credentials()).unwrap();
    let h = call(&c, "basic");
    assert!(
        matches!(h.auth.as_deref(), Some(Auth::Basic { user, password }) if user.key == "user" && password.key == "password")
    );
    assert!(h.secrets.iter().any(|r| r.name == "api" && r.key == "password"));
    let grant = |name: &str| match call(&c, name).auth.as_deref() {
        Some(Auth::OAuth2(g)) => g.clone(),
        other => panic!("{name}: {other:?}"),
    };
    let (read, write, read_too) = (grant("oauthRead"), grant("oauthWrite"), grant("oauthReadToo"));
    assert_eq!(read.token_url, "https://idp.example/token");
    assert_eq!(read.scope, "read");
    assert_eq!(write.scope, "read write");
    assert!(std::sync::Arc::ptr_eq(&read, &read_too), "same grant, one token");
    assert!(!std::sync::Arc::ptr_eq(&read, &write));
}

#[test]
fn an_operation_whose_requirement_is_not_met_is_a_problem_naming_it_and_its_schemes() {
    let mut creds = credentials();
    creds.as_object_mut().unwrap().remove("cc");
    let p = compiled(&api(), creds).unwrap_err();
    assert_eq!(p.len(), 3, "{p:?}");
    for op in ["paths./oauth.get:", "paths./oauth2.get:", "paths./oauth3.get:"] {
        assert!(
            p.iter()
                .any(|m| m.contains(op) && m.contains("`cc`") && m.contains("no credential")),
            "{op}: {p:?}"
        );
    }
    // Without `security`, operations are served as before (the source's `headers` carry
    // whatever the API needs).
    let c = compiled(&api(), json!({})).unwrap();
    assert!(call(&c, "inherits").headers.is_empty());
}

#[test]
fn bad_credentials_are_problems_of_the_source() {
    let cases = [
        (
            json!({"nope": {"secret": "api", "key": "k"}}),
            "security.nope",
            "declares no security scheme",
        ),
        (
            json!({"oidc": {"secret": "api", "key": "k"}}),
            "security.oidc",
            "not supported",
        ),
        (
            json!({"basic": {"secret": "api", "usernameKey": "u"}}),
            "security.basic",
            "`passwordKey`",
        ),
        (json!({"bearer": {"secret": "api"}}), "security.bearer", "`key`"),
        (
            json!({"bearer": {"secret": "a.b", "key": "k"}}),
            "security.bearer.secret",
            "not a Secret name",
        ),
        (
            json!({"bearer": {"secret": "a", "key": "{{x}}"}}),
            "security.bearer.key",
            "not a Secret key",
        ),
        (
            json!({"cc": {"secret": "a", "clientIdKey": "i", "clientSecretKey": "s", "tokenUrl": "ftp://x"}}),
            "security.cc.tokenUrl",
            "https",
        ),
        (
            json!({"cc": {"secret": "a", "clientIdKey": "i", "clientSecretKey": "s", "scopes": ["a b"]}}),
            "security.cc.scopes",
            "without spaces",
        ),
    ];
    for (security, at, want) in cases {
        let p = compiled(&api(), security.clone()).unwrap_err();
        assert!(
            p.iter().any(|m| m.contains(at) && m.contains(want)),
            "{security}: {p:?}"
        );
    }
    // A header the scheme sets is not also in `headers`.
    let ts: ToolSet = serde_json::from_value(json!({"openapi": [{
        "name": "api", "document": api().to_string(),
        "headers": {"authorization": "Bearer {{secret.other.token}}"},
        "security": {"bearer": {"secret": "api", "key": "token"}}
    }]}))
    .unwrap();
    let p: Vec<String> = compile(&ts)
        .unwrap_err()
        .problems
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        p.iter()
            .any(|m| m.contains("security.bearer") && m.contains("`headers` sets")),
        "{p:?}"
    );
    // Unknown fields are refused.
    assert!(serde_json::from_value::<ToolSet>(json!({"openapi": [{"name": "a", "document": "{}", "security": {"x": {"secret": "a", "value": "v"}}}]})).is_err());
}

#[test]
fn swagger_2_schemes_apply_and_a_source_to_fetch_grants_its_scheme_secrets() {
    let doc = json!({
        "swagger": "2.0", "info": {"title": "s", "version": "1"},
        "host": "api.example", "schemes": ["https"],
        "securityDefinitions": {"key": {"type": "apiKey", "in": "query", "name": "k"}, "b": {"type": "basic"},
                                "cc": {"type": "oauth2", "flow": "application", "tokenUrl": "https://idp.example/t", "scopes": {"r": "read"}}},
        "security": [{"key": []}],
        "paths": {"/a": {"get": {"operationId": "a", "responses": {"200": {"description": "ok"}}}},
                  "/b": {"get": {"operationId": "b", "security": [{"b": []}], "responses": {"200": {"description": "ok"}}}},
                  "/c": {"get": {"operationId": "c", "security": [{"cc": ["r"]}], "responses": {"200": {"description": "ok"}}}}}
    });
    let c = compiled(&doc, json!({"key": {"secret": "api", "key": "key"}, "b": {"secret": "api", "usernameKey": "user", "passwordKey": "password"},
        "cc": {"secret": "o", "clientIdKey": "id", "clientSecretKey": "s"}})).unwrap();
    assert_eq!(url(call(&c, "a")), "https://api.example/a?k=k%26v%3B%20x");
    assert!(matches!(call(&c, "b").auth.as_deref(), Some(Auth::Basic { .. })));
    assert!(
        matches!(call(&c, "c").auth.as_deref(), Some(Auth::OAuth2(g)) if g.token_url == "https://idp.example/t" && g.scope == "r")
    );

    let ts: ToolSet = serde_json::from_value(json!({"openapi": [{
        "name": "api", "url": "https://api.example/openapi.json", "allowedOrigins": ["https://api.example"],
        "security": {"key": {"secret": "api-key", "key": "key"}}
    }]}))
    .unwrap();
    let c = compile(&ts).unwrap();
    assert!(c.secrets.contains("api-key"), "{:?}", c.secrets);
}
