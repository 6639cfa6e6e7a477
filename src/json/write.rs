//! Writing JSON text straight into a byte buffer: strings with correct escaping, integers with
//! every digit, floats in shortest round-trip form, and whole values copied from a tape.

use smallvec::SmallVec;

use super::{Node, Nodes, StaticNode};

/// Writes `s` as a JSON string, quotes included.
#[inline]
pub fn string(out: &mut Vec<u8>, s: &str) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    string_body(out, s);
    out.push(b'"');
}

/// Writes the escaped content of `s` without quotes (for text assembled from several pieces).
pub fn string_body(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let mut done = 0;
    let mut i = 0;
    loop {
        // Words of eight bytes that hold nothing to escape are the common case: skip them whole.
        while let Some(word) = bytes.get(i..i + 8) {
            let Ok(word) = <[u8; 8]>::try_from(word) else { break };
            if needs_escape(u64::from_le_bytes(word)) {
                break;
            }
            i += 8;
        }
        let Some(&b) = bytes.get(i) else { break };
        i += 1;
        let escape = ESCAPE[b as usize];
        if escape == 0 {
            continue;
        }
        out.extend_from_slice(&bytes[done..i - 1]);
        done = i;
        if escape == b'u' {
            let hex = b"0123456789abcdef";
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                hex[(b >> 4) as usize],
                hex[(b & 0xf) as usize],
            ]);
        } else {
            out.extend_from_slice(&[b'\\', escape]);
        }
    }
    out.extend_from_slice(&bytes[done..]);
}

#[inline]
pub fn i64(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

#[inline]
pub fn u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Writes a finite float in its shortest round-trip form; returns `false` (writing nothing) for
/// NaN and infinities, which JSON cannot express.
#[inline]
pub fn f64(out: &mut Vec<u8>, f: f64) -> bool {
    if !f.is_finite() {
        return false;
    }
    out.extend_from_slice(zmij::Buffer::new().format_finite(f).as_bytes());
    true
}

/// Writes a scalar node as JSON.
pub fn scalar(out: &mut Vec<u8>, node: &StaticNode) {
    match *node {
        StaticNode::Null => out.extend_from_slice(b"null"),
        StaticNode::Bool(true) => out.extend_from_slice(b"true"),
        StaticNode::Bool(false) => out.extend_from_slice(b"false"),
        StaticNode::I64(n) => i64(out, n),
        StaticNode::U64(n) => u64(out, n),
        StaticNode::F64(f) => {
            if !f64(out, f) {
                out.extend_from_slice(b"null");
            }
        }
    }
}

/// Copies the value at `start` to `out` as compact JSON. Works iteratively, so nesting depth costs
/// heap (a small stack of open containers), never call-stack frames.
pub fn value(out: &mut Vec<u8>, nodes: &Nodes<'_>, start: usize) {
    // Members (for objects) or elements (for lists) still to write in each open container.
    let mut open: SmallVec<[(bool, usize); 16]> = SmallVec::new();
    let mut i = start;
    loop {
        match nodes.get(i) {
            Some(Node::String(s)) => string(out, s),
            Some(Node::Static(s)) => scalar(out, s),
            Some(Node::Object { len, .. }) => {
                if *len > 0 && key(out, nodes, i + 1, b'{') {
                    open.push((true, *len));
                    i += 2;
                    continue;
                }
                out.extend_from_slice(b"{}");
            }
            Some(Node::Array { len, .. }) => {
                if *len > 0 {
                    out.push(b'[');
                    open.push((false, *len));
                    i += 1;
                    continue;
                }
                out.extend_from_slice(b"[]");
            }
            // Unreachable for a tape from the parser; written as null rather than trusted.
            None => out.extend_from_slice(b"null"),
        }
        i += 1;
        // A value is complete: close finished containers, then separate the next member.
        loop {
            let Some((is_object, left)) = open.last_mut() else { return };
            *left -= 1;
            if *left == 0 {
                out.push(if *is_object { b'}' } else { b']' });
                open.pop();
                continue;
            }
            if *is_object {
                if !key(out, nodes, i, b',') {
                    // A malformed tape: close everything instead of reading on.
                    for (is_object, _) in open.drain(..).rev() {
                        out.push(if is_object { b'}' } else { b']' });
                    }
                    return;
                }
                i += 1;
            } else {
                out.push(b',');
            }
            break;
        }
    }
}

/// Writes `lead`, the member name at `i` and a colon; `false` if `i` holds no member name.
fn key(out: &mut Vec<u8>, nodes: &Nodes<'_>, i: usize, lead: u8) -> bool {
    let Some(Node::String(name)) = nodes.get(i) else {
        return false;
    };
    out.push(lead);
    string(out, name);
    out.push(b':');
    true
}

/// Whether any byte of the word is `"`, `\` or a control character (below 0x20).
#[inline]
fn needs_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below_space = w.wrapping_sub(ONES * 0x20) & !w;
    let quote = w ^ (ONES * b'"' as u64);
    let backslash = w ^ (ONES * b'\\' as u64);
    let is_quote = quote.wrapping_sub(ONES) & !quote;
    let is_backslash = backslash.wrapping_sub(ONES) & !backslash;
    (below_space | is_quote | is_backslash) & HIGH != 0
}

/// For each byte: 0 when it is written as is, the letter of its short escape, or `u` for `\u00XX`.
static ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = b'u';
        b += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(s: &str) -> String {
        let mut out = Vec::new();
        string(&mut out, s);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn escapes_quotes_backslashes_and_controls_only() {
        assert_eq!(escaped("plain text, long enough for words"), r#""plain text, long enough for words""#);
        assert_eq!(escaped("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(escaped("\n\t\r\u{8}\u{c}\u{1}\u{1f}"), r#""\n\t\r\b\f\u0001\u001f""#);
        assert_eq!(escaped("ünïcødé ☃ \u{7f}"), "\"ünïcødé ☃ \u{7f}\"");
        assert_eq!(escaped("12345678\"12345678\\"), r#""12345678\"12345678\\""#);
    }

    #[test]
    fn escaped_strings_round_trip_through_a_json_parser() {
        let all: String = (0u32..0x300).filter_map(char::from_u32).collect();
        let text = escaped(&all);
        let back: String = serde_json::from_str(&text).unwrap();
        assert_eq!(back, all);
    }

    #[test]
    fn numbers_keep_digits_and_floats_are_shortest() {
        let mut out = Vec::new();
        i64(&mut out, i64::MIN);
        out.push(b' ');
        u64(&mut out, u64::MAX);
        out.push(b' ');
        assert!(f64(&mut out, 0.1));
        out.push(b' ');
        assert!(f64(&mut out, 1e300));
        assert!(!f64(&mut out, f64::NAN));
        assert_eq!(String::from_utf8(out).unwrap(), "-9223372036854775808 18446744073709551615 0.1 1e+300");
    }

    #[test]
    fn values_are_copied_compactly() {
        let text =
            r#" { "a" : [1, {"b": null, "c": [[], {}]}, "x\"y"], "d": {"e": {"f": [true]}}, "g": -1.5 } "#;
        let mut buf = text.as_bytes().to_vec();
        let nodes = super::super::parse(&mut buf, 64).unwrap();
        let mut out = Vec::new();
        value(&mut out, &nodes, 0);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":[1,{"b":null,"c":[[],{}]},"x\"y"],"d":{"e":{"f":[true]}},"g":-1.5}"#
        );
    }
}
