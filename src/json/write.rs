//! Writing JSON text straight into a byte buffer: strings with correct escaping, integers with
//! every digit, floats in shortest round-trip form, and whole values copied from a tape.

use std::marker::PhantomData;

use simd_json::StaticNode;

/// The buffer a parsed document's strings point into, padding included (simd-json parses in
/// place, so every string of a tape lies inside it). A string inside it can be read in whole
/// [`chunk::LEN`]-byte chunks, past its own end, without a branch on its length: the padding
/// keeps such reads inside the buffer.
///
/// The reads go through the buffer's own pointer (the one the parser's slice was made from), not
/// through the string's, so they stay within what that pointer may access.
#[derive(Clone, Copy)]
pub struct Backing<'a> {
    start: *const u8,
    len: usize,
    /// A second buffer (null and 0 when none): where a text read on demand has its unescaped
    /// strings.
    other: *const u8,
    other_len: usize,
    /// The length of the text or texts the document was read from.
    read: usize,
    /// Whether the strings in the first buffer need no escaping: a text read on demand, whose
    /// strings without escape sequences point into it (so hold no `"`, `\` or control
    /// character), while the others were unescaped into the second buffer.
    clean: bool,
    buffer: PhantomData<&'a [u8]>,
}

impl<'a> Backing<'a> {
    /// The length of the text the document was read from.
    pub fn text_len(&self) -> usize {
        self.read
    }

    /// The same backing, for a document read from texts `read` bytes long in all (a composed
    /// route's answers, of which the backing holds one).
    pub(super) fn reading(self, read: usize) -> Backing<'a> {
        Backing { read, ..self }
    }

    /// No buffer: every string is written by the general path.
    pub const NONE: Backing<'static> = Backing {
        start: std::ptr::null(),
        len: 0,
        other: std::ptr::null(),
        other_len: 0,
        read: 0,
        clean: false,
        buffer: PhantomData,
    };

    /// The whole of `input` as the slice the parser fills, and its backing for the strings the
    /// parser leaves in it. Both borrow `input`, so it cannot change while either is used.
    pub(super) fn split(input: &'a mut Vec<u8>) -> (&'a mut [u8], Backing<'a>) {
        let len = input.len();
        let start = input.as_mut_ptr();
        // SAFETY: `start` points at the `len` initialised bytes of `input` (`Vec::as_mut_ptr`
        // makes no reference to them, so the pointer stays usable beside the slice made from
        // it). The slice is the only way to write them while `input` is borrowed for 'a; the
        // backing only reads, after the parser is done writing.
        let buffer = unsafe { std::slice::from_raw_parts_mut(start, len) };
        (buffer, Backing { start, len, read: len, ..Backing::NONE })
    }

    /// The backing of strings that lie in `text`, a JSON text read without being written to, or
    /// in `other`, the buffer its unescaped strings were written to ([`super::ondemand`]). It
    /// borrows both, which cannot change while it is used.
    ///
    /// Every string written from `text` is copied as it is, unchecked: the caller points into
    /// `text` only with the characters of strings that have no escape sequence, and with the
    /// text of numbers and literals, none of which has a byte that needs escaping.
    pub(super) fn of(text: &'a [u8], other: &'a [u8]) -> Backing<'a> {
        Backing {
            start: text.as_ptr(),
            len: text.len(),
            other: other.as_ptr(),
            other_len: other.len(),
            read: text.len(),
            clean: true,
            buffer: PhantomData,
        }
    }

    /// A pointer to the first byte of `bytes` that may read `bytes.len() + chunk::LEN` bytes, when
    /// `bytes` and that many bytes after it lie inside one of the buffers, and whether they need
    /// no escaping (see [`Backing::of`]).
    #[inline(always)]
    fn widened(self, bytes: &[u8]) -> Option<(*const u8, bool)> {
        let within = |start: *const u8, len: usize| {
            let offset = bytes.as_ptr().addr().wrapping_sub(start.addr());
            let inside = offset <= len && len - offset >= bytes.len() + chunk::LEN;
            // `wrapping_add` keeps the buffer pointer's provenance; the offset is within the buffer.
            inside.then(|| start.wrapping_add(offset))
        };
        match within(self.start, self.len) {
            Some(from) => Some((from, self.clean)),
            None => within(self.other, self.other_len).map(|from| (from, false)),
        }
    }
}

/// Writes `s` as a JSON string, quotes included.
///
/// The output buffer grows once, by the most the string can take, and the string is then written
/// through a pointer a chunk at a time: a chunk with nothing to escape is checked and stored in one
/// go, and the last, partial chunk is stored whole with only its bytes counted. So text with
/// nothing to escape costs no loop over bytes, no per-write capacity check and no library call. On
/// this general path a word that needs escaping is escaped byte by byte; strings of a parsed
/// document ([`string_in`]) escape just the byte that needs it and go on a chunk at a time.
#[inline(always)]
pub fn string(out: &mut Vec<u8>, s: &str) {
    string_in(out, s, Backing::NONE);
}

/// [`string`] for a string of a parsed document, read in whole chunks when it lies in `backing`.
#[inline(always)]
pub fn string_in(out: &mut Vec<u8>, s: &str, backing: Backing<'_>) {
    let bytes = s.as_bytes();
    out.reserve(sum(escaped_room(bytes.len()), 2));
    let len = out.len();
    // SAFETY: `reserve` left at least `escaped_room(n) + 2` bytes of spare capacity after `len`.
    // The opening quote takes one, `escape_into` writes within the next `escaped_room(n)` (its
    // contract), and the closing quote lands at most at `len + 1 + 6n`, inside the rest. Every
    // byte up to the closing quote is written, so the new length covers initialised bytes only.
    unsafe {
        let start = out.as_mut_ptr().add(len);
        start.write(b'"');
        let end = escape_into(start.add(1), bytes, backing);
        end.write(b'"');
        out.set_len(len + end.offset_from(start) as usize + 1);
    }
}

/// Writes the escaped content of `s` without quotes (for text assembled from several pieces).
#[inline(always)]
pub fn string_body(out: &mut Vec<u8>, s: &str, backing: Backing<'_>) {
    let bytes = s.as_bytes();
    out.reserve(escaped_room(bytes.len()));
    let len = out.len();
    // SAFETY: as in `string_in`, without the quotes: `escape_into` gets `escaped_room(n)` bytes
    // of spare capacity and the new length ends where it stopped writing.
    unsafe {
        let start = out.as_mut_ptr().add(len);
        let end = escape_into(start, bytes, backing);
        out.set_len(len + end.offset_from(start) as usize);
    }
}

/// Writes `separator` and then the escaped content of `s` without quotes, with one reservation
/// for both (the pieces of a concatenation).
#[inline(always)]
pub fn string_body_after(out: &mut Vec<u8>, separator: u8, s: &str, backing: Backing<'_>) {
    let bytes = s.as_bytes();
    out.reserve(sum(escaped_room(bytes.len()), 1));
    let len = out.len();
    // SAFETY: as in `string_body`, with one more byte reserved and written first: the separator
    // at `len`, then `escape_into` within the `escaped_room(n)` bytes after it; the new length
    // ends where it stopped writing.
    unsafe {
        let start = out.as_mut_ptr().add(len);
        start.write(separator);
        let end = escape_into(start.add(1), bytes, backing);
        out.set_len(len + end.offset_from(start) as usize);
    }
}

/// Writes `a` and `b` as one JSON string, quotes included, joined by a space when neither is
/// empty (a concatenation of two pieces of text), with one reservation for the whole.
#[inline(always)]
pub fn joined_in(out: &mut Vec<u8>, a: &str, b: &str, backing: Backing<'_>) {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    out.reserve(sum(sum(escaped_room(a.len()), escaped_room(b.len())), 3));
    let len = out.len();
    // SAFETY: `reserve` left `escaped_room(a) + escaped_room(b) + 3` bytes of spare capacity after
    // `len`. The opening quote takes one; `escape_into` writes `a` within the next
    // `escaped_room(a)` and ends at most `6 * a.len()` bytes on; the separator takes one more; `b`
    // then has at least `escaped_room(b)` bytes; the closing quote lands at most at
    // `len + 2 + 6 (a.len() + b.len())`, inside the rest. Every byte up to it is written.
    unsafe {
        let start = out.as_mut_ptr().add(len);
        start.write(b'"');
        let mut end = escape_into(start.add(1), a, backing);
        if !a.is_empty() && !b.is_empty() {
            end.write(b' ');
            end = end.add(1);
        }
        let end = escape_into(end, b, backing);
        end.write(b'"');
        out.set_len(len + end.offset_from(start) as usize + 1);
    }
}

/// Room the escaped form of `n` bytes may need: every byte as `\u00XX`, plus one chunk of slack
/// for the store of the last, partial chunk (a word, on the general path: smaller). Checked: the
/// writes below rely on this room, so a size that overflowed would be unsound rather than wrong.
/// No string that fits in memory comes near; such a one panics before anything is written.
#[inline(always)]
const fn escaped_room(n: usize) -> usize {
    match n.checked_mul(6) {
        Some(room) => sum(room, chunk::LEN),
        None => too_long(),
    }
}

/// `a + b` for the room of escaped text, checked as [`escaped_room`] is.
#[inline(always)]
const fn sum(a: usize, b: usize) -> usize {
    match a.checked_add(b) {
        Some(room) => room,
        None => too_long(),
    }
}

#[cold]
#[inline(never)]
const fn too_long() -> ! {
    panic!("text too long to escape: its room overflows usize")
}

/// Writes the escaped form of `bytes` at `to` and returns the end of what it wrote.
///
/// # Safety
/// `to` must be valid for writes of `escaped_room(bytes.len())` bytes.
#[inline(always)]
unsafe fn escape_into(to: *mut u8, bytes: &[u8], backing: Backing<'_>) -> *mut u8 {
    // SAFETY: the caller's room is passed on; `widened` vouches for the reads.
    unsafe {
        match backing.widened(bytes) {
            Some((from, true)) => copy_chunks(to, from, bytes.len()),
            Some((from, false)) => escape_chunks(to, from, bytes.len()),
            None => escape_words(to, bytes),
        }
    }
}

/// Copies `n` bytes at `from`, which need no escaping, a chunk at a time, the last chunk read
/// and stored whole with only its first bytes counted.
///
/// # Safety
/// `from` must be valid for reads of `n + chunk::LEN` bytes, `to` for writes of
/// `escaped_room(n)` bytes.
#[inline(always)]
unsafe fn copy_chunks(to: *mut u8, from: *const u8, n: usize) -> *mut u8 {
    // SAFETY: chunk `k` is read at `from + k * LEN` and stored at `to + k * LEN` while
    // `k * LEN < n` (and once when `n` is 0), so the last read ends before `n + LEN` bytes and
    // the last store before `n + LEN <= escaped_room(n)` bytes.
    unsafe {
        debug_assert!(
            (0..n).all(|i| ESCAPE[from.add(i).read() as usize] == 0),
            "a string copied unchecked has a byte to escape"
        );
        let mut done = 0;
        loop {
            chunk::Chunk::load(from.add(done)).store(to.add(done));
            done += chunk::LEN;
            if done >= n {
                return to.add(n);
            }
        }
    }
}

/// Escapes `n` bytes at `from` a chunk at a time, the last chunk read whole (past the `n` bytes)
/// and stored whole with only its first bytes counted. A chunk with a byte to escape is stored
/// whole too, counted up to that byte; the byte is escaped and the next chunk starts after it.
///
/// # Safety
/// `from` must be valid for reads of `n + chunk::LEN` bytes, `to` for writes of
/// `escaped_room(n)` bytes.
#[inline(always)]
unsafe fn escape_chunks(mut to: *mut u8, mut from: *const u8, n: usize) -> *mut u8 {
    let mut left = n;
    // SAFETY: each chunk is read at `from`, at most `n` bytes past the start with `left` bytes
    // after it still to escape, so the read stays in the `n + LEN` readable bytes. Writing never
    // takes more than six bytes per input byte, so at least `6 * left + LEN` bytes of room are
    // left at `to`: enough for a whole chunk stored (LEN), and when the byte at `i` is escaped
    // (six bytes written at `to + i`, for `i + 1` bytes taken) the room keeps that bound.
    unsafe {
        loop {
            let chunk = chunk::Chunk::load(from);
            let last = left <= chunk::LEN;
            match chunk.first_escape(if last { left } else { chunk::LEN }) {
                None if last => {
                    chunk.store(to);
                    return to.add(left);
                }
                None => {
                    chunk.store(to);
                    to = to.add(chunk::LEN);
                    from = from.add(chunk::LEN);
                    left -= chunk::LEN;
                }
                Some(i) => {
                    chunk.store(to);
                    to = escape_byte(to.add(i), from.add(i).read());
                    from = from.add(i + 1);
                    left -= i + 1;
                    if left == 0 {
                        return to;
                    }
                }
            }
        }
    }
}

/// The general path, for text not known to lie in a padded buffer: a word at a time, the last,
/// partial word loaded from its own bytes only.
///
/// # Safety
/// `to` must be valid for writes of `escaped_room(bytes.len())` bytes.
#[inline(always)]
unsafe fn escape_words(mut to: *mut u8, bytes: &[u8]) -> *mut u8 {
    let mut words = bytes.chunks_exact(8);
    for chunk in &mut words {
        let word = load_partial(chunk);
        // SAFETY: after `k` of the `n` input bytes at most `6k` bytes were written, so at least
        // `6(n - k) + 8` bytes of room are left; with `n - k >= 8` here, that covers the eight
        // bytes of a clean word and the at most 48 of an escaped one.
        unsafe {
            if escape_mask(word) == 0 {
                to.cast::<[u8; 8]>().write_unaligned(word.to_le_bytes());
                to = to.add(8);
            } else {
                to = escape_slow(to, chunk);
            }
        }
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let word = load_partial(rest);
        let counted = u64::MAX >> (64 - 8 * rest.len());
        // SAFETY: as above, at least `6 * rest.len() + 8` bytes of room are left: enough for the
        // whole-word store (of which only `rest.len()` bytes are counted) or the escaped bytes.
        unsafe {
            if escape_mask(word) & counted == 0 {
                to.cast::<[u8; 8]>().write_unaligned(word.to_le_bytes());
                to = to.add(rest.len());
            } else {
                to = escape_slow(to, rest);
            }
        }
    }
    to
}

/// The chunk the padded path reads, checks and stores in one go: 16 bytes with SSE2 (every
/// x86-64 processor has it), else a 64-bit word.
mod chunk {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    pub use sse2::{Chunk, LEN};
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    pub use word::{Chunk, LEN};

    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    mod sse2 {
        use std::arch::x86_64::{
            __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
            _mm_set1_epi8, _mm_storeu_si128,
        };

        pub const LEN: usize = 16;

        #[derive(Clone, Copy)]
        pub struct Chunk(__m128i);

        impl Chunk {
            /// # Safety
            /// `from` must be valid for reads of `LEN` bytes.
            #[inline(always)]
            pub unsafe fn load(from: *const u8) -> Chunk {
                // SAFETY: the caller's guarantee; the load has no alignment requirement.
                Chunk(unsafe { _mm_loadu_si128(from.cast()) })
            }

            /// # Safety
            /// `to` must be valid for writes of `LEN` bytes.
            #[inline(always)]
            pub unsafe fn store(self, to: *mut u8) {
                // SAFETY: the caller's guarantee; the store has no alignment requirement.
                unsafe { _mm_storeu_si128(to.cast(), self.0) }
            }

            /// The index of the first of the first `n` (at most `LEN`) bytes that is `"`, `\` or
            /// below 0x20, if any.
            #[inline(always)]
            pub fn first_escape(self, n: usize) -> Option<usize> {
                let v = self.0;
                // SAFETY: these intrinsics only compute on registers, and need SSE2, which this
                // module is compiled only with (its `cfg`).
                let escapes = unsafe {
                    let control = _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1f)), v);
                    let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
                    let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
                    _mm_movemask_epi8(_mm_or_si128(control, _mm_or_si128(quote, backslash)))
                };
                let counted = escapes as u32 & ((1u32 << n) - 1);
                (counted != 0).then(|| counted.trailing_zeros() as usize)
            }
        }
    }

    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    mod word {
        pub const LEN: usize = 8;

        #[derive(Clone, Copy)]
        pub struct Chunk(u64);

        impl Chunk {
            /// # Safety
            /// `from` must be valid for reads of `LEN` bytes.
            #[inline(always)]
            pub unsafe fn load(from: *const u8) -> Chunk {
                // SAFETY: the caller's guarantee; the read has no alignment requirement.
                Chunk(u64::from_le_bytes(unsafe { from.cast::<[u8; 8]>().read_unaligned() }))
            }

            /// # Safety
            /// `to` must be valid for writes of `LEN` bytes.
            #[inline(always)]
            pub unsafe fn store(self, to: *mut u8) {
                // SAFETY: the caller's guarantee; the write has no alignment requirement.
                unsafe { to.cast::<[u8; 8]>().write_unaligned(self.0.to_le_bytes()) }
            }

            /// The index of the first of the first `n` (at most `LEN`) bytes that is `"`, `\` or
            /// below 0x20, if any.
            #[inline(always)]
            pub fn first_escape(self, n: usize) -> Option<usize> {
                let counted = if n >= LEN { u64::MAX } else { (1u64 << (8 * n)) - 1 };
                let escapes = super::super::escape_mask(self.0) & counted;
                (escapes != 0).then(|| escapes.trailing_zeros() as usize / 8)
            }
        }
    }
}

/// Escapes byte by byte (the rare path) and returns the end of what it wrote.
///
/// # Safety
/// `to` must be valid for writes of `6 * bytes.len()` bytes.
#[cold]
#[inline(never)]
unsafe fn escape_slow(mut to: *mut u8, bytes: &[u8]) -> *mut u8 {
    for &b in bytes {
        // SAFETY: after `k` bytes at most `6k` were written; the next takes six at most.
        to = unsafe { escape_byte(to, b) };
    }
    to
}

/// Writes byte `b`, escaped if it must be, and returns the end of what it wrote.
///
/// # Safety
/// `to` must be valid for writes of six bytes: the whole room of the longest escape is written
/// in one store, whatever `b` takes.
#[inline(always)]
unsafe fn escape_byte(to: *mut u8, b: u8) -> *mut u8 {
    const HEX: &[u8; 16] = crate::hex::DIGITS;
    let escape = ESCAPE[b as usize];
    let (sequence, n) = match escape {
        0 => ([b, 0, 0, 0, 0, 0], 1),
        b'u' => ([b'\\', b'u', b'0', b'0', HEX[(b >> 4) as usize], HEX[(b & 0xf) as usize]], 6),
        _ => ([b'\\', escape, 0, 0, 0, 0], 2),
    };
    // SAFETY: the caller's guarantee.
    unsafe {
        to.cast::<[u8; 6]>().write_unaligned(sequence);
        to.add(n)
    }
}

/// Bytes split into little-endian words once, for text written many times (member names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Words {
    /// At least two words (zero past the text), so text of up to 16 bytes takes two stores.
    words: Box<[u64]>,
    len: usize,
}

impl Words {
    pub fn new(bytes: &[u8]) -> Words {
        let mut words: Vec<u64> = bytes.chunks(8).map(load_partial).collect();
        words.resize(words.len().max(2), 0);
        Words { words: words.into_boxed_slice(), len: bytes.len() }
    }

    /// Appends the bytes: one store per word, and for text of up to 16 bytes (most member names)
    /// exactly two, without a loop.
    #[inline(always)]
    pub fn write(&self, out: &mut Vec<u8>) {
        // Decided before the stores rather than matched around them, so the stores below are
        // straight-line code.
        let (short, words) = match *self.words {
            [first, second] => (Some((first, second)), &self.words[..0]),
            ref words => (None, words),
        };
        // The words' own size in bytes: it cannot overflow.
        out.reserve(self.words.len() * 8);
        let len = out.len();
        // SAFETY: `reserve` left eight bytes of spare capacity per word after `len`, and word `i`
        // is stored at `len + 8i`, inside that room. The words hold the `self.len` bytes of the
        // text in order (`new`), so the new length covers exactly bytes that were written.
        unsafe {
            let to = out.as_mut_ptr().add(len);
            if let Some((first, second)) = short {
                to.cast::<[u8; 8]>().write_unaligned(first.to_le_bytes());
                to.add(8).cast::<[u8; 8]>().write_unaligned(second.to_le_bytes());
            }
            for (i, &word) in words.iter().enumerate() {
                to.add(8 * i).cast::<[u8; 8]>().write_unaligned(word.to_le_bytes());
            }
            out.set_len(len + self.len);
        }
    }
}

/// Up to eight bytes as a little-endian word, zero above them. Loads overlapping halves rather
/// than looping over bytes.
#[inline(always)]
fn load_partial(bytes: &[u8]) -> u64 {
    let n = bytes.len();
    if n >= 8 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[..8]);
        u64::from_le_bytes(word)
    } else if n >= 4 {
        let low = load4(&bytes[..4]);
        let high = load4(&bytes[n - 4..]);
        low | high << (8 * (n - 4))
    } else if n > 0 {
        let (a, b, c) = (bytes[0] as u64, bytes[n / 2] as u64, bytes[n - 1] as u64);
        a | b << (8 * (n / 2)) | c << (8 * (n - 1))
    } else {
        0
    }
}

#[inline(always)]
fn load4(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[..4]);
    u64::from(u32::from_le_bytes(word))
}

#[inline]
pub fn i64(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

#[inline]
pub fn u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Writes a finite float in its shortest round-trip form; returns `false` (writing nothing) for
/// NaN and infinities, which JSON cannot express.
#[inline]
pub fn f64(out: &mut Vec<u8>, f: f64) -> bool {
    if !f.is_finite() {
        return false;
    }
    out.extend_from_slice(zmij::Buffer::new().format_finite(f).as_bytes());
    true
}

/// Whether `s` is an integer that an `Int` or `Long` target writes exactly as it is: an optional
/// minus, no leading zero, no `-0`, and at most 18 digits, so that it fits in 64 bits.
#[inline]
pub(crate) fn canonical_integer(s: &str) -> bool {
    let digits = s.as_bytes().strip_prefix(b"-").unwrap_or(s.as_bytes());
    match digits {
        [b'0'] => digits.len() == s.len(),
        [b'1'..=b'9', rest @ ..] => rest.len() < 18 && rest.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

/// Whether `s` is a decimal that a `Double` or `Float` target writes exactly as it is (the
/// shortest text that reads back as the same double, in fixed notation): an optional minus,
/// digits without a leading zero, a point, and digits that end in a nonzero one unless they are
/// one `0`; at most 15 significant digits (so no shorter text reads as the same double) and at
/// most 15 before the point, and at least 0.00001 unless zero (below, it is written with an
/// exponent).
#[inline]
pub(crate) fn canonical_decimal(s: &str) -> bool {
    let body = s.as_bytes().strip_prefix(b"-").unwrap_or(s.as_bytes());
    let Some(point) = body.iter().position(|&b| b == b'.') else { return false };
    let (whole, fraction) = (&body[..point], &body[point + 1..]);
    let digits = |d: &[u8]| !d.is_empty() && d.iter().all(u8::is_ascii_digit);
    if !digits(whole) || !digits(fraction) || whole.len() > 15 {
        return false;
    }
    if (whole.len() > 1 && whole[0] == b'0') || (fraction.len() > 1 && fraction.ends_with(b"0")) {
        return false;
    }
    let significant = if whole == b"0" {
        let zeros = fraction.iter().take_while(|&&b| b == b'0').count();
        if zeros == fraction.len() {
            return true;
        }
        if zeros > 4 {
            return false;
        }
        fraction.len() - zeros
    } else if fraction == b"0" {
        whole.len()
    } else {
        whole.len() + fraction.len()
    };
    significant <= 15
}

/// Writes a scalar node as JSON.
pub fn scalar(out: &mut Vec<u8>, node: &StaticNode) {
    match *node {
        StaticNode::Null => out.extend_from_slice(b"null"),
        StaticNode::Bool(true) => out.extend_from_slice(b"true"),
        StaticNode::Bool(false) => out.extend_from_slice(b"false"),
        StaticNode::I64(n) => i64(out, n),
        StaticNode::U64(n) => u64(out, n),
        StaticNode::F64(f) => {
            if !f64(out, f) {
                out.extend_from_slice(b"null");
            }
        }
    }
}

/// The high bit of each byte of the word that is `"`, `\` or a control character (below 0x20);
/// zero when the word needs no escaping.
#[inline(always)]
fn escape_mask(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below_space = w.wrapping_sub(ONES * 0x20) & !w;
    let quote = w ^ (ONES * b'"' as u64);
    let backslash = w ^ (ONES * b'\\' as u64);
    let is_quote = quote.wrapping_sub(ONES) & !quote;
    let is_backslash = backslash.wrapping_sub(ONES) & !backslash;
    (below_space | is_quote | is_backslash) & HIGH
}

/// For each byte: 0 when it is written as is, the letter of its short escape, or `u` for `\u00XX`.
static ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = b'u';
        b += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

#[cfg(test)]
mod tests {
    use simd_json::Node;

    use super::super::value;
    use super::*;

    fn escaped(s: &str) -> String {
        let mut out = Vec::new();
        string(&mut out, s);
        String::from_utf8(out).unwrap()
    }

    /// Every length below `end`, or under Miri (which interprets each step: the full sweeps
    /// would take hours there) the lengths next to the first word boundary and to each 16-byte
    /// chunk boundary.
    fn lengths(end: usize) -> Vec<usize> {
        let near = |n: usize| n < 3 || matches!(n, 7..=9) || matches!(n % 16, 0 | 1 | 15);
        (0..end).filter(|&n| !cfg!(miri) || near(n)).collect()
    }

    /// Every position in `0..=n`, or under Miri the ends, the middle and those next to a chunk
    /// boundary.
    fn positions(n: usize) -> Vec<usize> {
        let near = |at: usize| at < 2 || at + 1 >= n || at == n / 2 || matches!(at % 16, 0 | 15);
        (0..=n).filter(|&at| !cfg!(miri) || near(at)).collect()
    }

    /// What `joined_in` must write the text of: `a` and `b`, with a space when neither is empty.
    fn joined_text(a: &str, b: &str) -> String {
        if a.is_empty() || b.is_empty() { format!("{a}{b}") } else { format!("{a} {b}") }
    }

    #[test]
    fn escapes_quotes_backslashes_and_controls_only() {
        assert_eq!(escaped("plain text, long enough for words"), r#""plain text, long enough for words""#);
        assert_eq!(escaped("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(escaped("\n\t\r\u{8}\u{c}\u{1}\u{1f}"), r#""\n\t\r\b\f\u0001\u001f""#);
        assert_eq!(escaped("ünïcødé ☃ \u{7f}"), "\"ünïcødé ☃ \u{7f}\"");
        assert_eq!(escaped("12345678\"12345678\\"), r#""12345678\"12345678\\""#);
    }

    #[test]
    fn every_length_and_escape_position_is_written_right() {
        for n in lengths(70) {
            for at in positions(n) {
                let mut text: String = (0..n).map(|i| (b'a' + (i % 26) as u8) as char).collect();
                if at < n {
                    text.replace_range(at..at + 1, "\n");
                }
                let mut out = Vec::new();
                string(&mut out, &text);
                let back: String = serde_json::from_slice(&out).unwrap();
                assert_eq!(back, text, "length {n}, escape at {at}");
                let mut words = b"x".to_vec();
                Words::new(text.as_bytes()).write(&mut words);
                assert_eq!(&words[1..], text.as_bytes());
            }
        }
    }

    /// Writes the text of the JSON string `json` as the executor does: parsed, then written from
    /// the buffer it was parsed in, with the backing (whole chunks) and without (general path).
    fn written_from_a_parse(json: &str) -> (Vec<u8>, Vec<u8>) {
        let mut buf = json.as_bytes().to_vec();
        super::super::with_parsed(&mut buf, 8, |doc| {
            let Some(Node::String(s)) = doc.first() else { panic!("{json} is not a string") };
            assert!(doc.backing().widened(s.as_bytes()).is_some(), "{json} is not read in chunks");
            let mut chunked = Vec::new();
            string_in(&mut chunked, s, doc.backing());
            let mut general = Vec::new();
            string(&mut general, s);
            (chunked, general)
        })
        .unwrap()
    }

    #[test]
    fn strings_of_a_parse_are_read_in_chunks_and_written_as_by_the_general_path() {
        // Every length around the chunk boundaries, with an escape at every position, including
        // strings that end the document (read ahead into the padding alone).
        for n in lengths(70) {
            for at in positions(n) {
                for escape in ["\\n", "\\\"", "\\\\", "\\u0001", "\\u001f"] {
                    let mut text: String = (0..n).map(|i| (b'a' + (i % 26) as u8) as char).collect();
                    if at < n {
                        text.replace_range(at..at + 1, escape);
                    }
                    let (chunked, general) = written_from_a_parse(&format!("\"{text}\""));
                    assert_eq!(chunked, general, "length {n}, escape {escape} at {at}");
                    let back: String = serde_json::from_slice(&chunked).unwrap();
                    assert_eq!(serde_json::to_vec(&back).unwrap(), chunked, "length {n}, escape at {at}");
                }
            }
        }
        let (chunked, general) = written_from_a_parse("\"ünïcødé ☃ \\u007f \\u00e9\"");
        assert_eq!(chunked, general);
        assert_eq!(String::from_utf8(chunked).unwrap(), "\"ünïcødé ☃ \u{7f} é\"");
    }

    #[test]
    fn runs_of_escapes_in_parsed_strings_are_written_as_by_the_general_path() {
        // Several escapes per chunk, back to back or apart, at every length around the chunk
        // boundaries: each escaped byte ends a chunk's counted bytes and the next chunk starts
        // after it. A string of `\u0001`s alone takes the most room: six bytes per byte.
        for pattern in [r"\u0001", r"\n", r"a\u0001", r#"\"xy\\"#, r"\u001f\t", "é\\n", r"abcdefghijklmno\r"]
        {
            for n in lengths(50) {
                let (chunked, general) = written_from_a_parse(&format!("\"{}\"", pattern.repeat(n)));
                assert_eq!(chunked, general, "{pattern:?} x {n}");
                let back: String = serde_json::from_slice(&chunked).unwrap();
                assert_eq!(serde_json::to_vec(&back).unwrap(), chunked, "{pattern:?} x {n}");
            }
        }
    }

    #[test]
    fn only_strings_inside_the_parsed_buffer_are_read_in_chunks() {
        let elsewhere = "a string that is not in the buffer".to_owned();
        let mut buf = br#"["in the buffer"]"#.to_vec();
        super::super::with_parsed(&mut buf, 8, |doc| {
            let Some(Node::String(inside)) = doc.get(1) else { panic!() };
            // Parsed in place: its strings were unescaped there, so they are checked as written.
            assert!(matches!(doc.backing().widened(inside.as_bytes()), Some((_, false))));
            assert!(doc.backing().widened(elsewhere.as_bytes()).is_none());
            assert!(Backing::NONE.widened(inside.as_bytes()).is_none());
        })
        .unwrap();
    }

    #[test]
    fn strings_in_either_buffer_of_a_text_read_on_demand_are_read_in_chunks_with_room_after_them() {
        let text = format!("{}{}", "x".repeat(40), " ".repeat(chunk::LEN));
        let other = format!("{}{}", "y".repeat(40), " ".repeat(chunk::LEN));
        let backing = Backing::of(text.as_bytes(), other.as_bytes());
        for (buffer, clean) in [(&text, true), (&other, false)] {
            assert_eq!(backing.widened(&buffer.as_bytes()[3..40]).map(|(_, clean)| clean), Some(clean));
            // The last bytes have no room after them.
            assert!(backing.widened(&buffer.as_bytes()[40..]).is_none());
        }
        let elsewhere = "z".repeat(40);
        assert!(backing.widened(elsewhere.as_bytes()).is_none());
        let mut out = Vec::new();
        string_in(&mut out, &other[..40], backing);
        assert_eq!(out, format!("\"{}\"", "y".repeat(40)).into_bytes());
    }

    #[test]
    fn strings_of_the_text_itself_are_copied_unchecked_at_every_length() {
        for n in 0..3 * chunk::LEN {
            let text = format!("{}{}", "é".repeat(n / 2) + &"x".repeat(n % 2), " ".repeat(chunk::LEN));
            let body = &text[..text.len() - chunk::LEN];
            let mut out = b"[".to_vec();
            string_in(&mut out, body, Backing::of(text.as_bytes(), b""));
            assert_eq!(out, format!("[\"{body}\"").into_bytes(), "{n}");
        }
    }

    #[test]
    fn worst_case_escaping_fits_the_room_it_reserves() {
        // Every byte escaped as `\u00XX` (six bytes), and mixes of short and long escapes, at
        // every length around the word boundaries; each written into a buffer that starts with no
        // spare capacity, so any write past the reserved room would land outside the allocation.
        for n in lengths(70) {
            for pattern in ["\u{1}", "\u{1}\"", "a\u{1f}", "\\\t"] {
                let text: String = pattern.chars().cycle().take(n).collect();
                let mut out = Vec::new();
                string(&mut out, &text);
                let back: String = serde_json::from_slice(&out).unwrap();
                assert_eq!(back, text, "{pattern:?} x {n}");
                let mut body = b"[".to_vec();
                body.shrink_to_fit();
                string_body(&mut body, &text, Backing::NONE);
                assert_eq!(&body[1..], &out[1..out.len() - 1]);
                let mut after = b"[".to_vec();
                after.shrink_to_fit();
                string_body_after(&mut after, b' ', &text, Backing::NONE);
                assert_eq!(after[1], b' ');
                assert_eq!(&after[2..], &out[1..out.len() - 1]);
                for other in ["", "x", "\u{1}\u{1}"] {
                    let mut joined = b"[".to_vec();
                    joined.shrink_to_fit();
                    joined_in(&mut joined, &text, other, Backing::NONE);
                    joined_in(&mut joined, other, &text, Backing::NONE);
                    let mut expected = b"[".to_vec();
                    string(&mut expected, &joined_text(&text, other));
                    string(&mut expected, &joined_text(other, &text));
                    assert_eq!(joined, expected, "{pattern:?} x {n} with {other:?}");
                }
            }
        }
    }

    #[test]
    fn pairs_of_parsed_strings_are_joined_as_the_general_path_joins_them() {
        // Pieces of every length around the chunk boundaries, each with and without an escape,
        // read in chunks from the parse buffer; the second piece may end the document.
        let piece = |n: usize, escape: bool| -> String {
            let mut text: String = (0..n).map(|i| (b'a' + (i % 26) as u8) as char).collect();
            if escape && n > 0 {
                text.replace_range(n / 2..n / 2 + 1, "\\u0001");
            }
            text
        };
        for n in lengths(40) {
            for m in lengths(40) {
                for (x, y) in [(false, false), (true, false), (false, true), (true, true)] {
                    let json = format!(r#"["{}","{}"]"#, piece(n, x), piece(m, y));
                    let mut buf = json.clone().into_bytes();
                    super::super::with_parsed(&mut buf, 8, |doc| {
                        let (Some(Node::String(a)), Some(Node::String(b))) = (doc.get(1), doc.get(2)) else {
                            panic!("{json}")
                        };
                        assert!(doc.backing().widened(b.as_bytes()).is_some(), "{json}");
                        let mut chunked = Vec::new();
                        joined_in(&mut chunked, a, b, doc.backing());
                        let mut general = Vec::new();
                        string(&mut general, &joined_text(a, b));
                        assert_eq!(chunked, general, "{json}");
                    })
                    .unwrap();
                }
            }
        }
    }

    #[test]
    fn escaped_strings_round_trip_through_a_json_parser() {
        let all: String = (0u32..0x300).filter_map(char::from_u32).collect();
        let text = escaped(&all);
        let back: String = serde_json::from_str(&text).unwrap();
        assert_eq!(back, all);
    }

    #[test]
    fn numbers_keep_digits_and_floats_are_shortest() {
        let mut out = Vec::new();
        i64(&mut out, i64::MIN);
        out.push(b' ');
        u64(&mut out, u64::MAX);
        out.push(b' ');
        assert!(f64(&mut out, 0.1));
        out.push(b' ');
        assert!(f64(&mut out, 1e300));
        assert!(!f64(&mut out, f64::NAN));
        assert_eq!(String::from_utf8(out).unwrap(), "-9223372036854775808 18446744073709551615 0.1 1e+300");
    }

    #[test]
    fn values_are_copied_compactly() {
        let text =
            r#" { "a" : [1, {"b": null, "c": [[], {}]}, "x\"y"], "d": {"e": {"f": [true]}}, "g": -1.5 } "#;
        let mut buf = text.as_bytes().to_vec();
        let mut out = Vec::new();
        super::super::with_parsed(&mut buf, 64, |nodes| value(&mut out, nodes, 0)).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":[1,{"b":null,"c":[[],{}]},"x\"y"],"d":{"e":{"f":[true]}},"g":-1.5}"#
        );
    }
}
