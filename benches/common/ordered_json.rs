//! A JSON value whose objects keep their members in document order, repeated names included:
//! what the tests compare documents with, and the tree the reference mapper
//! (`benches/common/baseline.rs`) reads and builds. `serde_json::Value` would sort members and keep
//! only the last of a repeated name, so two outputs that differ in order would compare equal.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    /// Reads JSON text; panics, showing the text, when it is not JSON.
    pub fn parse(text: &[u8]) -> Json {
        Json::read(text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(text)))
    }

    pub fn read(text: &[u8]) -> Result<Json, serde_json::Error> {
        serde_json::from_slice(text)
    }

    /// The first member named `name` (the one recast reads when a name repeats).
    pub fn get(&self, name: &str) -> Option<&Json> {
        match self {
            Json::Object(members) => members.iter().find(|(k, _)| k == name).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> &[Json] {
        match self {
            Json::Array(items) => items,
            other => panic!("not an array: {other}"),
        }
    }

    /// The same value with every object's members sorted, for order-blind comparison.
    pub fn sorted(&self) -> Json {
        match self {
            Json::Array(items) => Json::Array(items.iter().map(Json::sorted).collect()),
            Json::Object(members) => {
                let mut members: Vec<_> = members.iter().map(|(k, v)| (k.clone(), v.sorted())).collect();
                members.sort_by(|a, b| a.0.cmp(&b.0));
                Json::Object(members)
            }
            other => other.clone(),
        }
    }

    /// Appends the value as compact JSON text, members in order.
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            Json::Null => out.extend_from_slice(b"null"),
            Json::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Json::Number(n) => serde_json::to_writer(&mut *out, n).expect("a number writes"),
            Json::String(s) => serde_json::to_writer(&mut *out, s).expect("a string writes"),
            Json::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            Json::Object(members) => {
                out.push(b'{');
                for (i, (name, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    serde_json::to_writer(&mut *out, name).expect("a string writes");
                    out.push(b':');
                    value.write(out);
                }
                out.push(b'}');
            }
        }
    }
}

/// Compact JSON text, members in order.
/// `json["member"]`: the first member of that name; panics, showing the value, when there is none.
impl std::ops::Index<&str> for Json {
    type Output = Json;

    fn index(&self, name: &str) -> &Json {
        self.get(name).unwrap_or_else(|| panic!("no member `{name}` in {self}"))
    }
}

/// `json[i]`: the element `i` of a list.
impl std::ops::Index<usize> for Json {
    type Output = Json;

    fn index(&self, i: usize) -> &Json {
        &self.as_array()[i]
    }
}

/// A string value compares equal to its text.
impl PartialEq<&str> for Json {
    fn eq(&self, text: &&str) -> bool {
        self.as_str() == Some(*text)
    }
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = Vec::new();
        self.write(&mut text);
        f.write_str(&String::from_utf8_lossy(&text))
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Json, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Json;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
                Ok(Json::Bool(b))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
                Ok(Json::Number(n.into()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
                Ok(Json::Number(n.into()))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Json, E> {
                serde_json::Number::from_f64(n).map(Json::Number).ok_or_else(|| E::custom("not finite"))
            }
            fn visit_str<E>(self, s: &str) -> Result<Json, E> {
                Ok(Json::String(s.to_owned()))
            }
            fn visit_string<E>(self, s: String) -> Result<Json, E> {
                Ok(Json::String(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Json::Array(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(Json::Object(members))
            }
        }
        deserializer.deserialize_any(V)
    }
}
