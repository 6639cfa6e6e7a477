//! The compiled form of a rules document: a flat list of [`Op`]s that the executor runs in order.
//!
//! Only the compiler builds a `Plan` and only the executor runs one. Every field name is resolved
//! to a *slot* (a small integer) at compile time: a [`Op::Scan`] walks one object of the input once
//! and records, for each wanted member, where its value sits in the tape; later ops read slots.
//! Targets that share a `parents` prefix share the scans of that prefix.

use std::fmt;

use crate::rules::{KeyEntry, Type};

/// Index of a slot: the tape position of one member value found by a scan.
pub type SlotId = u32;

/// A compiled rules document.
#[derive(Debug, Clone)]
pub struct Plan {
    pub(crate) ignore_empty: bool,
    /// `each`: the path to the list whose elements are mapped one by one.
    pub(crate) each: Option<Box<[Box<str>]>>,
    /// Scans first (each after the scan that fills its input slot), then one op per target in
    /// output order.
    pub(crate) ops: Vec<Op>,
    pub(crate) slot_count: usize,
    pub(crate) targets: Vec<Target>,
    /// Element reads of [`Op::Array`] ops.
    pub(crate) reads: Vec<Read>,
    /// Slots of the parts of every concatenation.
    pub(crate) parts: Vec<SlotId>,
}

/// One instruction of a plan.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// The walk into one object: the root (or an `each` element) with `input: Root`, or the object
    /// reached through a `parents` prefix, whose value a previous scan put in slot `input`.
    /// A list found there is followed to its first element (SPEC §1.2). Records in its slots the
    /// values of the members named in `table`.
    Scan { input: Input, table: KeyTable },
    /// A target whose `keys` has one entry: `"keys": ["strMeal"]` or `"keys": ["a, b"]`.
    Field { target: u32, read: Read },
    /// A target whose `keys` has several entries; written as a JSON array in entry order.
    Array { target: u32, reads: Span },
}

/// Where a scan finds its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// `"key":` with the key escaped once, at compile time.
    pub key_json: Box<[u8]>,
    pub ty: Type,
    pub parents: Box<[Box<str>]>,
    pub keys: Box<[KeyEntry]>,
}

impl Plan {
    /// Number of output members (targets).
    pub fn target_count(&self) -> usize {
        self.targets.len()
    }

    /// Whether the output is a list (the rules have `each`).
    pub fn is_each(&self) -> bool {
        self.each.is_some()
    }
}

/// Lookup from member name to slot for one scan: open addressing over a power-of-two table,
/// at most half full, so a name that is not wanted usually costs one hash and one probe.
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
        let mut table = KeyTable {
            mask: size - 1,
            entries: vec![Entry { start: 0, len: 0, slot: EMPTY }; size].into_boxed_slice(),
            names: names.iter().flat_map(|(n, _)| n.bytes()).collect(),
            len: names.len(),
        };
        let mut start = 0;
        for &(name, slot) in names {
            let mut i = hash(name.as_bytes()) & table.mask;
            while table.entries[i].slot != EMPTY {
                i = (i + 1) & table.mask;
            }
            table.entries[i] = Entry { start: start as u32, len: name.len() as u32, slot };
            start += name.len();
        }
        table
    }

    /// The slot of member `name`, if this scan wants it.
    #[inline]
    pub fn get(&self, name: &[u8]) -> Option<SlotId> {
        let mut i = hash(name) & self.mask;
        loop {
            let entry = self.entries.get(i)?;
            if entry.slot == EMPTY {
                return None;
            }
            if entry.len as usize == name.len() {
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

/// Hash of a member name from its length and its first and last eight bytes: cheap for the short
/// names JSON APIs use, and distinct for the usual families (`strIngredient1`, `strIngredient2`).
#[inline]
fn hash(name: &[u8]) -> usize {
    let n = name.len();
    let (head, tail) = if n >= 8 {
        (load(&name[..8]), load(&name[n - 8..]))
    } else if n >= 4 {
        (load(&name[..4]), load(&name[n - 4..]))
    } else {
        (load(name), 0)
    };
    let mixed = (head ^ tail.rotate_left(29) ^ n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed ^ (mixed >> 29)) as usize
}

/// Little-endian value of up to eight bytes.
#[inline]
fn load(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    let n = bytes.len().min(8);
    word[..n].copy_from_slice(&bytes[..n]);
    u64::from_le_bytes(word)
}

/// A readable listing of the plan, one op per line (used in snapshot tests and `recast check`).
impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ignore_empty {
            writeln!(f, "ignore empty values")?;
        }
        if let Some(each) = &self.each {
            writeln!(f, "each {}", each.join("."))?;
        }
        let slot = |s: SlotId| format!("s{s}");
        let read = |r: &Read| match r {
            Read::Slot(s) => slot(*s),
            Read::Concat(span) => {
                let parts: Vec<_> = self.parts[span.range()].iter().map(|s| slot(*s)).collect();
                format!("concat({})", parts.join(" "))
            }
        };
        for op in &self.ops {
            match op {
                Op::Scan { input, table } => {
                    let from = match input {
                        Input::Root => "root".to_owned(),
                        Input::Slot(s) => slot(*s),
                    };
                    let names: Vec<_> =
                        table.names().iter().map(|(n, s)| format!("{n}→{}", slot(*s))).collect();
                    writeln!(f, "scan {from}: {}", names.join(" "))?;
                }
                Op::Field { target, read: r } => {
                    let t = &self.targets[*target as usize];
                    writeln!(f, "field {} ({}) ← {}", t.key, t.ty.name(), read(r))?;
                }
                Op::Array { target, reads } => {
                    let t = &self.targets[*target as usize];
                    let rs: Vec<_> = self.reads[reads.range()].iter().map(read).collect();
                    writeln!(f, "array {} ({}) ← [{}]", t.key, t.ty.name(), rs.join(", "))?;
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
        for other in ["strIngredient21", "strMeasure0", "b", "abcd", "IdMeal", "x".repeat(100).as_str()] {
            assert_eq!(table.get(other.as_bytes()), None, "{other}");
        }
        assert_eq!(table.len(), pairs.len());
    }
}
