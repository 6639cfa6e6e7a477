//! A JSON value whose objects keep their members in the order written: what a routes file and a
//! route's view are read into where that order counts (a rules document writes its targets in
//! the order given, SPEC §1.7), which `serde_json::Value` would sort.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value, objects in their order.
#[derive(Debug, Clone, PartialEq)]
pub enum Ordered {
    /// `null`, a boolean, a number or a string.
    Scalar(serde_json::Value),
    List(Vec<Ordered>),
    Object(Vec<(String, Ordered)>),
}

impl Ordered {
    /// The member `name` of an object.
    pub fn get(&self, name: &str) -> Option<&Ordered> {
        match self {
            Ordered::Object(members) => members.iter().find(|(n, _)| n == name).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The text of a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Ordered::Scalar(serde_json::Value::String(text)) => Some(text),
            _ => None,
        }
    }

    /// Sets the member `name` of an object (in its place, or last).
    pub fn set(&mut self, name: &str, value: Ordered) {
        if let Ordered::Object(members) = self {
            match members.iter_mut().find(|(n, _)| n == name) {
                Some((_, old)) => *old = value,
                None => members.push((name.to_owned(), value)),
            }
        }
    }

    /// Takes the member `name` out of an object.
    pub fn remove(&mut self, name: &str) -> Option<Ordered> {
        match self {
            Ordered::Object(members) => {
                let at = members.iter().position(|(n, _)| n == name)?;
                Some(members.remove(at).1)
            }
            _ => None,
        }
    }

    /// A string.
    pub fn text(text: impl Into<String>) -> Ordered {
        Ordered::Scalar(serde_json::Value::String(text.into()))
    }

    /// Compact JSON text, members in their order.
    pub fn to_json(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            Ordered::Scalar(value) => out.push_str(&value.to_string()),
            Ordered::List(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(out);
                }
                out.push(']');
            }
            Ordered::Object(members) => {
                out.push('{');
                for (i, (name, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::Value::String(name.clone()).to_string());
                    out.push(':');
                    value.write(out);
                }
                out.push('}');
            }
        }
    }
}

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Ordered, D::Error> {
        struct Reading;
        impl<'de> Visitor<'de> for Reading {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(v.into()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(v.into()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(
                    serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, Into::into),
                ))
            }
            fn visit_str<E>(self, v: &str) -> Result<Ordered, E> {
                Ok(Ordered::text(v))
            }
            fn visit_string<E>(self, v: String) -> Result<Ordered, E> {
                Ok(Ordered::text(v))
            }
            fn visit_unit<E>(self) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(serde_json::Value::Null))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ordered, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Ordered::List(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
                let mut members = Vec::new();
                while let Some((name, value)) = map.next_entry::<String, Ordered>()? {
                    members.push((name, value));
                }
                Ok(Ordered::Object(members))
            }
        }
        deserializer.deserialize_any(Reading)
    }
}
