//! Checking a syntax tree (function names and arities, variables in scope) and lowering it into a
//! [`Program`]'s flat steps. Every problem is collected, each with its offset.

use super::functions::{Function, Literal};
use super::parse::Ast;
use super::{
    CompileError, CompileErrorKind, Const, Native, Patterns, Program, Range, Step, StepId, functions,
};

/// [`Step::Call`]'s native index for a function without compiled literals.
pub(crate) const NO_NATIVE: u32 = u32::MAX;

/// Checks and lowers a syntax tree. `bound` are variables bound outside the expression (`$item` of a composed route's
/// `forEach`, SPEC §2.3): `bound[i]` takes slot `i`, which the caller fills before evaluating.
pub fn lower_bound(
    ast: &Ast,
    source: &str,
    patterns: &mut Patterns,
    bound: &[&str],
) -> Result<Program, Vec<CompileError>> {
    let mut lowering = Lowering {
        patterns,
        program: Program {
            steps: Vec::new(),
            kids: Vec::new(),
            names: Vec::new(),
            paths: Vec::new(),
            consts: Vec::new(),
            natives: Vec::new(),
            vars: bound.len(),
            bound: bound.len(),
            source: source.into(),
        },
        scope: bound.iter().enumerate().map(|(slot, name)| (Box::from(*name), slot as u32)).collect(),
        errors: Vec::new(),
    };
    let top = lowering.lower(ast);
    if !lowering.errors.is_empty() {
        return Err(lowering.errors);
    }
    // Every step is pushed after its children, so the top one is the last, where the evaluator
    // starts.
    debug_assert_eq!(top as usize, lowering.program.steps.len() - 1);
    Ok(lowering.program)
}

struct Lowering<'p> {
    /// The patterns of the rules document's expressions.
    patterns: &'p mut Patterns,
    program: Program,
    /// Variables in scope, innermost last, with their slots.
    scope: Vec<(Box<str>, u32)>,
    errors: Vec<CompileError>,
}

impl Lowering<'_> {
    fn push(&mut self, step: Step) -> StepId {
        self.program.steps.push(step);
        (self.program.steps.len() - 1) as StepId
    }

    fn kids(&mut self, kids: &[StepId]) -> Range {
        let start = self.program.kids.len() as u32;
        self.program.kids.extend_from_slice(kids);
        Range { start, end: self.program.kids.len() as u32 }
    }

    fn error(&mut self, kind: CompileErrorKind, at: usize, message: String) {
        self.errors.push(CompileError { kind, at, message });
    }

    /// Compiles the literal arguments of a call of one of recast's own functions; each must be
    /// a literal, and one the function takes. Returns the index of the result.
    fn native(&mut self, function: Function, literals: &[(usize, Literal)], args: &[Ast], at: usize) -> u32 {
        let name = function.name();
        let mut native = Native::default();
        let mut formats = Vec::new();
        for &(i, kind) in literals {
            let Some(arg) = args.get(i) else { continue };
            let Ast::Literal(Const::String(text)) = arg else {
                let what = match kind {
                    Literal::Pattern => "pattern",
                    Literal::Format => "format",
                    Literal::Zone => "zone",
                };
                self.error(
                    CompileErrorKind::InvalidLiteral,
                    at,
                    format!("{name}() takes its {what} (argument {}) as a literal string, like '...'", i + 1),
                );
                continue;
            };
            match kind {
                Literal::Pattern => match self.patterns.get(text) {
                    Ok(pattern) => native.regex = Some(pattern),
                    Err(why) => self.error(CompileErrorKind::InvalidLiteral, at, format!("{name}(): {why}")),
                },
                Literal::Zone => match jiff::tz::TimeZone::get(text) {
                    Ok(zone) => native.zone = Some(zone),
                    Err(_) => self.error(
                        CompileErrorKind::InvalidLiteral,
                        at,
                        format!("{name}(): unknown time zone {text:?} (an IANA name, like 'Europe/Paris')"),
                    ),
                },
                Literal::Format => formats.push(text.clone()),
            }
        }
        for format in formats {
            // A format that cannot write a time with every field known is not one.
            let sample = jiff::Timestamp::UNIX_EPOCH.to_zoned(jiff::tz::TimeZone::UTC);
            if let Err(e) = jiff::fmt::strtime::format(format.as_bytes(), &sample) {
                self.error(
                    CompileErrorKind::InvalidLiteral,
                    at,
                    format!("{name}(): the format {format:?} is not one: {}", one_line(&e.to_string())),
                );
            }
        }
        self.program.natives.push(native);
        (self.program.natives.len() - 1) as u32
    }

    fn lower(&mut self, ast: &Ast) -> StepId {
        match ast {
            Ast::Current => self.push(Step::Current),
            Ast::Root => self.push(Step::Root),
            Ast::Var(name, at) => match self.scope.iter().rev().find(|(n, _)| n == name) {
                Some(&(_, slot)) => self.push(Step::Var(slot)),
                None => {
                    self.error(
                        CompileErrorKind::UndefinedVariable,
                        *at,
                        format!("undefined variable ${name}"),
                    );
                    self.push(Step::Current)
                }
            },
            Ast::Literal(value) => {
                self.program.consts.push(value.clone());
                let i = (self.program.consts.len() - 1) as u32;
                self.push(Step::Const(i))
            }
            Ast::Field(name) => self.push(Step::Field(name.clone())),
            Ast::Sub(..) if path(ast).is_some() => {
                let names = path(ast).unwrap_or_default();
                let start = self.program.paths.len() as u32;
                self.program.paths.extend(names.into_iter().map(Box::from));
                self.push(Step::Path(Range { start, end: self.program.paths.len() as u32 }))
            }
            Ast::Sub(left, right) => {
                let (l, r) = (self.lower(left), self.lower(right));
                self.push(Step::Sub(l, r))
            }
            Ast::Pipe(left, right) => {
                let (l, r) = (self.lower(left), self.lower(right));
                self.push(Step::Pipe(l, r))
            }
            Ast::Index(n) => self.push(Step::Index(*n)),
            Ast::Slice(start, stop, step) => self.push(Step::Slice(*start, *stop, *step)),
            Ast::ListProject(left, right) => {
                let (l, r) = (self.lower(left), self.lower(right));
                self.push(Step::ListProject(l, r))
            }
            Ast::SliceProject(left, right) => {
                let (l, r) = (self.lower(left), self.lower(right));
                self.push(Step::SliceProject(l, r))
            }
            Ast::ObjectProject(left, right) => {
                let (l, r) = (self.lower(left), self.lower(right));
                self.push(Step::ObjectProject(l, r))
            }
            Ast::Flatten(inner) => {
                let i = self.lower(inner);
                self.push(Step::Flatten(i))
            }
            Ast::Filter(left, condition, right) => {
                let (l, c, r) = (self.lower(left), self.lower(condition), self.lower(right));
                self.push(Step::Filter(l, c, r))
            }
            Ast::MultiList(items) => {
                let ids: Vec<_> = items.iter().map(|item| self.lower(item)).collect();
                let range = self.kids(&ids);
                self.push(Step::MultiList(range))
            }
            Ast::MultiHash(members) => {
                let ids: Vec<_> = members.iter().map(|(_, value)| self.lower(value)).collect();
                let kids = self.kids(&ids);
                let start = self.program.names.len() as u32;
                self.program.names.extend(members.iter().map(|(name, _)| name.clone()));
                let names = Range { start, end: self.program.names.len() as u32 };
                self.push(Step::MultiHash(kids, names))
            }
            Ast::Or(left, right) => {
                let (l, r) = (self.lower(left), self.lower(right));
                self.push(Step::Or(l, r))
            }
            Ast::And(left, right) => {
                let (l, r) = (self.lower(left), self.lower(right));
                self.push(Step::And(l, r))
            }
            Ast::Not(inner) => {
                let i = self.lower(inner);
                self.push(Step::Not(i))
            }
            Ast::Compare(op, left, right) => {
                let (l, r) = (self.lower(left), self.lower(right));
                self.push(Step::Compare(*op, l, r))
            }
            Ast::Arith(op, left, right) => {
                let (l, r) = (self.lower(left), self.lower(right));
                self.push(Step::Arith(*op, l, r))
            }
            Ast::Sign(negative, inner) => {
                let i = self.lower(inner);
                self.push(Step::Sign(*negative, i))
            }
            Ast::Ternary(condition, then, otherwise) => {
                let (c, t, o) = (self.lower(condition), self.lower(then), self.lower(otherwise));
                self.push(Step::Ternary(c, t, o))
            }
            Ast::Let(bindings, body) => {
                // The values are read in the outer scope; the names are in scope in the body only.
                let mut pairs = Vec::with_capacity(bindings.len() * 2);
                let mut slots = Vec::with_capacity(bindings.len());
                for (name, _, value) in bindings {
                    let v = self.lower(value);
                    let slot = self.program.vars as u32;
                    self.program.vars += 1;
                    pairs.extend([slot, v]);
                    slots.push((name.clone(), slot));
                }
                let depth = self.scope.len();
                self.scope.extend(slots);
                let b = self.lower(body);
                self.scope.truncate(depth);
                let range = self.kids(&pairs);
                self.push(Step::Let(range, b))
            }
            Ast::Call(name, at, args) => {
                let ids: Vec<_> = args.iter().map(|arg| self.lower(arg)).collect();
                let range = self.kids(&ids);
                match functions::lookup(name) {
                    None => {
                        self.error(
                            CompileErrorKind::UnknownFunction,
                            *at,
                            match functions::closest(name) {
                                Some(meant) => format!("unknown function {name}(); did you mean {meant}()?"),
                                None => format!("unknown function {name}()"),
                            },
                        );
                        self.push(Step::Current)
                    }
                    Some((function, least, most)) => {
                        if args.len() < least || most.is_some_and(|most| args.len() > most) {
                            let wanted = match most {
                                Some(1) if least == 1 => "1 argument".to_owned(),
                                Some(most) if most == least => format!("{least} arguments"),
                                Some(most) => format!("{least} to {most} arguments"),
                                None if least == 1 => "at least 1 argument".to_owned(),
                                None => format!("at least {least} arguments"),
                            };
                            self.error(
                                CompileErrorKind::InvalidArity,
                                *at,
                                format!("{name}() takes {wanted}, not {}", args.len()),
                            );
                        }
                        let native = match function.literals() {
                            [] => NO_NATIVE,
                            literals => self.native(function, literals, args, *at),
                        };
                        self.push(Step::Call(function, range, native))
                    }
                }
            }
            Ast::Expref(inner) => {
                let i = self.lower(inner);
                self.push(Step::Expref(i))
            }
        }
    }
}

/// The names of `a.b.c`, when the whole expression is such a chain of names.
fn path(ast: &Ast) -> Option<Vec<&str>> {
    match ast {
        Ast::Field(name) => Some(vec![name]),
        Ast::Sub(left, right) => {
            let mut names = path(left)?;
            names.extend(path(right)?);
            Some(names)
        }
        _ => None,
    }
}

/// A message on one line (a pattern's error spans several, pointing at the place).
pub(super) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
