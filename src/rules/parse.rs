//! Reads a rules document from a parsed JSON value into [`Rules`], checking its shape: required
//! members, member types, empty names, unknown and duplicate members. Every problem is recorded
//! with its location and reading goes on, so one pass reports them all.

use std::collections::HashSet;

use smallvec::SmallVec;

use super::{Each, KeyEntry, MAX_ID_BYTES, MAX_PROBLEMS, NewField, OldField, Problem, Rules, Type};
use crate::json::{self, Node, Nodes, StaticNode};
use crate::suggest;

const TOP_MEMBERS: &[&str] = &["ignoreEmptyValues", "each", "newBodyFields", "oldBodyFields"];
const NEW_MEMBERS: &[&str] = &["key", "type", "position"];
const OLD_MEMBERS: &[&str] = &["keys", "parents", "expr", "type"];

/// Reads the rules document at `root`. Problems are appended to `problems`; the returned
/// [`Rules`] holds everything that could be read, so compilation can find further problems.
pub fn parse(nodes: &Nodes<'_>, root: usize, problems: &mut Vec<Problem>) -> Rules {
    let mut rules = Rules::default();
    let Some(top) = json::members(nodes, root) else {
        problems.push(Problem::new(
            "",
            format!("rules must be a JSON object, found {}", json::kind(nodes, root)),
        ));
        return rules;
    };
    let mut seen = MemberNames::default();
    let (mut has_new, mut has_old) = (false, false);
    for (name, value) in top {
        if problems.len() >= MAX_PROBLEMS {
            break;
        }
        let at = At::Member(&At::Root, name);
        if !first_time(&mut seen, name, &at, problems) {
            continue;
        }
        match name {
            "ignoreEmptyValues" => match nodes.get(value) {
                Some(Node::Static(StaticNode::Bool(b))) => rules.ignore_empty_values = *b,
                Some(Node::Static(StaticNode::Null)) => {}
                _ => problems.push(must_be(&at, "true or false", nodes, value)),
            },
            "each" => {
                rules.each = match nodes.get(value) {
                    Some(Node::String(text)) => Some(Each::Expr(expression(text, &at, problems))),
                    _ => optional_path(nodes, value, &at, problems).map(Each::Path),
                }
            }
            "newBodyFields" => {
                has_new = true;
                rules.new_body_fields = entries(nodes, value, &at, problems, new_field);
            }
            "oldBodyFields" => {
                has_old = true;
                rules.old_body_fields = entries(nodes, value, &at, problems, old_field);
            }
            _ => problems.push(unknown(&at, name, TOP_MEMBERS)),
        }
    }
    for (present, name) in [(has_new, "newBodyFields"), (has_old, "oldBodyFields")] {
        if !present {
            problems.push(Problem::new("", format!("missing required member `{name}`")));
        }
    }
    rules
}

/// Reads an object of `id → entry` members in the client's order.
fn entries<T>(
    nodes: &Nodes<'_>,
    i: usize,
    at: &At<'_>,
    problems: &mut Vec<Problem>,
    read: fn(&Nodes<'_>, usize, String, &At<'_>, &mut Vec<Problem>) -> Option<T>,
) -> Vec<T> {
    let Some(members) = json::members(nodes, i) else {
        problems.push(must_be(at, "an object of rule ids", nodes, i));
        return Vec::new();
    };
    let mut seen = MemberNames::default();
    let mut out = Vec::new();
    for (id, value) in members {
        if problems.len() >= MAX_PROBLEMS {
            break;
        }
        // Told once, at the object, and not read: each problem of the rule would carry it.
        if id.len() > MAX_ID_BYTES {
            problems.push(Problem::new(
                at.pointer(),
                format!(
                    "a rule id is at most {MAX_ID_BYTES} bytes; one of {} bytes starts `{}`",
                    id.len(),
                    id.chars().take(32).collect::<String>()
                ),
            ));
            continue;
        }
        let at = At::Member(at, id);
        if !first_time(&mut seen, id, &at, problems) {
            continue;
        }
        if id.is_empty() {
            problems.push(Problem::new(at.pointer(), "a rule id must not be empty"));
        }
        out.extend(read(nodes, value, id.to_owned(), &at, problems));
    }
    out
}

fn new_field(
    nodes: &Nodes<'_>,
    i: usize,
    id: String,
    at: &At<'_>,
    problems: &mut Vec<Problem>,
) -> Option<NewField> {
    let Some(members) = json::members(nodes, i) else {
        problems.push(must_be(at, "an object with `key` and `type`", nodes, i));
        return None;
    };
    let mut field = NewField { id, key: None, ty: None, position: None };
    let (mut has_key, mut has_type) = (false, false);
    let mut seen = MemberNames::default();
    for (name, value) in members {
        if problems.len() >= MAX_PROBLEMS {
            break;
        }
        let at = At::Member(at, name);
        if !first_time(&mut seen, name, &at, problems) {
            continue;
        }
        match name {
            "key" => {
                has_key = true;
                match nodes.get(value) {
                    Some(Node::String("")) => {
                        problems.push(Problem::new(at.pointer(), "the output key must not be empty"))
                    }
                    Some(Node::String(key)) => field.key = Some((*key).to_owned()),
                    _ => problems.push(must_be(&at, "a string", nodes, value)),
                }
            }
            "type" => {
                has_type = true;
                field.ty = type_name(nodes, value, &at, problems);
            }
            "position" => match nodes.get(value) {
                Some(Node::Static(StaticNode::I64(n))) => field.position = Some(*n),
                Some(Node::Static(StaticNode::U64(n))) => match i64::try_from(*n) {
                    Ok(n) => field.position = Some(n),
                    Err(_) => problems.push(Problem::new(at.pointer(), "position is out of range")),
                },
                Some(Node::Static(StaticNode::Null)) => {}
                _ => problems.push(must_be(&at, "an integer", nodes, value)),
            },
            _ => problems.push(unknown(&at, name, NEW_MEMBERS)),
        }
    }
    if !has_key {
        problems.push(Problem::new(at.pointer(), "missing required member `key`"));
    }
    if !has_type {
        problems.push(Problem::new(at.pointer(), "missing required member `type`"));
    }
    Some(field)
}

fn old_field(
    nodes: &Nodes<'_>,
    i: usize,
    id: String,
    at: &At<'_>,
    problems: &mut Vec<Problem>,
) -> Option<OldField> {
    let Some(members) = json::members(nodes, i) else {
        problems.push(must_be(at, "an object with `keys`", nodes, i));
        return None;
    };
    let mut field = OldField { id, keys: Vec::new(), parents: Vec::new(), expr: None };
    let (mut has_keys, mut has_parents) = (false, false);
    // A misspelt `keys`, `parents` or `expr` is reported as such, not also as missing.
    let mut misspelt = false;
    let mut seen = MemberNames::default();
    for (name, value) in members {
        if problems.len() >= MAX_PROBLEMS {
            break;
        }
        let at = At::Member(at, name);
        if !first_time(&mut seen, name, &at, problems) {
            continue;
        }
        match name {
            "keys" => {
                has_keys = true;
                field.keys = key_entries(nodes, value, &at, problems);
            }
            "parents" => {
                has_parents = !matches!(nodes.get(value), Some(Node::Static(StaticNode::Null)));
                field.parents = optional_path(nodes, value, &at, problems).unwrap_or_default();
            }
            "expr" => match nodes.get(value) {
                Some(Node::String(text)) => field.expr = Some(expression(text, &at, problems)),
                _ => problems.push(must_be(&at, "an expression (a string)", nodes, value)),
            },
            // Informative only (SPEC §1), but a misspelt type is still worth reporting.
            "type" => {
                if !matches!(nodes.get(value), Some(Node::Static(StaticNode::Null))) {
                    type_name(nodes, value, &at, problems);
                }
            }
            _ => {
                misspelt |= matches!(
                    suggest::closest(name, OLD_MEMBERS.iter().copied()),
                    Some("keys" | "parents" | "expr")
                );
                problems.push(unknown(&at, name, OLD_MEMBERS));
            }
        }
    }
    match (has_keys || has_parents, field.expr.is_some()) {
        (true, true) => problems.push(Problem::new(
            at.pointer(),
            "a source reads its value by `keys` (with `parents`) or by `expr`, not both",
        )),
        (false, false) if misspelt => {}
        (false, false) => problems.push(Problem::new(
            at.pointer(),
            "missing required member: a source reads its value by `keys` (with `parents`) or by `expr`",
        )),
        (true, false) if !has_keys && !misspelt => {
            problems.push(Problem::new(at.pointer(), "missing required member `keys`"))
        }
        _ => {}
    }
    Some(field)
}

fn key_entries(nodes: &Nodes<'_>, i: usize, at: &At<'_>, problems: &mut Vec<Problem>) -> Vec<KeyEntry> {
    let Some(elements) = json::elements(nodes, i) else {
        problems.push(must_be(at, "a list of field names", nodes, i));
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut listed = 0;
    for (n, value) in elements.enumerate() {
        if problems.len() >= MAX_PROBLEMS {
            break;
        }
        listed += 1;
        let at = At::Index(at, n);
        let Some(Node::String(text)) = nodes.get(value) else {
            problems.push(must_be(&at, "a string", nodes, value));
            continue;
        };
        if text.contains(',') {
            let names: Vec<String> = text.split(',').map(|s| s.trim().to_owned()).collect();
            if names.iter().any(String::is_empty) {
                problems.push(Problem::new(
                    at.pointer(),
                    format!("concatenation `{text}` has an empty field name"),
                ));
                continue;
            }
            out.push(KeyEntry::Concat(names));
        } else if text.trim().is_empty() {
            problems.push(Problem::new(at.pointer(), "a field name must not be empty"));
        } else {
            out.push(KeyEntry::Field((*text).to_owned()));
        }
    }
    if listed == 0 {
        problems.push(Problem::new(at.pointer(), "`keys` must name at least one field"));
    }
    out
}

/// An expression's text; an empty one is a problem (compiling it is the compiler's part).
fn expression(text: &str, at: &At<'_>, problems: &mut Vec<Problem>) -> String {
    if text.trim().is_empty() {
        problems.push(Problem::new(at.pointer(), "an expression must not be empty"));
    }
    text.to_owned()
}

/// A `parents` or `each` path: a list of non-empty names, or `null` for none.
fn optional_path(
    nodes: &Nodes<'_>,
    i: usize,
    at: &At<'_>,
    problems: &mut Vec<Problem>,
) -> Option<Vec<String>> {
    if let Some(Node::Static(StaticNode::Null)) = nodes.get(i) {
        return None;
    }
    let Some(elements) = json::elements(nodes, i) else {
        problems.push(must_be(at, "a list of field names", nodes, i));
        return None;
    };
    let mut path = Vec::new();
    for (n, value) in elements.enumerate() {
        if problems.len() >= MAX_PROBLEMS {
            break;
        }
        match nodes.get(value) {
            Some(Node::String(name)) if !name.trim().is_empty() => path.push((*name).to_owned()),
            Some(Node::String(_)) => {
                problems.push(Problem::new(At::Index(at, n).pointer(), "a field name must not be empty"))
            }
            _ => problems.push(must_be(&At::Index(at, n), "a string", nodes, value)),
        }
    }
    Some(path)
}

fn type_name(nodes: &Nodes<'_>, i: usize, at: &At<'_>, problems: &mut Vec<Problem>) -> Option<Type> {
    let Some(Node::String(name)) = nodes.get(i) else {
        problems.push(must_be(at, "a type name", nodes, i));
        return None;
    };
    let ty = Type::from_name(name);
    if ty.is_none() {
        problems.push(Problem::new(
            at.pointer(),
            format!("{} (a trailing `?` is allowed)", suggest::unknown("type", name, &Type::NAMES)),
        ));
    }
    ty
}

/// Records `name` as seen in one object; a second occurrence is a problem.
fn first_time<'a>(
    seen: &mut MemberNames<'a>,
    name: &'a str,
    at: &At<'_>,
    problems: &mut Vec<Problem>,
) -> bool {
    if !seen.insert(name) {
        problems.push(Problem::new(at.pointer(), format!("duplicate member `{name}`")));
        return false;
    }
    true
}

/// The member names of one object so far. An object of the rules language has a few members, so
/// they are compared in a list, which costs less than hashing each name; past `LISTED` of them
/// they go in a hash set, so a document with thousands of members in one object stays linear.
#[derive(Default)]
struct MemberNames<'a> {
    listed: SmallVec<[&'a str; LISTED]>,
    hashed: HashSet<&'a str>,
}

/// Names [`MemberNames`] compares in its list before it hashes them.
const LISTED: usize = 16;

impl<'a> MemberNames<'a> {
    /// False when `name` was seen before.
    fn insert(&mut self, name: &'a str) -> bool {
        if self.listed.len() < LISTED {
            if self.listed.contains(&name) {
                return false;
            }
            self.listed.push(name);
            return true;
        }
        if self.hashed.is_empty() {
            self.hashed.extend(self.listed.iter().copied());
        }
        self.hashed.insert(name)
    }
}

/// Where a value of the rules document is. It becomes a JSON pointer only when a problem is
/// reported there, as most documents have none.
enum At<'a> {
    Root,
    Member(&'a At<'a>, &'a str),
    Index(&'a At<'a>, usize),
}

impl At<'_> {
    fn pointer(&self) -> String {
        let mut pointer = String::new();
        self.write(&mut pointer);
        pointer
    }

    fn write(&self, pointer: &mut String) {
        match self {
            At::Root => {}
            At::Member(parent, name) => {
                parent.write(pointer);
                json::push_pointer(pointer, name);
            }
            At::Index(parent, n) => {
                parent.write(pointer);
                pointer.push('/');
                pointer.push_str(itoa::Buffer::new().format(*n));
            }
        }
    }
}

fn must_be(at: &At<'_>, what: &str, nodes: &Nodes<'_>, i: usize) -> Problem {
    Problem::new(at.pointer(), format!("must be {what}, found {}", json::kind(nodes, i)))
}

fn unknown(at: &At<'_>, name: &str, expected: &[&str]) -> Problem {
    Problem::new(at.pointer(), suggest::unknown("member", name, expected))
}
