//! Traced execution for previews: the same run as [`execute`](super::execute) with an observer
//! that records, per target (and per `each` element, up to [`TRACE_ELEMENTS`]), what was read,
//! from where, and why a value is null or left out.
//!
//! Explanations re-walk the target's path slowly with JSON pointers; the output itself is always
//! the one the real executor wrote. The trace is part of the answer and has the mapping's bounds
//! too: its walks cost steps (a step per member passed and 64 bytes of the name looked for, four
//! per 64 bytes of a pointer built), counted apart from the run's and up to the same number, and
//! its entries count against the answer's bytes. A trace that would pass either stops the
//! preview with `mapping-limit`.

use super::coerce::{Coerced, coerce};
use super::{Observer, Outcome, Scratch, document, with_arena};
use crate::expr::EvalError;
use crate::expr::steps_of_bytes;
use crate::json::{self, Doc, Node, Nodes, write};
use crate::plan::{Each, Limit, Plan, Target};
use crate::plan::{KeyEntry, Type};
use crate::rules::Problem;

/// Most members of an object among which a missing name's likely meaning is looked for.
const SUGGESTED_AMONG: u64 = 256;

/// Steps a comparison of a missing name with one member's takes: two names of up to 64
/// characters, a band of up to 64 × 7 cells of their table. Measured (`docs/behaviour.md`, "The
/// bounds of one mapping"): 1,000 missing names of 63 characters, each compared with 256
/// members that differ from it in their last characters, spent the 4,000,000 steps in 118 ms at
/// 64 steps a member, 53–106 ms at 128 and 42–70 ms at 256 (time to the 422, five runs).
const SUGGESTION_STEPS: u64 = 256;

/// How many `each` elements a trace describes; the output always has all of them.
pub const TRACE_ELEMENTS: usize = 50;

/// What a traced run reports beside its output.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    pub entries: Vec<TraceEntry>,
    /// Remarks on the run as a whole (an `each` path that leads to no list, a shortened trace,
    /// an expression that failed), located in the rules document like compile warnings.
    pub notes: Vec<Problem>,
    pub outcome: Outcome,
    /// Whether any target wrote a value other than null, in any element (also past those the
    /// entries describe).
    pub wrote: bool,
}

/// One target evaluated once.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEntry {
    /// Index of the `each` element, for rules with `each`.
    pub element: Option<usize>,
    pub id: String,
    pub key: String,
    /// Whether the value (or any part of it) was found in the input.
    pub resolved: bool,
    /// Whether the member is in the output (it is left out when empty and empty values are
    /// ignored).
    pub included: bool,
    /// The JSON written for it, when included.
    pub value: Option<Vec<u8>>,
    pub note: String,
}

impl TraceEntry {
    /// Bytes it takes, about as written (its text, and the members' names around it).
    fn bytes(&self) -> usize {
        self.id.len() + self.key.len() + self.value.as_ref().map_or(4, Vec::len) + self.note.len() + 96
    }
}

impl Trace {
    /// Bytes the entries and notes take, about as written.
    pub fn bytes(&self) -> usize {
        let notes: usize = self.notes.iter().map(|n| n.location.len() + n.message.len() + 32).sum();
        self.entries.iter().map(TraceEntry::bytes).sum::<usize>() + notes
    }

    /// Appends the entries as a JSON array.
    pub fn write_entries(&self, out: &mut Vec<u8>) {
        out.push(b'[');
        for (n, e) in self.entries.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            out.push(b'{');
            if let Some(element) = e.element {
                out.extend_from_slice(b"\"element\":");
                write::u64(out, element as u64);
                out.push(b',');
            }
            out.extend_from_slice(b"\"id\":");
            write::string(out, &e.id);
            out.extend_from_slice(b",\"key\":");
            write::string(out, &e.key);
            out.extend_from_slice(if e.resolved { b",\"resolved\":true" } else { b",\"resolved\":false" });
            out.extend_from_slice(if e.included { b",\"included\":true" } else { b",\"included\":false" });
            out.extend_from_slice(b",\"value\":");
            out.extend_from_slice(e.value.as_deref().unwrap_or(b"null"));
            out.extend_from_slice(b",\"note\":");
            write::string(out, &e.note);
            out.push(b'}');
        }
        out.push(b']');
    }
}

/// Like [`execute`](super::execute), and also returns a [`Trace`].
pub fn execute_traced(plan: &Plan, nodes: &Doc<'_, '_>, root: usize, out: &mut Vec<u8>) -> Trace {
    execute_traced_as(plan, nodes, root, None, out)
}

/// [`execute_traced`] for a call of `caller` ([`execute_as`](super::execute_as)).
pub fn execute_traced_as(
    plan: &Plan,
    nodes: &Doc<'_, '_>,
    root: usize,
    caller: Option<&crate::expr::Const>,
    out: &mut Vec<u8>,
) -> Trace {
    let bounds = plan.bounds();
    let mut tracer = Tracer {
        plan,
        nodes,
        each: None,
        element: None,
        elements: 0,
        entries: Vec::new(),
        failure: None,
        failed: Vec::new(),
        failed_at: std::collections::HashSet::new(),
        seen: vec![Seen::default(); plan.targets.len()],
        left_out: vec![0; plan.targets.len() + 1],
        wrote: false,
        steps_left: bounds.steps,
        bytes_left: bounds.answer_bytes,
        stopped: None,
    };
    let mut notes = Vec::new();
    if let Some(Each::Expr(_)) = &plan.each {
        tracer.each = Some(("(each)".to_owned(), true));
    }
    if let Some(Each::Path(path)) = &plan.each {
        match locate(nodes, root, Some(String::new()), path.iter().map(|p| &**p), &mut tracer.steps_left) {
            Ok((at, pointer)) => match nodes.get(at) {
                Some(Node::Array { .. }) => tracer.each = Some((pointer, true)),
                Some(Node::Object { .. }) => tracer.each = Some((pointer, false)),
                _ => notes.push(Problem::new(
                    "/each",
                    format!(
                        "`each` leads to {} at {}, not a list or an object: the output is an empty list",
                        json::kind(nodes, at),
                        shown(&pointer)
                    ),
                )),
            },
            Err(_) if tracer.steps_left == 0 => tracer.stopped = Some(Limit::Steps),
            Err(why) => notes.push(Problem::new(
                "/each",
                format!("`each` leads nowhere ({why}): the output is an empty list"),
            )),
        }
    }
    let mut outcome = with_arena(|arena| {
        let mut scratch = Scratch::new(arena, plan);
        scratch.caller = caller;
        document(plan, nodes, root, &mut scratch, out, &mut tracer);
        scratch.outcome
    });
    if let Some(limit) = tracer.stopped {
        outcome.stopped(limit);
    }
    notes.append(&mut tracer.failed);
    // `each` first (its count is kept last), then the targets in order.
    let each = tracer.left_out.len() - 1;
    for slot in std::iter::once(each).chain(0..each) {
        let count = tracer.left_out[slot];
        if count == 0 {
            continue;
        }
        let location = tracer.expression_at((slot < each).then_some(slot as u32));
        let elements = if count == 1 { "1 element" } else { &format!("{count} elements") };
        notes.push(Problem::new(
            location,
            format!("group_by() left out {elements} whose key is null (counted over every run of the expression): they are in no group of the output"),
        ));
    }
    // A name no element has is most likely misspelt: its value is lost without a word else.
    for (t, seen) in plan.targets.iter().zip(&tracer.seen) {
        if let (false, Some(why)) = (seen.found, &seen.absent) {
            notes.push(Problem::new(
                format!("/oldBodyFields/{}", pointer_escaped(&t.id)),
                format!("`{}` found no value in the document: {why}", t.id),
            ));
        }
    }
    if tracer.elements > TRACE_ELEMENTS {
        notes.push(Problem::new(
            "",
            format!(
                "the trace describes the first {TRACE_ELEMENTS} of {} elements; the output has all of them",
                tracer.elements
            ),
        ));
    }
    Trace { entries: tracer.entries, notes, outcome, wrote: tracer.wrote }
}

struct Tracer<'r, 'a> {
    plan: &'r Plan,
    nodes: &'r Nodes<'a>,
    /// Where `each` leads: its pointer, and whether it is a list (whose elements are then at
    /// `/{index}` below it) or a single object.
    each: Option<(String, bool)>,
    element: Option<usize>,
    elements: usize,
    entries: Vec<TraceEntry>,
    /// The error of the expression whose target is reported next, if it failed.
    failure: Option<String>,
    /// A warning per expression that failed (its first failure).
    failed: Vec<Problem>,
    /// The targets (`None`: `each`) whose expression failure is in `failed`: each is told once,
    /// its location made only then.
    failed_at: std::collections::HashSet<Option<u32>>,
    /// By target, what was seen of those that read names.
    seen: Vec<Seen>,
    /// Elements `group_by` left out, by target, and last for `each`'s expression.
    left_out: Vec<u64>,
    /// Whether any target wrote a value other than null, in any element.
    wrote: bool,
    /// Steps the trace's own walks may still take (as many as the run's).
    steps_left: u64,
    /// Bytes its entries may still take (the answer's bound).
    bytes_left: usize,
    /// The bound the trace ran into: it describes nothing more, and the preview fails.
    stopped: Option<Limit>,
}

impl Observer for Tracer<'_, '_> {
    const ACTIVE: bool = true;

    fn element(&mut self, index: usize) {
        self.element = Some(index);
        self.elements = index + 1;
    }

    fn left_out(&mut self, target: Option<u32>, count: u64) {
        let each = self.left_out.len() - 1;
        if let Some(total) = self.left_out.get_mut(target.map_or(each, |t| t as usize)) {
            *total = total.saturating_add(count);
        }
    }

    fn expression(&mut self, target: Option<u32>, error: Option<&EvalError>) {
        let failure = error.map(|e| format!("{} ({})", e.message, e.kind.name()));
        if let Some(why) = &failure
            && self.failed_at.insert(target)
        {
            let location = self.expression_at(target);
            let element = self.element.map(|e| format!(" (element {e})")).unwrap_or_default();
            self.failed.push(Problem::new(
                location,
                format!("the expression failed{element}: {why}; its value is missing"),
            ));
        }
        self.failure = failure;
    }

    fn target(&mut self, target: u32, root: usize, value: Option<&[u8]>) {
        let failure = self.failure.take();
        // Past the elements described, what was written still counts: a name found only there
        // is found, and the mapping wrote something.
        if let Some(written) = value
            && written != b"null"
        {
            self.wrote = true;
            if let Some(seen) = self.seen.get_mut(target as usize) {
                seen.found = true;
            }
        }
        if self.element.is_some_and(|e| e >= TRACE_ELEMENTS) || self.stopped.is_some() {
            return;
        }
        let Some(t) = self.plan.targets.get(target as usize) else { return };
        if let Some(source) = &t.expr {
            // Nothing found, and no failure: a name it reads that the document lacks is most
            // likely misspelt (told with the name probably meant, as for `keys`).
            if failure.is_none() && value.is_none_or(|v| v == b"null") {
                // The first name missing that has a name probably meant, else the first missing
                // (`a.discount || a.prise` tells of `prise`).
                let start = self.element_pointer();
                let mut told: Option<Miss> = None;
                for path in &t.reads {
                    let found = locate(
                        self.nodes,
                        root,
                        Some(start.clone()),
                        path.iter().map(|p| &**p),
                        &mut self.steps_left,
                    );
                    match found {
                        Err(miss) if miss.absent && miss.suggested => {
                            told = Some(miss);
                            break;
                        }
                        Err(miss) if miss.absent && told.is_none() => told = Some(miss),
                        _ => {}
                    }
                }
                self.saw(target, told.as_ref());
                if self.steps_left == 0 {
                    self.stopped = Some(Limit::Steps);
                    return;
                }
            }
            let included = value.is_some();
            let fate = if included { "written as null" } else { "left out (ignoreEmptyValues)" };
            let note = match (&failure, value) {
                (Some(why), _) => format!("expression `{source}` failed: {why}; {fate}"),
                (None, Some(b"null")) => format!("expression `{source}` gave null; {fate}"),
                (None, Some(_)) => format!("expression `{source}` read as {}", t.ty.name()),
                (None, None) => format!("expression `{source}` gave nothing to keep; {fate}"),
            };
            self.push(TraceEntry {
                element: self.element,
                id: t.id.to_string(),
                key: t.key.to_string(),
                resolved: failure.is_none() && value.is_some_and(|v| v != b"null"),
                included,
                value: value.map(<[u8]>::to_vec),
                note,
            });
            return;
        }
        let start = self.element_pointer();
        let included = value.is_some();
        let mut names = t.keys.iter().flat_map(KeyEntry::names);
        let (resolved, note) = match (&*t.keys, names.next()) {
            ([KeyEntry::Field(_)], Some(name)) => {
                let path = t.parents.iter().map(|p| &**p).chain([name.as_str()]);
                let found = locate(self.nodes, root, Some(start), path, &mut self.steps_left);
                self.saw(target, found.as_ref().err());
                (found.is_ok(), self.single_note(t, &found, value))
            }
            (_, first) => {
                // Only how many were found and why the first miss is missing are told: no
                // pointer is built for the others.
                let (mut hits, mut all, mut missing) = (0, 0, None);
                for name in first.into_iter().chain(names) {
                    let path = || t.parents.iter().map(|p| &**p).chain([name.as_str()]);
                    match locate(self.nodes, root, None, path(), &mut self.steps_left) {
                        Ok(_) => hits += 1,
                        Err(_) if missing.is_none() && self.steps_left > 0 => {
                            let told =
                                locate(self.nodes, root, Some(start.clone()), path(), &mut self.steps_left);
                            missing = told.err();
                        }
                        Err(_) => {}
                    }
                    all += 1;
                    if self.steps_left == 0 {
                        break;
                    }
                }
                self.saw(target, if hits > 0 { None } else { missing.as_ref() });
                (hits > 0, several_note(hits, all, missing, included))
            }
        };
        if self.steps_left == 0 {
            self.stopped = Some(Limit::Steps);
            return;
        }
        self.push(TraceEntry {
            element: self.element,
            id: t.id.to_string(),
            key: t.key.to_string(),
            resolved,
            included,
            value: value.map(<[u8]>::to_vec),
            note,
        });
    }
}

/// A value found (its tape position and JSON pointer), or why there is none.
type Found = Result<(usize, String), Miss>;

/// Why a value is missing, and whether because an object lacks a member the rules name (the
/// mark of a misspelt name, when no element has it).
#[derive(Debug, Clone, Default)]
struct Miss {
    why: String,
    absent: bool,
    /// The name probably meant is told.
    suggested: bool,
}

impl Miss {
    fn other(why: String) -> Miss {
        Miss { why, absent: false, suggested: false }
    }
}

impl std::fmt::Display for Miss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// What the trace saw of one target whose value is read by names: whether any element had a
/// value for it, and the first member found missing.
#[derive(Default, Clone)]
struct Seen {
    found: bool,
    absent: Option<String>,
}

impl Tracer<'_, '_> {
    /// Where the expression of `target` (of `each` for `None`) is in the rules.
    fn expression_at(&self, target: Option<u32>) -> String {
        match target.and_then(|t| self.plan.targets.get(t as usize)) {
            Some(t) => format!("/oldBodyFields/{}/expr", pointer_escaped(&t.id)),
            None => "/each".to_owned(),
        }
    }

    /// Records what the walk of `target`'s names found: a value (no `miss`), or why not.
    fn saw(&mut self, target: u32, miss: Option<&Miss>) {
        let Some(seen) = self.seen.get_mut(target as usize) else { return };
        match miss {
            None => seen.found = true,
            Some(miss) if miss.absent && seen.absent.is_none() => seen.absent = Some(miss.why.clone()),
            Some(_) => {}
        }
    }

    /// Where the element being mapped is (the root without `each`).
    fn element_pointer(&self) -> String {
        match (&self.each, self.element) {
            (Some((list, true)), Some(index)) => format!("{list}/{index}"),
            (Some((object, false)), _) => object.clone(),
            _ => String::new(),
        }
    }

    /// Keeps `entry` if the answer's bound leaves room for it; else the trace stops there.
    fn push(&mut self, entry: TraceEntry) {
        match self.bytes_left.checked_sub(entry.bytes()) {
            Some(left) => {
                self.bytes_left = left;
                self.entries.push(entry);
            }
            None => self.stopped = Some(Limit::Answer),
        }
    }

    fn single_note(&self, t: &Target, found: &Found, value: Option<&[u8]>) -> String {
        let fate = if value.is_some() { "written as null" } else { "left out (ignoreEmptyValues)" };
        let (at, pointer) = match found {
            Err(why) => return format!("{why}; {fate}"),
            Ok(found) => found,
        };
        let Some(node) = self.nodes.get(*at) else { return format!("nothing at {pointer}; {fate}") };
        let kind = json::kind(self.nodes, *at);
        if t.ty == Type::Json {
            return match value {
                Some(_) => format!("copied {kind} from {pointer}"),
                None => format!("{kind} at {pointer} is empty; {fate}"),
            };
        }
        match node {
            Node::Array { .. } => match value {
                Some(_) => format!("list at {pointer}: each element converted to {}", t.ty.name()),
                None => format!("list at {pointer} has no non-empty element; {fate}"),
            },
            Node::Static(json::StaticNode::Null) => format!("null at {pointer}; {fate}"),
            _ if coerce(node, t.ty) == Coerced::Null => {
                format!("{kind} at {pointer} does not convert to {}; {fate}", t.ty.name())
            }
            _ if value.is_none() => format!("{kind} at {pointer} is blank; {fate}"),
            _ => format!("read {kind} at {pointer} as {}", t.ty.name()),
        }
    }
}

/// A note for a concatenation or a target with several `keys` entries: `hits` of `all` names
/// found, the first one missing and why.
fn several_note(hits: usize, all: usize, missing: Option<Miss>, included: bool) -> String {
    let mut note = format!("found {hits} of {all} fields");
    if let Some(why) = missing {
        note.push_str(&format!("; first missing: {why}"));
    }
    if !included {
        note.push_str("; nothing left to write, left out (ignoreEmptyValues)");
    }
    note
}

/// Walks `path` from `root` (whose pointer is `pointer`) as SPEC §1.2 reads values (lists are
/// followed to their first element before each step) and returns the value found with its JSON
/// pointer, or why there is none; with no `pointer`, only whether it is found (both empty).
/// Takes from `steps` a step per member passed (per 64 bytes of the name looked for, for each),
/// and four per 64 bytes of pointer built; with none left it stops, and what it answers is not
/// told.
fn locate<'p>(
    nodes: &Nodes<'_>,
    root: usize,
    mut pointer: Option<String>,
    path: impl IntoIterator<Item = &'p str>,
    steps: &mut u64,
) -> Found {
    let mut at = root;
    let shown_at = |pointer: &Option<String>| pointer.as_deref().map(shown).unwrap_or_default();
    for step in path {
        while let Some(Node::Array { len, .. }) = nodes.get(at) {
            if *len == 0 {
                return Err(Miss::other(format!("{} is an empty list", shown_at(&pointer))));
            }
            at += 1;
            if let Some(pointer) = &mut pointer {
                pointer.push_str("/0");
            }
        }
        let members = match nodes.get(at) {
            Some(Node::Object { len, .. }) => *len as u64,
            _ => 0,
        };
        let built = pointer.as_ref().map_or(0, |p| 4 * steps_of_bytes(p.len() + step.len()));
        match steps.checked_sub(members.saturating_mul(steps_of_bytes(step.len())).saturating_add(built)) {
            Some(left) => *steps = left,
            None => {
                *steps = 0;
                return Err(Miss::default());
            }
        }
        if !matches!(nodes.get(at), Some(Node::Object { .. })) {
            return Err(Miss::other(format!(
                "{} is {}, not an object",
                shown_at(&pointer),
                json::kind(nodes, at)
            )));
        }
        let object = at;
        at = json::member(nodes, object, step).ok_or_else(|| {
            let mut why = format!("{} has no member `{step}`", shown_at(&pointer));
            // The name probably meant, when only names are asked for no pointer is built: the
            // members were counted in the steps taken above.
            // Looked for among the first members only, and paid for: comparing two names takes
            // up to a table of their lengths.
            let mut suggested = false;
            if pointer.is_some()
                && members <= SUGGESTED_AMONG
                && let Some(left) = steps.checked_sub(members * SUGGESTION_STEPS)
                && let Some(names) = json::members(nodes, object)
            {
                *steps = left;
                if let Some(meant) = crate::suggest::closest(step, names.map(|(name, _)| name)) {
                    why.push_str(&format!(" (did you mean `{meant}`?)"));
                    suggested = true;
                }
            }
            Miss { why, absent: true, suggested }
        })?;
        if let Some(pointer) = &mut pointer {
            json::push_pointer(pointer, step);
        }
    }
    Ok((at, pointer.unwrap_or_default()))
}

fn pointer_escaped(name: &str) -> String {
    let mut pointer = String::new();
    json::push_pointer(&mut pointer, name);
    pointer[1..].to_owned()
}

fn shown(pointer: &str) -> String {
    if pointer.is_empty() { "the root".to_owned() } else { pointer.to_owned() }
}
