//! A routes file's text (YAML 1.2, of which JSON is a part) read into a JSON value, with the
//! line and column where each of its values begins, by JSON pointer.
//!
//! Plain scalars are typed as YAML 1.2's core schema says (`null`, `~`, `true`, `false`,
//! integers, floats); quoted ones are strings. Anchors and aliases are taken, each alias
//! counted against [`MOST_NODES`] as the values it copies (so that a few lines cannot expand
//! into billions of values). A mapping key given twice, a key that is not a scalar, a float
//! that JSON cannot write (`.inf`, `.nan`) and a second document are problems at their place.

use std::collections::{HashMap, HashSet};

use serde_json::{Number, Value};
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::json::ordered::Ordered;
use crate::json::push_pointer;

/// Where a value begins in the file: line and column, both from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct At {
    pub line: usize,
    pub column: usize,
}

impl At {
    fn of(mark: &Marker) -> At {
        At { line: mark.line(), column: mark.col() + 1 }
    }
}

/// The place of every value of the file, by JSON pointer.
#[derive(Debug, Default)]
pub struct Places(HashMap<String, At>, bool);

impl Places {
    /// Where `pointer` is, or the nearest value above it that is in the file (a member that is
    /// missing is told where its object begins).
    pub fn find(&self, pointer: &str) -> At {
        let mut pointer = pointer;
        loop {
            if let Some(at) = self.0.get(pointer) {
                return *at;
            }
            match pointer.rfind('/') {
                Some(cut) => pointer = &pointer[..cut],
                None => return At { line: 1, column: 1 },
            }
        }
    }
}

/// Most values (aliases' copies counted) one file may hold.
pub const MOST_NODES: usize = 4_000_000;

/// Most bytes of text (member names and strings, aliases' copies counted) one file may hold: an
/// alias of a long string copies it whole.
pub const MOST_BYTES: usize = 256 << 20;

/// Deepest a file may nest (a registration nests no deeper than 127 levels below a route).
pub const MOST_LEVELS: usize = 160;

/// Why the text is not a file: where, and what.
#[derive(Debug)]
pub struct SyntaxError {
    pub at: At,
    pub message: String,
}

/// A container being read.
enum Open {
    List {
        pointer: String,
        items: Vec<Ordered>,
        anchor: usize,
    },
    Map {
        pointer: String,
        members: Vec<(String, Ordered)>,
        names: HashSet<String>,
        key: Option<String>,
        anchor: usize,
    },
}

/// Reads `text` into a value and the places of its values.
pub fn parse(text: &str) -> Result<(Ordered, Places), SyntaxError> {
    parse_with(text, true)
}

/// Reads `text` into a value, noting no place: a file read without problems needs none (and a
/// file of ten thousand routes holds some four hundred thousand values). Its error, if any, is
/// [`parse`]'s.
pub fn parse_unplaced(text: &str) -> Result<Ordered, SyntaxError> {
    match parse_with(text, false) {
        Ok((value, _)) => Ok(value),
        Err(_) => parse(text).map(|(value, _)| value),
    }
}

fn parse_with(text: &str, noting: bool) -> Result<(Ordered, Places), SyntaxError> {
    let mut parser = Parser::new_from_str(text);
    let mut places = Places(HashMap::new(), noting);
    let mut anchors: HashMap<usize, (Ordered, Size)> = HashMap::new();
    let mut stack: Vec<Open> = Vec::new();
    let mut root: Option<Ordered> = None;
    let (mut nodes, mut bytes) = (0usize, 0usize);
    let mut documents = 0;
    loop {
        let (event, mark) = parser
            .next_token()
            .map_err(|e| SyntaxError { at: At::of(e.marker()), message: e.info().to_owned() })?;
        let at = At::of(&mark);
        // A value read whole (a scalar, an alias, or a container that ended): where it goes.
        let value = match event {
            Event::StreamEnd => break,
            Event::DocumentStart => {
                documents += 1;
                if documents > 1 {
                    return Err(SyntaxError { at, message: "a routes file holds one document".to_owned() });
                }
                continue;
            }
            Event::StreamStart | Event::DocumentEnd | Event::Nothing => continue,
            Event::Alias(id) => {
                let Some((value, size)) = anchors.get(&id) else {
                    return Err(SyntaxError { at, message: "an alias of no anchor".to_owned() });
                };
                nodes += size.nodes;
                bytes += size.bytes;
                if nodes > MOST_NODES || bytes > MOST_BYTES {
                    return Err(SyntaxError {
                        at,
                        message: format!(
                            "the file expands into more than {MOST_NODES} values or {MOST_BYTES} bytes of text"
                        ),
                    });
                }
                (value.clone(), 0, size.nodes)
            }
            Event::Scalar(text, style, anchor, tag) => {
                nodes += 1;
                bytes += text.len();
                let value = match &tag {
                    Some(tag) if tag.suffix == "str" => Ordered::text(text),
                    _ if style == TScalarStyle::Plain => {
                        Ordered::Scalar(typed(&text).map_err(|message| SyntaxError { at, message })?)
                    }
                    _ => Ordered::text(text),
                };
                (value, anchor, 1)
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                nodes += 1;
                if stack.len() >= MOST_LEVELS {
                    return Err(SyntaxError {
                        at,
                        message: format!("the file nests deeper than {MOST_LEVELS} levels"),
                    });
                }
                let pointer = place(&mut stack, &mut places, at)?;
                stack.push(match event {
                    Event::SequenceStart(..) => Open::List { pointer, items: Vec::new(), anchor },
                    _ => Open::Map { pointer, members: Vec::new(), names: HashSet::new(), key: None, anchor },
                });
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => match stack.pop() {
                Some(Open::List { items, anchor, .. }) => (Ordered::List(items), anchor, 0),
                Some(Open::Map { members, anchor, .. }) => (Ordered::Object(members), anchor, 0),
                None => continue,
            },
        };
        let (value, anchor, count) = value;
        if nodes > MOST_NODES || bytes > MOST_BYTES {
            return Err(SyntaxError {
                at,
                message: format!(
                    "the file holds more than {MOST_NODES} values or {MOST_BYTES} bytes of text"
                ),
            });
        }
        if anchor > 0 {
            anchors.insert(anchor, (value.clone(), size(&value)));
        }
        // A container that ended has its place already; a scalar takes it now.
        let ended = count == 0;
        if !ended {
            place(&mut stack, &mut places, at)?;
        }
        match stack.last_mut() {
            None => root = Some(value),
            Some(Open::List { items, .. }) => items.push(value),
            Some(Open::Map { members, names, key, pointer, .. }) => match key.take() {
                Some(name) => members.push((name, value)),
                None => {
                    let Some(name) = to_key(value) else {
                        return Err(SyntaxError { at, message: "a mapping key must be a scalar".to_owned() });
                    };
                    // A block mapping is marked where its first key ends: it begins at that key.
                    if members.is_empty()
                        && let Some(begins) = places.0.get_mut(pointer.as_str())
                    {
                        *begins = (*begins).min(at);
                    }
                    if !names.insert(name.clone()) {
                        let mut at_key = pointer.clone();
                        push_pointer(&mut at_key, &name);
                        return Err(SyntaxError {
                            at,
                            message: format!("`{name}` is given twice ({at_key})"),
                        });
                    }
                    *key = Some(name);
                }
            },
        }
    }
    Ok((root.unwrap_or(Ordered::Scalar(Value::Null)), places))
}

/// The pointer of the value that begins at `at` in the innermost open container, noted in
/// `places`; a mapping's key is no value of its own and gets none.
fn place(stack: &mut [Open], places: &mut Places, at: At) -> Result<String, SyntaxError> {
    if !places.1 {
        return Ok(String::new());
    }
    let pointer = match stack.last() {
        None => String::new(),
        Some(Open::List { pointer, items, .. }) => format!("{pointer}/{}", items.len()),
        Some(Open::Map { pointer, key: Some(name), .. }) => {
            let mut pointer = pointer.clone();
            push_pointer(&mut pointer, name);
            pointer
        }
        Some(Open::Map { key: None, .. }) => {
            // A key: containers as keys are refused where they end; scalars need no place.
            return Ok(String::new());
        }
    };
    places.0.insert(pointer.clone(), at);
    Ok(pointer)
}

/// A key read as a value: scalars as their text; a container is no key.
fn to_key(value: Ordered) -> Option<String> {
    match value {
        Ordered::Scalar(Value::String(text)) => Some(text),
        Ordered::Scalar(Value::Null) => Some("null".to_owned()),
        Ordered::Scalar(other) => Some(other.to_string()),
        _ => None,
    }
}

/// What a value holds: values (itself included) and bytes of text (member names and strings).
#[derive(Clone, Copy, Default)]
struct Size {
    nodes: usize,
    bytes: usize,
}

/// The size of `value`, walked without recursion (a file may nest to [`MOST_LEVELS`]).
fn size(value: &Ordered) -> Size {
    let mut size = Size::default();
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        size.nodes += 1;
        match value {
            Ordered::List(items) => pending.extend(items),
            Ordered::Object(members) => {
                for (name, member) in members {
                    size.bytes += name.len();
                    pending.push(member);
                }
            }
            Ordered::Scalar(Value::String(text)) => size.bytes += text.len(),
            Ordered::Scalar(_) => {}
        }
    }
    size
}

/// A plain scalar typed by YAML 1.2's core schema.
fn typed(text: &str) -> Result<Value, String> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Ok(Value::Null),
        "true" | "True" | "TRUE" => return Ok(Value::Bool(true)),
        "false" | "False" | "FALSE" => return Ok(Value::Bool(false)),
        _ => {}
    }
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    let negative = text.starts_with('-');
    let radix = |digits: &str, base| {
        u64::from_str_radix(digits, base).ok().map(|n| if negative { -(n as i128) } else { n as i128 })
    };
    if let Some(digits) = text.strip_prefix("0x") {
        if let Some(n) = radix(digits, 16) {
            return Ok(Value::from(n as u64));
        }
    } else if let Some(digits) = text.strip_prefix("0o") {
        if let Some(n) = radix(digits, 8) {
            return Ok(Value::from(n as u64));
        }
    } else if !unsigned.is_empty() && unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return match text.parse::<i64>() {
            Ok(n) => Ok(Value::from(n)),
            Err(_) => match text.trim_start_matches('+').parse::<u64>() {
                Ok(n) => Ok(Value::from(n)),
                Err(_) => text
                    .parse::<f64>()
                    .ok()
                    .and_then(Number::from_f64)
                    .map(Value::Number)
                    .ok_or_else(|| format!("`{text}` is a number JSON cannot hold")),
            },
        };
    }
    if matches!(unsigned, ".inf" | ".Inf" | ".INF") || matches!(text, ".nan" | ".NaN" | ".NAN") {
        return Err(format!("`{text}` is a number JSON cannot hold"));
    }
    let numeric = !unsigned.is_empty()
        && unsigned.bytes().next().is_some_and(|b| b.is_ascii_digit() || b == b'.')
        && unsigned.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'));
    if numeric && let Ok(n) = text.parse::<f64>() {
        return Number::from_f64(n)
            .map(Value::Number)
            .ok_or_else(|| format!("`{text}` is a number JSON cannot hold"));
    }
    Ok(Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::{At, parse};
    use serde_json::{Value, json};

    fn value(text: &str) -> (Value, super::Places) {
        let (ordered, places) = parse(text).unwrap();
        (serde_json::from_str(&ordered.to_json()).unwrap(), places)
    }

    #[test]
    fn values_keep_their_places() {
        let text = "routes:\n  - name: users\n    n: 12\n    f: 1.5\n    q: '12'\n    t: true\n    z: ~\n    list: [a, \"b\", {c: 1}]\n";
        let (value, places) = value(text);
        assert_eq!(
            value,
            json!({"routes": [{"name": "users", "n": 12, "f": 1.5, "q": "12", "t": true, "z": null, "list": ["a", "b", {"c": 1}]}]})
        );
        assert_eq!(places.find("/routes"), At { line: 2, column: 3 });
        assert_eq!(places.find("/routes/0/name"), At { line: 2, column: 11 });
        assert_eq!(places.find("/routes/0/n"), At { line: 3, column: 8 });
        assert_eq!(places.find("/routes/0/list/2/c"), At { line: 8, column: 24 });
        // A member that is not there: where its object is.
        assert_eq!(places.find("/routes/0/missing"), At { line: 2, column: 5 });
    }

    #[test]
    fn json_is_read_as_json() {
        let text =
            "{\"a\": [1, -2, 3.25e2, \"x\\u00e9\\n\"], \"b\": {\"c\": null}, \"d\": 18446744073709551615}";
        let (value, places) = value(text);
        assert_eq!(
            value,
            json!({"a": [1, -2, 325.0, "x\u{e9}\n"], "b": {"c": null}, "d": 18446744073709551615u64})
        );
        assert_eq!(places.find("/b/c"), At { line: 1, column: 48 });
    }

    #[test]
    fn members_keep_their_order() {
        let (ordered, _) = parse("z: 1\na: {y: 2, b: 3}\n").unwrap();
        assert_eq!(ordered.to_json(), r#"{"z":1,"a":{"y":2,"b":3}}"#);
    }

    #[test]
    fn what_json_cannot_hold_is_refused_at_its_place() {
        let twice = parse("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!((twice.at.line, twice.message.contains("given twice")), (3, true));
        assert_eq!(parse("a: .inf\n").unwrap_err().at.line, 1);
        assert!(parse("? [a]\n: 1\n").is_err());
        assert!(parse("a: 1\n---\nb: 2\n").unwrap_err().message.contains("one document"));
        assert!(parse("a: [1, 2\n").is_err());
    }

    #[test]
    fn aliases_are_copies_within_a_bound() {
        let (value, _) = value("base: &b {x: 1}\nuse: *b\n");
        assert_eq!(value, json!({"base": {"x": 1}, "use": {"x": 1}}));
        // Nine levels of ten aliases each would be a billion values.
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for level in 1..10 {
            let prev = format!("*a{}", level - 1);
            text.push_str(&format!("a{level}: &a{level} [{}]\n", [prev.as_str(); 10].join(", ")));
        }
        assert!(parse(&text).unwrap_err().message.contains("more than"));
        // A long string copied by aliases counts its bytes.
        let long = "x".repeat(100_000);
        let text = format!("a: &a \"{long}\"\nb: [{}]\n", ["*a"; 3000].join(", "));
        assert!(parse(&text).unwrap_err().message.contains("bytes of text"));
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!("{}x\n", "- ".repeat(super::MOST_LEVELS + 1));
        assert!(parse(&deep).unwrap_err().message.contains("nests deeper"));
        let fine = format!("{}x\n", "- ".repeat(20));
        assert!(parse(&fine).is_ok());
    }
}
