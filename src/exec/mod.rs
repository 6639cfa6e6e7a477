//! The executor: runs a [`Plan`] over a parsed JSON document and writes the output JSON bytes
//! directly, with no value tree in between (SPEC §1.2–1.7).
//!
//! It does no IO and cannot fail: missing or odd data becomes `null` or is left out. Per-call
//! scratch (the slot table) lives in a bump arena that is reset, not freed, between calls.

mod coerce;
mod trace;

use std::cell::RefCell;

use bumpalo::Bump;

pub use trace::{TRACE_ELEMENTS, Trace, TraceEntry, execute_traced};

use crate::json::{self, Node, Nodes, write};
use crate::plan::{Input, KeyTable, Op, Plan, Read, SlotId, Span};
use crate::rules::Type;
use coerce::{coerce, text};

/// Slot content before a scan has found the member.
const MISSING: usize = usize::MAX;

/// Maps the document `nodes` (rooted at `root`) by `plan`, appending the output JSON to `out`.
pub fn execute(plan: &Plan, nodes: &Nodes<'_>, root: usize, out: &mut Vec<u8>) {
    with_arena(|arena| Run::new(plan, nodes, out, arena, &mut Silent).document(root));
}

/// Runs `f` with this thread's scratch arena, emptied first.
fn with_arena<R>(f: impl FnOnce(&Bump) -> R) -> R {
    thread_local! {
        static ARENA: RefCell<Bump> = RefCell::new(Bump::new());
    }
    ARENA.with(|arena| match arena.try_borrow_mut() {
        Ok(mut arena) => {
            arena.reset();
            f(&arena)
        }
        // Only reachable if an observer re-enters the executor; give it an arena of its own.
        Err(_) => f(&Bump::new()),
    })
}

/// What a traced run is told as it goes. The silent observer compiles to nothing.
pub(crate) trait Observer {
    const ACTIVE: bool;
    /// The `each` element with this index starts.
    fn element(&mut self, index: usize);
    /// Target `target` was evaluated on the object at `root`; `value` is its JSON when written,
    /// `None` when it was left out.
    fn target(&mut self, target: u32, root: usize, value: Option<&[u8]>);
}

struct Silent;

impl Observer for Silent {
    const ACTIVE: bool = false;
    #[inline(always)]
    fn element(&mut self, _: usize) {}
    #[inline(always)]
    fn target(&mut self, _: u32, _: usize, _: Option<&[u8]>) {}
}

/// One execution: the plan, the input, the output and the per-object slot table.
struct Run<'r, 'a, O> {
    plan: &'r Plan,
    nodes: &'r Nodes<'a>,
    out: &'r mut Vec<u8>,
    slots: &'r mut [usize],
    observer: &'r mut O,
}

impl<'r, 'a, O: Observer> Run<'r, 'a, O> {
    fn new(
        plan: &'r Plan,
        nodes: &'r Nodes<'a>,
        out: &'r mut Vec<u8>,
        arena: &'r Bump,
        observer: &'r mut O,
    ) -> Self {
        let slots = arena.alloc_slice_fill_copy(plan.slot_count, MISSING);
        Run { plan, nodes, out, slots, observer }
    }

    /// The whole output: one object, or with `each` a list of objects (SPEC §1.6).
    fn document(&mut self, root: usize) {
        let Some(path) = &self.plan.each else {
            self.object(root);
            return;
        };
        self.out.push(b'[');
        match each_list(self.nodes, root, path) {
            Some(list) if matches!(self.nodes.get(list), Some(Node::Array { .. })) => {
                let mut written = 0;
                for (index, element) in json::elements(self.nodes, list).into_iter().flatten().enumerate() {
                    self.observer.element(index);
                    let mark = self.out.len();
                    if written > 0 {
                        self.out.push(b',');
                    }
                    if self.object(element) || !self.plan.ignore_empty {
                        written += 1;
                    } else {
                        self.out.truncate(mark);
                    }
                }
            }
            Some(object) if matches!(self.nodes.get(object), Some(Node::Object { .. })) => {
                self.observer.element(0);
                let mark = self.out.len();
                if !self.object(object) && self.plan.ignore_empty {
                    self.out.truncate(mark);
                }
            }
            _ => {}
        }
        self.out.push(b']');
    }

    /// One output object built with `root` as the root. Returns whether any member was written.
    fn object(&mut self, root: usize) -> bool {
        self.slots.fill(MISSING);
        self.out.push(b'{');
        let mut written = 0;
        for op in &self.plan.ops {
            let (target, mark, value_start, kept) = match op {
                Op::Scan { input, table } => {
                    let from = match *input {
                        Input::Root => root,
                        Input::Slot(slot) => self.slot(slot),
                    };
                    if let Some(object) = json::first_non_list(self.nodes, from) {
                        self.scan(object, table);
                    }
                    continue;
                }
                // A missing field that would be left out costs no writing and taking back.
                Op::Field { target, read: Read::Slot(slot), .. }
                    if self.plan.ignore_empty && self.slot(*slot) == MISSING =>
                {
                    (*target, self.out.len(), self.out.len(), false)
                }
                Op::Field { target, ty, member, read } => {
                    let mark = self.out.len();
                    member.write(self.out, written == 0);
                    (*target, mark, self.out.len(), self.read(*ty, *read))
                }
                Op::Array { target, ty, member, reads } => {
                    let mark = self.out.len();
                    member.write(self.out, written == 0);
                    (*target, mark, self.out.len(), self.array(*ty, *reads))
                }
            };
            if kept {
                written += 1;
            } else {
                self.out.truncate(mark);
            }
            if O::ACTIVE {
                let value = if kept { self.out.get(value_start..) } else { None };
                self.observer.target(target, root, value);
            }
        }
        self.out.push(b'}');
        written > 0
    }

    /// The tape position a slot holds, or `MISSING`.
    #[inline]
    fn slot(&self, slot: SlotId) -> usize {
        self.slots.get(slot as usize).copied().unwrap_or(MISSING)
    }

    /// Records the slots of the members of `object` that `table` names. The first occurrence of
    /// a duplicated member wins, and the walk stops once every wanted member is found.
    #[inline(always)]
    fn scan(&mut self, object: usize, table: &KeyTable) {
        let Some(Node::Object { len, count }) = self.nodes.get(object) else {
            return;
        };
        let Some(members) = self.nodes.get(object + 1..object + 1 + count) else {
            return;
        };
        let mut wanted = table.len();
        let mut at = 0;
        for _ in 0..*len {
            let (Some(Node::String(name)), Some(value)) = (members.get(at), members.get(at + 1)) else {
                return;
            };
            if let Some(slot) = table.get(name.as_bytes())
                && let Some(found) = self.slots.get_mut(slot as usize)
                && *found == MISSING
            {
                *found = object + 2 + at;
                wanted -= 1;
                if wanted == 0 {
                    return;
                }
            }
            at += match value {
                Node::Object { count, .. } | Node::Array { count, .. } => 2 + count,
                _ => 2,
            };
        }
    }

    /// Writes one `keys` entry; `false` when it is empty and left out.
    #[inline]
    fn read(&mut self, ty: Type, read: Read) -> bool {
        match read {
            Read::Slot(slot) => self.value(ty, self.slot(slot)),
            Read::Concat(parts) => self.concat(parts),
        }
    }

    /// A single value (SPEC §1.3–1.5): coerced scalar, list of coerced elements, or raw `Json`.
    fn value(&mut self, ty: Type, at: usize) -> bool {
        let ignore = self.plan.ignore_empty;
        let Some(node) = self.nodes.get(at) else {
            if !ignore {
                self.out.extend_from_slice(b"null");
            }
            return !ignore;
        };
        match (ty, node) {
            // The most common target by far: text read as text, written as is.
            (Type::String, Node::String(s)) => {
                if ignore && coerce::is_blank(s) {
                    return false;
                }
                write::string(self.out, s);
                return true;
            }
            (Type::Json, _) => {
                if ignore && is_empty_value(self.nodes, at) {
                    return false;
                }
                write::value(self.out, self.nodes, at);
                return true;
            }
            (_, Node::Array { .. }) => return self.list(ty, at),
            _ => {}
        }
        let value = coerce(node, ty);
        if ignore && value.is_empty() {
            return false;
        }
        value.write(self.out);
        true
    }

    /// A list value: each element coerced; objects and lists inside fail to `null`.
    fn list(&mut self, ty: Type, at: usize) -> bool {
        let ignore = self.plan.ignore_empty;
        self.out.push(b'[');
        let mut written = 0;
        for element in json::elements(self.nodes, at).into_iter().flatten() {
            let value = self.nodes.get(element).map_or(coerce::Coerced::Null, |n| coerce(n, ty));
            if ignore && value.is_empty() {
                continue;
            }
            if written > 0 {
                self.out.push(b',');
            }
            value.write(self.out);
            written += 1;
        }
        self.out.push(b']');
        written > 0 || !ignore
    }

    /// `"a, b"`: the text of each part, trimmed, joined by one space; blank parts left out.
    fn concat(&mut self, parts: Span) -> bool {
        self.out.push(b'"');
        let mut written = 0;
        for &slot in self.plan.parts.get(parts.range()).unwrap_or_default() {
            let at = self.slot(slot);
            if let Some(piece) = self.nodes.get(at).and_then(text) {
                if written > 0 {
                    self.out.push(b' ');
                }
                piece.write_body(self.out);
                written += 1;
            }
        }
        self.out.push(b'"');
        written > 0 || !self.plan.ignore_empty
    }

    /// Several `keys` entries: a JSON array in entry order; empty entries dropped when ignoring.
    fn array(&mut self, ty: Type, reads: Span) -> bool {
        self.out.push(b'[');
        let mut written = 0;
        for &read in self.plan.reads.get(reads.range()).unwrap_or_default() {
            let mark = self.out.len();
            if written > 0 {
                self.out.push(b',');
            }
            if self.read(ty, read) {
                written += 1;
            } else {
                self.out.truncate(mark);
            }
        }
        self.out.push(b']');
        written > 0 || !self.plan.ignore_empty
    }
}

/// The value that an `each` path leads to: each step reads a member, following lists to their
/// first element on the way (SPEC §1.2); the value at the end is not followed.
fn each_list(nodes: &Nodes<'_>, root: usize, path: &[Box<str>]) -> Option<usize> {
    let mut at = root;
    for name in path {
        at = json::member(nodes, json::first_non_list(nodes, at)?, name)?;
    }
    Some(at)
}

/// Empty as a whole (SPEC §1.4): null, a blank string, `[]` or `{}`.
fn is_empty_value(nodes: &Nodes<'_>, at: usize) -> bool {
    match nodes.get(at) {
        None | Some(Node::Static(json::StaticNode::Null)) => true,
        Some(Node::String(s)) => coerce::is_blank(s),
        Some(Node::Object { len, .. } | Node::Array { len, .. }) => *len == 0,
        Some(Node::Static(_)) => false,
    }
}
