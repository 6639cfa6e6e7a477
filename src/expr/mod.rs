//! Expressions in rules (SPEC §1.8): JMESPath as the Community Edition specifies it, with
//! recast's own functions. An expression's text is split into tokens ([`lex`]), parsed into a
//! syntax tree ([`parse`]), checked and lowered into a flat [`Program`] of steps ([`lower`]):
//! that program is all the rest of recast sees. [`eval`] runs a program over a parsed document,
//! reading the document in place and building values in the call's arena only where the
//! language must build them.

mod eval;
mod functions;
mod lex;
mod lower;
mod parse;
#[cfg(test)]
mod tests;
mod value;

#[cfg(feature = "fuzzing")]
pub use eval::evaluate_original;
pub use eval::{EvalError, EvalErrorKind, evaluate};
pub use value::{
    Arena, Budget, Built, Const, Doc, Kind, Number, OverBudget, Val, cost, steps_of_bytes, steps_of_writing,
};

/// Longest expression text, in bytes (SPEC §1.8).
pub const MAX_EXPR_BYTES: usize = 4096;

/// A compiled expression: steps indexed by [`StepId`], the root step last.
#[derive(Debug, Clone)]
pub struct Program {
    pub(crate) steps: Vec<Step>,
    /// Children of steps with several (multi-selects, calls), by range.
    pub(crate) kids: Vec<StepId>,
    /// Member names of multi-select hashes, in step order.
    pub(crate) names: Vec<Box<str>>,
    /// Field names of [`Step::Path`]s.
    pub(crate) paths: Vec<Box<str>>,
    pub(crate) consts: Vec<Const>,
    /// What calls of recast's own functions compiled from their literal arguments.
    pub(crate) natives: Vec<Native>,
    /// Number of variable slots (one per `let` binding).
    pub(crate) vars: usize,
    /// The text it was compiled from.
    pub(crate) source: Box<str>,
}

/// Index of a step in [`Program::steps`].
pub type StepId = u32;

/// A range of one of the program's pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: u32,
    pub end: u32,
}

impl Range {
    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }
}

/// One step of a program; each comes from one piece of expression syntax.
#[derive(Debug, Clone)]
pub(crate) enum Step {
    /// `@`.
    Current,
    /// `$`.
    Root,
    /// `$name`: a `let` binding's slot.
    Var(u32),
    /// A literal: an index into [`Program::consts`].
    Const(u32),
    /// `name`, `"name"`.
    Field(Box<str>),
    /// `a.b.c`: a chain of names (a range of [`Program::paths`]), read one after another.
    Path(Range),
    /// `a.b` where `b` is not a name.
    Sub(StepId, StepId),
    /// `a | b`.
    Pipe(StepId, StepId),
    /// `[n]`.
    Index(i64),
    /// `[start:stop:step]`.
    Slice(Option<i64>, Option<i64>, Option<i64>),
    /// `a[*].b`, `a[].b`.
    ListProject(StepId, StepId),
    /// `a[n:m].b`: like [`Step::ListProject`], but the slice of a string is read, not projected.
    SliceProject(StepId, StepId),
    /// `a.*.b`.
    ObjectProject(StepId, StepId),
    /// `a[]` before its projection.
    Flatten(StepId),
    /// `a[?c].b`.
    Filter(StepId, StepId, StepId),
    /// `[a, b]`: a range of kids.
    MultiList(Range),
    /// `{x: a, y: b}`: a range of kids, and the same range of names.
    MultiHash(Range, Range),
    Or(StepId, StepId),
    And(StepId, StepId),
    Not(StepId),
    Compare(parse::Compare, StepId, StepId),
    Arith(parse::Arith, StepId, StepId),
    /// Unary minus (`true`) or plus.
    Sign(bool, StepId),
    Ternary(StepId, StepId, StepId),
    /// `let`: slots with the kids whose values they take (two ranges of equal length: slots
    /// as kids' ids), then the body.
    Let(Range, StepId),
    /// A function call with its arguments (a range of kids), and for recast's own functions the
    /// index of what their literal arguments compiled to in [`Program::natives`].
    Call(functions::Function, Range, u32),
    /// `&expr`: only a function's argument can use one.
    Expref(StepId),
}

/// The literal arguments of a call of recast's own functions, compiled at registration: a
/// pattern, a time zone (SPEC §1.8).
#[derive(Debug, Clone, Default)]
pub(crate) struct Native {
    pub regex: Option<regex::Regex>,
    pub zone: Option<jiff::tz::TimeZone>,
}

/// Why an expression does not compile, at a byte offset of its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileError {
    pub kind: CompileErrorKind,
    /// Byte offset in the expression.
    pub at: usize,
    pub message: String,
}

/// The JMESPath compliance suites' names for compile errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompileErrorKind {
    Syntax,
    UnknownFunction,
    InvalidArity,
    UndefinedVariable,
    /// A literal argument a function needs at compile time is not one it takes (a pattern, a
    /// format, a zone).
    InvalidLiteral,
}

impl CompileErrorKind {
    pub fn name(self) -> &'static str {
        match self {
            CompileErrorKind::Syntax => "syntax",
            CompileErrorKind::UnknownFunction => "unknown-function",
            CompileErrorKind::InvalidArity => "invalid-arity",
            CompileErrorKind::UndefinedVariable => "undefined-variable",
            CompileErrorKind::InvalidLiteral => "invalid-value",
        }
    }
}

impl CompileError {
    /// The offset in characters, as messages give it.
    pub fn char_offset(&self, source: &str) -> usize {
        source.get(..self.at).map_or(self.at, |s| s.chars().count())
    }
}

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A syntax error while tokenizing or parsing.
#[derive(Debug, Clone)]
pub struct SyntaxError {
    pub at: usize,
    pub message: String,
}

impl SyntaxError {
    pub(crate) fn new(at: usize, message: impl Into<String>) -> SyntaxError {
        SyntaxError { at, message: message.into() }
    }

    pub(crate) fn expecting(mut self, what: impl std::fmt::Display) -> SyntaxError {
        self.message = format!("{}, expecting {what}", self.message);
        self
    }
}

/// Compiles `source`; `max_depth` bounds its nesting. Every problem found is returned, each with
/// its offset (a syntax error ends the search: what follows it cannot be read).
pub fn compile(source: &str, max_depth: usize) -> Result<Program, Vec<CompileError>> {
    let syntax = |e: SyntaxError| {
        vec![CompileError {
            kind: CompileErrorKind::Syntax,
            at: e.at,
            message: format!("syntax error: {}", e.message),
        }]
    };
    if source.len() > MAX_EXPR_BYTES {
        return Err(vec![CompileError {
            kind: CompileErrorKind::Syntax,
            at: 0,
            message: format!("the expression is {} bytes long, more than {MAX_EXPR_BYTES}", source.len()),
        }]);
    }
    let tokens = lex::tokens(source, max_depth).map_err(syntax)?;
    let ast = parse::parse(tokens, max_depth).map_err(syntax)?;
    lower::lower(&ast, source)
}

impl Program {
    /// The text the program was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The steps of a program that is nothing but a plain path of names and indexes
    /// (`a.b[0].c`, `"x y"[-1]`), `None` for any other. Such a program reads one value of the
    /// document, which a plan can read through its scans instead of running the program: a name
    /// reads the first member so called of an object, an index the element of a list, and
    /// anything else (a list where a name is read, a missing value) ends in `null`.
    pub fn plain_path(&self) -> Option<Vec<PathStep<'_>>> {
        fn walk<'p>(program: &'p Program, step: StepId, out: &mut Vec<PathStep<'p>>) -> Option<()> {
            match program.steps.get(step as usize)? {
                Step::Field(name) => out.push(PathStep::Field(name)),
                Step::Path(names) => {
                    out.extend(program.paths.get(names.range())?.iter().map(|n| PathStep::Field(n)))
                }
                &Step::Index(n) => out.push(PathStep::Index(n)),
                &Step::Sub(left, right) => {
                    walk(program, left, out)?;
                    walk(program, right, out)?;
                }
                _ => return None,
            }
            Some(())
        }
        let root = self.steps.len().checked_sub(1)?;
        let mut steps = Vec::new();
        walk(self, root as StepId, &mut steps)?;
        Some(steps)
    }
}

/// One step of a plain path ([`Program::plain_path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathStep<'p> {
    /// The first member of this name of an object.
    Field(&'p str),
    /// The element of a list at this index, counting from the end when negative.
    Index(i64),
}
