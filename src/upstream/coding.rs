//! Where an upstream answer's body goes as it is read: straight into the answer's buffer, or,
//! for a body in a content coding (`gzip`, `br`), through a decoder as its bytes arrive, into a
//! buffer bounded on the decoded size. A body that decodes past the limit (a "bomb") is stopped
//! there: nothing past the limit is decoded, and the rest of it is never read.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use brotli_decompressor::writer::DecompressorWriterCustomAlloc;
use brotli_decompressor::{Allocator, SliceWrapper, SliceWrapperMut, StandardAlloc};
use tokio::io::AsyncReadExt;

use super::wire::{Failed, READ_SIZE, Stream};
use crate::http1;
use crate::json::PADDING;

/// An answer's `Content-Encoding`, as far as recast reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Coding {
    Identity,
    Gzip,
    Br,
    /// Anything else, by its name as the upstream gave it (a list of codings included).
    Unknown(String),
}

impl std::fmt::Display for Coding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Coding::Identity => "identity",
            Coding::Gzip => "gzip",
            Coding::Br => "br",
            Coding::Unknown(name) => name,
        })
    }
}

impl Coding {
    /// The coding a `Content-Encoding` value names.
    pub(super) fn of(value: &[u8]) -> Coding {
        let value = value.trim_ascii();
        if value.is_empty() || value.eq_ignore_ascii_case(b"identity") {
            Coding::Identity
        } else if value.eq_ignore_ascii_case(b"gzip") || value.eq_ignore_ascii_case(b"x-gzip") {
            Coding::Gzip
        } else if value.eq_ignore_ascii_case(b"br") {
            Coding::Br
        } else {
            Coding::Unknown(String::from_utf8_lossy(value).into_owned())
        }
    }
}

/// What the framing readers hand a body's bytes to. `taken` counts the bytes as they came on the
/// wire (what the framing and the wire limit count), whatever the sink makes of them.
pub(super) trait Sink {
    /// Body bytes taken so far, as on the wire.
    fn taken(&self) -> usize;
    /// Makes room for `additional` more bytes, never past `most` bytes of capacity (a plain body's
    /// buffer; a decoder keeps its own bound).
    fn reserve(&mut self, additional: usize, most: usize);
    /// Takes bytes that were already read.
    fn take_slice(&mut self, bytes: &[u8]) -> Result<(), Failed>;
    /// Reads at most `wanted` bytes from `stream` and takes them; `Ok(0)` at the end of the stream.
    async fn read_from(&mut self, stream: &mut Stream, wanted: usize) -> Result<usize, Failed>;
}

/// A plain body goes into the answer's buffer as it is.
impl Sink for Vec<u8> {
    fn taken(&self) -> usize {
        self.len()
    }

    fn reserve(&mut self, additional: usize, most: usize) {
        http1::reserve_within(self, additional, most);
    }

    fn take_slice(&mut self, bytes: &[u8]) -> Result<(), Failed> {
        self.extend_from_slice(bytes);
        Ok(())
    }

    async fn read_from(&mut self, stream: &mut Stream, wanted: usize) -> Result<usize, Failed> {
        stream.take(wanted as u64).read_buf(self).await.map_err(|e| Failed::Broken(e.to_string()))
    }
}

/// Where an answer's body goes as it is read, whatever brings it (HTTP/1.1's framing in `wire`,
/// HTTP/2's data frames in `h2`): into the answer's buffer as it is, or through the decoder of
/// its coding, bounded on the decoded size; [`Body::finish`] hands it over with the room the
/// parser's padding takes. The one reader of bounded bodies.
pub(super) enum Body {
    Plain(Vec<u8>),
    Decoded(Decoding),
}

impl Body {
    /// Where the body of an answer in `coding` goes: decoded when `decode` (a body recast reads;
    /// one read only to keep the framing is taken as it is, whatever its coding), within `limit`
    /// decoded bytes. A coding recast does not decode is refused.
    pub(super) fn new(coding: &Coding, decode: bool, limit: usize) -> Result<Body, Failed> {
        Ok(match coding {
            Coding::Identity => Body::Plain(Vec::new()),
            _ if !decode => Body::Plain(Vec::new()),
            Coding::Unknown(name) => return Err(Failed::UnknownCoding(name.clone())),
            coding => Decoding::new(coding, limit).map_or(Body::Plain(Vec::new()), Body::Decoded),
        })
    }

    /// Takes `bytes` that arrived, refused once the body would pass `limit` bytes as they come.
    pub(super) fn take_within(&mut self, bytes: &[u8], limit: usize) -> Result<(), Failed> {
        if self.taken() + bytes.len() > limit {
            return Err(Failed::TooLarge);
        }
        self.reserve(bytes.len() + PADDING, limit + PADDING);
        self.take_slice(bytes)
    }

    /// The body, decoded, with room for the parser's padding after it.
    pub(super) fn finish(self) -> Result<Vec<u8>, Failed> {
        match self {
            Body::Plain(mut body) => {
                let most = body.len() + PADDING;
                http1::reserve_within(&mut body, PADDING, most);
                Ok(body)
            }
            Body::Decoded(decoding) => decoding.finish(),
        }
    }
}

impl Sink for Body {
    fn taken(&self) -> usize {
        match self {
            Body::Plain(body) => body.taken(),
            Body::Decoded(decoding) => decoding.taken(),
        }
    }

    fn reserve(&mut self, additional: usize, most: usize) {
        match self {
            Body::Plain(body) => Sink::reserve(body, additional, most),
            Body::Decoded(decoding) => decoding.reserve(additional, most),
        }
    }

    fn take_slice(&mut self, bytes: &[u8]) -> Result<(), Failed> {
        match self {
            Body::Plain(body) => body.take_slice(bytes),
            Body::Decoded(decoding) => decoding.take_slice(bytes),
        }
    }

    async fn read_from(&mut self, stream: &mut Stream, wanted: usize) -> Result<usize, Failed> {
        match self {
            Body::Plain(body) => body.read_from(stream, wanted).await,
            Body::Decoded(decoding) => decoding.read_from(stream, wanted).await,
        }
    }
}

/// A coded body: each read goes through the decoder into a buffer of at most `limit` decoded
/// bytes.
pub(super) struct Decoding {
    decoder: Decoder,
    /// Encoded bytes taken so far.
    taken: usize,
    /// Where reads land before they are decoded.
    scratch: Box<[u8]>,
}

enum Decoder {
    /// Several gzip members one after another are one body (RFC 1952 §2.2). Its memory is fixed:
    /// a 32 KiB window and the inflater's tables, and header fields of at most 64 KiB each.
    Gzip(Box<flate2::write::MultiGzDecoder<Bounded>>),
    /// Its byte buffers (the window's ring buffer, context maps) come from `budget`.
    Br(Box<BrDecoder>, Arc<Budget>),
}

type BrDecoder = DecompressorWriterCustomAlloc<Bounded, Cell, Budgeted, StandardAlloc, StandardAlloc>;

/// What a brotli decoder may hold in byte buffers at once. A stream declares its window (up to
/// 16 MiB) and the length of each metablock, and the decoder sizes its ring buffer from them; a
/// ring buffer larger than the decoded body can grow is never needed, since a brotli stream
/// cannot refer back past its own start. So the budget is what a body of `limit` bytes needs:
/// a ring buffer of the next power of two, half that again while it grows (the old buffer is
/// copied into the new), and room for the context maps. A stream that asks for more would decode
/// past the limit, and is refused as too large before anything is allocated.
#[derive(Debug)]
struct Budget {
    most: usize,
    held: AtomicUsize,
    /// The most it held at once.
    peak: AtomicUsize,
    /// Set when an allocation was refused.
    refused: AtomicBool,
}

impl Budget {
    fn for_limit(limit: usize) -> Arc<Budget> {
        let ring = limit.max(1).checked_next_power_of_two().unwrap_or(usize::MAX);
        let most = ring.saturating_add(ring / 2).saturating_add(64 << 10);
        Arc::new(Budget {
            most,
            held: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            refused: AtomicBool::new(false),
        })
    }

    fn refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }
}

/// The allocator of a brotli decoder's byte buffers: within its [`Budget`], else an empty cell,
/// which the decoder takes as an allocation failure and stops on.
struct Budgeted(Arc<Budget>);

impl Allocator<u8> for Budgeted {
    type AllocatedMemory = Cell;

    fn alloc_cell(&mut self, len: usize) -> Cell {
        let budget = &self.0;
        let held = budget.held.fetch_add(len, Ordering::Relaxed);
        if held.saturating_add(len) > budget.most {
            budget.held.fetch_sub(len, Ordering::Relaxed);
            budget.refused.store(true, Ordering::Relaxed);
            return Cell::default();
        }
        budget.peak.fetch_max(held + len, Ordering::Relaxed);
        Cell { bytes: vec![0; len].into_boxed_slice(), budget: Some(budget.clone()) }
    }

    fn free_cell(&mut self, cell: Cell) {
        drop(cell);
    }
}

/// A byte buffer of a brotli decoder, handed back to its budget when dropped (the decoder drops
/// some without calling `free_cell`).
#[derive(Default)]
struct Cell {
    bytes: Box<[u8]>,
    budget: Option<Arc<Budget>>,
}

impl Drop for Cell {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.held.fetch_sub(self.bytes.len(), Ordering::Relaxed);
        }
    }
}

impl SliceWrapper<u8> for Cell {
    fn slice(&self) -> &[u8] {
        &self.bytes
    }
}

impl SliceWrapperMut<u8> for Cell {
    fn slice_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

/// The decoded body, refusing to grow past `limit` bytes.
struct Bounded {
    out: Vec<u8>,
    limit: usize,
    /// Set when a write would have passed the limit.
    over: bool,
}

impl Write for Bounded {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if bytes.len() > self.limit - self.out.len() {
            self.over = true;
            return Err(std::io::Error::other("the decoded body is over the limit"));
        }
        let step = bytes.len().max(READ_SIZE).min(self.limit - self.out.len());
        http1::reserve_within(&mut self.out, step + PADDING, self.limit + PADDING);
        self.out.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Decoding {
    /// A sink decoding `coding` (gzip or br) into at most `limit` bytes; `None` for a coding it
    /// does not decode.
    pub(super) fn new(coding: &Coding, limit: usize) -> Option<Decoding> {
        let out = Bounded { out: Vec::with_capacity(READ_SIZE.min(limit) + PADDING), limit, over: false };
        let decoder = match coding {
            Coding::Gzip => Decoder::Gzip(Box::new(flate2::write::MultiGzDecoder::new(out))),
            Coding::Br => {
                let budget = Budget::for_limit(limit);
                // Its output buffer is not the budget's: it is fixed, like the read scratch.
                let buffer = Cell { bytes: vec![0; READ_SIZE].into_boxed_slice(), budget: None };
                let decoder =
                    BrDecoder::new(out, buffer, Budgeted(budget.clone()), StandardAlloc {}, StandardAlloc {});
                Decoder::Br(Box::new(decoder), budget)
            }
            Coding::Identity | Coding::Unknown(_) => return None,
        };
        Some(Decoding { decoder, taken: 0, scratch: vec![0; READ_SIZE].into_boxed_slice() })
    }

    /// The decoded body, with room for the JSON parser's padding, once every encoded byte is in.
    /// A body that ends before its coding does is undecodable.
    pub(super) fn finish(mut self) -> Result<Vec<u8>, Failed> {
        let finished = match &mut self.decoder {
            Decoder::Gzip(decoder) => decoder.try_finish(),
            Decoder::Br(decoder, _) => decoder.close(),
        };
        finished.map_err(|e| self.decoder.failed(&e))?;
        let mut bounded = match self.decoder {
            Decoder::Gzip(decoder) => decoder.finish().map_err(|e| Failed::Undecodable(e.to_string()))?,
            Decoder::Br(decoder, _) => decoder
                .into_inner()
                .map_err(|_| Failed::Undecodable("the upstream's br body ends before its end".into()))?,
        };
        http1::reserve_within(&mut bounded.out, PADDING, bounded.limit + PADDING);
        Ok(bounded.out)
    }
}

impl Decoder {
    fn name(&self) -> &'static str {
        match self {
            Decoder::Gzip(_) => "gzip",
            Decoder::Br(..) => "br",
        }
    }

    fn bounded(&self) -> &Bounded {
        match self {
            Decoder::Gzip(decoder) => decoder.get_ref(),
            Decoder::Br(decoder, _) => decoder.get_ref(),
        }
    }

    /// A decoder's failure: the limit (of the decoded bytes, or of the memory a body within it
    /// needs), or a body that is not in its coding.
    fn failed(&self, e: &std::io::Error) -> Failed {
        let over_budget = matches!(self, Decoder::Br(_, budget) if budget.refused());
        if self.bounded().over || over_budget {
            Failed::TooLarge
        } else {
            Failed::Undecodable(format!("the upstream's {} body cannot be decoded: {e}", self.name()))
        }
    }

    fn decode(&mut self, bytes: &[u8]) -> Result<(), Failed> {
        let written = match self {
            Decoder::Gzip(decoder) => decoder.write_all(bytes),
            Decoder::Br(decoder, _) => decoder.write_all(bytes),
        };
        written.map_err(|e| self.failed(&e))
    }
}

impl Sink for Decoding {
    fn taken(&self) -> usize {
        self.taken
    }

    fn reserve(&mut self, _additional: usize, _most: usize) {}

    fn take_slice(&mut self, bytes: &[u8]) -> Result<(), Failed> {
        self.taken += bytes.len();
        self.decoder.decode(bytes)
    }

    async fn read_from(&mut self, stream: &mut Stream, wanted: usize) -> Result<usize, Failed> {
        let room = wanted.min(self.scratch.len());
        let n = stream.read(&mut self.scratch[..room]).await.map_err(|e| Failed::Broken(e.to_string()))?;
        self.taken += n;
        self.decoder.decode(&self.scratch[..n])?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    fn decode(coding: Coding, encoded: &[u8], limit: usize) -> Result<Vec<u8>, Failed> {
        let mut sink = Decoding::new(&coding, limit).unwrap();
        // In small pieces, as reads would bring it.
        for piece in encoded.chunks(7) {
            sink.take_slice(piece)?;
        }
        assert_eq!(sink.taken(), encoded.len());
        sink.finish()
    }

    /// `bytes` in brotli with a window of 2^`window_bits` bytes.
    fn brotli(bytes: &[u8], window_bits: i32) -> Vec<u8> {
        let params =
            brotli::enc::BrotliEncoderParams { lgwin: window_bits, quality: 5, ..Default::default() };
        let mut out = Vec::new();
        brotli::BrotliCompress(&mut &bytes[..], &mut out, &params).unwrap();
        out
    }

    /// Decodes a br body whole, in read-sized pieces; the outcome and the most the decoder's
    /// byte buffers held at once.
    fn decode_br(encoded: &[u8], limit: usize) -> (Result<Vec<u8>, Failed>, usize, usize) {
        let mut sink = Decoding::new(&Coding::Br, limit).unwrap();
        let Decoder::Br(_, budget) = &sink.decoder else { unreachable!() };
        let budget = budget.clone();
        let mut outcome = Ok(());
        for piece in encoded.chunks(READ_SIZE) {
            outcome = sink.take_slice(piece);
            if outcome.is_err() {
                break;
            }
        }
        let decoded = outcome.and_then(|()| sink.finish());
        (decoded, budget.peak.load(Ordering::Relaxed), budget.most)
    }

    #[test]
    fn a_brotli_bomb_with_a_large_window_is_refused_within_the_memory_its_limit_allows() {
        // 16 MiB of one byte, in a 16 MiB window: the decoder would size its ring buffer by the
        // window and the metablocks' lengths, far past what a 1 MiB body needs.
        let bomb = brotli(&vec![b' '; 16 << 20], 24);
        assert!(bomb.len() < 64 << 10, "{} bytes", bomb.len());
        let (decoded, peak, most) = decode_br(&bomb, 1 << 20);
        assert!(matches!(decoded, Err(Failed::TooLarge)), "{decoded:?}");
        assert!(peak <= most, "{peak} bytes held, over the budget of {most}");
        assert!(most < 2 << 20, "the budget of a 1 MiB limit is {most} bytes");
    }

    #[test]
    fn bodies_within_the_limit_decode_whatever_window_they_declare() {
        let body: Vec<u8> = (0..200_000u32).flat_map(|n| format!("{n},").into_bytes()).collect();
        for window_bits in [10, 16, 22, 24] {
            let encoded = brotli(&body, window_bits);
            // Exactly at the limit, and far below it.
            for limit in [body.len(), body.len() * 4] {
                let (decoded, peak, most) = decode_br(&encoded, limit);
                assert_eq!(decoded.as_deref().ok(), Some(&body[..]), "window 2^{window_bits}, limit {limit}");
                assert!(peak <= most);
            }
            let (decoded, _, _) = decode_br(&encoded, body.len() - 1);
            assert!(matches!(decoded, Err(Failed::TooLarge)), "window 2^{window_bits}: {decoded:?}");
        }
        // A small body in the largest window, under a small limit.
        let (decoded, _, _) = decode_br(&brotli(br#"{"a":1}"#, 24), 100);
        assert_eq!(decoded.unwrap(), br#"{"a":1}"#);
    }

    #[test]
    fn a_gzip_bomb_over_many_members_stops_at_the_limit() {
        let member = gzip(&vec![b' '; 1 << 20]);
        let bomb: Vec<u8> = std::iter::repeat_n(member.as_slice(), 64).flatten().copied().collect();
        assert!(matches!(decode(Coding::Gzip, &bomb, 4 << 20), Err(Failed::TooLarge)));
        let four: Vec<u8> = std::iter::repeat_n(member.as_slice(), 4).flatten().copied().collect();
        assert_eq!(decode(Coding::Gzip, &four, 4 << 20).unwrap().len(), 4 << 20);
    }

    #[test]
    fn codings_are_read_by_name_whatever_their_case() {
        assert_eq!(Coding::of(b" GZip "), Coding::Gzip);
        assert_eq!(Coding::of(b"x-gzip"), Coding::Gzip);
        assert_eq!(Coding::of(b"br"), Coding::Br);
        assert_eq!(Coding::of(b""), Coding::Identity);
        assert_eq!(Coding::of(b"Identity"), Coding::Identity);
        assert_eq!(Coding::of(b"zstd"), Coding::Unknown("zstd".into()));
        assert_eq!(Coding::of(b"gzip, br"), Coding::Unknown("gzip, br".into()));
        assert!(Decoding::new(&Coding::Identity, 10).is_none());
    }

    #[test]
    fn a_gzip_body_of_several_members_decodes_whole() {
        let mut encoded = gzip(b"{\"a\":");
        encoded.extend(gzip(b"1}"));
        assert_eq!(&decode(Coding::Gzip, &encoded, 100).unwrap()[..], b"{\"a\":1}");
    }

    #[test]
    fn decoding_stops_at_the_limit_and_leaves_room_for_padding_below_it() {
        let encoded = gzip(&[b' '; 10_000]);
        assert!(matches!(decode(Coding::Gzip, &encoded, 9_999), Err(Failed::TooLarge)));
        let decoded = decode(Coding::Gzip, &encoded, 10_000).unwrap();
        assert_eq!(decoded.len(), 10_000);
        assert!(decoded.capacity() >= 10_000 + PADDING);
    }

    #[test]
    fn bodies_not_in_their_coding_are_undecodable_not_too_large() {
        let failed = decode(Coding::Gzip, b"{\"plain\":true}", 100).unwrap_err();
        assert!(matches!(&failed, Failed::Undecodable(why) if why.contains("gzip")), "{failed:?}");
        let failed = decode(Coding::Br, &[0xff; 40], 100).unwrap_err();
        assert!(matches!(&failed, Failed::Undecodable(why) if why.contains("br")), "{failed:?}");
        // Cut short: the coding's end never comes.
        let encoded = gzip(&[b'x'; 1000]);
        let failed = decode(Coding::Gzip, &encoded[..encoded.len() / 2], 10_000).unwrap_err();
        assert!(matches!(failed, Failed::Undecodable(_)), "{failed:?}");
    }
}
