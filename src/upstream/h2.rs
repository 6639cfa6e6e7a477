//! HTTP/2 to upstreams (`RECAST_UPSTREAM_HTTP2`, `docs/upstreams.md`): an `https` upstream that
//! picks `h2` by ALPN is spoken to over hyper's HTTP/2 client (the `h2` crate). One connection per
//! upstream (and route `tls`) carries many calls at once, up to as many as the server allows
//! (its `SETTINGS_MAX_CONCURRENT_STREAMS`, read by [`Frames`] since hyper does not tell it; at
//! most [`MOST_STREAMS`]), then another is opened, one at a time ([`Connections`]). The answer
//! is read as `wire` reads an HTTP/1.1 one: the same size bound on the body as it comes, the same
//! decoding of gzip and br, the same reading of its caching headers and `Retry-After`; the body
//! of an answer that is not 2xx is never read.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Version};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

use super::UpstreamRequest;
use super::coding::{Coding, Decoding, Sink};
use super::tls::CertificateAsked;
use super::wire::{self, Failed, Stream};
use super::{Answer, Freshness, Key, UpstreamError};
use crate::http1;
use crate::json::PADDING;

/// The calls one connection carries at once until the server's first SETTINGS frame says how
/// many it allows (RFC 9113 §6.5.2 asks servers to allow at least 100).
const STREAMS_BEFORE_SETTINGS: usize = 100;

/// The most calls one connection carries at once, however many the server allows; also what a
/// server that sets no limit gets.
const MOST_STREAMS: usize = 1000;

/// How many sweeps (of 30 s) an upstream that picked HTTP/1.1 is remembered with no call looking
/// for it: longer than its idle pooled connections are kept (90 s).
const HTTP1_SWEEPS: u8 = 4;

/// How long a call waits for a new connection's first SETTINGS frame (about one round trip)
/// before it takes a stream on it by [`STREAMS_BEFORE_SETTINGS`].
const SETTINGS_WAIT: Duration = Duration::from_secs(1);

/// How often an HTTP/2 connection is pinged, and how long a ping may go unanswered before the
/// connection is closed.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Headers HTTP/2 forbids (RFC 9113 §8.2.2), or that recast sets itself.
const NOT_SENT: [HeaderName; 6] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::HOST,
    header::CONTENT_LENGTH,
    header::ACCEPT_ENCODING,
];

/// One HTTP/2 connection: its sender, the calls it carries now, what its server said, and
/// whether its server asked for a client certificate (told with each answer).
struct Shared {
    sender: SendRequest<Full<Bytes>>,
    in_flight: AtomicUsize,
    peer: Arc<Peer>,
    certificate_asked: Option<CertificateAsked>,
}

impl Shared {
    /// Whether it may carry new calls: open, and its server has not begun to end it (a
    /// `GOAWAY`, RFC 9113 §6.8: the calls on it finish, new ones go elsewhere).
    fn open(&self) -> bool {
        !self.sender.is_closed() && !self.peer.going_away.load(Ordering::Acquire)
    }

    /// Whether a call may take a stream on it now: open, its server's limit known, and fewer
    /// calls on it than the server allows (a server that allows none for now gets one call on
    /// each connection, which waits in h2 until the server allows it).
    fn free(&self) -> bool {
        self.open()
            && self.peer.is_settled()
            && self.in_flight.load(Ordering::Acquire) < self.peer.streams.load(Ordering::Acquire).max(1)
    }
}

/// The HTTP/2 connections of every upstream, shared by all workers.
#[derive(Default)]
pub(super) struct Connections {
    by_key: Mutex<std::collections::HashMap<Key, Upstream>>,
}

/// An upstream that may speak HTTP/2: its connections, and what it picked last.
#[derive(Default)]
struct Upstream {
    connections: Vec<Arc<Shared>>,
    /// Held by the call opening a connection to it, so that the calls that find every
    /// connection full (or none open, or the upstream not met yet) wait for that one instead of
    /// each opening its own.
    opener: Arc<tokio::sync::Mutex<()>>,
    /// How many opens failed, and the last one's error: a call that waited for an open that
    /// failed is answered its error rather than trying again behind the others.
    failures: u64,
    failure: Option<UpstreamError>,
    /// The last connection made to it picked HTTP/1.1: its calls go to the HTTP/1.1 pool.
    http1: bool,
    /// Sweeps since a call last looked for it.
    untouched: u8,
}

impl Upstream {
    fn opener(&self) -> Opener {
        Opener { turn: self.opener.clone(), failures: self.failures }
    }
}

/// The opener's lock of an upstream, and how many of its opens had failed when a call found it.
pub(super) struct Opener {
    pub(super) turn: Arc<tokio::sync::Mutex<()>>,
    failures: u64,
}

/// What a call finds for its upstream.
pub(super) enum Found {
    /// A place on an open connection with a stream free.
    Lease(Lease),
    /// No connection has a stream free, or none was made yet: the opener's lock, for the call to
    /// take before it looks again ([`Connections::after_lock`]) and opens one.
    Open(Opener),
    /// The upstream picked HTTP/1.1.
    Http1,
    /// The open the call waited for failed so ([`Connections::after_lock`] only).
    Failed(UpstreamError),
}

/// A call's place on a connection: given back when the call ends.
pub(super) struct Lease(Arc<Shared>);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Connections {
    /// What there is for `key`, under one lock; closed connections are forgotten on the way.
    pub(super) fn find(&self, key: &Key) -> Found {
        match self.look(key) {
            Look::Found(found) => found,
            Look::Settling(_, opener) => Found::Open(opener),
        }
    }

    /// What there is for `key` for a call that holds its opener's lock (`opener`, as it found
    /// it): as [`Connections::find`], but a connection whose server has not said yet how many
    /// streams it allows is waited for (up to [`SETTINGS_WAIT`]) rather than passed over, and an
    /// open that failed meanwhile is the call's failure. [`Found::Open`]: the call opens one.
    pub(super) async fn after_lock(&self, key: &Key, opener: &Opener) -> Found {
        loop {
            let peer = match self.look(key) {
                Look::Found(Found::Open(now)) if now.failures > opener.failures => {
                    let all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
                    match all.get(key).and_then(|upstream| upstream.failure.clone()) {
                        Some(failure) => return Found::Failed(failure),
                        None => return Found::Open(now),
                    }
                }
                Look::Found(found) => return found,
                Look::Settling(peer, _) => peer,
            };
            let mut settled = peer.settled.subscribe();
            let _ = tokio::time::timeout(SETTINGS_WAIT, settled.wait_for(|settled| *settled)).await;
            // A server that has not said it by now is taken at the default.
            peer.settle();
        }
    }

    fn look(&self, key: &Key) -> Look {
        let mut all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(upstream) = all.get_mut(key) else {
            return Look::Found(Found::Open(all.entry(key.clone()).or_default().opener()));
        };
        upstream.untouched = 0;
        if upstream.http1 {
            return Look::Found(Found::Http1);
        }
        upstream.connections.retain(|c| c.open());
        if let Some(free) = upstream.connections.iter().find(|c| c.free()) {
            free.in_flight.fetch_add(1, Ordering::AcqRel);
            return Look::Found(Found::Lease(Lease(free.clone())));
        }
        match upstream.connections.iter().find(|c| !c.peer.is_settled()) {
            Some(settling) => Look::Settling(settling.peer.clone(), upstream.opener()),
            None => Look::Found(Found::Open(upstream.opener())),
        }
    }

    /// Notes that opening a connection to `key` failed with `failure`, for the calls that waited.
    pub(super) fn open_failed(&self, key: &Key, failure: &UpstreamError) {
        let mut all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        let upstream = all.entry(key.clone()).or_default();
        upstream.failures += 1;
        upstream.failure = Some(failure.clone());
    }

    /// Notes that a new connection to `key` picked HTTP/1.1: its calls go to the HTTP/1.1 pool
    /// without waiting for an opener, until a connection picks `h2` again. Its HTTP/2
    /// connections are let go (each closes once its calls end).
    pub(super) fn picked_http1(&self, key: &Key) {
        let mut all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        let upstream = all.entry(key.clone()).or_default();
        upstream.http1 = true;
        upstream.connections.clear();
    }

    /// Takes the connection of `lease` out of use (the upstream is ending it: a `GOAWAY`, a
    /// refused stream): the calls on it finish, new ones go elsewhere.
    pub(super) fn forget(&self, key: &Key, lease: &Lease) {
        let mut all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(upstream) = all.get_mut(key) {
            upstream.connections.retain(|c| !Arc::ptr_eq(c, &lease.0));
        }
    }

    /// Forgets the upstreams that no call looked for since the sweep before (an upstream that
    /// picked HTTP/1.1: in the last [`HTTP1_SWEEPS`] sweeps, as long as its idle pooled
    /// connections may last), that have no open connection and no call at their opener.
    /// How many upstreams are known.
    pub(super) fn len(&self) -> usize {
        self.by_key.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    pub(super) fn sweep(&self) {
        let mut all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|_, upstream| {
            upstream.connections.retain(|c| c.open());
            upstream.untouched = upstream.untouched.saturating_add(1);
            let kept_for = if upstream.http1 { HTTP1_SWEEPS } else { 1 };
            upstream.untouched <= kept_for
                || !upstream.connections.is_empty()
                || Arc::strong_count(&upstream.opener) > 1
        });
    }

    /// Makes an HTTP/2 connection of `stream` (whose TLS picked `h2`), keeps it for `key`, and
    /// answers a place on it (taken at once). Until its server's first SETTINGS come the others
    /// take it at the limit its other connections' server set, or wait for them when there are
    /// none.
    pub(super) async fn add(
        &self,
        key: Key,
        stream: Stream,
        certificate_asked: Option<CertificateAsked>,
        spawner: &super::Spawner,
    ) -> Result<Lease, Failed> {
        let known = {
            let all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
            let said = all.get(&key).and_then(|upstream| {
                let said = |c: &&Arc<Shared>| c.open() && c.peer.said.load(Ordering::Acquire);
                upstream.connections.iter().find(said).cloned()
            });
            said.map(|c| c.peer.streams.load(Ordering::Acquire))
        };
        let peer = Arc::new(Peer::new(known));
        let stream = Watched { stream, frames: Frames::default(), peer: peer.clone() };
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(hyper_util::rt::TokioTimer::new())
            // A connection that went dead without a word (a NAT or firewall dropped it) is found
            // by its unanswered pings, and closed.
            .keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| {
                let why = format!("the HTTP/2 handshake failed: {}", super::error_chain(&e));
                if super::tls::is_tls_failure(&e) { Failed::Tls(why) } else { Failed::Broken(why) }
            })?;
        // The connection's frames are read and written by a task of its own until it closes,
        // away from the workers: every worker's calls may ride it.
        spawner.spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %super::error_chain(&e), "an upstream HTTP/2 connection ended");
            }
        });
        let shared = Arc::new(Shared { sender, in_flight: AtomicUsize::new(1), peer, certificate_asked });
        let mut all = self.by_key.lock().unwrap_or_else(PoisonError::into_inner);
        let upstream = all.entry(key).or_default();
        upstream.http1 = false;
        upstream.connections.push(shared.clone());
        Ok(Lease(shared))
    }
}

/// What [`Connections::look`] saw: something for the call, or a new connection whose server's
/// SETTINGS are still to come (and the opener's lock).
enum Look {
    Found(Found),
    Settling(Arc<Peer>, Opener),
}

/// What the server of a connection said in its SETTINGS frames (RFC 9113 §6.5): how many streams
/// it allows at once, whether that is known (its first SETTINGS frame read, or its server's
/// other connections' word taken meanwhile, or waited for in vain), also as a channel to wait
/// on, and whether this connection's server said it.
struct Peer {
    streams: AtomicUsize,
    known: AtomicBool,
    settled: watch::Sender<bool>,
    said: AtomicBool,
    /// It sent a `GOAWAY`.
    going_away: AtomicBool,
}

impl Peer {
    /// A peer of a new connection, taken at `known` streams until its SETTINGS come, or not
    /// used by other calls until then.
    fn new(known: Option<usize>) -> Peer {
        Peer {
            streams: AtomicUsize::new(known.unwrap_or(STREAMS_BEFORE_SETTINGS)),
            known: AtomicBool::new(known.is_some()),
            settled: watch::channel(known.is_some()).0,
            said: AtomicBool::new(false),
            going_away: AtomicBool::new(false),
        }
    }

    fn is_settled(&self) -> bool {
        self.known.load(Ordering::Acquire)
    }

    fn settle(&self) {
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
struct Frames {
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

/// A connection's stream as hyper's HTTP/2 client reads and writes it, with the server's frames
/// followed on the way in.
struct Watched {
    stream: Stream,
    frames: Frames,
    peer: Arc<Peer>,
}

impl Drop for Watched {
    /// A connection that ended is waited for no more.
    fn drop(&mut self) {
        self.peer.settle();
    }
}

impl AsyncRead for Watched {
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

impl AsyncWrite for Watched {
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

/// Sends `request` on the leased connection and reads the whole answer, the body at most `limit`
/// bytes (decoded, when it comes in a content coding).
pub(super) async fn exchange(
    lease: &Lease,
    request: &UpstreamRequest,
    authorization: Option<&HeaderValue>,
    compression: bool,
    limit: usize,
) -> Result<Answer, Failed> {
    let mut outgoing =
        Request::builder().method(request.method.clone()).uri(request.uri.clone()).version(Version::HTTP_2);
    if let Some(headers) = outgoing.headers_mut() {
        for (name, value) in &request.headers {
            let replaced = authorization.is_some() && name == header::AUTHORIZATION;
            if !NOT_SENT.contains(name) && !replaced {
                headers.append(name, value.clone());
            }
        }
        if let Some(value) = authorization {
            headers.insert(header::AUTHORIZATION, value.clone());
        }
        let codings = if compression { "gzip, br" } else { "identity" };
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static(codings));
    }
    let outgoing = outgoing
        .body(Full::new(request.body.clone()))
        .map_err(|e| Failed::Broken(format!("the request cannot be sent over HTTP/2: {e}")))?;
    let mut sender = lease.0.sender.clone();
    let response = sender.send_request(outgoing).await.map_err(|e| sent_failure(&e))?;
    let (head, mut body) = response.into_parts();
    let mut freshness = Freshness::default();
    let mut coding = Coding::Identity;
    let mut retry_after = None;
    for (name, value) in &head.headers {
        freshness.line(name.as_str().as_bytes(), value.as_bytes());
        if name == header::CONTENT_ENCODING {
            coding = match coding {
                Coding::Identity => Coding::of(value.as_bytes()),
                earlier => Coding::Unknown(format!(
                    "{earlier}, {}",
                    String::from_utf8_lossy(value.as_bytes().trim_ascii())
                )),
            };
        } else if name == header::RETRY_AFTER {
            retry_after = wire::retry_after_of(value.as_bytes());
        }
    }
    let status = head.status;
    if !status.is_success() {
        // Never read: dropping it resets the stream.
        let certificate_asked = lease.0.certificate_asked;
        return Ok(Answer { status, body: Vec::new(), freshness, retry_after, certificate_asked });
    }
    let mut plain = Vec::new();
    let mut decoding = match &coding {
        Coding::Identity => None,
        Coding::Unknown(name) => return Err(Failed::UnknownCoding(name.clone())),
        coding => Decoding::new(coding, limit),
    };
    while let Some(frame) = body.frame().await {
        // The upstream has answered: whatever breaks now, it may have acted on the request.
        let frame = frame.map_err(|e| {
            let why = super::error_chain(&e);
            if super::tls::is_tls_failure(&e) { Failed::Tls(why) } else { Failed::Broken(why) }
        })?;
        let Ok(data) = frame.into_data() else { continue };
        match &mut decoding {
            None => {
                if plain.len() + data.len() > limit {
                    return Err(Failed::TooLarge);
                }
                http1::reserve_within(&mut plain, data.len() + PADDING, limit + PADDING);
                plain.extend_from_slice(&data);
            }
            Some(decoding) => {
                if decoding.taken() + data.len() > limit {
                    return Err(Failed::TooLarge);
                }
                decoding.take_slice(&data)?;
            }
        }
    }
    let mut body = match decoding {
        None => plain,
        Some(decoding) => decoding.finish()?,
    };
    let most = body.len() + PADDING;
    http1::reserve_within(&mut body, PADDING, most);
    Ok(Answer { status, body, freshness, retry_after, certificate_asked: lease.0.certificate_asked })
}

/// How an HTTP/2 exchange that failed before the answer's head is reported. A stream the
/// upstream refused (`REFUSED_STREAM`, RFC 9113 §8.7), or a request the connection dropped before
/// sending it, was never processed ([`Failed::Unsent`]: sent again on another connection whatever
/// its method). TLS refusing is [`Failed::Tls`]. Anything else (a `GOAWAY`, a connection error, a
/// reset) may have come after the upstream took the request: only an idempotent request is sent
/// again ([`Failed::Stale`]).
fn sent_failure(error: &hyper::Error) -> Failed {
    let why = super::error_chain(error);
    let h2 = std::error::Error::source(error).and_then(|e| e.downcast_ref::<::h2::Error>());
    let refused =
        h2.and_then(::h2::Error::reason).is_some_and(|reason| reason == ::h2::Reason::REFUSED_STREAM);
    if refused || error.is_canceled() {
        Failed::Unsent(why)
    } else if super::tls::is_tls_failure(error) {
        Failed::Tls(why)
    } else {
        Failed::Stale(why)
    }
}

/// Whether the TLS of `stream` picked `h2` by ALPN.
pub(super) fn negotiated(stream: &Stream) -> bool {
    use hyper_util::client::legacy::connect::Connection as _;
    stream.inner().connected().is_negotiated_h2()
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

    fn key() -> Key {
        Key::of(&"https://127.0.0.1:9/".parse().unwrap(), None).unwrap()
    }

    fn upstreams(connections: &Connections) -> usize {
        connections.by_key.lock().unwrap().len()
    }

    #[tokio::test]
    async fn calls_that_waited_for_an_open_that_failed_answer_its_failure_and_later_calls_try_again() {
        let (connections, key) = (Connections::default(), key());
        let Found::Open(waiting) = connections.find(&key) else { panic!("the first call opens") };
        let failure = UpstreamError::Connect("refused".to_owned());
        connections.open_failed(&key, &failure);
        assert!(matches!(connections.after_lock(&key, &waiting).await, Found::Failed(f) if f == failure));
        let Found::Open(later) = connections.find(&key) else { panic!("a later call opens") };
        assert!(matches!(connections.after_lock(&key, &later).await, Found::Open(_)));
    }

    #[test]
    fn upstreams_no_call_looked_for_since_the_last_sweep_are_forgotten() {
        let (connections, key) = (Connections::default(), key());
        let Found::Open(opener) = connections.find(&key) else { panic!("the first call opens") };
        connections.sweep();
        connections.sweep();
        assert_eq!(upstreams(&connections), 1, "a call holds its opener");
        drop(opener);
        connections.sweep();
        assert_eq!(upstreams(&connections), 0);
        // An upstream that picked HTTP/1.1 is remembered while calls look for it, and for as
        // long as its idle HTTP/1.1 connections may be pooled after.
        connections.picked_http1(&key);
        assert!(matches!(connections.find(&key), Found::Http1));
        connections.sweep();
        assert!(matches!(connections.find(&key), Found::Http1));
        for _ in 0..HTTP1_SWEEPS {
            connections.sweep();
        }
        assert_eq!(upstreams(&connections), 1);
        connections.sweep();
        assert_eq!(upstreams(&connections), 0);
    }
}
