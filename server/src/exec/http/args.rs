//! The request parts an imported OpenAPI operation takes from its arguments as they are:
//! query, header and cookie parameters (absent ones left out, arrays by style) and the body.

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use serde_json::Value;

use crate::handlers::http::{ArgParam, ArgParts, BodyEncoding, ParamPlace};
use crate::template::{percent_encode, push_value};

/// The text of one scalar (strings as they are, other values as JSON).
fn scalar(v: &Value, out: &mut String) {
    push_value(v, out);
}

/// The values of a parameter's argument: none when absent or null, each item of an array.
fn values<'a>(p: &ArgParam, args: &'a Value) -> &'a [Value] {
    match args.get(&*p.name) {
        None | Some(Value::Null) => &[],
        Some(Value::Array(items)) => items,
        Some(v) => std::slice::from_ref(v),
    }
}

/// Appends the query parameters present in `args` to `out` (`a=1&b=x%20y`), percent-encoded.
pub(super) fn query(parts: &ArgParts, args: &Value, out: &mut String) {
    let mut text = String::new();
    for p in parts.params.iter().filter(|p| p.place == ParamPlace::Query) {
        let items = values(p, args);
        if items.is_empty() && !matches!(args.get(&*p.name), Some(Value::Array(_))) {
            continue;
        }
        if p.explode {
            for v in items {
                text.clear();
                scalar(v, &mut text);
                push_pair(out, &p.name, &percent_encode(&text));
            }
        } else {
            let mut joined = String::new();
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    joined.push_str(&percent_encode(&p.separator.to_string()));
                }
                text.clear();
                scalar(v, &mut text);
                joined.push_str(&percent_encode(&text));
            }
            push_pair(out, &p.name, &joined);
        }
    }
}

fn push_pair(out: &mut String, name: &str, value: &str) {
    if !out.is_empty() {
        out.push('&');
    }
    out.push_str(&percent_encode(name));
    out.push('=');
    out.push_str(value);
}

/// The header and cookie parameters present in `args`, as headers.
///
/// # Errors
/// A value is not a valid header value (a line break, say).
pub(super) fn headers(parts: &ArgParts, args: &Value) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut out = Vec::new();
    let mut cookie = String::new();
    for p in parts.params.iter().filter(|p| p.place != ParamPlace::Query) {
        let items = values(p, args);
        if items.is_empty() {
            continue;
        }
        let mut text = String::new();
        for (i, v) in items.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            scalar(v, &mut text);
        }
        if p.place == ParamPlace::Cookie {
            if !cookie.is_empty() {
                cookie.push_str("; ");
            }
            cookie.push_str(&p.name);
            cookie.push('=');
            cookie.push_str(&percent_encode(&text));
            continue;
        }
        let name = HeaderName::from_bytes(p.name.as_bytes())
            .map_err(|_| format!("header parameter `{}` is not a header name", p.name))?;
        let value = HeaderValue::from_str(&text)
            .map_err(|_| format!("header parameter `{}`: not a valid header value", p.name))?;
        out.push((name, value));
    }
    if !cookie.is_empty() {
        let value =
            HeaderValue::from_str(&cookie).map_err(|_| "cookie parameters: not a valid header value")?;
        out.push((http::header::COOKIE, value));
    }
    Ok(out)
}

/// The request body and its content type, when the body's argument is present.
pub(super) fn body(parts: &ArgParts, args: &Value) -> Option<(Bytes, &'static str)> {
    let (name, encoding) = parts.body.as_ref()?;
    let v = args.get(&**name).filter(|v| !v.is_null())?;
    Some(match encoding {
        BodyEncoding::Json => (
            Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
            "application/json",
        ),
        BodyEncoding::Form => {
            let mut out = String::new();
            let mut text = String::new();
            for (k, field) in v.as_object().into_iter().flatten() {
                let items = match field {
                    Value::Null => continue,
                    Value::Array(a) => a.as_slice(),
                    other => std::slice::from_ref(other),
                };
                for item in items {
                    text.clear();
                    scalar(item, &mut text);
                    push_pair(&mut out, k, &percent_encode(&text));
                }
            }
            (Bytes::from(out), "application/x-www-form-urlencoded")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(name: &str, place: ParamPlace, explode: bool, separator: char) -> ArgParam {
        ArgParam {
            name: name.into(),
            place,
            explode,
            separator,
        }
    }

    #[test]
    fn query_arrays_follow_their_style_and_absent_values_are_left_out() {
        let parts = ArgParts {
            params: vec![
                param("tag", ParamPlace::Query, true, ','),
                param("ids", ParamPlace::Query, false, ','),
                param("pipes", ParamPlace::Query, false, '|'),
                param("limit", ParamPlace::Query, true, ','),
                param("q", ParamPlace::Query, true, ','),
                param("gone", ParamPlace::Query, true, ','),
            ],
            body: None,
        };
        let mut out = String::new();
        let args = json!({"tag": ["a b", "c&d"], "ids": [1, 2], "pipes": ["x", "y"], "limit": 5, "q": "é/?", "gone": null});
        query(&parts, &args, &mut out);
        assert_eq!(
            out,
            "tag=a%20b&tag=c%26d&ids=1%2C2&pipes=x%7Cy&limit=5&q=%C3%A9%2F%3F"
        );
        let mut empty = String::new();
        query(&parts, &json!({}), &mut empty);
        assert_eq!(empty, "");
    }

    #[test]
    fn headers_cookies_and_bodies() {
        let parts = ArgParts {
            params: vec![
                param("X-Trace", ParamPlace::Header, false, ','),
                param("session", ParamPlace::Cookie, true, ','),
                param("theme", ParamPlace::Cookie, true, ','),
            ],
            body: Some(("body".into(), BodyEncoding::Form)),
        };
        let args = json!({"X-Trace": ["a", "b"], "session": "s 1", "theme": "dark", "body": {"user": "a+b", "n": 2, "tags": ["x", "y"], "skip": null}});
        let h = headers(&parts, &args).unwrap();
        assert_eq!(h[0].1, "a,b");
        assert_eq!(
            h[1],
            (
                http::header::COOKIE,
                HeaderValue::from_static("session=s%201; theme=dark")
            )
        );
        let (b, ct) = body(&parts, &args).unwrap();
        assert_eq!(ct, "application/x-www-form-urlencoded");
        assert_eq!(&b[..], b"n=2&tags=x&tags=y&user=a%2Bb");
        assert!(headers(&parts, &json!({"X-Trace": "a\nb"})).is_err());
        assert!(body(&parts, &json!({})).is_none());
    }
}
