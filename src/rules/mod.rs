//! The rules language (SPEC §1): its source model, the parser that reads it from JSON, and the
//! compiler that turns it into a [`Plan`](crate::plan::Plan).
//!
//! Parsing and compiling never stop at the first problem: every problem is collected with a
//! JSON-pointer location into the rules document, and the caller gets all of them at once.

mod compile;
mod parse;

pub use compile::{Compiled, compile, compile_json, compile_value, read_json};
pub use parse::parse;

pub use crate::plan::{KeyEntry, Type};

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
    /// Bytes of the answer one call's mapping may write (`RECAST_MAX_RESPONSE_BYTES`).
    pub max_response_bytes: usize,
    /// Steps of work one call's mapping may take (`RECAST_MAX_MAPPING_STEPS`).
    pub max_mapping_steps: u64,
    /// Requests one call of a composed route may send, retries counted
    /// (`RECAST_MAX_SOURCE_CALLS`, SPEC §2.3).
    pub max_source_calls: usize,
}

/// The default of [`Limits::max_expr_bytes`]: 64 MiB.
pub const DEFAULT_MAX_EXPR_BYTES: usize = 64 << 20;

/// The default of [`Limits::max_response_bytes`]: 64 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 64 << 20;

/// The default of [`Limits::max_mapping_steps`] (`docs/behaviour.md` says how it was chosen).
pub const DEFAULT_MAX_MAPPING_STEPS: u64 = 4_000_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_rules: 1024,
            max_depth: 64,
            max_expr_bytes: DEFAULT_MAX_EXPR_BYTES,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            max_mapping_steps: DEFAULT_MAX_MAPPING_STEPS,
            max_source_calls: DEFAULT_MAX_SOURCE_CALLS,
        }
    }
}

/// The default of [`Limits::max_source_calls`].
pub const DEFAULT_MAX_SOURCE_CALLS: usize = 64;

/// Most problems one answer lists; a list cut short ends with a problem that counts the rest.
pub const MAX_LISTED: usize = 200;

/// The most problems reading or compiling one rules document collects: past them it stops
/// looking, so that a document of many mistakes costs what this many cost.
pub const MAX_PROBLEMS: usize = 1000;

/// The longest rule id a rules document may have, in bytes. Every problem of a rule carries its
/// id in its location: a longer one would make each of them that long.
pub const MAX_ID_BYTES: usize = 1024;

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
