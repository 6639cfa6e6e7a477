//! Where two JSON texts differ, as JSON pointers (RFC 6901): what a dry-run update answers
//! (SPEC §2.5). The order of an object's members counts (a rules document writes its targets
//! in the order given), so the texts are read into trees that keep it.

use super::ordered::Ordered as Tree;
use super::push_pointer;

/// The JSON pointers where `after` differs from `before`: a member added, removed or changed
/// (its own pointer), an object whose members are the same in another order (the object's), a
/// list of another length (the list's), a value of another kind or text (its own). Members of
/// `ignored` at the top level are not compared. An empty list: the same.
pub fn differences(before: &str, after: &str, ignored: &[&str]) -> Result<Vec<String>, String> {
    let read = |text: &str| -> Result<Tree, String> {
        // The texts are the service's own views, nested no deeper than a registration may be
        // (within the reader's 128 levels).
        let mut reader = serde_json::Deserializer::from_str(text);
        let tree: Tree = serde::Deserialize::deserialize(&mut reader).map_err(|e| e.to_string())?;
        Ok(match tree {
            Tree::Object(members) => Tree::Object(
                members.into_iter().filter(|(name, _)| !ignored.contains(&name.as_str())).collect(),
            ),
            other => other,
        })
    };
    let (before, after) = (read(before)?, read(after)?);
    let mut found = Vec::new();
    let mut at = String::new();
    compare(&before, &after, &mut at, &mut found);
    Ok(found)
}

fn compare(before: &Tree, after: &Tree, at: &mut String, found: &mut Vec<String>) {
    match (before, after) {
        (Tree::Object(old), Tree::Object(new)) => {
            // By name, in linear time: an object may hold many members (a body of a megabyte).
            let new_members: std::collections::HashMap<&str, &Tree> =
                new.iter().map(|(name, value)| (name.as_str(), value)).collect();
            let old_names: std::collections::HashSet<&str> =
                old.iter().map(|(name, _)| name.as_str()).collect();
            let same_names =
                old_names.len() == new_members.len() && old_names.iter().all(|n| new_members.contains_key(n));
            if same_names && old.iter().map(|(n, _)| n).ne(new.iter().map(|(n, _)| n)) {
                found.push(at.clone());
            }
            let len = at.len();
            for (name, value) in old {
                push_pointer(at, name);
                match new_members.get(name.as_str()) {
                    Some(other) => compare(value, other, at, found),
                    None => found.push(at.clone()),
                }
                at.truncate(len);
            }
            for (name, _) in new.iter().filter(|(name, _)| !old_names.contains(name.as_str())) {
                push_pointer(at, name);
                found.push(at.clone());
                at.truncate(len);
            }
        }
        (Tree::List(old), Tree::List(new)) if old.len() == new.len() => {
            let len = at.len();
            for (i, (a, b)) in old.iter().zip(new).enumerate() {
                at.push('/');
                at.push_str(&i.to_string());
                compare(a, b, at, found);
                at.truncate(len);
            }
        }
        (a, b) if a == b => {}
        _ => found.push(at.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::differences;

    #[test]
    fn every_difference_is_told_at_its_place() {
        let before = r#"{"a":1,"b":{"x":"1","y":[1,2]},"c":{"p":1,"q":2},"d":[1],"gone":true,"t":1}"#;
        let after = r#"{"a":1,"b":{"x":"2","y":[1,3]},"c":{"q":2,"p":1},"d":[1,2],"new":null,"t":2}"#;
        let found = differences(before, after, &["t"]).unwrap();
        assert_eq!(found, ["/b/x", "/b/y/1", "/c", "/d", "/gone", "/new"]);
        assert_eq!(differences(before, before, &[]).unwrap(), Vec::<String>::new());
        // Names with `/` and `~` are escaped as RFC 6901 says.
        assert_eq!(differences(r#"{"a/b~":1}"#, r#"{"a/b~":2}"#, &[]).unwrap(), ["/a~1b~0"]);
        // 1 and 1.0 are different texts of a number: told.
        assert_eq!(differences(r#"{"n":1}"#, r#"{"n":1.0}"#, &[]).unwrap(), ["/n"]);
        assert!(differences("{", "{}", &[]).is_err());
    }
}
