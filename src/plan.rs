//! The compiled form of a rules document: a flat list of [`Op`]s that the executor runs in order.
//!
//! Only the compiler builds a `Plan` and only the executor runs one. Every field name is resolved
//! to a *slot* (a small integer) at compile time: a [`Op::Scan`] walks one object of the input once
//! and records, for each wanted member, where its value sits in the tape; later ops read slots.
//! Targets that share a `parents` prefix share the scans of that prefix.

use std::fmt;

use crate::expr::Program;
use crate::json::write::Words;
use crate::rules::{KeyEntry, Type};

/// Index of a slot: the tape position of one member value found by a scan.
pub type SlotId = u32;

/// A compiled rules document.
#[derive(Debug, Clone)]
pub struct Plan {
    pub(crate) ignore_empty: bool,
    /// `each`: where the list whose elements are mapped one by one is.
    pub(crate) each: Option<Each>,
    /// Scans first (each after the scan that fills its input slot), then one op per target in
    /// output order.
    pub(crate) ops: Vec<Op>,
    pub(crate) slot_count: usize,
    /// Number of [`Op::Scan`]s.
    pub(crate) scan_count: usize,
    pub(crate) targets: Vec<Target>,
    /// Element reads of [`Op::Array`] ops.
    pub(crate) reads: Vec<Read>,
    /// Slots of the parts of every concatenation.
    pub(crate) parts: Vec<SlotId>,
    /// Compiled expressions of [`Op::Expr`] targets and of `each`.
    pub(crate) programs: Vec<Program>,
    /// Bytes the values built by one call's expressions may take (`RECAST_MAX_EXPR_BYTES`).
    pub(crate) expr_budget: usize,
    /// What the plan reads of a document, for reading only that; `None` when an expression may
    /// read anything ([`crate::exec::wants`]).
    pub(crate) wants: Option<crate::json::ondemand::Wants>,
}

/// Where `each` finds its list.
#[derive(Debug, Clone)]
pub(crate) enum Each {
    /// `"each": ["data", "items"]`.
    Path(Box<[Box<str>]>),
    /// `"each": "data.items[?inStock]"`: an index into [`Plan::programs`].
    Expr(u32),
}

/// One instruction of a plan.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// The walk into one object: the root (or an `each` element) with `input: Root`, or the object
    /// reached through a `parents` prefix, whose value a previous scan put in slot `input`.
    /// A list found there is followed to its first element (SPEC §1.2), unless the scan is
    /// `strict`: the scans of an expression's plain path (`a.b[0].c`, SPEC §1.8) read only an
    /// object. Records in its slots the values of the members named in `table`.
    Scan { input: Input, strict: bool, table: KeyTable },
    /// An index step of an expression's plain path (`a[0]`): records in `slot` the element at
    /// `index` (from the end when negative) of the list at `input`, if it is one and has it.
    Index { input: Input, index: i64, slot: SlotId },
    /// A `String` target whose `keys` has one entry naming one field (`"keys": ["strMeal"]`): the
    /// most common target, whose text values are copied without going through coercion.
    Text { target: u32, slot: SlotId, member: Member },
    /// A target whose `keys` has one concatenation entry (`"keys": ["a, b"]`); always `String`.
    Concat { target: u32, parts: Span, member: Member },
    /// A target of another type whose `keys` has one entry naming one field. `Text` and `Field`
    /// also write the targets whose expression is a plain path, from the slot its scans fill.
    Field { target: u32, ty: Type, slot: SlotId, member: Member },
    /// A target whose `keys` has several entries; written as a JSON array in entry order.
    Array { target: u32, ty: Type, reads: Span, member: Member },
    /// A target whose source is an `expr` (SPEC §1.8): the program's value, coerced like a value
    /// read by one key.
    Expr { target: u32, ty: Type, program: u32, member: Member },
}

/// The output member name of a target as written: `"key":`, escaped and split into words once at
/// compile time, with and without the comma that separates it from the member before.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    first: Words,
    next: Words,
}

impl Member {
    pub fn new(key: &str) -> Member {
        let mut bytes = vec![b','];
        crate::json::write::string(&mut bytes, key);
        bytes.push(b':');
        Member { first: Words::new(&bytes[1..]), next: Words::new(&bytes) }
    }

    /// Writes the member name, with the leading comma unless it is the object's first member.
    #[inline(always)]
    pub fn write(&self, out: &mut Vec<u8>, first: bool) {
        if first { self.first.write(out) } else { self.next.write(out) }
    }
}

/// Where a scan finds its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Input {
    Root,
    Slot(SlotId),
}

/// One `keys` entry.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Read {
    /// A single field name.
    Slot(SlotId),
    /// `"a, b"`: the parts of a concatenation, as a range of [`Plan::parts`].
    Concat(Span),
}

/// A range into one of the plan's pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }
}

/// One output member, with what traces need to explain it.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The rule id in `newBodyFields`.
    pub id: Box<str>,
    pub key: Box<str>,
    pub ty: Type,
    pub parents: Box<[Box<str>]>,
    pub keys: Box<[KeyEntry]>,
    /// The expression, for a target whose source is one.
    pub expr: Option<Box<str>>,
}

impl Plan {
    /// Number of output members (targets).
    pub fn target_count(&self) -> usize {
        self.targets.len()
    }

    /// Bytes the values built by one call's expressions may take.
    pub fn expr_budget(&self) -> usize {
        self.expr_budget
    }

    /// Whether the output is a list (the rules have `each`).
    pub fn is_each(&self) -> bool {
        self.each.is_some()
    }
}

/// Lookup from member name to slot for one scan: open addressing over a power-of-two table,
/// at most half full, so a name that is not wanted usually costs one hash and one probe.
///
/// Each entry keeps the name's length and its first and last eight bytes ([`words`]). Those
/// determine a name of up to 16 bytes completely, so most comparisons are two integer compares;
/// longer names are compared in full after the words match.
#[derive(Clone)]
pub(crate) struct KeyTable {
    mask: usize,
    entries: Box<[Entry]>,
    /// All names, back to back; entries point into it.
    names: Box<[u8]>,
    len: usize,
}

#[derive(Clone, Copy)]
struct Entry {
    head: u64,
    tail: u64,
    start: u32,
    len: u32,
    /// `EMPTY` for a free entry.
    slot: SlotId,
}

const EMPTY: SlotId = SlotId::MAX;

impl KeyTable {
    /// Builds the table; names must be distinct.
    pub fn new(names: &[(&str, SlotId)]) -> KeyTable {
        let size = (names.len() * 2).next_power_of_two().max(4);
        let free = Entry { head: 0, tail: 0, start: 0, len: 0, slot: EMPTY };
        let mut table = KeyTable {
            mask: size - 1,
            entries: vec![free; size].into_boxed_slice(),
            names: names.iter().flat_map(|(n, _)| n.bytes()).collect(),
            len: names.len(),
        };
        let mut start = 0;
        for &(name, slot) in names {
            let (head, tail) = words(name.as_bytes());
            let mut i = hash(head, tail, name.len()) & table.mask;
            while table.entries[i].slot != EMPTY {
                i = (i + 1) & table.mask;
            }
            table.entries[i] = Entry { head, tail, start: start as u32, len: name.len() as u32, slot };
            start += name.len();
        }
        table
    }

    /// The slot of member `name`, if this scan wants it.
    #[cfg(test)]
    pub fn get(&self, name: &[u8]) -> Option<SlotId> {
        let (head, tail) = words(name);
        self.get_words(name, head, tail)
    }

    /// [`KeyTable::get`] for a name whose [`words`] are known.
    #[inline(always)]
    pub fn get_words(&self, name: &[u8], head: u64, tail: u64) -> Option<SlotId> {
        let mut i = hash(head, tail, name.len()) & self.mask;
        loop {
            let entry = self.entries.get(i)?;
            if entry.slot == EMPTY {
                return None;
            }
            if entry.head == head && entry.tail == tail && entry.len as usize == name.len() {
                if name.len() <= 16 {
                    return Some(entry.slot);
                }
                let start = entry.start as usize;
                if self.names.get(start..start + name.len()) == Some(name) {
                    return Some(entry.slot);
                }
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Number of names in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `(name, slot)` pairs in slot order.
    pub fn names(&self) -> Vec<(&str, SlotId)> {
        let mut out: Vec<_> = self
            .entries
            .iter()
            .filter(|e| e.slot != EMPTY)
            .map(|e| {
                let bytes = &self.names[e.start as usize..(e.start + e.len) as usize];
                (std::str::from_utf8(bytes).unwrap_or("?"), e.slot)
            })
            .collect();
        out.sort_by_key(|&(_, slot)| slot);
        out
    }
}

impl fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.names()).finish()
    }
}

/// Two words that, with the length, identify a name of up to 16 bytes: the first and the last
/// eight bytes (overlapping for shorter names; four-byte halves below eight; the bytes themselves
/// below four).
#[inline(always)]
pub(crate) fn words(name: &[u8]) -> (u64, u64) {
    if let (Some(head), Some(tail)) = (name.first_chunk::<8>(), name.last_chunk::<8>()) {
        (u64::from_le_bytes(*head), u64::from_le_bytes(*tail))
    } else if let (Some(head), Some(tail)) = (name.first_chunk::<4>(), name.last_chunk::<4>()) {
        (u64::from(u32::from_le_bytes(*head)), u64::from(u32::from_le_bytes(*tail)))
    } else {
        match *name {
            [a] => (u64::from(a) * 0x01_01_01, 0),
            [a, b] => (u64::from(a) | (u64::from(b) * 0x01_01_00), 0),
            [a, b, c] => (u64::from(a) | (u64::from(b) << 8) | (u64::from(c) << 16), 0),
            _ => (0, 0),
        }
    }
}

/// Mixes the words and length of a name; distinct for the usual families of API field names
/// (`strIngredient1`, `strIngredient2`, ...).
#[inline(always)]
fn hash(head: u64, tail: u64, len: usize) -> usize {
    let mixed = (head ^ tail.rotate_left(29) ^ len as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed ^ (mixed >> 29)) as usize
}

/// A readable listing of the plan, one op per line (used in snapshot tests and `recast check`).
impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ignore_empty {
            writeln!(f, "ignore empty values")?;
        }
        match &self.each {
            Some(Each::Path(path)) => writeln!(f, "each {}", path.join("."))?,
            Some(Each::Expr(program)) => {
                writeln!(f, "each expr {}", self.programs[*program as usize].source())?
            }
            None => {}
        }
        let slot = |s: SlotId| format!("s{s}");
        let from = |input: Input| match input {
            Input::Root => "root".to_owned(),
            Input::Slot(s) => slot(s),
        };
        let read = |r: &Read| match r {
            Read::Slot(s) => slot(*s),
            Read::Concat(span) => {
                let parts: Vec<_> = self.parts[span.range()].iter().map(|s| slot(*s)).collect();
                format!("concat({})", parts.join(" "))
            }
        };
        for op in &self.ops {
            match op {
                Op::Scan { input, strict, table } => {
                    let names: Vec<_> =
                        table.names().iter().map(|(n, s)| format!("{n}→{}", slot(*s))).collect();
                    let kind = if *strict { "strict scan" } else { "scan" };
                    writeln!(f, "{kind} {}: {}", from(*input), names.join(" "))?;
                }
                Op::Index { input, index, slot: s } => {
                    writeln!(f, "index {}[{index}]→{}", from(*input), slot(*s))?;
                }
                Op::Text { target, slot: s, .. } | Op::Field { target, slot: s, .. } => {
                    let t = &self.targets[*target as usize];
                    let path = t.expr.as_ref().map(|e| format!(" (expr {e})")).unwrap_or_default();
                    writeln!(f, "field {} ({}) ← {}{path}", t.key, t.ty.name(), slot(*s))?;
                }
                Op::Concat { target, parts, .. } => {
                    let t = &self.targets[*target as usize];
                    writeln!(f, "field {} ({}) ← {}", t.key, t.ty.name(), read(&Read::Concat(*parts)))?;
                }
                Op::Array { target, reads, .. } => {
                    let t = &self.targets[*target as usize];
                    let rs: Vec<_> = self.reads[reads.range()].iter().map(read).collect();
                    writeln!(f, "array {} ({}) ← [{}]", t.key, t.ty.name(), rs.join(", "))?;
                }
                Op::Expr { target, program, .. } => {
                    let t = &self.targets[*target as usize];
                    let source = self.programs[*program as usize].source();
                    writeln!(f, "expr {} ({}) ← {source}", t.key, t.ty.name())?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_table_finds_every_name_and_nothing_else() {
        let names: Vec<String> = (1..=20)
            .flat_map(|i| [format!("strIngredient{i}"), format!("strMeasure{i}")])
            .chain(["a", "ab", "abc", "", "idMeal", "ünï"].map(String::from))
            .collect();
        let pairs: Vec<(&str, SlotId)> =
            names.iter().enumerate().map(|(i, n)| (n.as_str(), i as SlotId)).collect();
        let table = KeyTable::new(&pairs);
        for (name, slot) in &pairs {
            assert_eq!(table.get(name.as_bytes()), Some(*slot), "{name}");
        }
        let long = "a fairly long member name, longer than sixteen bytes";
        let table = KeyTable::new(&[(long, 0), ("strIngredient1", 1)]);
        assert_eq!(table.get(long.as_bytes()), Some(0));
        let same_words = "a fairly long member name. longer than sixteen bytes";
        assert_eq!(table.get(same_words.as_bytes()), None, "equal head, tail and length, different middle");
        let table = KeyTable::new(&pairs);
        for other in ["strIngredient21", "strMeasure0", "b", "abcd", "IdMeal", "x".repeat(100).as_str()] {
            assert_eq!(table.get(other.as_bytes()), None, "{other}");
        }
        assert_eq!(table.len(), pairs.len());
    }

    #[test]
    fn names_of_every_short_length_are_told_apart() {
        // Every string over {a, b} of up to 9 bytes: lengths around each packing boundary.
        let names: Vec<String> = (0..=9)
            .flat_map(|n| {
                (0..1u32 << n)
                    .map(move |bits| (0..n).map(|i| if bits >> i & 1 == 1 { 'b' } else { 'a' }).collect())
            })
            .collect();
        let pairs: Vec<(&str, SlotId)> =
            names.iter().enumerate().map(|(i, n)| (n.as_str(), i as SlotId)).collect();
        let table = KeyTable::new(&pairs);
        for (name, slot) in &pairs {
            assert_eq!(table.get(name.as_bytes()), Some(*slot), "{name:?}");
        }
        assert_eq!(table.get(b"c"), None);
        assert_eq!(table.get(b"aaaaaaaaaa"), None);
    }
}
