//! The executor: runs a [`Plan`] over a parsed JSON document and writes the output JSON bytes
//! directly, with no value tree in between (SPEC §1.2–1.7).
//!
//! It does no IO and cannot fail: missing or odd data becomes `null` or is left out. Per-call
//! scratch (the slot table) lives in a bump arena that is reset, not freed, between calls.

mod coerce;
mod expr;
mod trace;

use std::cell::RefCell;

use bumpalo::Bump;

pub use trace::{TRACE_ELEMENTS, Trace, TraceEntry, execute_traced, execute_traced_as};

use crate::expr::{Arena, Budget, Const, EvalError, EvalErrorKind, Kind, Val};
use crate::json::{self, Doc, Node, Nodes, write};
use crate::plan::Type;
use crate::plan::{Each, Input, KeyTable, Limit, Member, Op, Plan, Read, SlotId, Span};
use coerce::text;

/// Slot content before a scan has found the member.
const MISSING: usize = usize::MAX;

/// Maps the document `nodes` (rooted at `root`) by `plan`, appending the output JSON to `out`.
pub fn execute(plan: &Plan, nodes: &Doc<'_, '_>, root: usize, out: &mut Vec<u8>) -> Outcome {
    execute_as(plan, nodes, root, None, out)
}

/// [`execute`] for a call of `caller` (`$caller` in the rules' expressions, SPEC §2.4; `null`
/// when `None`).
pub fn execute_as(
    plan: &Plan,
    nodes: &Doc<'_, '_>,
    root: usize,
    caller: Option<&Const>,
    out: &mut Vec<u8>,
) -> Outcome {
    with_arena(|arena| {
        let mut scratch = Scratch::new(arena, plan);
        scratch.caller = caller;
        document(plan, nodes, root, &mut scratch, out, &mut Silent);
        scratch.outcome
    })
}

/// Reads the JSON text `input` and maps it by `plan`, appending the output to `out`: the way a
/// call maps an upstream answer. Only what the plan reads is turned into tape nodes
/// ([`json::ondemand`]) unless its expressions may read anything; the text is checked whole
/// either way, and refused (nested deeper than `max_depth`, not JSON) as the parser refuses it.
pub fn map_text(
    plan: &Plan,
    input: &mut Vec<u8>,
    max_depth: usize,
    out: &mut Vec<u8>,
) -> Result<Outcome, json::JsonError> {
    map_text_as(plan, input, max_depth, None, out)
}

/// [`map_text`] for a call of `caller` ([`execute_as`]).
pub fn map_text_as(
    plan: &Plan,
    input: &mut Vec<u8>,
    max_depth: usize,
    caller: Option<&Const>,
    out: &mut Vec<u8>,
) -> Result<Outcome, json::JsonError> {
    match &plan.wants {
        Some(wants) if wants.fills_slots() => map_rows(plan, wants, input, max_depth, caller, out),
        Some(wants) => {
            json::ondemand::with_read(input, wants, max_depth, |doc| execute_as(plan, doc, 0, caller, out))
        }
        None => json::with_parsed(input, max_depth, |doc| execute_as(plan, doc, 0, caller, out)),
    }
}

/// [`map_text`] for a plan whose reads are exactly its scans: the walk that reads the text fills
/// the scans' slots and hands over each object to map as soon as it is read
/// ([`json::ondemand::with_rows`]), which is mapped then, without its scans. Writes what
/// [`execute`] writes on the tape [`json::ondemand::with_read`] gives, and counts the same steps;
/// nothing when the text is refused.
fn map_rows(
    plan: &Plan,
    wants: &json::ondemand::Wants,
    input: &mut Vec<u8>,
    max_depth: usize,
    caller: Option<&Const>,
    out: &mut Vec<u8>,
) -> Result<Outcome, json::JsonError> {
    with_arena(|bump| {
        let start = out.len();
        let mut scratch = Scratch::new(bump, plan);
        scratch.caller = caller;
        let budget = Budget::new(plan.bounds.built_bytes, plan.bounds.steps);
        let arena = Arena::new(bump, &budget);
        scratch.answer_end = start.saturating_add(plan.bounds.answer_bytes);
        let each = plan.each.is_some();
        if each {
            out.push(b'[');
        }
        let (mut rows, mut written) = (0, 0);
        // Once a bound is met no more rows are wanted: the rest of the text is only checked.
        let read = json::ondemand::with_rows(input, wants, max_depth, &mut |doc, root, slots, steps| {
            if scratch.outcome.limit.is_some() {
                return false;
            }
            if rows == 0 {
                // As [`document`] has it: output as long as the text is paid for.
                scratch.paid_until = start.saturating_add(doc.backing().text_len());
            }
            rows += 1;
            let tape: &Nodes<'_> = doc;
            let context =
                expr::Context { top: Val::from_tape(tape, 0), arena: &arena, caller: scratch.caller() };
            let row = Some(Row { slots, steps });
            let cur = Val::from_tape(tape, root);
            if !each {
                object(plan, doc, root, cur, row, &context, &mut scratch, out, &mut Silent);
                return false;
            }
            list_element(plan, doc, root, cur, row, &context, &mut scratch, out, &mut Silent, &mut written);
            scratch.outcome.limit.is_none()
        });
        if each {
            out.push(b']');
        }
        scratch.outcome.steps = plan.bounds.steps - budget.steps_left();
        match read {
            Ok(()) => Ok(scratch.outcome),
            Err(refused) => {
                out.truncate(start);
                Err(refused)
            }
        }
    })
}

/// The slots of one object, filled by the walk that read the text, and the steps its scans
/// would have taken ([`json::ondemand::with_rows`]).
#[derive(Clone, Copy)]
struct Row<'r> {
    slots: &'r [usize],
    steps: u32,
}

const _: () = assert!(MISSING == json::ondemand::UNFILLED);

/// What a run reports beside its output: how its expressions fared (SPEC §1.8).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Expressions that failed while evaluating; each one's value was missing.
    pub expression_errors: u32,
    /// The bound of the plan's [`Bounds`](plan::Bounds) the run ran into: it stopped there, the
    /// output is not the mapping's, and the call fails (`mapping-limit`).
    pub limit: Option<Limit>,
    /// Steps of work it took (`RECAST_MAX_MAPPING_STEPS`).
    pub steps: u64,
}

impl Outcome {
    fn failed(&mut self, error: &EvalError) {
        match error.kind {
            EvalErrorKind::OverBudget(bound) => self.stopped(bound.into()),
            _ => self.expression_errors += 1,
        }
    }

    /// The run stops at `limit` (the first bound it met is the one reported).
    fn stopped(&mut self, limit: Limit) {
        self.limit.get_or_insert(limit);
    }
}

/// Per-call scratch of the executor, in the arena.
pub(crate) struct Scratch<'a> {
    arena: &'a Bump,
    /// The tape position each slot holds (`MISSING` until a scan finds its member).
    slots: &'a mut [usize],
    /// Per scan (the first [`SHAPE_SCANS`]), the members of the object it walked last. Made only
    /// for an `each` list of two or more elements.
    shapes: &'a mut [Shape],
    outcome: Outcome,
    /// The length the output may reach (`RECAST_MAX_RESPONSE_BYTES` past where it began).
    answer_end: usize,
    /// The length of output paid for: as long as the document's text for free, then a step per
    /// [`WRITTEN_BY_KEYS`] bytes as targets write (an expression's value is paid for by its
    /// own charge).
    paid_until: usize,
    /// `$caller` (SPEC §2.4); `None`: `null`.
    pub(crate) caller: Option<&'a Const>,
}

/// Bytes per step of the output written past the document's own length by targets that read
/// it by `keys`: text copied out with its escapes checked, a little faster than an expression's
/// value is written. A mapping that writes about as much as it reads pays nothing for writing;
/// one that writes many times what it reads stops at the step budget (at about 16 MiB past its
/// document by default), not only at the answer's bound.
const WRITTEN_BY_KEYS: u64 = 4;

/// Members per object whose names a scan remembers from one `each` element to the next.
const SHAPE_MEMBERS: usize = 64;

/// Scans that remember names; later scans look every name up. This bounds the memory a call
/// takes whatever the rules (a document may have thousands of scans): about 12 KiB.
const SHAPE_SCANS: usize = 8;

/// What a scan remembers of the object it walked last: its first `known` members, by the words
/// that identify their names, with the slot each one filled.
///
/// Elements of a list usually have the same members in the same order. While the members of the
/// next element match the remembered ones position by position, each fills the slot it filled
/// last time: no hashing, no probing, and no check that the slot is still empty. That is exact
/// because which slot a member fills (none, for a repeat of an earlier name) depends only on its
/// name and the names before it, and those are the ones of the last walk.
#[derive(Clone, Copy)]
struct Shape {
    known: usize,
    members: [RememberedMember; SHAPE_MEMBERS],
}

/// A member name at some position, by the words that identify it (names of up to 16 bytes), and
/// the slot it filled.
#[derive(Clone, Copy)]
struct RememberedMember {
    head: u64,
    tail: u64,
    len: u32,
    /// `NOT_TAKEN` when the member filled no slot: not wanted, or a repeat of an earlier name.
    slot: SlotId,
}

impl Shape {
    /// Nothing known. The placeholder entries are never read: only the first `known` are.
    const EMPTY: Shape = Shape {
        known: 0,
        members: [RememberedMember { head: 0, tail: 0, len: 0, slot: NOT_TAKEN }; SHAPE_MEMBERS],
    };
}

/// [`RememberedMember::slot`] of a member that filled no slot.
const NOT_TAKEN: SlotId = SlotId::MAX;

impl<'a> Scratch<'a> {
    pub(crate) fn new(arena: &'a Bump, plan: &Plan) -> Scratch<'a> {
        Scratch {
            arena,
            slots: arena.alloc_slice_fill_copy(plan.slot_count, MISSING),
            shapes: &mut [],
            outcome: Outcome::default(),
            answer_end: usize::MAX,
            paid_until: usize::MAX,
            caller: None,
        }
    }

    /// `$caller` as expressions read it.
    fn caller(&self) -> Val<'a> {
        self.caller.map_or(Val::Null, Val::from_const)
    }

    /// Makes the shape memory, for a list whose elements will be mapped one after another.
    fn remember_shapes(&mut self, plan: &Plan) {
        let scans = plan.scan_count.min(SHAPE_SCANS);
        self.shapes = self.arena.alloc_slice_fill_copy(scans, Shape::EMPTY);
    }
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
    /// The expression of `target` (of `each` for `None`) was run, and failed with `error` if any.
    /// For a target, this comes just before [`Observer::target`].
    fn expression(&mut self, _target: Option<u32>, _error: Option<&EvalError>) {}
    /// The expression of `target` (of `each` for `None`) left `count` elements out of a value it
    /// built (`group_by`'s null keys). Comes just before [`Observer::expression`].
    fn left_out(&mut self, _target: Option<u32>, _count: u64) {}
}

struct Silent;

impl Observer for Silent {
    const ACTIVE: bool = false;
    #[inline(always)]
    fn element(&mut self, _: usize) {}
    #[inline(always)]
    fn target(&mut self, _: u32, _: usize, _: Option<&[u8]>) {}
}

/// The whole output: one object, or with `each` a list of objects (SPEC §1.6).
pub(crate) fn document<O: Observer>(
    plan: &Plan,
    nodes: &Doc<'_, '_>,
    root: usize,
    scratch: &mut Scratch<'_>,
    out: &mut Vec<u8>,
    observer: &mut O,
) {
    let tape: &Nodes<'_> = nodes;
    let bump: &Bump = scratch.arena;
    let budget = Budget::new(plan.bounds.built_bytes, plan.bounds.steps);
    let arena = Arena::new(bump, &budget);
    let context = expr::Context { top: Val::from_tape(tape, root), arena: &arena, caller: scratch.caller() };
    scratch.answer_end = out.len().saturating_add(plan.bounds.answer_bytes);
    scratch.paid_until = out.len().saturating_add(nodes.backing().text_len());
    mapped(plan, nodes, root, &context, scratch, out, observer);
    scratch.outcome.steps = plan.bounds.steps - budget.steps_left();
}

/// The output of [`document`], within the call's bounds.
fn mapped<O: Observer>(
    plan: &Plan,
    nodes: &Doc<'_, '_>,
    root: usize,
    context: &expr::Context<'_>,
    scratch: &mut Scratch<'_>,
    out: &mut Vec<u8>,
    observer: &mut O,
) {
    let tape: &Nodes<'_> = nodes;
    let Some(each) = &plan.each else {
        object(plan, nodes, root, context.top, None, context, scratch, out, observer);
        return;
    };
    out.push(b'[');
    match each {
        Each::Path(path) => match each_list(nodes, root, path) {
            Some(list) if matches!(nodes.get(list), Some(Node::Array { .. })) => {
                let elements = json::elements(nodes, list).into_iter().flatten();
                let items = elements.map(|element| (element, Val::from_tape(tape, element)));
                elements_of(plan, nodes, items, context, scratch, out, observer);
            }
            Some(element) if matches!(nodes.get(element), Some(Node::Object { .. })) => {
                let items = std::iter::once((element, Val::from_tape(tape, element)));
                elements_of(plan, nodes, items, context, scratch, out, observer);
            }
            _ => {}
        },
        Each::Expr(program) => {
            let ran = expr::run(&plan.programs[*program as usize], tape, context, context.top);
            let left_out = context.arena.take_left_out();
            if O::ACTIVE && left_out > 0 {
                observer.left_out(None, left_out);
            }
            match ran {
                Err(error) => {
                    scratch.outcome.failed(&error);
                    observer.expression(None, Some(&error));
                }
                Ok(found) => {
                    observer.expression(None, None);
                    each_expression(plan, nodes, found, context, scratch, out, observer);
                }
            }
        }
    }
    out.push(b']');
}

/// The elements an `each` expression gave: those of a list, or an object alone. Elements that
/// are places in the document are mapped there; when the expression built some (a
/// multi-select) and the rules read them through slots (by `keys` or plain paths), the elements
/// and `$` are written out and parsed again, so that the scans can walk them as they walk the
/// document.
fn each_expression<O: Observer>(
    plan: &Plan,
    nodes: &Doc<'_, '_>,
    found: Val<'_>,
    context: &expr::Context<'_>,
    scratch: &mut Scratch<'_>,
    out: &mut Vec<u8>,
    observer: &mut O,
) {
    let tape: &Nodes<'_> = nodes;
    let view = crate::expr::Doc { nodes: tape };
    let elements: Vec<Val<'_>> = match found.kind() {
        Kind::Array => view.items(found).into_iter().flatten().collect(),
        Kind::Object => vec![found],
        _ => return,
    };
    let built =
        |v: &Val<'_>| matches!(v.kind(), Kind::Array | Kind::Object) && expr::tape_index(*v).is_none();
    if plan.slot_count == 0 || !elements.iter().any(built) {
        let items = elements.into_iter().map(|v| (expr::tape_index(v).unwrap_or(MISSING), v));
        elements_of(plan, nodes, items, context, scratch, out, observer);
        return;
    }
    // The elements were charged when they were built; their text is charged again for the
    // nodes its parse takes (a node per two bytes of text at most).
    let mut size = 2u64;
    for v in &elements {
        match context.arena.size(view, *v) {
            Ok(bytes) => size = size.saturating_add(bytes + 1),
            Err(bound) => return scratch.outcome.stopped(bound.into()),
        }
    }
    let parse = size.saturating_mul((std::mem::size_of::<Node<'_>>() / 2) as u64);
    // Written, then parsed (about four times faster than written).
    let work =
        crate::expr::steps_of_writing(size).saturating_add(size / (4 * crate::expr::cost::WRITTEN_BYTES));
    if let Err(bound) = context.arena.charge(parse).and_then(|()| context.arena.step(work)) {
        return scratch.outcome.stopped(bound.into());
    }
    let mut text = Vec::new();
    text.push(b'[');
    view.write(&mut text, context.top);
    text.extend_from_slice(b",[");
    for (n, v) in elements.iter().enumerate() {
        if n > 0 {
            text.push(b',');
        }
        view.write(&mut text, *v);
    }
    text.extend_from_slice(b"]]");
    // Deeper than the document's limit only by the two lists wrapped around it.
    let parsed = json::with_parsed(&mut text, 1 << 12, |again| {
        let tape: &Nodes<'_> = again;
        let (Some(top), Some(list)) = (
            json::elements(tape, 0).and_then(|mut e| e.next()),
            json::elements(tape, 0).and_then(|e| e.last()),
        ) else {
            return;
        };
        let context =
            expr::Context { top: Val::from_tape(tape, top), arena: context.arena, caller: context.caller };
        let items = json::elements(tape, list).into_iter().flatten().map(|i| (i, Val::from_tape(tape, i)));
        elements_of(plan, again, items, &context, scratch, out, observer);
    });
    debug_assert!(parsed.is_ok(), "values written by the engine parse again");
}

/// Maps each of `items` (its tape index, `MISSING` for a value not in the tape, and its value)
/// as one output element.
fn elements_of<'v, O: Observer>(
    plan: &Plan,
    nodes: &Doc<'_, '_>,
    items: impl Iterator<Item = (usize, Val<'v>)>,
    context: &expr::Context<'_>,
    scratch: &mut Scratch<'_>,
    out: &mut Vec<u8>,
    observer: &mut O,
) {
    let mut items = items.peekable();
    let mut written = 0;
    for index in 0.. {
        if scratch.outcome.limit.is_some() {
            break;
        }
        let Some((element, value)) = items.next() else { break };
        if index == 0 && items.peek().is_some() {
            scratch.remember_shapes(plan);
        }
        observer.element(index);
        list_element(plan, nodes, element, value, None, context, scratch, out, observer, &mut written);
    }
}

/// Writes one element of an `each` list as [`object`] maps it, after a comma when `written`
/// elements are before it; one that writes nothing is left out when the plan ignores empties.
#[allow(clippy::too_many_arguments)]
fn list_element<O: Observer>(
    plan: &Plan,
    nodes: &Doc<'_, '_>,
    root: usize,
    cur: Val<'_>,
    row: Option<Row<'_>>,
    context: &expr::Context<'_>,
    scratch: &mut Scratch<'_>,
    out: &mut Vec<u8>,
    observer: &mut O,
    written: &mut usize,
) {
    let mark = out.len();
    if *written > 0 {
        out.push(b',');
    }
    if object(plan, nodes, root, cur, row, context, scratch, out, observer) || !plan.ignore_empty {
        *written += 1;
    } else {
        out.truncate(mark);
    }
}

/// One output object built with `root` as the root (its tape index for `keys`, `MISSING` when
/// it is not in the tape; its value `cur` for expressions). With `row`, the walk that read the
/// text filled the slots, and the scans are not run. Returns whether any member was written.
#[allow(clippy::too_many_arguments)]
fn object<O: Observer>(
    plan: &Plan,
    nodes: &Doc<'_, '_>,
    root: usize,
    cur: Val<'_>,
    row: Option<Row<'_>>,
    context: &expr::Context<'_>,
    scratch: &mut Scratch<'_>,
    out: &mut Vec<u8>,
    observer: &mut O,
) -> bool {
    let ignore = plan.ignore_empty;
    let tape: &Nodes<'_> = nodes;
    let answer_end = scratch.answer_end;
    let Scratch { slots, shapes, outcome, paid_until, .. } = scratch;
    // A step per op of each object mapped, and per `keys` entry and part of a concatenation.
    if let Err(bound) = context.arena.step(plan.object_steps) {
        outcome.stopped(bound.into());
        return false;
    }
    let slots = &mut **slots;
    // With a row, the scans (the first ops: a plan whose slots the walk fills has no index step)
    // are done, and their steps are charged where the first of them would have been.
    let mut ops = plan.ops.iter();
    let mut scans_steps = None;
    match row {
        Some(row) if row.slots.len() == slots.len() => {
            slots.copy_from_slice(row.slots);
            scans_steps = Some(u64::from(row.steps));
            ops = plan.ops.get(plan.scan_count..).unwrap_or_default().iter();
        }
        _ => slots.fill(MISSING),
    }
    let mut shapes = shapes.iter_mut();
    out.push(b'{');
    let mut first = true;
    for op in ops {
        if out.len() > answer_end {
            outcome.stopped(Limit::Answer);
        }
        if let Err(bound) = pay_for_writing(out.len(), paid_until, context) {
            outcome.stopped(bound);
        }
        if outcome.limit.is_some() {
            break;
        }
        if let Some(steps) = scans_steps.take()
            && let Err(bound) = context.arena.step(steps)
        {
            outcome.stopped(bound.into());
            break;
        }
        // Where what an op writes by `keys` must stop: the answer's bound, or the output the
        // steps left pay for (found only by the ops that write many values).
        let steps_left = match op {
            Op::Concat { .. } | Op::Array { .. } => context.arena.budget().steps_left(),
            _ => 0,
        };
        let paid = *paid_until;
        let write_end = || {
            answer_end.min(paid.saturating_add(
                usize::try_from(steps_left.saturating_mul(WRITTEN_BY_KEYS)).unwrap_or(usize::MAX),
            ))
        };
        let target = MemberOut { out: &mut *out, first: &mut first, root, observer: &mut *observer };
        match op {
            Op::Scan { input, strict, table } => {
                let from = input_at(*input, root, slots);
                let shape = shapes.next();
                let object = if *strict { Some(from) } else { json::first_non_list(nodes, from) };
                // `scan` reads only an object, a step per member it may pass.
                if let Some(object) = object {
                    if let Some(Node::Object { len, .. }) = nodes.get(object)
                        && let Err(bound) = context.arena.step(*len as u64)
                    {
                        outcome.stopped(bound.into());
                        break;
                    }
                    scan(nodes, object, table, slots, shape);
                }
            }
            Op::Index { input, index, slot } => {
                // A step per element passed on the way.
                let found = element(nodes, input_at(*input, root, slots), *index, |passed| {
                    context.arena.step(passed as u64).map_err(|bound| outcome.stopped(bound.into())).is_ok()
                });
                if let Some(found) = found
                    && let Some(at) = slots.get_mut(*slot as usize)
                {
                    *at = found;
                }
            }
            Op::Text { target: id, slot, member } => {
                let at = slot_at(slots, *slot);
                if let Err(bound) = context.arena.step(read_steps(nodes, at)) {
                    outcome.stopped(bound.into());
                    break;
                }
                match nodes.get(at) {
                    Some(Node::String(text)) if !(ignore && coerce::is_blank(text)) => {
                        target.write(*id, member, |out| {
                            write::string_in(out, text, nodes.backing());
                            true
                        });
                    }
                    // Blank, or missing, and left out: nothing to write or take back.
                    Some(Node::String(_)) | None if ignore => target.left_out(*id),
                    _ => target.write(*id, member, |out| value(nodes, Type::String, at, ignore, out)),
                }
            }
            Op::Concat { parts, .. }
                if context.arena.step(parts_bytes(plan, nodes, *parts, slots)).is_err() =>
            {
                outcome.stopped(Limit::Steps);
                break;
            }
            Op::Concat { target: id, parts, member } => match text_pair(plan, nodes, *parts, slots) {
                // The usual concatenation, two pieces of text, is written in one step.
                Some((a, b)) if !ignore || !a.is_empty() || !b.is_empty() => {
                    target.write(*id, member, |out| {
                        write::joined_in(out, a, b, nodes.backing());
                        true
                    });
                }
                Some(_) => target.left_out(*id),
                None => target
                    .write(*id, member, |out| concat(plan, nodes, *parts, slots, ignore, write_end(), out)),
            },
            Op::Field { slot, .. }
                if context.arena.step(read_steps(nodes, slot_at(slots, *slot))).is_err() =>
            {
                outcome.stopped(Limit::Steps);
                break;
            }
            Op::Field { target: id, slot, .. } if ignore && slot_at(slots, *slot) == MISSING => {
                target.left_out(*id);
            }
            Op::Field { target: id, ty, slot, member } => {
                target.write(*id, member, |out| value(nodes, *ty, slot_at(slots, *slot), ignore, out));
            }
            Op::Array { reads, .. }
                if context.arena.step(reads_bytes(plan, nodes, *reads, slots)).is_err() =>
            {
                outcome.stopped(Limit::Steps);
                break;
            }
            Op::Array { target: id, ty, member, reads } => {
                target.write(*id, member, |out| {
                    array(plan, nodes, *ty, *reads, slots, ignore, write_end(), out)
                });
            }
            Op::Expr { target: id, ty, program, member } => {
                let ran = expr::run(&plan.programs[*program as usize], tape, context, cur);
                let left_out = context.arena.take_left_out();
                if O::ACTIVE && left_out > 0 {
                    target.observer.left_out(Some(*id), left_out);
                }
                let value = match ran {
                    Ok(value) => {
                        target.observer.expression(Some(*id), None);
                        value
                    }
                    Err(error) => {
                        outcome.failed(&error);
                        target.observer.expression(Some(*id), Some(&error));
                        Val::Null
                    }
                };
                // Once a bound is met the call fails, and nothing more is written.
                if outcome.limit.is_some() {
                    break;
                }
                // A value is measured before it is written: one that would pass the answer's
                // bound is not written at all.
                let view = crate::expr::Doc { nodes: tape };
                let size = context.arena.size(view, value);
                match size
                    .and_then(|size| context.arena.step(crate::expr::steps_of_writing(size)).map(|()| size))
                {
                    Ok(size) if size > answer_end.saturating_sub(target.out.len()) as u64 => {
                        outcome.stopped(Limit::Answer);
                        break;
                    }
                    Err(bound) => {
                        outcome.stopped(bound.into());
                        break;
                    }
                    Ok(_) => {}
                }
                if ignore && value.is_null() {
                    target.left_out(*id);
                } else {
                    target.write(*id, member, |out| expr::write_value(nodes, value, *ty, ignore, out));
                }
                // Paid for by the charge of its writing above.
                *paid_until = (*paid_until).max(out.len());
            }
        }
    }
    if out.len() > answer_end {
        outcome.stopped(Limit::Answer);
    }
    if let Err(bound) = pay_for_writing(out.len(), paid_until, context) {
        outcome.stopped(bound);
    }
    out.push(b'}');
    !first
}

/// Charges the output written past `paid_until` (a step per [`WRITTEN_BY_KEYS`] bytes) and moves
/// it to `written`.
fn pay_for_writing(written: usize, paid_until: &mut usize, context: &expr::Context<'_>) -> Result<(), Limit> {
    if written <= *paid_until {
        return Ok(());
    }
    let steps = ((written - *paid_until) as u64).div_ceil(WRITTEN_BY_KEYS);
    *paid_until = written;
    context.arena.step(steps).map_err(Limit::from)
}

/// Where one target is written: a member of the output object being built.
struct MemberOut<'o, O> {
    out: &'o mut Vec<u8>,
    /// Whether no member is written yet.
    first: &'o mut bool,
    root: usize,
    observer: &'o mut O,
}

impl<O: Observer> MemberOut<'_, O> {
    /// Writes target `id`: its member name, then its value by `value`, which says whether the
    /// value is kept; when it is not, both are taken back.
    #[inline(always)]
    fn write(self, id: u32, member: &Member, value: impl FnOnce(&mut Vec<u8>) -> bool) {
        let mark = self.out.len();
        member.write(self.out, *self.first);
        let start = self.out.len();
        let kept = value(self.out);
        if kept {
            *self.first = false;
        } else {
            self.out.truncate(mark);
        }
        if O::ACTIVE {
            self.observer.target(id, self.root, if kept { self.out.get(start..) } else { None });
        }
    }

    /// Target `id` is left out without writing anything.
    #[inline(always)]
    fn left_out(self, id: u32) {
        if O::ACTIVE {
            self.observer.target(id, self.root, None);
        }
    }
}

/// The tape position a slot holds, or `MISSING`.
#[inline(always)]
fn slot_at(slots: &[usize], slot: SlotId) -> usize {
    slots.get(slot as usize).copied().unwrap_or(MISSING)
}

/// The tape position a scan or an index step reads.
#[inline(always)]
fn input_at(input: Input, root: usize, slots: &[usize]) -> usize {
    match input {
        Input::Root => root,
        Input::Slot(slot) => slot_at(slots, slot),
    }
}

/// The tape position of the element at `index` (from the end when negative) of the list at
/// `list`, if it is a list that has one.
fn element(nodes: &Nodes<'_>, list: usize, index: i64, pass: impl FnOnce(usize) -> bool) -> Option<usize> {
    let Some(&Node::Array { len, .. }) = nodes.get(list) else { return None };
    let at = if index < 0 { (len as i64).checked_add(index)? } else { index };
    let at = usize::try_from(at).ok().filter(|&at| at < len)?;
    if !pass(at) {
        return None;
    }
    json::elements(nodes, list)?.nth(at)
}

/// Steps of reading the texts of a concatenation's `parts` (trimmed, told blank or not): one per
/// 64 bytes of each.
fn parts_bytes(plan: &Plan, nodes: &Nodes<'_>, parts: Span, slots: &[usize]) -> u64 {
    plan.parts
        .get(parts.range())
        .unwrap_or_default()
        .iter()
        .fold(0u64, |sum, &slot| sum.saturating_add(read_steps(nodes, slot_at(slots, slot))))
}

/// Steps of reading the texts of several `keys` entries ([`parts_bytes`]).
fn reads_bytes(plan: &Plan, nodes: &Nodes<'_>, reads: Span, slots: &[usize]) -> u64 {
    plan.reads.get(reads.range()).unwrap_or_default().iter().fold(0u64, |sum, read| {
        sum.saturating_add(match *read {
            Read::Slot(slot) => read_steps(nodes, slot_at(slots, slot)),
            Read::Concat(parts) => parts_bytes(plan, nodes, parts, slots),
        })
    })
}

/// Steps of reading the value at `at` as a target does (a text trimmed or told blank, each
/// element of a list converted): one per 64 bytes of a text, one per value inside a list or an
/// object. What is written is bounded by the answer's bytes; this bounds what is read and
/// left out.
#[inline]
fn read_steps(nodes: &Nodes<'_>, at: usize) -> u64 {
    match nodes.get(at) {
        Some(Node::String(text)) => crate::expr::steps_of_bytes(text.len()),
        Some(Node::Array { count, .. } | Node::Object { count, .. }) => *count as u64,
        _ => 0,
    }
}

/// Records the slots of the members of `object` that `table` names. The first occurrence of a
/// duplicated member wins, and the walk stops once every wanted member is found.
///
/// With a `shape` (the scan's memory of the object it walked in the previous `each` element), the
/// members are first followed along the remembered ones; from the first member that differs on,
/// names are looked up in the table and remembered anew.
#[inline(always)]
fn scan(nodes: &Nodes<'_>, object: usize, table: &KeyTable, slots: &mut [usize], shape: Option<&mut Shape>) {
    let Some(Node::Object { len, count }) = nodes.get(object) else {
        return;
    };
    // The tape up to the object's end: member positions below are tape positions.
    let Some(nodes) = nodes.get(..object + 1 + count) else {
        return;
    };
    let mut walk = Walk { at: object + 1, position: 0, wanted: table.len() };
    match shape {
        None => {
            look_up(nodes, *len, table, slots, &walk, &mut []);
        }
        Some(shape) => {
            let known = shape.known.min(*len);
            let remembered = shape.members.get(..known).unwrap_or_default();
            if follow(nodes, remembered, slots, &mut walk) && walk.position < *len {
                shape.known = look_up(nodes, *len, table, slots, &walk, &mut shape.members);
            }
        }
    }
}

/// Where a [`scan`] is: the tape position of the next member's name, that member's position in
/// the object, and how many wanted members are still to be found.
struct Walk {
    at: usize,
    position: usize,
    wanted: usize,
}

/// Walks the members that match the `remembered` ones, position by position, each filling the
/// slot it filled last time. Returns whether the walk goes on: it stops early when every wanted
/// member is found (or the tape is not an object's).
#[inline(never)]
fn follow(nodes: &[Node<'_>], remembered: &[RememberedMember], slots: &mut [usize], walk: &mut Walk) -> bool {
    // Locals rather than the fields: the loop keeps them in registers.
    let mut at = walk.at;
    let mut wanted = walk.wanted;
    let mut expected = remembered.iter();
    while let Some(seen) = expected.next() {
        let Some([Node::String(name), value]) = nodes.get(at..at + 2) else {
            return false;
        };
        let name = name.as_bytes();
        if name.len() != seen.len as usize || json::keys::words(name) != (seen.head, seen.tail) {
            *walk = Walk { at, position: remembered.len() - expected.len() - 1, wanted };
            return true;
        }
        if seen.slot != NOT_TAKEN {
            if let Some(found) = slots.get_mut(seen.slot as usize) {
                *found = at + 1;
            }
            wanted -= 1;
            if wanted == 0 {
                return false;
            }
        }
        at += skip(value);
    }
    *walk = Walk { at, position: remembered.len(), wanted };
    true
}

/// Walks the members from where `walk` is to the end (of `len`), looking each name up in the
/// table. Remembers in `remember` each member it meets, as long as it can (a name of up to 16
/// bytes, at a position the memory has), and returns the number of leading positions that
/// `remember` then holds as this walk saw them.
#[inline(never)]
fn look_up(
    nodes: &[Node<'_>],
    len: usize,
    table: &KeyTable,
    slots: &mut [usize],
    walk: &Walk,
    remember: &mut [RememberedMember],
) -> usize {
    let Walk { mut at, mut position, mut wanted } = *walk;
    let mut known = position;
    while position < len {
        let Some([Node::String(name), value]) = nodes.get(at..at + 2) else {
            break;
        };
        let name = name.as_bytes();
        let (head, tail) = json::keys::words(name);
        let mut taken = NOT_TAKEN;
        if let Some(slot) = table.get_words(name, head, tail)
            && let Some(found) = slots.get_mut(slot as usize)
            && *found == MISSING
        {
            *found = at + 1;
            taken = slot;
            wanted -= 1;
        }
        if known == position
            && name.len() <= 16
            && let Some(seen) = remember.get_mut(position)
        {
            *seen = RememberedMember { head, tail, len: name.len() as u32, slot: taken };
            known += 1;
        }
        if wanted == 0 {
            break;
        }
        at += skip(value);
        position += 1;
    }
    known
}

/// Tape nodes from a member's value to the next member's name.
#[inline(always)]
fn skip(value: &Node<'_>) -> usize {
    match value {
        Node::Object { count, .. } | Node::Array { count, .. } => 2 + count,
        _ => 2,
    }
}

/// One `keys` entry of an array target; `false` when it is empty and left out.
#[allow(clippy::too_many_arguments)]
fn read(
    plan: &Plan,
    nodes: &Doc<'_, '_>,
    ty: Type,
    read: Read,
    slots: &[usize],
    ignore: bool,
    answer_end: usize,
    out: &mut Vec<u8>,
) -> bool {
    match read {
        Read::Slot(slot) => value(nodes, ty, slot_at(slots, slot), ignore, out),
        Read::Concat(parts) => concat(plan, nodes, parts, slots, ignore, answer_end, out),
    }
}

/// A single value (SPEC §1.3–1.5): coerced scalar, list of coerced elements, or raw `Json`.
fn value(nodes: &Doc<'_, '_>, ty: Type, at: usize, ignore: bool, out: &mut Vec<u8>) -> bool {
    let Some(node) = nodes.get(at) else {
        if !ignore {
            out.extend_from_slice(b"null");
        }
        return !ignore;
    };
    match (ty, node) {
        (Type::String, Node::String(s)) => {
            if ignore && coerce::is_blank(s) {
                return false;
            }
            write::string_in(out, s, nodes.backing());
            return true;
        }
        (Type::Json, _) => {
            if ignore && is_empty_value(nodes, at) {
                return false;
            }
            crate::json::value(out, nodes, at);
            return true;
        }
        (_, Node::Array { .. }) => return list(nodes, ty, at, ignore, out),
        _ => {}
    }
    let value = coerce::coerce_at(nodes, at, node, ty);
    if ignore && value.is_empty() {
        return false;
    }
    value.write(out, nodes.backing());
    true
}

/// A list value: each element coerced; objects and lists inside fail to `null`.
fn list(nodes: &Doc<'_, '_>, ty: Type, at: usize, ignore: bool, out: &mut Vec<u8>) -> bool {
    out.push(b'[');
    let mut written = 0;
    for element in json::elements(nodes, at).into_iter().flatten() {
        let value =
            nodes.get(element).map_or(coerce::Coerced::Null, |n| coerce::coerce_at(nodes, element, n, ty));
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

/// `"a, b"`: the text of each part, trimmed, joined by one space; blank parts left out. (A
/// `Concat` target of two text parts is written through [`text_pair`] instead.)
fn concat(
    plan: &Plan,
    nodes: &Doc<'_, '_>,
    parts: Span,
    slots: &[usize],
    ignore: bool,
    answer_end: usize,
    out: &mut Vec<u8>,
) -> bool {
    out.push(b'"');
    let empty = out.len();
    for &slot in plan.parts.get(parts.range()).unwrap_or_default() {
        // Past the answer's bound: the op stops, and the run after it.
        if out.len() > answer_end {
            break;
        }
        match nodes.get(slot_at(slots, slot)) {
            // Text, the usual part, is written with its separator in one step: the string case
            // of `text` written out here, so the usual part skips its dispatch.
            Some(Node::String(s)) => {
                let s = coerce::trim(s);
                if s.is_empty() {
                    continue;
                }
                if out.len() == empty {
                    write::string_body(out, s, nodes.backing());
                } else {
                    write::string_body_after(out, b' ', s, nodes.backing());
                }
            }
            Some(node) => {
                let float = nodes.float_text(slot_at(slots, slot)).map(coerce::Text::Digits);
                if let Some(piece) = float.or_else(|| text(node)) {
                    if out.len() > empty {
                        out.push(b' ');
                    }
                    piece.write_body(out, nodes.backing());
                }
            }
            None => {}
        }
    }
    let written = out.len() > empty;
    out.push(b'"');
    written || !ignore
}

/// The usual concatenation, two parts that are both text: their trimmed text, which
/// [`write::joined_in`] writes in one step.
#[inline(always)]
fn text_pair<'n>(
    plan: &Plan,
    nodes: &'n Doc<'_, '_>,
    parts: Span,
    slots: &[usize],
) -> Option<(&'n str, &'n str)> {
    let &[a, b] = plan.parts.get(parts.range())? else {
        return None;
    };
    match (nodes.get(slot_at(slots, a)), nodes.get(slot_at(slots, b))) {
        (Some(Node::String(a)), Some(Node::String(b))) => Some((coerce::trim(a), coerce::trim(b))),
        _ => None,
    }
}

/// Several `keys` entries: a JSON array in entry order; empty entries dropped when ignoring.
#[allow(clippy::too_many_arguments)]
fn array(
    plan: &Plan,
    nodes: &Doc<'_, '_>,
    ty: Type,
    reads: Span,
    slots: &[usize],
    ignore: bool,
    answer_end: usize,
    out: &mut Vec<u8>,
) -> bool {
    out.push(b'[');
    let mut written = 0;
    for &entry in plan.reads.get(reads.range()).unwrap_or_default() {
        // Past the answer's bound: the op stops, and the run after it.
        if out.len() > answer_end {
            break;
        }
        let mark = out.len();
        if written > 0 {
            out.push(b',');
        }
        if read(plan, nodes, ty, entry, slots, ignore, answer_end, out) {
            written += 1;
        } else {
            out.truncate(mark);
        }
    }
    out.push(b']');
    written > 0 || !ignore
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

#[cfg(test)]
mod tests {
    use crate::json::with_parsed;
    use crate::rules::{Limits, compile_json};

    /// Maps `input` with `each: ["items"]` rules whose targets read the given keys (each target is
    /// named after its key, type `Json`), keeping empty values.
    fn map_items(keys: &[&str], parents: &str, input: &str) -> String {
        let new: Vec<String> =
            keys.iter().map(|k| format!(r#""{k}":{{"key":"{k}","type":"Json"}}"#)).collect();
        let old: Vec<String> =
            keys.iter().map(|k| format!(r#""{k}":{{"keys":["{k}"],"parents":[{parents}]}}"#)).collect();
        let rules = format!(
            r#"{{"each":["items"],"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}"#,
            new.join(","),
            old.join(",")
        );
        let plan = compile_json(rules.as_bytes(), &Limits::default()).expect("rules compile").plan;
        let mut buf = input.as_bytes().to_vec();
        let mut out = Vec::new();
        with_parsed(&mut buf, 64, |nodes| super::execute(&plan, nodes, 0, &mut out)).expect("JSON");
        String::from_utf8(out).expect("UTF-8")
    }

    #[test]
    fn elements_with_other_members_at_a_remembered_position_are_read_right() {
        // Reordered members, a member that is not wanted where a wanted one was, and back.
        let out = map_items(
            &["a", "b"],
            "",
            r#"{"items":[{"a":1,"b":2},{"b":3,"a":4},{"x":0,"a":5},{"a":6,"b":7}]}"#,
        );
        assert_eq!(out, r#"[{"a":1,"b":2},{"a":4,"b":3},{"a":5,"b":null},{"a":6,"b":7}]"#);
    }

    #[test]
    fn long_names_with_the_same_words_are_never_taken_for_each_other() {
        // 19 bytes each, equal in their first and last eight bytes and in length.
        let (x, y) = ("aaaaaaaa_X_zzzzzzzz", "aaaaaaaa_Y_zzzzzzzz");
        let input = format!(r#"{{"items":[{{"{x}":1}},{{"{y}":2}},{{"{x}":3}}]}}"#);
        let out = map_items(&[x], "", &input);
        assert_eq!(out, format!(r#"[{{"{x}":1}},{{"{x}":null}},{{"{x}":3}}]"#));
    }

    #[test]
    fn a_repeated_name_after_a_matching_prefix_does_not_take_the_slot_again() {
        // The second element matches the first at position 0, then repeats `a` where `b` was;
        // the third repeats `b`; the fourth is the first again.
        let out = map_items(
            &["a", "b"],
            "",
            r#"{"items":[{"a":1,"b":2},{"a":3,"a":4},{"a":5,"b":6,"b":7},{"a":8,"b":9}]}"#,
        );
        assert_eq!(out, r#"[{"a":1,"b":2},{"a":3,"b":null},{"a":5,"b":6},{"a":8,"b":9}]"#);
    }

    #[test]
    fn a_long_name_ends_what_is_remembered_and_later_members_are_still_found() {
        let long = "a member name of 24 bytes";
        let element = |n: u32| format!(r#"{{"a":{n},"{long}":{},"b":{}}}"#, n + 1, n + 2);
        let input = format!(r#"{{"items":[{},{},{}]}}"#, element(0), element(10), element(20));
        let out = map_items(&["b", long, "a"], "", &input);
        let expected = |n: u32| format!(r#"{{"b":{},"{long}":{},"a":{n}}}"#, n + 2, n + 1);
        assert_eq!(out, format!("[{},{},{}]", expected(0), expected(10), expected(20)));
    }

    #[test]
    fn duplicate_members_keep_the_first_in_every_element() {
        let out = map_items(&["a"], "", r#"{"items":[{"a":1,"a":2},{"a":3,"a":4},{"b":0,"a":5,"a":6}]}"#);
        assert_eq!(out, r#"[{"a":1},{"a":3},{"a":5}]"#);
    }

    #[test]
    fn members_beyond_the_remembered_positions_are_found() {
        let element = |n: usize| {
            let members: Vec<String> = (0..70).map(|i| format!(r#""m{i}":{}"#, i * 100 + n)).collect();
            format!("{{{}}}", members.join(","))
        };
        let input = format!(r#"{{"items":[{},{},{}]}}"#, element(1), element(2), element(3));
        let out = map_items(&["m66", "m3", "m69"], "", &input);
        assert_eq!(
            out,
            r#"[{"m66":6601,"m3":301,"m69":6901},{"m66":6602,"m3":302,"m69":6902},{"m66":6603,"m3":303,"m69":6903}]"#
        );
    }

    #[test]
    fn rules_with_more_scans_than_are_remembered_still_map_every_element() {
        // Twelve `parents` prefixes: twelve scans below the element's own, more than SHAPE_SCANS.
        let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
        let new: Vec<String> =
            keys.iter().map(|k| format!(r#""{k}":{{"key":"{k}","type":"Int"}}"#)).collect();
        let old: Vec<String> =
            keys.iter().map(|k| format!(r#""{k}":{{"keys":["v"],"parents":["{k}"]}}"#)).collect();
        let rules = format!(
            r#"{{"each":["items"],"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}"#,
            new.join(","),
            old.join(",")
        );
        let plan = compile_json(rules.as_bytes(), &Limits::default()).expect("rules compile").plan;
        assert!(plan.scan_count > super::SHAPE_SCANS, "{} scans", plan.scan_count);
        let element = |n: usize| {
            let members: Vec<String> =
                keys.iter().enumerate().map(|(i, k)| format!(r#""{k}":{{"v":{}}}"#, n + i)).collect();
            format!("{{{}}}", members.join(","))
        };
        let mut buf = format!(r#"{{"items":[{},{}]}}"#, element(0), element(100)).into_bytes();
        let mut out = Vec::new();
        with_parsed(&mut buf, 64, |nodes| super::execute(&plan, nodes, 0, &mut out)).expect("JSON");
        let expected = |n: usize| {
            let members: Vec<String> =
                keys.iter().enumerate().map(|(i, k)| format!(r#""{k}":{}"#, n + i)).collect();
            format!("{{{}}}", members.join(","))
        };
        assert_eq!(String::from_utf8(out).unwrap(), format!("[{},{}]", expected(0), expected(100)));
    }
}

/// Rules whose sources are expressions (SPEC §1.8), run through the whole executor.
#[cfg(test)]
mod filled_slots_tests {
    use crate::json::{ondemand, with_parsed};
    use crate::rules::{Limits, compile_json};

    /// Maps `input` by `rules` three ways: as a call does (`map_text`: with the slots the
    /// walk fills, each object mapped as it is read, when `fills`), by the executor's own scans on
    /// the tape the same reads give (`with_read`), and on the whole parse. Asserts that all three
    /// write the same bytes (the first two also when a bound stops them), that the first two
    /// report the same outcome (steps included, unless stopped), and that the plan's reads fill
    /// slots exactly when `fills` says; returns the output and outcome.
    fn mapped(rules: &str, input: &str, fills: bool, limits: &Limits) -> (String, super::Outcome) {
        let plan = compile_json(rules.as_bytes(), limits).unwrap_or_else(|p| panic!("{p:?}")).plan;
        let wants = plan.wants().expect("read on demand");
        assert_eq!(wants.fills_slots(), fills, "{rules}");
        let (mut filled, mut scanned, mut whole) = (Vec::new(), Vec::new(), Vec::new());
        let called = super::map_text(&plan, &mut input.as_bytes().to_vec(), 64, &mut filled).expect("JSON");
        let read = ondemand::with_read(&mut input.as_bytes().to_vec(), wants, 64, |doc| {
            super::execute(&plan, doc, 0, &mut scanned)
        })
        .expect("JSON");
        with_parsed(&mut input.as_bytes().to_vec(), 64, |doc| super::execute(&plan, doc, 0, &mut whole))
            .expect("JSON");
        let [filled, scanned, whole] = [filled, scanned, whole].map(|o| String::from_utf8(o).expect("UTF-8"));
        assert_eq!(filled, scanned, "{rules} on {input}");
        if called.limit.is_none() {
            assert_eq!(called, read, "{rules} on {input}");
            assert_eq!(filled, whole, "{rules} on {input}");
        } else {
            // Stopped at the same object, for the same bound (the scans' steps are charged
            // together, so the steps counted up to the stop may differ).
            assert_eq!(called.limit, read.limit, "{rules} on {input}");
        }
        (filled, called)
    }

    /// Rules with `each` (when given) and targets `id` (Json, by `keys`) and `name` and `email`
    /// (Json, under `parents: ["owner"]`).
    fn rules(each: Option<&str>) -> String {
        let each = each.map_or(String::new(), |path| format!(r#""each":{path},"#));
        format!(
            r#"{{{each}"newBodyFields":{{"id":{{"key":"id","type":"Json"}},"name":{{"key":"name","type":"Json"}},"email":{{"key":"email","type":"Json"}}}},"oldBodyFields":{{"id":{{"keys":["id"]}},"name":{{"keys":["name"],"parents":["owner"]}},"email":{{"keys":["email"],"parents":["owner"]}}}}}}"#
        )
    }

    #[test]
    fn the_walk_fills_the_slots_the_scans_would_and_only_there() {
        let items = rules(Some(r#"["items"]"#));
        let cases = [
            // Repeated names: the first of each in an object fills its slot, and only what
            // lies under it fills the slots below.
            (
                items.as_str(),
                r#"{"items":[{"id":1,"id":2,"owner":{"name":"a"},"owner":{"name":"b","email":"x"}},{"owner":{"email":"y"},"id":3}]}"#,
                r#"[{"id":1,"name":"a","email":null},{"id":3,"name":null,"email":"y"}]"#,
            ),
            // Lists followed to their first element, which may be a list, empty, or not an object.
            (
                items.as_str(),
                r#"{"items":[{"owner":[[{"name":"a"}],{"name":"b"}]},{"owner":[[],{"name":"c"}]},{"owner":[1,{"name":"d"}]},{"owner":[{"email":"e"},{"name":"f"}]}]}"#,
                r#"[{"id":null,"name":"a","email":null},{"id":null,"name":null,"email":null},{"id":null,"name":null,"email":null},{"id":null,"name":null,"email":"e"}]"#,
            ),
            // Elements that are not objects, or lists of them, are rows too.
            (
                items.as_str(),
                r#"{"items":[1,null,[{"id":4},{"id":9}],{"id":5},[],"x"]}"#,
                r#"[{"id":null,"name":null,"email":null},{"id":null,"name":null,"email":null},{"id":4,"name":null,"email":null},{"id":5,"name":null,"email":null},{"id":null,"name":null,"email":null},{"id":null,"name":null,"email":null}]"#,
            ),
            // The first member on the `each` path is followed, whatever it holds.
            (items.as_str(), r#"{"items":5,"items":[{"id":1}]}"#, "[]"),
            (
                items.as_str(),
                r#"{"items":[{"id":1}],"items":[{"id":2}]}"#,
                r#"[{"id":1,"name":null,"email":null}]"#,
            ),
            // An object there is the one row.
            (
                items.as_str(),
                r#"{"items":{"id":6,"owner":{"name":"g"}}}"#,
                r#"[{"id":6,"name":"g","email":null}]"#,
            ),
            // Escaped names are matched as the scans match them.
            (
                items.as_str(),
                r#"{"i\u0074ems":[{"i\u0064":7,"\u006fwner":{"name":"h"}}]}"#,
                r#"[{"id":7,"name":"h","email":null}]"#,
            ),
            (items.as_str(), r#"{"items":[]}"#, "[]"),
            // Strings with escapes (a row handed over on a copy of its nodes) beside floats
            // copied as written, in rows before and after.
            (
                items.as_str(),
                r#"{"items":[{"id":12.25},{"id":"a\nb","owner":{"name":"x\"y","email":1.5}},{"id":"\u00e9"},{"owner":{"email":2.75}}]}"#,
                r#"[{"id":12.25,"name":null,"email":null},{"id":"a\nb","name":"x\"y","email":1.5},{"id":"é","name":null,"email":null},{"id":null,"name":null,"email":2.75}]"#,
            ),
        ];
        for (rules, input, expected) in cases {
            assert_eq!(mapped(rules, input, true, &Limits::default()).0, expected, "{input}");
        }
        // A path through lists: each name is looked up in the first element.
        let path = rules(Some(r#"["data","items"]"#));
        let input = r#"{"data":[{"items":[{"id":1},{"id":2}]},{"items":[{"id":3}]}]}"#;
        let expected = r#"[{"id":1,"name":null,"email":null},{"id":2,"name":null,"email":null}]"#;
        assert_eq!(mapped(&path, input, true, &Limits::default()).0, expected);
        // Without `each` the document is the one row, a list followed to its first element.
        let plain = rules(None);
        assert_eq!(
            mapped(&plain, r#"[{"id":1,"owner":[{"name":"a"}]},{"id":2}]"#, true, &Limits::default()).0,
            r#"{"id":1,"name":"a","email":null}"#
        );
        assert_eq!(
            mapped(&plain, r#""x""#, true, &Limits::default()).0,
            r#"{"id":null,"name":null,"email":null}"#
        );
    }

    #[test]
    fn a_refused_text_leaves_nothing_of_the_rows_mapped_before() {
        let plan =
            compile_json(rules(Some(r#"["items"]"#)).as_bytes(), &Limits::default()).expect("rules").plan;
        for broken in [
            r#"{"items":[{"id":1},{"id":2}],"#,
            r#"{"items":[{"id":1},{"id":2}]} x"#,
            r#"{"items":[{"id":1},{"id":"#,
        ] {
            let mut out = b"kept".to_vec();
            assert!(
                super::map_text(&plan, &mut broken.as_bytes().to_vec(), 64, &mut out).is_err(),
                "{broken}"
            );
            assert_eq!(out, b"kept", "{broken}");
        }
    }

    #[test]
    fn after_a_bound_stops_the_mapping_the_rest_of_the_text_is_still_checked() {
        let rules = rules(Some(r#"["items"]"#));
        let limits = Limits { max_mapping_steps: 30, ..Limits::default() };
        let plan = compile_json(rules.as_bytes(), &limits).expect("rules").plan;
        let items = vec![r#"{"id":1,"owner":{"name":"a"}}"#; 50].join(",");
        let mut out = Vec::new();
        let stopped =
            super::map_text(&plan, &mut format!(r#"{{"items":[{items}]}}"#).into_bytes(), 64, &mut out);
        assert_eq!(stopped.expect("JSON").limit, Some(crate::plan::Limit::Steps));
        let mut out = b"kept".to_vec();
        let broken = format!(r#"{{"items":[{items},{{"id":}}]}}"#);
        assert!(super::map_text(&plan, &mut broken.into_bytes(), 64, &mut out).is_err());
        assert_eq!(out, b"kept");
    }

    #[test]
    fn rules_the_walk_cannot_fill_for_keep_their_scans() {
        let cases = [
            // A plain path: strict scans and an index step.
            r#"{"newBodyFields":{"v":{"key":"v","type":"Json"}},"oldBodyFields":{"v":{"expr":"owner.names[0]"}}}"#,
            // A value read whole and scanned below.
            r#"{"newBodyFields":{"o":{"key":"o","type":"Json"},"n":{"key":"n","type":"Json"}},"oldBodyFields":{"o":{"keys":["owner"]},"n":{"keys":["name"],"parents":["owner"]}}}"#,
        ];
        let input = r#"{"owner":{"name":"a","names":["b"]}}"#;
        for rules in cases {
            mapped(rules, input, false, &Limits::default());
        }
    }

    #[test]
    fn the_scans_steps_are_charged_where_the_scans_would_charge_them() {
        let rules = rules(Some(r#"["items"]"#));
        let input = format!(
            r#"{{"items":[{}]}}"#,
            vec![r#"{"id":1,"owner":{"name":"a","email":"b"}}"#; 50].join(",")
        );
        let (_, whole) = mapped(&rules, &input, true, &Limits::default());
        // Every bound from well below to just above what the mapping takes: the same outcome
        // either way (`mapped` compares them), and a stop at each bound below.
        for steps in (whole.steps.saturating_sub(40)..=whole.steps).chain([whole.steps / 2, 1]) {
            let limits = Limits { max_mapping_steps: steps, ..Limits::default() };
            let (_, outcome) = mapped(&rules, &input, true, &limits);
            assert_eq!(outcome.limit.is_some(), steps < whole.steps, "{steps} of {}", whole.steps);
        }
    }
}

#[cfg(test)]
mod expression_tests {
    use crate::json::with_parsed;
    use crate::rules::{Limits, compile_json};

    /// Maps `input` by `rules` under `limits`; the output and what the run reports.
    fn map_with(rules: &str, input: &str, limits: &Limits) -> (String, super::Outcome) {
        let plan = compile_json(rules.as_bytes(), limits).unwrap_or_else(|p| panic!("{p:?}")).plan;
        let mut buf = input.as_bytes().to_vec();
        let mut out = Vec::new();
        let outcome =
            with_parsed(&mut buf, 64, |nodes| super::execute(&plan, nodes, 0, &mut out)).expect("JSON");
        (String::from_utf8(out).expect("UTF-8"), outcome)
    }

    fn map(rules: &str, input: &str) -> String {
        map_with(rules, input, &Limits::default()).0
    }

    /// Rules with one target `v` of `ty` read by `expr`.
    fn one(expr: &str, ty: &str) -> String {
        let expr = serde_json::to_string(expr).expect("a string");
        format!(
            r#"{{"newBodyFields":{{"v":{{"key":"v","type":"{ty}"}}}},"oldBodyFields":{{"v":{{"expr":{expr}}}}}}}"#
        )
    }

    const ORDER: &str = r#"{"customer":{"name":"Ada","email":null},"currency":"EUR",
        "items":[{"sku":"a","price":"12.25","qty":2,"stock":3},{"sku":"b","price":"4.5","qty":1,"stock":0},
                 {"sku":"c","price":"1","qty":10,"stock":7}]}"#;

    #[test]
    fn an_expression_reads_filters_computes_and_defaults() {
        let cases = [
            ("customer.name", "String", r#"{"v":"Ada"}"#),
            // No implicit first element: that stays `parents`' behaviour.
            ("items.sku", "Json", r#"{"v":null}"#),
            ("items[?stock > `0`].sku", "Json", r#"{"v":["a","c"]}"#),
            ("items[?stock > `0`].sku", "String", r#"{"v":["a","c"]}"#),
            ("sum(items[*].qty)", "Int", r#"{"v":13}"#),
            ("sum(items[].[to_number(price) * qty][])", "Double", r#"{"v":39.0}"#),
            ("customer.email || 'none'", "String", r#"{"v":"none"}"#),
            ("length(items)", "String", r#"{"v":"3"}"#),
            ("items[0].price", "Double", r#"{"v":12.25}"#),
            ("items[-1].qty", "Boolean", r#"{"v":null}"#),
            ("{n: customer.name, c: currency}", "Json", r#"{"v":{"n":"Ada","c":"EUR"}}"#),
            ("max_by(items, &qty).sku", "String", r#"{"v":"c"}"#),
            (
                "let $c = currency in items[*].join(' ', [sku, $c])",
                "Json",
                r#"{"v":["a EUR","b EUR","c EUR"]}"#,
            ),
            ("items[?qty > `1`] | length(@) > `1` ? 'many' : 'few'", "String", r#"{"v":"many"}"#),
        ];
        for (expr, ty, expected) in cases {
            assert_eq!(map(&one(expr, ty), ORDER), expected, "{expr} as {ty}");
        }
    }

    #[test]
    fn plain_paths_read_by_jmespath_rules_not_by_parents_rules() {
        let input = r#"{"a":[{"b":1,"b":2},{"b":3}],"o":{"0":"zero","b":[4,5]},"s":"text","l":[[6,7],[8]]}"#;
        let cases = [
            // A name reads the first member so called; an index an element, from the end when
            // negative; past either end, nothing.
            ("a[0].b", r#"{"v":1}"#),
            ("a[-1].b", r#"{"v":3}"#),
            ("a[2].b", r#"{"v":null}"#),
            ("a[-3]", r#"{"v":null}"#),
            ("l[0][-1]", r#"{"v":7}"#),
            ("o.b[1]", r#"{"v":5}"#),
            // No list is followed to its first element, as `parents` would, and an index does
            // not read an object's member.
            ("a.b", r#"{"v":null}"#),
            ("l.b", r#"{"v":null}"#),
            ("o[0]", r#"{"v":null}"#),
            ("s.b", r#"{"v":null}"#),
            ("s[0]", r#"{"v":null}"#),
            ("missing[0].b", r#"{"v":null}"#),
            ("o", r#"{"v":{"0":"zero","b":[4,5]}}"#),
        ];
        for (expr, expected) in cases {
            assert_eq!(map(&one(expr, "Json"), input), expected, "{expr}");
            // The same read by the program, which a pipe keeps from being a plain path.
            assert_eq!(map(&one(&format!("{expr} | @"), "Json"), input), expected, "{expr} | @");
        }
        // A root that is a list: a name reads nothing, an index an element.
        assert_eq!(map(&one("b", "Int"), r#"[{"b":1}]"#), r#"{"v":null}"#);
        assert_eq!(map(&one("[0].b", "Int"), r#"[{"b":1}]"#), r#"{"v":1}"#);
        // Built `each` elements are written out and parsed again for the scans.
        let rules = r#"{"each":"a[*].{x: b}","newBodyFields":{"x":{"key":"x","type":"Int"}},
            "oldBodyFields":{"x":{"expr":"x"}}}"#;
        assert_eq!(map(rules, input), r#"[{"x":1},{"x":3}]"#);
        let rules = r#"{"each":"l[0]","newBodyFields":{"x":{"key":"x","type":"Int"}},
            "oldBodyFields":{"x":{"expr":"[0]"}}}"#;
        assert_eq!(map(rules, input), r#"[{"x":null},{"x":null}]"#);
    }

    #[test]
    fn each_takes_an_expression_and_dollar_is_the_whole_document_under_it() {
        let rules = r#"{"each":"items[?stock > `0`]",
            "newBodyFields":{"sku":{"key":"sku","type":"String"},"total":{"key":"total","type":"Double"},
                             "cur":{"key":"currency","type":"String"},"name":{"key":"who","type":"String"}},
            "oldBodyFields":{"sku":{"keys":["sku"]},"total":{"expr":"to_number(price) * qty"},
                             "cur":{"expr":"$.currency"},"name":{"keys":["name"],"parents":["customer"]}}}"#;
        assert_eq!(
            map(rules, ORDER),
            r#"[{"sku":"a","total":24.5,"currency":"EUR","who":null},{"sku":"c","total":10.0,"currency":"EUR","who":null}]"#
        );
        // Built elements (a multi-select) are read by `keys` too, and `$` still reaches the root.
        let rules = r#"{"each":"items[*].{s: sku, q: qty}","newBodyFields":{"s":{"key":"s","type":"String"},
            "q":{"key":"q","type":"Int"},"c":{"key":"c","type":"String"}},
            "oldBodyFields":{"s":{"keys":["s"]},"q":{"expr":"q"},"c":{"expr":"$.currency"}}}"#;
        assert_eq!(
            map(rules, ORDER),
            r#"[{"s":"a","q":2,"c":"EUR"},{"s":"b","q":1,"c":"EUR"},{"s":"c","q":10,"c":"EUR"}]"#
        );
        // An object is the one element; anything else gives no elements.
        let each = |expr: &str| {
            format!(
                r#"{{"each":"{expr}","newBodyFields":{{"n":{{"key":"n","type":"String"}}}},"oldBodyFields":{{"n":{{"keys":["name"]}}}}}}"#
            )
        };
        assert_eq!(map(&each("customer"), ORDER), r#"[{"n":"Ada"}]"#);
        assert_eq!(map(&each("currency"), ORDER), "[]");
        assert_eq!(map(&each("nothing"), ORDER), "[]");
    }

    #[test]
    fn a_failing_expression_is_a_missing_value_and_is_counted() {
        let (out, outcome) = map_with(&one("abs(currency)", "Int"), ORDER, &Limits::default());
        assert_eq!(out, r#"{"v":null}"#);
        assert_eq!((outcome.expression_errors, outcome.limit), (1, None));
        let rules = r#"{"ignoreEmptyValues":true,"newBodyFields":{"v":{"key":"v","type":"Int"},"w":{"key":"w","type":"String"}},
            "oldBodyFields":{"v":{"expr":"`1` / `0`"},"w":{"expr":"currency"}}}"#;
        let (out, outcome) = map_with(rules, ORDER, &Limits::default());
        assert_eq!(out, r#"{"w":"EUR"}"#);
        assert_eq!(outcome.expression_errors, 1);
    }

    #[test]
    fn values_built_past_the_budget_fail_the_mapping_quickly() {
        // Each level builds a list per element of the one before: 100^4 lists of 100 elements,
        // some 24 GB, were the budget not there. The run stops at the budget's first megabyte.
        let hundred: Vec<String> = (0..100).map(|i| i.to_string()).collect();
        let input = format!(r#"{{"a":[{}]}}"#, hundred.join(","));
        let expr = "a[*].[$.a[*].[$.a[*].[$.a[*].[$.a[*]]]]]";
        let limits = Limits { max_expr_bytes: 1 << 20, ..Limits::default() };
        let (_, outcome) = map_with(&one(expr, "Json"), &input, &limits);
        assert_eq!(outcome.limit, Some(crate::plan::Limit::Built), "{outcome:?}");
        let (out, outcome) = map_with(&one("length(a[*].[@, @])", "Int"), &input, &limits);
        assert_eq!((out.as_str(), outcome.limit), (r#"{"v":100}"#, None));
    }
}
