//! On-demand reading: a tape of only the parts of a document that a plan reads.
//!
//! [`Wants`] says, from the root down, which members of each object and which elements of each
//! list are read, and which values are read whole. [`with_read`] finds the text's tokens
//! ([`super::index`]), then walks them once, checking the whole text as [`super::with_parsed`]
//! does, and writes tape nodes only for what is wanted: an object keeps only its wanted members
//! (in document order, repeats included), a value nobody reads is checked and passed over, so a
//! skipped string is never unescaped, a skipped number never converted and a skipped container
//! never written. What is kept is the nodes the full parse would have written there, so the
//! executor runs unchanged on the smaller tape and, reading only wanted places, finds the same.
//!
//! [`with_rows`] is the same walk made one pass with the executor, for wants that are exactly a
//! plan's scans ([`Wants::fills_slots`]): as it matches a wanted member's name it fills the slot
//! that member's scan would have filled, where the scan would have looked, and it hands each
//! object the plan maps (the document, or each element of its `each` list) over as soon as it is
//! read, on a tape of its own, so the executor runs no scan and the tape holds one element at a
//! time.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use super::doc::{Doc, PADDING};
use super::error::JsonError;
use super::index::{self, syntax};
use super::keys::{KeyTable, words};
use super::write;
use simd_json::{Node, StaticNode};

/// What a plan reads of a document: a tree of [`Want`]s, the root's first.
#[derive(Debug, Clone)]
pub struct Wants {
    wants: Vec<Want>,
    /// Told apart from every other tree made in this process (clones share it, and are equal):
    /// what a thread remembers of the names read under these wants is kept for the next text.
    id: u64,
    /// When the wants are exactly the plan's scans: the walk can then fill the scans' slots as
    /// it matches the names, and hand each object mapped over as soon as it is read
    /// ([`with_rows`]).
    fills: Option<Fills>,
}

/// How the walk fills a plan's slots ([`Wants::fills`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fills {
    /// The plan's slots are `0..plan_slots`; the members of an `each` path have the slots after
    /// them, up to `slots`, filled once per text rather than once per row.
    pub plan_slots: u32,
    pub slots: u32,
    /// Whether the document itself is the one row (rules without `each`); otherwise a row starts
    /// at the `each` value ([`Want::each`]), or at each of its elements when it is a list.
    pub root_row: bool,
}

/// What is read of one value.
#[derive(Debug, Clone)]
pub(crate) struct Want {
    /// The value is read whole (copied, coerced, tested for emptiness): everything is kept.
    pub whole: bool,
    /// Of an object, the members read, each with its own want (by index into [`Wants`]).
    pub members: KeyTable,
    /// Of a list, what is read of each element; `None`: no element is read.
    pub elements: Option<u32>,
    /// The slot of the plan's scans that this value fills when it is met as a member of an
    /// object whose members fill slots ([`NO_SLOT`]: none).
    pub slot: u32,
    /// The value an `each` path leads to: its elements are the rows, or it is the one row when
    /// it is an object ([`with_rows`]).
    pub each: bool,
}

/// [`Want::slot`] of a value that fills no slot.
pub(crate) const NO_SLOT: u32 = u32::MAX;

impl Want {
    /// A want that fills no slot.
    pub(crate) fn new(whole: bool, members: KeyTable, elements: Option<u32>) -> Want {
        Want { whole, members, elements, slot: NO_SLOT, each: false }
    }
}

impl Wants {
    /// Wants whose root is `wants[0]`; members' and elements' indexes point into `wants`.
    pub(crate) fn new(wants: Vec<Want>) -> Wants {
        static MADE: AtomicU64 = AtomicU64::new(1);
        Wants { wants, id: MADE.fetch_add(1, Ordering::Relaxed), fills: None }
    }

    /// Wants whose members' [`Want::slot`]s are exactly the slots of the plan's scans.
    pub(crate) fn filling(wants: Vec<Want>, fills: Fills) -> Wants {
        Wants { fills: Some(fills), ..Wants::new(wants) }
    }

    /// Whether the walk can fill the plan's slots ([`with_rows`]).
    pub fn fills_slots(&self) -> bool {
        self.fills.is_some()
    }

    /// The number of wants in the tree.
    pub fn len(&self) -> usize {
        self.wants.len()
    }

    /// Whether the tree is empty (then nothing of the document is read).
    pub fn is_empty(&self) -> bool {
        self.wants.is_empty()
    }

    /// Whether anything of the document's member `name` is read (all of it is when the
    /// document is read whole).
    pub fn reads_member(&self, name: &str) -> bool {
        self.wants.first().is_some_and(|root| root.whole || root.members.get(name.as_bytes()).is_some())
    }
}

/// What the walk does with one value.
#[derive(Clone, Copy)]
enum Mode {
    /// Check it, write nothing.
    Skip,
    /// Write all of it.
    Whole,
    /// Write what the want at this index reads; with [`FILL`] added, the members it matches also
    /// fill the plan's slots.
    Want(u32),
}

/// Added to a [`Mode::Want`]'s index: the value is where the executor's scans would look (the
/// first member of its name in an object they read, the first element of a list they follow),
/// so the slots of its members are filled from it.
const FILL: u32 = 1 << 31;

/// Reads `input` for `wants` and runs `f` on the tape of what is wanted; refuses exactly the
/// texts [`super::with_parsed`] refuses (same `max_depth`), for the same reason, except that a
/// text both nested too deep and broken inside a string (the index checks strings before the walk
/// checks depth) may be refused as broken where the parser says too deep. The buffer is grown by
/// [`PADDING`] spaces first, as there, and left as it was: nothing is written into it.
pub fn with_read<R>(
    input: &mut Vec<u8>,
    wants: &Wants,
    max_depth: usize,
    f: impl FnOnce(&Doc<'_, '_>) -> R,
) -> Result<R, JsonError> {
    let len = input.len();
    input.resize(len + PADDING, b' ');
    let result = read_padded(input, len, wants, max_depth, None, |doc, _| f(doc));
    input.truncate(len);
    result
}

/// Where [`with_read_at`] found the value of its path: its text's byte range, and for a list
/// the number of its elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub start: usize,
    pub end: usize,
    /// Its elements, when it is a list.
    pub elements: Option<usize>,
}

/// [`with_read`], and where the value at `path` lies in `input` (each step the first member of
/// that name of an object, as a plain path reads it; the root for an empty path): `f` gets it,
/// `None` when the path reaches nothing. What that value holds is not read into the tape (unless
/// `wants` asks): it is found by its tokens, so its text can be taken as it is.
pub fn with_read_at<R>(
    input: &mut Vec<u8>,
    wants: &Wants,
    max_depth: usize,
    path: &[&str],
    f: impl FnOnce(&Doc<'_, '_>, Option<Found>) -> R,
) -> Result<R, JsonError> {
    let len = input.len();
    input.resize(len + PADDING, b' ');
    let result = read_padded(input, len, wants, max_depth, Some(path), f);
    input.truncate(len);
    result
}

/// Reads the padded text (`len` bytes of it) for `wants`; with a `path`, also where the value
/// at that path lies ([`with_read_at`]).
fn read_padded<R>(
    padded: &[u8],
    len: usize,
    wants: &Wants,
    max_depth: usize,
    path: Option<&[&str]>,
    f: impl FnOnce(&Doc<'_, '_>, Option<Found>) -> R,
) -> Result<R, JsonError> {
    let Ok(source) = simdutf8::basic::from_utf8(padded) else {
        return Err(JsonError::whole("the text is not UTF-8"));
    };
    let source = &source[..len];
    let root = if wants.wants.is_empty() { Mode::Skip } else { Mode::Want(0) };
    let found = std::cell::Cell::new(None);
    with_tape(
        wants,
        padded.len(),
        padded,
        |index, escapes, sink| {
            let count = index::build_str(source, index, escapes)?;
            let index = index.get(..count).unwrap_or_default();
            Walk::new(source, index, escapes, &wants.wants, sink, max_depth).document(0, root)?;
            // The text is whole and well formed: its tokens can be followed without checks.
            if let Some(path) = path {
                found.set(locate(source.as_bytes(), index, path));
            }
            Ok(())
        },
        |doc| f(doc, found.get()),
    )
}

/// The token after the value whose first token is `k`.
fn past_value(text: &[u8], index: &[u32], k: usize) -> Option<usize> {
    let at = |j: usize| index.get(j).and_then(|&p| text.get(p as usize)).copied();
    if !matches!(at(k)?, b'{' | b'[') {
        return Some(k + 1);
    }
    let mut depth = 0usize;
    for j in k..index.len() {
        match at(j)? {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(j + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// Where the value at `path` is in a well-formed `text` whose tokens are `index` (see
/// [`with_read_at`]).
fn locate(text: &[u8], index: &[u32], path: &[&str]) -> Option<Found> {
    let at = |j: usize| index.get(j).and_then(|&p| text.get(p as usize)).copied();
    let mut k = 0;
    for name in path {
        if at(k)? != b'{' {
            return None;
        }
        let mut j = k + 1;
        loop {
            if at(j)? != b'"' {
                return None;
            }
            // The name runs from after its quote to the quote before the `:` token.
            let open = index[j] as usize + 1;
            let colon = *index.get(j + 1)? as usize;
            let close = open + text.get(open..colon)?.iter().rposition(|&b| b == b'"')?;
            let raw = text.get(open..close)?;
            let same = if raw.contains(&b'\\') {
                serde_json::from_slice::<String>(text.get(open - 1..=close)?).is_ok_and(|n| n == *name)
            } else {
                raw == name.as_bytes()
            };
            if same {
                k = j + 2;
                break;
            }
            j = past_value(text, index, j + 2)?;
            if at(j)? != b',' {
                return None;
            }
            j += 1;
        }
    }
    let start = index.get(k).copied()? as usize;
    let after = past_value(text, index, k)?;
    let (end, elements) = match at(k)? {
        b'[' | b'{' => {
            let last = *index.get(after - 1)? as usize;
            let elements = (at(k)? == b'[').then(|| {
                if after == k + 2 {
                    return 0;
                }
                // Commas directly inside the list, and one more.
                let mut depth = 0usize;
                let mut commas = 0;
                for j in k + 1..after - 1 {
                    match at(j) {
                        Some(b'{' | b'[') => depth += 1,
                        Some(b'}' | b']') => depth = depth.saturating_sub(1),
                        Some(b',') if depth == 0 => commas += 1,
                        _ => {}
                    }
                }
                commas + 1
            });
            (last + 1, elements)
        }
        // A scalar ends where the next token starts, or the text does.
        _ => (index.get(after).map_or(text.len(), |&p| p as usize), None),
    };
    Some(Found { start, end, elements })
}

/// What [`with_rows`] hands each row to: its tape, the position of its object there, the plan's
/// slots and the steps of its scans. It answers whether it wants more rows.
pub type OnRow<'f> = dyn FnMut(&Doc<'_, '_>, usize, &[usize], u32) -> bool + 'f;

/// Reads `input` as [`with_read`] does, for wants that are exactly a plan's scans
/// ([`Wants::fills_slots`]), and hands over each object the plan maps as soon as it is read:
/// `on_row` gets its tape (the document's, or for an `each` element one of its own, from
/// position 0), the object's position on it, the plan's slots (each the position of the value
/// its scan would have found, [`UNFILLED`] when none) and the steps the scans would have taken. Without `each`, the document is the one object, handed over once the
/// text is checked whole; with `each`, each element of its list is (or its object alone), as it
/// ends, so the rows handed over before a text is refused are to be dropped. Once `on_row`
/// wants no more (its mapping met a bound), the rest of the text is only checked: no slot is
/// filled, and each element's tape is still emptied.
pub fn with_rows(
    input: &mut Vec<u8>,
    wants: &Wants,
    max_depth: usize,
    on_row: &mut OnRow<'_>,
) -> Result<(), JsonError> {
    let Some(fills) = wants.fills else {
        return Err(JsonError::whole("these reads do not fill a plan's slots"));
    };
    let len = input.len();
    input.resize(len + PADDING, b' ');
    let mut scratch = SCRATCH.with_borrow_mut(std::mem::take);
    let result = rows_of(input, len, &mut scratch, wants, fills, max_depth, on_row);
    input.truncate(len);
    if len <= RETAIN_SCRATCH_BYTES {
        scratch.shapes_of = wants.id;
        SCRATCH.with_borrow_mut(|kept| *kept = scratch);
    }
    result
}

/// [`with_rows`] on the padded text, with the thread's scratch.
#[allow(clippy::too_many_arguments)]
fn rows_of<'s>(
    padded: &'s [u8],
    len: usize,
    scratch: &mut Scratch,
    wants: &Wants,
    fills: Fills,
    max_depth: usize,
    on_row: &mut OnRow<'_>,
) -> Result<(), JsonError> {
    let Ok(source) = simdutf8::basic::from_utf8(padded) else {
        return Err(JsonError::whole("the text is not UTF-8"));
    };
    let source = &source[..len];
    if scratch.shapes_of != wants.id {
        scratch.shapes.clear();
        scratch.shapes.resize(wants.wants.len().min(SHAPE_WANTS) * SHAPE_MEMBERS, UNSEEN);
    }
    let count = index::build_str(source, &mut scratch.index, &mut scratch.escapes)?;
    let index = scratch.index.get(..count).unwrap_or_default();
    let mut nodes: Vec<Node<'s>> = std::mem::take(&mut scratch.nodes);
    let mut floats: Vec<&'s str> = std::mem::take(&mut scratch.floats);
    nodes.clear();
    floats.clear();
    scratch.unescaped.clear();
    scratch.later.clear();
    scratch.slots.clear();
    scratch.slots.resize(fills.plan_slots as usize, UNFILLED);
    scratch.marks.clear();
    scratch.marks.resize(fills.slots.saturating_sub(fills.plan_slots) as usize, false);
    let mut sink = Sink {
        shapes: &mut scratch.shapes,
        nodes: &mut nodes,
        unescaped: &mut scratch.unescaped,
        later: &mut scratch.later,
        floats: &mut floats,
    };
    let mut walk = Walk::new(source, index, &scratch.escapes, &wants.wants, &mut sink, max_depth);
    walk.rows = Some(RowWalk {
        slots: &mut scratch.slots,
        marks: &mut scratch.marks,
        plan_slots: fills.plan_slots,
        open: false,
        steps: 0,
        done: false,
        outer: Vec::new(),
        swapped: false,
        unescaped_from: 0,
        // (The length read is the padded text's, as `with_read` has it.)
        text: padded,
        on_row,
    });
    if fills.root_row {
        walk.open_row();
    }
    let walked = walk.document(0, Mode::Want(FILL));
    if walked.is_ok() && fills.root_row {
        walk.end_row(0);
    }
    // Emptying the tape and the floats ends their borrows; their allocations go back.
    nodes.clear();
    scratch.nodes = nodes.into_iter().map(|_| Node::Static(StaticNode::Null)).collect();
    floats.clear();
    scratch.floats = floats.into_iter().map(|_| "").collect();
    walked
}

/// Where the walks of one read write: the tape, and what it takes to complete it.
struct Sink<'s, 'w> {
    shapes: &'w mut [RememberedName],
    nodes: &'w mut Vec<Node<'s>>,
    unescaped: &'w mut String,
    later: &'w mut Vec<(usize, usize, usize)>,
    floats: &'w mut Vec<&'s str>,
}

/// Runs `walks` on the thread's scratch (its index and escapes, and a [`Sink`] for `wants`),
/// completes the tape they wrote and runs `f` on it, its strings backed by `backing` (a padded
/// text that strings without escapes point into) and the buffer of the unescaped ones. `len`
/// is the length of what was read (the document's text length, `write::Backing::text_len`),
/// which also decides whether the scratch is kept.
fn with_tape<'s, R>(
    wants: &Wants,
    len: usize,
    backing: &'s [u8],
    walks: impl FnOnce(&mut Vec<u32>, &mut Vec<u32>, &mut Sink<'s, '_>) -> Result<(), JsonError>,
    f: impl FnOnce(&Doc<'_, '_>) -> R,
) -> Result<R, JsonError> {
    let mut scratch = SCRATCH.with_borrow_mut(std::mem::take);
    let mut unescaped = std::mem::take(&mut scratch.unescaped);
    unescaped.clear();
    let mut nodes: Vec<Node<'s>> = std::mem::take(&mut scratch.nodes);
    let mut later = std::mem::take(&mut scratch.later);
    later.clear();
    let mut floats: Vec<&'s str> = std::mem::take(&mut scratch.floats);
    // The names remembered under these same wants by the last text this thread read still hold.
    let mut shapes = std::mem::take(&mut scratch.shapes);
    if scratch.shapes_of != wants.id {
        shapes.clear();
        shapes.resize(wants.wants.len().min(SHAPE_WANTS) * SHAPE_MEMBERS, UNSEEN);
    }
    let mut sink = Sink {
        shapes: &mut shapes,
        nodes: &mut nodes,
        unescaped: &mut unescaped,
        later: &mut later,
        floats: &mut floats,
    };
    let outcome = walks(&mut scratch.index, &mut scratch.escapes, &mut sink);
    // The tape now also points into `unescaped`, for less long than into `backing`.
    let mut nodes: Vec<Node<'_>> = nodes;
    let result = outcome.map(|()| {
        // Strings with escapes were unescaped into their own buffer, which is now complete; the
        // padding lets the writer read its strings in whole chunks too.
        unescaped.extend(std::iter::repeat_n(' ', PADDING));
        for &(node, start, end) in &later {
            if let (Some(slot), Some(text)) = (nodes.get_mut(node), unescaped.get(start..end)) {
                *slot = Node::String(text);
            }
        }
        if nodes.is_empty() {
            // Nothing is read (no wants): the executor still needs a root.
            nodes.push(Node::Static(StaticNode::Null));
        }
        let backing = write::Backing::of(backing, unescaped.as_bytes()).reading(len);
        f(&Doc { nodes: &nodes, backing, floats: &floats })
    });
    // Emptying the tape and the floats ends their borrows; their allocations go back to the
    // thread's scratch.
    nodes.clear();
    let nodes = nodes.into_iter().map(|_| Node::Static(StaticNode::Null)).collect();
    floats.clear();
    let floats = floats.into_iter().map(|_| "").collect();
    if len <= RETAIN_SCRATCH_BYTES {
        let Scratch { index, escapes, slots, marks, .. } = scratch;
        let shapes_of = wants.id;
        SCRATCH.with_borrow_mut(|kept| {
            *kept =
                Scratch { index, escapes, shapes, shapes_of, nodes, unescaped, later, floats, slots, marks }
        });
    }
    result
}

/// Checks that the tokens `index` found in `input` make one JSON text nested at most
/// `max_depth` deep, and that every number and literal is well formed: [`with_read`]'s walk,
/// wanting nothing ([`validate`]).
pub fn validate(input: &[u8], index: &[u32], max_depth: usize) -> Result<(), JsonError> {
    let Ok(source) = simdutf8::basic::from_utf8(input) else {
        return Err(JsonError::whole("the text is not UTF-8"));
    };
    check_str(source, index, &[], max_depth)
}

fn check_str(source: &str, index: &[u32], escapes: &[u32], max_depth: usize) -> Result<(), JsonError> {
    let mut sink = Sink {
        shapes: &mut [],
        nodes: &mut Vec::new(),
        unescaped: &mut String::new(),
        later: &mut Vec::new(),
        floats: &mut Vec::new(),
    };
    Walk::new(source, index, escapes, &[], &mut sink, max_depth).document(0, Mode::Skip)
}

/// A JSON text checked whole (as [`super::diagnose`] checks it) and kept with its structural
/// index, to be read later, as often as needed, without finding its tokens again: a composed
/// route's answer (SPEC §2.3), read once for each source that waits for it and once for the
/// document the rules map.
pub struct Indexed {
    /// The text, then [`PADDING`] spaces.
    padded: String,
    len: usize,
    index: Box<[u32]>,
    escapes: Box<[u32]>,
}

impl Indexed {
    /// Checks `text` (nested at most `max_depth` deep) and finds its tokens.
    pub fn new(mut text: Vec<u8>, max_depth: usize) -> Result<Indexed, JsonError> {
        let len = text.len();
        text.reserve_exact(PADDING);
        if len >= u32::MAX as usize {
            return Err(JsonError::whole("the text is longer than 4 GiB"));
        }
        let Ok(mut padded) = String::from_utf8(text) else {
            return Err(JsonError::whole("the text is not UTF-8"));
        };
        let (index, escapes) = SCRATCH.with_borrow_mut(|scratch| {
            let found =
                index::build_str(&padded, &mut scratch.index, &mut scratch.escapes).and_then(|count| {
                    let index = scratch.index.get(..count).unwrap_or_default();
                    check_str(&padded, index, &scratch.escapes, max_depth)?;
                    Ok((Box::from(index), Box::from(scratch.escapes.as_slice())))
                });
            if len > RETAIN_SCRATCH_BYTES {
                scratch.index = Vec::new();
                scratch.escapes = Vec::new();
            }
            found
        })?;
        padded.extend(std::iter::repeat_n(' ', PADDING));
        Ok(Indexed { padded, len, index, escapes })
    }

    /// The text.
    pub fn text(&self) -> &[u8] {
        self.padded.as_bytes().get(..self.len).unwrap_or_default()
    }

    /// The bytes it holds: its text and padding, and its index.
    pub fn held_bytes(&self) -> usize {
        self.padded.capacity() + 4 * (self.index.len() + self.escapes.len())
    }

    /// Walks the value, at `depth` of a document, for `mode`.
    fn walk<'s>(
        &'s self,
        depth: usize,
        mode: Mode,
        wants: &[Want],
        sink: &mut Sink<'s, '_>,
        max_depth: usize,
    ) -> Result<(), JsonError> {
        let source = self.padded.get(..self.len).unwrap_or_default();
        Walk::new(source, &self.index, &self.escapes, wants, sink, max_depth).document(depth, mode)
    }
}

/// The value of one member of a document made of several texts ([`with_parts`]).
pub enum Part<'a> {
    Null,
    One(&'a Indexed),
    /// A list of values: texts, or `null` where there is none.
    List(Vec<Option<&'a Indexed>>),
}

impl<'a> Part<'a> {
    /// Its texts.
    fn texts(&self) -> impl Iterator<Item = &'a Indexed> + '_ {
        let (one, list) = match self {
            Part::Null => (None, &[][..]),
            Part::One(text) => (Some(*text), &[][..]),
            Part::List(items) => (None, items.as_slice()),
        };
        one.into_iter().chain(list.iter().flatten().copied())
    }
}

/// Runs `f` on the object `{names[i]: parts[i], ...}` read for `wants` (`None`: all of it), each
/// text where it lies: its tokens are the ones [`Indexed::new`] found, and only what is wanted
/// is written, as [`with_read`] writes it for one text. Texts checked with `max_depth` less the
/// levels the object adds above them (one for a member, two for an element of a list) are not
/// refused; a text refused anyway is answered by its member's position.
pub fn with_parts<'s, R>(
    names: &[&'s str],
    parts: &[Part<'s>],
    wants: Option<&Wants>,
    max_depth: usize,
    f: impl FnOnce(&Doc<'_, '_>) -> R,
) -> Result<R, (usize, JsonError)> {
    let (mut len, mut longest) = (0, None::<&'s Indexed>);
    for text in parts.iter().flat_map(Part::texts) {
        len += text.padded.len();
        if longest.is_none_or(|l| l.len < text.len) {
            longest = Some(text);
        }
    }
    // The strings of the longest text are written from where they lie without being looked at.
    let backing = longest.map_or(&b""[..], |text| text.padded.as_bytes());
    let whole = Wants { wants: Vec::new(), id: 0, fills: None };
    let (tree, root) = match wants {
        None => (&whole, Mode::Whole),
        Some(wants) if wants.wants.is_empty() => (wants, Mode::Skip),
        Some(wants) => (wants, Mode::Want(0)),
    };
    let mut failed = 0;
    let walks = |_: &mut Vec<u32>, _: &mut Vec<u32>, sink: &mut Sink<'s, '_>| {
        let root_want = match root {
            Mode::Skip => return Ok(()),
            Mode::Want(w) => tree.wants.get(w as usize).filter(|want| !want.whole),
            Mode::Whole => None,
        };
        let header = sink.nodes.len();
        sink.nodes.push(Node::Object { len: 0, count: 0 });
        let mut kept = 0;
        for (i, (name, part)) in names.iter().zip(parts).enumerate() {
            let mode = match root_want {
                None => Mode::Whole,
                Some(want) => {
                    let (head, tail) = words(name.as_bytes());
                    match want.members.get_words(name.as_bytes(), head, tail) {
                        Some(w) => Mode::Want(w),
                        None => continue,
                    }
                }
            };
            failed = i;
            sink.nodes.push(Node::String(name));
            kept += 1;
            match part {
                Part::Null => sink.nodes.push(Node::Static(StaticNode::Null)),
                Part::One(text) => text.walk(1, mode, &tree.wants, sink, max_depth)?,
                Part::List(items) => {
                    let element = element_mode(&tree.wants, mode);
                    let header = sink.nodes.len();
                    sink.nodes.push(Node::Array { len: 0, count: 0 });
                    let mut elements = 0;
                    for item in items.iter().filter(|_| !matches!(element, Mode::Skip)) {
                        match item {
                            None => sink.nodes.push(Node::Static(StaticNode::Null)),
                            Some(text) => text.walk(2, element, &tree.wants, sink, max_depth)?,
                        }
                        elements += 1;
                    }
                    let count = sink.nodes.len() - header - 1;
                    sink.nodes[header] = Node::Array { len: elements, count };
                }
            }
        }
        let count = sink.nodes.len() - header - 1;
        sink.nodes[header] = Node::Object { len: kept, count };
        Ok(())
    };
    with_tape(tree, len, backing, walks, f).map_err(|e| (failed, e))
}

/// The mode of the elements of a list read for `mode` (as [`Walk::array`] reads them).
fn element_mode(wants: &[Want], mode: Mode) -> Mode {
    match mode {
        Mode::Skip => Mode::Skip,
        Mode::Whole => Mode::Whole,
        Mode::Want(w) => match wants.get((w & !FILL) as usize) {
            Some(want) if want.whole => Mode::Whole,
            Some(Want { elements: Some(e), .. }) => Mode::Want(*e),
            Some(_) => Mode::Skip,
            None => Mode::Whole,
        },
    }
}

/// Largest document whose scratch a thread keeps for the next read.
const RETAIN_SCRATCH_BYTES: usize = 4 << 20;

#[derive(Default)]
struct Scratch {
    index: Vec<u32>,
    escapes: Vec<u32>,
    shapes: Vec<RememberedName>,
    /// The [`Wants::id`] `shapes` were remembered under (0: none).
    shapes_of: u64,
    nodes: Vec<Node<'static>>,
    unescaped: String,
    later: Vec<(usize, usize, usize)>,
    floats: Vec<&'static str>,
    /// [`with_rows`]: the plan's slots and the marks of a path's.
    slots: Vec<usize>,
    marks: Vec<bool>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Why the walk stopped: two words, so that every step's result is returned in registers (an
/// `Ok` is the null the reference cannot be); the message is made once, by [`Stop::error`].
#[derive(Clone, Copy)]
struct Stop {
    /// What is wrong at `at` (in a syntax error's words), or [`TOO_DEEP`].
    what: &'static &'static str,
    at: usize,
}

/// [`Stop::what`] of a text nested deeper than allowed, told apart by its address.
static TOO_DEEP: &str = "nested too deep";

impl Stop {
    fn error(self, len: usize, max_depth: usize) -> JsonError {
        let Stop { what, at } = self;
        if std::ptr::eq(what, &TOO_DEEP) {
            JsonError::TooDeep { limit: max_depth }
        } else if at >= len && *what == "not a value" {
            syntax("the text ends where a value should be", len)
        } else if at >= len {
            JsonError::Syntax { what: format!("the text ends early: {what}"), at: Some(len) }
        } else {
            syntax(what, at)
        }
    }
}

type Step = Result<(), Stop>;

const _: () = assert!(std::mem::size_of::<Step>() == 2 * std::mem::size_of::<usize>());

fn stop(what: &'static &'static str, at: usize) -> Step {
    Err(Stop { what, at })
}

/// A text nested deeper than allowed.
fn too_deep() -> Step {
    Err(Stop { what: &TOO_DEEP, at: 0 })
}

/// Member positions per object whose names a want remembers from one object to the next.
const SHAPE_MEMBERS: usize = 16;

/// Wants that remember names; the others look every name up.
const SHAPE_WANTS: usize = 32;

/// A member name at some position of the last object read under a want, by the words that
/// identify it (names of up to 16 bytes), and the want it has there ([`SKIP`]: none).
#[derive(Clone, Copy)]
struct RememberedName {
    head: u64,
    tail: u64,
    len: u32,
    want: u32,
}

/// [`RememberedName::want`] of a member nobody reads.
const SKIP: u32 = u32::MAX;

/// A position nothing is remembered at: no name has this length.
const UNSEEN: RememberedName = RememberedName { head: 0, tail: 0, len: u32::MAX, want: SKIP };

/// The walk over the tokens, checking their order and the text of numbers and literals (the
/// characters of strings were checked by the index), writing the nodes that are wanted.
struct Walk<'s, 'w> {
    source: &'s str,
    /// The tokens not yet passed.
    tokens: std::slice::Iter<'w, u32>,
    /// Where the escapes are, and the first one not yet passed.
    escapes: &'w [u32],
    next_escape: usize,
    wants: &'w [Want],
    /// Per want (the first [`SHAPE_WANTS`]), the names of the members of the object it read last,
    /// [`SHAPE_MEMBERS`] apiece. A member's want depends on its name alone, so a name found at
    /// the same position again needs no lookup: objects of a list usually share their members.
    shapes: &'w mut [RememberedName],
    nodes: &'w mut Vec<Node<'s>>,
    unescaped: &'w mut String,
    /// Strings with escapes: the node that gets each, and where it is in `unescaped`.
    later: &'w mut Vec<(usize, usize, usize)>,
    /// The texts of floats the writer may copy ([`Doc::float_text`]).
    floats: &'w mut Vec<&'s str>,
    /// When the walk fills the plan's slots and hands each object mapped over ([`with_rows`]).
    rows: Option<RowWalk<'s, 'w>>,
    max_depth: usize,
}

/// What a walk that fills a plan's slots keeps ([`with_rows`]).
struct RowWalk<'s, 'w> {
    /// The plan's slots: where the value each fills lies on the tape, [`UNFILLED`] until then.
    slots: &'w mut [usize],
    /// Whether each slot of an `each` path's names (from `plan_slots` on) is filled: once for
    /// the whole text.
    marks: &'w mut [bool],
    plan_slots: u32,
    /// Whether a row is being read, and the members of the objects its scans would have walked.
    open: bool,
    steps: u32,
    /// Whether `on_row` wants no more rows: slots are no longer filled.
    done: bool,
    /// While the rows of an `each` value are read, the tape of what holds it: each row is read
    /// on a tape of its own, from position 0, handed over and emptied, so the tape holds one
    /// element at a time.
    outer: Vec<Node<'s>>,
    swapped: bool,
    /// Where the row's unescaped text begins.
    unescaped_from: usize,
    /// The padded text.
    text: &'s [u8],
    /// Called with each row: its tape, the row's object (its position), its slots and the steps
    /// of its scans.
    on_row: &'w mut OnRow<'w>,
}

/// [`PADDING`] spaces.
const SPACES: &str = match std::str::from_utf8(&[b' '; PADDING]) {
    Ok(spaces) => spaces,
    Err(_) => "",
};

/// A slot the walk has not filled.
pub(crate) const UNFILLED: usize = usize::MAX;

impl<'s, 'w> Walk<'s, 'w> {
    fn new(
        source: &'s str,
        index: &'w [u32],
        escapes: &'w [u32],
        wants: &'w [Want],
        sink: &'w mut Sink<'s, '_>,
        max_depth: usize,
    ) -> Walk<'s, 'w> {
        Walk {
            source,
            tokens: index.iter(),
            escapes,
            next_escape: 0,
            wants,
            shapes: &mut *sink.shapes,
            nodes: &mut *sink.nodes,
            unescaped: &mut *sink.unescaped,
            later: &mut *sink.later,
            floats: &mut *sink.floats,
            rows: None,
            max_depth,
        }
    }

    /// A row starts: its slots are empty, and its tape too.
    fn open_row(&mut self) {
        if let Some(rows) = &mut self.rows {
            if !rows.done {
                rows.slots.fill(UNFILLED);
            }
            rows.steps = 0;
            rows.open = !rows.done;
            if !rows.swapped && !self.nodes.is_empty() {
                std::mem::swap(&mut *self.nodes, &mut rows.outer);
                rows.swapped = true;
            }
            // What holds the rows is not read again (nothing maps it), so its floats and the
            // strings with escapes of its names are let go.
            self.floats.clear();
            self.later.clear();
            rows.unescaped_from = self.unescaped.len();
        }
    }

    /// The row whose object is at `root` on its tape is read: it is handed over, its strings
    /// with escapes completed, and its tape emptied.
    fn end_row(&mut self, root: usize) {
        let Some(rows) = &mut self.rows else { return };
        rows.open = false;
        if rows.done {
            self.nodes.clear();
            self.floats.clear();
            self.later.clear();
            self.unescaped.truncate(rows.unescaped_from);
            return;
        }
        if !self.later.is_empty() {
            // The padding lets the writer read the unescaped strings in whole chunks too.
            self.unescaped.push_str(SPACES);
        }
        let unescaped: &str = self.unescaped.as_str();
        // The tape now also points into `unescaped`, which stays as it is while the row is read.
        let mut nodes: Vec<Node<'_>> = std::mem::take(&mut *self.nodes);
        for &(node, start, end) in self.later.iter() {
            if let (Some(slot), Some(text)) = (nodes.get_mut(node), unescaped.get(start..end)) {
                *slot = Node::String(text);
            }
        }
        let backing = write::Backing::of(rows.text, unescaped.as_bytes()).reading(rows.text.len());
        let floats: &[&str] = self.floats;
        rows.done = !(rows.on_row)(&Doc { nodes: &nodes, backing, floats }, root, rows.slots, rows.steps);
        // Emptying the tape ends its borrows; its allocation is kept.
        nodes.clear();
        *self.nodes = nodes.into_iter().map(|_| Node::Static(StaticNode::Null)).collect();
        self.floats.clear();
        self.later.clear();
        self.unescaped.truncate(rows.unescaped_from);
    }

    /// The rows of an `each` value are read: the tape that holds it is back.
    fn close_rows(&mut self) {
        if let Some(rows) = &mut self.rows
            && rows.swapped
        {
            std::mem::swap(&mut *self.nodes, &mut rows.outer);
            rows.swapped = false;
        }
    }

    /// The mode of the value of a member of an object whose members fill slots, when that
    /// member's want is `child`: with [`FILL`] when the member fills its slot now, the first
    /// of its name in the object (in the row for the plan's slots, in the text for a path's).
    #[inline(always)]
    fn fill(&mut self, child: u32) -> u32 {
        let Some(rows) = self.rows.as_mut().filter(|rows| !rows.done) else { return child };
        let slot = self.wants.get(child as usize).map_or(NO_SLOT, |want| want.slot);
        if slot < rows.plan_slots {
            let Some(found) = rows.slots.get_mut(slot as usize) else { return child };
            if *found != UNFILLED || !rows.open {
                return child;
            }
            // The value's node comes right after its name's.
            *found = self.nodes.len() + 1;
        } else {
            let Some(seen) = rows.marks.get_mut(slot.wrapping_sub(rows.plan_slots) as usize) else {
                return child;
            };
            if *seen {
                return child;
            }
            *seen = true;
        }
        child | FILL
    }

    /// The next token's position and first byte; after the last, the text's end and 0.
    #[inline(always)]
    fn token(&mut self) -> (usize, u8) {
        match self.tokens.next() {
            Some(&at) => {
                let at = at as usize;
                (at, self.source.as_bytes().get(at).copied().unwrap_or(0))
            }
            None => (self.source.len(), 0),
        }
    }

    /// Where the next token is (the text's end after the last).
    #[inline(always)]
    fn upcoming(&self) -> usize {
        self.tokens.as_slice().first().map_or(self.source.len(), |&n| n as usize)
    }

    /// The text of the string whose opening quote is at `at` (its characters were checked by the
    /// index), when the next token after it is at `until`: up to the last quote before that.
    /// Also answers whether the string has an escape.
    #[inline(always)]
    fn string_at(&mut self, at: usize, until: usize) -> (&'s str, bool) {
        let bytes = self.source.as_bytes();
        let mut end = until;
        while end > at + 1 && bytes.get(end - 1) != Some(&b'"') {
            end -= 1;
        }
        let end = end.saturating_sub(1).max(at + 1);
        // Strings are read in document order, so the escapes before this one are passed for good.
        while self.escapes.get(self.next_escape).is_some_and(|&e| (e as usize) < at) {
            self.next_escape += 1;
        }
        let escaped = self.escapes.get(self.next_escape).is_some_and(|&e| (e as usize) < end);
        (self.source.get(at + 1..end).unwrap_or_default(), escaped)
    }

    /// The whole text: one value (at `depth` of the document it is read into), then nothing.
    fn document(&mut self, depth: usize, root: Mode) -> Result<(), JsonError> {
        let walked = self.next_value(depth, root).and_then(|()| match self.tokens.as_slice().first() {
            None => Ok(()),
            Some(&at) => stop(&"text after the JSON value", at as usize),
        });
        walked.map_err(|stop| stop.error(self.source.len(), self.max_depth))
    }

    /// The string value whose opening quote is at `at`.
    #[inline(always)]
    fn string(&mut self, at: usize, mode: Mode) {
        if !matches!(mode, Mode::Skip) {
            let (text, escaped) = self.string_at(at, self.upcoming());
            self.push_string(text, escaped);
        }
    }

    /// The value whose first token, at `at`, is `byte`.
    fn value(&mut self, depth: usize, mode: Mode, at: usize, byte: u8) -> Step {
        match byte {
            b'"' => {
                self.string(at, mode);
                Ok(())
            }
            b'{' | b'[' if depth >= self.max_depth => too_deep(),
            // A container nobody reads is walked by code made for skipping, with no question of
            // what to write at each token.
            b'{' if matches!(mode, Mode::Skip) => self.object::<true>(depth + 1, mode),
            b'{' => self.object::<false>(depth + 1, mode),
            b'[' if matches!(mode, Mode::Skip) => self.array::<true>(depth + 1, mode),
            b'[' => self.array::<false>(depth + 1, mode),
            _ => {
                let Ok(text) = index::scalar_text(self.source.as_bytes(), at) else {
                    return stop(&"not a value", at);
                };
                if !matches!(mode, Mode::Skip) {
                    let text = self.source.get(at..at + text.len()).unwrap_or_default();
                    let node = scalar(text);
                    if matches!(node, StaticNode::F64(_)) && write::canonical_decimal(text) {
                        // Nodes are only added, so this float's node comes after the last one's.
                        self.floats.resize(self.nodes.len(), "");
                        self.floats.push(text);
                    }
                    self.nodes.push(Node::Static(node));
                }
                Ok(())
            }
        }
    }

    /// The next value: a string is handled here, anything else by [`Walk::value`].
    #[inline(always)]
    fn next_value(&mut self, depth: usize, mode: Mode) -> Step {
        let (at, byte) = self.token();
        if byte == b'"' {
            self.string(at, mode);
            return Ok(());
        }
        self.value(depth, mode, at, byte)
    }

    /// The positions in `text`, a string [`Walk::string_at`] just answered, of its escapes.
    fn escapes_in(&self, text: &str) -> impl Iterator<Item = usize> + use<'w> {
        let start = text.as_ptr().addr().wrapping_sub(self.source.as_ptr().addr());
        let end = start + text.len();
        let escapes: &'w [u32] = self.escapes;
        let escapes = escapes.get(self.next_escape..).unwrap_or_default();
        escapes.iter().map(move |&e| (e as usize).wrapping_sub(start)).take_while(move |&e| e < end - start)
    }

    /// Writes a string node: the text itself when it has no escape, else its unescaped form.
    #[inline(always)]
    fn push_string(&mut self, text: &'s str, escaped: bool) {
        if !escaped {
            self.nodes.push(Node::String(text));
            return;
        }
        let start = self.unescaped.len();
        unescape(text, self.escapes_in(text), self.unescaped);
        self.later.push((self.nodes.len(), start, self.unescaped.len()));
        self.nodes.push(Node::String(""));
    }

    /// The want (or [`SKIP`]) of the member called `name` (as written, escapes and all) at
    /// `position` of an object read under want `w`.
    #[inline(always)]
    fn member(&mut self, w: u32, want: &Want, position: usize, name: &str, escaped: bool) -> u32 {
        if escaped {
            let mut plain = String::new();
            unescape(name, self.escapes_in(name), &mut plain);
            let (head, tail) = words(plain.as_bytes());
            return want.members.get_words(plain.as_bytes(), head, tail).unwrap_or(SKIP);
        }
        let bytes = name.as_bytes();
        let (head, tail) = words(bytes);
        let remembered = if (w as usize) < SHAPE_WANTS && position < SHAPE_MEMBERS && bytes.len() <= 16 {
            self.shapes.get_mut(w as usize * SHAPE_MEMBERS + position)
        } else {
            None
        };
        match remembered {
            Some(seen) if seen.len as usize == bytes.len() && seen.head == head && seen.tail == tail => {
                seen.want
            }
            Some(seen) => {
                let found = want.members.get_words(bytes, head, tail).unwrap_or(SKIP);
                *seen = RememberedName { head, tail, len: bytes.len() as u32, want: found };
                found
            }
            None => want.members.get_words(bytes, head, tail).unwrap_or(SKIP),
        }
    }

    /// The object after its `{`, read in `mode`; `SKIPPED` when that is [`Mode::Skip`].
    fn object<const SKIPPED: bool>(&mut self, depth: usize, mode: Mode) -> Step {
        let wanted = match mode {
            Mode::Want(w) if !SKIPPED => match self.wants.get((w & !FILL) as usize) {
                Some(want) if !want.whole => Some((w & !FILL, want)),
                _ => None,
            },
            _ => None,
        };
        // Whether its members fill slots, and whether it is the `each` value, a row of its own.
        let filling = wanted.is_some() && matches!(mode, Mode::Want(w) if w & FILL != 0);
        let each = filling && wanted.is_some_and(|(_, want)| want.each);
        if each {
            self.open_row();
        }
        let mode = if SKIPPED {
            Mode::Skip
        } else if wanted.is_none() && !matches!(mode, Mode::Skip) {
            Mode::Whole
        } else {
            mode
        };
        let header = self.nodes.len();
        if !SKIPPED && !matches!(mode, Mode::Skip) {
            self.nodes.push(Node::Object { len: 0, count: 0 });
        }
        let mut kept = 0;
        let (at, byte) = self.token();
        match byte {
            b'}' => {
                if !SKIPPED {
                    self.close(header, mode, kept, true);
                    if each {
                        self.end_row(header);
                        self.close_rows();
                    }
                }
                return Ok(());
            }
            b'"' => {}
            _ => return stop(&"expected a member name", at),
        }
        let mut name_at = at;
        for position in 0.. {
            let (at, byte) = self.token();
            if byte != b':' {
                return stop(&"expected ':'", at);
            }
            // The name, found once, unless nothing of this object is written.
            let (name, escaped) =
                if SKIPPED || matches!(mode, Mode::Skip) { ("", false) } else { self.string_at(name_at, at) };
            let member = match (mode, wanted) {
                _ if SKIPPED => Mode::Skip,
                (Mode::Skip, _) => Mode::Skip,
                (_, None) => Mode::Whole,
                (_, Some((w, want))) => match self.member(w, want, position, name, escaped) {
                    SKIP => Mode::Skip,
                    child if filling => Mode::Want(self.fill(child)),
                    child => Mode::Want(child),
                },
            };
            if !SKIPPED && !matches!(member, Mode::Skip) {
                self.push_string(name, escaped);
                kept += 1;
            }
            self.next_value(depth, member)?;
            let (at, byte) = self.token();
            match byte {
                b'}' => break,
                b',' => {
                    let (at, byte) = self.token();
                    if byte != b'"' {
                        return stop(&"expected a member name", at);
                    }
                    name_at = at;
                }
                _ => return stop(&"expected ',' or '}'", at),
            }
        }
        if !SKIPPED {
            self.close(header, mode, kept, true);
            if filling
                && let Some(rows) = &mut self.rows
                && rows.open
            {
                // The executor's scan of this object would have stepped over its members.
                rows.steps = rows.steps.saturating_add(kept as u32);
            }
            if each {
                self.end_row(header);
                self.close_rows();
            }
        }
        Ok(())
    }

    /// Completes the header of the container written at `header` with `kept` members or elements.
    #[inline(always)]
    fn close(&mut self, header: usize, mode: Mode, kept: usize, object: bool) {
        if !matches!(mode, Mode::Skip) {
            let count = self.nodes.len() - header - 1;
            if let Some(node) = self.nodes.get_mut(header) {
                *node =
                    if object { Node::Object { len: kept, count } } else { Node::Array { len: kept, count } };
            }
        }
    }

    /// The list after its `[`, read in `mode`; `SKIPPED` when that is [`Mode::Skip`].
    fn array<const SKIPPED: bool>(&mut self, depth: usize, mode: Mode) -> Step {
        let element = if SKIPPED { Mode::Skip } else { element_mode(self.wants, mode) };
        // Of a list whose members fill slots, the first element fills them (a scan follows a
        // list to it); of the `each` list, every element is a row of its own.
        let (mut filling, each) = match (mode, element) {
            (Mode::Want(w), Mode::Want(_)) if !SKIPPED && w & FILL != 0 => {
                (true, self.wants.get((w & !FILL) as usize).is_some_and(|want| want.each))
            }
            _ => (false, false),
        };
        let header = self.nodes.len();
        if !SKIPPED && !matches!(mode, Mode::Skip) {
            self.nodes.push(Node::Array { len: 0, count: 0 });
        }
        let written = !SKIPPED && !matches!(element, Mode::Skip);
        let mut kept = 0;
        if self.tokens.as_slice().first().and_then(|&at| self.source.as_bytes().get(at as usize))
            == Some(&b']')
        {
            self.tokens.next();
            if !SKIPPED {
                self.close(header, mode, kept, false);
            }
            return Ok(());
        }
        loop {
            match element {
                Mode::Want(e) if each => {
                    self.open_row();
                    self.next_value(depth, Mode::Want(e | FILL))?;
                    self.end_row(0);
                }
                Mode::Want(e) if filling => {
                    filling = false;
                    self.next_value(depth, Mode::Want(e | FILL))?;
                }
                _ => self.next_value(depth, element)?,
            }
            kept += usize::from(written);
            let (at, byte) = self.token();
            match byte {
                b']' => break,
                b',' => {}
                _ => return stop(&"expected ',' or ']'", at),
            }
        }
        if each {
            self.close_rows();
        }
        if !SKIPPED {
            self.close(header, mode, kept, false);
        }
        Ok(())
    }
}

/// The value of a number or literal whose text was checked, as the tape parser gives it: an
/// integer as `U64` (not negative) or `I64` (negative, and `-0` as 0) when it fits, else, like
/// every number with a fraction or an exponent, the nearest double.
fn scalar(text: &str) -> StaticNode {
    match text.as_bytes().first() {
        Some(b't') => return StaticNode::Bool(true),
        Some(b'f') => return StaticNode::Bool(false),
        Some(b'n') => return StaticNode::Null,
        _ => {}
    }
    let integer = !text.bytes().any(|b| matches!(b, b'.' | b'e' | b'E'));
    if integer {
        match text.strip_prefix('-') {
            Some(digits) => {
                if let Ok(magnitude) = digits.parse::<u64>()
                    && magnitude <= 1 << 63
                {
                    return StaticNode::I64((magnitude as i64).wrapping_neg());
                }
            }
            None => {
                if let Ok(value) = text.parse::<u64>() {
                    return StaticNode::U64(value);
                }
            }
        }
    }
    StaticNode::F64(text.parse::<f64>().unwrap_or(f64::NAN))
}

/// Appends the characters of the JSON string body `text` (checked: every escape is complete, and
/// surrogates come in pairs) to `out`; `escapes` are the positions in `text` of its escapes'
/// backslashes, in order (a pair's low surrogate's too, or not).
fn unescape(text: &str, escapes: impl Iterator<Item = usize>, out: &mut String) {
    let mut done = 0;
    for at in escapes {
        // The low surrogate of a pair was read with its high one.
        if at < done {
            continue;
        }
        out.push_str(text.get(done..at).unwrap_or_default());
        let after = text.get(at + 1..).unwrap_or_default();
        let (c, used) = match after.as_bytes().first() {
            Some(b'b') => ('\u{8}', 1),
            Some(b'f') => ('\u{c}', 1),
            Some(b'n') => ('\n', 1),
            Some(b'r') => ('\r', 1),
            Some(b't') => ('\t', 1),
            Some(b'u') => {
                let unit = |at: usize| after.get(at..at + 4).and_then(|h| u32::from_str_radix(h, 16).ok());
                match unit(1) {
                    Some(high @ 0xd800..=0xdbff) => match (after.get(5..7), unit(7)) {
                        (Some("\\u"), Some(low @ 0xdc00..=0xdfff)) => {
                            let c = 0x10000 + ((high - 0xd800) << 10) + (low - 0xdc00);
                            (char::from_u32(c).unwrap_or('\u{fffd}'), 11)
                        }
                        _ => ('\u{fffd}', 5),
                    },
                    Some(unit) => (char::from_u32(unit).unwrap_or('\u{fffd}'), 5),
                    None => ('\u{fffd}', 1),
                }
            }
            Some(&b) => (char::from(b), 1),
            None => ('\\', 0),
        };
        out.push(c);
        done = at + 1 + used;
    }
    out.push_str(text.get(done..).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::{Indexed, Part, Want, Wants, with_parts, with_read};
    use crate::json::keys::KeyTable;
    use crate::rules::{Limits, compile_json};

    fn indexed(text: &str) -> Indexed {
        Indexed::new(text.as_bytes().to_vec(), 62).expect("JSON")
    }

    fn written(doc: &crate::json::Doc<'_, '_>) -> String {
        let mut out = Vec::new();
        crate::json::value(&mut out, doc, 0);
        String::from_utf8(out).unwrap()
    }

    /// The verdict of reading `text` nested at most `max_depth` deep with nothing wanted (the
    /// skipping readers) and with everything wanted (the readers that write), which must agree.
    fn skipped_and_read_whole(text: &[u8], max_depth: usize) -> (String, String) {
        let nothing = Wants::new(Vec::new());
        let whole = Wants::new(vec![Want::new(true, KeyTable::new(&[]), None)]);
        let verdict = |wants: &Wants| {
            let read = with_read(&mut text.to_vec(), wants, max_depth, |doc| doc.nodes.len());
            read.map_or_else(|e| format!("{e:?}"), |_| "taken".to_owned())
        };
        (verdict(&nothing), verdict(&whole))
    }

    /// A container skipped is checked by the readers' copies made for skipping, which write
    /// nothing: they take the same texts as the copies that write, and stop at the same token for
    /// the same reason, on texts nested 1 to 7 levels, 60 to 69 and 124 to 131 (more where
    /// objects hold lists), within limits below, at and past their depth.
    #[test]
    fn skipping_refuses_what_reading_whole_refuses_at_every_depth() {
        let mut texts = Vec::new();
        for levels in (1..8).chain(60..70).chain(124..132) {
            let (open_list, close_list) = ("[".repeat(levels), "]".repeat(levels));
            let (open_object, close_object) = (r#"{"a":"#.repeat(levels), "}".repeat(levels));
            let mixed_open: String =
                (0..levels).map(|i| if i % 3 == 0 { r#"{"k":["# } else { "[" }).collect();
            let mixed_close: String =
                (0..levels).rev().map(|i| if i % 3 == 0 { "]}" } else { "]" }).collect();
            for inner in ["1", "", "[]", "{}", r#""s""#, "1,", "tru", "]", "}", r#"{"a" 1}"#, r#"{"a":1,}"#] {
                texts.push(format!("{open_list}{inner}{close_list}"));
                texts.push(format!("{open_object}{inner}{close_object}"));
                texts.push(format!("{mixed_open}{inner}{mixed_close}"));
                // Closed once too few and once too many, and followed by more of the same.
                texts.push(format!("{open_list}{inner}{}", &close_list[1..]));
                texts.push(format!("{open_object}{inner}{close_object}}}"));
                texts.push(format!("[{mixed_open}{inner}{mixed_close},{mixed_open}0{mixed_close}]"));
            }
        }
        let mut refused = 0;
        for text in &texts {
            for max_depth in [3, 64, 65, 66, 129, 1024] {
                let (skipped, whole) = skipped_and_read_whole(text.as_bytes(), max_depth);
                assert_eq!(skipped, whole, "{text} within {max_depth}");
                refused += usize::from(skipped != "taken");
            }
        }
        // Both verdicts occur, and often.
        let taken = texts.len() * 6 - refused;
        assert!(refused > texts.len() / 2 && taken > texts.len() / 2, "{refused} refused, {taken} taken");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2048, ..Default::default() })]

        /// Texts a few bytes away from valid ones: the skipping readers and the readers that write
        /// give the same verdict, the same reason at the same place.
        #[test]
        fn skipping_judges_damaged_texts_as_reading_whole_does(
            edits in proptest::collection::vec(
                (proptest::prelude::any::<proptest::sample::Index>(), 0u8..3, proptest::prelude::any::<u8>()),
                0..4,
            ),
            pick in 0usize..3,
        ) {
            let valid = [
                r#"{"a":[1,-2.5e3,true,null,{"b":"x\"y\u00e9"}],"c":{"d":[[],{}],"e":[{"f":[0]}]},"g":{}}"#,
                r#"[[[[{"a":[[{"b":{"c":[1,[2,{"d":null}]]}}]]}]]], {"": ""}, "\\\""]"#,
                r#"{"meals":[{"idMeal":"52772","tags":["a","b"],"n":17,"o":{"p":false}}]}"#,
            ][pick];
            let mut text = valid.as_bytes().to_vec();
            for (at, kind, byte) in edits {
                let i = at.index(text.len() + 1);
                // Structural bytes more often than any byte.
                let byte = match byte % 4 {
                    0 => b"{}[]:,\"1 \"t"[usize::from(byte) % 10],
                    _ => byte,
                };
                match kind {
                    0 if i < text.len() => text[i] = byte,
                    1 if i < text.len() => { text.remove(i); }
                    _ => text.insert(i, byte),
                }
            }
            for max_depth in [4, 1024] {
                let (skipped, whole) = skipped_and_read_whole(&text, max_depth);
                proptest::prop_assert_eq!(skipped, whole, "{}", String::from_utf8_lossy(&text));
            }
        }
    }

    /// Read whole, the parts are one object, each text's nodes where its member is.
    #[test]
    fn parts_are_read_into_one_object() {
        let (a, b, c) = (
            indexed(r#"{"name":"Ada","tags":["x","y\n"]}"#),
            indexed("[1,2.5,{\"k\":null}]"),
            indexed("\"text\""),
        );
        let parts = [Part::One(&a), Part::One(&b), Part::Null, Part::List(vec![Some(&c), None])];
        let out = with_parts(&["user", "orders", "none", "list"], &parts, None, 64, written).unwrap();
        assert_eq!(
            out,
            r#"{"user":{"name":"Ada","tags":["x","y\n"]},"orders":[1,2.5,{"k":null}],"none":null,"list":["text",null]}"#
        );
    }

    /// For rules' wants, mapping the parts gives what mapping the same document parsed whole
    /// gives, for rules that read a member's insides, a list's elements, a value whole, or
    /// nothing of a member; members nobody reads are not written at all.
    #[test]
    fn parts_read_for_wants_map_as_the_whole_document_does() {
        let texts = [
            r#"{"meals":[{"id":"1","name":"Soup","tags":"a,b"},{"id":"2","name":"Pie"}],"n":3}"#,
            r#"{"areas":[{"strArea":"Greek"}],"skip":{"deep":[1,2,{"x":"\u00e9"}]}}"#,
            r#"[{"v":1.5},{"v":"2"},{"v":null}]"#,
        ];
        let rules = [
            r#"{"newBodyFields":{"x":{"key":"x","type":"String"}},"oldBodyFields":{"x":{"expr":"a.meals[1].name"}}}"#,
            r#"{"newBodyFields":{"x":{"key":"x","type":"Json"},"y":{"key":"y","type":"Int"}},"oldBodyFields":{"x":{"keys":["b"]},"y":{"keys":["n"],"parents":["a"]}}}"#,
            r#"{"newBodyFields":{"v":{"key":"v","type":"Float"}},"oldBodyFields":{"v":{"keys":["v"]}},"each":"c"}"#,
            r#"{"newBodyFields":{"s":{"key":"s","type":"Json"}},"oldBodyFields":{"s":{"expr":"length(c)"}}}"#,
            r#"{"newBodyFields":{"r":{"key":"r","type":"Json"}},"oldBodyFields":{"r":{"keys":["request"]}}}"#,
        ];
        let (a, b, c) = (indexed(texts[0]), indexed(texts[1]), indexed(texts[2]));
        let request = indexed(r#"{"query":{"id":"7"}}"#);
        let names = ["a", "b", "c", "list", "request"];
        let parts = [
            Part::One(&a),
            Part::One(&b),
            Part::One(&c),
            Part::List(vec![Some(&a), None]),
            Part::One(&request),
        ];
        let whole = format!(
            r#"{{"a":{},"b":{},"c":{},"list":[{},null],"request":{{"query":{{"id":"7"}}}}}}"#,
            texts[0], texts[1], texts[2], texts[0]
        );
        let limits = crate::rules::Limits::default();
        for rules in rules {
            let plan = compile_json(rules.as_bytes(), &limits).expect("rules").plan;
            let mut expected = Vec::new();
            crate::json::with_parsed(&mut whole.clone().into_bytes(), 64, |doc| {
                crate::exec::execute(&plan, doc, 0, &mut expected)
            })
            .unwrap();
            let mut out = Vec::new();
            let tape = with_parts(&names, &parts, plan.wants.as_ref(), 64, |doc| {
                crate::exec::execute(&plan, doc, 0, &mut out);
                doc.len()
            })
            .unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), String::from_utf8(expected).unwrap(), "{rules}");
            if plan.wants.is_some() {
                assert!(tape < 30, "only what is read is written: {tape} nodes for {rules}");
            }
        }
    }

    /// A text is refused as `diagnose` refuses it, for the same reason.
    #[test]
    fn an_indexed_text_is_refused_as_diagnose_refuses_it() {
        for (text, depth) in [
            (&b"{\"a\":"[..], 8),
            (b"[[[[1]]]]", 3),
            (b"\xff", 8),
            (b"", 8),
            (b"[1,]", 8),
            (b"\"\\x\"", 8),
            (b"{} x", 8),
        ] {
            let indexed = Indexed::new(text.to_vec(), depth).err().expect("refused");
            assert_eq!(Some(indexed), crate::json::diagnose(text, depth).err(), "{text:?}");
        }
        let kept = Indexed::new(b"  {\"a\": [1, \"b\\n\"]} ".to_vec(), 8).expect("JSON");
        assert_eq!(kept.text(), b"  {\"a\": [1, \"b\\n\"]} ");
    }

    /// Floats whose text is what the writer writes for them keep it; other numbers do not.
    #[test]
    fn floats_keep_their_text_when_it_is_what_the_writer_writes() {
        let whole = Wants::new(vec![Want::new(true, KeyTable::new(&[]), None)]);
        let mut text = br#"{"a":12.25,"b":12.250,"c":1e2,"d":3,"e":[-0.5,0.1,1.5E1]}"#.to_vec();
        let kept = with_read(&mut text, &whole, 8, |doc| {
            (0..doc.len()).map(|i| doc.float_text(i).map(str::to_owned)).collect::<Vec<_>>()
        })
        .expect("read");
        let mut expected = vec![None; 14];
        expected[2] = Some("12.25".to_owned());
        expected[11] = Some("-0.5".to_owned());
        expected[12] = Some("0.1".to_owned());
        assert_eq!(kept, expected);
    }

    /// Nesting as deep as `RECAST_MAX_DEPTH` allows (1024) is read and mapped on a thread with a
    /// worker's stack, in each of the walk's modes: values read through wants (a list followed by
    /// a scan), read whole, and skipped. (A release build also passes on the standard 2 MiB stack;
    /// a debug build overflows it.)
    #[test]
    fn the_deepest_nesting_allowed_is_read_on_a_standard_stack_in_every_mode() {
        const DEPTH: usize = 1024;
        let nested = |inner: &str| format!("{}{inner}{}", "[".repeat(DEPTH - 1), "]".repeat(DEPTH - 1));
        let limits = Limits { max_depth: DEPTH, ..Limits::default() };
        let rules =
            br#"{"newBodyFields":{"a":{"key":"a","type":"Json"}},"oldBodyFields":{"a":{"keys":["a"]}}}"#;
        let plan = compile_json(rules, &limits).expect("rules").plan;
        let cases = [
            (nested(r#"{"a":1}"#), r#"{"a":1}"#.to_owned()),
            (format!(r#"{{"a":{}}}"#, nested("1")), format!(r#"{{"a":{}}}"#, nested("1"))),
            (format!(r#"{{"b":{},"a":2}}"#, nested("1")), r#"{"a":2}"#.to_owned()),
        ];
        std::thread::Builder::new()
            .stack_size(crate::workers::STACK_BYTES)
            .spawn(move || {
                for (text, expected) in cases {
                    let mut out = Vec::new();
                    crate::exec::map_text(&plan, &mut text.into_bytes(), DEPTH, &mut out).expect("read");
                    assert_eq!(String::from_utf8(out).unwrap(), expected);
                }
            })
            .expect("a thread")
            .join()
            .expect("no overflow");
    }
}
