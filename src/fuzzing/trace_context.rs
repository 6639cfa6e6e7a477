//! The `trace_context` target: arbitrary `traceparent` and `tracestate` lines, read as a call
//! reads a caller's (`crate::trace_context`).

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::trace_context::{MAX_MEMBERS, SAMPLED, TRACEPARENT, TRACESTATE, TraceParent, trace_state};

/// What one input reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceReached {
    /// No parent taken: none, several, or one not well formed.
    NoParent,
    /// A parent, and no `tracestate` kept.
    Parent,
    /// A parent and its `tracestate`.
    ParentAndState,
}

/// Reads the input's lines (split at `\n`; a line's first byte picks its field, even for
/// `traceparent`, odd for `tracestate`; lines that cannot be header values are left out) and
/// checks that no input panics; that a parent is taken exactly when a reading by `-`-separated
/// fields, written independently here, takes it; that the parent written for an upstream is 55
/// bytes and reads back as the same parent with only the sampled flag; and that a kept
/// `tracestate` has at most 32 members, no key twice, and reads back as itself.
pub fn trace_context(data: &[u8]) -> TraceReached {
    let mut headers = HeaderMap::new();
    let mut parents = Vec::new();
    for line in data.split(|&b| b == b'\n') {
        let Some((&pick, value)) = line.split_first() else { continue };
        let Ok(value) = HeaderValue::from_bytes(value) else { continue };
        let name = if pick % 2 == 0 { TRACEPARENT } else { TRACESTATE };
        if pick % 2 == 0 {
            parents.push(value.clone());
        }
        headers.append(HeaderName::from_static(name), value);
    }
    let parent = TraceParent::from_headers(&headers);
    let expected = match parents.as_slice() {
        [one] => by_fields(one.as_bytes()),
        _ => None,
    };
    assert_eq!(parent, expected, "{parents:?}");
    let Some(parent) = parent else { return TraceReached::NoParent };
    let written = parent.header_value().expect("a parent is always a header value");
    assert_eq!(written.len(), 55);
    let again = TraceParent::parse(written.as_bytes()).expect("a written parent reads back");
    assert_eq!(again, TraceParent { flags: parent.flags & SAMPLED, ..parent });
    let Some(state) = trace_state(&headers) else { return TraceReached::Parent };
    let members: Vec<&[u8]> = state.as_bytes().split(|&b| b == b',').collect();
    assert!(members.len() <= MAX_MEMBERS, "{state:?}");
    let keys: Vec<&[u8]> = members.iter().map(|m| &m[..m.iter().position(|&b| b == b'=').unwrap()]).collect();
    for (i, key) in keys.iter().enumerate() {
        assert!(!keys[..i].contains(key), "{state:?}: a key twice");
    }
    let mut one = HeaderMap::new();
    one.insert(HeaderName::from_static(TRACESTATE), state.clone());
    assert_eq!(trace_state(&one).as_ref(), Some(&state));
    TraceReached::ParentAndState
}

/// A `traceparent` read by its `-`-separated fields: the reference the parser is held to.
fn by_fields(value: &[u8]) -> Option<TraceParent> {
    // A later version's fields after the flags may hold any byte a header value holds.
    let text = String::from_utf8_lossy(value);
    let text = text.trim_matches([' ', '\t']);
    let fields: Vec<&str> = text.split('-').collect();
    let lower_hex =
        |s: &str, n: usize| s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let [version, trace_id, parent_id, flags, ..] = fields.as_slice() else { return None };
    let fits = lower_hex(version, 2)
        && *version != "ff"
        && (*version != "00" || fields.len() == 4)
        && lower_hex(trace_id, 32)
        && lower_hex(parent_id, 16)
        && lower_hex(flags, 2)
        && trace_id.bytes().any(|b| b != b'0')
        && parent_id.bytes().any(|b| b != b'0');
    if !fits {
        return None;
    }
    let bytes = |s: &str| {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect::<Vec<_>>()
    };
    Some(TraceParent {
        trace_id: bytes(trace_id).try_into().unwrap(),
        parent_id: bytes(parent_id).try_into().unwrap(),
        flags: bytes(flags)[0],
    })
}
