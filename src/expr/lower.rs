//! Checking a syntax tree (function names and arities, variables in scope) and lowering it into a
//! [`Program`]'s flat steps. Every problem is collected, each with its offset.

use super::parse::Ast;
use super::{CompileError, CompileErrorKind, Program, Range, Step, StepId, functions};

pub fn lower(ast: &Ast, source: &str) -> Result<Program, Vec<CompileError>> {
    let mut lowering = Lowering {
        program: Program {
            steps: Vec::new(),
            kids: Vec::new(),
            names: Vec::new(),
            paths: Vec::new(),
            consts: Vec::new(),
            vars: 0,
            source: source.into(),
        },
        scope: Vec::new(),
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

struct Lowering {
    program: Program,
    /// Variables in scope, innermost last, with their slots.
    scope: Vec<(Box<str>, u32)>,
    errors: Vec<CompileError>,
}

impl Lowering {
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
                            format!("unknown function {name}()"),
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
                        self.push(Step::Call(function, range))
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
