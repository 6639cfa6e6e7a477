//! Why a byte string is not a document recast accepts.

/// Why a byte string is not a document recast accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonError {
    /// Not JSON at all (syntax, encoding): what is wrong, in words, and at which byte when it
    /// is at one.
    Syntax { what: String, at: Option<usize> },
    /// Valid JSON nested deeper than the configured limit.
    TooDeep { limit: usize },
}

impl JsonError {
    /// A syntax error of no one byte (the encoding, the length).
    pub fn whole(what: &str) -> JsonError {
        JsonError::Syntax { what: what.to_owned(), at: None }
    }
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JsonError::Syntax { what, at: Some(at) } => write!(f, "{what} at byte {at}"),
            JsonError::Syntax { what, at: None } => f.write_str(what),
            JsonError::TooDeep { limit } => {
                write!(f, "JSON nested deeper than {limit} levels")
            }
        }
    }
}

impl std::error::Error for JsonError {}
