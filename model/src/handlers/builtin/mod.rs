//! The `builtin` handler: functions built into the server (`echo`, `add`, `multiply`,
//! `upper`, `lower`, `length`, `sha256`, `now`, `sleep`, `json`), each with its own input
//! schema; all but `sleep` run synchronously on the dispatch path.

use serde_json::{Value, json};

/// Built-in functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    /// Returns `text`.
    Echo,
    /// `a + b`.
    Add,
    /// `a * b`.
    Multiply,
    /// Upper-cases `text`.
    Upper,
    /// Lower-cases `text`.
    Lower,
    /// Character count of `text`.
    Length,
    /// Hex SHA-256 of `text`.
    Sha256,
    /// Current UTC time, RFC 3339.
    Now,
    /// Waits `ms` milliseconds (at most 60000).
    Sleep,
    /// Returns the arguments as structured content.
    Json,
}

impl Builtin {
    const ALL: [(&'static str, Builtin); 10] = [
        ("echo", Self::Echo),
        ("add", Self::Add),
        ("multiply", Self::Multiply),
        ("upper", Self::Upper),
        ("lower", Self::Lower),
        ("length", Self::Length),
        ("sha256", Self::Sha256),
        ("now", Self::Now),
        ("sleep", Self::Sleep),
        ("json", Self::Json),
    ];

    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == s).map(|(_, b)| *b)
    }

    pub fn names() -> String {
        Self::ALL.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
    }

    /// The input schema a builtin implies when the tool declares none.
    pub fn input_schema(self) -> Value {
        let text = json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"], "additionalProperties": false});
        match self {
            Self::Echo | Self::Upper | Self::Lower | Self::Length | Self::Sha256 => text,
            Self::Add | Self::Multiply => {
                json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"], "additionalProperties": false})
            }
            Self::Now => json!({"type": "object", "properties": {}, "additionalProperties": false}),
            Self::Sleep => {
                json!({"type": "object", "properties": {"ms": {"type": "integer", "minimum": 0, "maximum": 60000}}, "required": ["ms"], "additionalProperties": false})
            }
            Self::Json => json!({"type": "object"}),
        }
    }

    /// The output schema of builtins with structured results.
    pub fn output_schema(self) -> Option<Value> {
        match self {
            Self::Add | Self::Multiply | Self::Length => Some(
                json!({"type": "object", "properties": {"result": {"type": "number"}}, "required": ["result"]}),
            ),
            _ => None,
        }
    }
}
