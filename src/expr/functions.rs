//! The functions an expression can call: JMESPath's 26, the Community Edition's string, object and
//! grouping functions, and recast's own (rounding, dates, patterns: SPEC §1.8). Names and numbers
//! of arguments are checked when compiling ([`lookup`]), and so are the literal arguments of
//! recast's own functions; argument types when running, as the specification says.

use std::cmp::Ordering;

use super::eval::{EvalError, Evaluator, Result, negate};
use super::value::{Kind, Number, Val};
use super::{Range, Step, StepId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Function {
    Abs,
    Avg,
    Ceil,
    Contains,
    EndsWith,
    Floor,
    Join,
    Keys,
    Length,
    Map,
    Max,
    MaxBy,
    Merge,
    Min,
    MinBy,
    NotNull,
    Reverse,
    Sort,
    SortBy,
    StartsWith,
    Sum,
    ToArray,
    ToNumber,
    ToString,
    Type,
    Values,
    Items,
    FromItems,
    Zip,
    GroupBy,
    Lower,
    Upper,
    Trim,
    TrimLeft,
    TrimRight,
    PadLeft,
    PadRight,
    Replace,
    Split,
    FindFirst,
    FindLast,
    Round,
    DateFormat,
    DateParse,
    RegexMatch,
    RegexExtract,
    RegexReplace,
}

/// A literal argument that recast's own functions compile at registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Literal {
    Pattern,
    Format,
    Zone,
}

/// The first [`ORIGINAL`] rows of [`TABLE`] are the original specification's functions.
#[cfg(any(test, feature = "fuzzing"))]
const ORIGINAL: usize = 26;

/// Each function's name and how many arguments it takes (`None`: any number from the least).
const TABLE: &[(&str, Function, usize, Option<usize>)] = &[
    ("abs", Function::Abs, 1, Some(1)),
    ("avg", Function::Avg, 1, Some(1)),
    ("ceil", Function::Ceil, 1, Some(1)),
    ("contains", Function::Contains, 2, Some(2)),
    ("ends_with", Function::EndsWith, 2, Some(2)),
    ("floor", Function::Floor, 1, Some(1)),
    ("join", Function::Join, 2, Some(2)),
    ("keys", Function::Keys, 1, Some(1)),
    ("length", Function::Length, 1, Some(1)),
    ("map", Function::Map, 2, Some(2)),
    ("max", Function::Max, 1, Some(1)),
    ("max_by", Function::MaxBy, 2, Some(2)),
    ("merge", Function::Merge, 1, None),
    ("min", Function::Min, 1, Some(1)),
    ("min_by", Function::MinBy, 2, Some(2)),
    ("not_null", Function::NotNull, 1, None),
    ("reverse", Function::Reverse, 1, Some(1)),
    ("sort", Function::Sort, 1, Some(1)),
    ("sort_by", Function::SortBy, 2, Some(2)),
    ("starts_with", Function::StartsWith, 2, Some(2)),
    ("sum", Function::Sum, 1, Some(1)),
    ("to_array", Function::ToArray, 1, Some(1)),
    ("to_number", Function::ToNumber, 1, Some(1)),
    ("to_string", Function::ToString, 1, Some(1)),
    ("type", Function::Type, 1, Some(1)),
    ("values", Function::Values, 1, Some(1)),
    ("items", Function::Items, 1, Some(1)),
    ("from_items", Function::FromItems, 1, Some(1)),
    ("zip", Function::Zip, 1, None),
    ("group_by", Function::GroupBy, 2, Some(2)),
    ("lower", Function::Lower, 1, Some(1)),
    ("upper", Function::Upper, 1, Some(1)),
    ("trim", Function::Trim, 1, Some(2)),
    ("trim_left", Function::TrimLeft, 1, Some(2)),
    ("trim_right", Function::TrimRight, 1, Some(2)),
    ("pad_left", Function::PadLeft, 2, Some(3)),
    ("pad_right", Function::PadRight, 2, Some(3)),
    ("replace", Function::Replace, 3, Some(4)),
    ("split", Function::Split, 2, Some(3)),
    ("find_first", Function::FindFirst, 2, Some(4)),
    ("find_last", Function::FindLast, 2, Some(4)),
    ("round", Function::Round, 2, Some(2)),
    ("date_format", Function::DateFormat, 2, Some(3)),
    ("date_parse", Function::DateParse, 2, Some(3)),
    ("regex_match", Function::RegexMatch, 2, Some(2)),
    ("regex_extract", Function::RegexExtract, 2, Some(2)),
    ("regex_replace", Function::RegexReplace, 3, Some(3)),
];

/// The function called `name`, with the least and most arguments it takes.
pub fn lookup(name: &str) -> Option<(Function, usize, Option<usize>)> {
    TABLE.iter().find(|(n, ..)| *n == name).map(|&(_, f, least, most)| (f, least, most))
}

impl Function {
    pub fn name(self) -> &'static str {
        TABLE.iter().find(|(_, f, ..)| *f == self).map_or("?", |(n, ..)| n)
    }

    /// Whether the original JMESPath specification has this function (26 of them do).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn in_original_language(self) -> bool {
        TABLE.iter().position(|(_, f, ..)| *f == self).is_some_and(|i| i < ORIGINAL)
    }

    /// Whether argument `i` is an expression reference (`&expr`) the function runs.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn takes_expref(self, i: usize) -> bool {
        matches!(
            (self, i),
            (Function::Map, 0)
                | (Function::SortBy | Function::MaxBy | Function::MinBy | Function::GroupBy, 1)
        )
    }

    /// The arguments (by position) that must be literals, compiled at registration.
    pub fn literals(self) -> &'static [(usize, Literal)] {
        match self {
            Function::DateFormat | Function::DateParse => &[(1, Literal::Format), (2, Literal::Zone)],
            Function::RegexMatch | Function::RegexExtract | Function::RegexReplace => {
                &[(1, Literal::Pattern)]
            }
            _ => &[],
        }
    }
}

/// One argument: a value, or an expression reference (`&expr`) still to be run.
#[derive(Clone, Copy)]
enum Arg<'v> {
    Val(Val<'v>),
    Ref(StepId),
}

impl<'v> Evaluator<'v> {
    pub(crate) fn call(
        &mut self,
        function: &Function,
        args: Range,
        native: u32,
        cur: Val<'v>,
    ) -> Result<Val<'v>> {
        let program = self.program;
        let mut values: smallvec::SmallVec<[Arg<'v>; 4]> = smallvec::SmallVec::new();
        for &kid in &program.kids[args.range()] {
            values.push(match program.steps[kid as usize] {
                Step::Expref(body) => Arg::Ref(body),
                _ => Arg::Val(self.eval(kid, cur)?),
            });
        }
        let f = *function;
        let name = f.name();
        let arg = |i: usize| -> Result<Val<'v>> {
            match values.get(i) {
                Some(Arg::Val(v)) => Ok(*v),
                Some(Arg::Ref(_)) => Err(EvalError::invalid_type(format!(
                    "{name}() takes a value as argument {}, not an expression reference",
                    i + 1
                ))),
                None => Ok(Val::Null),
            }
        };
        let expref = |i: usize| -> Result<StepId> {
            match values.get(i) {
                Some(Arg::Ref(step)) => Ok(*step),
                _ => Err(EvalError::invalid_type(format!(
                    "{name}() takes an expression (&...) as argument {}",
                    i + 1
                ))),
            }
        };
        let doc = self.doc;
        let wrong = |i: usize, wanted: &str, got: Val<'v>| {
            EvalError::invalid_type(format!(
                "{name}() takes {wanted} as argument {}, not {}",
                i + 1,
                got.kind().name()
            ))
        };
        let number = |i: usize| -> Result<Number> {
            match arg(i)? {
                Val::Number(n) => Ok(n),
                v => Err(wrong(i, "a number", v)),
            }
        };
        let string = |i: usize| -> Result<&'v str> {
            match arg(i)? {
                Val::String(s) => Ok(s),
                v => Err(wrong(i, "a string", v)),
            }
        };
        let list = |i: usize| -> Result<Val<'v>> {
            let v = arg(i)?;
            if v.kind() == Kind::Array { Ok(v) } else { Err(wrong(i, "an array", v)) }
        };
        let object = |i: usize| -> Result<Val<'v>> {
            let v = arg(i)?;
            if v.kind() == Kind::Object { Ok(v) } else { Err(wrong(i, "an object", v)) }
        };
        let items =
            |i: usize| -> Result<Vec<Val<'v>>> { Ok(doc.items(list(i)?).into_iter().flatten().collect()) };
        // An optional whole, non-negative number argument.
        let count = |i: usize| -> Result<Option<usize>> {
            match values.get(i) {
                None => Ok(None),
                Some(_) => {
                    let n = number(i)?;
                    match n.as_i64() {
                        Some(n) if n >= 0 => Ok(Some(n as usize)),
                        _ => Err(EvalError::invalid_value(format!(
                            "{name}() takes a whole number of at least 0 as argument {}",
                            i + 1
                        ))),
                    }
                }
            }
        };
        let arena = self.arena;
        let text = |s: &str| -> Result<Val<'v>> { Ok(Val::String(arena.str(s)?)) };
        let native = program.natives.get(native as usize);
        let regex =
            || native.and_then(|n| n.regex.as_ref()).ok_or_else(|| EvalError::invalid_value("no pattern"));
        let zone = || native.and_then(|n| n.zone.clone()).unwrap_or(jiff::tz::TimeZone::UTC);

        Ok(match f {
            Function::Abs => match number(0)? {
                Number::Int(n) if n < 0 => Val::Number(negate(Number::Int(n))),
                Number::Float(x) => Val::Number(Number::Float(x.abs())),
                n => Val::Number(n),
            },
            Function::Avg => {
                let numbers = numbers(&items(0)?, name)?;
                if numbers.is_empty() {
                    Val::Null
                } else {
                    let sum: f64 = numbers.iter().map(|n| n.as_f64()).sum();
                    Val::Number(Number::Float(sum / numbers.len() as f64))
                }
            }
            Function::Ceil | Function::Floor => match number(0)? {
                Number::Float(x) => {
                    let r = if f == Function::Ceil { x.ceil() } else { x.floor() };
                    Val::Number(Number::Float(r))
                }
                n => Val::Number(n),
            },
            Function::Contains => {
                let needle = arg(1)?;
                match arg(0)? {
                    Val::String(s) => Val::Bool(matches!(needle, Val::String(n) if s.contains(n))),
                    v if v.kind() == Kind::Array => {
                        Val::Bool(doc.items(v).into_iter().flatten().any(|x| doc.equal(x, needle)))
                    }
                    v => return Err(wrong(0, "an array or a string", v)),
                }
            }
            Function::EndsWith => Val::Bool(string(0)?.ends_with(string(1)?)),
            Function::StartsWith => Val::Bool(string(0)?.starts_with(string(1)?)),
            Function::Join => {
                let glue = string(0)?;
                let mut out = String::new();
                for (n, item) in items(1)?.into_iter().enumerate() {
                    let Val::String(s) = item else { return Err(wrong(1, "an array of strings", item)) };
                    if n > 0 {
                        out.push_str(glue);
                    }
                    out.push_str(s);
                }
                text(&out)?
            }
            Function::Keys => {
                let v = object(0)?;
                self.list(doc.members(v).into_iter().flatten().map(|(k, _)| Val::String(k)))?
            }
            Function::Values => {
                let v = object(0)?;
                self.list(doc.members(v).into_iter().flatten().map(|(_, v)| v))?
            }
            Function::Length => match arg(0)? {
                Val::String(s) => Val::Number(Number::Int(s.chars().count() as i64)),
                v => match doc.len(v) {
                    Some(n) => Val::Number(Number::Int(n as i64)),
                    None => return Err(wrong(0, "a string, an array or an object", v)),
                },
            },
            Function::Map => {
                let body = expref(0)?;
                let elements = items(1)?;
                let mut out = arena.vec();
                for item in elements {
                    let v = self.eval(body, item)?;
                    arena.push(&mut out, v)?;
                }
                Val::List(out.into_bump_slice())
            }
            Function::Max | Function::Min => {
                let elements = items(0)?;
                let want = if f == Function::Max { Ordering::Greater } else { Ordering::Less };
                best(&elements, name, want)?
            }
            Function::MaxBy | Function::MinBy => {
                let elements = items(0)?;
                let body = expref(1)?;
                let keys = elements.iter().map(|&v| self.eval(body, v)).collect::<Result<Vec<_>>>()?;
                let want = if f == Function::MaxBy { Ordering::Greater } else { Ordering::Less };
                let mut pairs = keys.iter().copied().zip(elements.iter().copied());
                match pairs.next() {
                    None => Val::Null,
                    Some(first) => {
                        check_sortable(&keys, name)?;
                        let mut chosen = first;
                        for pair in pairs {
                            if order(pair.0, chosen.0) == want {
                                chosen = pair;
                            }
                        }
                        chosen.1
                    }
                }
            }
            Function::Merge => {
                let mut out: Vec<(&'v str, Val<'v>)> = Vec::new();
                for i in 0..values.len() {
                    let v = object(i)?;
                    for (k, value) in doc.members(v).into_iter().flatten() {
                        match out.iter_mut().find(|(name, _)| *name == k) {
                            Some(member) => member.1 = value,
                            None => out.push((k, value)),
                        }
                    }
                }
                Val::Object(arena.object(&out)?)
            }
            Function::NotNull => {
                let mut found = Val::Null;
                for i in 0..values.len() {
                    let v = arg(i)?;
                    if !v.is_null() {
                        found = v;
                        break;
                    }
                }
                found
            }
            Function::Reverse => match arg(0)? {
                Val::String(s) => text(&s.chars().rev().collect::<String>())?,
                v if v.kind() == Kind::Array => {
                    let mut elements: Vec<_> = doc.items(v).into_iter().flatten().collect();
                    elements.reverse();
                    self.list(elements)?
                }
                v => return Err(wrong(0, "an array or a string", v)),
            },
            Function::Sort => {
                let mut elements = items(0)?;
                check_sortable(&elements, name)?;
                elements.sort_by(|a, b| order(*a, *b));
                self.list(elements)?
            }
            Function::SortBy => {
                let elements = items(0)?;
                let body = expref(1)?;
                let keys = elements.iter().map(|&v| self.eval(body, v)).collect::<Result<Vec<_>>>()?;
                check_sortable(&keys, name)?;
                let mut pairs: Vec<_> = keys.into_iter().zip(elements).collect();
                pairs.sort_by(|a, b| order(a.0, b.0));
                self.list(pairs.into_iter().map(|(_, v)| v))?
            }
            Function::Sum => {
                let numbers = numbers(&items(0)?, name)?;
                let mut total = Number::Int(0);
                for n in numbers {
                    total = add(total, n);
                }
                Val::Number(total)
            }
            Function::ToArray => match arg(0)? {
                v if v.kind() == Kind::Array => v,
                v => self.list([v])?,
            },
            Function::ToNumber => match arg(0)? {
                v @ Val::Number(_) => v,
                Val::String(s) => parse_number(s).map_or(Val::Null, Val::Number),
                _ => Val::Null,
            },
            Function::ToString => match arg(0)? {
                v @ Val::String(_) => v,
                v => {
                    let mut out = Vec::new();
                    doc.write(&mut out, v);
                    text(std::str::from_utf8(&out).unwrap_or_default())?
                }
            },
            Function::Type => Val::String(arg(0)?.kind().name()),
            Function::Items => {
                let v = object(0)?;
                let mut out = arena.vec();
                for (k, value) in doc.members(v).into_iter().flatten() {
                    let pair = self.list([Val::String(k), value])?;
                    arena.push(&mut out, pair)?;
                }
                Val::List(out.into_bump_slice())
            }
            Function::FromItems => {
                let mut out: Vec<(&'v str, Val<'v>)> = Vec::new();
                for pair in items(0)? {
                    let parts: Vec<_> = doc.items(pair).into_iter().flatten().collect();
                    let [Val::String(k), value] = parts[..] else {
                        return Err(wrong(0, "an array of [name, value] pairs", pair));
                    };
                    match out.iter_mut().find(|(name, _)| *name == k) {
                        Some(member) => member.1 = value,
                        None => out.push((k, value)),
                    }
                }
                Val::Object(arena.object(&out)?)
            }
            Function::Zip => {
                let lists = (0..values.len()).map(items).collect::<Result<Vec<_>>>()?;
                let shortest = lists.iter().map(Vec::len).min().unwrap_or(0);
                let mut out = arena.vec();
                for i in 0..shortest {
                    let row = self.list(lists.iter().map(|l| l[i]))?;
                    arena.push(&mut out, row)?;
                }
                Val::List(out.into_bump_slice())
            }
            Function::GroupBy => {
                let elements = items(0)?;
                let body = expref(1)?;
                let mut groups: Vec<(&'v str, Vec<Val<'v>>)> = Vec::new();
                for item in elements {
                    let key = match self.eval(body, item)? {
                        Val::String(k) => k,
                        Val::Null => continue,
                        v => {
                            return Err(EvalError::invalid_type(format!(
                                "group_by() groups by strings, not {}",
                                v.kind().name()
                            )));
                        }
                    };
                    match groups.iter_mut().find(|(name, _)| *name == key) {
                        Some(group) => group.1.push(item),
                        None => groups.push((key, vec![item])),
                    }
                }
                let mut out = Vec::with_capacity(groups.len());
                for (key, members) in groups {
                    out.push((key, self.list(members)?));
                }
                Val::Object(arena.object(&out)?)
            }
            Function::Lower => text(&string(0)?.to_lowercase())?,
            Function::Upper => text(&string(0)?.to_uppercase())?,
            Function::Trim | Function::TrimLeft | Function::TrimRight => {
                let s = string(0)?;
                let chars = if values.len() > 1 { string(1)? } else { "" };
                let strip = |c: char| if chars.is_empty() { c.is_whitespace() } else { chars.contains(c) };
                Val::String(match f {
                    Function::Trim => s.trim_matches(strip),
                    Function::TrimLeft => s.trim_start_matches(strip),
                    _ => s.trim_end_matches(strip),
                })
            }
            Function::PadLeft | Function::PadRight => {
                let s = string(0)?;
                let width = match number(1)?.as_i64() {
                    Some(n) if n >= 0 => n as usize,
                    _ => {
                        return Err(EvalError::invalid_value(format!(
                            "{name}() takes a whole width of at least 0"
                        )));
                    }
                };
                let pad = if values.len() > 2 { string(2)? } else { " " };
                let mut pad_chars = pad.chars();
                let (Some(pad), None) = (pad_chars.next(), pad_chars.next()) else {
                    return Err(EvalError::invalid_value(format!("{name}() pads with one character")));
                };
                let len = s.chars().count();
                if len >= width {
                    Val::String(s)
                } else {
                    arena.charge(width.saturating_mul(4))?;
                    let padding: String = std::iter::repeat_n(pad, width - len).collect();
                    let out = if f == Function::PadLeft { padding + s } else { s.to_owned() + &padding };
                    text(&out)?
                }
            }
            Function::Replace => {
                let (s, old, new) = (string(0)?, string(1)?, string(2)?);
                let out = match count(3)? {
                    Some(n) => s.replacen(old, new, n),
                    None => s.replace(old, new),
                };
                text(&out)?
            }
            Function::Split => {
                let (s, separator) = (string(0)?, string(1)?);
                let limit = count(2)?;
                let mut parts: Vec<&'v str> = Vec::new();
                if separator.is_empty() {
                    let mut rest = s;
                    while let Some(c) = rest.chars().next() {
                        if limit.is_some_and(|n| parts.len() == n) {
                            break;
                        }
                        parts.push(&rest[..c.len_utf8()]);
                        rest = &rest[c.len_utf8()..];
                    }
                    if !rest.is_empty() {
                        parts.push(rest);
                    }
                } else {
                    match limit {
                        Some(n) => parts.extend(s.splitn(n + 1, separator)),
                        None => parts.extend(s.split(separator)),
                    }
                }
                self.list(parts.into_iter().map(Val::String))?
            }
            Function::FindFirst | Function::FindLast => {
                let (s, needle) = (string(0)?, string(1)?);
                let bound = |i: usize| -> Result<Option<i64>> {
                    if values.len() <= i {
                        return Ok(None);
                    }
                    number(i)?;
                    Ok(Some(0))
                };
                bound(2)?;
                bound(3)?;
                let whole = |i: usize| -> Result<Option<i64>> {
                    if values.len() <= i {
                        return Ok(None);
                    }
                    match number(i)?.as_i64() {
                        Some(n) => Ok(Some(n)),
                        None => {
                            Err(EvalError::invalid_value(format!("{name}() takes whole numbers as bounds")))
                        }
                    }
                };
                let chars: Vec<char> = s.chars().collect();
                let len = chars.len() as i64;
                let start = whole(2)?.unwrap_or(0).clamp(0, len) as usize;
                let end = whole(3)?.unwrap_or(len).clamp(0, len) as usize;
                let needle: Vec<char> = needle.chars().collect();
                if needle.is_empty() || start >= end || needle.len() > end - start {
                    Val::Null
                } else {
                    let mut at =
                        (start..=end - needle.len()).filter(|&i| chars[i..i + needle.len()] == needle[..]);
                    let found = if f == Function::FindFirst { at.next() } else { at.next_back() };
                    found.map_or(Val::Null, |i| Val::Number(Number::Int(i as i64)))
                }
            }
            Function::Round => {
                let n = number(0)?;
                let digits = match number(1)?.as_i64() {
                    Some(d @ 0..=15) => d as u32,
                    _ => return Err(EvalError::invalid_value("round() takes 0 to 15 digits")),
                };
                Val::Number(round(n, digits))
            }
            Function::DateFormat => {
                let time = match arg(0)? {
                    Val::Number(n) => timestamp_of_seconds(n)?,
                    Val::String(s) => s.parse::<jiff::Timestamp>().map_err(|e| {
                        EvalError::invalid_value(format!(
                            "date_format() takes RFC 3339 text or Unix seconds: {e}"
                        ))
                    })?,
                    v => return Err(wrong(0, "Unix seconds or RFC 3339 text", v)),
                };
                let format = string(1)?;
                let written = jiff::fmt::strtime::format(format.as_bytes(), &time.to_zoned(zone()))
                    .map_err(|e| EvalError::invalid_value(format!("date_format(): {e}")))?;
                text(&written)?
            }
            Function::DateParse => {
                let (input, format) = (string(0)?, string(1)?);
                let parsed = jiff::fmt::strtime::parse(format.as_bytes(), input.as_bytes())
                    .map_err(|e| EvalError::invalid_value(format!("date_parse(): {e}")))?;
                let time = match parsed.offset() {
                    Some(_) => parsed.to_timestamp(),
                    None => parsed.to_datetime().and_then(|at| at.to_zoned(zone())).map(|at| at.timestamp()),
                }
                .map_err(|e| EvalError::invalid_value(format!("date_parse(): {e}")))?;
                Val::Number(seconds_of(time))
            }
            Function::RegexMatch => Val::Bool(regex()?.is_match(string(0)?)),
            Function::RegexExtract => {
                let s = string(0)?;
                match regex()?.captures(s) {
                    None => Val::Null,
                    Some(found) => {
                        let group = if found.len() > 1 { found.get(1) } else { found.get(0) };
                        group.map_or(Val::Null, |m| Val::String(&s[m.range()]))
                    }
                }
            }
            Function::RegexReplace => {
                let (s, replacement) = (string(0)?, string(2)?);
                let replaced = regex()?.replace_all(s, replacement);
                text(&replaced)?
            }
        })
    }
}

fn numbers<'v>(items: &[Val<'v>], name: &str) -> Result<Vec<Number>> {
    items
        .iter()
        .map(|v| match v {
            Val::Number(n) => Ok(*n),
            v => Err(EvalError::invalid_type(format!(
                "{name}() takes an array of numbers, not one holding {}",
                v.kind().name()
            ))),
        })
        .collect()
}

/// Sums exactly while the integers allow.
fn add(a: Number, b: Number) -> Number {
    match (a.as_i64(), b.as_i64(), a, b) {
        (Some(x), Some(y), Number::Int(_) | Number::UInt(_), Number::Int(_) | Number::UInt(_)) => {
            x.checked_add(y).map_or(Number::Float(x as f64 + y as f64), Number::Int)
        }
        _ => Number::Float(a.as_f64() + b.as_f64()),
    }
}

/// All numbers or all strings, as sorting and `max`/`min` need.
fn check_sortable(values: &[Val<'_>], name: &str) -> Result<()> {
    let kind = values.first().map(Val::kind);
    match kind {
        None => Ok(()),
        Some(kind @ (Kind::Number | Kind::String)) if values.iter().all(|v| v.kind() == kind) => Ok(()),
        Some(_) => Err(EvalError::invalid_type(format!("{name}() takes only numbers or only strings"))),
    }
}

/// Numbers by value, strings by code point (the order of their UTF-8 bytes).
fn order(a: Val<'_>, b: Val<'_>) -> Ordering {
    match (a, b) {
        (Val::Number(x), Val::Number(y)) => x.compare(y).unwrap_or(Ordering::Equal),
        (Val::String(x), Val::String(y)) => x.cmp(y),
        _ => Ordering::Equal,
    }
}

fn best<'v>(items: &[Val<'v>], name: &str, want: Ordering) -> Result<Val<'v>> {
    check_sortable(items, name)?;
    let mut chosen: Option<Val<'v>> = None;
    for &item in items {
        if chosen.is_none_or(|c| order(item, c) == want) {
            chosen = Some(item);
        }
    }
    Ok(chosen.unwrap_or(Val::Null))
}

/// `n` rounded half away from zero to `digits` decimals of its shortest decimal text, so that
/// `2.345` (binary 2.34499…) rounds to 2.35 as written. Integers are already round.
fn round(n: Number, digits: u32) -> Number {
    let Number::Float(f) = n else { return n };
    if !f.is_finite() {
        return n;
    }
    // `d.ddde±x`: the digits, and the power of ten of the first one.
    let text = format!("{:e}", f.abs());
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let Ok(exponent) = exponent.parse::<i64>() else { return n };
    // From 10^16 up a double has no decimals to round.
    if exponent >= 16 {
        return n;
    }
    let all: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).map(|b| b - b'0').collect();
    // Digits kept: those down to 10^-digits.
    let keep = exponent + 1 + i64::from(digits);
    if keep < 0 {
        return Number::Float(0.0);
    }
    let keep = keep as usize;
    let mut kept: Vec<u8> = all.iter().copied().take(keep).collect();
    kept.resize(keep, 0);
    let up = all.get(keep).is_some_and(|&d| d >= 5);
    let mut value: u128 =
        kept.iter().fold(0u128, |acc, &d| acc.saturating_mul(10).saturating_add(u128::from(d)));
    if up {
        value = value.saturating_add(1);
    }
    let sign = if f < 0.0 { "-" } else { "" };
    format!("{sign}{value}e-{digits}").parse::<f64>().map_or(n, Number::Float)
}

fn timestamp_of_seconds(n: Number) -> Result<jiff::Timestamp> {
    let nanos = match n {
        Number::Float(f) => (f * 1e9).round() as i128,
        n => i128::from(n.as_i64().unwrap_or(i64::MAX)) * 1_000_000_000,
    };
    jiff::Timestamp::from_nanosecond(nanos)
        .map_err(|e| EvalError::invalid_value(format!("date_format(): {e}")))
}

/// Unix seconds: an integer when the time has no fraction of a second.
fn seconds_of(time: jiff::Timestamp) -> Number {
    match time.subsec_nanosecond() {
        0 => Number::Int(time.as_second()),
        nanos => Number::Float(time.as_second() as f64 + f64::from(nanos) / 1e9),
    }
}

/// A JSON number's text as a number; anything else is `None`.
pub(crate) fn parse_number(s: &str) -> Option<Number> {
    let bytes = s.as_bytes();
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    let valid = !digits.is_empty()
        && digits[0].is_ascii_digit()
        && !(digits.len() > 1 && digits[0] == b'0' && digits[1].is_ascii_digit())
        && bytes.iter().all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'));
    if !valid {
        return None;
    }
    if let Ok(n) = s.parse::<i64>() {
        return Some(Number::Int(n));
    }
    if let Ok(n) = s.parse::<u64>() {
        return Some(Number::UInt(n));
    }
    s.parse::<f64>().ok().filter(|f| f.is_finite()).map(Number::Float)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_original_functions_are_the_first_26() {
        let original: Vec<&str> = TABLE[..ORIGINAL].iter().map(|(name, ..)| *name).collect();
        assert_eq!(original.first(), Some(&"abs"));
        assert_eq!(original.last(), Some(&"values"));
        assert!(!Function::Items.in_original_language());
        assert!(Function::Values.in_original_language());
    }
}
