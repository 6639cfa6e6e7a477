//! "Did you mean ...?": the name closest to one that is not known, among those that are, when
//! one is close enough to be the one meant (a typo, another case, a swapped pair of letters).

/// Longest name compared: past it, no suggestion (the distance costs the product of the lengths).
const MAX_LEN: usize = 64;

/// The name among `known` closest to `name`, if it is close enough to be a typo of it: at most
/// none but case for names of one or two characters, one edit up to four, two up to eight, three beyond. A name that
/// differs only in case is always close, and closer than any other. Ties go to the first.
pub fn closest<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let len = name.chars().count();
    if len == 0 || len > MAX_LEN {
        return None;
    }
    let allowed = match len {
        0..=2 => 0,
        3..=4 => 1,
        5..=8 => 2,
        _ => 3,
    };
    let lower = name.to_lowercase();
    let mut best: Option<(usize, &str)> = None;
    for candidate in known {
        // Lengths that differ by more edits than allowed rule a candidate out before any work
        // (bytes first: a character takes at most four).
        if candidate == name
            || candidate.len() > 4 * MAX_LEN
            || candidate.len().abs_diff(name.len()) > 4 * allowed
        {
            continue;
        }
        let candidate_len = candidate.chars().count();
        if candidate_len > MAX_LEN || candidate_len.abs_diff(len) > allowed {
            continue;
        }
        let d = if candidate.eq_ignore_ascii_case(name) || candidate.to_lowercase() == lower {
            0
        } else {
            distance(&lower, &candidate.to_lowercase())
        };
        if d <= allowed && best.is_none_or(|(b, _)| d < b) {
            best = Some((d, candidate));
        }
    }
    best.map(|(_, candidate)| candidate)
}

/// Edits (insert, delete, replace, swap two neighbours) from `a` to `b`, by character.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows of the table: two back, one back, this one.
    let mut two_back = vec![0usize; b.len() + 1];
    let mut one_back: Vec<usize> = (0..=b.len()).collect();
    let mut row = vec![0usize; b.len() + 1];
    for i in 1..=a.len() {
        row[0] = i;
        for j in 1..=b.len() {
            let replace = one_back[j - 1] + usize::from(a[i - 1] != b[j - 1]);
            let mut best = replace.min(one_back[j] + 1).min(row[j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(two_back[j - 2] + 1);
            }
            row[j] = best;
        }
        std::mem::swap(&mut two_back, &mut one_back);
        std::mem::swap(&mut one_back, &mut row);
    }
    one_back[b.len()]
}

/// "unknown member `kyes`; did you mean `keys`? The known members are keys, parents, expr, type":
/// an unknown `name` of a kind (`what`: "member", "type", ...), the one probably meant, and all
/// that are known.
pub fn unknown(what: &str, name: &str, known: &[&str]) -> String {
    let listed = known.join(", ");
    match closest(name, known.iter().copied()) {
        Some(meant) => {
            format!("unknown {what} `{name}`; did you mean `{meant}`? The known {what}s are {listed}")
        }
        None => format!("unknown {what} `{name}`; the known {what}s are {listed}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_case_and_swaps_find_the_name_meant() {
        let members = ["originalApi", "path", "method", "headers", "queries", "body", "authHeader"];
        assert_eq!(closest("originalAPI", members), Some("originalApi"));
        assert_eq!(closest("heders", members), Some("headers"));
        assert_eq!(closest("qeuries", members), Some("queries"));
        assert_eq!(closest("kyes", ["keys", "parents", "expr", "type"]), Some("keys"));
        assert_eq!(closest("tilte", ["title", "tags"]), Some("title"));
        assert_eq!(closest("Title", ["titles", "title"]), Some("title"));
        // Nothing close: no guess.
        assert_eq!(closest("colour", members), None);
        assert_eq!(closest("x", ["keys", "type"]), None);
        assert_eq!(closest("", ["a"]), None);
        assert_eq!(closest("path", members), None, "a known name needs no suggestion");
        assert_eq!(
            unknown("type", "Strng", &["String", "Int"]),
            "unknown type `Strng`; did you mean `String`? The known types are String, Int"
        );
        assert_eq!(unknown("member", "x", &["a", "b"]), "unknown member `x`; the known members are a, b");
    }

    #[test]
    fn distance_counts_edits_and_swaps() {
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("ab", "ba"), 1);
        assert_eq!(distance("abc", "abc"), 0);
        assert_eq!(distance("é", "e"), 1);
    }
}
