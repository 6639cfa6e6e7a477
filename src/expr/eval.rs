//! Running a [`Program`] over a parsed document. The document is read in place; lists and objects
//! that the language builds (projections, multi-selects, function results) go into the call's
//! arena, whose budget bounds them. Nothing here panics on data: odd data is `null`, and a wrong
//! type or value is an [`EvalError`].

use std::cmp::Ordering;

use super::parse::{Arith, Compare};
use super::value::{Arena, Doc, Kind, Number, OverBudget, Val, position};
use super::{Program, Step, StepId};
use crate::json::Nodes;

/// Why an expression gave no value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalError {
    pub kind: EvalErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalErrorKind {
    /// A function or operator got a value of a type it does not take.
    InvalidType,
    /// A value of the right type that is out of its range (a slice step of 0, a division by 0).
    InvalidValue,
    /// The call ran into one of its bounds: the values built would pass
    /// `RECAST_MAX_EXPR_BYTES`, or the work `RECAST_MAX_MAPPING_STEPS`.
    OverBudget(OverBudget),
}

impl EvalErrorKind {
    /// The compliance suites' name for the error.
    pub fn name(self) -> &'static str {
        match self {
            EvalErrorKind::InvalidType => "invalid-type",
            EvalErrorKind::InvalidValue => "invalid-value",
            EvalErrorKind::OverBudget(_) => "over-budget",
        }
    }
}

impl std::fmt::Display for EvalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<OverBudget> for EvalError {
    fn from(bound: OverBudget) -> EvalError {
        let message = match bound {
            OverBudget::Built => "the values built would pass the call's budget of built bytes",
            OverBudget::Steps => "the work would pass the call's budget of steps",
        };
        EvalError { kind: EvalErrorKind::OverBudget(bound), message: message.into() }
    }
}

impl EvalError {
    pub(crate) fn invalid_type(message: impl Into<String>) -> EvalError {
        EvalError { kind: EvalErrorKind::InvalidType, message: message.into() }
    }

    pub(crate) fn invalid_value(message: impl Into<String>) -> EvalError {
        EvalError { kind: EvalErrorKind::InvalidValue, message: message.into() }
    }
}

pub(crate) type Result<T> = std::result::Result<T, EvalError>;

/// Evaluates `program` with `current` as `@` and `root` as `$`, over the document `nodes`.
pub fn evaluate<'v>(
    program: &'v Program,
    nodes: &'v Nodes<'v>,
    root: Val<'v>,
    current: Val<'v>,
    arena: &'v Arena<'v>,
) -> Result<Val<'v>> {
    run(program, nodes, root, current, arena, &[], false)
}

/// [`evaluate`] with the values of the variables bound outside the expression
/// ([`compile_bound`](super::compile_bound)), in their order.
pub fn evaluate_bound<'v>(
    program: &'v Program,
    nodes: &'v Nodes<'v>,
    current: Val<'v>,
    arena: &'v Arena<'v>,
    bound: &[Val<'v>],
) -> Result<Val<'v>> {
    evaluate_with(program, nodes, current, current, arena, bound)
}

/// [`evaluate`] with `root` as `$` and the values of the variables bound outside the
/// expression, in their order (those past the program's own are not set).
pub fn evaluate_with<'v>(
    program: &'v Program,
    nodes: &'v Nodes<'v>,
    root: Val<'v>,
    current: Val<'v>,
    arena: &'v Arena<'v>,
    bound: &[Val<'v>],
) -> Result<Val<'v>> {
    run(program, nodes, root, current, arena, bound, false)
}

/// [`evaluate`] as implementations of the original JMESPath specification have it where the
/// Community Edition differs in evaluation (its JEP-19): a multi-select of `null` is `null`, and
/// the right side of a sub-expression runs on a `null` left side too. Only for comparing recast
/// with such implementations (the `expr_differential` fuzz target).
#[cfg(feature = "fuzzing")]
pub fn evaluate_original<'v>(
    program: &'v Program,
    nodes: &'v Nodes<'v>,
    root: Val<'v>,
    current: Val<'v>,
    arena: &'v Arena<'v>,
) -> Result<Val<'v>> {
    run(program, nodes, root, current, arena, &[], true)
}

fn run<'v>(
    program: &'v Program,
    nodes: &'v Nodes<'v>,
    root: Val<'v>,
    current: Val<'v>,
    arena: &'v Arena<'v>,
    bound: &[Val<'v>],
    original: bool,
) -> Result<Val<'v>> {
    let mut vars = smallvec::smallvec![Val::Null; program.vars];
    for (slot, value) in vars.iter_mut().zip(bound).take(program.bound) {
        *slot = *value;
    }
    let mut evaluator = Evaluator { program, doc: Doc { nodes }, root, arena, vars, original };
    let top = (program.steps.len() - 1) as StepId;
    evaluator.eval(top, current)
}

pub(crate) struct Evaluator<'v> {
    pub(crate) program: &'v Program,
    pub(crate) doc: Doc<'v>,
    root: Val<'v>,
    pub(crate) arena: &'v Arena<'v>,
    /// The variables' values: those bound outside, then each `let` binding's (most programs
    /// have a few, kept without an allocation).
    vars: smallvec::SmallVec<[Val<'v>; 4]>,
    /// The original specification's evaluation of `null` (see `evaluate_original`).
    original: bool,
}

impl<'v> Evaluator<'v> {
    pub(crate) fn eval(&mut self, step: StepId, cur: Val<'v>) -> Result<Val<'v>> {
        let program = self.program;
        self.arena.step(1)?;
        Ok(match &program.steps[step as usize] {
            Step::Current => cur,
            Step::Root => self.root,
            Step::Var(slot) => self.vars[*slot as usize],
            Step::Const(i) => Val::from_const(&program.consts[*i as usize]),
            Step::Field(name) => self.field(cur, name)?,
            Step::Path(range) => {
                let mut v = cur;
                for name in &program.paths[range.range()] {
                    v = self.field(v, name)?;
                    if v.is_null() {
                        break;
                    }
                }
                v
            }
            // The Community Edition's JEP-19: a sub-expression of null is null; a pipe goes on.
            &Step::Sub(left, right) => match self.eval(left, cur)? {
                Val::Null if !self.original => Val::Null,
                v => self.eval(right, v)?,
            },
            &Step::Pipe(left, right) => {
                let v = self.eval(left, cur)?;
                self.eval(right, v)?
            }
            &Step::Index(n) => {
                // An element of the document is found by skipping the ones before it.
                if let (Val::TapeList(_), Some(len)) = (cur, self.doc.len(cur)) {
                    self.arena.step(position(len, n).unwrap_or(0) as u64)?;
                }
                self.doc.index(cur, n)
            }
            &Step::Slice(start, stop, step) => self.slice(cur, start, stop, step)?,
            &Step::ListProject(left, right) => {
                let base = self.eval(left, cur)?;
                match self.doc.items(base) {
                    Some(items) => self.project(items, right)?,
                    None => Val::Null,
                }
            }
            &Step::SliceProject(left, right) => match self.eval(left, cur)? {
                text @ Val::String(_) => self.eval(right, text)?,
                base => match self.doc.items(base) {
                    Some(items) => self.project(items, right)?,
                    None => Val::Null,
                },
            },
            &Step::ObjectProject(left, right) => {
                let base = self.eval(left, cur)?;
                match self.doc.members(base) {
                    Some(members) => self.project(members.map(|(_, v)| v), right)?,
                    None => Val::Null,
                }
            }
            &Step::Flatten(inner) => {
                let base = self.eval(inner, cur)?;
                let Some(items) = self.doc.items(base) else { return Ok(Val::Null) };
                let mut out = self.arena.list();
                for item in items {
                    match self.doc.items(item) {
                        Some(inner) => {
                            for v in inner {
                                self.arena.push(self.doc, &mut out, v)?;
                            }
                        }
                        None => self.arena.push(self.doc, &mut out, item)?,
                    }
                }
                self.arena.finish(out)
            }
            &Step::Filter(left, condition, right) => {
                let base = self.eval(left, cur)?;
                let Some(items) = self.doc.items(base) else { return Ok(Val::Null) };
                let mut out = self.arena.list();
                for item in items {
                    if self.eval(condition, item)?.truthy(self.doc.nodes) {
                        let v = self.eval(right, item)?;
                        if !v.is_null() {
                            self.arena.push(self.doc, &mut out, v)?;
                        }
                    }
                }
                self.arena.finish(out)
            }
            Step::MultiList(_) | Step::MultiHash(..) if self.original && cur.is_null() => Val::Null,
            &Step::MultiList(kids) => {
                let mut out = self.arena.list();
                for &kid in &program.kids[kids.range()] {
                    let v = self.eval(kid, cur)?;
                    self.arena.push(self.doc, &mut out, v)?;
                }
                self.arena.finish(out)
            }
            &Step::MultiHash(kids, names) => {
                // Names of a multi-select are unique: the parser refuses a repeated one.
                let mut out = self.arena.object();
                for (&kid, name) in program.kids[kids.range()].iter().zip(&program.names[names.range()]) {
                    let v = self.eval(kid, cur)?;
                    self.arena.insert(self.doc, &mut out, name, v)?;
                }
                self.arena.finish_object(out)
            }
            &Step::Or(left, right) => {
                let v = self.eval(left, cur)?;
                if v.truthy(self.doc.nodes) { v } else { self.eval(right, cur)? }
            }
            &Step::And(left, right) => {
                let v = self.eval(left, cur)?;
                if v.truthy(self.doc.nodes) { self.eval(right, cur)? } else { v }
            }
            &Step::Not(inner) => Val::Bool(!self.eval(inner, cur)?.truthy(self.doc.nodes)),
            &Step::Compare(op, left, right) => {
                let (a, b) = (self.eval(left, cur)?, self.eval(right, cur)?);
                compare(self.doc, self.arena, op, a, b)?
            }
            &Step::Arith(op, left, right) => {
                let (a, b) = (self.eval(left, cur)?, self.eval(right, cur)?);
                match (a, b) {
                    (Val::Number(a), Val::Number(b)) => Val::Number(arith(op, a, b)?),
                    _ => {
                        return Err(EvalError::invalid_type(format!(
                            "arithmetic takes numbers, not {} and {}",
                            a.kind().name(),
                            b.kind().name()
                        )));
                    }
                }
            }
            &Step::Sign(negative, inner) => match self.eval(inner, cur)? {
                Val::Number(n) if negative => Val::Number(negate(n)),
                Val::Number(n) => Val::Number(n),
                v => {
                    return Err(EvalError::invalid_type(format!(
                        "a sign takes a number, not {}",
                        v.kind().name()
                    )));
                }
            },
            &Step::Ternary(condition, then, otherwise) => {
                if self.eval(condition, cur)?.truthy(self.doc.nodes) {
                    self.eval(then, cur)?
                } else {
                    self.eval(otherwise, cur)?
                }
            }
            &Step::Let(bindings, body) => {
                // Every binding's value is read in the scope outside the `let`, then bound.
                let values: smallvec::SmallVec<[Val<'v>; 4]> = program.kids[bindings.range()]
                    .chunks_exact(2)
                    .map(|pair| self.eval(pair[1], cur))
                    .collect::<Result<_>>()?;
                for (pair, value) in program.kids[bindings.range()].chunks_exact(2).zip(values) {
                    self.vars[pair[0] as usize] = value;
                }
                self.eval(body, cur)?
            }
            Step::Call(function, args, native) => self.call(function, *args, *native, cur)?,
            Step::Expref(_) => {
                return Err(EvalError::invalid_type("an expression reference is only a function's argument"));
            }
        })
    }

    /// The member `name` of an object, as [`Doc::field`] reads it; a step per member it may
    /// pass.
    #[inline]
    fn field(&self, v: Val<'v>, name: &str) -> Result<Val<'v>> {
        if let Val::TapeObject(_) | Val::Object(_) | Val::ConstObject(_) = v {
            self.arena.step(self.doc.len(v).unwrap_or(0) as u64)?;
        }
        Ok(self.doc.field(v, name))
    }

    /// `right` of each value of `items`, leaving out `null`s.
    fn project(&mut self, items: impl Iterator<Item = Val<'v>>, right: StepId) -> Result<Val<'v>> {
        let mut out = self.arena.list();
        let identity = matches!(self.program.steps[right as usize], Step::Current);
        for item in items {
            let v = if identity {
                self.arena.step(1)?;
                item
            } else {
                self.eval(right, item)?
            };
            if !v.is_null() {
                self.arena.push(self.doc, &mut out, v)?;
            }
        }
        Ok(self.arena.finish(out))
    }

    fn slice(
        &mut self,
        cur: Val<'v>,
        start: Option<i64>,
        stop: Option<i64>,
        step: Option<i64>,
    ) -> Result<Val<'v>> {
        let step = step.unwrap_or(1);
        if step == 0 {
            return Err(EvalError::invalid_value("a slice's step cannot be 0"));
        }
        match cur {
            Val::String(s) => {
                self.arena.step(super::value::steps_of_bytes(s.len()))?;
                // Its characters, four bytes each, and the text cut from it, no longer than it.
                self.arena.charge((s.len() as u64).saturating_mul(5))?;
                let chars: smallvec::SmallVec<[char; 64]> = s.chars().collect();
                let mut out = String::new();
                for i in slice_indexes(chars.len(), start, stop, step) {
                    if let Some(&c) = chars.get(i) {
                        out.push(c);
                    }
                }
                Ok(Val::String(self.arena.charged_str(&out)))
            }
            _ => {
                let Some(len) = self.doc.len(cur).filter(|_| cur.kind() == Kind::Array) else {
                    return Ok(Val::Null);
                };
                self.arena.step(len as u64)?;
                let items: Vec<Val<'v>> = self.doc.items(cur).into_iter().flatten().collect();
                let mut out = self.arena.list();
                for i in slice_indexes(len, start, stop, step) {
                    if let Some(&item) = items.get(i) {
                        self.arena.push(self.doc, &mut out, item)?;
                    }
                }
                Ok(self.arena.finish(out))
            }
        }
    }

    /// Builds a list from values.
    pub(crate) fn list(&self, items: impl IntoIterator<Item = Val<'v>>) -> Result<Val<'v>> {
        Ok(self.arena.list_of(self.doc, items)?)
    }
}

/// The indexes a slice takes of a sequence of `len`, in order (Python's slice rules).
fn slice_indexes(
    len: usize,
    start: Option<i64>,
    stop: Option<i64>,
    step: i64,
) -> impl Iterator<Item = usize> {
    let len = len as i64;
    let clamp = |n: i64, low: i64, high: i64| {
        let n = if n < 0 { n + len } else { n };
        n.clamp(low, high)
    };
    let (start, stop) = if step > 0 {
        (start.map_or(0, |n| clamp(n, 0, len)), stop.map_or(len, |n| clamp(n, 0, len)))
    } else {
        (start.map_or(len - 1, |n| clamp(n, -1, len - 1)), stop.map_or(-1, |n| clamp(n, -1, len - 1)))
    };
    // `None` once a step would leave the range of an i64: no index lies beyond it.
    let mut i = Some(start);
    std::iter::from_fn(move || {
        let at = i?;
        let more = if step > 0 { at < stop } else { at > stop };
        if !more {
            return None;
        }
        i = at.checked_add(step);
        usize::try_from(at).ok()
    })
}

fn compare<'v>(doc: Doc<'v>, arena: &Arena<'v>, op: Compare, a: Val<'v>, b: Val<'v>) -> Result<Val<'v>> {
    Ok(match op {
        Compare::Eq => Val::Bool(doc.equal(a, b, arena.budget())?),
        Compare::Ne => Val::Bool(!doc.equal(a, b, arena.budget())?),
        _ => {
            let (Val::Number(a), Val::Number(b)) = (a, b) else { return Ok(Val::Null) };
            let Some(order) = a.compare(b) else { return Ok(Val::Null) };
            Val::Bool(match op {
                Compare::Lt => order == Ordering::Less,
                Compare::Le => order != Ordering::Greater,
                Compare::Gt => order == Ordering::Greater,
                _ => order != Ordering::Less,
            })
        }
    })
}

pub(crate) fn negate(n: Number) -> Number {
    match n {
        Number::Int(i) => i.checked_neg().map_or(Number::Float(-(i as f64)), Number::Int),
        Number::UInt(u) => {
            i64::try_from(u).ok().and_then(i64::checked_neg).map_or(Number::Float(-(u as f64)), Number::Int)
        }
        Number::Float(f) => Number::Float(-f),
    }
}

/// Arithmetic: exact on integers while the result fits 64 bits, else in double precision.
fn arith(op: Arith, a: Number, b: Number) -> Result<Number> {
    let ints = a
        .as_i64()
        .zip(b.as_i64())
        .filter(|_| !matches!(a, Number::Float(_)) && !matches!(b, Number::Float(_)));
    let zero = || EvalError::invalid_value("division by zero");
    if matches!(op, Arith::Divide | Arith::Modulo | Arith::IntDivide) && b.as_f64() == 0.0 {
        return Err(zero());
    }
    if let Some((x, y)) = ints {
        let exact = match op {
            Arith::Add => x.checked_add(y),
            Arith::Subtract => x.checked_sub(y),
            Arith::Multiply => x.checked_mul(y),
            Arith::Modulo => x.checked_rem_euclid(y).map(|r| if y < 0 && r != 0 { r + y } else { r }),
            Arith::IntDivide => x.checked_div_euclid(y).map(|q| {
                // Floor division, as for floats below.
                if y < 0 && x.rem_euclid(y) != 0 { q - 1 } else { q }
            }),
            Arith::Divide => None,
        };
        if let Some(n) = exact {
            return Ok(Number::Int(n));
        }
    }
    let (x, y) = (a.as_f64(), b.as_f64());
    let f = match op {
        Arith::Add => x + y,
        Arith::Subtract => x - y,
        Arith::Multiply => x * y,
        Arith::Divide => x / y,
        Arith::Modulo => x - y * (x / y).floor(),
        Arith::IntDivide => (x / y).floor(),
    };
    if !f.is_finite() {
        return Err(EvalError::invalid_value("arithmetic beyond the range of a number"));
    }
    Ok(Number::Float(f))
}
