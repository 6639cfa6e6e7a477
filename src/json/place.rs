//! Where in a text a byte is, in the words a user who wrote the text looks for it by: its line
//! and column, and the member of the top-level object it falls in (`mappingRules`, ...).

use std::fmt;

use super::error::JsonError;

/// A place in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// From 1.
    pub line: usize,
    /// From 1, in characters.
    pub column: usize,
    /// The member of the top-level object whose value holds the place, when the text is an
    /// object and the place is inside one of its values.
    pub member: Option<String>,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)?;
        match &self.member {
            Some(member) => write!(f, " (in `{member}`)"),
            None => Ok(()),
        }
    }
}

/// Longest member name a place repeats.
const MAX_NAME: usize = 64;

/// The place of byte `at` of `text` (its end when `at` is past it).
pub fn place(text: &[u8], at: usize) -> Place {
    let at = at.min(text.len());
    let before = &text[..at];
    let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |n| n + 1);
    let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
    // Characters, not bytes: a UTF-8 continuation byte starts none.
    let column = 1 + before[line_start..].iter().filter(|&&b| b & 0xC0 != 0x80).count();
    Place { line, column, member: member_at(before) }
}

/// The member of the top-level object whose value the end of `before` is in.
fn member_at(before: &[u8]) -> Option<String> {
    let start = before.iter().position(|b| !b.is_ascii_whitespace())?;
    if before[start] != b'{' {
        return None;
    }
    let mut depth = 0usize;
    let mut string: Option<usize> = None;
    let mut escaped = false;
    // The last string closed at depth 1, and the member whose value is being read.
    let mut name: Option<(usize, usize)> = None;
    let mut member: Option<(usize, usize)> = None;
    for (i, &b) in before.iter().enumerate().skip(start) {
        if let Some(opened) = string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                string = None;
                if depth == 1 {
                    name = Some((opened + 1, i));
                }
            }
            continue;
        }
        match b {
            b'"' => string = Some(i),
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                // Past the top-level object: in no member of it.
                if depth == 0 {
                    member = None;
                }
            }
            b':' if depth == 1 => member = name.take(),
            b',' if depth == 1 => member = None,
            _ => {}
        }
    }
    let (from, to) = member?;
    let name = String::from_utf8_lossy(&before[from..to]);
    Some(name.chars().take(MAX_NAME).collect())
}

/// A JSON error in a text a user wrote, with its place: "line 3, column 14 (in `mappingRules`):
/// expected ',' or '}', found `]`".
pub fn described(text: &[u8], error: &JsonError) -> String {
    match error {
        JsonError::Syntax { what, at: Some(at) } => {
            let found = match text.get(*at..) {
                None | Some([]) => String::new(),
                Some(rest) => {
                    let shown: String = String::from_utf8_lossy(&rest[..rest.len().min(4)])
                        .chars()
                        .next()
                        .filter(|c| !c.is_control() && *c != char::REPLACEMENT_CHARACTER)
                        .map(String::from)
                        .unwrap_or_default();
                    if shown.is_empty() { String::new() } else { format!(", found `{shown}`") }
                }
            };
            format!("{}: {what}{found}", place(text, *at))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_is_its_line_column_and_top_level_member() {
        let text = "{\n  \"originalResponse\": {\"a\": [1, 2]},\n  \"mappingRules\": {\"x\": é}\n}";
        let at = |needle: &str| text.find(needle).unwrap();
        let p = place(text.as_bytes(), at("2]"));
        assert_eq!((p.line, p.column, p.member.as_deref()), (2, 33, Some("originalResponse")));
        let p = place(text.as_bytes(), at("é}") + 2);
        assert_eq!((p.line, p.column, p.member.as_deref()), (3, 26, Some("mappingRules")));
        // Between members, and before the object, no member holds the place.
        assert_eq!(place(text.as_bytes(), at("\n  \"mappingRules\"")).member, None);
        assert_eq!(place(text.as_bytes(), 0).member, None);
        // A name with a comma and a colon inside, and one that is escaped.
        let text = br#"{"a,b:c": 1, "d\"e": [tru"#;
        assert_eq!(place(text, text.len()).member.as_deref(), Some(r#"d\"e"#));
        assert_eq!(place(b"[1, 2", 5).member, None);
        assert_eq!(place(br#"{"a": 1} x"#, 9).member, None, "after the object");
    }

    #[test]
    fn an_error_is_described_by_its_place_and_what_was_found() {
        let text = b"{\"mappingRules\": {\"a\": 1,}}";
        let error = super::super::diagnose(text, 64).unwrap_err();
        assert_eq!(
            described(text, &error),
            "line 1, column 26 (in `mappingRules`): expected a member name, found `}`"
        );
        let error = super::super::diagnose(b"", 64).unwrap_err();
        assert_eq!(described(b"", &error), "line 1, column 1: the text ends where a value should be");
    }
}
