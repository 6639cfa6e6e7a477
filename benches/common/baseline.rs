//! A straightforward mapper over a JSON tree: read the rules text, parse the input to a tree
//! ([`Json`], objects in document order), walk it target by target, build an output tree,
//! serialise it. It implements SPEC §1.2–1.7 from the rules' JSON text with nothing of recast's
//! (not its rules parser, plan or executor), so it serves twice: as the baseline the engine
//! benchmark compares against, and as the reference the property tests check recast's output
//! with, member order and repeated names included (the first of a repeated name is read, as
//! `docs/behaviour.md` says).

use crate::ordered_json::Json;

/// A target type (SPEC §1.5); `Long` and `Float` behave as `Int` and `Double`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Type {
    String,
    Int,
    Double,
    Boolean,
    Json,
}

/// One `keys` entry: a field, or a concatenation of fields (SPEC §1.3).
#[derive(Debug)]
enum Entry {
    Field(String),
    Concat(Vec<String>),
}

#[derive(Debug)]
struct Target {
    key: String,
    ty: Type,
    parents: Vec<String>,
    keys: Vec<Entry>,
}

/// A rules document as the reference reads it: its targets in output order.
#[derive(Debug)]
pub struct Rules {
    ignore_empty: bool,
    each: Option<Vec<String>>,
    targets: Vec<Target>,
}

impl Rules {
    /// Reads a rules document that recast accepts (a JSON object, or a string holding one). It
    /// checks only what it needs to read; a document it cannot read is an error.
    pub fn read(text: &[u8]) -> Result<Rules, String> {
        let mut document = Json::read(text).map_err(|e| e.to_string())?;
        if let Json::String(inner) = &document {
            document = Json::read(inner.as_bytes()).map_err(|e| e.to_string())?;
        }
        let ignore_empty = match document.get("ignoreEmptyValues") {
            None | Some(Json::Null) => false,
            Some(Json::Bool(ignore)) => *ignore,
            Some(other) => return Err(format!("ignoreEmptyValues: {other}")),
        };
        let each = match document.get("each") {
            None | Some(Json::Null) => None,
            Some(path) => Some(names(path)?),
        };
        let (Some(Json::Object(new)), Some(old @ Json::Object(_))) =
            (document.get("newBodyFields"), document.get("oldBodyFields"))
        else {
            return Err("newBodyFields and oldBodyFields must be objects".to_owned());
        };
        let mut targets = Vec::new();
        for (id, new) in new {
            let source = old.get(id).ok_or_else(|| format!("no oldBodyFields entry {id}"))?;
            let key = new.get("key").and_then(Json::as_str).ok_or_else(|| format!("{id}: key"))?;
            let ty = new.get("type").and_then(Json::as_str).ok_or_else(|| format!("{id}: type"))?;
            let ty = match ty.strip_suffix('?').unwrap_or(ty) {
                "String" => Type::String,
                "Int" | "Long" => Type::Int,
                "Double" | "Float" => Type::Double,
                "Boolean" => Type::Boolean,
                "Json" => Type::Json,
                other => return Err(format!("{id}: type {other}")),
            };
            let position = match new.get("position") {
                None | Some(Json::Null) => None,
                Some(Json::Number(n)) => Some(n.as_i64().ok_or_else(|| format!("{id}: position {n}"))?),
                Some(other) => return Err(format!("{id}: position {other}")),
            };
            let parents = match source.get("parents") {
                None | Some(Json::Null) => Vec::new(),
                Some(path) => names(path)?,
            };
            let keys = names(source.get("keys").ok_or_else(|| format!("{id}: keys"))?)?
                .into_iter()
                .map(|entry| {
                    if entry.contains(',') {
                        Entry::Concat(entry.split(',').map(|name| name.trim().to_owned()).collect())
                    } else {
                        Entry::Field(entry)
                    }
                })
                .collect();
            targets.push((position, Target { key: key.to_owned(), ty, parents, keys }));
        }
        // By position, those without one last; a stable sort keeps the document's order otherwise.
        targets.sort_by_key(|(position, _)| (position.is_none(), *position));
        Ok(Rules { ignore_empty, each, targets: targets.into_iter().map(|(_, target)| target).collect() })
    }
}

/// A list of strings.
fn names(list: &Json) -> Result<Vec<String>, String> {
    let Json::Array(items) = list else { return Err(format!("not a list: {list}")) };
    items
        .iter()
        .map(|item| item.as_str().map(str::to_owned).ok_or_else(|| format!("not a name: {item}")))
        .collect()
}

/// Parses `input`, maps it, and serialises the result (what a naive service would do per call).
pub fn map_bytes(rules: &Rules, input: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    map(rules, &Json::read(input).unwrap_or(Json::Null)).write(&mut out);
    out
}

/// Maps a parsed document.
pub fn map(rules: &Rules, root: &Json) -> Json {
    let Some(path) = &rules.each else {
        return Json::Object(object(rules, root));
    };
    let mut at = Some(root);
    for name in path {
        at = at.and_then(first_non_list).and_then(|v| v.get(name));
    }
    let elements: Vec<&Json> = match at {
        Some(Json::Array(items)) => items.iter().collect(),
        Some(v @ Json::Object(_)) => vec![v],
        _ => Vec::new(),
    };
    Json::Array(
        elements
            .into_iter()
            .map(|element| object(rules, element))
            .filter(|o| !(rules.ignore_empty && o.is_empty()))
            .map(Json::Object)
            .collect(),
    )
}

fn object(rules: &Rules, root: &Json) -> Vec<(String, Json)> {
    let ignore = rules.ignore_empty;
    let mut out = Vec::new();
    for target in &rules.targets {
        let value = if let [entry] = target.keys.as_slice() {
            read(ignore, target, root, entry)
        } else {
            let items: Vec<Json> =
                target.keys.iter().filter_map(|entry| read(ignore, target, root, entry)).collect();
            (!(ignore && items.is_empty())).then_some(Json::Array(items))
        };
        if let Some(value) = value {
            out.push((target.key.clone(), value));
        }
    }
    out
}

/// One `keys` entry; `None` when it is left out.
fn read(ignore: bool, target: &Target, root: &Json, entry: &Entry) -> Option<Json> {
    match entry {
        Entry::Field(name) => single(ignore, target.ty, lookup(root, &target.parents, name)),
        Entry::Concat(names) => {
            let parts: Vec<String> =
                names.iter().filter_map(|n| text(lookup(root, &target.parents, n)?)).collect();
            if parts.is_empty() && ignore { None } else { Some(Json::String(parts.join(" "))) }
        }
    }
}

fn first_non_list(mut v: &Json) -> Option<&Json> {
    while let Json::Array(items) = v {
        v = items.first()?;
    }
    Some(v)
}

fn lookup<'v>(root: &'v Json, parents: &[String], name: &str) -> Option<&'v Json> {
    let mut at = root;
    for step in parents.iter().map(String::as_str).chain([name]) {
        at = first_non_list(at)?.get(step)?;
    }
    Some(at)
}

fn single(ignore: bool, ty: Type, value: Option<&Json>) -> Option<Json> {
    let value = match value {
        None | Some(Json::Null) => return (!ignore).then_some(Json::Null),
        Some(value) => value,
    };
    if ty == Type::Json {
        return (!(ignore && is_empty(value))).then(|| value.clone());
    }
    if let Json::Array(items) = value {
        let items: Vec<Json> =
            items.iter().map(|item| coerce(item, ty)).filter(|item| !(ignore && is_empty(item))).collect();
        return (!(ignore && items.is_empty())).then_some(Json::Array(items));
    }
    let value = coerce(value, ty);
    (!(ignore && is_empty(&value))).then_some(value)
}

fn is_empty(value: &Json) -> bool {
    match value {
        Json::Null => true,
        Json::String(s) => s.trim().is_empty(),
        Json::Array(items) => items.is_empty(),
        Json::Object(members) => members.is_empty(),
        _ => false,
    }
}

fn coerce(value: &Json, ty: Type) -> Json {
    let converted = match (ty, value) {
        (Type::String, Json::String(s)) => Some(Json::String(s.clone())),
        (Type::String, Json::Number(n)) => Some(Json::String(n.to_string())),
        (Type::String, Json::Bool(b)) => Some(Json::String(b.to_string())),
        (Type::Int, Json::Number(n)) => n.as_i64().map(|n| Json::Number(n.into())),
        (Type::Int, Json::String(s)) => s.trim().parse::<i64>().ok().map(|n| Json::Number(n.into())),
        (Type::Double, Json::Number(n)) => n.as_f64().and_then(float),
        (Type::Double, Json::String(s)) => {
            let s = s.trim();
            let numeric = s.bytes().any(|b| b.is_ascii_digit())
                && s.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b));
            if numeric { s.parse::<f64>().ok().and_then(float) } else { None }
        }
        (Type::Boolean, Json::Bool(b)) => Some(Json::Bool(*b)),
        (Type::Boolean, Json::Number(n)) => match (n.as_u64(), n.is_f64()) {
            (Some(1), false) => Some(Json::Bool(true)),
            (Some(0), false) => Some(Json::Bool(false)),
            _ => None,
        },
        (Type::Boolean, Json::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
            "true" => Some(Json::Bool(true)),
            "false" => Some(Json::Bool(false)),
            _ => None,
        },
        _ => None,
    };
    converted.unwrap_or(Json::Null)
}

/// A finite float as a JSON number.
fn float(f: f64) -> Option<Json> {
    serde_json::Number::from_f64(f).map(Json::Number)
}

fn text(value: &Json) -> Option<String> {
    match value {
        Json::String(s) => Some(s.trim()).filter(|s| !s.is_empty()).map(str::to_owned),
        Json::Number(n) => Some(n.to_string()),
        Json::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}
