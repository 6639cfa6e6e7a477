//! What an upstream answer's own headers say about keeping it (RFC 9111), as far as recast's cache
//! of mapped answers uses them: `Cache-Control`, `Age` and `Vary`.
//!
//! The lines are read one way whatever their number, order or size. A field split over several
//! lines is the same list as one line holding them all (RFC 9110 §5.3); a directive given twice
//! with different values counts at its smallest, as does `Age` at its largest, so that the answer
//! is kept for the shortest time any of them allows. Numbers are RFC 9111 delta-seconds: digits
//! only, and a value too large to represent, or any sum that would overflow, counts as
//! [`MAX_DELTA_SECONDS`] (§1.2.2). No input can make the arithmetic overflow.

/// The largest number of seconds recast represents: 2^31, as RFC 9111 §1.2.2 says a cache uses for
/// anything larger.
pub const MAX_DELTA_SECONDS: u64 = 1 << 31;

/// What an answer's headers say about caching it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Freshness {
    /// `no-store`, `private` or `no-cache` (recast does not revalidate), or `Vary: *`: never
    /// reused.
    pub no_store: bool,
    /// The smallest `max-age`; a malformed one is 0 (stale at once, RFC 9111 §4.2.1).
    max_age: Option<u64>,
    /// The smallest `s-maxage`, which a shared cache takes over `max-age`.
    s_maxage: Option<u64>,
    /// `must-revalidate` or `proxy-revalidate`.
    must_revalidate: bool,
    /// The largest `Age`: seconds the answer already spent in caches upstream.
    age: u64,
}

impl Freshness {
    /// Reads `(name, value)` header lines; other fields are passed over.
    pub fn of<'a>(lines: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Freshness {
        let mut freshness = Freshness::default();
        for (name, value) in lines {
            freshness.line(name, value);
        }
        freshness
    }

    /// What several answers joined into one say together (a paged upstream's pages): never
    /// reused if any says so, the smallest lifetimes, the largest age, revalidation if any asks.
    pub fn join(self, other: Freshness) -> Freshness {
        let least = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Freshness {
            no_store: self.no_store || other.no_store,
            max_age: least(self.max_age, other.max_age),
            s_maxage: least(self.s_maxage, other.s_maxage),
            must_revalidate: self.must_revalidate || other.must_revalidate,
            age: self.age.max(other.age),
        }
    }

    /// Takes in one header line, if it is one of the fields read here.
    pub fn line(&mut self, name: &[u8], value: &[u8]) {
        if name.eq_ignore_ascii_case(b"cache-control") {
            self.cache_control(value);
        } else if name.eq_ignore_ascii_case(b"age") {
            self.age_line(value);
        } else if name.eq_ignore_ascii_case(b"vary") {
            self.vary(value);
        }
    }

    /// Takes in one `Cache-Control` line (a list of directives, RFC 9111 §5.2).
    fn cache_control(&mut self, value: &[u8]) {
        for directive in value.split(|&b| b == b',') {
            let directive = directive.trim_ascii();
            let (name, argument) = match directive.iter().position(|&b| b == b'=') {
                Some(at) => (directive[..at].trim_ascii(), directive[at + 1..].trim_ascii()),
                None => (directive, &[][..]),
            };
            // A quoted argument is read as its content (RFC 9111 §5.2 allows either form).
            let argument =
                argument.strip_prefix(b"\"").and_then(|a| a.strip_suffix(b"\"")).unwrap_or(argument);
            let seconds = || delta_seconds(argument).unwrap_or(0);
            if name.eq_ignore_ascii_case(b"no-store")
                || name.eq_ignore_ascii_case(b"private")
                || name.eq_ignore_ascii_case(b"no-cache")
            {
                self.no_store = true;
            } else if name.eq_ignore_ascii_case(b"must-revalidate")
                || name.eq_ignore_ascii_case(b"proxy-revalidate")
            {
                self.must_revalidate = true;
            } else if name.eq_ignore_ascii_case(b"max-age") {
                self.max_age = Some(self.max_age.map_or(seconds(), |earlier| earlier.min(seconds())));
            } else if name.eq_ignore_ascii_case(b"s-maxage") {
                self.s_maxage = Some(self.s_maxage.map_or(seconds(), |earlier| earlier.min(seconds())));
            }
        }
    }

    /// Takes in an `Age` line. `Age` holds one number; a line that holds a list counts at its
    /// largest, like several lines, and what is not a number counts as nothing.
    fn age_line(&mut self, value: &[u8]) {
        for item in value.split(|&b| b == b',') {
            if let Some(age) = delta_seconds(item.trim_ascii()) {
                self.age = self.age.max(age);
            }
        }
    }

    /// Takes in a `Vary` line: `*` means the answer depends on more than the request says.
    fn vary(&mut self, value: &[u8]) {
        if value.split(|&b| b == b',').any(|field| field.trim_ascii() == b"*") {
            self.no_store = true;
        }
    }

    /// How long a shared cache may use the answer from when the upstream made it: `s-maxage`
    /// (RFC 9111 §5.2.2.10), else `max-age`; `None` when the upstream says neither.
    pub fn lifetime(&self) -> Option<u64> {
        self.s_maxage.or(self.max_age)
    }

    /// Seconds the answer already spent in caches upstream, at most [`MAX_DELTA_SECONDS`].
    pub fn age(&self) -> u64 {
        self.age
    }

    /// How many more seconds the upstream lets it be fresh; `None` when it does not say.
    pub fn fresh_for(&self) -> Option<u64> {
        self.lifetime().map(|lifetime| lifetime.saturating_sub(self.age))
    }

    /// Whether it may be answered once stale: not after `must-revalidate`, `proxy-revalidate`
    /// or `s-maxage` (which implies `proxy-revalidate` for a shared cache).
    pub fn may_be_stale(&self) -> bool {
        !self.must_revalidate && self.s_maxage.is_none()
    }
}

/// RFC 9111 delta-seconds: one or more digits and nothing else; values past
/// [`MAX_DELTA_SECONDS`] are that.
fn delta_seconds(text: &[u8]) -> Option<u64> {
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut value: u64 = 0;
    for digit in text {
        value = value.saturating_mul(10).saturating_add(u64::from(digit - b'0'));
        if value >= MAX_DELTA_SECONDS {
            return Some(MAX_DELTA_SECONDS);
        }
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(lines: &[(&str, &str)]) -> Freshness {
        Freshness::of(lines.iter().map(|(name, value)| (name.as_bytes(), value.as_bytes())))
    }

    #[test]
    fn cache_control_directives_are_read_case_blind() {
        assert_eq!(of(&[]), Freshness::default());
        assert_eq!(of(&[]).lifetime(), None);
        assert_eq!(of(&[("cache-control", "public, Max-Age=60")]).lifetime(), Some(60));
        assert_eq!(of(&[("Cache-Control", "max-age=\"30\"")]).lifetime(), Some(30), "quoted");
        for malformed in ["max-age=soon", "max-age=", "max-age", "max-age=+5", "max-age=-5", "max-age=1.5"] {
            assert_eq!(of(&[("cache-control", malformed)]).lifetime(), Some(0), "{malformed}: stale");
        }
        for never in
            ["no-store", "PRIVATE", "private=\"x-user\"", "no-cache", "public, no-cache=\"set-cookie\""]
        {
            assert!(of(&[("cache-control", never)]).no_store, "{never}");
        }
        assert!(!of(&[("cache-control", "must-revalidate")]).may_be_stale());
        assert!(of(&[("vary", "accept, *")]).no_store);
        assert!(!of(&[("vary", "accept-language")]).no_store);
        assert!(of(&[("x-other", "no-store")]) == Freshness::default());
    }

    #[test]
    fn s_maxage_wins_over_max_age_and_forbids_stale_answers() {
        let shared = of(&[("cache-control", "max-age=5, s-maxage=100")]);
        assert_eq!((shared.lifetime(), shared.may_be_stale()), (Some(100), false));
        assert!(of(&[("cache-control", "max-age=5")]).may_be_stale());
    }

    #[test]
    fn one_line_or_several_read_the_same_and_the_smallest_freshness_wins() {
        let cases: [&[(&str, &str)]; 2] = [
            &[("cache-control", "max-age=60, s-maxage=100, max-age=10, s-maxage=30"), ("age", "5, 20")],
            &[
                ("cache-control", "max-age=60"),
                ("cache-control", "s-maxage=100"),
                ("cache-control", "max-age=10"),
                ("cache-control", "s-maxage=30"),
                ("age", "5"),
                ("age", "20"),
            ],
        ];
        for lines in cases {
            let freshness = of(lines);
            assert_eq!(
                (freshness.lifetime(), freshness.age(), freshness.fresh_for()),
                (Some(30), 20, Some(10))
            );
        }
        // The order of the lines does not matter either.
        let reversed: Vec<_> = cases[1].iter().rev().copied().collect();
        assert_eq!(of(&reversed), of(cases[1]));
    }

    #[test]
    fn numbers_of_any_size_saturate_at_two_to_the_31() {
        let huge = "18446744073709551615";
        let longer = "9".repeat(400);
        for value in [huge, longer.as_str(), "2147483648", "2147483649"] {
            let freshness = of(&[("age", value), ("cache-control", &format!("max-age={value}"))]);
            assert_eq!(freshness.age(), MAX_DELTA_SECONDS, "{value}");
            assert_eq!(freshness.lifetime(), Some(MAX_DELTA_SECONDS), "{value}");
            assert_eq!(freshness.fresh_for(), Some(0), "{value}");
        }
        assert_eq!(of(&[("age", "2147483647")]).age(), MAX_DELTA_SECONDS - 1);
        assert_eq!(of(&[("age", " 42 ")]).age(), 42);
        assert_eq!(of(&[("age", "-1")]).age(), 0);
        assert_eq!(of(&[("age", "0x10")]).age(), 0);
        // An age past the lifetime leaves no freshness, never a negative one.
        assert_eq!(of(&[("age", "100"), ("cache-control", "max-age=10")]).fresh_for(), Some(0));
    }
}
