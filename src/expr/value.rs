//! The values an expression works with while it runs: a place in the parsed document (a tape
//! index, no copy), a constant of the expression itself, or a value built in the call's arena.
//! Only what must be built is built (lists of a projection, multi-selects, sorted copies, text).

use std::cmp::Ordering;
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
            (a, b) => a.as_f64().partial_cmp(&b.as_f64()),
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
    List(&'v [Val<'v>]),
    /// An object built while evaluating; member names are unique.
    Object(&'v [(&'v str, Val<'v>)]),
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
            Val::List(l) => !l.is_empty(),
            Val::Object(o) => !o.is_empty(),
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
            Val::List(l) => Some(Items::Built(l.iter())),
            _ => None,
        }
    }

    /// The members, when `v` is an object.
    #[inline]
    pub fn members(self, v: Val<'v>) -> Option<Members<'v>> {
        match v {
            Val::TapeObject(i) => json::members(self.nodes, i).map(|m| Members::Tape(self.nodes, m)),
            Val::ConstObject(o) => Some(Members::Const(o.iter())),
            Val::Object(o) => Some(Members::Built(o.iter())),
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
            Val::List(l) => Some(l.len()),
            Val::Object(o) => Some(o.len()),
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
        let at = if index < 0 { len as i64 + index } else { index };
        if at < 0 || at >= len as i64 {
            return Val::Null;
        }
        match v {
            Val::ConstList(l) => Val::from_const(&l[at as usize]),
            Val::List(l) => l[at as usize],
            _ => self.items(v).and_then(|mut items| items.nth(at as usize)).unwrap_or(Val::Null),
        }
    }

    /// JSON equality: numbers by value, objects whatever their member order.
    pub fn equal(self, a: Val<'v>, b: Val<'v>) -> bool {
        match (a, b) {
            (Val::Null, Val::Null) => true,
            (Val::Bool(x), Val::Bool(y)) => x == y,
            (Val::Number(x), Val::Number(y)) => x.compare(y) == Some(Ordering::Equal),
            (Val::String(x), Val::String(y)) => x == y,
            _ => match (a.kind(), b.kind()) {
                (Kind::Array, Kind::Array) => {
                    self.len(a) == self.len(b)
                        && self
                            .items(a)
                            .into_iter()
                            .flatten()
                            .zip(self.items(b).into_iter().flatten())
                            .all(|(x, y)| self.equal(x, y))
                }
                (Kind::Object, Kind::Object) => {
                    self.len(a) == self.len(b)
                        && self.members(a).into_iter().flatten().all(|(name, x)| {
                            self.members(b)
                                .into_iter()
                                .flatten()
                                .find(|(other, _)| *other == name)
                                .is_some_and(|(_, y)| self.equal(x, y))
                        })
                }
                _ => false,
            },
        }
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

/// The arena a call's expressions build their values in, with the budget those values may take
/// (`RECAST_MAX_EXPR_BYTES`).
pub struct Arena<'v> {
    bump: &'v Bump,
    left: std::cell::Cell<usize>,
}

/// The budget of built values is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget;

impl<'v> Arena<'v> {
    pub fn new(bump: &'v Bump, budget: usize) -> Arena<'v> {
        Arena { bump, left: std::cell::Cell::new(budget) }
    }

    /// Takes `bytes` of the budget.
    pub fn charge(&self, bytes: usize) -> Result<(), OverBudget> {
        let left = self.left.get().checked_sub(bytes).ok_or(OverBudget)?;
        self.left.set(left);
        Ok(())
    }

    /// Bytes of the budget still free.
    pub fn left(&self) -> usize {
        self.left.get()
    }

    /// An empty list to build in the arena; [`Arena::push`] charges each element.
    pub fn vec<T>(&self) -> bumpalo::collections::Vec<'v, T> {
        bumpalo::collections::Vec::new_in(self.bump)
    }

    /// Appends `item` to a list being built, charging its size.
    #[inline]
    pub fn push<T>(&self, vec: &mut bumpalo::collections::Vec<'v, T>, item: T) -> Result<(), OverBudget> {
        self.charge(std::mem::size_of::<T>())?;
        vec.push(item);
        Ok(())
    }

    pub fn list(&self, items: &[Val<'v>]) -> Result<&'v [Val<'v>], OverBudget> {
        self.charge(std::mem::size_of_val(items))?;
        Ok(self.bump.alloc_slice_copy(items))
    }

    pub fn object(&self, members: &[(&'v str, Val<'v>)]) -> Result<&'v [(&'v str, Val<'v>)], OverBudget> {
        self.charge(std::mem::size_of_val(members))?;
        Ok(self.bump.alloc_slice_copy(members))
    }

    pub fn str(&self, s: &str) -> Result<&'v str, OverBudget> {
        self.charge(s.len())?;
        Ok(self.bump.alloc_str(s))
    }
}
