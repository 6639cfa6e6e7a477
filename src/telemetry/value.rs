//! What a span is and holds: its kind, and an attribute's value as it is written.

/// The kind of a span, as OTLP numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

/// An attribute's value, borrowed: it is written into the span at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    Str(&'a str),
    /// A text in pieces, written one after the other.
    Parts(&'a [&'a str]),
    Int(i64),
    Bool(bool),
}

impl<'a> From<&'a str> for Value<'a> {
    fn from(text: &'a str) -> Value<'a> {
        Value::Str(text)
    }
}

impl<'a> From<&'a String> for Value<'a> {
    fn from(text: &'a String) -> Value<'a> {
        Value::Str(text)
    }
}

impl From<i64> for Value<'_> {
    fn from(n: i64) -> Value<'static> {
        Value::Int(n)
    }
}

impl From<bool> for Value<'_> {
    fn from(b: bool) -> Value<'static> {
        Value::Bool(b)
    }
}
