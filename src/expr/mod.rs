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
mod reads;
#[cfg(test)]
mod tests;
mod value;

#[cfg(feature = "fuzzing")]
pub use eval::evaluate_original;
pub use eval::{EvalError, EvalErrorKind, evaluate, evaluate_bound, evaluate_with};
pub(crate) use reads::Seg;
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
    /// How many of the first slots are variables bound outside the expression (`$caller`,
    /// `$item`), which the caller fills ([`evaluate_with`]).
    pub(crate) bound: usize,
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
    pub regex: Option<Pattern>,
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
    /// A number where a value was expected (told with its text by [`compile_with`]).
    pub(crate) bare_number: bool,
}

impl SyntaxError {
    pub(crate) fn new(at: usize, message: impl Into<String>) -> SyntaxError {
        SyntaxError { at, message: message.into(), bare_number: false }
    }

    pub(crate) fn expecting(mut self, what: impl std::fmt::Display) -> SyntaxError {
        self.message = format!("{}, expecting {what}", self.message);
        self
    }
}

/// Compiles `source`; `max_depth` bounds its nesting. Every problem found is returned, each with
/// its offset (a syntax error ends the search: what follows it cannot be read).
pub fn compile(source: &str, max_depth: usize) -> Result<Program, Vec<CompileError>> {
    compile_with(source, max_depth, &mut Patterns::default())
}

/// [`compile`], with the patterns (`regex_*`) of the other expressions of its rules document:
/// each distinct pattern is compiled once, and a document has at most [`MAX_PATTERNS`].
pub fn compile_with(
    source: &str,
    max_depth: usize,
    patterns: &mut Patterns,
) -> Result<Program, Vec<CompileError>> {
    compile_bound(source, max_depth, patterns, &[])
}

/// [`compile_with`], with variables bound outside the expression: `bound[i]` (a name without
/// its `$`) is slot `i` of [`evaluate_bound`]'s values.
pub fn compile_bound(
    source: &str,
    max_depth: usize,
    patterns: &mut Patterns,
    bound: &[&str],
) -> Result<Program, Vec<CompileError>> {
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
    let unbalanced = parse::unbalanced(&tokens, source);
    let ast = parse::parse(tokens, max_depth).map_err(|e| {
        // A bracket left open or closed wrongly explains the parser's complaint at or past it.
        syntax(match unbalanced {
            Some((bracket, shows_at)) if e.at >= shows_at => bracket,
            _ if e.bare_number => bare_number(source, e.at),
            _ => e,
        })
    })?;
    lower::lower_bound(&ast, source, patterns, bound)
}

/// Mistakes an expression that compiles may still hold, each with its byte offset: a name in
/// double quotes compared with a field (`a[?b == "x"]` compares `b` with the field `x`, never
/// with the text `x`: the most common JMESPath mistake after bare numbers). A name that needs
/// its quotes (`"first name"`), or compared with a literal (`"status" == 'on'`), is taken as
/// meant.
pub fn lint(source: &str, max_depth: usize) -> Vec<(usize, String)> {
    let Ok(tokens) = lex::tokens(source, max_depth) else { return Vec::new() };
    let compares = |tok: &lex::Tok| {
        use lex::Tok::{Eq, Ge, Gt, Le, Lt, Ne};
        matches!(tok, Eq | Ne | Lt | Le | Gt | Ge)
    };
    // The operand on a comparison's other side: a field too means two fields are compared
    // (`b == "x"`); a literal (`"status" == 'active'`) means the quotes name a field on purpose.
    let field =
        |t: Option<&lex::Token>| matches!(t.map(|t| &t.tok), Some(lex::Tok::Name(_) | lex::Tok::Quoted(_)));
    let mut found = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let lex::Tok::Quoted(name) = &token.tok else { continue };
        let beside = (i > 1 && compares(&tokens[i - 1].tok) && field(tokens.get(i - 2)))
            || (tokens.get(i + 1).is_some_and(|t| compares(&t.tok)) && field(tokens.get(i + 2)));
        let bare = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if beside && bare {
            found.push((
                token.at,
                format!(
                    "\"{name}\" is the field named {name}, not the text {name}: text is written '{name}' (or `\"{name}\"`)"
                ),
            ));
        }
    }
    found
}

/// The error of a number used as a value at byte `at` of `source`, showing the number as written.
fn bare_number(source: &str, at: usize) -> SyntaxError {
    let rest = source.get(at..).unwrap_or_default();
    let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let mut len = usize::from(rest.starts_with('-'));
    len += digits(&rest[len..]);
    if rest[len..].starts_with('.') && digits(&rest[len + 1..]) > 0 {
        len += 1 + digits(&rest[len + 1..]);
    }
    let number = &rest[..len];
    SyntaxError::new(
        at,
        format!(
            "a number as a value is a JSON literal, with backticks around it: `` `{number}` `` (a bare number is only an index, as in `a[0]`)"
        ),
    )
}

/// Distinct patterns one rules document's expressions may have: each costs up to
/// [`PATTERN_BYTES`] compiled, twice (a pattern is searched forwards and backwards), and its
/// search caches.
pub const MAX_PATTERNS: usize = 32;

/// How large one compiled pattern may be.
pub const PATTERN_BYTES: usize = 1 << 20;

/// The patterns of one rules document's expressions, by their text. Every distinct pattern
/// tried counts toward [`MAX_PATTERNS`], whether it compiles or not, and once one does not, no
/// other is compiled: what one document's patterns may cost to compile is bounded by that many
/// attempts, each stopped at [`PATTERN_BYTES`].
#[derive(Default)]
pub struct Patterns {
    compiled: std::collections::HashMap<Box<str>, Pattern>,
    /// Distinct patterns tried, compiled or not.
    tried: usize,
    /// The first pattern that did not compile, and why.
    failed: Option<(Box<str>, String)>,
}

/// A compiled pattern, with what searching with it costs.
#[derive(Debug, Clone)]
pub(crate) struct Pattern {
    pub regex: regex::Regex,
    /// Steps per 64 bytes of text searched: eight (a search reads a byte about eight times
    /// slower than a plain scan), and one more per 4 KiB of its compiled automaton (a search that
    /// can no longer keep its states in cache steps through the automaton).
    pub weight: u64,
    /// Whether it can match text of any length (`+`, `*`, `{n,}`): each search may then read up
    /// to the end of the text, whatever it finds.
    pub unbounded: bool,
}

impl Patterns {
    /// The pattern `text`, compiled now or earlier in the document.
    pub(crate) fn get(&mut self, text: &str) -> Result<Pattern, String> {
        if let Some(pattern) = self.compiled.get(text) {
            return Ok(pattern.clone());
        }
        if let Some((failed, why)) = &self.failed {
            return Err(match &**failed == text {
                true => why.clone(),
                false => format!(
                    "the pattern {text:?} is not compiled: the pattern {failed:?} before it does not compile, and none is compiled after one that does not"
                ),
            });
        }
        if self.tried >= MAX_PATTERNS {
            return Err(format!("a rules document has at most {MAX_PATTERNS} distinct patterns"));
        }
        self.tried += 1;
        match compile_pattern(text) {
            Ok(pattern) => {
                self.compiled.insert(text.into(), pattern.clone());
                Ok(pattern)
            }
            Err(why) => {
                let why = format!("the pattern {text:?} does not compile: {}", lower::one_line(&why));
                self.failed = Some((text.into(), why.clone()));
                Err(why)
            }
        }
    }
}

/// Compiles `text`, its cheapest checks first: parsed (its nesting bounded), its automaton built
/// (its size bounded, which is where a pattern too large stops), then the searcher.
fn compile_pattern(text: &str) -> Result<Pattern, String> {
    let hir =
        regex_syntax::ParserBuilder::new().nest_limit(32).build().parse(text).map_err(|e| e.to_string())?;
    let unbounded = hir.properties().maximum_len().is_none();
    let automaton = regex_automata::nfa::thompson::NFA::compiler()
        .configure(regex_automata::nfa::thompson::Config::new().nfa_size_limit(Some(PATTERN_BYTES)))
        .build_from_hir(&hir)
        .map_err(|e| e.to_string())?
        .memory_usage();
    let regex = regex::RegexBuilder::new(text)
        .size_limit(PATTERN_BYTES)
        .nest_limit(32)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(Pattern { regex, weight: 8 + (automaton / 4096) as u64, unbounded })
}

impl Program {
    /// The names the program reads from the value it starts on (`@` at its top, or `$`), for an
    /// expression over a composed route's context (SPEC §2.3), which may read only some of its
    /// members: `Err` when it reads that value whole (`@`, `$`, `keys(@)`), which it may not.
    pub fn context_names(&self) -> Result<Vec<&str>, &'static str> {
        let mut names = Vec::new();
        let top = (self.steps.len() - 1) as StepId;
        self.names_at(top, true, false, &mut names)?;
        names.sort_unstable();
        names.dedup();
        Ok(names)
    }

    /// [`Program::context_names`] of an expression over a value that may be a list (a page of
    /// an upstream's answers): an index or a slice of it (`[-1].id`) reads it whole too.
    pub fn value_names(&self) -> Result<Vec<&str>, &'static str> {
        let mut names = Vec::new();
        let top = (self.steps.len() - 1) as StepId;
        self.names_at(top, true, true, &mut names)?;
        names.sort_unstable();
        names.dedup();
        Ok(names)
    }

    /// [`Program::context_names`] of step `id`, which runs on the context when `on_context`.
    fn names_at<'p>(
        &'p self,
        id: StepId,
        on_context: bool,
        strict: bool,
        names: &mut Vec<&'p str>,
    ) -> Result<(), &'static str> {
        let whole = "reads the whole context (`@` or `$`); name what it reads, such as `request.query.id`";
        let kids = |range: Range| &self.kids[range.range()];
        match &self.steps[id as usize] {
            Step::Current if on_context => return Err(whole),
            Step::Root => return Err(whole),
            Step::Field(name) if on_context => names.push(name),
            Step::Path(range) if on_context => {
                if let Some(first) = self.paths[range.range()].first() {
                    names.push(first);
                }
            }
            Step::Current | Step::Var(_) | Step::Const(_) | Step::Field(_) | Step::Path(_) => {}
            // An index or a slice of the value read whole, when it may be a list.
            Step::Index(_) | Step::Slice(..) if on_context && strict => return Err(whole),
            Step::Index(_) | Step::Slice(..) => {}
            // `$.a`: the right side reads the context.
            Step::Sub(left, right) if matches!(self.steps[*left as usize], Step::Root) => {
                self.names_at(*right, true, strict, names)?;
            }
            Step::Sub(left, right)
            | Step::Pipe(left, right)
            | Step::ListProject(left, right)
            | Step::SliceProject(left, right)
            | Step::ObjectProject(left, right) => {
                self.names_at(*left, on_context, strict, names)?;
                self.names_at(*right, false, strict, names)?;
            }
            Step::Flatten(inner) | Step::Not(inner) | Step::Sign(_, inner) => {
                self.names_at(*inner, on_context, strict, names)?;
            }
            Step::Expref(inner) => self.names_at(*inner, false, strict, names)?,
            Step::Filter(list, condition, right) => {
                self.names_at(*list, on_context, strict, names)?;
                self.names_at(*condition, false, strict, names)?;
                self.names_at(*right, false, strict, names)?;
            }
            Step::MultiList(range) | Step::MultiHash(range, _) | Step::Call(_, range, _) => {
                for kid in kids(*range) {
                    self.names_at(*kid, on_context, strict, names)?;
                }
            }
            Step::Let(bindings, body) => {
                for pair in kids(*bindings).chunks_exact(2) {
                    self.names_at(pair[1], on_context, strict, names)?;
                }
                self.names_at(*body, on_context, strict, names)?;
            }
            Step::Or(a, b) | Step::And(a, b) | Step::Compare(_, a, b) | Step::Arith(_, a, b) => {
                self.names_at(*a, on_context, strict, names)?;
                self.names_at(*b, on_context, strict, names)?;
            }
            Step::Ternary(a, b, c) => {
                for kid in [a, b, c] {
                    self.names_at(*kid, on_context, strict, names)?;
                }
            }
        }
        Ok(())
    }

    /// The chains of names the program reads, each from where it starts (the value the program
    /// starts on, or a variable) and as far as it goes by names, indexes, slices, projections
    /// and flattening (`sum(orders.items[*].price)` reads `orders.items.price`; `a.b[?x].c`
    /// reads `a.b`; `$item.id` reads `id` of `$item`), for telling where a value it found none
    /// of is missing. At most `most` chains, the first ones.
    pub fn read_paths(&self, most: usize) -> Vec<(Start, Vec<&str>)> {
        let mut paths = Vec::new();
        if let Some(top) = self.steps.len().checked_sub(1) {
            self.paths_at(top as StepId, &mut paths, most);
        }
        paths
    }

    /// [`Program::read_paths`] of step `id`, which runs on the value the program starts on.
    fn paths_at<'p>(&'p self, id: StepId, paths: &mut Vec<(Start, Vec<&'p str>)>, most: usize) {
        if paths.len() >= most {
            return;
        }
        let kids = |range: Range| &self.kids[range.range()];
        match &self.steps[id as usize] {
            Step::Field(_)
            | Step::Path(_)
            | Step::Sub(..)
            | Step::ListProject(..)
            | Step::SliceProject(..)
            | Step::ObjectProject(..)
            | Step::Flatten(_)
            | Step::Filter(..) => {
                if let Some((start, names, _)) = self.chain(id)
                    && !names.is_empty()
                {
                    paths.push((start, names));
                }
            }
            // What the left side of a pipe gives is not the document.
            Step::Pipe(left, _) => self.paths_at(*left, paths, most),
            Step::Not(inner) | Step::Sign(_, inner) => self.paths_at(*inner, paths, most),
            Step::Or(a, b) | Step::And(a, b) | Step::Compare(_, a, b) | Step::Arith(_, a, b) => {
                self.paths_at(*a, paths, most);
                self.paths_at(*b, paths, most);
            }
            Step::Ternary(a, b, c) => {
                for kid in [a, b, c] {
                    self.paths_at(*kid, paths, most);
                }
            }
            Step::MultiList(range) | Step::MultiHash(range, _) | Step::Call(_, range, _) => {
                for kid in kids(*range) {
                    self.paths_at(*kid, paths, most);
                }
            }
            Step::Let(bindings, body) => {
                for pair in kids(*bindings).chunks_exact(2) {
                    self.paths_at(pair[1], paths, most);
                }
                self.paths_at(*body, paths, most);
            }
            Step::Current
            | Step::Root
            | Step::Var(_)
            | Step::Const(_)
            | Step::Index(_)
            | Step::Slice(..)
            | Step::Expref(_) => {}
        }
    }

    /// Where step `id` starts, the names it reads one after another from there, and whether the
    /// whole step is such a chain (so what follows it continues the chain); `None` for a step
    /// that reads no chain.
    fn chain(&self, id: StepId) -> Option<(Start, Vec<&str>, bool)> {
        Some(match &self.steps[id as usize] {
            Step::Field(name) => (Start::Context, vec![&**name], true),
            Step::Path(range) => {
                (Start::Context, self.paths[range.range()].iter().map(|n| &**n).collect(), true)
            }
            Step::Index(_) | Step::Slice(..) | Step::Current | Step::Root => {
                (Start::Context, Vec::new(), true)
            }
            &Step::Var(slot) => (Start::Var(slot), Vec::new(), true),
            Step::Flatten(inner) => self.chain(*inner)?,
            Step::Sub(left, right)
            | Step::ListProject(left, right)
            | Step::SliceProject(left, right)
            | Step::ObjectProject(left, right) => {
                let (start, mut names, whole) = self.chain(*left)?;
                // `a.*` has no name of its own to read below: a chain goes on below a name only.
                if whole && !matches!(self.steps[id as usize], Step::ObjectProject(..)) {
                    return Some(match self.chain(*right) {
                        Some((Start::Context, more, whole)) => {
                            names.extend(more);
                            (start, names, whole)
                        }
                        _ => (start, names, false),
                    });
                }
                (start, names, false)
            }
            Step::Filter(list, ..) => {
                let (start, names, _) = self.chain(*list)?;
                (start, names, false)
            }
            _ => return None,
        })
    }

    /// The text of a program that is a string literal and nothing else (`'{{'`).
    pub fn constant_text(&self) -> Option<&str> {
        match (self.steps.as_slice(), self.consts.as_slice()) {
            ([Step::Const(0)], [Const::String(text)]) => Some(text),
            _ => None,
        }
    }

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

/// Where a chain of names of [`Program::read_paths`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The value the program starts on (`@`; in rules, the document).
    Context,
    /// A variable: a `let` binding's slot, or a template's `$item`.
    Var(u32),
}

/// One step of a plain path ([`Program::plain_path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathStep<'p> {
    /// The first member of this name of an object.
    Field(&'p str),
    /// The element of a list at this index, counting from the end when negative.
    Index(i64),
}
