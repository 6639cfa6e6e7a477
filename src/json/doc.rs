//! A parsed document as the engine reads it: its tape's nodes and the buffer their strings lie
//! in ([`Doc`]), and a value of it copied as compact JSON ([`value`]).

use smallvec::SmallVec;

use super::write::{Backing, scalar, string_in};
use simd_json::Node;

/// Nodes of a parsed document; value positions are indexes into this slice.
pub type Nodes<'a> = [Node<'a>];

/// A parsed document as [`with_parsed`] hands it out: its nodes (what it dereferences to) and the
/// buffer their strings point into, which lets the writer read those strings in whole chunks
/// ([`Backing`]).
pub struct Doc<'t, 'a> {
    pub(super) nodes: &'t Nodes<'a>,
    pub(super) backing: Backing<'a>,
    /// By node, the text of a float that the writer would write as that very text ("" for any
    /// other node; shorter than `nodes` when the last such float comes before their end). A text
    /// read on demand keeps these, so that such a float is copied, not formatted again; a parsed
    /// document has none.
    pub(super) floats: &'t [&'a str],
}

impl<'a> Doc<'_, 'a> {
    /// The buffer the document's strings point into.
    #[inline(always)]
    pub fn backing(&self) -> Backing<'a> {
        self.backing
    }

    /// The text of the float at node `i`, when the writer writes that float as exactly this text
    /// ([`super::write::canonical_decimal`]) and the document kept it.
    #[inline(always)]
    pub fn float_text(&self, i: usize) -> Option<&'a str> {
        self.floats.get(i).copied().filter(|text| !text.is_empty())
    }
}

impl<'a> std::ops::Deref for Doc<'_, 'a> {
    type Target = Nodes<'a>;

    #[inline(always)]
    fn deref(&self) -> &Nodes<'a> {
        self.nodes
    }
}

/// Spare capacity a buffer given to [`with_parsed`] should have beyond the document.
pub const PADDING: usize = simd_json::INPUT_PADDING;

/// Copies the value at `start` to `out` as compact JSON. Works iteratively, so nesting depth costs
/// heap (a small stack of open containers), never call-stack frames.
pub fn value(out: &mut Vec<u8>, doc: &Doc<'_, '_>, start: usize) {
    let (nodes, backing) = (&**doc, doc.backing());
    // Members (for objects) or elements (for lists) still to write in each open container.
    let mut open: SmallVec<[(bool, usize); 16]> = SmallVec::new();
    let mut i = start;
    loop {
        match nodes.get(i) {
            Some(Node::String(s)) => string_in(out, s, backing),
            Some(Node::Static(s)) => match doc.float_text(i) {
                Some(text) => out.extend_from_slice(text.as_bytes()),
                None => scalar(out, s),
            },
            Some(Node::Object { len, .. }) => {
                if *len > 0 && key(out, nodes, backing, i + 1, b'{') {
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
                if !key(out, nodes, backing, i, b',') {
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
fn key(out: &mut Vec<u8>, nodes: &[Node<'_>], backing: Backing<'_>, i: usize, lead: u8) -> bool {
    let Some(Node::String(name)) = nodes.get(i) else {
        return false;
    };
    out.push(lead);
    string_in(out, name, backing);
    out.push(b':');
    true
}
