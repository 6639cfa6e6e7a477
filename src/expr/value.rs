//! The values an expression works with while it runs: a place in the parsed document (a tape
//! index, no copy), a constant of the expression itself, or a value built in the call's arena.
//! Only what must be built is built (lists of a projection, multi-selects, sorted copies, text).
//!
//! What a call may spend is its [`Budget`]: bytes of built values and steps of work. A built list
//! or object is charged, before it is built, what writing it out would take ([`Arena::size`]):
//! a list of two references to one value costs twice that value, so sharing cannot hide a value
//! that doubles at every step.

use std::cell::{Cell, RefCell};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt::Write as _;

use bumpalo::Bump;

use crate::json::{self, Node, Nodes, StaticNode, write};

/// A number as JSON gives it or arithmetic makes it. Integers keep every digit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    Int(i64),
    UInt(u64),
    Float(f64),
}

impl Number {
    pub fn as_f64(self) -> f64 {
        match self {
            Number::Int(n) => n as f64,
            Number::UInt(n) => n as f64,
            Number::Float(f) => f,
        }
    }

    /// The number as a signed 64-bit integer, when it is one (an integral float included).
    pub fn as_i64(self) -> Option<i64> {
        match self {
            Number::Int(n) => Some(n),
            Number::UInt(n) => i64::try_from(n).ok(),
            Number::Float(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => Some(f as i64),
            Number::Float(_) => None,
        }
    }

    /// Compares by value, exactly for integers of either sign.
    pub fn compare(self, other: Number) -> Option<Ordering> {
        match (self, other) {
            (Number::Int(a), Number::Int(b)) => Some(a.cmp(&b)),
            (Number::UInt(a), Number::UInt(b)) => Some(a.cmp(&b)),
            (Number::Int(a), Number::UInt(b)) => {
                Some(if a < 0 { Ordering::Less } else { (a as u64).cmp(&b) })
            }
            (Number::UInt(a), Number::Int(b)) => {
                Some(if b < 0 { Ordering::Greater } else { a.cmp(&(b as u64)) })
            }
            (Number::Float(a), Number::Float(b)) => a.partial_cmp(&b),
            (Number::Int(a), Number::Float(b)) => integer_and_float(i128::from(a), b),
            (Number::UInt(a), Number::Float(b)) => integer_and_float(i128::from(a), b),
            (Number::Float(a), Number::Int(b)) => integer_and_float(i128::from(b), a).map(Ordering::reverse),
            (Number::Float(a), Number::UInt(b)) => integer_and_float(i128::from(b), a).map(Ordering::reverse),
        }
    }

    /// Appends the number's JSON text: integers as written, floats in their shortest round-trip
    /// form. A float that is not finite (which only arithmetic makes) is written as `null`.
    pub fn write(self, out: &mut Vec<u8>) {
        match self {
            Number::Int(n) => write::i64(out, n),
            Number::UInt(n) => write::u64(out, n),
            Number::Float(f) => {
                if !write::f64(out, f) {
                    out.extend_from_slice(b"null");
                }
            }
        }
    }
}

/// A literal of an expression (`` `{"a": [1, 2]}` ``, `'text'`), parsed once at compile time.
/// Objects keep their members in the order written.
#[derive(Debug, Clone, PartialEq)]
pub enum Const {
    Null,
    Bool(bool),
    Number(Number),
    String(Box<str>),
    List(Box<[Const]>),
    Object(Box<[(Box<str>, Const)]>),
}

impl Const {
    /// Reads the JSON value at `i` of a parsed document.
    pub fn from_tape(nodes: &Nodes<'_>, i: usize) -> Const {
        match nodes[i] {
            Node::String(s) => Const::String(s.into()),
            Node::Static(s) => match Val::from_static(s) {
                Val::Bool(b) => Const::Bool(b),
                Val::Number(n) => Const::Number(n),
                _ => Const::Null,
            },
            Node::Array { .. } => Const::List(
                json::elements(nodes, i).into_iter().flatten().map(|e| Const::from_tape(nodes, e)).collect(),
            ),
            Node::Object { .. } => Const::Object(
                json::members(nodes, i)
                    .into_iter()
                    .flatten()
                    .map(|(name, value)| (name.into(), Const::from_tape(nodes, value)))
                    .collect(),
            ),
        }
    }
}

/// A value during evaluation. Cheap to copy: containers are a tape index or a borrowed slice.
#[derive(Debug, Clone, Copy)]
pub enum Val<'v> {
    Null,
    Bool(bool),
    Number(Number),
    String(&'v str),
    /// A list of the document, by the tape index of its header.
    TapeList(usize),
    /// An object of the document, by the tape index of its header.
    TapeObject(usize),
    ConstList(&'v [Const]),
    ConstObject(&'v [(Box<str>, Const)]),
    /// A list built while evaluating.
    List(&'v Built<'v, Val<'v>>),
    /// An object built while evaluating; member names are unique.
    Object(&'v Built<'v, (&'v str, Val<'v>)>),
}

/// A list's elements or an object's members, built while evaluating, with the bytes writing it
/// out as JSON takes (its expanded size: a value it holds twice counts twice).
#[derive(Debug)]
pub struct Built<'v, T> {
    pub items: &'v [T],
    pub size: u64,
}

/// The JSON types JMESPath names (`type()`), in its words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Null,
    Boolean,
    Number,
    String,
    Array,
    Object,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Boolean => "boolean",
            Kind::Number => "number",
            Kind::String => "string",
            Kind::Array => "array",
            Kind::Object => "object",
        }
    }
}

impl<'v> Val<'v> {
    pub fn from_static(s: StaticNode) -> Val<'v> {
        match s {
            StaticNode::Null => Val::Null,
            StaticNode::Bool(b) => Val::Bool(b),
            StaticNode::I64(n) => Val::Number(Number::Int(n)),
            StaticNode::U64(n) => Val::Number(Number::UInt(n)),
            StaticNode::F64(f) => Val::Number(Number::Float(f)),
        }
    }

    /// The value at tape index `i`.
    #[inline]
    pub fn from_tape(nodes: &'v Nodes<'v>, i: usize) -> Val<'v> {
        match nodes[i] {
            Node::String(s) => Val::String(s),
            Node::Static(s) => Val::from_static(s),
            Node::Array { .. } => Val::TapeList(i),
            Node::Object { .. } => Val::TapeObject(i),
        }
    }

    pub fn from_const(c: &'v Const) -> Val<'v> {
        match c {
            Const::Null => Val::Null,
            Const::Bool(b) => Val::Bool(*b),
            Const::Number(n) => Val::Number(*n),
            Const::String(s) => Val::String(s),
            Const::List(items) => Val::ConstList(items),
            Const::Object(members) => Val::ConstObject(members),
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Val::Null => Kind::Null,
            Val::Bool(_) => Kind::Boolean,
            Val::Number(_) => Kind::Number,
            Val::String(_) => Kind::String,
            Val::TapeList(_) | Val::ConstList(_) | Val::List(_) => Kind::Array,
            Val::TapeObject(_) | Val::ConstObject(_) | Val::Object(_) => Kind::Object,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Val::Null)
    }

    /// JMESPath's truth: `false`, `null`, `""`, `[]` and `{}` are false, everything else true.
    pub fn truthy(&self, nodes: &Nodes<'_>) -> bool {
        match *self {
            Val::Null | Val::Bool(false) => false,
            Val::Bool(true) | Val::Number(_) => true,
            Val::String(s) => !s.is_empty(),
            Val::TapeList(i) | Val::TapeObject(i) => match nodes[i] {
                Node::Array { len, .. } | Node::Object { len, .. } => len > 0,
                _ => true,
            },
            Val::ConstList(l) => !l.is_empty(),
            Val::ConstObject(o) => !o.is_empty(),
            Val::List(l) => !l.items.is_empty(),
            Val::Object(o) => !o.items.is_empty(),
        }
    }
}

/// The elements of a list value, in order.
pub enum Items<'v> {
    Tape(&'v Nodes<'v>, json::Elements<'v, 'v>),
    Const(std::slice::Iter<'v, Const>),
    Built(std::slice::Iter<'v, Val<'v>>),
}

impl<'v> Iterator for Items<'v> {
    type Item = Val<'v>;

    #[inline]
    fn next(&mut self) -> Option<Val<'v>> {
        match self {
            Items::Tape(nodes, elements) => elements.next().map(|i| Val::from_tape(nodes, i)),
            Items::Const(items) => items.next().map(Val::from_const),
            Items::Built(items) => items.next().copied(),
        }
    }
}

/// The members of an object value, in order.
pub enum Members<'v> {
    Tape(&'v Nodes<'v>, json::Members<'v, 'v>),
    Const(std::slice::Iter<'v, (Box<str>, Const)>),
    Built(std::slice::Iter<'v, (&'v str, Val<'v>)>),
}

impl<'v> Iterator for Members<'v> {
    type Item = (&'v str, Val<'v>);

    #[inline]
    fn next(&mut self) -> Option<(&'v str, Val<'v>)> {
        match self {
            Members::Tape(nodes, members) => members.next().map(|(k, i)| (k, Val::from_tape(nodes, i))),
            Members::Const(members) => members.next().map(|(k, v)| (&**k, Val::from_const(v))),
            Members::Built(members) => members.next().copied(),
        }
    }
}

/// What a value is read against: the document's nodes.
#[derive(Clone, Copy)]
pub struct Doc<'v> {
    pub nodes: &'v Nodes<'v>,
}

impl<'v> Doc<'v> {
    /// The elements, when `v` is a list.
    #[inline]
    pub fn items(self, v: Val<'v>) -> Option<Items<'v>> {
        match v {
            Val::TapeList(i) => json::elements(self.nodes, i).map(|e| Items::Tape(self.nodes, e)),
            Val::ConstList(l) => Some(Items::Const(l.iter())),
            Val::List(l) => Some(Items::Built(l.items.iter())),
            _ => None,
        }
    }

    /// The members, when `v` is an object.
    #[inline]
    pub fn members(self, v: Val<'v>) -> Option<Members<'v>> {
        match v {
            Val::TapeObject(i) => json::members(self.nodes, i).map(|m| Members::Tape(self.nodes, m)),
            Val::ConstObject(o) => Some(Members::Const(o.iter())),
            Val::Object(o) => Some(Members::Built(o.items.iter())),
            _ => None,
        }
    }

    /// Number of elements of a list or members of an object.
    pub fn len(self, v: Val<'v>) -> Option<usize> {
        match v {
            Val::TapeList(i) | Val::TapeObject(i) => match self.nodes[i] {
                Node::Array { len, .. } | Node::Object { len, .. } => Some(len),
                _ => None,
            },
            Val::ConstList(l) => Some(l.len()),
            Val::ConstObject(o) => Some(o.len()),
            Val::List(l) => Some(l.items.len()),
            Val::Object(o) => Some(o.items.len()),
            _ => None,
        }
    }

    /// The first member called `name` of an object; `Null` for anything else.
    #[inline]
    pub fn field(self, v: Val<'v>, name: &str) -> Val<'v> {
        match v {
            Val::TapeObject(i) => {
                json::member(self.nodes, i, name).map_or(Val::Null, |i| Val::from_tape(self.nodes, i))
            }
            Val::ConstObject(_) | Val::Object(_) => {
                self.members(v).and_then(|mut m| m.find(|(k, _)| *k == name)).map_or(Val::Null, |(_, v)| v)
            }
            _ => Val::Null,
        }
    }

    /// The element at `index` of a list, counting from the end when negative.
    pub fn index(self, v: Val<'v>, index: i64) -> Val<'v> {
        let Some(len) = self.len(v).filter(|_| v.kind() == Kind::Array) else { return Val::Null };
        let Some(at) = position(len, index) else { return Val::Null };
        match v {
            Val::ConstList(l) => Val::from_const(&l[at]),
            Val::List(l) => l.items[at],
            _ => self.items(v).and_then(|mut items| items.nth(at)).unwrap_or(Val::Null),
        }
    }

    /// JSON equality: numbers by value, objects whatever their member order. Each pair of values
    /// compared is a step of `budget`; an object of more than [`INDEXED`] members is looked up by
    /// a hash of its names, not member by member.
    pub fn equal(self, a: Val<'v>, b: Val<'v>, budget: &Budget) -> Result<bool, OverBudget> {
        budget.step(cost::COMPARE)?;
        Ok(match (a, b) {
            (Val::Null, Val::Null) => true,
            (Val::Bool(x), Val::Bool(y)) => x == y,
            (Val::Number(x), Val::Number(y)) => x.compare(y) == Some(Ordering::Equal),
            (Val::String(x), Val::String(y)) => {
                budget.step(steps_of_bytes(x.len().min(y.len())))?;
                x == y
            }
            // One place of the document, or one value built: equal without a walk.
            (Val::TapeList(x), Val::TapeList(y)) | (Val::TapeObject(x), Val::TapeObject(y)) if x == y => true,
            (Val::List(x), Val::List(y)) if std::ptr::eq(x, y) => true,
            (Val::Object(x), Val::Object(y)) if std::ptr::eq(x, y) => true,
            _ => match (a.kind(), b.kind()) {
                (Kind::Array, Kind::Array) => {
                    if self.len(a) != self.len(b) {
                        return Ok(false);
                    }
                    for (x, y) in self.items(a).into_iter().flatten().zip(self.items(b).into_iter().flatten())
                    {
                        if !self.equal(x, y, budget)? {
                            return Ok(false);
                        }
                    }
                    true
                }
                (Kind::Object, Kind::Object) => {
                    let len = self.len(a).unwrap_or(0);
                    if Some(len) != self.len(b) {
                        return Ok(false);
                    }
                    if len <= INDEXED {
                        for (name, x) in self.members(a).into_iter().flatten() {
                            budget.step(len as u64)?;
                            let found =
                                self.members(b).into_iter().flatten().find(|(other, _)| *other == name);
                            match found {
                                Some((_, y)) if self.equal(x, y, budget)? => {}
                                _ => return Ok(false),
                            }
                        }
                        return Ok(true);
                    }
                    // Each member of both: put in the index, or looked up in it.
                    budget.step((2 * len as u64).saturating_mul(cost::MEMBER))?;
                    let mut index: HashMap<&str, Val<'v>> = HashMap::with_capacity(len);
                    for (name, y) in self.members(b).into_iter().flatten() {
                        index.entry(name).or_insert(y);
                    }
                    for (name, x) in self.members(a).into_iter().flatten() {
                        match index.get(name) {
                            Some(&y) if self.equal(x, y, budget)? => {}
                            _ => return Ok(false),
                        }
                    }
                    true
                }
                _ => false,
            },
        })
    }

    /// Appends `v` as compact JSON.
    pub fn write(self, out: &mut Vec<u8>, v: Val<'v>) {
        match v {
            Val::Null => out.extend_from_slice(b"null"),
            Val::Bool(b) => out.extend_from_slice(if b { b"true" } else { b"false" }),
            Val::Number(n) => n.write(out),
            Val::String(s) => write::string(out, s),
            _ if v.kind() == Kind::Array => {
                out.push(b'[');
                for (n, item) in self.items(v).into_iter().flatten().enumerate() {
                    if n > 0 {
                        out.push(b',');
                    }
                    self.write(out, item);
                }
                out.push(b']');
            }
            _ => {
                out.push(b'{');
                for (n, (name, value)) in self.members(v).into_iter().flatten().enumerate() {
                    if n > 0 {
                        out.push(b',');
                    }
                    write::string(out, name);
                    out.push(b':');
                    self.write(out, value);
                }
                out.push(b'}');
            }
        }
    }

    /// `v` as compact JSON text, for messages and tests.
    pub fn to_json(self, v: Val<'v>) -> String {
        let mut out = Vec::new();
        self.write(&mut out, v);
        String::from_utf8(out).unwrap_or_else(|e| {
            let mut s = String::new();
            let _ = write!(s, "{e}");
            s
        })
    }
}

/// Objects of up to this many members are searched member by member; larger ones through a hash
/// of their names (equality, `merge`, `from_items`, `group_by`).
pub const INDEXED: usize = 8;

/// The index of `index` in a sequence of `len`, counting from the end when negative; `None` when
/// it falls outside.
pub(crate) fn position(len: usize, index: i64) -> Option<usize> {
    let at = if index < 0 { i64::try_from(len).ok()?.checked_add(index)? } else { index };
    usize::try_from(at).ok().filter(|&at| at < len)
}

/// What a step pays for, in the units the code charges: weights chosen so that a step is at
/// most about 15 ns of one core of the machine the bounds were measured on, whatever it pays for
/// (`benches/bounds.rs`, `docs/behaviour.md`). Each evaluation of a piece of an expression, each
/// element of a list walked or built, and each object an `each` maps (per op, and per member
/// its scans pass) is one step; these are the rest.
pub mod cost {
    /// Two values compared (equality, `contains`).
    pub const COMPARE: u64 = 4;
    /// A member put in an object being built, or looked up in one, through a hash of its name
    /// (`merge`, `from_items`, `group_by`, equality of large objects).
    pub const MEMBER: u64 = 64;
    /// A function called (its arguments gathered and checked, its value made).
    pub const CALL: u64 = 4;
    /// An element put in a list being built.
    pub const ELEMENT: u64 = 2;
    /// Bytes of text read (searched, cased, cut, split) per step.
    pub const TEXT_BYTES: u64 = 64;
    /// Bytes of a value written out (an expression's value in the answer, `to_string`, the
    /// elements of an `each` written to be read again) per step.
    pub const WRITTEN_BYTES: u64 = 2;
}

/// Steps of work of reading `bytes` bytes of text: one per [`cost::TEXT_BYTES`], and one more.
#[inline]
pub fn steps_of_bytes(bytes: usize) -> u64 {
    bytes as u64 / cost::TEXT_BYTES + 1
}

/// Steps of work of writing out a value of `bytes` bytes: one per [`cost::WRITTEN_BYTES`], and one
/// more.
#[inline]
pub fn steps_of_writing(bytes: u64) -> u64 {
    bytes / cost::WRITTEN_BYTES + 1
}

/// What one call may still spend: bytes of values its expressions build
/// (`RECAST_MAX_EXPR_BYTES`), and steps of work (`RECAST_MAX_MAPPING_STEPS`), each spent before
/// the work it pays for is done. `docs/behaviour.md` says what costs a step.
#[derive(Debug)]
pub struct Budget {
    bytes: Cell<u64>,
    steps: Cell<u64>,
    /// Elements `group_by` left out (their key is null) since [`Budget::take_left_out`] last
    /// asked: told in a preview's trace, not lost without a word.
    left_out: Cell<u64>,
}

/// A bound of [`Budget`] that a call ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverBudget {
    /// The values built would pass `RECAST_MAX_EXPR_BYTES`.
    Built,
    /// The work would pass `RECAST_MAX_MAPPING_STEPS`.
    Steps,
}

impl Budget {
    pub fn new(bytes: usize, steps: u64) -> Budget {
        Budget { bytes: Cell::new(bytes as u64), steps: Cell::new(steps), left_out: Cell::new(0) }
    }

    /// Takes `bytes` of the budget of built values.
    #[inline]
    pub fn charge(&self, bytes: u64) -> Result<(), OverBudget> {
        let left = self.bytes.get().checked_sub(bytes).ok_or(OverBudget::Built)?;
        self.bytes.set(left);
        Ok(())
    }

    /// Takes `steps` steps of work.
    #[inline]
    pub fn step(&self, steps: u64) -> Result<(), OverBudget> {
        let left = self.steps.get().checked_sub(steps).ok_or(OverBudget::Steps)?;
        self.steps.set(left);
        Ok(())
    }

    /// Bytes of built values still free.
    pub fn bytes_left(&self) -> u64 {
        self.bytes.get()
    }

    /// Steps still free.
    pub fn steps_left(&self) -> u64 {
        self.steps.get()
    }
}

/// The arena a call's expressions build their values in, and the [`Budget`] those values and
/// the work of making them are charged to.
pub struct Arena<'v> {
    bump: &'v Bump,
    budget: &'v Budget,
    /// The expanded size of each container of the document that was asked for, by tape index,
    /// and the address of the nodes they belong to (a call may parse a second document).
    sizes: RefCell<(usize, HashMap<usize, u64>)>,
}

/// A list being built ([`Arena::list`]): its elements so far and their expanded size.
pub struct ListBuilder<'v> {
    items: bumpalo::collections::Vec<'v, Val<'v>>,
    size: u64,
}

/// An object being built ([`Arena::object`]).
pub struct ObjectBuilder<'v> {
    members: bumpalo::collections::Vec<'v, (&'v str, Val<'v>)>,
    size: u64,
}

impl<'v> ListBuilder<'v> {
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl<'v> ObjectBuilder<'v> {
    /// The members so far, to change one in place (its size counted again by [`Arena::replace`]).
    pub fn members(&self) -> &[(&'v str, Val<'v>)] {
        &self.members
    }
}

impl<'v> Arena<'v> {
    pub fn new(bump: &'v Bump, budget: &'v Budget) -> Arena<'v> {
        Arena { bump, budget, sizes: RefCell::new((0, HashMap::new())) }
    }

    /// Records that a function left an element out of what it built (`group_by`: a null key).
    pub fn left_out(&self) {
        self.budget.left_out.set(self.budget.left_out.get().saturating_add(1));
    }

    /// The elements left out since the last call, and starts counting again.
    pub fn take_left_out(&self) -> u64 {
        self.budget.left_out.replace(0)
    }

    /// The call's budget.
    #[inline]
    pub fn budget(&self) -> &'v Budget {
        self.budget
    }

    /// Takes `bytes` of the budget of built values.
    #[inline]
    pub fn charge(&self, bytes: u64) -> Result<(), OverBudget> {
        self.budget.charge(bytes)
    }

    /// Takes `steps` steps of work.
    #[inline]
    pub fn step(&self, steps: u64) -> Result<(), OverBudget> {
        self.budget.step(steps)
    }

    /// An empty list to build; [`Arena::push`] charges each element.
    pub fn list(&self) -> ListBuilder<'v> {
        ListBuilder { items: bumpalo::collections::Vec::new_in(self.bump), size: 2 }
    }

    /// Appends `item` to a list being built, charging what it takes in memory and what writing
    /// it out takes.
    #[inline]
    pub fn push(&self, doc: Doc<'v>, list: &mut ListBuilder<'v>, item: Val<'v>) -> Result<(), OverBudget> {
        self.step(cost::ELEMENT)?;
        let size = self.size(doc, item)? + 1;
        self.charge(size + std::mem::size_of::<Val<'_>>() as u64)?;
        list.size += size;
        list.items.push(item);
        Ok(())
    }

    /// The list built.
    pub fn finish(&self, list: ListBuilder<'v>) -> Val<'v> {
        let items = list.items.into_bump_slice();
        Val::List(self.bump.alloc(Built { items, size: list.size }))
    }

    /// A list of `items`, each charged as [`Arena::push`] charges it.
    pub fn list_of(
        &self,
        doc: Doc<'v>,
        items: impl IntoIterator<Item = Val<'v>>,
    ) -> Result<Val<'v>, OverBudget> {
        let mut list = self.list();
        for item in items {
            self.push(doc, &mut list, item)?;
        }
        Ok(self.finish(list))
    }

    /// An empty object to build; [`Arena::insert`] charges each member.
    pub fn object(&self) -> ObjectBuilder<'v> {
        ObjectBuilder { members: bumpalo::collections::Vec::new_in(self.bump), size: 2 }
    }

    /// Appends a member to an object being built (its name must not be there yet).
    #[inline]
    pub fn insert(
        &self,
        doc: Doc<'v>,
        object: &mut ObjectBuilder<'v>,
        name: &'v str,
        value: Val<'v>,
    ) -> Result<(), OverBudget> {
        self.step(1)?;
        let size = name.len() as u64 + 3 + self.size(doc, value)? + 1;
        self.charge(size + std::mem::size_of::<(&str, Val<'_>)>() as u64)?;
        object.size += size;
        object.members.push((name, value));
        Ok(())
    }

    /// Gives member `at` of an object being built a new value, charging the new value's size.
    pub fn replace(
        &self,
        doc: Doc<'v>,
        object: &mut ObjectBuilder<'v>,
        at: usize,
        value: Val<'v>,
    ) -> Result<(), OverBudget> {
        let size = self.size(doc, value)?;
        self.charge(size)?;
        let Some(member) = object.members.get_mut(at) else { return Ok(()) };
        let old = self.size(doc, member.1)?;
        object.size = object.size.saturating_sub(old) + size;
        member.1 = value;
        Ok(())
    }

    /// The object built.
    pub fn finish_object(&self, object: ObjectBuilder<'v>) -> Val<'v> {
        let items = object.members.into_bump_slice();
        Val::Object(self.bump.alloc(Built { items, size: object.size }))
    }

    /// Text made by a function, copied into the arena. Its bytes were charged before it was
    /// made (functions know the length of what they make first).
    pub fn charged_str(&self, s: &str) -> &'v str {
        self.bump.alloc_str(s)
    }

    /// Text made by a function, charged now: for text whose length depends on one value alone
    /// and can be no larger than a few times it.
    pub fn str(&self, s: &str) -> Result<&'v str, OverBudget> {
        self.charge(s.len() as u64)?;
        Ok(self.bump.alloc_str(s))
    }

    /// What writing `v` out as compact JSON takes, in bytes: exact for everything but floats
    /// (24, the longest a shortest round-trip float takes) and strings that need escapes (their
    /// text as it is). A container of the document is measured once per call, a step per value
    /// inside it.
    pub fn size(&self, doc: Doc<'v>, v: Val<'v>) -> Result<u64, OverBudget> {
        Ok(match v {
            Val::Null | Val::Bool(true) => 4,
            Val::Bool(false) => 5,
            Val::Number(n) => number_size(n),
            Val::String(s) => s.len() as u64 + 2,
            Val::TapeList(i) | Val::TapeObject(i) => self.tape_size(doc.nodes, i)?,
            Val::ConstList(_) | Val::ConstObject(_) => {
                let mut size = 0;
                self.const_size(v, &mut size)?;
                size
            }
            Val::List(l) => l.size,
            Val::Object(o) => o.size,
        })
    }

    fn tape_size(&self, nodes: &'v Nodes<'v>, i: usize) -> Result<u64, OverBudget> {
        let address = nodes.as_ptr() as usize;
        {
            let mut sizes = self.sizes.borrow_mut();
            if sizes.0 != address {
                *sizes = (address, HashMap::new());
            }
            if let Some(&size) = sizes.1.get(&i) {
                return Ok(size);
            }
        }
        let mut size = 2;
        match nodes.get(i) {
            Some(Node::Array { len, .. }) => {
                self.step(*len as u64 + 1)?;
                for element in json::elements(nodes, i).into_iter().flatten() {
                    size += self.tape_value_size(nodes, element)? + 1;
                }
            }
            Some(Node::Object { len, .. }) => {
                self.step(*len as u64 + 1)?;
                for (name, value) in json::members(nodes, i).into_iter().flatten() {
                    size += name.len() as u64 + 3 + self.tape_value_size(nodes, value)? + 1;
                }
            }
            _ => return self.tape_value_size(nodes, i),
        }
        self.sizes.borrow_mut().1.insert(i, size);
        Ok(size)
    }

    fn tape_value_size(&self, nodes: &'v Nodes<'v>, i: usize) -> Result<u64, OverBudget> {
        match nodes.get(i) {
            Some(Node::Array { .. } | Node::Object { .. }) => self.tape_size(nodes, i),
            Some(Node::String(s)) => Ok(s.len() as u64 + 2),
            Some(Node::Static(s)) => Ok(match Val::from_static(*s) {
                Val::Number(n) => number_size(n),
                Val::Bool(false) => 5,
                _ => 4,
            }),
            None => Ok(4),
        }
    }

    fn const_size(&self, v: Val<'v>, size: &mut u64) -> Result<(), OverBudget> {
        self.step(1)?;
        match v {
            Val::ConstList(items) => {
                *size += 2;
                for item in items {
                    self.const_size(Val::from_const(item), size)?;
                    *size += 1;
                }
            }
            Val::ConstObject(members) => {
                *size += 2;
                for (name, value) in members {
                    *size += name.len() as u64 + 4;
                    self.const_size(Val::from_const(value), size)?;
                }
            }
            scalar => *size += self.size(Doc { nodes: &[] }, scalar)?,
        }
        Ok(())
    }
}

/// Bytes of a number's JSON text: exact for integers, the longest a float takes for floats.
fn number_size(n: Number) -> u64 {
    match n {
        Number::Int(n) => itoa::Buffer::new().format(n).len() as u64,
        Number::UInt(n) => itoa::Buffer::new().format(n).len() as u64,
        Number::Float(_) => 24,
    }
}

/// Compares integer `a` with float `b` exactly (not through `a`'s nearest float, which would
/// make 2^53 + 1 equal to 2^53 as a float and so not a total order for sorting).
fn integer_and_float(a: i128, b: f64) -> Option<Ordering> {
    if b.is_nan() {
        return None;
    }
    // Beyond every 64-bit integer either way.
    if b >= 1e20 {
        return Some(Ordering::Less);
    }
    if b <= -1e20 {
        return Some(Ordering::Greater);
    }
    let whole = b.trunc();
    match a.cmp(&(whole as i128)) {
        Ordering::Equal => 0.0f64.partial_cmp(&(b - whole)),
        unequal => Some(unequal),
    }
}
