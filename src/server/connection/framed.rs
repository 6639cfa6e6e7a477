//! What hyper reads through: [`Framed`], which hands it one request head at a time, and
//! [`RequestBody`], which tells the connection's [`Activity`] when a body has been read to its end.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, ReadBuf};

use super::Activity;

/// A request's body as hyper reads it, telling the connection's [`Activity`] when it has been
/// read to its end.
pub(in crate::server) struct RequestBody {
    inner: Incoming,
    activity: Arc<Activity>,
}

impl RequestBody {
    pub(in crate::server) fn new(inner: Incoming, activity: Arc<Activity>) -> RequestBody {
        activity.told_body_length(inner.size_hint().exact());
        if inner.is_end_stream() {
            activity.body_read();
        }
        RequestBody { inner, activity }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.activity.body_read();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The client's stream as hyper reads it after the hand-off (`lane::hand_off`): one request at a
/// time, so the connection sees bytes of the next request arrive even when hyper would have read
/// them together with the one it serves.
///
/// A head is handed up to its blank line; the body, once the request has said its length through
/// [`RequestBody::new`], exactly to its end; what follows is kept until hyper reads again. Bytes
/// kept beyond a request are the start of the next one, so its head timeout runs from when they
/// came ([`Activity::head_begun_at_kept`]), while hyper, which would otherwise hold them unseen in its
/// own buffer, is still busy with the request before. A body of no declared length (chunked), or
/// a head hyper did not take where this one saw it end, switch the framing off for the rest of
/// the connection: bytes then pass straight through, and a head begins only with bytes read once
/// a body has been read ([`Activity::read`]).
pub(in crate::server) struct Framed<S> {
    stream: S,
    /// Bytes read and not yet handed to hyper: `kept[at..len]`.
    kept: Box<[u8]>,
    at: usize,
    len: usize,
    pub(super) phase: Phase,
    activity: Arc<Activity>,
}

/// Where a [`Framed`] stream is in the request it hands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Handing a head; the search for its end so far.
    Head(HeadEnd),
    /// The head is handed: hyper calls the service next, which says how long the body is.
    Handed,
    /// Handing a body with this many bytes left.
    Body(u64),
    /// No framing: everything passes straight through.
    Through,
}

/// The search for the blank line that ends a request head (`\n\n` or `\n\r\n`, as
/// [`crate::http1::has_blank_line`] reads it), a byte at a time across reads; empty lines before
/// the request line, which a server skips (RFC 9112 §2.2), do not count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct HeadEnd {
    /// A byte other than CR or LF has come.
    begun: bool,
    /// The last two bytes of the head so far.
    last: [u8; 2],
}

impl HeadEnd {
    /// How many of `bytes` belong to the head, when it ends within them.
    fn end_in(&mut self, bytes: &[u8]) -> Option<usize> {
        for (i, &byte) in bytes.iter().enumerate() {
            if !self.begun {
                if byte == b'\r' || byte == b'\n' {
                    continue;
                }
                self.begun = true;
            } else if byte == b'\n' && (self.last[1] == b'\n' || self.last == *b"\n\r") {
                return Some(i + 1);
            }
            self.last = [self.last[1], byte];
        }
        None
    }
}

/// Bytes a [`Framed`] stream reads at a time.
const FRAMED_READ: usize = 8 * 1024;

impl<S> Framed<S> {
    /// Frames `stream` for hyper, which gets `read` (bytes the lane already read) first.
    pub(in crate::server) fn new(stream: S, read: &[u8], activity: Arc<Activity>) -> Framed<S> {
        let mut kept = vec![0; FRAMED_READ.max(read.len())].into_boxed_slice();
        kept[..read.len()].copy_from_slice(read);
        let framed =
            Framed { stream, kept, at: 0, len: read.len(), phase: Phase::Head(HeadEnd::default()), activity };
        framed.activity.keep(read.len(), true);
        framed
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Framed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            match this.phase {
                Phase::Handed => {
                    this.phase = match this.activity.take_body_length() {
                        Some(length) => Phase::Body(length),
                        // hyper read on without taking the head handed to it: no framing.
                        None => Phase::Through,
                    };
                }
                Phase::Body(0) => this.phase = Phase::Head(HeadEnd::default()),
                _ => break,
            }
        }
        if this.at == this.len {
            if this.phase == Phase::Through {
                return Pin::new(&mut this.stream).poll_read(cx, buf);
            }
            let mut read = ReadBuf::new(&mut this.kept[..]);
            ready!(Pin::new(&mut this.stream).poll_read(cx, &mut read))?;
            (this.at, this.len) = (0, read.filled().len());
            if this.len == 0 {
                return Poll::Ready(Ok(()));
            }
            this.activity.keep(this.len, true);
        }
        let available = &this.kept[this.at..this.len];
        let room = available.len().min(buf.remaining());
        let n = match &mut this.phase {
            Phase::Head(end) => match end.end_in(&available[..room]) {
                Some(n) => {
                    this.phase = Phase::Handed;
                    n
                }
                None => room,
            },
            Phase::Body(left) => {
                let n = room.min(usize::try_from(*left).unwrap_or(usize::MAX));
                *left -= n as u64;
                n
            }
            // `Handed` is resolved above.
            Phase::Through | Phase::Handed => room,
        };
        buf.put_slice(&available[..n]);
        this.at += n;
        this.activity.keep(this.len - this.at, false);
        // The body is all handed and bytes are left: the next request has begun.
        if this.phase == Phase::Body(0) && this.at < this.len {
            this.activity.head_begun_at_kept();
        }
        Poll::Ready(Ok(()))
    }
}

crate::http1::write_through!(Framed, stream);
