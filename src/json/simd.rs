//! Classifying the bytes of a text sixty-four at a time: which are quotes, backslashes,
//! structural characters (`{}[]:,`), spaces and control characters, each class a bit mask with
//! bit `i` for byte `i`. This is the one place where the structural index ([`super::index`])
//! touches the processor's vector instructions.
//!
//! Three kernels do the same work:
//!
//! - [`Avx2`]: thirty-two bytes per instruction, the structural characters and spaces found by
//!   two table lookups (one by each half of a byte), and the prefix XOR that tells which bytes
//!   are inside strings done by one carry-less multiplication. Chosen at run time, when the
//!   processor has AVX2 and PCLMULQDQ; reached only through [`run`], which detects them.
//! - [`Fallback`]: on x86-64, sixteen bytes per instruction with SSE2 (part of every x86-64
//!   processor, through `safe_arch`); elsewhere one byte at a time.
//! - [`classify_bytes`], one byte at a time: the reference the others are tested against.
//!
//! This module and `json::write` are the only ones with `unsafe` code. Here it is of two kinds,
//! each block with its reason: calling a function compiled for AVX2 and PCLMULQDQ, which is sound
//! only on a processor that has them (an [`Avx2`] is made only after they were detected), and
//! loading thirty-two bytes from a block of sixty-four. Miri cannot run the intrinsics; what
//! stands in for it is the differential test in `index.rs` and the `json_index` fuzz target,
//! which run both kernels and the byte-at-a-time reference on every input and compare them.

use std::sync::atomic::{AtomicBool, Ordering};

/// Bit masks of the bytes of one block, bit `i` for byte `i`.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(crate) struct Classes {
    pub quote: u64,
    pub backslash: u64,
    /// `{}[]:,`.
    pub structural: u64,
    /// Space, tab, line feed, carriage return.
    pub space: u64,
    /// Below 0x20.
    pub control: u64,
}

/// What a kernel does: classify a block, and the prefix XOR of a mask.
pub(crate) trait Kernel: Copy {
    /// The classes of the bytes of `block`.
    fn classify(self, block: &[u8; 64]) -> Classes;

    /// Each bit the XOR of itself and all bits below it.
    #[inline(always)]
    fn prefix_xor(self, mut bits: u64) -> u64 {
        for shift in [1, 2, 4, 8, 16, 32] {
            bits ^= bits << shift;
        }
        bits
    }
}

/// Work that runs with a kernel: [`run`] picks the kernel and compiles the work for it.
pub(crate) trait Job {
    type Output;
    fn run<K: Kernel>(self, kernel: K) -> Self::Output;
}

/// The kernels a caller can ask for by name, for tests, fuzzing and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// AVX2 and PCLMULQDQ, when the processor has them.
    Avx2,
    /// SSE2 on x86-64, bytes one at a time elsewhere.
    Fallback,
}

impl Choice {
    /// The kernel [`run`] uses on this processor (unless told otherwise by [`prefer_fallback`]).
    pub fn detected() -> Choice {
        if Avx2::detect().is_some() { Choice::Avx2 } else { Choice::Fallback }
    }

    /// Its name, for the start-up log.
    pub fn name(self) -> &'static str {
        match self {
            Choice::Avx2 => "avx2",
            Choice::Fallback if cfg!(target_arch = "x86_64") => "sse2",
            Choice::Fallback => "bytes",
        }
    }
}

/// Whether [`run`] uses the fallback kernel even where AVX2 is there.
static FALLBACK_PREFERRED: AtomicBool = AtomicBool::new(false);

/// Makes every later [`run`] in this process use the fallback kernel (`true`) or the detected
/// one (`false`). For benchmarks, which measure both in one run; the service never calls it.
#[doc(hidden)]
pub fn prefer_fallback(yes: bool) {
    FALLBACK_PREFERRED.store(yes, Ordering::Relaxed);
}

/// Runs `job` with the best kernel this processor has.
#[inline]
pub(crate) fn run<J: Job>(job: J) -> J::Output {
    if !FALLBACK_PREFERRED.load(Ordering::Relaxed)
        && let Some(avx2) = Avx2::detect()
    {
        return avx2.run(job);
    }
    job.run(Fallback)
}

/// Runs `job` with the kernel asked for; `None` when it is AVX2 and the processor lacks it.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn run_with<J: Job>(choice: Choice, job: J) -> Option<J::Output> {
    match choice {
        Choice::Avx2 => Avx2::detect().map(|avx2| avx2.run(job)),
        Choice::Fallback => Some(job.run(Fallback)),
    }
}

/// The kernel every processor has.
#[derive(Clone, Copy)]
pub(crate) struct Fallback;

impl Kernel for Fallback {
    #[inline(always)]
    fn classify(self, block: &[u8; 64]) -> Classes {
        #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
        {
            classify_sse2(block)
        }
        #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
        {
            classify_bytes(block)
        }
    }
}

/// The classes of a block's bytes, sixteen at a time with SSE2.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[inline(always)]
fn classify_sse2(block: &[u8; 64]) -> Classes {
    use safe_arch::{
        bitor_m128i as or, cmp_eq_mask_i8_m128i as eq, m128i, max_u8_m128i, move_mask_i8_m128i,
        set_splat_i8_m128i as splat,
    };
    let mut c = Classes { quote: 0, backslash: 0, structural: 0, space: 0, control: 0 };
    for (n, chunk) in block.chunks_exact(16).enumerate() {
        let bytes: [u8; 16] = chunk.try_into().unwrap_or_default();
        let v = m128i::from(bytes);
        let is = |byte: u8| eq(v, splat(byte as i8));
        let mask = |m: m128i| u64::from(move_mask_i8_m128i(m) as u16) << (16 * n);
        // With 0x20 set, `[` and `]` read as `{` and `}`, and no other byte does.
        let folded = or(v, splat(0x20));
        let brackets = or(eq(folded, splat(b'{' as i8)), eq(folded, splat(b'}' as i8)));
        c.quote |= mask(is(b'"'));
        c.backslash |= mask(is(b'\\'));
        c.structural |= mask(or(brackets, or(is(b':'), is(b','))));
        c.space |= mask(or(or(is(b' '), is(b'\t')), or(is(b'\n'), is(b'\r'))));
        c.control |= mask(eq(max_u8_m128i(v, splat(0x1f)), splat(0x1f)));
    }
    c
}

/// The classes of a block's bytes, one at a time.
#[cfg_attr(all(target_arch = "x86_64", target_feature = "sse2", not(test)), allow(dead_code))]
pub(crate) fn classify_bytes(block: &[u8; 64]) -> Classes {
    let mut c = Classes { quote: 0, backslash: 0, structural: 0, space: 0, control: 0 };
    for (i, &byte) in block.iter().enumerate() {
        let bit = 1u64 << i;
        match byte {
            b'"' => c.quote |= bit,
            b'\\' => c.backslash |= bit,
            b'{' | b'}' | b'[' | b']' | b':' | b',' => c.structural |= bit,
            b' ' => c.space |= bit,
            b'\t' | b'\n' | b'\r' => {
                c.space |= bit;
                c.control |= bit;
            }
            0..0x20 => c.control |= bit,
            _ => {}
        }
    }
    c
}

/// The AVX2 kernel. Holding one is the proof that the processor has AVX2 and PCLMULQDQ (and
/// POPCNT, BMI1 and BMI2, which every processor with AVX2 has, for counting and finding bits in
/// the work's loop): it is made only by [`Avx2::detect`].
#[derive(Clone, Copy)]
pub(crate) struct Avx2(());

#[cfg(target_arch = "x86_64")]
impl Avx2 {
    /// The kernel, when this processor has what it needs (`std` asks the processor once and
    /// keeps the answer).
    #[inline]
    fn detect() -> Option<Avx2> {
        use std::arch::is_x86_feature_detected as has;
        (has!("avx2") && has!("pclmulqdq") && has!("popcnt") && has!("bmi1") && has!("bmi2"))
            .then_some(Avx2(()))
    }

    /// Runs `job` compiled for AVX2 and PCLMULQDQ.
    #[inline]
    fn run<J: Job>(self, job: J) -> J::Output {
        // SAFETY: `self` exists, so `detect` found AVX2, PCLMULQDQ, POPCNT, BMI1 and BMI2 on this
        // processor, which is all `avx2::run` needs.
        unsafe { avx2::run(self, job) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl Avx2 {
    fn detect() -> Option<Avx2> {
        None
    }

    fn run<J: Job>(self, job: J) -> J::Output {
        job.run(Fallback)
    }
}

#[cfg(target_arch = "x86_64")]
impl Kernel for Avx2 {
    #[inline(always)]
    fn classify(self, block: &[u8; 64]) -> Classes {
        // SAFETY: `self` exists, so this processor has AVX2 (see `Avx2::detect`).
        unsafe { avx2::classify(block) }
    }

    #[inline(always)]
    fn prefix_xor(self, bits: u64) -> u64 {
        // SAFETY: `self` exists, so this processor has PCLMULQDQ (see `Avx2::detect`).
        unsafe { avx2::prefix_xor(bits) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl Kernel for Avx2 {
    fn classify(self, block: &[u8; 64]) -> Classes {
        classify_bytes(block)
    }
}

/// The functions compiled for AVX2 and PCLMULQDQ. Each may run only on a processor that has
/// them; outside this module they are reached only through an [`Avx2`].
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::{
        __m256i, _mm_clmulepi64_si128, _mm_cvtsi128_si64, _mm_set_epi64x, _mm_set1_epi8, _mm256_and_si256,
        _mm256_cmpeq_epi8, _mm256_loadu_si256, _mm256_min_epu8, _mm256_movemask_epi8, _mm256_set1_epi8,
        _mm256_setr_epi8, _mm256_setzero_si256, _mm256_shuffle_epi8, _mm256_srli_epi16,
    };

    use super::{Classes, Job};

    /// `job` run with the AVX2 kernel, in a function compiled for it, so that the kernel's
    /// functions are inlined into the work's loop, whose bit counts and searches also take
    /// single instructions (POPCNT, TZCNT).
    #[target_feature(enable = "avx2,pclmulqdq,popcnt,bmi1,bmi2")]
    pub(super) fn run<J: Job>(kernel: super::Avx2, job: J) -> J::Output {
        job.run(kernel)
    }

    // The structural characters and spaces by table lookups: each byte looks up a set of bits by
    // its low four bits and another by its high four, and is of a class when the two sets share
    // a bit of that class. Bits 0 and 1 are spaces (tab, line feed, carriage return; space),
    // bits 2 to 4 structural characters (`,`; `:`; the brackets and braces).
    //
    //   byte   high  low        byte   high  low
    //   \t     0     9          :      3     A
    //   \n     0     A          [ {    5 7   B
    //   \r     0     D          ] }    5 7   D
    //   space  2     0          ,      2     C
    //
    // No other byte shares a bit between its two sets: a byte whose high half is 0 has bit 0
    // only, and of the low halves only 9, A and D carry it; 2 has bits 1 and 2, carried by 0 and
    // C alone; 3 has bit 3, carried by A alone; 5 and 7 have bit 4, carried by B and D alone. A
    // byte from 0x80 has a high half from 8, whose set is empty.
    const SPACE_BITS: i8 = 0b0_0011;
    const STRUCTURAL_BITS: i8 = 0b1_1100;

    /// The bits by the low four bits of a byte, for both 16-byte lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn by_low() -> __m256i {
        #[rustfmt::skip]
        let v = _mm256_setr_epi8(
            0b10, 0, 0, 0, 0, 0, 0, 0, 0, 0b1, 0b1001, 0b1_0000, 0b100, 0b1_0001, 0, 0,
            0b10, 0, 0, 0, 0, 0, 0, 0, 0, 0b1, 0b1001, 0b1_0000, 0b100, 0b1_0001, 0, 0,
        );
        v
    }

    /// The bits by the high four bits of a byte, for both 16-byte lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn by_high() -> __m256i {
        #[rustfmt::skip]
        let v = _mm256_setr_epi8(
            0b1, 0, 0b110, 0b1000, 0, 0b1_0000, 0, 0b1_0000, 0, 0, 0, 0, 0, 0, 0, 0,
            0b1, 0, 0b110, 0b1000, 0, 0b1_0000, 0, 0b1_0000, 0, 0, 0, 0, 0, 0, 0, 0,
        );
        v
    }

    /// The classes of the bytes of `block`, thirty-two at a time.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn classify(block: &[u8; 64]) -> Classes {
        let mut c = Classes { quote: 0, backslash: 0, structural: 0, space: 0, control: 0 };
        let (low, high) = (by_low(), by_high());
        let nibble = _mm256_set1_epi8(0x0f);
        let zero = _mm256_setzero_si256();
        for half in 0..2 {
            // SAFETY: `block` holds 64 bytes, so the 32 from `32 * half` (0 or 32) are in it, and
            // `_mm256_loadu_si256` reads them with no alignment required.
            let v = unsafe { _mm256_loadu_si256(block.as_ptr().add(32 * half).cast::<__m256i>()) };
            let mask = |m: __m256i| u64::from(_mm256_movemask_epi8(m) as u32) << (32 * half);
            let not_mask = |m: __m256i| u64::from(!(_mm256_movemask_epi8(m) as u32)) << (32 * half);
            let bits = _mm256_and_si256(
                _mm256_shuffle_epi8(low, _mm256_and_si256(v, nibble)),
                _mm256_shuffle_epi8(high, _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble)),
            );
            let none_of =
                |class: i8| _mm256_cmpeq_epi8(_mm256_and_si256(bits, _mm256_set1_epi8(class)), zero);
            c.quote |= mask(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'"' as i8)));
            c.backslash |= mask(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'\\' as i8)));
            c.structural |= not_mask(none_of(STRUCTURAL_BITS));
            c.space |= not_mask(none_of(SPACE_BITS));
            // A byte is at most 0x1f when the smaller of it and 0x1f is itself.
            c.control |= mask(_mm256_cmpeq_epi8(_mm256_min_epu8(v, _mm256_set1_epi8(0x1f)), v));
        }
        c
    }

    /// Each bit of `bits` the XOR of itself and all bits below it: the carry-less product of
    /// `bits` and all ones.
    #[inline]
    #[target_feature(enable = "pclmulqdq")]
    pub(super) fn prefix_xor(bits: u64) -> u64 {
        let product = _mm_clmulepi64_si128::<0>(_mm_set_epi64x(0, bits as i64), _mm_set1_epi8(-1));
        _mm_cvtsi128_si64(product) as u64
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Classifies blocks and takes prefix XORs with whichever kernel it is run with.
    struct Classify<'a> {
        blocks: &'a [[u8; 64]],
        masks: &'a [u64],
    }

    impl Job for Classify<'_> {
        type Output = (Vec<Classes>, Vec<u64>);

        fn run<K: Kernel>(self, kernel: K) -> Self::Output {
            (
                self.blocks.iter().map(|block| kernel.classify(block)).collect(),
                self.masks.iter().map(|&bits| kernel.prefix_xor(bits)).collect(),
            )
        }
    }

    fn prefix_xor_bit_by_bit(bits: u64) -> u64 {
        (0..64)
            .fold((0, false), |(out, on), i| {
                let on = on ^ (bits >> i & 1 == 1);
                (out | u64::from(on) << i, on)
            })
            .0
    }

    /// Every byte value at every position of a block: each kernel classifies it as the
    /// byte-at-a-time reference does.
    #[test]
    fn every_byte_at_every_position_is_classified_alike_by_every_kernel() {
        let blocks: Vec<[u8; 64]> =
            (0..=255u8).map(|start| std::array::from_fn(|i| start.wrapping_add(i as u8))).collect();
        let expected: Vec<Classes> = blocks.iter().map(classify_bytes).collect();
        let job = || Classify { blocks: &blocks, masks: &[] };
        assert_eq!(run_with(Choice::Fallback, job()).map(|(c, _)| c).as_ref(), Some(&expected));
        match run_with(Choice::Avx2, job()) {
            Some((classes, _)) => assert_eq!(classes, expected),
            None => assert_eq!(Choice::detected(), Choice::Fallback),
        }
    }

    proptest! {
        /// The prefix XOR of every kernel is the one a walk bit by bit makes.
        #[test]
        fn prefix_xors_are_alike(masks in proptest::collection::vec(any::<u64>(), 1..16)) {
            let expected: Vec<u64> = masks.iter().map(|&bits| prefix_xor_bit_by_bit(bits)).collect();
            for choice in [Choice::Fallback, Choice::Avx2] {
                if let Some((_, xors)) = run_with(choice, Classify { blocks: &[], masks: &masks }) {
                    prop_assert_eq!(&xors, &expected, "{:?}", choice);
                }
            }
        }
    }
}
