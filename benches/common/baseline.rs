//! A straightforward mapper over `serde_json::Value`: parse the input to a `Value`, walk it target
//! by target, build an output `Value`, serialise it. It implements SPEC §1.2–1.7 independently of
//! recast's plan and executor, so it serves twice: as the baseline the engine benchmark compares
//! against, and as the reference the property tests check recast's output with.
//!
//! Output objects are `serde_json::Map`s, which keep keys sorted rather than in rule order; JSON
//! objects are unordered, so comparisons are by value (order is tested by the conformance cases).

use recast::rules::{KeyEntry, NewField, OldField, Rules, Type};
use serde_json::{Map, Value};

/// Parses `input`, maps it, and serialises the result (what a naive service would do per call).
pub fn map_bytes(rules: &Rules, input: &[u8]) -> Vec<u8> {
    let value: Value = serde_json::from_slice(input).unwrap_or(Value::Null);
    serde_json::to_vec(&map(rules, &value)).unwrap_or_default()
}

/// Maps a parsed document.
pub fn map(rules: &Rules, root: &Value) -> Value {
    let targets = ordered_targets(rules);
    let Some(path) = &rules.each else {
        return Value::Object(object(rules, &targets, root));
    };
    let mut at = Some(root);
    for name in path {
        at = at.and_then(first_non_list).and_then(|v| v.as_object()?.get(name));
    }
    let elements: Vec<&Value> = match at {
        Some(Value::Array(items)) => items.iter().collect(),
        Some(v @ Value::Object(_)) => vec![v],
        _ => Vec::new(),
    };
    Value::Array(
        elements
            .into_iter()
            .map(|element| object(rules, &targets, element))
            .filter(|o| !(rules.ignore_empty_values && o.is_empty()))
            .map(Value::Object)
            .collect(),
    )
}

/// Targets with their sources, by position and then declaration order.
fn ordered_targets(rules: &Rules) -> Vec<(&NewField, &OldField)> {
    let mut targets: Vec<_> = rules
        .new_body_fields
        .iter()
        .filter_map(|new| Some((new, rules.old_body_fields.iter().find(|old| old.id == new.id)?)))
        .collect();
    targets.sort_by_key(|(new, _)| (new.position.is_none(), new.position));
    targets
}

fn object(rules: &Rules, targets: &[(&NewField, &OldField)], root: &Value) -> Map<String, Value> {
    let ignore = rules.ignore_empty_values;
    let mut out = Map::new();
    for (new, old) in targets {
        let (Some(key), Some(ty)) = (&new.key, new.ty) else { continue };
        let value = if let [entry] = old.keys.as_slice() {
            read(ignore, ty, root, &old.parents, entry)
        } else {
            let items: Vec<Value> =
                old.keys.iter().filter_map(|entry| read(ignore, ty, root, &old.parents, entry)).collect();
            (!(ignore && items.is_empty())).then_some(Value::Array(items))
        };
        if let Some(value) = value {
            out.insert(key.clone(), value);
        }
    }
    out
}

/// One `keys` entry; `None` when it is left out.
fn read(ignore: bool, ty: Type, root: &Value, parents: &[String], entry: &KeyEntry) -> Option<Value> {
    match entry {
        KeyEntry::Field(name) => single(ignore, ty, lookup(root, parents, name)),
        KeyEntry::Concat(names) => {
            let parts: Vec<String> = names.iter().filter_map(|n| text(lookup(root, parents, n)?)).collect();
            if parts.is_empty() && ignore { None } else { Some(Value::String(parts.join(" "))) }
        }
    }
}

fn first_non_list(mut v: &Value) -> Option<&Value> {
    while let Value::Array(items) = v {
        v = items.first()?;
    }
    Some(v)
}

fn lookup<'v>(root: &'v Value, parents: &[String], name: &str) -> Option<&'v Value> {
    let mut at = root;
    for step in parents.iter().map(String::as_str).chain([name]) {
        at = first_non_list(at)?.as_object()?.get(step)?;
    }
    Some(at)
}

fn single(ignore: bool, ty: Type, value: Option<&Value>) -> Option<Value> {
    let value = match value {
        None | Some(Value::Null) => return (!ignore).then_some(Value::Null),
        Some(value) => value,
    };
    if ty == Type::Json {
        return (!(ignore && is_empty(value))).then(|| value.clone());
    }
    if let Value::Array(items) = value {
        let items: Vec<Value> =
            items.iter().map(|item| coerce(item, ty)).filter(|item| !(ignore && is_empty(item))).collect();
        return (!(ignore && items.is_empty())).then_some(Value::Array(items));
    }
    let value = coerce(value, ty);
    (!(ignore && is_empty(&value))).then_some(value)
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.trim().is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(members) => members.is_empty(),
        _ => false,
    }
}

fn coerce(value: &Value, ty: Type) -> Value {
    let converted = match (ty, value) {
        (Type::String, Value::String(s)) => Some(Value::String(s.clone())),
        (Type::String, Value::Number(n)) => Some(Value::String(n.to_string())),
        (Type::String, Value::Bool(b)) => Some(Value::String(b.to_string())),
        (Type::Int | Type::Long, Value::Number(n)) => n.as_i64().map(Value::from),
        (Type::Int | Type::Long, Value::String(s)) => s.trim().parse::<i64>().ok().map(Value::from),
        (Type::Double | Type::Float, Value::Number(n)) => n.as_f64().and_then(float),
        (Type::Double | Type::Float, Value::String(s)) => {
            let s = s.trim();
            let numeric = s.bytes().any(|b| b.is_ascii_digit())
                && s.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b));
            if numeric { s.parse::<f64>().ok().and_then(float) } else { None }
        }
        (Type::Boolean, Value::Bool(b)) => Some(Value::Bool(*b)),
        (Type::Boolean, Value::Number(n)) => match (n.as_u64(), n.is_f64()) {
            (Some(1), false) => Some(Value::Bool(true)),
            (Some(0), false) => Some(Value::Bool(false)),
            _ => None,
        },
        (Type::Boolean, Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            _ => None,
        },
        _ => None,
    };
    converted.unwrap_or(Value::Null)
}

/// A finite float as a JSON number (`Value::from(f64)` would turn NaN into null silently).
fn float(f: f64) -> Option<Value> {
    serde_json::Number::from_f64(f).map(Value::Number)
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.trim()).filter(|s| !s.is_empty()).map(str::to_owned),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}
