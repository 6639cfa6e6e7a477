//! The executor's side of expressions (SPEC §1.8): running an [`Op::Expr`](crate::plan::Op) and
//! writing its value coerced by the target type, and finding the elements an `each` expression
//! gives.

use super::coerce::{self, coerce};
use crate::expr::{Arena, Doc as View, EvalError, Kind, Number, Program, Val, evaluate_with};
use crate::json::{Doc, Node, Nodes, StaticNode};
use crate::plan::Type;

/// What one call's expressions share: `$`, the arena their values are built in, and `$caller`.
pub(crate) struct Context<'v> {
    pub top: Val<'v>,
    pub arena: &'v Arena<'v>,
    pub caller: Val<'v>,
}

/// Runs `program` with `cur` as `@`.
pub(crate) fn run<'v>(
    program: &'v Program,
    nodes: &'v Nodes<'v>,
    context: &Context<'v>,
    cur: Val<'v>,
) -> Result<Val<'v>, EvalError> {
    evaluate_with(program, nodes, context.top, cur, context.arena, &[context.caller])
}

/// Writes `v` as a target of type `ty` would have it (SPEC §1.3–1.5, as a value read by one key);
/// `false` when it is empty and left out.
pub(crate) fn write_value(
    nodes: &Doc<'_, '_>,
    v: Val<'_>,
    ty: Type,
    ignore: bool,
    out: &mut Vec<u8>,
) -> bool {
    let view = View { nodes };
    match (ty, v.kind()) {
        (_, Kind::Null) => {
            if !ignore {
                out.extend_from_slice(b"null");
            }
            !ignore
        }
        (Type::Json, _) => {
            if ignore && is_empty(view, v) {
                return false;
            }
            match v {
                Val::TapeList(i) | Val::TapeObject(i) => crate::json::value(out, nodes, i),
                _ => view.write(out, v),
            }
            true
        }
        (_, Kind::Array) => {
            out.push(b'[');
            let mut written = 0;
            for element in view.items(v).into_iter().flatten() {
                let value = scalar(element).map_or(coerce::Coerced::Null, |node| coerce(&node, ty));
                if ignore && value.is_empty() {
                    continue;
                }
                if written > 0 {
                    out.push(b',');
                }
                value.write(out, nodes.backing());
                written += 1;
            }
            out.push(b']');
            written > 0 || !ignore
        }
        _ => {
            let value = scalar(v).map_or(coerce::Coerced::Null, |node| coerce(&node, ty));
            if ignore && value.is_empty() {
                return false;
            }
            value.write(out, nodes.backing());
            true
        }
    }
}

/// A scalar as the tape node it would be, for coercion; `None` for containers.
fn scalar(v: Val<'_>) -> Option<Node<'_>> {
    Some(match v {
        Val::Null => Node::Static(StaticNode::Null),
        Val::Bool(b) => Node::Static(StaticNode::Bool(b)),
        Val::Number(Number::Int(n)) => Node::Static(StaticNode::I64(n)),
        Val::Number(Number::UInt(n)) => Node::Static(StaticNode::U64(n)),
        Val::Number(Number::Float(f)) => Node::Static(StaticNode::F64(f)),
        Val::String(s) => Node::String(s),
        _ => return None,
    })
}

/// Empty as a whole (SPEC §1.4): null, a blank string, `[]` or `{}`.
fn is_empty(view: View<'_>, v: Val<'_>) -> bool {
    match v {
        Val::Null => true,
        Val::String(s) => coerce::is_blank(s),
        Val::Bool(_) | Val::Number(_) => false,
        _ => view.len(v) == Some(0),
    }
}

/// The tape index of a value of the document, if it is a container there.
pub(crate) fn tape_index(v: Val<'_>) -> Option<usize> {
    match v {
        Val::TapeList(i) | Val::TapeObject(i) => Some(i),
        _ => None,
    }
}
