//! "Did you mean ...?": the name closest to one that is not known, among those that are, when
//! one is close enough to be the one meant (a typo, another case, a swapped pair of letters).

/// Longest name compared: past it, no suggestion (the distance costs the product of the lengths).
const MAX_LEN: usize = 64;

/// The name among `known` closest to `name`, if it is close enough to be a typo of it: at most
/// none but case for names of one or two characters, one edit up to four, two up to eight, three beyond. A name that
/// differs only in case is always close, and closer than any other. Ties go to the first.
pub fn closest<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let wanted: Vec<char> = name.chars().map(|c| c.to_ascii_lowercase()).collect();
    let len = wanted.len();
    if len == 0 || len > MAX_LEN {
        return None;
    }
    let allowed = match len {
        0..=2 => 0,
        3..=4 => 1,
        5..=8 => 2,
        _ => 3,
    };
    let mut best: Option<(usize, &str)> = None;
    // One buffer and one table for every candidate: a comparison allocates nothing.
    let mut candidate_chars = Vec::with_capacity(MAX_LEN);
    let mut rows = Rows::default();
    for candidate in known {
        // Lengths that differ by more edits than allowed rule a candidate out before any work
        // (bytes first: a character takes at most four).
        if candidate == name
            || candidate.len().abs_diff(name.len()) > 4 * allowed
            || candidate.len() > 4 * MAX_LEN
        {
            continue;
        }
        candidate_chars.clear();
        candidate_chars.extend(candidate.chars().map(|c| c.to_ascii_lowercase()));
        if candidate_chars.len() > MAX_LEN || candidate_chars.len().abs_diff(len) > allowed {
            continue;
        }
        // Only a candidate closer than the best so far is of use.
        let within = best.map_or(allowed, |(b, _)| b.saturating_sub(1));
        if best.is_some_and(|(b, _)| b == 0) {
            break;
        }
        if let Some(d) = rows.distance_within(&wanted, &candidate_chars, within) {
            best = Some((d, candidate));
        }
    }
    best.map(|(_, candidate)| candidate)
}

/// The rows of the edit table [`Rows::distance_within`] fills, kept from one comparison to the next.
#[derive(Default)]
struct Rows {
    two_back: Vec<usize>,
    one_back: Vec<usize>,
    row: Vec<usize>,
}

impl Rows {
    /// Edits (insert, delete, replace, swap two neighbours) from `a` to `b`, when at most `k`:
    /// only the cells within `k` of the diagonal are filled (a cell further out costs more than
    /// `k`), and the comparison stops once a whole row is past `k`.
    fn distance_within(&mut self, a: &[char], b: &[char], k: usize) -> Option<usize> {
        const FAR: usize = usize::MAX / 2;
        if a.len().abs_diff(b.len()) > k {
            return None;
        }
        let width = b.len() + 1;
        for row in [&mut self.two_back, &mut self.one_back, &mut self.row] {
            row.clear();
            row.resize(width, FAR);
        }
        for (j, cell) in self.one_back.iter_mut().enumerate().take(k + 1) {
            *cell = j;
        }
        for i in 1..=a.len() {
            let from = i.saturating_sub(k).max(1);
            let to = (i + k).min(b.len());
            self.row.fill(FAR);
            if i <= k {
                self.row[0] = i;
            }
            let mut least = self.row[0];
            for j in from..=to {
                let replace = self.one_back[j - 1] + usize::from(a[i - 1] != b[j - 1]);
                let mut best = replace.min(self.one_back[j] + 1).min(self.row[j - 1] + 1);
                if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                    best = best.min(self.two_back[j - 2] + 1);
                }
                self.row[j] = best;
                least = least.min(best);
            }
            if least > k {
                return None;
            }
            std::mem::swap(&mut self.two_back, &mut self.one_back);
            std::mem::swap(&mut self.one_back, &mut self.row);
        }
        Some(self.one_back[b.len()]).filter(|&d| d <= k)
    }
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
    fn distance_counts_edits_and_swaps_within_its_bound() {
        let distance = |a: &str, b: &str, k: usize| {
            let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
            Rows::default().distance_within(&a, &b, k)
        };
        assert_eq!(distance("", "abc", 3), Some(3));
        assert_eq!(distance("kitten", "sitting", 3), Some(3));
        assert_eq!(distance("kitten", "sitting", 2), None);
        assert_eq!(distance("ab", "ba", 1), Some(1));
        assert_eq!(distance("abc", "abc", 0), Some(0));
        assert_eq!(distance("é", "e", 1), Some(1));
        assert_eq!(distance("abcdef", "abcxyz", 2), None);
        // Every pair of short words over a small alphabet agrees with the whole table.
        let words: Vec<String> = (0..200u32)
            .map(|n| (0..(n % 6)).map(|i| char::from(b'a' + ((n >> i) % 3) as u8)).collect())
            .collect();
        for a in &words {
            for b in &words {
                let full = full_distance(a, b);
                for k in 0..4 {
                    assert_eq!(distance(a, b, k), Some(full).filter(|&d| d <= k), "{a:?} {b:?} within {k}");
                }
            }
        }
    }

    /// The whole table, as a reference.
    fn full_distance(a: &str, b: &str) -> usize {
        let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
        let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
        for (i, row) in d.iter_mut().enumerate() {
            row[0] = i;
        }
        for (j, cell) in d[0].iter_mut().enumerate() {
            *cell = j;
        }
        for i in 1..=a.len() {
            for j in 1..=b.len() {
                let replace = d[i - 1][j - 1] + usize::from(a[i - 1] != b[j - 1]);
                let mut best = replace.min(d[i - 1][j] + 1).min(d[i][j - 1] + 1);
                if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                    best = best.min(d[i - 2][j - 2] + 1);
                }
                d[i][j] = best;
            }
        }
        d[a.len()][b.len()]
    }
}
