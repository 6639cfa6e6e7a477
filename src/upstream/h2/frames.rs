//! What hyper does not tell of an HTTP/2 connection, read off the frames its server sends as they
//! pass ([`TappedStream`]): how many streams the server allows (its SETTINGS), and that it is
//! ending the connection (a GOAWAY).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

use crate::upstream::wire::Stream;

/// The calls one connection carries at once until the server's first SETTINGS frame says how
/// many it allows (RFC 9113 §6.5.2 asks servers to allow at least 100).
pub(super) const STREAMS_BEFORE_SETTINGS: usize = 100;

/// The most calls one connection carries at once, however many the server allows; also what a
/// server that sets no limit gets.
pub(super) const MOST_STREAMS: usize = 1000;

/// What the server of a connection said in its SETTINGS frames (RFC 9113 §6.5): how many streams
/// it allows at once, whether that is known (its first SETTINGS frame read, or its server's
/// other connections' word taken meanwhile, or waited for in vain), also as a channel to wait
/// on, and whether this connection's server said it.
pub(in crate::upstream) struct Peer {
    pub(super) streams: AtomicUsize,
    pub(super) known: AtomicBool,
    pub(super) settled: watch::Sender<bool>,
    pub(super) said: AtomicBool,
    /// It sent a `GOAWAY`.
    pub(super) going_away: AtomicBool,
}

impl Peer {
    /// A peer of a new connection, taken at `known` streams until its SETTINGS come, or not
    /// used by other calls until then.
    pub(super) fn new(known: Option<usize>) -> Peer {
        Peer {
            streams: AtomicUsize::new(known.unwrap_or(STREAMS_BEFORE_SETTINGS)),
            known: AtomicBool::new(known.is_some()),
            settled: watch::channel(known.is_some()).0,
            said: AtomicBool::new(false),
            going_away: AtomicBool::new(false),
        }
    }

    pub(super) fn is_settled(&self) -> bool {
        self.known.load(Ordering::Acquire)
    }

    pub(super) fn settle(&self) {
        self.known.store(true, Ordering::Release);
        self.settled.send_if_modified(|settled| !std::mem::replace(settled, true));
    }
}

/// Follows the frames a server sends (RFC 9113 §4.1) for what hyper does not tell: each frame's
/// 9-byte head is read and its payload passed over, but a SETTINGS frame's entries, which are
/// read for `SETTINGS_MAX_CONCURRENT_STREAMS`; a `GOAWAY` frame's head takes the connection out
/// of use for new calls at once, before hyper has acted on it. (A server's connection preface is its SETTINGS
/// frame, so the first byte read is a frame's first.) The frames themselves are hyper's to check.
#[derive(Default)]
pub(super) struct Frames {
    head: [u8; 9],
    head_read: usize,
    /// Payload bytes of the frame whose head was read still to come.
    payload_left: usize,
    /// The frame is a SETTINGS frame (not an acknowledgement).
    settings: bool,
    /// A SETTINGS frame was met before this one.
    settings_met: bool,
    /// The stream limit the SETTINGS frame being read sets, if it does: set when the frame
    /// ends, as its settings apply together (RFC 9113 §6.5).
    streams: Option<usize>,
    entry: [u8; 6],
    entry_read: usize,
}

impl Frames {
    const SETTINGS: u8 = 0x4;
    const GOAWAY: u8 = 0x7;
    const ACK: u8 = 0x1;
    const MAX_CONCURRENT_STREAMS: u16 = 0x3;

    fn read(&mut self, mut bytes: &[u8], peer: &Peer) {
        while !bytes.is_empty() {
            if self.head_read < self.head.len() {
                let n = (self.head.len() - self.head_read).min(bytes.len());
                self.head[self.head_read..self.head_read + n].copy_from_slice(&bytes[..n]);
                self.head_read += n;
                bytes = &bytes[n..];
                if self.head_read == self.head.len() {
                    let [a, b, c, kind, flags, ..] = self.head;
                    self.payload_left = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
                    self.settings = kind == Frames::SETTINGS && flags & Frames::ACK == 0;
                    if kind == Frames::GOAWAY {
                        peer.going_away.store(true, Ordering::Release);
                    }
                    self.entry_read = 0;
                    // The first SETTINGS: a limit it does not set is none (RFC 9113 §6.5.2).
                    let first = self.settings && !std::mem::replace(&mut self.settings_met, true);
                    self.streams = first.then_some(MOST_STREAMS);
                    self.end_if_read(peer);
                }
                continue;
            }
            let n = self.payload_left.min(bytes.len());
            if self.settings {
                for &byte in &bytes[..n] {
                    self.entry[self.entry_read] = byte;
                    self.entry_read += 1;
                    if self.entry_read == self.entry.len() {
                        self.entry_read = 0;
                        let [a, b, value @ ..] = self.entry;
                        if u16::from_be_bytes([a, b]) == Frames::MAX_CONCURRENT_STREAMS {
                            let streams = usize::try_from(u32::from_be_bytes(value)).unwrap_or(usize::MAX);
                            self.streams = Some(streams.min(MOST_STREAMS));
                        }
                    }
                }
            }
            self.payload_left -= n;
            bytes = &bytes[n..];
            self.end_if_read(peer);
        }
    }

    /// Ends the frame when its payload is all read.
    fn end_if_read(&mut self, peer: &Peer) {
        if self.payload_left == 0 {
            if self.settings {
                if let Some(streams) = self.streams.take() {
                    peer.streams.store(streams, Ordering::Release);
                }
                peer.said.store(true, Ordering::Release);
                peer.settle();
            }
            self.head_read = 0;
            self.settings = false;
        }
    }
}

/// A connection's stream as hyper's HTTP/2 client reads and writes it, tapped: the server's
/// frames are followed on their way in ([`Frames`]).
pub(super) struct TappedStream {
    pub(super) stream: Stream,
    pub(super) frames: Frames,
    pub(super) peer: Arc<Peer>,
}

impl Drop for TappedStream {
    /// A connection that ended is waited for no more.
    fn drop(&mut self) {
        self.peer.settle();
    }
}

impl AsyncRead for TappedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.frames.read(&buf.filled()[before..], &this.peer);
        }
        polled
    }
}

impl AsyncWrite for TappedStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame of `kind` with `flags` on stream `stream` carrying `payload`.
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut bytes = vec![len[1], len[2], len[3], kind, flags];
        bytes.extend_from_slice(&stream.to_be_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    fn settings(entries: &[(u16, u32)]) -> Vec<u8> {
        let payload: Vec<u8> = entries
            .iter()
            .flat_map(|(id, value)| [&id.to_be_bytes()[..], &value.to_be_bytes()].concat())
            .collect();
        frame(Frames::SETTINGS, 0, 0, &payload)
    }

    /// What a peer knows after reading `bytes` in pieces of `piece` bytes.
    fn read(bytes: &[u8], piece: usize) -> (bool, usize) {
        let (peer, mut frames) = (Peer::new(None), Frames::default());
        for chunk in bytes.chunks(piece) {
            frames.read(chunk, &peer);
        }
        (peer.is_settled(), peer.streams.load(Ordering::Acquire))
    }

    #[test]
    fn the_servers_stream_limit_is_read_from_its_settings_however_the_bytes_are_cut() {
        // nginx's preface: SETTINGS (MAX_CONCURRENT_STREAMS 10, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE),
        // then a WINDOW_UPDATE; a DATA frame whose payload looks like another SETTINGS frame.
        let mut bytes = settings(&[(3, 10), (4, 65_536), (5, 16_777_215)]);
        bytes.extend(frame(0x8, 0, 0, &[0, 0x7f, 0xff, 0xff]));
        bytes.extend(frame(0x0, 0x1, 1, &settings(&[(3, 1)])));
        for piece in 1..=bytes.len() {
            assert_eq!(read(&bytes, piece), (true, 10), "read {piece} bytes at a time");
        }
    }

    #[test]
    fn a_later_settings_frame_changes_the_limit_and_an_acknowledgement_does_not() {
        let mut bytes = settings(&[(3, 10)]);
        bytes.extend(frame(Frames::SETTINGS, Frames::ACK, 0, &[]));
        bytes.extend(frame(0x6, 0, 0, &[0; 8])); // PING
        bytes.extend(settings(&[(4, 1), (3, 250)]));
        assert_eq!(read(&bytes, 7), (true, 250));
        // A GOAWAY (last stream 5, NO_ERROR), cut anywhere, marks the connection as ending.
        let goaway = frame(Frames::GOAWAY, 0, 0, &[0, 0, 0, 5, 0, 0, 0, 0]);
        for piece in 1..=goaway.len() {
            let (peer, mut frames) = (Peer::new(None), Frames::default());
            frames.read(&bytes, &peer);
            assert!(!peer.going_away.load(Ordering::Acquire));
            for chunk in goaway.chunks(piece) {
                frames.read(chunk, &peer);
            }
            assert!(peer.going_away.load(Ordering::Acquire), "read {piece} bytes at a time");
            assert_eq!(peer.streams.load(Ordering::Acquire), 250);
        }
        // An acknowledgement is not the server's SETTINGS: it settles nothing.
        assert_eq!(read(&frame(Frames::SETTINGS, Frames::ACK, 0, &[0, 3, 0, 0, 0, 1]), 3), (false, 100));
    }

    #[test]
    fn a_server_that_sets_no_limit_gets_the_most_and_none_sent_yet_the_default() {
        assert_eq!(read(&settings(&[]), 4), (true, MOST_STREAMS));
        assert_eq!(read(&settings(&[(4, 65_535)]), 5), (true, MOST_STREAMS));
        assert_eq!(read(&settings(&[(3, u32::MAX)]), 5), (true, MOST_STREAMS));
        assert_eq!(read(&settings(&[(3, 0)]), 9), (true, 0));
        // A SETTINGS frame cut short has neither settled the connection nor set its limit: its
        // settings apply together.
        let whole = settings(&[(3, 10), (4, 1)]);
        assert_eq!(read(&whole[..whole.len() - 1], 2), (false, STREAMS_BEFORE_SETTINGS));
        assert_eq!(read(&[], 1), (false, STREAMS_BEFORE_SETTINGS));
        // A connection waited for in vain is taken at the default until its SETTINGS come.
        let (peer, mut frames) = (Peer::new(None), Frames::default());
        peer.settle();
        assert_eq!(peer.streams.load(Ordering::Acquire), STREAMS_BEFORE_SETTINGS);
        let first = settings(&[(3, 10)]);
        frames.read(&first[..12], &peer);
        assert_eq!(peer.streams.load(Ordering::Acquire), STREAMS_BEFORE_SETTINGS, "not the most meanwhile");
        frames.read(&first[12..], &peer);
        assert_eq!(peer.streams.load(Ordering::Acquire), 10);
        // Another connection of a server whose limit is known is taken at it at once.
        let peer = Peer::new(Some(10));
        assert!(peer.is_settled());
        Frames::default().read(&settings(&[]), &peer);
        assert_eq!(peer.streams.load(Ordering::Acquire), MOST_STREAMS);
    }
}
