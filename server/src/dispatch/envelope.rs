//! The JSON-RPC envelope: one message read with every field borrowed from the request bytes
//! and sorted into a request, a notification or an answer (or refused, with the error and
//! the id it can still name); batches read as raw elements, bounded before their list is
//! built; method params read the same way.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::error::RpcError;
use crate::protocol::{self, INVALID_REQUEST, PARSE_ERROR};

/// A JSON-RPC message as received: every field borrowed from the request bytes.
#[derive(Deserialize)]
struct Incoming<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed_str")]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "borrowed_str")]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// A message that passed the envelope checks.
pub(super) enum Message<'a> {
    /// A request: answered.
    Request {
        id: &'a RawValue,
        method: Cow<'a, str>,
        params: Option<&'a RawValue>,
    },
    /// A notification: never answered.
    Notification {
        method: Cow<'a, str>,
        params: Option<&'a RawValue>,
    },
    /// The answer to a request this server sent the client (sampling, elicitation).
    Answer {
        id: &'a RawValue,
        result: Option<&'a RawValue>,
        error: Option<&'a RawValue>,
    },
}

/// A message refused by the envelope checks: the error and the id it answers, when the
/// message's id could be read (without one, HTTP answers 400).
#[derive(Debug)]
pub(super) struct Malformed<'a> {
    pub error: RpcError,
    pub id: Option<&'a RawValue>,
}

/// Reads one JSON-RPC message.
///
/// # Errors
/// Unparsable JSON (`-32700`), or not a JSON-RPC 2.0 request, notification or answer
/// (`-32600`).
pub(super) fn read(body: &[u8]) -> Result<Message<'_>, Malformed<'_>> {
    let msg: Incoming<'_> = match serde_json::from_slice(body) {
        Ok(m) => m,
        Err(e) if e.is_data() => {
            return Err(Malformed {
                error: RpcError::new(INVALID_REQUEST, format!("Invalid request: {e}")),
                id: protocol::peek_id(body),
            });
        }
        Err(e) => {
            return Err(Malformed {
                error: RpcError::new(PARSE_ERROR, format!("Parse error: {e}")),
                id: None,
            });
        }
    };
    if msg.jsonrpc.as_deref() != Some("2.0") {
        return Err(Malformed {
            error: RpcError::new(INVALID_REQUEST, "Invalid request: `jsonrpc` must be \"2.0\""),
            id: msg.id.filter(|i| protocol::valid_id(i)),
        });
    }
    let Some(method) = msg.method else {
        if let Some(id) = msg.id
            && (msg.result.is_some() || msg.error.is_some())
        {
            return Ok(Message::Answer {
                id,
                result: msg.result,
                error: msg.error,
            });
        }
        return Err(Malformed {
            error: RpcError::new(INVALID_REQUEST, "Invalid request: no `method`"),
            id: msg.id.filter(|i| protocol::valid_id(i)),
        });
    };
    let Some(id) = msg.id else {
        return Ok(Message::Notification {
            method,
            params: msg.params,
        });
    };
    if !protocol::valid_id(id) {
        return Err(Malformed {
            error: RpcError::new(
                INVALID_REQUEST,
                "Invalid request: `id` must be a string or a number",
            ),
            id: None,
        });
    }
    Ok(Message::Request {
        id,
        method,
        params: msg.params,
    })
}

/// An optional string borrowed from the request bytes when it has no escapes (serde's own
/// `Option<Cow<str>>` always copies); `null` is `None`, like a missing field.
fn borrowed_str<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    struct Str;
    impl<'de> serde::de::Visitor<'de> for Str {
        type Value = Option<Cow<'de, str>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Borrowed(v)))
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(v.to_owned())))
        }
        fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(v)))
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(Str)
}

/// Keeps `"id": null` distinguishable from a missing id.
pub(super) fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// A method's params, read borrowing from the request.
///
/// # Errors
/// `-32602` when they are missing or do not have the method's shape.
pub(super) fn parse_params<'a, T: Deserialize<'a>>(params: Option<&'a RawValue>) -> Result<T, RpcError> {
    let Some(p) = params else {
        return Err(RpcError::invalid_params("Invalid params: `params` is required"));
    };
    serde_json::from_str(p.get()).map_err(|e| RpcError::invalid_params(format!("Invalid params: {e}")))
}

/// The outcome of reading a batch.
pub(super) enum Batch<'a> {
    /// Its elements, raw.
    Items(Vec<&'a RawValue>),
    /// More than the limit.
    TooLong,
    /// Not a JSON array.
    Unreadable(serde_json::Error),
}

/// Reads a batch's elements as raw messages, refusing one of more than `max` before its
/// element list is built.
pub(super) fn read_batch(body: &[u8], max: usize) -> Batch<'_> {
    let over = Cell::new(false);
    let seed = BoundedBatch { max, over: &over };
    let mut de = serde_json::Deserializer::from_slice(body);
    match seed.deserialize(&mut de).and_then(|v| de.end().map(|()| v)) {
        Ok(v) => Batch::Items(v),
        Err(_) if over.get() => Batch::TooLong,
        Err(e) => Batch::Unreadable(e),
    }
}

/// Reads a batch's elements as raw messages, failing (and setting `over`) past `max` of them,
/// so an oversized batch is refused before its element list is built.
struct BoundedBatch<'c> {
    max: usize,
    over: &'c Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for BoundedBatch<'_> {
    type Value = Vec<&'de RawValue>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for BoundedBatch<'_> {
    type Value = Vec<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-RPC batch (an array of messages)")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(8).min(self.max));
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            if items.len() == self.max {
                self.over.set(true);
                return Err(serde::de::Error::custom("batch too long"));
            }
            items.push(item);
        }
        Ok(items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::INVALID_PARAMS;

    fn refused(body: &str) -> (i32, Option<String>) {
        match read(body.as_bytes()) {
            Err(m) => (m.error.code, m.id.map(|i| i.get().to_owned())),
            Ok(_) => panic!("accepted: {body}"),
        }
    }

    #[test]
    fn refuses_what_is_not_json_rpc_naming_the_id_when_it_can() {
        assert_eq!(refused("{not json"), (PARSE_ERROR, None));
        assert_eq!(refused(""), (PARSE_ERROR, None));
        assert_eq!(
            refused(r#"{"jsonrpc":"2.0","id":4,"method":7}"#),
            (INVALID_REQUEST, Some("4".into()))
        );
        assert_eq!(
            refused(r#"{"jsonrpc":"1.0","id":"a","method":"ping"}"#),
            (INVALID_REQUEST, Some("\"a\"".into()))
        );
        assert_eq!(
            refused(r#"{"id":1,"method":"ping"}"#),
            (INVALID_REQUEST, Some("1".into()))
        );
        assert_eq!(
            refused(r#"{"jsonrpc":"2.0","id":2}"#),
            (INVALID_REQUEST, Some("2".into()))
        );
        assert_eq!(
            refused(r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#),
            (INVALID_REQUEST, None)
        );
        assert_eq!(
            refused(r#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#),
            (INVALID_REQUEST, None)
        );
    }

    #[test]
    fn sorts_requests_notifications_and_answers() {
        match read(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"a":1}}"#) {
            Ok(Message::Request { id, method, params }) => {
                assert_eq!((id.get(), &*method), ("1", "tools/list"));
                assert_eq!(params.map(RawValue::get), Some(r#"{"a":1}"#));
                assert!(
                    matches!(method, Cow::Borrowed(_)),
                    "an unescaped method is borrowed"
                );
            }
            _ => panic!("not a request"),
        }
        assert!(matches!(
            read(br#"{"jsonrpc":"2.0","method":"notifications/cancelled"}"#),
            Ok(Message::Notification { .. })
        ));
        assert!(matches!(
            read(br#"{"jsonrpc":"2.0","id":"s-1","result":{}}"#),
            Ok(Message::Answer { .. })
        ));
        // An escaped method name is read, copied.
        assert!(matches!(
            read(br#"{"jsonrpc":"2.0","id":1,"method":"p\u0069ng"}"#),
            Ok(Message::Request { method, .. }) if method == "ping"
        ));
    }

    #[test]
    fn batches_are_bounded_before_they_are_listed() {
        assert!(matches!(read_batch(b"[1,2,3]", 3), Batch::Items(v) if v.len() == 3));
        assert!(matches!(read_batch(b"[1,2,3,4]", 3), Batch::TooLong));
        assert!(matches!(read_batch(b"[1,", 3), Batch::Unreadable(_)));
        assert!(matches!(read_batch(b"[] x", 3), Batch::Unreadable(_)));
    }

    #[test]
    fn params_are_required_and_shaped() {
        #[derive(Deserialize)]
        struct P {
            #[allow(dead_code)]
            name: String,
        }
        let raw = |s: &str| RawValue::from_string(s.to_owned()).unwrap();
        assert_eq!(parse_params::<P>(None).err().unwrap().code, INVALID_PARAMS);
        assert_eq!(
            parse_params::<P>(Some(&raw(r#"{"name":1}"#))).err().unwrap().code,
            INVALID_PARAMS
        );
        assert!(parse_params::<P>(Some(&raw(r#"{"name":"x"}"#))).is_ok());
    }
}
