//! Writing JSON text straight into a byte buffer: strings with correct escaping, integers with
//! every digit, floats in shortest round-trip form, and whole values copied from a tape.

use smallvec::SmallVec;

use super::{Node, Nodes, StaticNode};

/// Writes `s` as a JSON string, quotes included.
///
/// The output buffer grows once, by the most the string can take, and the string is then written
/// through a pointer a word (eight bytes) at a time: a word with nothing to escape is checked and
/// stored in one go, and the last, partial word is stored whole with only its bytes counted. So
/// text with nothing to escape costs no loop over bytes, no per-write capacity check and no
/// library call. A word that needs escaping is escaped byte by byte.
#[inline(always)]
pub fn string(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(escaped_room(bytes.len()) + 2);
    let len = out.len();
    // SAFETY: `reserve` left at least `escaped_room(n) + 2` bytes of spare capacity after `len`.
    // The opening quote takes one, `escape_into` writes within the next `escaped_room(n)` (its
    // contract), and the closing quote lands at most at `len + 1 + 6n`, inside the rest. Every
    // byte up to the closing quote is written, so the new length covers initialised bytes only.
    unsafe {
        let start = out.as_mut_ptr().add(len);
        start.write(b'"');
        let end = escape_into(start.add(1), bytes);
        end.write(b'"');
        out.set_len(len + end.offset_from(start) as usize + 1);
    }
}

/// Writes the escaped content of `s` without quotes (for text assembled from several pieces).
#[inline(always)]
pub fn string_body(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(escaped_room(bytes.len()));
    let len = out.len();
    // SAFETY: as in `string`, without the quotes: `escape_into` gets `escaped_room(n)` bytes of
    // spare capacity and the new length ends where it stopped writing.
    unsafe {
        let start = out.as_mut_ptr().add(len);
        let end = escape_into(start, bytes);
        out.set_len(len + end.offset_from(start) as usize);
    }
}

/// Writes `separator` and then the escaped content of `s` without quotes, with one reservation
/// for both (the pieces of a concatenation).
#[inline(always)]
pub fn string_body_after(out: &mut Vec<u8>, separator: u8, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(escaped_room(bytes.len()) + 1);
    let len = out.len();
    // SAFETY: as in `string_body`, with one more byte reserved and written first: the separator
    // at `len`, then `escape_into` within the `escaped_room(n)` bytes after it; the new length
    // ends where it stopped writing.
    unsafe {
        let start = out.as_mut_ptr().add(len);
        start.write(separator);
        let end = escape_into(start.add(1), bytes);
        out.set_len(len + end.offset_from(start) as usize);
    }
}

/// Room the escaped form of `n` bytes may need: every byte as `\u00XX`, plus one word of slack for
/// the store of the last, partial word.
#[inline(always)]
const fn escaped_room(n: usize) -> usize {
    6 * n + 8
}

/// Writes the escaped form of `bytes` at `to` and returns the end of what it wrote.
///
/// # Safety
/// `to` must be valid for writes of `escaped_room(bytes.len())` bytes.
#[inline(always)]
unsafe fn escape_into(mut to: *mut u8, bytes: &[u8]) -> *mut u8 {
    let mut words = bytes.chunks_exact(8);
    for chunk in &mut words {
        let word = load_partial(chunk);
        // SAFETY: after `k` of the `n` input bytes at most `6k` bytes were written, so at least
        // `6(n - k) + 8` bytes of room are left; with `n - k >= 8` here, that covers the eight
        // bytes of a clean word and the at most 48 of an escaped one.
        unsafe {
            if escape_mask(word) == 0 {
                to.cast::<[u8; 8]>().write_unaligned(word.to_le_bytes());
                to = to.add(8);
            } else {
                to = escape_slow(to, chunk);
            }
        }
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let word = load_partial(rest);
        let counted = u64::MAX >> (64 - 8 * rest.len());
        // SAFETY: as above, at least `6 * rest.len() + 8` bytes of room are left: enough for the
        // whole-word store (of which only `rest.len()` bytes are counted) or the escaped bytes.
        unsafe {
            if escape_mask(word) & counted == 0 {
                to.cast::<[u8; 8]>().write_unaligned(word.to_le_bytes());
                to = to.add(rest.len());
            } else {
                to = escape_slow(to, rest);
            }
        }
    }
    to
}

/// Escapes byte by byte (the rare path) and returns the end of what it wrote.
///
/// # Safety
/// `to` must be valid for writes of `6 * bytes.len()` bytes.
#[cold]
#[inline(never)]
unsafe fn escape_slow(mut to: *mut u8, bytes: &[u8]) -> *mut u8 {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        let escape = ESCAPE[b as usize];
        let (sequence, n) = match escape {
            0 => ([b, 0, 0, 0, 0, 0], 1),
            b'u' => ([b'\\', b'u', b'0', b'0', HEX[(b >> 4) as usize], HEX[(b & 0xf) as usize]], 6),
            _ => ([b'\\', escape, 0, 0, 0, 0], 2),
        };
        // SAFETY: each input byte becomes at most six output bytes, within the room the caller
        // guarantees; source and destination do not overlap (one is on the stack).
        unsafe {
            std::ptr::copy_nonoverlapping(sequence.as_ptr(), to, n);
            to = to.add(n);
        }
    }
    to
}

/// Bytes split into little-endian words once, for text written many times (member names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Words {
    words: Box<[u64]>,
    len: usize,
}

impl Words {
    pub fn new(bytes: &[u8]) -> Words {
        Words { words: bytes.chunks(8).map(load_partial).collect(), len: bytes.len() }
    }

    /// Appends the bytes: one store per word.
    #[inline(always)]
    pub fn write(&self, out: &mut Vec<u8>) {
        out.reserve(self.words.len() * 8);
        let len = out.len();
        // SAFETY: `reserve` left eight bytes of spare capacity per word after `len`, and word `i`
        // is stored at `len + 8i`, inside that room. The words hold the `self.len` bytes of the
        // text in order (`new`), so the new length covers exactly bytes that were written.
        unsafe {
            let to = out.as_mut_ptr().add(len);
            for (i, &word) in self.words.iter().enumerate() {
                to.add(8 * i).cast::<[u8; 8]>().write_unaligned(word.to_le_bytes());
            }
            out.set_len(len + self.len);
        }
    }
}

/// Up to eight bytes as a little-endian word, zero above them. Loads overlapping halves rather
/// than looping over bytes.
#[inline(always)]
fn load_partial(bytes: &[u8]) -> u64 {
    let n = bytes.len();
    if n >= 8 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[..8]);
        u64::from_le_bytes(word)
    } else if n >= 4 {
        let low = load4(&bytes[..4]);
        let high = load4(&bytes[n - 4..]);
        low | high << (8 * (n - 4))
    } else if n > 0 {
        let (a, b, c) = (bytes[0] as u64, bytes[n / 2] as u64, bytes[n - 1] as u64);
        a | b << (8 * (n / 2)) | c << (8 * (n - 1))
    } else {
        0
    }
}

#[inline(always)]
fn load4(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[..4]);
    u64::from(u32::from_le_bytes(word))
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

/// The high bit of each byte of the word that is `"`, `\` or a control character (below 0x20);
/// zero when the word needs no escaping.
#[inline(always)]
fn escape_mask(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below_space = w.wrapping_sub(ONES * 0x20) & !w;
    let quote = w ^ (ONES * b'"' as u64);
    let backslash = w ^ (ONES * b'\\' as u64);
    let is_quote = quote.wrapping_sub(ONES) & !quote;
    let is_backslash = backslash.wrapping_sub(ONES) & !backslash;
    (below_space | is_quote | is_backslash) & HIGH
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
    fn every_length_and_escape_position_is_written_right() {
        for n in 0..70 {
            for at in 0..=n {
                let mut text: String = (0..n).map(|i| (b'a' + (i % 26) as u8) as char).collect();
                if at < n {
                    text.replace_range(at..at + 1, "\n");
                }
                let mut out = Vec::new();
                string(&mut out, &text);
                let back: String = serde_json::from_slice(&out).unwrap();
                assert_eq!(back, text, "length {n}, escape at {at}");
                let mut words = b"x".to_vec();
                Words::new(text.as_bytes()).write(&mut words);
                assert_eq!(&words[1..], text.as_bytes());
            }
        }
    }

    #[test]
    fn worst_case_escaping_fits_the_room_it_reserves() {
        // Every byte escaped as `\u00XX` (six bytes), and mixes of short and long escapes, at
        // every length around the word boundaries; each written into a buffer that starts with no
        // spare capacity, so any write past the reserved room would land outside the allocation.
        for n in 0..70 {
            for pattern in ["\u{1}", "\u{1}\"", "a\u{1f}", "\\\t"] {
                let text: String = pattern.chars().cycle().take(n).collect();
                let mut out = Vec::new();
                string(&mut out, &text);
                let back: String = serde_json::from_slice(&out).unwrap();
                assert_eq!(back, text, "{pattern:?} x {n}");
                let mut body = b"[".to_vec();
                body.shrink_to_fit();
                string_body(&mut body, &text);
                assert_eq!(&body[1..], &out[1..out.len() - 1]);
                let mut after = b"[".to_vec();
                after.shrink_to_fit();
                string_body_after(&mut after, b' ', &text);
                assert_eq!(after[1], b' ');
                assert_eq!(&after[2..], &out[1..out.len() - 1]);
            }
        }
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
        let mut out = Vec::new();
        super::super::with_parsed(&mut buf, 64, |nodes| value(&mut out, nodes, 0)).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":[1,{"b":null,"c":[[],{}]},"x\"y"],"d":{"e":{"f":[true]}},"g":-1.5}"#
        );
    }
}
