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
//! - **Answers not taken.** An answer handed to the connection ([`Sent`]) is given to HTTP/2 in
//!   pieces of [`CHUNK`] bytes as the client's flow-control window lets them go (hyper's send
//!   buffer of a stream is kept to [`SEND_BUFFER`]; hyper holds one piece more while it waits),
//!   and counts as not taken until given. A connection whose answers not taken pass
//!   `RECAST_MAX_RESPONSE_BYTES` (what one HTTP/1.1 connection may hold: one answer) answers its
//!   next calls 503 `overloaded`, before they are made, until it takes them; one where an answer
//!   has waited with no piece of it given for `RECAST_HEADER_TIMEOUT_MS` (a window held shut,
//!   whatever the client does on its other streams) is closed with GOAWAY.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, ReadBuf};

use super::connection::Busy;

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
    /// The answers hyper has not sent to their end yet, each with when a piece of it was last
    /// given (milliseconds since `started`), by a number of their own.
    waiting: Mutex<Vec<(u64, u64)>>,
    next: AtomicU64,
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
            waiting: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
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

    /// Whether an answer has waited with no piece of it given for `within`.
    pub(super) fn stalled(&self, within: Duration) -> bool {
        let now = self.now_ms();
        let within = within.as_millis() as u64;
        self.waiting().iter().any(|&(_, given)| now.saturating_sub(given) >= within)
    }

    pub(super) fn flooded(&self) -> bool {
        self.flooded.load(Ordering::Relaxed)
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Vec<(u64, u64)>> {
        self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An answer of `bytes` handed to the connection: its number.
    fn hold(&self, bytes: usize) -> u64 {
        self.untaken.fetch_add(bytes, Ordering::Relaxed);
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        self.waiting().push((number, now));
        number
    }

    /// A piece of `bytes` of answer `number` given to HTTP/2.
    fn given(&self, number: u64, bytes: usize) {
        self.untaken.fetch_sub(bytes, Ordering::Relaxed);
        let now = self.now_ms();
        if let Some(answer) = self.waiting().iter_mut().find(|(n, _)| *n == number) {
            answer.1 = now;
        }
    }

    /// Answer `number` sent to its end, or let go of, with `bytes` not given.
    fn ended(&self, number: u64, bytes: usize) {
        self.untaken.fetch_sub(bytes, Ordering::Relaxed);
        self.waiting().retain(|(n, _)| *n != number);
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

/// An answer's body as handed to hyper: given in pieces of [`CHUNK`] bytes; over HTTP/2, counted
/// in its connection's [`Conduct`] until given, and waiting there until hyper lets go of it (its
/// last piece sent). It holds the request's place in its connection's activity until then, so
/// a long download is not an idle connection.
pub(super) struct Sent {
    rest: Bytes,
    /// The connection's account and the answer's number there, while it waits.
    conduct: Option<(Arc<Conduct>, u64)>,
    _busy: Option<Busy>,
}

impl Sent {
    pub(super) fn new(bytes: Bytes, conduct: Option<Arc<Conduct>>, busy: Busy) -> Sent {
        let conduct = conduct.filter(|_| !bytes.is_empty()).map(|conduct| {
            let number = conduct.hold(bytes.len());
            (conduct, number)
        });
        Sent { rest: bytes, conduct, _busy: Some(busy) }
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
        if let Some((conduct, number)) = &self.conduct {
            conduct.given(*number, n);
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
        if let Some((conduct, number)) = &self.conduct {
            conduct.ended(*number, self.rest.len());
        }
    }
}

/// The frame types counted (RFC 9113 §6).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const CONTINUATION: u8 = 0x9;
const RST_STREAM: u8 = 0x3;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
/// DATA's and HEADERS' END_STREAM; SETTINGS' and PING's ACK.
const END_STREAM_OR_ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// DATA's and HEADERS' PADDED, HEADERS' PRIORITY.
const PADDED: u8 = 0x8;
const WITH_PRIORITY: u8 = 0x20;
/// The longest a DATA or HEADERS frame may be and still carry nothing: its pad length's byte,
/// 255 bytes of padding, and HEADERS' 5 bytes of priority.
const MOST_EMPTY: usize = 1 + 255 + 5;
/// How many times `RECAST_MAX_HEADER_BYTES` a header block may take before its connection is
/// closed: up to 4 times, hyper's HTTP/2 answers the stream 431 and keeps the connection (its
/// bound for a header list it still reads), and a block is never larger than its list plus
/// padding.
const BLOCK_TIMES: usize = 4;
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

/// A client's connection whose frames' headers are read as they pass, to count its control
/// frames; once it has flooded, nothing more of it is read.
pub(super) struct Watched<S> {
    inner: S,
    conduct: Arc<Conduct>,
    from_client: Frames,
    /// The most a header block may take ([`BLOCK_TIMES`] `RECAST_MAX_HEADER_BYTES`, and its
    /// padding: HPACK never makes a header list's counted size smaller than its block).
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
            most_block: most_block.saturating_mul(BLOCK_TIMES).saturating_add(MOST_EMPTY),
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
            // A client never pushes: one that does is flooding whatever it means.
            if kind == PUSH_PROMISE {
                conduct.flood();
                return false;
            }
            // Frames that may carry nothing: empty, or only padding and priority (a frame that
            // ends its stream or block ends something).
            let empty = |ends: u8| {
                let most = if flags & (PADDED | WITH_PRIORITY) != 0 { MOST_EMPTY } else { 0 };
                flags & ends == 0 && length <= most
            };
            let control = match kind {
                // SETTINGS, and PING whether it asks or answers: recast sends no PING of its own
                // but the one that closes a connection.
                SETTINGS => flags & END_STREAM_OR_ACK == 0,
                PING | PRIORITY => true,
                DATA => empty(END_STREAM_OR_ACK),
                HEADERS => empty(END_HEADERS),
                CONTINUATION => length == 0 && flags & END_HEADERS == 0,
                RST_STREAM | GOAWAY | WINDOW_UPDATE => false,
                // Types it does not know serve no request.
                _ => true,
            };
            !control || conduct.control()
        })
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

crate::http1::write_through!(Watched, inner);

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
            assert!(watched.read(&frame(HEADERS, 0, 30_000)));
            assert!(watched.read(&frame(CONTINUATION, END_HEADERS, 30_000)));
        }
        assert!(!conduct.flooded());
        assert!(watched.read(&frame(HEADERS, 0, 1_000)));
        // Up to four times the bound, and padding: hyper answers 431 on the stream.
        for _ in 0..64 {
            assert!(watched.read(&frame(CONTINUATION, 0, 1_000)));
        }
        assert!(!watched.read(&frame(CONTINUATION, 0, 1_000)), "66,000 bytes of one block");
        assert!(conduct.flooded());
    }

    #[test]
    fn an_answer_that_gives_nothing_for_the_bound_stalls_whatever_the_others_do() {
        let conduct = Conduct::new();
        let within = Duration::from_millis(30);
        assert!(!conduct.stalled(Duration::ZERO), "nothing waits");
        let held = conduct.hold(100_000);
        let moving = conduct.hold(100_000);
        assert_eq!(conduct.untaken(), 200_000);
        std::thread::sleep(within * 2);
        assert!(conduct.stalled(within));
        // Another answer's pieces do not move the one held.
        conduct.given(moving, CHUNK);
        assert!(conduct.stalled(within), "one answer still gives nothing");
        conduct.given(held, CHUNK);
        assert!(!conduct.stalled(within));
        std::thread::sleep(within * 2);
        assert!(conduct.stalled(within));
        conduct.ended(held, 100_000 - CHUNK);
        conduct.ended(moving, 100_000 - CHUNK);
        assert!(!conduct.stalled(Duration::ZERO), "nothing waits");
        assert_eq!(conduct.untaken(), 0);
    }

    #[test]
    fn pings_either_way_unknown_frames_and_padding_alone_are_control_frames_and_a_push_floods() {
        let (conduct, mut watched) = fresh();
        for _ in 0..CONTROL_BURST / 4 {
            assert!(watched.read(&frame(PING, END_STREAM_OR_ACK, 8)));
            assert!(watched.read(&frame(0xa, 0, 16)));
            assert!(watched.read(&frame(DATA, PADDED, 200)));
            assert!(watched.read(&frame(HEADERS, WITH_PRIORITY | PADDED, 6)));
        }
        assert!(!watched.read(&frame(PING, 0, 8)));
        assert!(conduct.flooded());
        let (conduct, mut watched) = fresh();
        assert!(!watched.read(&frame(PUSH_PROMISE, END_HEADERS, 10)));
        assert!(conduct.flooded());
    }
}
