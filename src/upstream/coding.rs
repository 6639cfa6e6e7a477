//! Where an upstream answer's body goes as it is read: straight into the answer's buffer, or,
//! for a body in a content coding (`gzip`, `br`), through a decoder as its bytes arrive, into a
//! buffer bounded on the decoded size. A body that decodes past the limit (a "bomb") is stopped
//! there: nothing past the limit is decoded, and the rest of it is never read.

use std::io::Write;

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
    /// Several gzip members one after another are one body (RFC 1952 §2.2).
    Gzip(Box<flate2::write::MultiGzDecoder<Bounded>>),
    Br(Box<brotli_decompressor::DecompressorWriter<Bounded>>),
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
            Coding::Br => Decoder::Br(Box::new(brotli_decompressor::DecompressorWriter::new(out, READ_SIZE))),
            Coding::Identity | Coding::Unknown(_) => return None,
        };
        Some(Decoding { decoder, taken: 0, scratch: vec![0; READ_SIZE].into_boxed_slice() })
    }

    /// The decoded body, with room for the JSON parser's padding, once every encoded byte is in.
    /// A body that ends before its coding does is undecodable.
    pub(super) fn finish(mut self) -> Result<Vec<u8>, Failed> {
        let finished = match &mut self.decoder {
            Decoder::Gzip(decoder) => decoder.try_finish(),
            Decoder::Br(decoder) => decoder.close(),
        };
        finished.map_err(|e| self.decoder.failed(&e))?;
        let mut bounded = match self.decoder {
            Decoder::Gzip(decoder) => decoder.finish().map_err(|e| Failed::Undecodable(e.to_string()))?,
            Decoder::Br(decoder) => decoder
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
            Decoder::Br(_) => "br",
        }
    }

    fn bounded(&self) -> &Bounded {
        match self {
            Decoder::Gzip(decoder) => decoder.get_ref(),
            Decoder::Br(decoder) => decoder.get_ref(),
        }
    }

    /// A decoder's failure: the limit, or a body that is not in its coding.
    fn failed(&self, e: &std::io::Error) -> Failed {
        if self.bounded().over {
            Failed::TooLarge
        } else {
            Failed::Undecodable(format!("the upstream's {} body cannot be decoded: {e}", self.name()))
        }
    }

    fn decode(&mut self, bytes: &[u8]) -> Result<(), Failed> {
        let written = match self {
            Decoder::Gzip(decoder) => decoder.write_all(bytes),
            Decoder::Br(decoder) => decoder.write_all(bytes),
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
