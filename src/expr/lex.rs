//! Splitting an expression's text into tokens, each with the byte offset it starts at.

use super::{Const, SyntaxError};

#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// An unquoted identifier (`foo`, also `let` and `in`, which are keywords only where a
    /// `let` expression is).
    Name(Box<str>),
    /// A quoted identifier (`"foo bar"`), unescaped.
    Quoted(Box<str>),
    /// `$name`.
    Variable(Box<str>),
    /// A non-negative integer (indexes, slices).
    Number(i64),
    /// `` `json` `` or `'raw text'`.
    Literal(Box<Const>),
    Dot,
    Star,
    /// `×`: multiplication only.
    Times,
    At,
    /// `$` alone: the whole document.
    Root,
    Ampersand,
    And,
    Pipe,
    Or,
    Not,
    Ne,
    Eq,
    Assign,
    Lt,
    Le,
    Gt,
    Ge,
    Lparen,
    Rparen,
    Lbracket,
    Rbracket,
    /// `[?`
    Filter,
    /// `[]`
    Flatten,
    Lbrace,
    Rbrace,
    Comma,
    Colon,
    Question,
    Plus,
    Minus,
    Divide,
    IntDivide,
    Modulo,
    Eof,
}

#[derive(Debug, Clone)]
pub struct Token {
    pub tok: Tok,
    /// Byte offset in the expression.
    pub at: usize,
}

/// The tokens of `text`, ending with [`Tok::Eof`]; JSON literals nest at most `max_depth` deep.
pub fn tokens(text: &str, max_depth: usize) -> Result<Vec<Token>, SyntaxError> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let at = i;
        let c = text[i..].chars().next().expect("a character at a char boundary");
        let one = |tok| (tok, c.len_utf8());
        let two = |second: u8, both, single| {
            if bytes.get(i + 1) == Some(&second) { (both, 2) } else { (single, 1) }
        };
        let (tok, len) = match c {
            ' ' | '\t' | '\n' | '\r' => {
                i += 1;
                continue;
            }
            'a'..='z' | 'A'..='Z' | '_' => {
                let end = name_end(bytes, i);
                (Tok::Name(text[i..end].into()), end - i)
            }
            '$' => {
                let end = name_end(bytes, i + 1);
                if end > i + 1 && !bytes[i + 1].is_ascii_digit() {
                    (Tok::Variable(text[i + 1..end].into()), end - i)
                } else {
                    one(Tok::Root)
                }
            }
            '0'..='9' => {
                let end = i + bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
                let n = text[i..end]
                    .parse()
                    .map_err(|_| SyntaxError::new(at, "a number too large for an index"))?;
                (Tok::Number(n), end - i)
            }
            '"' => {
                let (value, len) = quoted(text, i)?;
                (Tok::Quoted(value.into()), len)
            }
            '\'' => {
                let (value, len) = raw_string(text, i)?;
                (Tok::Literal(Box::new(Const::String(value.into()))), len)
            }
            '`' => {
                let (value, len) = json_literal(text, i, max_depth)?;
                (Tok::Literal(Box::new(value)), len)
            }
            '.' => one(Tok::Dot),
            '*' => one(Tok::Star),
            '×' => one(Tok::Times),
            '@' => one(Tok::At),
            '&' => two(b'&', Tok::And, Tok::Ampersand),
            '|' => two(b'|', Tok::Or, Tok::Pipe),
            '!' => two(b'=', Tok::Ne, Tok::Not),
            '=' => two(b'=', Tok::Eq, Tok::Assign),
            '<' => two(b'=', Tok::Le, Tok::Lt),
            '>' => two(b'=', Tok::Ge, Tok::Gt),
            '(' => one(Tok::Lparen),
            ')' => one(Tok::Rparen),
            '[' => match bytes.get(i + 1) {
                Some(b'?') => (Tok::Filter, 2),
                Some(b']') => (Tok::Flatten, 2),
                _ => one(Tok::Lbracket),
            },
            ']' => one(Tok::Rbracket),
            '{' => one(Tok::Lbrace),
            '}' => one(Tok::Rbrace),
            ',' => one(Tok::Comma),
            ':' => one(Tok::Colon),
            '?' => one(Tok::Question),
            '+' => one(Tok::Plus),
            '-' | '−' => one(Tok::Minus),
            '/' => two(b'/', Tok::IntDivide, Tok::Divide),
            '÷' => one(Tok::Divide),
            '%' => one(Tok::Modulo),
            other => return Err(SyntaxError::new(at, format!("unexpected character {other:?}"))),
        };
        out.push(Token { tok, at });
        i += len;
    }
    out.push(Token { tok: Tok::Eof, at: bytes.len() });
    Ok(out)
}

fn name_end(bytes: &[u8], from: usize) -> usize {
    from + bytes[from..].iter().take_while(|b| b.is_ascii_alphanumeric() || **b == b'_').count()
}

/// A quoted identifier from `start` (its opening quote): a JSON string.
fn quoted(text: &str, start: usize) -> Result<(String, usize), SyntaxError> {
    let bytes = text.as_bytes();
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => {
                let json = &text[start..=i];
                let value: String = serde_json::from_str(json).map_err(|e| {
                    SyntaxError::new(start, format!("a quoted identifier that is not a JSON string: {e}"))
                })?;
                return Ok((value, i + 1 - start));
            }
            _ => i += 1,
        }
    }
    Err(SyntaxError::new(start, "a quoted identifier without its closing \""))
}

/// A raw string from `start` (its opening `'`): `\'` is a quote and `\\` a backslash; any other
/// backslash is itself.
fn raw_string(text: &str, start: usize) -> Result<(String, usize), SyntaxError> {
    let bytes = text.as_bytes();
    let mut value = String::new();
    let mut i = start + 1;
    let mut run = i;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if matches!(bytes.get(i + 1), Some(b'\'' | b'\\')) => {
                value.push_str(&text[run..i]);
                value.push(bytes[i + 1] as char);
                i += 2;
                run = i;
            }
            b'\'' => {
                value.push_str(&text[run..i]);
                return Ok((value, i + 1 - start));
            }
            _ => i += 1,
        }
    }
    Err(SyntaxError::new(start, "a raw string without its closing '"))
}

/// Why the literal `` `text` `` is refused: a literal is JSON, so bare text (the legacy form
/// recast does not take, SPEC §1.8) is told how to write it.
/// `before`: the characters of the expression before the literal's backtick.
fn not_json(text: &str, before: usize, error: &crate::json::JsonError) -> String {
    let trimmed = text.trim();
    let bare_text = !trimmed.is_empty()
        && !trimmed.starts_with(['"', '{', '[', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9'])
        && !matches!(trimmed, "true" | "false" | "null");
    if bare_text {
        let quoted = serde_json::to_string(trimmed).unwrap_or_default();
        let raw = trimmed.replace('\\', "\\\\").replace('\'', "\\'");
        format!(
            "`{trimmed}` is not JSON: a literal in backticks is a JSON value, so text is written with quotes, `{quoted}`, or as the raw string '{raw}'"
        )
    } else {
        match error {
            crate::json::JsonError::Syntax { at: Some(at), .. } if *at >= text.len() => {
                format!("the literal `{text}` is not JSON: it ends before its value is complete")
            }
            crate::json::JsonError::Syntax { what, at: Some(at) } => {
                let within = text.get(..*at).map_or(*at, |t| t.chars().count());
                format!("the literal is not JSON: {what} at character {}", before + 1 + within)
            }
            other => format!("the literal is not JSON: {other}"),
        }
    }
}

/// A JSON literal from `start` (its opening backtick): `` \` `` is a backtick; the rest must be
/// one JSON value.
fn json_literal(text: &str, start: usize, max_depth: usize) -> Result<(Const, usize), SyntaxError> {
    let bytes = text.as_bytes();
    let mut json = Vec::new();
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if bytes.get(i + 1) == Some(&b'`') => {
                json.push(b'`');
                i += 2;
            }
            b'`' => {
                let literal = String::from_utf8_lossy(&json).into_owned();
                let parsed = crate::json::with_parsed(&mut json, max_depth, |doc| Const::from_tape(doc, 0))
                    .map_err(|e| {
                    // Told from the literal as written (the parser rewrote its copy).
                    let e = crate::json::diagnose(literal.as_bytes(), max_depth).err().unwrap_or(e);
                    SyntaxError::new(start, not_json(&literal, text[..start].chars().count(), &e))
                })?;
                return Ok((parsed, i + 1 - start));
            }
            b => {
                json.push(b);
                i += 1;
            }
        }
    }
    Err(SyntaxError::new(start, "a literal without its closing `"))
}
