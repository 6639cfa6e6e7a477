//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the `traceparent` and `tracestate`
//! a caller sends, read strictly, and the `traceparent` an upstream call is sent with.
//!
//! A `traceparent` is taken only as the recommendation writes it: lowercase hex, the version not
//! `ff`, version `00` exactly 55 bytes, a later version at least that and, if longer, with a `-`
//! after the flags; neither id all zeros; one header line, not several. Anything else is no
//! parent (the call starts a trace of its own), and then its `tracestate` is not read either.
//! A `tracestate` is kept whole or not at all: every list member well formed, no key twice, at
//! most 32 members; empty members and the spaces around members are dropped, and the lines of
//! the field are joined.

use http::{HeaderMap, HeaderValue};

/// The `traceparent` field.
pub const TRACEPARENT: &str = "traceparent";
/// The `tracestate` field.
pub const TRACESTATE: &str = "tracestate";

/// The two as header names, which are looked up without being parsed first.
pub const TRACEPARENT_NAME: http::HeaderName = http::HeaderName::from_static(TRACEPARENT);
pub const TRACESTATE_NAME: http::HeaderName = http::HeaderName::from_static(TRACESTATE);

/// The one flag this version of the recommendation defines: the caller may have recorded.
pub const SAMPLED: u8 = 0x01;
/// The most list members a `tracestate` may have.
pub const MAX_MEMBERS: usize = 32;

/// The length of a version `00` `traceparent`.
pub const LENGTH: usize = 55;

/// A parent span, as a `traceparent` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    /// The flags as sent; only [`SAMPLED`] is passed on.
    pub flags: u8,
}

impl TraceParent {
    /// The caller's parent span: its one `traceparent` line, read as [`TraceParent::parse`] reads
    /// it; `None` for none, several, or one that is not well formed.
    pub fn from_headers(headers: &HeaderMap) -> Option<TraceParent> {
        let mut lines = headers.get_all(TRACEPARENT_NAME).iter();
        let line = lines.next()?;
        if lines.next().is_some() {
            return None;
        }
        TraceParent::parse(line.as_bytes())
    }

    /// A `traceparent` value, with any spaces or tabs around it; `None` unless well formed.
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        let value = trim(value);
        if value.len() < LENGTH {
            return None;
        }
        let version = hex_byte(&value[0..2])?;
        if version == 0xff || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        // A later version may add fields after a `-`; version 00 has none.
        if (version == 0 && value.len() != LENGTH) || (value.len() > LENGTH && value[LENGTH] != b'-') {
            return None;
        }
        let mut trace_id = [0; 16];
        let mut parent_id = [0; 8];
        hex_into(&value[3..35], &mut trace_id)?;
        hex_into(&value[36..52], &mut parent_id)?;
        let flags = hex_byte(&value[53..55])?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent { trace_id, parent_id, flags })
    }

    /// Whether the caller may have recorded its span.
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// The same trace, with `parent_id` as the parent: what a call made under it sends.
    pub fn child(&self, parent_id: [u8; 8]) -> TraceParent {
        TraceParent { parent_id, ..*self }
    }

    /// The version `00` text of this parent, flags other than [`SAMPLED`] cleared.
    pub fn text(&self) -> [u8; LENGTH] {
        let mut out = [b'-'; LENGTH];
        crate::hex::write_bytes(&mut out[0..2], &[0]);
        crate::hex::write_bytes(&mut out[3..35], &self.trace_id);
        crate::hex::write_bytes(&mut out[36..52], &self.parent_id);
        crate::hex::write_bytes(&mut out[53..55], &[self.flags & SAMPLED]);
        out
    }

    /// [`TraceParent::text`] as a header value (hex digits and dashes always are one: `None` is
    /// only the type's, so that nothing here can panic).
    pub fn header_value(&self) -> Option<HeaderValue> {
        HeaderValue::from_bytes(&self.text()).ok()
    }
}

/// The caller's `tracestate`, its lines joined, members as sent without the empty ones and the
/// spaces around each; `None` when there is none, when it has no member, or when it is not all
/// well formed (any member, a key twice, more than [`MAX_MEMBERS`]). Read only when the caller's
/// `traceparent` was taken.
pub fn trace_state(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut out = Vec::new();
    let mut keys: Vec<&[u8]> = Vec::new();
    for line in headers.get_all(TRACESTATE_NAME) {
        for member in line.as_bytes().split(|&b| b == b',') {
            let member = trim(member);
            if member.is_empty() {
                continue;
            }
            let key = member_key(member)?;
            if keys.len() == MAX_MEMBERS || keys.contains(&key) {
                return None;
            }
            keys.push(key);
            if !out.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(member);
        }
    }
    if out.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(&out).ok()
}

/// The key of a well-formed list member, `key=value`.
fn member_key(member: &[u8]) -> Option<&[u8]> {
    let at = member.iter().position(|&b| b == b'=')?;
    let (key, value) = (&member[..at], &member[at + 1..]);
    (valid_key(key) && valid_value(value)).then_some(key)
}

/// `simple-key` or `tenant-id@system-id`.
fn valid_key(key: &[u8]) -> bool {
    match key.iter().position(|&b| b == b'@') {
        None => {
            key.len() <= 256
                && key.first().is_some_and(u8::is_ascii_lowercase)
                && key[1..].iter().all(key_byte)
        }
        Some(at) => {
            let (tenant, system) = (&key[..at], &key[at + 1..]);
            tenant.len() <= 241
                && tenant.first().is_some_and(|&b| b.is_ascii_lowercase() || b.is_ascii_digit())
                && tenant[1..].iter().all(key_byte)
                && system.len() <= 14
                && system.first().is_some_and(u8::is_ascii_lowercase)
                && system[1..].iter().all(key_byte)
        }
    }
}

fn key_byte(b: &u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'*' | b'/')
}

/// 1 to 256 printable characters other than `,` and `=`, the last not a space.
fn valid_value(value: &[u8]) -> bool {
    (1..=256).contains(&value.len())
        && value.iter().all(|&b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
        && value.last() != Some(&b' ')
}

/// `bytes` without the spaces and tabs around it.
fn trim(bytes: &[u8]) -> &[u8] {
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !blank(b)).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|b| !blank(b)).map_or(start, |i| i + 1);
    &bytes[start..end]
}

/// One lowercase hex digit's value.
fn digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    Some(digit(two[0])? << 4 | digit(two[1])?)
}

/// Lowercase hex `text` into `out` (twice as long as `out`).
fn hex_into(text: &[u8], out: &mut [u8]) -> Option<()> {
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *byte = hex_byte(pair)?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn parsed(value: &str) -> Option<TraceParent> {
        TraceParent::parse(value.as_bytes())
    }

    fn headers(lines: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in lines {
            map.append(
                http::HeaderName::from_static(name),
                HeaderValue::from_bytes(value.as_bytes()).unwrap(),
            );
        }
        map
    }

    #[test]
    fn the_recommendations_example_is_read_and_written_back() {
        let parent = parsed(VALID).unwrap();
        assert_eq!(parent.trace_id[0], 0x4b);
        assert_eq!(parent.trace_id[15], 0x36);
        assert_eq!(parent.parent_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert!(parent.sampled());
        assert_eq!(parent.header_value().unwrap(), VALID);
        assert_eq!(parsed(&format!(" \t{VALID} ")), Some(parent));
        let child = parent.child([1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(child.header_value().unwrap(), "00-4bf92f3577b34da6a3ce929d0e0e4736-0102030405060708-01");
        assert!(!parsed(&VALID.replace("-01", "-00")).unwrap().sampled());
    }

    #[test]
    fn what_the_recommendation_refuses_is_no_parent() {
        for bad in [
            "",
            "00",
            &VALID[..54],
            &format!("{VALID}-"),
            &format!("{VALID}0"),
            &VALID.replace("00-4b", "ff-4b"),
            &VALID.to_uppercase(),
            &VALID.replace("4bf9", "4BF9"),
            &VALID.replace("-01", "-0g"),
            &VALID.replace("-00f0", "+00f0"),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-abc-def-01",
        ] {
            assert_eq!(parsed(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_for_the_fields_this_one_knows_and_unknown_flags_are_not_passed_on() {
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-what-comes-next";
        let parent = parsed(later).unwrap();
        assert_eq!(parent.flags, 0x03);
        assert_eq!(parent.header_value().unwrap(), VALID);
        assert_eq!(parsed(&later[..LENGTH]).unwrap(), parent);
        assert_eq!(parsed(&later.replace("-03-what", "-03+what")), None);
    }

    #[test]
    fn several_traceparent_lines_are_no_parent() {
        assert!(TraceParent::from_headers(&headers(&[(TRACEPARENT, VALID)])).is_some());
        assert_eq!(TraceParent::from_headers(&headers(&[(TRACEPARENT, VALID), (TRACEPARENT, VALID)])), None);
        assert_eq!(TraceParent::from_headers(&HeaderMap::new()), None);
    }

    #[test]
    fn a_tracestate_is_joined_and_trimmed_and_kept_only_when_all_of_it_is_well_formed() {
        let state = |lines: &[&str]| {
            let lines: Vec<_> = lines.iter().map(|l| (TRACESTATE, *l)).collect();
            trace_state(&headers(&lines)).map(|v| v.to_str().unwrap().to_owned())
        };
        assert_eq!(
            state(&["rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"]).as_deref(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        assert_eq!(
            state(&[" rojo=1 ,, ", "\tfw529a3039@dt=x y"]).as_deref(),
            Some("rojo=1,fw529a3039@dt=x y")
        );
        assert_eq!(state(&[]), None);
        assert_eq!(state(&[" , "]), None);
        let thirty_two: Vec<String> = (0..32).map(|i| format!("k{i}=v")).collect();
        assert_eq!(state(&[&thirty_two.join(",")]).map(|s| s.matches('=').count()), Some(32));
        let thirty_three = format!("{},k32=v", thirty_two.join(","));
        for bad in [
            "rojo=1,rojo=2",
            thirty_three.as_str(),
            "Rojo=1",
            "1rojo=1",
            "rojo",
            "rojo=",
            "rojo=a\tb",
            "rojo=a=b",
            "rojo=é",
            "a@=1",
            "a@B=1",
            "a@abcdefghijklmno=1",
            "ok=1,bad key=2",
        ] {
            assert_eq!(state(&[bad]), None, "{bad:?}");
        }
        let long_value = "v".repeat(256);
        assert!(state(&[&format!("k={long_value}")]).is_some());
        assert_eq!(state(&[&format!("k={long_value}v")]), None);
        let long_key = format!("k{}", "a".repeat(255));
        assert!(state(&[&format!("{long_key}=v")]).is_some());
        assert_eq!(state(&[&format!("{long_key}a=v")]), None);
    }
}
