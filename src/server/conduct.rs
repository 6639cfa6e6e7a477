//! What an HTTP/2 client may do to the server (SPEC §7), beyond what hyper's server bounds
//! itself (streams at once, header lists, CONTINUATION frames, streams reset before they are
//! served): a connection's [`Conduct`].
//!
//! - **Control frames.** SETTINGS, PING, PRIORITY, and DATA, HEADERS or CONTINUATION frames that
//!   carry nothing and end nothing cost the server work (an acknowledgement, a lookup) and serve
//!   no request. Each connection has an allowance of them, [`CONTROL_BURST`] at once refilled at
//!   [`CONTROL_PER_SECOND`] (a browser or an HTTP client library sends a handful per
//!   connection); a client past it is flooding, and so is one whose header block (HEADERS and
//!   its CONTINUATION frames) grows past `RECAST_MAX_HEADER_BYTES`: its connection is closed with
//!   GOAWAY, its further frames not read ([`Watched`] reads the frames' headers as they pass).
//! - **Answers not taken.** An answer handed to the connection ([`Sent`]) counts in
//!   `RECAST_MAX_BUFFERED_BYTES` until its client has taken every byte, given to HTTP/2 in pieces
//!   of [`CHUNK`] bytes as the client's flow-control window lets them go (hyper's send buffer of a
//!   stream is kept to [`SEND_BUFFER`]; hyper holds one piece more while it waits). A
//!   connection whose untaken answers pass
//!   `RECAST_MAX_RESPONSE_BYTES` (what one HTTP/1.1 connection may hold: one answer) gets 503
//!   `overloaded` for its next calls until it takes them; one with answers waiting where no
//!   answer byte (DATA) has been written for `RECAST_HEADER_TIMEOUT_MS` (a window held shut) is
//!   closed with GOAWAY.

use std::convert::Infallible;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::State;

/// The most bytes of an answer given to HTTP/2 at once: what a stream's window must let go
/// before the next piece is taken.
pub(super) const CHUNK: usize = 16 * 1024;
/// A stream's send buffer in hyper's HTTP/2 server: what it may hold of an answer beyond the
/// client's window (its default is 400 KiB).
pub(super) const SEND_BUFFER: usize = 64 * 1024;
/// Control frames a client may send at once.
pub const CONTROL_BURST: u32 = 1_000;
/// Control frames a client may send each second, past its burst.
pub const CONTROL_PER_SECOND: u32 = 100;

/// One HTTP/2 connection's account of its client.
pub(super) struct Conduct {
    started: Instant,
    /// Answer bytes handed to the connection and not given to HTTP/2 yet.
    untaken: AtomicUsize,
    /// Answers hyper has not sent to their end yet.
    waiting: AtomicUsize,
    /// Milliseconds since `started` when answer bytes (DATA) were last written to the client, or
    /// when the first of the waiting answers began to wait.
    taken_ms: AtomicU64,
    /// The client sent control frames past its allowance.
    flooded: AtomicBool,
    /// The control frames it may still send, and when that was counted.
    allowance: Mutex<(f64, Instant)>,
}

impl Conduct {
    pub(super) fn new() -> Arc<Conduct> {
        let started = Instant::now();
        Arc::new(Conduct {
            started,
            untaken: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            taken_ms: AtomicU64::new(0),
            flooded: AtomicBool::new(false),
            allowance: Mutex::new((f64::from(CONTROL_BURST), started)),
        })
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Answer bytes handed to the connection and not taken yet.
    pub(super) fn untaken(&self) -> usize {
        self.untaken.load(Ordering::Relaxed)
    }

    /// Whether answers wait and no answer bytes were written for `within`.
    pub(super) fn stalled(&self, within: Duration) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
            && self.now_ms().saturating_sub(self.taken_ms.load(Ordering::Relaxed))
                >= within.as_millis() as u64
    }

    pub(super) fn flooded(&self) -> bool {
        self.flooded.load(Ordering::Relaxed)
    }

    fn hold(&self, bytes: usize) {
        self.untaken.fetch_add(bytes, Ordering::Relaxed);
        if self.waiting.fetch_add(1, Ordering::Relaxed) == 0 {
            self.taken_ms.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// Answer bytes given to HTTP/2.
    fn given(&self, bytes: usize) {
        self.untaken.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// An answer hyper has sent to its end, or let go of.
    fn ended(&self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }

    /// Answer bytes written to the client.
    fn written(&self) {
        self.taken_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// One control frame: whether the client is still within its allowance.
    fn control(&self) -> bool {
        let mut allowance = self.allowance.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        let refill = now.duration_since(allowance.1).as_secs_f64() * f64::from(CONTROL_PER_SECOND);
        *allowance = ((allowance.0 + refill).min(f64::from(CONTROL_BURST)) - 1.0, now);
        if allowance.0 < 0.0 {
            self.flood();
        }
        !self.flooded()
    }

    fn flood(&self) {
        self.flooded.store(true, Ordering::Relaxed);
    }
}

/// An answer's body as handed to hyper: given in pieces of [`CHUNK`] bytes, counted in
/// `RECAST_MAX_BUFFERED_BYTES` (and, over HTTP/2, in its connection's [`Conduct`]) until each
/// piece is given; waiting, over HTTP/2, until hyper lets go of it (its last piece sent).
pub(super) struct Sent {
    rest: Bytes,
    state: Arc<State>,
    /// The connection's account, while the answer waits there.
    conduct: Option<Arc<Conduct>>,
}

impl Sent {
    pub(super) fn new(bytes: Bytes, state: Arc<State>, conduct: Option<Arc<Conduct>>) -> Sent {
        state.buffered.add(bytes.len());
        let conduct = conduct.filter(|_| !bytes.is_empty());
        if let Some(conduct) = &conduct {
            conduct.hold(bytes.len());
        }
        Sent { rest: bytes, state, conduct }
    }
}

impl Body for Sent {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.rest.is_empty() {
            return Poll::Ready(None);
        }
        let n = self.rest.len().min(CHUNK);
        let piece = self.rest.split_to(n);
        self.state.buffered.release(n);
        if let Some(conduct) = &self.conduct {
            conduct.given(n);
        }
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

impl Drop for Sent {
    fn drop(&mut self) {
        self.state.buffered.release(self.rest.len());
        if let Some(conduct) = &self.conduct {
            conduct.given(self.rest.len());
            conduct.ended();
        }
    }
}

/// The frame types counted (RFC 9113 §6).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const CONTINUATION: u8 = 0x9;
/// DATA's and HEADERS' END_STREAM; SETTINGS' and PING's ACK.
const END_STREAM_OR_ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// The client's preface, before its first frame.
const PREFACE: usize = 24;

/// Frame headers read from a stream of HTTP/2 bytes as they pass.
struct Frames {
    /// Bytes to pass before the next frame header: the preface, then each frame's payload.
    skip: usize,
    /// The next frame header, as far as it has come.
    header: [u8; 9],
    have: usize,
}

impl Frames {
    fn new(skip: usize) -> Frames {
        Frames { skip, header: [0; 9], have: 0 }
    }

    /// Reads the frame headers in `bytes`, each told to `each` (its type, flags and payload's
    /// length), until `each` says stop: whether it never did.
    fn read(&mut self, mut bytes: &[u8], mut each: impl FnMut(u8, u8, usize) -> bool) -> bool {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < 9 {
                break;
            }
            self.have = 0;
            let length = u32::from_be_bytes([0, self.header[0], self.header[1], self.header[2]]) as usize;
            self.skip = length;
            if !each(self.header[3], self.header[4], length) {
                return false;
            }
        }
        true
    }
}

/// A client's connection whose frames' headers are read as they pass: the client's, to count its
/// control frames (once it has flooded, nothing more of it is read), and the server's, to see
/// answer bytes leave.
pub(super) struct Watched<S> {
    inner: S,
    conduct: Arc<Conduct>,
    from_client: Frames,
    to_client: Frames,
    /// `RECAST_MAX_HEADER_BYTES`: the most a header block may take, compressed (HPACK never
    /// makes a header list's counted size smaller than its block).
    most_block: usize,
    /// The bytes of the header block under way (HEADERS, then CONTINUATION until END_HEADERS).
    block: Option<usize>,
}

impl<S> Watched<S> {
    pub(super) fn new(inner: S, conduct: Arc<Conduct>, most_block: usize) -> Watched<S> {
        Watched {
            inner,
            conduct,
            from_client: Frames::new(PREFACE),
            to_client: Frames::new(0),
            most_block,
            block: None,
        }
    }

    /// Reads the client's frame headers in `bytes`: whether it is still within its allowance.
    fn read(&mut self, bytes: &[u8]) -> bool {
        let (conduct, block, most_block) = (&self.conduct, &mut self.block, self.most_block);
        self.from_client.read(bytes, |kind, flags, length| {
            // A header block longer than a head may be is a CONTINUATION flood, whatever its
            // frames carry.
            if matches!(kind, HEADERS | CONTINUATION) {
                let so_far = if kind == HEADERS { length } else { block.unwrap_or(0) + length };
                *block = (flags & END_HEADERS == 0).then_some(so_far);
                if so_far > most_block {
                    conduct.flood();
                    return false;
                }
            }
            let control = match kind {
                SETTINGS | PING => flags & END_STREAM_OR_ACK == 0,
                PRIORITY => true,
                DATA => length == 0 && flags & END_STREAM_OR_ACK == 0,
                HEADERS | CONTINUATION => length == 0 && flags & END_HEADERS == 0,
                _ => false,
            };
            !control || conduct.control()
        })
    }

    /// Reads the server's frame headers in `bytes`, written: answer bytes left.
    fn wrote(&mut self, bytes: &[u8]) {
        let conduct = &self.conduct;
        self.to_client.read(bytes, |kind, _, length| {
            if kind == DATA && length > 0 {
                conduct.written();
            }
            true
        });
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // A flooding client is read no further: its connection is being closed.
        if self.conduct.flooded() {
            return Poll::Pending;
        }
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        // The bytes read are hyper's either way; the connection (`h2::Http2`) sees the flood
        // as soon as hyper has handled them.
        self.read(&buf.filled()[before..]);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let n = std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, buf))?;
        self.wrote(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let n = std::task::ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, bufs))?;
        let mut left = n;
        for buf in bufs {
            let part = left.min(buf.len());
            self.wrote(&buf[..part]);
            left -= part;
            if left == 0 {
                break;
            }
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, length: usize) -> Vec<u8> {
        let mut out = (length as u32).to_be_bytes()[1..].to_vec();
        out.extend_from_slice(&[kind, flags, 0, 0, 0, 1]);
        out.resize(out.len() + length, 0);
        out
    }

    fn fresh() -> (Arc<Conduct>, Watched<()>) {
        let conduct = Conduct::new();
        let mut watched = Watched::new((), conduct.clone(), 16_384);
        assert!(watched.read(&[0; PREFACE]));
        (conduct, watched)
    }

    #[test]
    fn control_frames_past_the_allowance_flood_and_requests_do_not() {
        let (conduct, mut watched) = fresh();
        let mut bytes = Vec::new();
        // Requests, their data, acknowledgements and window updates are not control frames.
        for _ in 0..5_000 {
            bytes.extend(frame(HEADERS, END_HEADERS | END_STREAM_OR_ACK, 20));
            bytes.extend(frame(DATA, 0, 100));
            bytes.extend(frame(SETTINGS, END_STREAM_OR_ACK, 0));
            bytes.extend(frame(0x8, 0, 4));
        }
        // Read in uneven pieces, splitting headers.
        for piece in bytes.chunks(7) {
            assert!(watched.read(piece));
        }
        assert!(!conduct.flooded());
        let mut settings = Vec::new();
        for _ in 0..CONTROL_BURST {
            settings.extend(frame(SETTINGS, 0, 6));
        }
        assert!(watched.read(&settings), "the burst is allowed");
        assert!(!watched.read(&frame(PING, 0, 8)), "one more is not");
        assert!(conduct.flooded());
        // Empty frames that end nothing count; one that ends its stream or block does not.
        let (conduct, mut watched) = fresh();
        for _ in 0..CONTROL_BURST {
            assert!(watched.read(&frame(DATA, END_STREAM_OR_ACK, 0)));
            assert!(watched.read(&frame(HEADERS, END_HEADERS, 0)));
        }
        for _ in 0..CONTROL_BURST / 2 {
            assert!(watched.read(&frame(DATA, 0, 0)));
            assert!(watched.read(&frame(HEADERS, END_HEADERS, 0)));
            assert!(watched.read(&frame(CONTINUATION, 0, 0)));
        }
        assert!(!watched.read(&frame(PRIORITY, 0, 5)));
        assert!(conduct.flooded());
    }

    #[test]
    fn a_header_block_longer_than_a_head_may_be_floods() {
        let (conduct, mut watched) = fresh();
        // Blocks that end within the bound, again and again.
        for _ in 0..100 {
            assert!(watched.read(&frame(HEADERS, 0, 8_000)));
            assert!(watched.read(&frame(CONTINUATION, END_HEADERS, 8_000)));
        }
        assert!(!conduct.flooded());
        assert!(watched.read(&frame(HEADERS, 0, 1_000)));
        for _ in 0..15 {
            assert!(watched.read(&frame(CONTINUATION, 0, 1_000)));
        }
        assert!(!watched.read(&frame(CONTINUATION, 0, 1_000)), "17,000 bytes of one block");
        assert!(conduct.flooded());
    }

    #[test]
    fn answers_waiting_with_no_data_written_stall() {
        let (conduct, mut watched) = fresh();
        let within = Duration::from_millis(30);
        assert!(!conduct.stalled(Duration::ZERO), "nothing waits");
        conduct.hold(100);
        std::thread::sleep(within * 2);
        // Frames other than DATA leave no answer bytes: still stalled.
        watched.wrote(&frame(HEADERS, END_HEADERS, 30));
        watched.wrote(&frame(PING, END_STREAM_OR_ACK, 8));
        watched.wrote(&frame(DATA, END_STREAM_OR_ACK, 0));
        assert!(conduct.stalled(within));
        // A DATA frame written in two pieces, its header split.
        let data = frame(DATA, 0, 100);
        watched.wrote(&data[..5]);
        assert!(conduct.stalled(within));
        watched.wrote(&data[5..]);
        assert!(!conduct.stalled(within));
        std::thread::sleep(within * 2);
        assert!(conduct.stalled(within));
        conduct.given(100);
        conduct.ended();
        assert!(!conduct.stalled(within), "nothing waits");
        assert_eq!(conduct.untaken(), 0);
    }
}
