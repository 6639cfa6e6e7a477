//! Type coercion of single JSON values (SPEC §1.5) and their text form for concatenations (§1.3).
//! Pure functions over tape nodes: a value that does not convert becomes [`Coerced::Null`].

use crate::json::write::{self, Backing, canonical_decimal, canonical_integer};
use crate::json::{Doc, Node, StaticNode};
use crate::plan::Type;

/// A scalar converted to its target type, ready to be written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Coerced<'a> {
    /// `null`: the value was null, or it did not convert.
    Null,
    /// A string, written as is (escaped).
    Str(&'a str),
    /// A number written as a JSON string (`String` type).
    NumberText(Number),
    Int(i64),
    Float(f64),
    Bool(bool),
    /// Text that is a number written exactly as its target type writes it (`"12"` as `Int`,
    /// `"12.25"` as `Double`, a float `12.25` as `Double`): copied, not parsed and formatted
    /// again.
    Digits(&'a str),
    /// The text of a float written exactly as `String` writes it (`12.25` as `"12.25"`).
    QuotedDigits(&'a str),
}

/// A JSON number as the parser read it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Number {
    I64(i64),
    U64(u64),
    F64(f64),
}

impl Coerced<'_> {
    /// Empty in the sense of SPEC §1.4: null, or a string of only white space.
    #[inline]
    pub fn is_empty(&self) -> bool {
        match self {
            Coerced::Null => true,
            Coerced::Str(s) => is_blank(s),
            _ => false,
        }
    }

    #[inline]
    pub fn write(&self, out: &mut Vec<u8>, backing: Backing<'_>) {
        match *self {
            Coerced::Null => out.extend_from_slice(b"null"),
            Coerced::Str(s) => write::string_in(out, s, backing),
            Coerced::NumberText(n) => {
                out.push(b'"');
                n.write(out);
                out.push(b'"');
            }
            Coerced::Int(n) => write::i64(out, n),
            Coerced::Float(f) => {
                if !write::f64(out, f) {
                    out.extend_from_slice(b"null");
                }
            }
            Coerced::Bool(true) => out.extend_from_slice(b"true"),
            Coerced::Bool(false) => out.extend_from_slice(b"false"),
            Coerced::Digits(text) => out.extend_from_slice(text.as_bytes()),
            Coerced::QuotedDigits(text) => {
                out.push(b'"');
                out.extend_from_slice(text.as_bytes());
                out.push(b'"');
            }
        }
    }
}

impl Number {
    #[inline]
    fn write(self, out: &mut Vec<u8>) {
        match self {
            Number::I64(n) => write::i64(out, n),
            Number::U64(n) => write::u64(out, n),
            // Only finite floats become a `Number` (see `number`).
            Number::F64(f) => {
                write::f64(out, f);
            }
        }
    }
}

/// A string that is empty or only white space (Unicode's, as `str::trim` has it).
#[inline]
pub(crate) fn is_blank(s: &str) -> bool {
    match s.as_bytes().first() {
        // Printable ASCII is not white space: the usual first byte decides at once.
        Some(&b) if b > b' ' && b < 0x80 => false,
        _ => trim(s).is_empty(),
    }
}

/// `s` without leading and trailing white space (Unicode's, as `str::trim` has it). Text that
/// starts and ends with printable ASCII is returned at once, ASCII white space is stripped byte by
/// byte, and only text with other bytes at an end goes to `str::trim`.
#[inline]
pub(crate) fn trim(s: &str) -> &str {
    let printable = |b: u8| b > b' ' && b < 0x80;
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) if printable(first) && printable(last) => s,
        _ => trim_slow(s),
    }
}

#[inline(never)]
fn trim_slow(s: &str) -> &str {
    // ASCII white space as `char::is_whitespace` has it: tab to carriage return, and space.
    let space = |b: &u8| *b == b' ' || (b'\t'..=b'\r').contains(b);
    let bytes = s.as_bytes();
    let start = bytes.iter().position(|b| !space(b)).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|b| !space(b)).map_or(start, |last| last + 1);
    // Only ASCII bytes were cut off, so both ends are character boundaries.
    let rest = s.get(start..end).unwrap_or_default();
    match (rest.as_bytes().first(), rest.as_bytes().last()) {
        (Some(&first), Some(&last)) if first >= 0x80 || last >= 0x80 => rest.trim(),
        _ => rest,
    }
}

/// [`coerce`] for node `at` of `doc`: a float whose text the document kept ([`Doc::float_text`])
/// is that text, where the target type writes it unchanged.
#[inline(always)]
pub(crate) fn coerce_at<'a>(doc: &Doc<'_, 'a>, at: usize, node: &Node<'a>, ty: Type) -> Coerced<'a> {
    match (doc.float_text(at), ty) {
        (Some(text), Type::Double | Type::Float) => Coerced::Digits(text),
        (Some(text), Type::String) => Coerced::QuotedDigits(text),
        _ => coerce(node, ty),
    }
}

/// Converts a scalar node to `ty`. Containers do not convert (the executor handles lists before
/// calling this, and an object is never a scalar). `Json` is not a conversion and gives `Null`.
#[inline]
pub(crate) fn coerce<'a>(node: &Node<'a>, ty: Type) -> Coerced<'a> {
    let value = match node {
        Node::String(s) => Scalar::Str(s),
        Node::Static(StaticNode::Null) => return Coerced::Null,
        Node::Static(StaticNode::Bool(b)) => Scalar::Bool(*b),
        Node::Static(s) => match number(s) {
            Some(n) => Scalar::Number(n),
            None => return Coerced::Null,
        },
        Node::Object { .. } | Node::Array { .. } => return Coerced::Null,
    };
    match ty {
        Type::String => match value {
            Scalar::Str(s) => Coerced::Str(s),
            Scalar::Number(n) => Coerced::NumberText(n),
            Scalar::Bool(b) => Coerced::Str(if b { "true" } else { "false" }),
        },
        Type::Int | Type::Long => match value {
            Scalar::Number(Number::I64(n)) => Coerced::Int(n),
            Scalar::Number(Number::U64(n)) => i64::try_from(n).map_or(Coerced::Null, Coerced::Int),
            Scalar::Str(s) => {
                let s = trim(s);
                if canonical_integer(s) {
                    Coerced::Digits(s)
                } else {
                    s.parse::<i64>().map_or(Coerced::Null, Coerced::Int)
                }
            }
            Scalar::Number(Number::F64(_)) | Scalar::Bool(_) => Coerced::Null,
        },
        Type::Double | Type::Float => match value {
            Scalar::Number(Number::I64(n)) => Coerced::Float(n as f64),
            Scalar::Number(Number::U64(n)) => Coerced::Float(n as f64),
            Scalar::Number(Number::F64(f)) => Coerced::Float(f),
            Scalar::Str(s) => {
                let s = trim(s);
                if canonical_decimal(s) {
                    Coerced::Digits(s)
                } else {
                    parse_decimal(s).map_or(Coerced::Null, Coerced::Float)
                }
            }
            Scalar::Bool(_) => Coerced::Null,
        },
        Type::Boolean => match value {
            Scalar::Bool(b) => Coerced::Bool(b),
            Scalar::Number(Number::I64(1) | Number::U64(1)) => Coerced::Bool(true),
            Scalar::Number(Number::I64(0) | Number::U64(0)) => Coerced::Bool(false),
            Scalar::Number(_) => Coerced::Null,
            Scalar::Str(s) => {
                let s = trim(s);
                if s.eq_ignore_ascii_case("true") {
                    Coerced::Bool(true)
                } else if s.eq_ignore_ascii_case("false") {
                    Coerced::Bool(false)
                } else {
                    Coerced::Null
                }
            }
        },
        Type::Json => Coerced::Null,
    }
}

/// One piece of a concatenation: a scalar as `String` converts it, trimmed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Text<'a> {
    Str(&'a str),
    /// A float's text that `String` writes unchanged ([`Doc::float_text`]).
    Digits(&'a str),
    Number(Number),
    Bool(bool),
}

impl Text<'_> {
    /// Writes the piece escaped, without quotes.
    #[inline]
    pub fn write_body(&self, out: &mut Vec<u8>, backing: Backing<'_>) {
        match *self {
            Text::Str(s) => write::string_body(out, s, backing),
            Text::Number(n) => n.write(out),
            Text::Digits(text) => out.extend_from_slice(text.as_bytes()),
            Text::Bool(b) => out.extend_from_slice(if b { b"true" } else { b"false" }),
        }
    }
}

/// The text of a concatenation part, or `None` when the part is left out (missing, null, blank,
/// an object or a list).
#[inline]
pub(crate) fn text<'a>(node: &Node<'a>) -> Option<Text<'a>> {
    match node {
        Node::String(s) => {
            let s = trim(s);
            (!s.is_empty()).then_some(Text::Str(s))
        }
        Node::Static(StaticNode::Bool(b)) => Some(Text::Bool(*b)),
        Node::Static(s) => number(s).map(Text::Number),
        Node::Object { .. } | Node::Array { .. } => None,
    }
}

enum Scalar<'a> {
    Str(&'a str),
    Number(Number),
    Bool(bool),
}

/// The number in a node, if it is a number JSON can write (finite).
#[inline]
fn number(node: &StaticNode) -> Option<Number> {
    match *node {
        StaticNode::I64(n) => Some(Number::I64(n)),
        StaticNode::U64(n) => Some(Number::U64(n)),
        StaticNode::F64(f) if f.is_finite() => Some(Number::F64(f)),
        _ => None,
    }
}

/// A finite decimal number in text: optional sign, digits with an optional fraction, optional
/// exponent. Words that Rust's float parser also takes (`inf`, `NaN`) are refused.
fn parse_decimal(s: &str) -> Option<f64> {
    let digits = s.bytes().filter(u8::is_ascii_digit).count();
    if digits == 0 || !s.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.' | b'e' | b'E'))
    {
        return None;
    }
    s.parse::<f64>().ok().filter(|f| f.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::with_parsed;

    /// Coerces the JSON text `value` to `ty` and returns what is written.
    fn check(value: &str, ty: &str) -> String {
        let mut buf = value.as_bytes().to_vec();
        let mut out = Vec::new();
        with_parsed(&mut buf, 8, |nodes| {
            coerce(&nodes[0], Type::from_name(ty).unwrap()).write(&mut out, nodes.backing())
        })
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn string_takes_strings_numbers_and_booleans() {
        assert_eq!(check(r#"" as sent ""#, "String"), r#"" as sent ""#);
        assert_eq!(check("12", "String"), r#""12""#);
        assert_eq!(check("-7", "String"), r#""-7""#);
        assert_eq!(check("18446744073709551615", "String"), r#""18446744073709551615""#);
        assert_eq!(check("1.50", "String"), r#""1.5""#);
        assert_eq!(check("true", "String"), r#""true""#);
        assert_eq!(check("null", "String"), "null");
        assert_eq!(check(r#"{"a":1}"#, "String"), "null");
    }

    #[test]
    fn int_takes_integers_and_integer_strings_only() {
        assert_eq!(check("17", "Int"), "17");
        assert_eq!(check(r#""17""#, "Int"), "17");
        assert_eq!(check(r#"" -17 ""#, "Long"), "-17");
        assert_eq!(check(r#""+5""#, "Int"), "5");
        assert_eq!(check("9223372036854775807", "Long"), "9223372036854775807");
        assert_eq!(check("-9223372036854775808", "Int"), "-9223372036854775808");
        assert_eq!(check(r#""9223372036854775807""#, "Int"), "9223372036854775807");
        // Out of range, fractions, words and other kinds fail.
        assert_eq!(check("9223372036854775808", "Int"), "null");
        assert_eq!(check(r#""9223372036854775808""#, "Int"), "null");
        assert_eq!(check("1.5", "Int"), "null");
        assert_eq!(check("2.0", "Int"), "null");
        assert_eq!(check(r#""1.5""#, "Int"), "null");
        assert_eq!(check(r#""abc""#, "Int"), "null");
        assert_eq!(check(r#""""#, "Int"), "null");
        assert_eq!(check(r#""1 2""#, "Int"), "null");
        assert_eq!(check("true", "Int"), "null");
    }

    #[test]
    fn double_takes_numbers_and_finite_decimal_strings() {
        assert_eq!(check("4.5", "Double"), "4.5");
        assert_eq!(check(r#""4.5""#, "Double"), "4.5");
        assert_eq!(check(r#"" -0.25 ""#, "Float"), "-0.25");
        assert_eq!(check(r#""1e3""#, "Double"), "1000.0");
        assert_eq!(check("12", "Double"), "12.0");
        assert_eq!(check("0.1", "Double"), "0.1");
        assert_eq!(check(r#""inf""#, "Double"), "null");
        assert_eq!(check(r#""NaN""#, "Double"), "null");
        assert_eq!(check(r#""1e400""#, "Double"), "null");
        assert_eq!(check(r#""0x10""#, "Double"), "null");
        assert_eq!(check(r#""1.2.3""#, "Double"), "null");
        assert_eq!(check(r#"".""#, "Double"), "null");
        assert_eq!(check("false", "Double"), "null");
    }

    #[test]
    fn boolean_takes_booleans_words_and_one_or_zero() {
        assert_eq!(check("true", "Boolean"), "true");
        assert_eq!(check(r#""TRUE""#, "Boolean"), "true");
        assert_eq!(check(r#""False""#, "Boolean"), "false");
        assert_eq!(check("1", "Boolean"), "true");
        assert_eq!(check("0", "Boolean"), "false");
        assert_eq!(check("2", "Boolean"), "null");
        assert_eq!(check("1.0", "Boolean"), "null");
        assert_eq!(check(r#""yes""#, "Boolean"), "null");
        assert_eq!(check(r#""1""#, "Boolean"), "null");
    }

    #[test]
    fn trim_and_is_blank_agree_with_str_trim() {
        // Every pair of pieces drawn from ASCII (controls, white space, printable), Unicode white
        // space, and other non-ASCII characters, in every arrangement of up to three.
        let mut pieces: Vec<String> = (0u8..0x80).map(|b| char::from(b).to_string()).collect();
        pieces.extend(["\u{85}", "\u{a0}", "\u{2003}", "\u{3000}", "é", "☃", "\u{200b}"].map(String::from));
        let mut checked = 0;
        for a in &pieces {
            for b in &pieces {
                for text in [format!("{a}{b}"), format!("{a}x{b}"), format!(" {a}{b} "), format!("{a} {b}")] {
                    assert_eq!(trim(&text), text.trim(), "{text:?}");
                    assert_eq!(is_blank(&text), text.trim().is_empty(), "{text:?}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 60_000);
    }

    #[test]
    fn blank_strings_are_empty_but_kept_verbatim() {
        for blank in ["", " ", "\t\r\n", "\u{b}", "\u{a0}", " \u{2003} "] {
            assert!(is_blank(blank), "{blank:?}");
            assert_eq!(trim(blank), "", "{blank:?}");
        }
        for text in ["x", " x", "\u{a0}x", "é"] {
            assert!(!is_blank(text), "{text:?}");
        }
        assert_eq!(trim("\u{b}x\u{a0}"), "x");
        assert_eq!(trim("x y"), "x y");
        assert!(coerce(&Node::String(" \t"), Type::String).is_empty());
        assert!(!coerce(&Node::String(" x "), Type::String).is_empty());
        assert!(coerce(&Node::Static(StaticNode::Null), Type::Int).is_empty());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 8192, ..Default::default() })]

        /// Text copied as a number is exactly what parsing it and writing the number gives.
        #[test]
        fn numbers_copied_as_text_are_what_a_round_trip_writes(
            text in r"-?(0|[1-9][0-9]{0,18}|10{0,17})(\.(0{0,7}[0-9]{0,16}))?( )?",
        ) {
            for ty in [Type::Int, Type::Double] {
                let copied = coerce(&Node::String(&text), ty);
                if let Coerced::Digits(digits) = copied {
                    let round_trip = match ty {
                        Type::Int => Coerced::Int(digits.parse::<i64>().map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?),
                        _ => Coerced::Float(digits.parse::<f64>().map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?),
                    };
                    let (mut a, mut b) = (Vec::new(), Vec::new());
                    copied.write(&mut a, Backing::NONE);
                    round_trip.write(&mut b, Backing::NONE);
                    proptest::prop_assert_eq!(String::from_utf8_lossy(&a), String::from_utf8_lossy(&b), "{:?} as {}", text, ty.name());
                }
            }
        }
    }

    #[test]
    fn the_usual_numbers_in_text_are_copied() {
        for (text, ty) in [
            ("12", Type::Int),
            ("-7", Type::Long),
            ("0", Type::Int),
            ("12.25", Type::Double),
            ("0.5", Type::Float),
            ("39.0", Type::Double),
            ("0.00001", Type::Double),
            ("-0.0", Type::Double),
        ] {
            assert_eq!(coerce(&Node::String(text), ty), Coerced::Digits(text), "{text}");
        }
        // Written otherwise than as they are: parsed and written again.
        for (text, ty, written) in [
            ("-0", Type::Int, "0"),
            ("007", Type::Int, "7"),
            ("12.50", Type::Double, "12.5"),
            ("1e3", Type::Double, "1000.0"),
            ("12", Type::Double, "12.0"),
            ("0.000001", Type::Double, "1e-6"),
            ("1234567890123456.5", Type::Double, "1234567890123456.5"),
            ("0.1000000000000000055511", Type::Double, "0.1"),
        ] {
            let coerced = coerce(&Node::String(text), ty);
            assert!(!matches!(coerced, Coerced::Digits(_)), "{text}");
            let mut out = Vec::new();
            coerced.write(&mut out, Backing::NONE);
            assert_eq!(String::from_utf8_lossy(&out), written, "{text}");
        }
    }

    #[test]
    fn concatenation_text_is_trimmed_and_skips_blanks() {
        assert_eq!(text(&Node::String("  1 tsp ")), Some(Text::Str("1 tsp")));
        assert_eq!(text(&Node::String("   ")), None);
        assert_eq!(text(&Node::Static(StaticNode::Null)), None);
        assert_eq!(text(&Node::Static(StaticNode::I64(3))), Some(Text::Number(Number::I64(3))));
        assert_eq!(text(&Node::Array { len: 0, count: 0 }), None);
    }
}
