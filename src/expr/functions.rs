//! The functions an expression can call: JMESPath's 26, the Community Edition's string, object and
//! grouping functions, and recast's own (rounding, dates, patterns: SPEC §1.8). Names and numbers
//! of arguments are checked when compiling ([`lookup`]), and so are the literal arguments of
//! recast's own functions; argument types when running, as the specification says.

use std::cmp::Ordering;

use std::collections::HashMap;

use super::eval::{EvalError, Evaluator, Result, negate};
use super::value::{
    Arena, Doc, INDEXED, Kind, Number, ObjectBuilder, Val, cost, steps_of_bytes, steps_of_writing,
};
use super::{Pattern, Range, Step, StepId};

/// Steps of each match `regex_replace` finds, with its groups, beside the text it reads.
const MATCH_STEPS: u64 = 8;

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

/// The known function whose name is closest to `name`, when one is close enough to be meant.
pub fn closest(name: &str) -> Option<&'static str> {
    crate::suggest::closest(name, TABLE.iter().map(|(n, ..)| *n))
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
        self.arena.step(cost::CALL)?;
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
        let arena = self.arena;
        let items = |i: usize| -> Result<Vec<Val<'v>>> {
            let v = list(i)?;
            arena.step(doc.len(v).unwrap_or(0) as u64)?;
            Ok(doc.items(v).into_iter().flatten().collect())
        };
        // An optional whole, non-negative number argument.
        let count = |i: usize| -> Result<Option<usize>> {
            match values.get(i) {
                None => Ok(None),
                Some(_) => {
                    let n = number(i)?;
                    match n.as_i64() {
                        Some(n) if n >= 0 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
                        _ => Err(EvalError::invalid_value(format!(
                            "{name}() takes a whole number of at least 0 as argument {}",
                            i + 1
                        ))),
                    }
                }
            }
        };
        // Text charged as it is copied in: for text no longer than a few times one input.
        let text = |s: &str| -> Result<Val<'v>> { Ok(Val::String(arena.str(s)?)) };
        // Text whose length was charged before it was made.
        let made = |s: &str| -> Val<'v> { Val::String(arena.charged_str(s)) };
        let native = program.natives.get(native as usize);
        let regex =
            || native.and_then(|n| n.regex.as_ref()).ok_or_else(|| EvalError::invalid_value("no pattern"));
        // A search reads its text, at the pattern's cost per byte (`Pattern::weight`).
        let regex_steps =
            |pattern: &Pattern, text: &str| steps_of_bytes(text.len()).saturating_mul(pattern.weight);
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
                    Val::String(s) => {
                        arena.step(steps_of_bytes(s.len()))?;
                        Val::Bool(matches!(needle, Val::String(n) if s.contains(n)))
                    }
                    v if v.kind() == Kind::Array => {
                        let mut found = false;
                        for x in doc.items(v).into_iter().flatten() {
                            if doc.equal(x, needle, arena.budget())? {
                                found = true;
                                break;
                            }
                        }
                        Val::Bool(found)
                    }
                    v => return Err(wrong(0, "an array or a string", v)),
                }
            }
            Function::EndsWith | Function::StartsWith => {
                let (s, affix) = (string(0)?, string(1)?);
                arena.step(steps_of_bytes(affix.len()))?;
                Val::Bool(if f == Function::EndsWith { s.ends_with(affix) } else { s.starts_with(affix) })
            }
            Function::Join => {
                let glue = string(0)?;
                let parts = items(1)?;
                let mut len: u64 = 0;
                for (n, item) in parts.iter().enumerate() {
                    let Val::String(s) = *item else { return Err(wrong(1, "an array of strings", *item)) };
                    len = len.saturating_add(s.len() as u64 + if n > 0 { glue.len() as u64 } else { 0 });
                }
                arena.charge(len)?;
                arena.step(steps_of_bytes(len as usize))?;
                let mut out = String::with_capacity(len as usize);
                for (n, item) in parts.iter().enumerate() {
                    if n > 0 {
                        out.push_str(glue);
                    }
                    if let Val::String(s) = item {
                        out.push_str(s);
                    }
                }
                made(&out)
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
                Val::String(s) => {
                    arena.step(steps_of_bytes(s.len()))?;
                    Val::Number(Number::Int(s.chars().count() as i64))
                }
                v => match doc.len(v) {
                    Some(n) => Val::Number(Number::Int(n as i64)),
                    None => return Err(wrong(0, "a string, an array or an object", v)),
                },
            },
            Function::Map => {
                let body = expref(0)?;
                let elements = items(1)?;
                let mut out = arena.list();
                for item in elements {
                    let v = self.eval(body, item)?;
                    arena.push(doc, &mut out, v)?;
                }
                arena.finish(out)
            }
            Function::Max | Function::Min => {
                let elements = items(0)?;
                arena.step(order_steps(&elements, false))?;
                let want = if f == Function::Max { Ordering::Greater } else { Ordering::Less };
                best(&elements, name, want)?
            }
            Function::MaxBy | Function::MinBy => {
                let elements = items(0)?;
                let body = expref(1)?;
                let keys = elements.iter().map(|&v| self.eval(body, v)).collect::<Result<Vec<_>>>()?;
                arena.step(order_steps(&keys, false))?;
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
                let mut out = arena.object();
                let mut names = Names::default();
                for i in 0..values.len() {
                    let v = object(i)?;
                    for (k, value) in doc.members(v).into_iter().flatten() {
                        arena.step(steps_of_bytes(k.len()))?;
                        names.set(arena, doc, &mut out, k, value)?;
                    }
                }
                arena.finish_object(out)
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
                Val::String(s) => {
                    arena.step(steps_of_bytes(s.len()))?;
                    arena.charge(s.len() as u64)?;
                    made(&s.chars().rev().collect::<String>())
                }
                v if v.kind() == Kind::Array => {
                    let mut elements = items(0)?;
                    elements.reverse();
                    self.list(elements)?
                }
                v => return Err(wrong(0, "an array or a string", v)),
            },
            Function::Sort => {
                let mut elements = items(0)?;
                check_sortable(&elements, name)?;
                arena.step(order_steps(&elements, true))?;
                elements.sort_by(|a, b| order(*a, *b));
                self.list(elements)?
            }
            Function::SortBy => {
                let elements = items(0)?;
                let body = expref(1)?;
                let keys = elements.iter().map(|&v| self.eval(body, v)).collect::<Result<Vec<_>>>()?;
                check_sortable(&keys, name)?;
                arena.step(order_steps(&keys, true))?;
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
                Val::String(s) => {
                    arena.step(steps_of_bytes(s.len()))?;
                    parse_number(s).map_or(Val::Null, Val::Number)
                }
                _ => Val::Null,
            },
            Function::ToString => match arg(0)? {
                v @ Val::String(_) => v,
                v => {
                    let size = arena.size(doc, v)?;
                    arena.charge(size)?;
                    arena.step(steps_of_writing(size))?;
                    let mut out = Vec::with_capacity(size as usize);
                    doc.write(&mut out, v);
                    // Strings that need escapes are longer written than measured.
                    arena.charge((out.len() as u64).saturating_sub(size))?;
                    made(std::str::from_utf8(&out).unwrap_or_default())
                }
            },
            Function::Type => Val::String(arg(0)?.kind().name()),
            Function::Items => {
                let v = object(0)?;
                let mut out = arena.list();
                for (k, value) in doc.members(v).into_iter().flatten() {
                    let pair = self.list([Val::String(k), value])?;
                    arena.push(doc, &mut out, pair)?;
                }
                arena.finish(out)
            }
            Function::FromItems => {
                let mut out = arena.object();
                let mut names = Names::default();
                for pair in items(0)? {
                    let mut parts = doc.items(pair).into_iter().flatten();
                    let (Some(Val::String(k)), Some(value), None) =
                        (parts.next(), parts.next(), parts.next())
                    else {
                        return Err(wrong(0, "an array of [name, value] pairs", pair));
                    };
                    arena.step(steps_of_bytes(k.len()))?;
                    names.set(arena, doc, &mut out, k, value)?;
                }
                arena.finish_object(out)
            }
            Function::Zip => {
                let lists = (0..values.len()).map(items).collect::<Result<Vec<_>>>()?;
                let shortest = lists.iter().map(Vec::len).min().unwrap_or(0);
                let mut out = arena.list();
                for i in 0..shortest {
                    let row = self.list(lists.iter().map(|l| l[i]))?;
                    arena.push(doc, &mut out, row)?;
                }
                arena.finish(out)
            }
            Function::GroupBy => {
                let elements = items(0)?;
                let body = expref(1)?;
                let mut groups: Vec<(&'v str, Vec<Val<'v>>)> = Vec::new();
                let mut index: HashMap<&'v str, usize> = HashMap::new();
                for item in elements {
                    let key = match self.eval(body, item)? {
                        Val::String(k) => k,
                        Val::Null => {
                            arena.left_out();
                            continue;
                        }
                        v => {
                            return Err(EvalError::invalid_type(format!(
                                "group_by() groups by strings, not {}",
                                v.kind().name()
                            )));
                        }
                    };
                    arena.step(steps_of_bytes(key.len()).saturating_add(cost::MEMBER))?;
                    match index.get(key) {
                        Some(&at) => groups[at].1.push(item),
                        None => {
                            index.insert(key, groups.len());
                            groups.push((key, vec![item]));
                        }
                    }
                }
                let mut out = arena.object();
                for (key, members) in groups {
                    let list = self.list(members)?;
                    arena.insert(doc, &mut out, key, list)?;
                }
                arena.finish_object(out)
            }
            Function::Lower | Function::Upper => {
                let s = string(0)?;
                arena.step(steps_of_bytes(s.len()))?;
                arena.charge(s.len() as u64)?;
                let changed = if f == Function::Lower { s.to_lowercase() } else { s.to_uppercase() };
                // Case mapping may lengthen text (at most three times): the rest is charged now.
                arena.charge((changed.len() as u64).saturating_sub(s.len() as u64))?;
                made(&changed)
            }
            Function::Trim | Function::TrimLeft | Function::TrimRight => {
                let s = string(0)?;
                let chars = if values.len() > 1 { string(1)? } else { "" };
                // Characters to strip are looked up in a table when they are ASCII, else in
                // order. Stripping is done a character at a time: about eight times slower than a
                // plain scan, more for a set looked up in order.
                let ascii = chars.is_ascii();
                let per_byte = if chars.is_empty() || ascii { 8 } else { 16 };
                arena.step(
                    steps_of_bytes(s.len())
                        .saturating_mul(per_byte)
                        .saturating_add(steps_of_bytes(chars.len())),
                )?;
                let mut table = [false; 128];
                let mut set: Vec<char> = Vec::new();
                if ascii {
                    for b in chars.bytes() {
                        table[usize::from(b)] = true;
                    }
                } else {
                    arena.charge((chars.len() * std::mem::size_of::<char>()) as u64)?;
                    set = chars.chars().collect();
                    set.sort_unstable();
                    set.dedup();
                }
                let strip = |c: char| {
                    if chars.is_empty() {
                        c.is_whitespace()
                    } else if ascii {
                        c.is_ascii() && table[c as usize]
                    } else {
                        set.binary_search(&c).is_ok()
                    }
                };
                Val::String(match f {
                    Function::Trim => s.trim_matches(strip),
                    Function::TrimLeft => s.trim_start_matches(strip),
                    _ => s.trim_end_matches(strip),
                })
            }
            Function::PadLeft | Function::PadRight => {
                let s = string(0)?;
                let width = match number(1)?.as_i64() {
                    Some(n) if n >= 0 => u64::try_from(n).unwrap_or(u64::MAX),
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
                arena.step(steps_of_bytes(s.len()))?;
                let len = s.chars().count() as u64;
                if len >= width {
                    Val::String(s)
                } else {
                    let added = (width - len).saturating_mul(pad.len_utf8() as u64);
                    arena.charge(added.saturating_add(s.len() as u64))?;
                    arena.step(steps_of_bytes(added as usize))?;
                    let mut out = String::with_capacity((added as usize).saturating_add(s.len()));
                    if f == Function::PadRight {
                        out.push_str(s);
                    }
                    out.extend(std::iter::repeat_n(pad, (width - len) as usize));
                    if f == Function::PadLeft {
                        out.push_str(s);
                    }
                    made(&out)
                }
            }
            Function::Replace => {
                let (s, old, new) = (string(0)?, string(1)?, string(2)?);
                let limit = count(3)?;
                // Searching reads the text and `old` (the searcher is made from it).
                arena.step(steps_of_bytes(s.len()).saturating_add(steps_of_bytes(old.len())))?;
                if old.len() > s.len() {
                    return Ok(Val::String(s));
                }
                // Counted first, so that the text is charged before it is made: `old` empty is
                // found between every two characters and at both ends.
                let times = s.matches(old).count().min(limit.unwrap_or(usize::MAX)) as u64;
                let len = (s.len() as u64 - times * old.len() as u64)
                    .saturating_add(times.saturating_mul(new.len() as u64));
                arena.charge(len)?;
                arena.step(steps_of_bytes(len as usize))?;
                let out = match limit {
                    Some(n) => s.replacen(old, new, n),
                    None => s.replace(old, new),
                };
                made(&out)
            }
            Function::Split => {
                let (s, separator) = (string(0)?, string(1)?);
                let limit = count(2)?;
                arena.step(steps_of_bytes(s.len()).saturating_add(steps_of_bytes(separator.len())))?;
                let mut out = arena.list();
                if separator.is_empty() {
                    let mut rest = s;
                    while let Some(c) = rest.chars().next() {
                        if limit.is_some_and(|n| out.len() == n) {
                            break;
                        }
                        arena.push(doc, &mut out, Val::String(&rest[..c.len_utf8()]))?;
                        rest = &rest[c.len_utf8()..];
                    }
                    if !rest.is_empty() {
                        arena.push(doc, &mut out, Val::String(rest))?;
                    }
                } else {
                    for (split, part) in s.split(separator).enumerate() {
                        if limit.is_some_and(|n| split == n) {
                            // The rest, from this part on, unsplit.
                            let from = part.as_ptr() as usize - s.as_ptr() as usize;
                            arena.push(doc, &mut out, Val::String(&s[from..]))?;
                            break;
                        }
                        arena.push(doc, &mut out, Val::String(part))?;
                    }
                }
                arena.finish(out)
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
                arena.step(steps_of_bytes(s.len()).saturating_add(steps_of_bytes(needle.len())))?;
                let len = s.chars().count();
                // The bounds are those of the slice `[start:end]` (JEP-14): negative ones count
                // from the end, and both are clamped to the text.
                let clamp = |n: i64| {
                    let n = if n < 0 { n.saturating_add(len as i64) } else { n };
                    n.clamp(0, len as i64) as usize
                };
                let start = whole(2)?.map_or(0, clamp);
                let end = whole(3)?.map_or(len, clamp);
                if needle.is_empty() || start >= end {
                    Val::Null
                } else {
                    let byte = |chars: usize| s.char_indices().nth(chars).map_or(s.len(), |(at, _)| at);
                    let (from, to) = (byte(start), byte(end));
                    let window = &s[from..to];
                    let found =
                        if f == Function::FindFirst { window.find(needle) } else { window.rfind(needle) };
                    found.map_or(Val::Null, |at| {
                        Val::Number(Number::Int((start + window[..at].chars().count()) as i64))
                    })
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
                // The format is a literal: what it writes is a few times its length at most.
                let written = jiff::fmt::strtime::format(format.as_bytes(), &time.to_zoned(zone()))
                    .map_err(|e| EvalError::invalid_value(format!("date_format(): {e}")))?;
                text(&written)?
            }
            Function::DateParse => {
                let (input, format) = (string(0)?, string(1)?);
                arena.step(steps_of_bytes(input.len()))?;
                let parsed = jiff::fmt::strtime::parse(format.as_bytes(), input.as_bytes())
                    .map_err(|e| EvalError::invalid_value(format!("date_parse(): {e}")))?;
                let time = match parsed.offset() {
                    Some(_) => parsed.to_timestamp(),
                    None => parsed.to_datetime().and_then(|at| at.to_zoned(zone())).map(|at| at.timestamp()),
                }
                .map_err(|e| EvalError::invalid_value(format!("date_parse(): {e}")))?;
                Val::Number(seconds_of(time))
            }
            Function::RegexMatch => {
                let (s, pattern) = (string(0)?, regex()?);
                arena.step(regex_steps(pattern, s))?;
                Val::Bool(pattern.regex.is_match(s))
            }
            Function::RegexExtract => {
                let (s, pattern) = (string(0)?, regex()?);
                // Found, then read again for its groups.
                arena.step(regex_steps(pattern, s).saturating_mul(2))?;
                match pattern.regex.captures(s) {
                    None => Val::Null,
                    Some(found) => {
                        let group = if found.len() > 1 { found.get(1) } else { found.get(0) };
                        group.map_or(Val::Null, |m| Val::String(&s[m.range()]))
                    }
                }
            }
            Function::RegexReplace => {
                let (s, replacement, pattern) = (string(0)?, string(2)?, regex()?);
                arena.step(
                    regex_steps(pattern, s)
                        .saturating_mul(2)
                        .saturating_add(steps_of_bytes(replacement.len())),
                )?;
                let template = Template::read(replacement);
                let mut out = String::new();
                let mut last = 0;
                for found in pattern.regex.captures_iter(s) {
                    let Some(whole) = found.get(0) else { continue };
                    // The next search is paid for before it is made: a pattern that can match
                    // text of any length may read to the end of the text each time.
                    if pattern.unbounded {
                        arena.step(regex_steps(pattern, &s[whole.end()..]))?;
                    }
                    // Each replacement is charged before it is written: a short text with many
                    // matches and a long replacement makes a long answer.
                    let len = template.len(&found);
                    arena.charge((whole.start() - last) as u64 + len)?;
                    // A match found with its groups costs a few hundred nanoseconds.
                    arena.step(MATCH_STEPS + template.pieces.len() as u64 + steps_of_bytes(len as usize))?;
                    out.push_str(&s[last..whole.start()]);
                    template.write(&found, &mut out);
                    last = whole.end();
                }
                arena.charge((s.len() - last) as u64)?;
                out.push_str(&s[last..]);
                made(&out)
            }
        })
    }
}

/// Where each name of an object being built is: searched member by member while the object has
/// up to [`INDEXED`] members, through a hash of the names beyond (`merge`, `from_items`).
#[derive(Default)]
struct Names<'v> {
    hashed: Option<HashMap<&'v str, usize>>,
}

impl<'v> Names<'v> {
    /// Sets member `name` of `object` to `value`: replaced in place when it is there, added last
    /// when it is not.
    fn set(
        &mut self,
        arena: &Arena<'v>,
        doc: Doc<'v>,
        object: &mut ObjectBuilder<'v>,
        name: &'v str,
        value: Val<'v>,
    ) -> Result<()> {
        let members = object.members();
        arena.step(cost::MEMBER)?;
        let found = match &self.hashed {
            Some(hashed) => hashed.get(name).copied(),
            None => {
                // A step per member searched: a search this way of a large object would cost
                // its size squared.
                arena.step(members.len() as u64)?;
                members.iter().position(|(k, _)| *k == name)
            }
        };
        match found {
            Some(at) => arena.replace(doc, object, at, value)?,
            None => {
                let at = members.len();
                arena.insert(doc, object, name, value)?;
                match &mut self.hashed {
                    Some(hashed) => {
                        hashed.insert(name, at);
                    }
                    None if at >= INDEXED => {
                        let members = object.members();
                        self.hashed = Some(members.iter().enumerate().map(|(i, (k, _))| (*k, i)).collect());
                    }
                    None => {}
                }
            }
        }
        Ok(())
    }
}

/// Steps of picking from (`sorting`: of sorting) `values`: a step per value and per 64 bytes of
/// text each may compare, for every round of comparisons (one to pick, about log₂ n to sort).
fn order_steps(values: &[Val<'_>], sorting: bool) -> u64 {
    let n = values.len() as u64;
    let text: u64 = values.iter().map(|v| if let Val::String(s) = v { s.len() as u64 / 64 } else { 0 }).sum();
    let rounds = if sorting { u64::from(64 - n.leading_zeros()).max(1) } else { 1 };
    n.saturating_add(text).saturating_mul(rounds)
}

/// A replacement of `regex_replace` read once per call: text and references to groups (`$1`,
/// `$name`, `${name}`; `$$` is a `$`), as the pattern library reads it, so that what each match
/// writes is measured before it is written.
struct Template<'r> {
    pieces: Vec<Piece<'r>>,
}

enum Piece<'r> {
    Text(&'r str),
    Number(usize),
    Name(&'r str),
}

impl<'r> Template<'r> {
    fn read(mut rest: &'r str) -> Template<'r> {
        let mut pieces = Vec::new();
        let group = |name: &'r str| match name.parse::<usize>() {
            Ok(n) => Piece::Number(n),
            Err(_) => Piece::Name(name),
        };
        while let Some(at) = rest.find('$') {
            if at > 0 {
                pieces.push(Piece::Text(&rest[..at]));
            }
            rest = &rest[at..];
            let bytes = rest.as_bytes();
            if bytes.get(1) == Some(&b'$') {
                pieces.push(Piece::Text("$"));
                rest = &rest[2..];
                continue;
            }
            if bytes.get(1) == Some(&b'{') {
                if let Some(close) = rest[2..].find('}') {
                    pieces.push(group(&rest[2..2 + close]));
                    rest = &rest[2 + close + 1..];
                    continue;
                }
            } else {
                let end =
                    1 + bytes[1..].iter().take_while(|b| b.is_ascii_alphanumeric() || **b == b'_').count();
                if end > 1 {
                    pieces.push(group(&rest[1..end]));
                    rest = &rest[end..];
                    continue;
                }
            }
            // A `$` that starts no reference is itself.
            pieces.push(Piece::Text("$"));
            rest = &rest[1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest));
        }
        Template { pieces }
    }

    fn group<'h>(piece: &Piece<'_>, found: &regex::Captures<'h>) -> &'h str {
        let m = match piece {
            Piece::Number(n) => found.get(*n),
            Piece::Name(name) => found.name(name),
            Piece::Text(_) => None,
        };
        m.map_or("", |m| m.as_str())
    }

    /// Bytes the replacement of `found` takes.
    fn len(&self, found: &regex::Captures<'_>) -> u64 {
        self.pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => text.len() as u64,
                group => Template::group(group, found).len() as u64,
            })
            .sum()
    }

    fn write(&self, found: &regex::Captures<'_>, out: &mut String) {
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => out.push_str(text),
                group => out.push_str(Template::group(group, found)),
            }
        }
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

/// Whether `s` is a number by JSON's grammar (RFC 8259 §6): `-? (0 | [1-9][0-9]*) (. [0-9]+)?
/// ([eE] [+-]? [0-9]+)?`, and nothing else (no `1.`, `.5`, `+1` or spaces).
fn is_json_number(s: &str) -> bool {
    let mut bytes = s.as_bytes();
    let digits = |bytes: &mut &[u8]| {
        let n = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
        *bytes = &bytes[n..];
        n
    };
    if let [b'-', rest @ ..] = bytes {
        bytes = rest;
    }
    match bytes {
        [b'0', rest @ ..] => bytes = rest,
        [b'1'..=b'9', ..] => {
            digits(&mut bytes);
        }
        _ => return false,
    }
    if let [b'.', rest @ ..] = bytes {
        bytes = rest;
        if digits(&mut bytes) == 0 {
            return false;
        }
    }
    if let [b'e' | b'E', rest @ ..] = bytes {
        bytes = rest;
        if let [b'+' | b'-', rest @ ..] = bytes {
            bytes = rest;
        }
        if digits(&mut bytes) == 0 {
            return false;
        }
    }
    bytes.is_empty()
}

/// A JSON number's text as a number (`to_number`: "any string that conforms to the json-number
/// production"); anything else, and a number beyond a double's range, is `None`.
pub(crate) fn parse_number(s: &str) -> Option<Number> {
    if !is_json_number(s) {
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
