//! The `upstream_headers` target: an upstream answer's `Cache-Control`, `Age` and `Vary` lines,
//! as many and as large as the input holds, read into what the cache keeps, for a route's
//! settings and a time the answer was kept.

use arbitrary::Unstructured;

use crate::cache::{age_after, lifetime};
use crate::route::CacheSettings;
use crate::upstream::{Freshness, MAX_DELTA_SECONDS};

/// What one input reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeadersReached {
    /// The answer would be kept, fresh for a while.
    Kept,
    /// The upstream forbids keeping it.
    Forbidden,
    /// Allowed, but with no freshness left (or a TTL of 0).
    NoFreshness,
}

const NAMES: &[&str] = &["cache-control", "Cache-Control", "age", "AGE", "vary", "x-other", "expires"];
const DIRECTIVES: &[&str] = &[
    "max-age",
    "s-maxage",
    "Max-Age",
    "no-store",
    "private",
    "no-cache",
    "must-revalidate",
    "proxy-revalidate",
    "public",
    "immutable",
    "*",
];

/// Reads arbitrary header lines and checks that no input panics, that every number stays within
/// 2^31, that the lines read the same joined into one line per field and in any order, and that
/// what is kept is never kept longer than the route's TTL.
pub fn upstream_headers(data: &[u8]) -> HeadersReached {
    let mut input = Unstructured::new(data);
    let settings = CacheSettings {
        ttl_seconds: input.int_in_range(0..=31_536_000).unwrap_or(60),
        stale_while_revalidate_seconds: input.int_in_range(0..=31_536_000).unwrap_or(0),
    };
    let lived: u64 = input.arbitrary().unwrap_or(0);
    let mut lines: Vec<(&'static str, Vec<u8>)> = Vec::new();
    while !input.is_empty() && lines.len() < 64 {
        let Ok(name) = input.choose(NAMES) else { break };
        let value = if input.arbitrary::<bool>().unwrap_or(false) {
            input.arbitrary::<&[u8]>().unwrap_or_default().to_vec()
        } else {
            built_value(&mut input)
        };
        lines.push((name, value));
    }
    let freshness = Freshness::of(lines.iter().map(|(name, value)| (name.as_bytes(), value.as_slice())));

    // Numbers never pass 2^31, and what is left never passes what there was.
    assert!(freshness.age() <= MAX_DELTA_SECONDS, "{freshness:?}");
    if let Some(lifetime) = freshness.lifetime() {
        assert!(lifetime <= MAX_DELTA_SECONDS, "{freshness:?}");
        assert!(freshness.fresh_for().is_some_and(|left| left <= lifetime), "{freshness:?}");
    }
    let age = age_after(freshness.age(), lived);
    assert!(age <= MAX_DELTA_SECONDS && age >= freshness.age(), "{freshness:?} after {lived} s: {age}");

    // One way however they come: a field's lines joined into one line, and the lines in reverse.
    let mut joined: Vec<(String, Vec<u8>)> = Vec::new();
    for (name, value) in &lines {
        let name = name.to_ascii_lowercase();
        match joined.iter_mut().find(|(seen, _)| *seen == name) {
            Some((_, line)) => {
                line.push(b',');
                line.extend_from_slice(value);
            }
            None => joined.push((name, value.clone())),
        }
    }
    let one_line = Freshness::of(joined.iter().map(|(name, value)| (name.as_bytes(), value.as_slice())));
    assert_eq!(one_line, freshness, "{lines:?} read otherwise as one line per field");
    let reversed = Freshness::of(lines.iter().rev().map(|(name, value)| (name.as_bytes(), value.as_slice())));
    assert_eq!(reversed, freshness, "{lines:?} read otherwise in reverse");

    match lifetime(&freshness, settings) {
        Some((fresh, stale)) => {
            assert!((1..=settings.ttl_seconds).contains(&fresh), "{freshness:?}, {settings:?}: {fresh}");
            assert!(stale <= settings.stale_while_revalidate_seconds, "{freshness:?}, {settings:?}");
            assert!(!freshness.no_store);
            HeadersReached::Kept
        }
        None if freshness.no_store => HeadersReached::Forbidden,
        None => {
            assert!(
                settings.ttl_seconds == 0 || freshness.fresh_for() == Some(0),
                "{freshness:?}, {settings:?}: not kept"
            );
            HeadersReached::NoFreshness
        }
    }
}

/// A header value made of directives, numbers of every size and separators.
fn built_value(input: &mut Unstructured<'_>) -> Vec<u8> {
    let mut value = Vec::new();
    let parts = input.int_in_range(1..=6).unwrap_or(1);
    for i in 0..parts {
        if i > 0 {
            let separator: &[u8] = input.choose(&[&b", "[..], b",", b" , ", b",,"]).copied().unwrap_or(b",");
            value.extend_from_slice(separator);
        }
        let with_name = input.arbitrary::<bool>().unwrap_or(true);
        if with_name {
            let directive = input.choose(DIRECTIVES).copied().unwrap_or("max-age");
            value.extend_from_slice(directive.as_bytes());
            if !input.arbitrary::<bool>().unwrap_or(true) {
                continue;
            }
            value.push(b'=');
        }
        let quoted = input.ratio(1, 8).unwrap_or(false);
        if quoted {
            value.push(b'"');
        }
        match input.int_in_range(0..=3).unwrap_or(0) {
            0 => value.extend_from_slice(input.arbitrary::<u64>().unwrap_or(0).to_string().as_bytes()),
            1 => value.extend_from_slice(input.int_in_range(0..=1000u32).unwrap_or(0).to_string().as_bytes()),
            2 => {
                let digits = input.int_in_range(1..=60usize).unwrap_or(20);
                value.extend(std::iter::repeat_n(b'9', digits));
            }
            _ => value.extend_from_slice(input.arbitrary::<&str>().unwrap_or("x").as_bytes()),
        }
        if quoted {
            value.push(b'"');
        }
    }
    value
}
