//! The structural index of a JSON text: where every token starts (the structural characters
//! `{}[]:,`, the opening quote of each string, the first character of each number or literal),
//! found sixty-four bytes at a time, with everything inside strings checked on the way (UTF-8,
//! control characters, escape sequences). What is left to check is the order of the tokens and
//! the text of numbers and literals, which [`validate`] does by walking the index.
//!
//! This is the first stage of on-demand evaluation ([`super::ondemand`]): the walk there jumps
//! from token to token, and skips a string without reading its characters, because they were
//! checked here.

use super::error::JsonError;
use super::simd::{self, Kernel};

/// Positions of the tokens of `input`, in order, into `out` (emptied first).
pub fn build(input: &[u8], out: &mut Vec<u32>) -> Result<(), JsonError> {
    out.clear();
    if input.len() >= u32::MAX as usize {
        return Err(JsonError::whole("the text is longer than 4 GiB"));
    }
    if simdutf8::basic::from_utf8(input).is_err() {
        return Err(JsonError::whole("the text is not UTF-8"));
    }
    let count = tokens(input, out, &mut Vec::new())?;
    out.truncate(count);
    Ok(())
}

/// [`build`] for a text already known to be UTF-8, also answering in `escapes` (emptied first)
/// where the backslash of each escape sequence is, in order. The tokens are the first `count`
/// positions of `out`, the count answered: the rest of `out` is room kept for the next text, so
/// that a buffer that is long enough is not written twice.
pub(super) fn build_str(input: &str, out: &mut Vec<u32>, escapes: &mut Vec<u32>) -> Result<usize, JsonError> {
    escapes.clear();
    if input.len() >= u32::MAX as usize {
        return Err(JsonError::whole("the text is longer than 4 GiB"));
    }
    tokens(input.as_bytes(), out, escapes)
}

/// The tokens of a UTF-8 text shorter than 4 GiB into the first positions of `out`, their count
/// answered, and where its escapes are, with the best kernel this processor has.
fn tokens(input: &[u8], out: &mut Vec<u32>, escapes: &mut Vec<u32>) -> Result<usize, JsonError> {
    simd::run(Tokens { input, out, escapes })
}

/// What the index of a text holds: its tokens and where its escapes are.
#[cfg(any(test, feature = "fuzzing"))]
#[derive(Debug, PartialEq, Eq)]
pub struct Found {
    pub tokens: Vec<u32>,
    pub escapes: Vec<u32>,
}

/// What [`tokens`] finds in `input` (UTF-8 or not) with the kernel asked for, or the error it
/// meets first. `None` when the processor lacks the kernel. For tests and fuzzing.
#[cfg(any(test, feature = "fuzzing"))]
pub fn build_with(choice: simd::Choice, input: &[u8]) -> Option<Result<Found, JsonError>> {
    let (mut out, mut escapes) = (Vec::new(), Vec::new());
    let found = simd::run_with(choice, Tokens { input, out: &mut out, escapes: &mut escapes })?;
    Some(found.map(|count| {
        out.truncate(count);
        Found { tokens: out, escapes }
    }))
}

/// Whether the kernels this processor has find the same tokens, escapes and first error in
/// `text`; `Err` with what differs. For tests and fuzzing.
#[cfg(any(test, feature = "fuzzing"))]
pub fn kernels_agree(text: &[u8]) -> Result<(), String> {
    let fallback = build_with(simd::Choice::Fallback, text);
    match build_with(simd::Choice::Avx2, text) {
        Some(avx2) if Some(&avx2) != fallback.as_ref() => {
            Err(format!("{:?}: avx2 {avx2:?}, fallback {fallback:?}", String::from_utf8_lossy(text)))
        }
        _ => Ok(()),
    }
}

/// Finding the tokens, as work a kernel runs.
struct Tokens<'a> {
    input: &'a [u8],
    out: &'a mut Vec<u32>,
    escapes: &'a mut Vec<u32>,
}

impl simd::Job for Tokens<'_> {
    type Output = Result<usize, JsonError>;

    /// `out` is first made long enough for any text of this length (a token per byte, and a
    /// block's worth of room written past the last).
    #[inline(always)]
    fn run<K: Kernel>(self, kernel: K) -> Result<usize, JsonError> {
        let Tokens { input, out, escapes } = self;
        let room = input.len() + 64;
        if out.len() < room {
            out.resize(room, 0);
        }
        let mut state = State::default();
        let mut blocks = input.chunks_exact(64);
        let mut base = 0;
        for block in blocks.by_ref() {
            let block: &[u8; 64] = block.try_into().map_err(|_| syntax("a block of 64 bytes", base))?;
            state.block(kernel, input, block, base, out, escapes)?;
            base += 64;
        }
        let rest = blocks.remainder();
        if !rest.is_empty() {
            // The last bytes, padded with spaces: a space starts no token and ends none inside a
            // string (an unclosed string is caught below).
            let mut last = [b' '; 64];
            last[..rest.len()].copy_from_slice(rest);
            state.block(kernel, input, &last, base, out, escapes)?;
        }
        if state.in_string != 0 {
            return Err(syntax("the string is not closed", input.len()));
        }
        Ok(state.count)
    }
}

pub(super) fn syntax(what: &str, at: usize) -> JsonError {
    JsonError::Syntax { what: what.to_owned(), at: Some(at) }
}

/// What one block leaves to the next.
#[derive(Default)]
struct State {
    /// Whether the next block's first character is escaped (this block ended in an odd run of
    /// backslashes inside a string).
    escaped: bool,
    /// All ones when this block ended inside a string, else zero.
    in_string: u64,
    /// Whether this block's last byte belongs to a number or literal.
    scalar: bool,
    /// Where the escape of the last low surrogate checked with its high surrogate is (0: none;
    /// no escape is at the start of a text).
    low_surrogate: usize,
    /// Tokens found so far.
    count: usize,
}

impl State {
    #[inline(always)]
    fn block<K: Kernel>(
        &mut self,
        kernel: K,
        input: &[u8],
        block: &[u8; 64],
        base: usize,
        out: &mut [u32],
        escapes_at: &mut Vec<u32>,
    ) -> Result<(), JsonError> {
        let c = kernel.classify(block);
        let escaped = self.escaped_chars(c.backslash);
        let quotes = c.quote & !escaped;
        // Each quote toggles: the bits from an opening quote up to (not including) its closing
        // quote are set.
        let in_string = kernel.prefix_xor(quotes) ^ self.in_string;
        self.in_string = ((in_string as i64) >> 63) as u64;
        if c.control & in_string != 0 {
            let at = base + (c.control & in_string).trailing_zeros() as usize;
            return Err(syntax("a control character in a string", at));
        }
        let mut escapes = c.backslash & in_string & !escaped;
        while escapes != 0 {
            let at = base + escapes.trailing_zeros() as usize;
            escapes_at.push(at as u32);
            // The low surrogate of a pair was checked with its high one.
            if at != self.low_surrogate
                && let Some(low) = escape(input, at)?
            {
                self.low_surrogate = low;
            }
            escapes &= escapes - 1;
        }
        let outside = !in_string & !quotes;
        let scalar = outside & !(c.structural | c.space);
        let scalar_starts = scalar & !(scalar << 1 | u64::from(self.scalar));
        self.scalar = scalar >> 63 == 1;
        let tokens = (c.structural & !in_string) | scalar_starts | (quotes & in_string);
        flatten(tokens, base as u32, out, &mut self.count);
        Ok(())
    }

    /// The characters that a backslash escapes. Blocks without backslashes, by far the most,
    /// take the first branch.
    #[inline(always)]
    fn escaped_chars(&mut self, backslash: u64) -> u64 {
        if backslash == 0 {
            return u64::from(std::mem::take(&mut self.escaped));
        }
        let carried = u64::from(self.escaped);
        let (escaped, next) = escaped_after_runs(backslash, carried);
        self.escaped = next;
        escaped
    }
}

/// Bits at even positions (0, 2, ...).
const EVEN: u64 = 0x5555_5555_5555_5555;

/// The characters escaped in a block with backslashes at `backslash`, when `carried` (0 or 1)
/// says the first one is escaped by the block before; and whether the next block's first is.
///
/// In a run of backslashes from `s`, the characters at an odd distance from `s` are escaped (the
/// second backslash of each pair, and the character after a run of odd length). Adding the
/// starts of the runs that begin at odd positions to the mask clears those runs, so what is
/// left, shifted by one, marks where the distance's parity is the other way round.
#[inline(always)]
fn escaped_after_runs(backslash: u64, carried: u64) -> (u64, bool) {
    // A backslash escaped by the block before starts nothing.
    let backslash = backslash & !carried;
    let follows = (backslash << 1) | carried;
    let odd_starts = backslash & !EVEN & !follows;
    let (sum, overflow) = odd_starts.overflowing_add(backslash);
    // A run from an odd position that reaches the block's end has an odd length so far.
    ((EVEN ^ (sum << 1)) & follows, overflow)
}

/// Writes the position of each set bit of `tokens`, `base` being bit 0's, into `out` after the
/// `count` already there, and adds them to `count`. Positions are written four at a time, past
/// the last one too (into room `out` has, overwritten next), which spares a branch per token.
#[inline(always)]
fn flatten(mut tokens: u64, base: u32, out: &mut [u32], count: &mut usize) {
    let found = tokens.count_ones() as usize;
    // Rounds of four write at most 64 positions: the first round that finds no bit left ends.
    let Some(positions) = out.get_mut(*count..*count + 64) else { return };
    let mut n = 0;
    while tokens != 0 {
        for _ in 0..4 {
            if let Some(slot) = positions.get_mut(n) {
                *slot = base + tokens.trailing_zeros();
            }
            tokens &= tokens.wrapping_sub(1);
            n += 1;
        }
    }
    *count += found;
}

/// Checks the escape sequence whose backslash is at `at`; for a surrogate pair, returns where
/// the low surrogate's escape is, checked with it.
fn escape(input: &[u8], at: usize) -> Result<Option<usize>, JsonError> {
    match input.get(at + 1) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(None),
        Some(b'u') => match code_unit(input, at)? {
            // A high surrogate must be followed by a low one: together they are one character.
            0xd800..=0xdbff => match code_unit(input, at + 6) {
                Ok(0xdc00..=0xdfff) => Ok(Some(at + 6)),
                _ => Err(syntax("a high surrogate without its low surrogate", at)),
            },
            0xdc00..=0xdfff => Err(syntax("a low surrogate alone", at)),
            _ => Ok(None),
        },
        _ => Err(syntax("an unknown escape", at)),
    }
}

/// The code unit of the `\uXXXX` escape at `at`.
fn code_unit(input: &[u8], at: usize) -> Result<u32, JsonError> {
    let Some([b'\\', b'u', hex @ ..]) = input.get(at..at + 6) else {
        return Err(syntax("\\u without four hex digits", at));
    };
    hex.iter().try_fold(0, |unit, &digit| {
        let value =
            char::from(digit).to_digit(16).ok_or_else(|| syntax("\\u without four hex digits", at))?;
        Ok(unit << 4 | value)
    })
}

/// Checks the number or literal that starts at `at` (its text runs to the next space or
/// structural character) and answers its text.
pub(super) fn scalar_text(input: &[u8], at: usize) -> Result<&[u8], JsonError> {
    let rest = input.get(at..).unwrap_or_default();
    let len = rest
        .iter()
        .position(|b| {
            matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b'{' | b'}' | b'[' | b']' | b':' | b',' | b'"')
        })
        .unwrap_or(rest.len());
    let text = &rest[..len];
    let ok = match text.first() {
        Some(b't') => text == b"true",
        Some(b'f') => text == b"false",
        Some(b'n') => text == b"null",
        Some(b'-' | b'0'..=b'9') => number(text),
        _ => false,
    };
    if ok { Ok(text) } else { Err(syntax("not a value", at)) }
}

/// Whether `text` is a JSON number whose value a double can hold (the parser refuses the others).
fn number(text: &[u8]) -> bool {
    let mut at = usize::from(text.first() == Some(&b'-'));
    let digits = |at: &mut usize| {
        let start = *at;
        while let Some(b'0'..=b'9') = text.get(*at) {
            *at += 1;
        }
        *at - start
    };
    match text.get(at) {
        Some(b'0') => at += 1,
        Some(b'1'..=b'9') => {
            digits(&mut at);
        }
        _ => return false,
    }
    if text.get(at) == Some(&b'.') {
        at += 1;
        if digits(&mut at) == 0 {
            return false;
        }
    }
    let mut exponent = 0;
    if let Some(b'e' | b'E') = text.get(at) {
        at += 1;
        if let Some(b'+' | b'-') = text.get(at) {
            at += 1;
        }
        exponent = digits(&mut at);
        if exponent == 0 {
            return false;
        }
    }
    // Fewer than 200 digits with an exponent of at most two cannot be beyond a double's range.
    at == text.len()
        && (exponent <= 2 && text.len() <= 200
            || std::str::from_utf8(text).ok().and_then(|t| t.parse::<f64>().ok()).is_some_and(f64::is_finite))
}

#[cfg(any(test, feature = "fuzzing"))]
/// The tokens of `input` by a walk a byte at a time that keeps its state as it goes: what
/// [`build`] must find, for tests and fuzzing.
pub fn reference(input: &[u8]) -> Vec<u32> {
    let mut tokens = Vec::new();
    let (mut in_string, mut escaped, mut scalar) = (false, false, false);
    for (i, &byte) in input.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            continue;
        }
        match byte {
            b'"' => {
                tokens.push(i as u32);
                in_string = true;
                scalar = false;
            }
            b'{' | b'}' | b'[' | b']' | b':' | b',' => {
                tokens.push(i as u32);
                scalar = false;
            }
            b' ' | b'\t' | b'\n' | b'\r' => scalar = false,
            _ => {
                if !scalar {
                    tokens.push(i as u32);
                }
                scalar = true;
            }
        }
    }
    tokens
}

/// Whether the index and the tape parser take `text` alike, when nested at most `max_depth`
/// deep; `Ok` with their verdict when they do, and then the index holds the tokens
/// [`reference`] finds; and every kernel finds the same ([`kernels_agree`]). A text with both a
/// syntax error and nesting too deep may be refused for either: with no bound on depth, both
/// must then find the syntax error. For tests and fuzzing.
#[cfg(any(test, feature = "fuzzing"))]
pub fn agrees_with_parser(text: &[u8], max_depth: usize) -> Result<bool, String> {
    kernels_agree(text)?;
    let verdicts = |depth: usize| {
        let mut buf = text.to_vec();
        let parsed = super::with_parsed(&mut buf, depth, |_| ());
        let mut index = Vec::new();
        let checked = build(text, &mut index).and_then(|()| super::ondemand::validate(text, &index, depth));
        (parsed, checked, index)
    };
    let (parsed, checked, index) = verdicts(max_depth);
    let differ = || format!("{:?}: parser {parsed:?}, index {checked:?}", String::from_utf8_lossy(text));
    match (&parsed, &checked) {
        (Ok(()), Ok(())) if index == reference(text) => Ok(true),
        (Ok(()), Ok(())) => Err(format!("{:?}: tokens {index:?}", String::from_utf8_lossy(text))),
        (Err(JsonError::TooDeep { .. }), Err(JsonError::TooDeep { .. }))
        | (Err(JsonError::Syntax { .. }), Err(JsonError::Syntax { .. })) => Ok(false),
        (Err(_), Err(_)) => match verdicts(text.len() + 1) {
            (Err(JsonError::Syntax { .. }), Err(JsonError::Syntax { .. }), _) => Ok(false),
            _ => Err(differ()),
        },
        _ => Err(differ()),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Texts of every length around one and two blocks, at every alignment, whole or cut short,
    /// with a string, an escape, a number or a character of several bytes across each boundary:
    /// every kernel finds the same as the others, and the verdict is the parser's.
    #[test]
    fn every_kernel_finds_the_same_at_every_length_and_alignment() {
        let mut texts = Vec::new();
        for len in 0..=140 {
            let filler = "x".repeat(len);
            texts.push(format!(r#"["{filler}"]"#));
            texts.push(format!(r#"{{"{filler}\"":[1,2.5e-3,true]}}"#));
            texts.push(format!(r#"[{}1234567890, "\u00e9\\"]"#, " ".repeat(len)));
            texts.push(format!(r#"["{}\\\"", null]"#, "y".repeat(len)));
            texts.push(format!("[\"{filler}\u{e9}\u{1f600}\", {{}}]"));
        }
        for text in &texts {
            let bytes = text.as_bytes();
            for cut in [bytes.len(), bytes.len().saturating_sub(1), bytes.len() / 2] {
                let text = &bytes[..cut];
                // The same text at each of 32 offsets in a buffer.
                let mut buffer = vec![b' '; text.len() + 32];
                for offset in 0..32 {
                    buffer[offset..offset + text.len()].copy_from_slice(text);
                    let at = &buffer[offset..offset + text.len()];
                    agrees_with_parser(at, 16).unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
    }

    #[test]
    fn tokens_are_found_across_blocks_escapes_and_strings() {
        let texts = [
            r#"{"a":[1,-2.5e3,true,null,{"b":"x\"y\\"}],"c":"0123456789abcdefghij","d":{}}"#.to_owned(),
            format!(r#"["{}\\", 12, "{}\"", "\\\\\\"]"#, "x".repeat(61), "y".repeat(63)),
            format!("[{}1, 2]", " ".repeat(62)),
            format!(r#"["{}\\\\", true]"#, "z".repeat(60)),
            // Blocks where every byte is a token, and where all but a few are.
            format!("[{}[]]", "[],".repeat(50)),
            format!("[{}1]", "1,".repeat(100)),
        ];
        for text in texts {
            let mut index = Vec::new();
            build(text.as_bytes(), &mut index).unwrap();
            assert_eq!(index, reference(text.as_bytes()), "{text}");
            assert_eq!(agrees_with_parser(text.as_bytes(), 16), Ok(true), "{text}");
        }
    }

    #[test]
    fn it_takes_and_refuses_what_the_parser_does() {
        let cases: &[&[u8]] = &[
            b"[1,]",
            br#"{"a":1,}"#,
            b"[01]",
            b"[1.]",
            b"[.5]",
            b"[1e]",
            b"[1e+]",
            b"[-]",
            b"[+1]",
            b"[- 1]",
            br#"["\x"]"#,
            br#"["\u12"]"#,
            br#"["\u12G4"]"#,
            b"[tru]",
            b"[nul]",
            b"[True]",
            b"[\"a\x01\"]",
            b"[1 2]",
            br#"{"a" 1}"#,
            b"{1:2}",
            br#"{"a":}"#,
            b"[Infinity]",
            b"[NaN]",
            b"",
            b" ",
            b"[] []",
            b"[",
            b"{",
            b"\"abc",
            b"[\"\xff\"]",
            b"[\xc3]",
            b"[\"\xed\xa0\x80\"]",
            b"[1]x",
            b"[1]\x00",
            b"\x00",
            br#"["\uD800"]"#,
            br#"["\uDC00\uD800"]"#,
            br#"["\uD83D\uDE00"]"#,
            br#"["\u0000"]"#,
            b"[1e309]",
            b"[-1e309]",
            b"[1e-400]",
            b"[-0]",
            b"[-0.0e-0]",
            b"[1E+2]",
            b"[123456789012345678901234567890]",
            b"[-9223372036854775809]",
            b"[18446744073709551616]",
            br#""\u00e9""#,
            br#" {"a" : [ true , false , null ] } "#,
            b"[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]",
            b"[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]",
            br#"{"a":{"a":{"a":{}}}}"#,
            b"\"a\tb\"",
            br#""a\/b""#,
            b"[\"\xe2\x80\xa8\"]",
            b"\xef\xbb\xbf[]",
            b"[1]\n",
            b"\t[1]\r\n",
            br#"["0123456789abcdef\"0123456789abcdef"]"#,
            b"[\"0123456789abcde\x1f\"]",
            b"[1\"a\"]",
            b"[\"a\"1]",
            b"{\"a\":1\"b\":2}",
            b"[\"a\"\"b\"]",
            b"[truefalse]",
            b"[1]]",
            b"[[1]",
            b"{\"a\":1}}",
            b"[\\]",
            b"[1,,2]",
            b"[,1]",
            b"{,}",
            b"{\"a\"}",
            b"{\"a\":1:2}",
            b"[\x0b]",
            b"[1\x0c]",
            b"\"\\\"",
        ];
        let mut taken = 0;
        for case in cases {
            taken += usize::from(agrees_with_parser(case, 16).unwrap_or_else(|e| panic!("{e}")));
        }
        assert!(taken > 10 && taken < cases.len() - 10, "{taken} of {}", cases.len());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

        /// A valid text with a few bytes changed, dropped or added: the same verdict as the
        /// parser, and the tokens the reference finds where the text still parses.
        #[test]
        fn damaged_texts_are_indexed_and_judged_alike(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..3, any::<u8>()), 0..4),
            pick in 0usize..4,
            indent in 0usize..70,
        ) {
            let valid = [
                r#"{"a":[1,-2.5e3,true,null,{"b":"x\"y\u00e9"}],"c":"0123456789abcdefghij","d":{}}"#,
                r#"[0, 1.25, -0, 1E9, "", " ", "\\", "\ud83d\ude00", [[]], {"": ""}, "\\\""]"#,
                r#"{"meals":[{"idMeal":"52772","strMeal":"Teriyaki Chicken Casserole","n":17}]}"#,
                "\"plain text of some length, without escapes at all, longer than one block of sixty-four\"",
            ][pick];
            let mut text = format!("{}{valid}", " ".repeat(indent)).into_bytes();
            for (at, kind, byte) in edits {
                let i = at.index(text.len() + 1);
                match kind {
                    0 if i < text.len() => text[i] = byte,
                    1 if i < text.len() => { text.remove(i); }
                    _ => text.insert(i, byte),
                }
            }
            agrees_with_parser(&text, 16).map_err(TestCaseError::fail)?;
        }

        /// The escaped characters by adding runs are those a walk bit by bit finds.
        #[test]
        fn escapes_are_found_as_a_walk_finds_them(backslash in any::<u64>(), sparse in any::<u64>(), carried in any::<bool>()) {
            for mask in [backslash, backslash & sparse, backslash | sparse] {
                let mut escaped = 0;
                let mut pending = carried;
                for i in 0..64 {
                    if pending {
                        escaped |= 1 << i;
                        pending = false;
                    } else if mask >> i & 1 == 1 {
                        pending = true;
                    }
                }
                prop_assert_eq!(escaped_after_runs(mask, u64::from(carried)), (escaped, pending), "{:#066b}", mask);
            }
        }

        /// Numbers of every shape and size, in range or not: taken or refused alike.
        #[test]
        fn numbers_are_judged_alike(
            number in r"-?(0|[1-9][0-9]{0,25}|[1-9][0-9]{290,330})(\.[0-9]{1,30})?([eE][+-]?[0-9]{1,4})?",
        ) {
            agrees_with_parser(format!("[{number}]").as_bytes(), 16).map_err(TestCaseError::fail)?;
        }
    }
}
