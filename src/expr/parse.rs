//! The syntax tree of an expression, by a Pratt parser over [`lex`](super::lex)'s tokens. Only
//! [`lower`](super::lower) reads the tree.

use super::lex::{Tok, Token};
use super::{Const, SyntaxError};

#[derive(Debug, Clone)]
pub enum Ast {
    /// `@`: the current value.
    Current,
    /// `$`: the whole document.
    Root,
    /// `$name`, at its offset.
    Var(Box<str>, usize),
    Literal(Const),
    Field(Box<str>),
    /// `a.b`: `b` read from what `a` gives, unless that is `null`.
    Sub(Box<Ast>, Box<Ast>),
    /// `a | b`: `b` read from what `a` gives, whatever it is.
    Pipe(Box<Ast>, Box<Ast>),
    /// `[n]` of the current value.
    Index(i64),
    /// `[start:stop:step]` of the current value.
    Slice(Option<i64>, Option<i64>, Option<i64>),
    /// `a[*].b`, `a[1:].b`, `a[].b`: `b` of each element of the list `a` gives.
    ListProject(Box<Ast>, Box<Ast>),
    /// `a[n:m].b`: `b` of each element of the slice `a` gives; a string's slice (the
    /// Community Edition's) is not projected, `b` reads the string.
    SliceProject(Box<Ast>, Box<Ast>),
    /// `a.*.b`: `b` of each member value of the object `a` gives.
    ObjectProject(Box<Ast>, Box<Ast>),
    /// `a[]`: the list `a` gives with its list elements spliced in.
    Flatten(Box<Ast>),
    /// `a[?c].b`: `b` of each element of `a` for which `c` is true.
    Filter(Box<Ast>, Box<Ast>, Box<Ast>),
    MultiList(Vec<Ast>),
    MultiHash(Vec<(Box<str>, Ast)>),
    Or(Box<Ast>, Box<Ast>),
    And(Box<Ast>, Box<Ast>),
    Not(Box<Ast>),
    Compare(Compare, Box<Ast>, Box<Ast>),
    Arith(Arith, Box<Ast>, Box<Ast>),
    /// Unary `-` (`true`) or `+` (`false`).
    Sign(bool, Box<Ast>),
    Ternary(Box<Ast>, Box<Ast>, Box<Ast>),
    /// `let $a = x, $b = y in body`: the names with their offsets and values.
    Let(Vec<(Box<str>, usize, Ast)>, Box<Ast>),
    /// A function call, at its name's offset.
    Call(Box<str>, usize, Vec<Ast>),
    /// `&expr`.
    Expref(Box<Ast>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arith {
    Add,
    Subtract,
    Multiply,
    Divide,
    Modulo,
    IntDivide,
}

/// Parses a whole expression; `max_depth` bounds its nesting.
pub fn parse(tokens: Vec<Token>, max_depth: usize) -> Result<Ast, SyntaxError> {
    let mut parser = Parser { tokens, next: 0, depth: 0, max_depth };
    let ast = parser.expression(0)?;
    match parser.peek() {
        Tok::Eof => Ok(ast),
        _ => Err(parser.unexpected()),
    }
}

/// The first bracket of `tokens` that is not closed, or closed by the wrong one, or closes
/// nothing: the mistake, and the offset where it shows (a closer, or the end). A parse error
/// at or past that offset is better told by this.
pub fn unbalanced(tokens: &[Token], source: &str) -> Option<(SyntaxError, usize)> {
    // Offsets in messages count characters, as the offset before them does.
    let character = |at: usize| source.get(..at).map_or(at, |s| s.chars().count());
    let mut open: Vec<(&'static str, &'static str, usize)> = Vec::new();
    for token in tokens {
        let (opener, closer) = match token.tok {
            Tok::Lparen => ("(", ")"),
            Tok::Lbracket => ("[", "]"),
            Tok::Filter => ("[?", "]"),
            Tok::Lbrace => ("{", "}"),
            Tok::Rparen | Tok::Rbracket | Tok::Rbrace => {
                let found = match token.tok {
                    Tok::Rparen => ")",
                    Tok::Rbracket => "]",
                    _ => "}",
                };
                let message = match open.pop() {
                    Some((_, closer, _)) if closer == found => continue,
                    Some((opener, closer, at)) => format!(
                        "`{found}` does not close the `{opener}` at character {}, which needs `{closer}` first",
                        character(at)
                    ),
                    None => format!("`{found}` closes nothing: no `{}` is open before it", opening(found)),
                };
                return Some((SyntaxError::new(token.at, message), token.at));
            }
            _ => continue,
        };
        open.push((opener, closer, token.at));
    }
    let (opener, closer, at) = open.pop()?;
    let message = format!(
        "the expression ends before the `{opener}` at character {} is closed with `{closer}`",
        character(at)
    );
    Some((SyntaxError::new(source.len(), message), source.len()))
}

fn opening(closer: &str) -> &'static str {
    match closer {
        ")" => "(",
        "]" => "[",
        _ => "{",
    }
}

struct Parser {
    tokens: Vec<Token>,
    next: usize,
    depth: usize,
    max_depth: usize,
}

/// How tightly a token binds the expression on its left (0: it ends an expression).
fn left_power(tok: &Tok) -> u8 {
    match tok {
        Tok::Pipe => 1,
        Tok::Question => 2,
        Tok::Or => 3,
        Tok::And => 4,
        Tok::Eq | Tok::Ne | Tok::Lt | Tok::Le | Tok::Gt | Tok::Ge => 5,
        Tok::Plus | Tok::Minus => 6,
        Tok::Star | Tok::Times | Tok::Divide | Tok::IntDivide | Tok::Modulo => 7,
        Tok::Flatten => 9,
        Tok::Filter => 21,
        Tok::Dot => 40,
        Tok::Lbracket => 55,
        Tok::Lparen => 60,
        _ => 0,
    }
}

/// The power a projection's right side is parsed with (`[*]`, `*`, slices).
const STAR: u8 = 20;
const FLATTEN: u8 = 9;
const FILTER: u8 = 21;
const DOT: u8 = 40;
const NOT: u8 = 45;
/// Unary minus and plus bind like `!`.
const SIGN: u8 = NOT;
/// Projections stop at tokens that bind less than this.
const PROJECTION_STOP: u8 = 10;

impl Parser {
    fn peek(&self) -> &Tok {
        &self.tokens[self.next].tok
    }

    fn peek_at(&self, ahead: usize) -> &Tok {
        &self.tokens[(self.next + ahead).min(self.tokens.len() - 1)].tok
    }

    fn at(&self) -> usize {
        self.tokens[self.next].at
    }

    fn advance(&mut self) -> Token {
        let token = self.tokens[self.next].clone();
        if self.next < self.tokens.len() - 1 {
            self.next += 1;
        }
        token
    }

    /// Steps back over `tok`, just read by [`Parser::advance`] (which does not move past the end).
    fn back(&mut self, tok: &Tok) {
        self.next -= usize::from(*tok != Tok::Eof);
    }

    fn unexpected(&self) -> SyntaxError {
        let what = match self.peek() {
            Tok::Eof => return SyntaxError::new(self.at(), "the expression ends too early"),
            tok => describe(tok),
        };
        SyntaxError::new(self.at(), format!("unexpected {what}"))
    }

    fn expect(&mut self, tok: Tok) -> Result<(), SyntaxError> {
        if *self.peek() == tok {
            self.advance();
            Ok(())
        } else {
            Err(self.unexpected().expecting(describe(&tok)))
        }
    }

    /// An expression binding tighter than `power`. `depth` bounds the height of the tree built,
    /// so that compiling, running and dropping it stay within any thread's stack: each nested
    /// expression adds a level, and so does each operator that takes the tree built so far as
    /// its left side (`a.b.c`, `a | b | c` nest to the left).
    fn expression(&mut self, power: u8) -> Result<Ast, SyntaxError> {
        let outside = self.depth;
        self.deeper()?;
        let mut left = self.nud()?;
        while power < left_power(self.peek()) {
            self.deeper()?;
            left = self.led(left)?;
        }
        self.depth = outside;
        Ok(left)
    }

    fn deeper(&mut self) -> Result<(), SyntaxError> {
        self.depth += 1;
        if self.depth > self.max_depth {
            return Err(SyntaxError::new(
                self.at(),
                format!("the expression nests deeper than {} levels (RECAST_MAX_DEPTH)", self.max_depth),
            ));
        }
        Ok(())
    }

    /// An expression that starts at the next token.
    fn nud(&mut self) -> Result<Ast, SyntaxError> {
        let token = self.advance();
        Ok(match token.tok {
            Tok::Literal(value) => Ast::Literal(*value),
            Tok::Name(name) if &*name == "let" && matches!(self.peek(), Tok::Variable(_)) => {
                self.let_expression()?
            }
            Tok::Name(name) if *self.peek() == Tok::Lparen => {
                self.advance();
                let args = self.arguments()?;
                Ast::Call(name, token.at, args)
            }
            Tok::Name(name) | Tok::Quoted(name) => Ast::Field(name),
            Tok::Variable(name) => Ast::Var(name, token.at),
            Tok::At => Ast::Current,
            Tok::Root => Ast::Root,
            Tok::Star => {
                let rhs = self.projection_rhs(STAR)?;
                Ast::ObjectProject(Box::new(Ast::Current), Box::new(rhs))
            }
            Tok::Filter => self.filter(Ast::Current)?,
            Tok::Flatten => {
                let rhs = self.projection_rhs(FLATTEN)?;
                Ast::ListProject(Box::new(Ast::Flatten(Box::new(Ast::Current))), Box::new(rhs))
            }
            Tok::Lbracket => match self.peek() {
                Tok::Number(_) | Tok::Colon | Tok::Minus => self.index(Ast::Current)?,
                Tok::Star if *self.peek_at(1) == Tok::Rbracket => {
                    self.advance();
                    self.advance();
                    let rhs = self.projection_rhs(STAR)?;
                    Ast::ListProject(Box::new(Ast::Current), Box::new(rhs))
                }
                _ => self.multi_list()?,
            },
            Tok::Lbrace => self.multi_hash()?,
            Tok::Not => Ast::Not(Box::new(self.expression(NOT)?)),
            Tok::Minus => Ast::Sign(true, Box::new(self.expression(SIGN)?)),
            Tok::Plus => Ast::Sign(false, Box::new(self.expression(SIGN)?)),
            Tok::Lparen => {
                let inner = self.expression(0)?;
                self.expect(Tok::Rparen)?;
                inner
            }
            Tok::Ampersand => Ast::Expref(Box::new(self.expression(0)?)),
            // The most common mistake of all: a bare number is an index (`a[0]`), never a value.
            Tok::Number(_) => {
                let mut error = SyntaxError::new(token.at, "a number as a value");
                error.bare_number = true;
                return Err(error);
            }
            _ => {
                self.next -= usize::from(token.tok != Tok::Eof);
                return Err(self.unexpected());
            }
        })
    }

    /// What a token on the right of `left` makes of it.
    fn led(&mut self, left: Ast) -> Result<Ast, SyntaxError> {
        let token = self.advance();
        let left = Box::new(left);
        Ok(match token.tok {
            Tok::Dot => Ast::Sub(left, Box::new(self.dot_rhs(DOT)?)),
            Tok::Pipe => Ast::Pipe(left, Box::new(self.expression(1)?)),
            Tok::Or => Ast::Or(left, Box::new(self.expression(3)?)),
            Tok::And => Ast::And(left, Box::new(self.expression(4)?)),
            Tok::Eq => Ast::Compare(Compare::Eq, left, Box::new(self.expression(5)?)),
            Tok::Ne => Ast::Compare(Compare::Ne, left, Box::new(self.expression(5)?)),
            Tok::Lt => Ast::Compare(Compare::Lt, left, Box::new(self.expression(5)?)),
            Tok::Le => Ast::Compare(Compare::Le, left, Box::new(self.expression(5)?)),
            Tok::Gt => Ast::Compare(Compare::Gt, left, Box::new(self.expression(5)?)),
            Tok::Ge => Ast::Compare(Compare::Ge, left, Box::new(self.expression(5)?)),
            Tok::Plus => Ast::Arith(Arith::Add, left, Box::new(self.expression(6)?)),
            Tok::Minus => Ast::Arith(Arith::Subtract, left, Box::new(self.expression(6)?)),
            Tok::Star | Tok::Times => Ast::Arith(Arith::Multiply, left, Box::new(self.expression(7)?)),
            Tok::Divide => Ast::Arith(Arith::Divide, left, Box::new(self.expression(7)?)),
            Tok::IntDivide => Ast::Arith(Arith::IntDivide, left, Box::new(self.expression(7)?)),
            Tok::Modulo => Ast::Arith(Arith::Modulo, left, Box::new(self.expression(7)?)),
            Tok::Question => {
                let then = self.expression(0)?;
                self.expect(Tok::Colon)?;
                let otherwise = self.expression(2)?;
                Ast::Ternary(left, Box::new(then), Box::new(otherwise))
            }
            Tok::Flatten => {
                let rhs = self.projection_rhs(FLATTEN)?;
                Ast::ListProject(Box::new(Ast::Flatten(left)), Box::new(rhs))
            }
            Tok::Filter => self.filter(*left)?,
            Tok::Lbracket => match self.peek() {
                Tok::Number(_) | Tok::Colon | Tok::Minus => self.index(*left)?,
                Tok::Star if *self.peek_at(1) == Tok::Rbracket => {
                    self.advance();
                    self.advance();
                    let rhs = self.projection_rhs(STAR)?;
                    Ast::ListProject(left, Box::new(rhs))
                }
                _ => return Err(self.unexpected().expecting("an index, a slice or *")),
            },
            _ => {
                self.next -= 1;
                return Err(self.unexpected());
            }
        })
    }

    /// After `[` (already read) and before a number, `:` or `-`: an index or a slice of `left`.
    fn index(&mut self, left: Ast) -> Result<Ast, SyntaxError> {
        let at = self.tokens[self.next - 1].at;
        let mut parts = [None; 3];
        let mut part = 0;
        loop {
            match self.peek() {
                Tok::Rbracket => {
                    self.advance();
                    break;
                }
                Tok::Colon if part < 2 => {
                    self.advance();
                    part += 1;
                }
                Tok::Number(_) | Tok::Minus if parts[part].is_none() => {
                    parts[part] = Some(self.signed_number()?)
                }
                _ => return Err(self.unexpected()),
            }
        }
        if part == 0 {
            let Some(n) = parts[0] else { return Err(SyntaxError::new(at, "an empty index")) };
            return Ok(join(left, Ast::Index(n)));
        }
        let slice = Ast::Slice(parts[0], parts[1], parts[2]);
        let rhs = self.projection_rhs(STAR)?;
        Ok(Ast::SliceProject(Box::new(join(left, slice)), Box::new(rhs)))
    }

    fn signed_number(&mut self) -> Result<i64, SyntaxError> {
        let negative = *self.peek() == Tok::Minus;
        if negative {
            self.advance();
        }
        match self.peek() {
            &Tok::Number(n) => {
                self.advance();
                Ok(if negative { -n } else { n })
            }
            _ => Err(self.unexpected().expecting("a number")),
        }
    }

    /// After `[?`: the condition, `]`, and the projection's right side.
    fn filter(&mut self, left: Ast) -> Result<Ast, SyntaxError> {
        let condition = self.expression(0)?;
        self.expect(Tok::Rbracket)?;
        let rhs = self.projection_rhs(FILTER)?;
        Ok(Ast::Filter(Box::new(left), Box::new(condition), Box::new(rhs)))
    }

    /// What a projection applies to each element: nothing more, or a chain of `.x`, `[..]`, `[?..]`.
    fn projection_rhs(&mut self, power: u8) -> Result<Ast, SyntaxError> {
        match self.peek() {
            tok if left_power(tok) < PROJECTION_STOP => Ok(Ast::Current),
            Tok::Lbracket | Tok::Filter => self.expression(power),
            Tok::Dot => {
                self.advance();
                self.dot_rhs(power)
            }
            _ => Err(self.unexpected()),
        }
    }

    /// After `.`: a name, a function call, `*`, or a multi-select.
    fn dot_rhs(&mut self, power: u8) -> Result<Ast, SyntaxError> {
        match self.peek() {
            Tok::Name(_) | Tok::Quoted(_) | Tok::Star => self.expression(power),
            Tok::Lbracket => {
                self.advance();
                self.multi_list()
            }
            Tok::Lbrace => {
                self.advance();
                self.multi_hash()
            }
            _ => Err(self.unexpected().expecting("a name, *, [ or {")),
        }
    }

    /// After `[`: expressions separated by commas, up to `]`.
    fn multi_list(&mut self) -> Result<Ast, SyntaxError> {
        let mut items = vec![self.expression(0)?];
        while *self.peek() == Tok::Comma {
            self.advance();
            items.push(self.expression(0)?);
        }
        self.expect(Tok::Rbracket)?;
        Ok(Ast::MultiList(items))
    }

    /// After `{`: `name: expression` pairs separated by commas, up to `}`.
    fn multi_hash(&mut self) -> Result<Ast, SyntaxError> {
        let mut members = Vec::new();
        loop {
            let name = match self.advance().tok {
                Tok::Name(name) | Tok::Quoted(name) => name,
                other => {
                    self.back(&other);
                    return Err(self.unexpected().expecting("a member name"));
                }
            };
            self.expect(Tok::Colon)?;
            members.push((name, self.expression(0)?));
            match self.advance().tok {
                Tok::Comma => {}
                Tok::Rbrace => return Ok(Ast::MultiHash(members)),
                other => {
                    self.back(&other);
                    return Err(self.unexpected().expecting("`,` or `}`"));
                }
            }
        }
    }

    /// After `(` of a call: arguments separated by commas, up to `)`.
    fn arguments(&mut self) -> Result<Vec<Ast>, SyntaxError> {
        let mut args = Vec::new();
        if *self.peek() == Tok::Rparen {
            self.advance();
            return Ok(args);
        }
        loop {
            args.push(self.expression(0)?);
            match self.advance().tok {
                Tok::Comma => {}
                Tok::Rparen => return Ok(args),
                other => {
                    self.back(&other);
                    return Err(self.unexpected().expecting("`,` or `)`"));
                }
            }
        }
    }

    /// After `let` (already read): `$name = expression` bindings, `in`, and the body.
    fn let_expression(&mut self) -> Result<Ast, SyntaxError> {
        let mut bindings = Vec::new();
        loop {
            let token = self.advance();
            let Tok::Variable(name) = token.tok else {
                self.next -= 1;
                return Err(self.unexpected().expecting("a variable"));
            };
            self.expect(Tok::Assign)?;
            bindings.push((name, token.at, self.expression(0)?));
            match self.peek() {
                Tok::Comma => {
                    self.advance();
                }
                Tok::Name(word) if &**word == "in" => {
                    self.advance();
                    break;
                }
                _ => return Err(self.unexpected().expecting("`,` or `in`")),
            }
        }
        let body = self.expression(0)?;
        Ok(Ast::Let(bindings, Box::new(body)))
    }
}

/// `right` read from what `left` gives; `@` on the left adds nothing.
fn join(left: Ast, right: Ast) -> Ast {
    match left {
        Ast::Current => right,
        left => Ast::Sub(Box::new(left), Box::new(right)),
    }
}

fn describe(tok: &Tok) -> String {
    match tok {
        Tok::Name(name) => format!("name {name:?}"),
        Tok::Quoted(name) => format!("quoted name {name:?}"),
        Tok::Variable(name) => format!("variable ${name}"),
        Tok::Number(n) => format!("number {n}"),
        Tok::Literal(_) => "literal".to_owned(),
        Tok::Eof => "the end of the expression".to_owned(),
        other => {
            let text = match other {
                Tok::Dot => ".",
                Tok::Star => "*",
                Tok::Times => "×",
                Tok::At => "@",
                Tok::Root => "$",
                Tok::Ampersand => "&",
                Tok::And => "&&",
                Tok::Pipe => "|",
                Tok::Or => "||",
                Tok::Not => "!",
                Tok::Ne => "!=",
                Tok::Eq => "==",
                Tok::Assign => "=",
                Tok::Lt => "<",
                Tok::Le => "<=",
                Tok::Gt => ">",
                Tok::Ge => ">=",
                Tok::Lparen => "(",
                Tok::Rparen => ")",
                Tok::Lbracket => "[",
                Tok::Rbracket => "]",
                Tok::Filter => "[?",
                Tok::Flatten => "[]",
                Tok::Lbrace => "{",
                Tok::Rbrace => "}",
                Tok::Comma => ",",
                Tok::Colon => ":",
                Tok::Question => "?",
                Tok::Plus => "+",
                Tok::Minus => "-",
                Tok::Divide => "/",
                Tok::IntDivide => "//",
                Tok::Modulo => "%",
                _ => "token",
            };
            format!("`{text}`")
        }
    }
}
