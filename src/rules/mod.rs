//! The rules language (SPEC §1): its source model, the parser that reads it from JSON, and the
//! compiler that turns it into a [`Plan`](crate::plan::Plan).
//!
//! Parsing and compiling never stop at the first problem: every problem is collected with a
//! JSON-pointer location into the rules document, and the caller gets all of them at once.

mod compile;
mod parse;

pub use compile::{Compiled, compile, compile_json, compile_value, read_json};
pub use parse::parse;

/// Ceilings that compilation enforces (SPEC §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Targets per rules document (`RECAST_MAX_RULES`).
    pub max_rules: usize,
    /// Steps in a `parents` or `each` path, nesting of JSON documents and of expressions
    /// (`RECAST_MAX_DEPTH`).
    pub max_depth: usize,
    /// Bytes the values built by one call's expressions may take (`RECAST_MAX_EXPR_BYTES`).
    pub max_expr_bytes: usize,
}

/// The default of [`Limits::max_expr_bytes`]: 64 MiB.
pub const DEFAULT_MAX_EXPR_BYTES: usize = 64 << 20;

impl Default for Limits {
    fn default() -> Self {
        Limits { max_rules: 1024, max_depth: 64, max_expr_bytes: DEFAULT_MAX_EXPR_BYTES }
    }
}

/// One problem (or warning) in a rules document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// JSON pointer into the rules document (`""` is the document itself).
    pub location: String,
    pub message: String,
}

impl Problem {
    pub fn new(location: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem { location: location.into(), message: message.into() }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.location.is_empty() { "(document)" } else { &self.location };
        write!(f, "{at}: {}", self.message)
    }
}

/// A target type (SPEC §1.5). `Long` and `Float` are spelled differently but behave as `Int` and
/// `Double`; the spelling is kept for messages and traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    String,
    Int,
    Long,
    Double,
    Float,
    Boolean,
    Json,
}

impl Type {
    pub const NAMES: [&'static str; 7] = ["String", "Int", "Long", "Double", "Float", "Boolean", "Json"];

    /// Reads a type name; a trailing `?` is allowed and changes nothing.
    pub fn from_name(name: &str) -> Option<Type> {
        Some(match name.strip_suffix('?').unwrap_or(name) {
            "String" => Type::String,
            "Int" => Type::Int,
            "Long" => Type::Long,
            "Double" => Type::Double,
            "Float" => Type::Float,
            "Boolean" => Type::Boolean,
            "Json" => Type::Json,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Type::String => "String",
            Type::Int => "Int",
            Type::Long => "Long",
            Type::Double => "Double",
            Type::Float => "Float",
            Type::Boolean => "Boolean",
            Type::Json => "Json",
        }
    }
}

/// A rules document as the client wrote it, after shape checks. Members keep the client's order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rules {
    pub ignore_empty_values: bool,
    /// `each`: where the list whose elements are mapped one by one is (SPEC §1.6).
    pub each: Option<Each>,
    pub new_body_fields: Vec<NewField>,
    pub old_body_fields: Vec<OldField>,
}

/// Where `each` finds its list: a path of names, or an expression (SPEC §1.8).
#[derive(Debug, Clone, PartialEq)]
pub enum Each {
    Path(Vec<String>),
    Expr(String),
}

/// One `newBodyFields` entry: an output member.
#[derive(Debug, Clone, PartialEq)]
pub struct NewField {
    pub id: String,
    /// The output member name (`None` when it was missing or invalid; the problem is recorded).
    pub key: Option<String>,
    pub ty: Option<Type>,
    pub position: Option<i64>,
}

/// One `oldBodyFields` entry: where a target's value comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct OldField {
    pub id: String,
    /// One entry per `keys` element; an entry holds one name, or several for a concatenation.
    /// Empty when the source is an expression.
    pub keys: Vec<KeyEntry>,
    pub parents: Vec<String>,
    /// `expr`: the expression that reads the value instead of `keys` and `parents` (SPEC §1.8).
    pub expr: Option<String>,
}

/// One `keys` element: a single field name, or `"a, b"` naming the parts of a concatenation.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyEntry {
    Field(String),
    Concat(Vec<String>),
}

impl KeyEntry {
    pub fn names(&self) -> &[String] {
        match self {
            KeyEntry::Field(name) => std::slice::from_ref(name),
            KeyEntry::Concat(names) => names,
        }
    }
}
