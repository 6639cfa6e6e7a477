//! One document made of several JSON texts (a composed route's answers, SPEC §2.3) without
//! writing them into one text: each text is parsed into a tape of its own, and the document's
//! tape is an object header, then each member's name and its value's nodes as they lie in that
//! text's tape. The executor and expressions read it as any other document.

use simd_json::{Node, StaticNode};

use super::{Doc, JsonError, PADDING, parser_words};

/// The value of one member of a composed document.
pub enum Member<'b> {
    /// A JSON text.
    Text(&'b mut Vec<u8>),
    Null,
    /// A list of values: texts, or `null` where there is none.
    List(Vec<Option<&'b mut Vec<u8>>>),
}

/// Why a composed document could not be made: the member whose text is not JSON, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberError {
    pub member: usize,
    pub error: JsonError,
}

/// Makes the object `{names[i]: members[i], ...}` and runs `f` on it. Each text is parsed with
/// `max_depth` less the levels the document adds above it, in place: a text is padded and its
/// strings unescaped, so it is not its JSON any more after.
pub fn with_members<R>(
    names: &[&str],
    members: Vec<Member<'_>>,
    max_depth: usize,
    f: impl FnOnce(&Doc<'_, '_>) -> R,
) -> Result<R, MemberError> {
    let mut nodes: Vec<Node<'_>> = Vec::with_capacity(1 + 2 * names.len());
    nodes.push(Node::Object { len: names.len(), count: 0 });
    for (i, (name, member)) in names.iter().zip(members).enumerate() {
        nodes.push(Node::String(name));
        let fail = |error| MemberError { member: i, error };
        match member {
            Member::Null => nodes.push(Node::Static(StaticNode::Null)),
            Member::Text(text) => {
                append(text, max_depth.saturating_sub(1), &mut nodes).map_err(fail)?;
            }
            Member::List(items) => {
                let header = nodes.len();
                let len = items.len();
                nodes.push(Node::Array { len, count: 0 });
                for item in items {
                    match item {
                        None => nodes.push(Node::Static(StaticNode::Null)),
                        Some(text) => {
                            append(text, max_depth.saturating_sub(2), &mut nodes).map_err(fail)?;
                        }
                    }
                }
                let count = nodes.len() - header - 1;
                nodes[header] = Node::Array { len, count };
            }
        }
    }
    let count = nodes.len() - 1;
    nodes[0] = Node::Object { len: names.len(), count };
    Ok(f(&Doc { nodes: &nodes, backing: super::write::Backing::NONE, floats: &[] }))
}

/// Parses `text` and appends its nodes. The padding the parser needs is added to the text and
/// taken off again.
fn append<'a>(text: &'a mut Vec<u8>, max_depth: usize, nodes: &mut Vec<Node<'a>>) -> Result<(), JsonError> {
    let len = text.len();
    text.resize(len + PADDING, b' ');
    let mut buffers = simd_json::Buffers::with_max_depth(len, max_depth.max(1));
    let mut tape = simd_json::Tape::null().reset();
    // The tape borrows the text for as long as the nodes are used; the padding stays on it.
    let parsed = simd_json::fill_tape_padded(text.as_mut_slice(), len, &mut buffers, &mut tape);
    match parsed {
        Ok(()) => {
            nodes.extend_from_slice(&tape.0);
            Ok(())
        }
        Err(e) if matches!(e.error(), simd_json::ErrorType::DepthLimitExceeded) => {
            Err(JsonError::TooDeep { limit: max_depth })
        }
        Err(e) => Err(JsonError::Syntax { what: parser_words(e.error()).to_owned(), at: Some(e.index()) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(names: &[&str], members: Vec<Member<'_>>) -> String {
        with_members(names, members, 64, |doc| {
            let mut out = Vec::new();
            super::super::write::value(&mut out, doc, 0);
            String::from_utf8(out).unwrap()
        })
        .unwrap()
    }

    #[test]
    fn members_are_spliced_into_one_object() {
        let mut a = br#"{"name":"Ada","tags":["x","y\n"]}"#.to_vec();
        let mut b = b"[1,2.5,{\"k\":null}]".to_vec();
        let mut c = b"\"text\"".to_vec();
        let out = written(
            &["user", "orders", "none", "list"],
            vec![
                Member::Text(&mut a),
                Member::Text(&mut b),
                Member::Null,
                Member::List(vec![Some(&mut c), None]),
            ],
        );
        assert_eq!(
            out,
            r#"{"user":{"name":"Ada","tags":["x","y\n"]},"orders":[1,2.5,{"k":null}],"none":null,"list":["text",null]}"#
        );
    }

    #[test]
    fn a_member_that_is_not_json_is_named() {
        let mut a = b"{}".to_vec();
        let mut b = b"{\"a\":".to_vec();
        let error = with_members(&["a", "b"], vec![Member::Text(&mut a), Member::Text(&mut b)], 64, |_| ())
            .unwrap_err();
        assert_eq!(error.member, 1);
        let mut deep = b"[[[[1]]]]".to_vec();
        let error = with_members(&["d"], vec![Member::Text(&mut deep)], 3, |_| ()).unwrap_err();
        assert!(matches!(error.error, JsonError::TooDeep { .. }), "{error:?}");
    }
}
