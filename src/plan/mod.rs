//! The compiled form of a rules document: a flat list of [`Op`]s that the executor runs in order.
//!
//! Only the compiler builds a `Plan` and only the executor runs one. Every field name is resolved
//! to a *slot* (a small integer) at compile time: a [`Op::Scan`] walks one object of the input once
//! and records, for each wanted member, where its value sits in the tape; later ops read slots.
//! Targets that share a `parents` prefix share the scans of that prefix.

use std::fmt;

mod wants;

use crate::expr::Program;
pub(crate) use crate::json::keys::KeyTable;
use crate::json::write::Words;
pub(crate) use wants::{wants, wants_of, wants_of_value};

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
    /// What one call's mapping may spend.
    pub(crate) bounds: Bounds,
    /// Steps of mapping one object, charged before it is mapped: one per op, and one per entry
    /// of a target with several `keys` entries and per part of a concatenation.
    pub(crate) object_steps: u64,
    /// What the plan reads of a document, for reading only that; `None` when an expression may
    /// read anything ([`wants`]).
    pub(crate) wants: Option<crate::json::ondemand::Wants>,
}

/// A target type (SPEC §1.5). `Long` and `Float` are spelled differently but behave as `Int` and
/// `Double`; the spelling is kept for messages and traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    String,
    Int,
    Long,
    Double,
    Float,
    Boolean,
    Json,
}

impl Type {
    pub const NAMES: [&'static str; 7] = ["String", "Int", "Long", "Double", "Float", "Boolean", "Json"];

    /// Reads a type name; a trailing `?` is allowed and changes nothing.
    pub fn from_name(name: &str) -> Option<Type> {
        Some(match name.strip_suffix('?').unwrap_or(name) {
            "String" => Type::String,
            "Int" => Type::Int,
            "Long" => Type::Long,
            "Double" => Type::Double,
            "Float" => Type::Float,
            "Boolean" => Type::Boolean,
            "Json" => Type::Json,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Type::String => "String",
            Type::Int => "Int",
            Type::Long => "Long",
            Type::Double => "Double",
            Type::Float => "Float",
            Type::Boolean => "Boolean",
            Type::Json => "Json",
        }
    }
}

/// One `keys` element: a single field name, or `"a, b"` naming the parts of a concatenation.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyEntry {
    Field(String),
    Concat(Vec<String>),
}

impl KeyEntry {
    pub fn names(&self) -> &[String] {
        match self {
            KeyEntry::Field(name) => std::slice::from_ref(name),
            KeyEntry::Concat(names) => names,
        }
    }
}

/// What one call's mapping may spend (SPEC §1.8, §5; `docs/behaviour.md`): past any of them it
/// stops, and the call answers `mapping-limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Bytes of the values its expressions build, each charged its expanded size
    /// (`RECAST_MAX_EXPR_BYTES`).
    pub built_bytes: usize,
    /// Bytes of the answer it writes (`RECAST_MAX_RESPONSE_BYTES`).
    pub answer_bytes: usize,
    /// Steps of work (`RECAST_MAX_MAPPING_STEPS`).
    pub steps: u64,
}

/// Which of a call's [`Bounds`] its mapping ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    Built,
    Answer,
    Steps,
}

impl Bounds {
    /// The bound `limit` stands at, in bytes or steps.
    pub fn of(&self, limit: Limit) -> u64 {
        match limit {
            Limit::Built => self.built_bytes as u64,
            Limit::Answer => self.answer_bytes as u64,
            Limit::Steps => self.steps,
        }
    }
}

impl Limit {
    /// The setting that holds this bound.
    pub fn setting(self) -> &'static str {
        match self {
            Limit::Built => "RECAST_MAX_EXPR_BYTES",
            Limit::Answer => "RECAST_MAX_RESPONSE_BYTES",
            Limit::Steps => "RECAST_MAX_MAPPING_STEPS",
        }
    }

    /// What passed it, in words.
    pub fn what(self) -> &'static str {
        match self {
            Limit::Built => "the values its expressions build",
            Limit::Answer => "the answer it writes",
            Limit::Steps => "the work it takes",
        }
    }

    /// The unit of the bound.
    pub fn unit(self) -> &'static str {
        match self {
            Limit::Built | Limit::Answer => "bytes",
            Limit::Steps => "steps",
        }
    }
}

impl From<crate::expr::OverBudget> for Limit {
    fn from(bound: crate::expr::OverBudget) -> Limit {
        match bound {
            crate::expr::OverBudget::Built => Limit::Built,
            crate::expr::OverBudget::Steps => Limit::Steps,
        }
    }
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
    /// The chains of names the expression reads from the document (its first few,
    /// [`Program::read_paths`](crate::expr::Program::read_paths)): where a trace looks for why
    /// it found nothing.
    pub reads: Box<[Box<[Box<str>]>]>,
}

/// Chains of names of an expression a trace looks for when it found nothing.
pub(crate) const TRACED_READS: usize = 4;

impl Plan {
    /// What the plan reads of a document, or `None` when it may read anything.
    pub fn wants(&self) -> Option<&crate::json::ondemand::Wants> {
        self.wants.as_ref()
    }

    /// Number of output members (targets).
    pub fn target_count(&self) -> usize {
        self.targets.len()
    }

    /// What one call's mapping may spend.
    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// The steps of mapping one object by `ops`, `reads` and `parts` ([`Plan::object_steps`]).
    pub(crate) fn steps_per_object(&self) -> u64 {
        let entries = |span: &Span| u64::from(span.end.saturating_sub(span.start));
        let reads = |span: &Span| {
            self.reads.get(span.range()).unwrap_or_default().iter().fold(
                entries(span),
                |sum, read| match read {
                    Read::Concat(parts) => sum.saturating_add(entries(parts)),
                    Read::Slot(_) => sum,
                },
            )
        };
        self.ops.iter().fold(0u64, |sum, op| {
            let more = match op {
                Op::Concat { parts, .. } => entries(parts),
                Op::Array { reads: span, .. } => reads(span),
                _ => 0,
            };
            sum.saturating_add(1).saturating_add(more)
        })
    }

    /// Whether the output is a list (the rules have `each`).
    pub fn is_each(&self) -> bool {
        self.each.is_some()
    }
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
