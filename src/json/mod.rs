//! Parsing JSON into a simd-json tape, and walking that tape: the one in-memory form every JSON
//! document (rules, preview bodies, upstream answers) takes inside recast. An upstream answer is
//! read into a tape of only what its route's rules read ([`ondemand`]).
//!
//! A tape is a flat `Vec<Node>` in document order. Containers are a header node followed by their
//! contents; the header's `count` is the number of nodes inside, so a value is skipped in O(1).

// One of two modules with `unsafe` code: writing strings through pointers (see its SAFETY
// comments).
#[allow(unsafe_code)]
pub mod write;

pub mod diff;
mod doc;
mod error;
pub mod index;
pub mod keys;
pub mod ondemand;
pub mod ordered;
pub mod place;
// The one other module with `unsafe` code: the vector instructions the index classifies bytes
// with, AVX2 chosen at run time (see its SAFETY comments).
#[allow(unsafe_code)]
pub mod simd;

use std::cell::RefCell;

pub use doc::{Doc, Nodes, PADDING, value};
pub use error::JsonError;
pub use simd_json::{Node, StaticNode};

/// Checks that `input` is one JSON text nested at most `max_depth` deep, as [`with_parsed`]
/// would take it, and says in words what is wrong and where when it is not: for texts a user
/// wrote, whose mistakes are worth a precise answer.
pub fn diagnose(input: &[u8], max_depth: usize) -> Result<(), JsonError> {
    let mut index = Vec::new();
    index::build(input, &mut index)?;
    ondemand::validate(input, &index, max_depth)
}

/// The parser's reason for refusing a text, in words (its own names for them are not for users).
fn parser_words(error: &simd_json::ErrorType) -> &'static str {
    use simd_json::ErrorType as E;
    match error {
        E::Eof => "the text ends where a value should be",
        E::InvalidUtf8 => "the text is not UTF-8",
        E::InvalidEscape | E::InvalidUnicodeEscape | E::InvalidUnicodeCodepoint => {
            "a string has an escape sequence that is not JSON"
        }
        E::InvalidNumber | E::InvalidExponent | E::Overflow => "a number that is not JSON",
        E::UnterminatedString => "the string is not closed",
        E::TrailingData => "text after the JSON value",
        E::ExpectedObjectKey | E::KeyMustBeAString | E::BadKeyType => "expected a member name",
        E::ExpectedObjectColon => "expected ':'",
        E::ExpectedMapComma | E::ExpectedMapEnd | E::ExpectedObjectContent => "expected ',' or '}'",
        E::ExpectedArrayComma | E::ExpectedArrayContent => "expected ',' or ']'",
        _ => "not a value",
    }
}

/// Parses `input` in place (simd-json unescapes strings inside the buffer) and runs `f` on the
/// parsed document.
///
/// The buffer is grown by simd-json's padding first so the parser needs no copy of its own; give
/// it that much spare capacity to avoid a reallocation. The parser's scratch buffers and the
/// tape's allocation are kept per thread and reused, so a warm thread parses without allocating;
/// a nested call (from inside `f`) simply works with fresh scratch.
pub fn with_parsed<R>(
    input: &mut Vec<u8>,
    max_depth: usize,
    f: impl FnOnce(&Doc<'_, '_>) -> R,
) -> Result<R, JsonError> {
    let len = input.len();
    input.resize(len + PADDING, b' ');
    let (mut buffers, tape) = match SCRATCH.with_borrow_mut(Option::take) {
        Some(scratch) if scratch.max_depth == max_depth => (scratch.buffers, scratch.tape),
        _ => (simd_json::Buffers::with_max_depth(len, max_depth), simd_json::Tape::null().reset()),
    };
    let mut tape = tape.reset();
    let (buffer, backing) = write::Backing::split(input);
    let parsed = simd_json::fill_tape_padded(buffer, len, &mut buffers, &mut tape);
    let result = match parsed {
        Ok(()) => Ok(f(&Doc { nodes: &tape.0, backing, floats: &[] })),
        Err(e) if matches!(e.error(), simd_json::ErrorType::DepthLimitExceeded) => {
            Err(JsonError::TooDeep { limit: max_depth })
        }
        Err(e) => Err(JsonError::Syntax { what: parser_words(e.error()).to_owned(), at: Some(e.index()) }),
    };
    // Emptying the tape ends its borrow of the input.
    let tape = tape.reset();
    input.truncate(len);
    // Scratch grown by a large document is let go rather than kept for the thread's lifetime.
    if len <= RETAIN_SCRATCH_BYTES {
        SCRATCH.with_borrow_mut(|scratch| *scratch = Some(Scratch { max_depth, buffers, tape }));
    }
    result
}

/// Largest document whose parser scratch a thread keeps for the next parse.
const RETAIN_SCRATCH_BYTES: usize = 4 << 20;

struct Scratch {
    max_depth: usize,
    buffers: simd_json::Buffers,
    tape: simd_json::Tape<'static>,
}

thread_local! {
    static SCRATCH: RefCell<Option<Scratch>> = const { RefCell::new(None) };
}

/// Index of the node just after the value that starts at `i`.
#[inline]
pub fn skip(nodes: &Nodes<'_>, i: usize) -> usize {
    match nodes.get(i) {
        Some(Node::Object { count, .. } | Node::Array { count, .. }) => i + 1 + count,
        _ => i + 1,
    }
}

/// Follows a list to its first element, again for a list inside a list (SPEC §1.2). `None` when a
/// list on the way is empty, which the rules language treats as "missing".
#[inline]
pub fn first_non_list(nodes: &Nodes<'_>, mut i: usize) -> Option<usize> {
    loop {
        match nodes.get(i)? {
            Node::Array { len: 0, .. } => return None,
            Node::Array { .. } => i += 1,
            _ => return Some(i),
        }
    }
}

/// The members of the object at `i` in document order, or `None` when it is not an object.
pub fn members<'t, 'a>(nodes: &'t Nodes<'a>, i: usize) -> Option<Members<'t, 'a>> {
    match nodes.get(i)? {
        Node::Object { len, .. } => Some(Members { nodes, next: i + 1, left: *len }),
        _ => None,
    }
}

/// The elements of the list at `i` in order, or `None` when it is not a list.
pub fn elements<'t, 'a>(nodes: &'t Nodes<'a>, i: usize) -> Option<Elements<'t, 'a>> {
    match nodes.get(i)? {
        Node::Array { len, .. } => Some(Elements { nodes, next: i + 1, left: *len }),
        _ => None,
    }
}

/// The value of the first member called `name` of the object at `i`.
pub fn member(nodes: &Nodes<'_>, i: usize, name: &str) -> Option<usize> {
    members(nodes, i)?.find(|(key, _)| *key == name).map(|(_, value)| value)
}

/// Iterator over `(name, value index)` pairs of one object.
pub struct Members<'t, 'a> {
    nodes: &'t Nodes<'a>,
    next: usize,
    left: usize,
}

impl<'a> Iterator for Members<'_, 'a> {
    type Item = (&'a str, usize);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let Some(Node::String(key)) = self.nodes.get(self.next) else {
            self.left = 0;
            return None;
        };
        let value = self.next + 1;
        self.next = skip(self.nodes, value);
        self.left -= 1;
        Some((key, value))
    }
}

/// Iterator over the value indexes of one list.
pub struct Elements<'t, 'a> {
    nodes: &'t Nodes<'a>,
    next: usize,
    left: usize,
}

impl Iterator for Elements<'_, '_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.left == 0 || self.next >= self.nodes.len() {
            return None;
        }
        let value = self.next;
        self.next = skip(self.nodes, value);
        self.left -= 1;
        Some(value)
    }
}

/// A short description of the value's kind, for messages ("a string", "an object").
pub fn kind(nodes: &Nodes<'_>, i: usize) -> &'static str {
    match nodes.get(i) {
        None => "nothing",
        Some(Node::String(_)) => "a string",
        Some(Node::Object { .. }) => "an object",
        Some(Node::Array { .. }) => "a list",
        Some(Node::Static(StaticNode::Null)) => "null",
        Some(Node::Static(StaticNode::Bool(_))) => "a boolean",
        Some(Node::Static(_)) => "a number",
    }
}

/// Appends `name` to a JSON pointer (RFC 6901 escaping of `~` and `/`).
pub fn push_pointer(pointer: &mut String, name: &str) {
    pointer.push('/');
    for c in name.chars() {
        match c {
            '~' => pointer.push_str("~0"),
            '/' => pointer.push_str("~1"),
            c => pointer.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tape(text: &str) -> Vec<u8> {
        text.as_bytes().to_vec()
    }

    #[test]
    fn skips_nested_values_in_one_step() {
        let mut buf = tape(r#"{"a":{"b":[1,2,{"c":3}]},"d":4}"#);
        with_parsed(&mut buf, 64, |nodes| {
            let found: Vec<_> = members(nodes, 0).unwrap().map(|(k, _)| k).collect();
            assert_eq!(found, ["a", "d"]);
            let d = member(nodes, 0, "d").unwrap();
            assert_eq!(nodes[d], Node::Static(StaticNode::I64(4)));
        })
        .unwrap();
    }

    #[test]
    fn first_non_list_descends_and_treats_empty_as_missing() {
        let mut buf = tape(r#"[[[{"x":1}]],[]]"#);
        with_parsed(&mut buf, 64, |nodes| {
            let inner = first_non_list(nodes, 0).unwrap();
            assert!(matches!(nodes[inner], Node::Object { .. }));
        })
        .unwrap();
        let mut buf = tape("[[]]");
        assert_eq!(with_parsed(&mut buf, 64, |nodes| first_non_list(nodes, 0)).unwrap(), None);
    }

    #[test]
    fn depth_limit_is_reported_as_such() {
        let mut ok = tape("[[[1]]]");
        assert!(with_parsed(&mut ok, 3, |_| ()).is_ok());
        let mut deep = tape("[[[[1]]]]");
        assert_eq!(with_parsed(&mut deep, 3, |_| ()).unwrap_err(), JsonError::TooDeep { limit: 3 });
    }

    #[test]
    fn syntax_errors_and_bad_utf8_are_errors() {
        for bad in [&b"{"[..], b"{\"a\":}", b"\"\xff\"", b"", b"nul", b"[1,]"] {
            let mut buf = bad.to_vec();
            assert!(matches!(with_parsed(&mut buf, 64, |_| ()), Err(JsonError::Syntax { .. })), "{bad:?}");
        }
    }

    #[test]
    fn huge_integers_parse_as_floats() {
        let mut buf = tape("123456789012345678901234567890");
        let is_float =
            with_parsed(&mut buf, 64, |nodes| matches!(nodes[0], Node::Static(StaticNode::F64(_))));
        assert_eq!(is_float, Ok(true));
    }

    #[test]
    fn nested_parses_work_and_the_input_keeps_its_length() {
        let mut outer = tape(r#"{"inner":"[1,2]"}"#);
        let inner_len = with_parsed(&mut outer, 8, |nodes| {
            let Some(Node::String(text)) = member(nodes, 0, "inner").map(|i| nodes[i]) else { panic!() };
            let mut inner = text.as_bytes().to_vec();
            with_parsed(&mut inner, 8, |nodes| nodes.len()).unwrap()
        })
        .unwrap();
        assert_eq!(inner_len, 3);
        assert_eq!(outer.len(), r#"{"inner":"[1,2]"}"#.len());
    }

    #[test]
    fn pointer_escapes_tilde_and_slash() {
        let mut p = String::new();
        push_pointer(&mut p, "a/b~c");
        assert_eq!(p, "/a~1b~0c");
    }
}
