//! One client connection, whether the lane or hyper serves it: this driver closes it gracefully
//! - when no request has begun for `RECAST_IDLE_TIMEOUT_MS` after the last one ended (or after
//!   the connection opened): an idle keep-alive connection;
//! - when a request head has begun but is not complete `RECAST_HEADER_TIMEOUT_MS` after its first
//!   byte: a slow client (slowloris);
//! - when the service stops.
//!
//! The driver tells the two waits apart by watching the bytes the connection reads ([`Watched`]):
//! bytes read while no request is in flight begin a head, and so do bytes read while one is
//! served once its body has been read to its end ([`RequestBody`]): the client pipelines its next
//! request.
//!
//! Nothing here runs per request beyond a few atomic stores: the driver's one timer fires at
//! least every `min(head, idle)` and at the earliest deadline known when it was armed (see
//! [`drive`] for which deadlines that meets on time) and is re-armed only when it fires, and a
//! stop reaches each connection through its own [`Activity`] ([`Open`]) rather than through a
//! channel every connection would poll on each wake.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

const NONE: u64 = u64::MAX;
/// [`Activity::body_length`] before a request says its body's length.
const UNSET: u64 = u64::MAX;
/// [`Activity::body_length`] of a body without a declared length (chunked).
const UNKNOWN: u64 = u64::MAX - 1;

/// What a connection is doing: requests in flight, when the last one ended, and when the head
/// of the next one began.
pub(super) struct Activity {
    started: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds since `started` at the last request's end (or the connection's start).
    last_ms: AtomicU64,
    /// Milliseconds since `started` at the first byte of a head not yet complete, or [`NONE`].
    head_ms: AtomicU64,
    /// The body of the request in flight has been read: bytes read now begin the next head.
    body_read: AtomicBool,
    /// Bytes a [`Framed`] stream read and has not handed to hyper yet, and when it read them.
    kept: AtomicUsize,
    kept_ms: AtomicU64,
    /// The length of the body of the request hyper has just taken, as [`RequestBody::new`] tells
    /// it to [`Framed`]: [`UNSET`] until it is told, [`UNKNOWN`] for a body of no declared length.
    body_length: AtomicU64,
    /// Notified once when the service stops.
    stop: Notify,
}

/// Held while a request on the connection is served.
pub(super) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.last_ms.store(self.0.elapsed_ms(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The driver's timeouts.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timeouts {
    pub idle: Duration,
    pub head: Duration,
}

impl Activity {
    pub(super) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
            head_ms: AtomicU64::new(NONE),
            body_read: AtomicBool::new(false),
            kept: AtomicUsize::new(0),
            kept_ms: AtomicU64::new(0),
            body_length: AtomicU64::new(UNSET),
            stop: Notify::new(),
        })
    }

    fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// A request's head is complete and it is being served.
    pub(super) fn busy(self: &Arc<Activity>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_ms.store(NONE, Ordering::Release);
        self.body_read.store(false, Ordering::Release);
        Busy(self.clone())
    }

    /// The body of the request in flight has been read to its end (or it has none).
    pub(super) fn body_read(&self) {
        self.body_read.store(true, Ordering::Release);
    }

    /// Bytes of the next request's head are here (read while a request is served, or left over
    /// after its head): its head timeout runs from now, unless it already runs.
    pub(super) fn head_begun(&self) {
        let _ = self.head_ms.compare_exchange(NONE, self.elapsed_ms(), Ordering::AcqRel, Ordering::Acquire);
    }

    /// The bytes a [`Framed`] stream keeps from hyper are now `n`; `fresh` when they were just
    /// read.
    fn keep(&self, n: usize, fresh: bool) {
        self.kept.store(n, Ordering::Release);
        if fresh {
            self.kept_ms.store(self.elapsed_ms(), Ordering::Release);
        }
    }

    /// The bytes a [`Framed`] stream keeps are the start of the next request: its head timeout
    /// runs from when they were read, unless it already runs.
    fn head_begun_at_kept(&self) {
        let at = self.kept_ms.load(Ordering::Acquire);
        let _ = self.head_ms.compare_exchange(NONE, at, Ordering::AcqRel, Ordering::Acquire);
    }

    /// hyper took a request whose body is `length` bytes long (`None`: not declared). When the
    /// bytes kept after its head are more than that, the next request has begun.
    fn told_body_length(&self, length: Option<u64>) {
        self.body_length.store(length.unwrap_or(UNKNOWN), Ordering::Release);
        if length.is_some_and(|length| self.kept.load(Ordering::Acquire) as u64 > length) {
            self.head_begun_at_kept();
        }
    }

    /// The body length told since the last call, if one was told and it is declared.
    fn take_body_length(&self) -> Option<u64> {
        match self.body_length.swap(UNSET, Ordering::AcqRel) {
            UNSET | UNKNOWN => None,
            length => Some(length),
        }
    }

    /// Bytes were read from the client: unless they belong to the request in flight, they begin
    /// a head.
    fn read(&self) {
        let next = self.in_flight.load(Ordering::Acquire) == 0 || self.body_read.load(Ordering::Acquire);
        if next && self.head_ms.load(Ordering::Acquire) == NONE {
            self.head_begun();
        }
    }

    /// When the connection is to be closed if nothing happens meanwhile; `None` while a request
    /// is in flight.
    fn deadline(&self, timeouts: Timeouts) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let at = |ms: u64, after: Duration| self.started + Duration::from_millis(ms) + after;
        match self.head_ms.load(Ordering::Acquire) {
            NONE => Some(at(self.last_ms.load(Ordering::Acquire), timeouts.idle)),
            head => Some(at(head, timeouts.head)),
        }
    }
}

/// The client's stream, reporting reads to the connection's [`Activity`].
pub(super) struct Watched<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T> Watched<T> {
    pub(super) fn new(inner: T, activity: Arc<Activity>) -> Watched<T> {
        Watched { inner, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

crate::http1::write_through!(Watched, inner);

/// A request's body as hyper reads it, telling the connection's [`Activity`] when it has been
/// read to its end.
pub(super) struct RequestBody {
    inner: Incoming,
    activity: Arc<Activity>,
}

impl RequestBody {
    pub(super) fn new(inner: Incoming, activity: Arc<Activity>) -> RequestBody {
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
pub(super) struct Framed<S> {
    stream: S,
    /// Bytes read and not yet handed to hyper: `kept[at..len]`.
    kept: Box<[u8]>,
    at: usize,
    len: usize,
    phase: Phase,
    activity: Arc<Activity>,
}

/// Where a [`Framed`] stream is in the request it hands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
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
struct HeadEnd {
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
    pub(super) fn new(stream: S, read: &[u8], activity: Arc<Activity>) -> Framed<S> {
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

/// A hyper connection that can be asked to finish its current request and close.
pub(super) trait Graceful: Future {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S> Graceful for hyper::server::conn::http1::Connection<I, S>
where
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S::ResBody: http_body::Body + 'static,
    <S::ResBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper::server::conn::http1::Connection::graceful_shutdown(self)
    }
}

/// Drives `connection` to its end, closing it gracefully when its idle or head deadline passes
/// or when the service stops. Returns the connection's own result, or `None` when a connection
/// closed for a deadline did not finish within one more head timeout and was dropped.
///
/// Reads and requests need not wake the driver: armed at time `t`, its timer fires at the
/// earlier of the current deadline and `t + min(head, idle)`, and a deadline set by a later event
/// cannot fall before that (a head beginning at `h ≥ t` is due at `h + head`, a request ending at
/// `e ≥ t` makes the connection idle until `e + idle`), so such deadlines are met on time. Two
/// are met up to `min(head, idle)` late: a head whose bytes were read before `t` but found to
/// begin a request only after it (kept by [`Framed`], timed from when they were read), and a head
/// timeout that falls due while a request is still in flight (no connection is closed under a
/// call; the deadline counts once the call has ended). (Times are kept in whole milliseconds, so
/// a deadline may also pass up to a millisecond late.)
pub(super) async fn drive<C>(connection: C, activity: Arc<Activity>, timeouts: Timeouts) -> Option<C::Output>
where
    C: Graceful,
{
    let check = timeouts.head.min(timeouts.idle);
    let mut connection = std::pin::pin!(connection);
    let mut timer = std::pin::pin!(tokio::time::sleep_until(Instant::now() + check));
    let mut stopped = std::pin::pin!(activity.stop.notified());
    let mut closing = false;
    let mut drop_at = None;
    loop {
        tokio::select! {
            biased;
            result = connection.as_mut() => return Some(result),
            () = stopped.as_mut(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = timer.as_mut() => {
                let now = Instant::now();
                let next = match drop_at {
                    Some(at) if at <= now => return None,
                    Some(at) => at,
                    None if closing => now + check,
                    None => match activity.deadline(timeouts) {
                        Some(at) if at <= now => {
                            tracing::debug!(?timeouts, "closing an idle or slow connection");
                            connection.as_mut().graceful_shutdown();
                            closing = true;
                            *drop_at.insert(now + timeouts.head)
                        }
                        Some(at) => at.min(now + check),
                        None => now + check,
                    },
                };
                timer.as_mut().reset(next);
            }
        }
    }
}

/// The open connections, so that a stop reaches each of them.
#[derive(Default)]
pub(super) struct Open {
    connections: Mutex<HashMap<u64, Weak<Activity>>>,
    next: AtomicU64,
    stopped: AtomicBool,
}

/// A connection's place in [`Open`], given up when dropped.
pub(super) struct Registered {
    open: Arc<Open>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open.connections.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.id);
    }
}

impl Open {
    /// Adds a connection; one that opens after the stop is told to stop at once.
    pub(super) fn register(self: &Arc<Open>, activity: &Arc<Activity>) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut connections = self.connections.lock().unwrap_or_else(PoisonError::into_inner);
        if self.stopped.load(Ordering::Acquire) {
            activity.stop.notify_one();
        }
        connections.insert(id, Arc::downgrade(activity));
        Registered { open: self.clone(), id }
    }

    /// Tells every open connection to finish its current request and close.
    pub(super) fn stop(&self) {
        let connections = self.connections.lock().unwrap_or_else(PoisonError::into_inner);
        self.stopped.store(true, Ordering::Release);
        for activity in connections.values().filter_map(Weak::upgrade) {
            activity.stop.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection that ends when told to close gracefully, or never (`stubborn`), and says
    /// when it was told.
    struct Fake {
        told: Arc<std::sync::Mutex<Option<Instant>>>,
        stubborn: bool,
    }

    impl Future for Fake {
        type Output = ();

        fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
            let told = self.told.lock().unwrap().is_some();
            if told && !self.stubborn { Poll::Ready(()) } else { Poll::Pending }
        }
    }

    impl Graceful for Fake {
        fn graceful_shutdown(self: Pin<&mut Self>) {
            self.told.lock().unwrap().get_or_insert_with(Instant::now);
        }
    }

    const TIMEOUTS: Timeouts = Timeouts { idle: Duration::from_secs(60), head: Duration::from_secs(10) };

    /// Drives a fake connection in the background; returns when it was told to close (shared)
    /// and the driver's task.
    fn driven(
        activity: &Arc<Activity>,
        stubborn: bool,
    ) -> (Arc<std::sync::Mutex<Option<Instant>>>, tokio::task::JoinHandle<Option<()>>) {
        let told = Arc::new(std::sync::Mutex::new(None));
        let fake = Fake { told: told.clone(), stubborn };
        (told, tokio::spawn(drive(fake, activity.clone(), TIMEOUTS)))
    }

    /// Seconds from `start` to when the connection was told to close, to the millisecond.
    fn told_after(told: &std::sync::Mutex<Option<Instant>>, start: Instant) -> Option<f64> {
        told.lock().unwrap().map(|at| (at - start).as_millis() as f64 / 1000.0)
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_connection_closes_at_the_idle_timeout_and_a_begun_head_at_the_head_timeout() {
        let start = Instant::now();
        let quiet = Activity::new();
        let (told, task) = driven(&quiet, false);
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert_eq!(told_after(&told, start), None, "quiet for 59 s, within the idle timeout");
        assert_eq!(task.await.unwrap(), Some(()));
        // Due at 60 s; times are kept in whole milliseconds, so a millisecond late at most.
        let at = told_after(&told, start).unwrap();
        assert!((60.0..=60.001).contains(&at), "closed at {at} s");

        let start = Instant::now();
        let slow = Activity::new();
        let (told, task) = driven(&slow, false);
        tokio::time::sleep(Duration::from_secs(5)).await;
        slow.read();
        assert_eq!(task.await.unwrap(), Some(()));
        let at = told_after(&told, start).unwrap();
        assert!((15.0..=15.001).contains(&at), "a head begun at 5 s closed at {at} s");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_holds_the_connection_open_and_its_end_restarts_the_idle_time() {
        let start = Instant::now();
        let activity = Activity::new();
        let (told, task) = driven(&activity, false);
        let busy = activity.busy();
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert_eq!(told_after(&told, start), None, "served for 300 s, and still open");
        drop(busy);
        assert_eq!(task.await.unwrap(), Some(()));
        let at = told_after(&told, start).unwrap();
        assert!((360.0..=360.001).contains(&at), "idle from 300 s, closed at {at} s");
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_read_once_the_body_is_in_start_the_next_heads_time_but_body_bytes_do_not() {
        let start = Instant::now();
        let activity = Activity::new();
        let (told, task) = driven(&activity, false);
        let busy = activity.busy();
        // The body, read over 20 s: not a head.
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            activity.read();
        }
        activity.body_read();
        tokio::time::sleep(Duration::from_secs(1)).await;
        // 21 s: the client pipelines the start of its next request while this one is served.
        activity.read();
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert_eq!(told_after(&told, start), None, "nothing is closed while a request is served");
        drop(busy);
        assert_eq!(task.await.unwrap(), Some(()));
        // The head was due at 31 s, while the request was served: the connection closes at the
        // driver's next look after the request ends (it looks at least every head timeout).
        let at = told_after(&told, start).unwrap();
        assert!((50.0..=60.001).contains(&at), "closed at {at} s, not at the idle timeout (110 s)");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_closes_at_once_and_leaves_a_connection_that_will_not_close_to_the_grace_period() {
        let open = Arc::new(Open::default());
        let start = Instant::now();
        let activity = Activity::new();
        let _registered = open.register(&activity);
        let (told, task) = driven(&activity, true);
        tokio::time::sleep(Duration::from_secs(1)).await;
        open.stop();
        tokio::task::yield_now().await;
        assert_eq!(told_after(&told, start), Some(1.0), "told at the stop");
        // It does not finish, and the driver leaves it to the service's grace period
        // (`server::run`), which gives requests in flight their time before it cuts them.
        let waited = tokio::time::timeout(Duration::from_secs(3600), task).await;
        assert!(waited.is_err(), "still driven an hour after the stop");

        // A connection that opens after the stop is told at once.
        let late = Activity::new();
        let _registered = open.register(&late);
        let (told, task) = driven(&late, false);
        assert_eq!(task.await.unwrap(), Some(()));
        assert!(told_after(&told, Instant::now()).is_some());
    }

    /// A client stream that yields one of its chunks per read, then waits forever.
    struct Chunks(std::collections::VecDeque<&'static [u8]>);

    impl AsyncRead for Chunks {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            match self.0.pop_front() {
                Some(chunk) => {
                    buf.put_slice(chunk);
                    Poll::Ready(Ok(()))
                }
                None => Poll::Pending,
            }
        }
    }

    impl tokio::io::AsyncWrite for Chunks {
        fn poll_write(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A framed stream after the lane read `lane_read`, and its connection's activity.
    fn framing(lane_read: &[u8], chunks: &[&'static [u8]]) -> (Framed<Chunks>, Arc<Activity>) {
        let activity = Activity::new();
        (Framed::new(Chunks(chunks.iter().copied().collect()), lane_read, activity.clone()), activity)
    }

    /// What one read of hyper's gets: its bytes, or `None` when it would wait.
    fn hyper_reads(framed: &mut Framed<Chunks>) -> Option<String> {
        let mut space = [0u8; 64 * 1024];
        let mut buf = ReadBuf::new(&mut space);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match Pin::new(framed).poll_read(&mut cx, &mut buf) {
            Poll::Ready(read) => {
                read.unwrap();
                Some(String::from_utf8_lossy(buf.filled()).into_owned())
            }
            Poll::Pending => None,
        }
    }

    /// Seconds from the connection's start to its deadline, once no request is in flight.
    fn deadline_after(activity: &Activity, start: Instant) -> f64 {
        (activity.deadline(TIMEOUTS).expect("idle") - start).as_millis() as f64 / 1000.0
    }

    const GET_A: &str = "GET /a HTTP/1.1\r\nhost: t\r\n\r\n";

    #[tokio::test(start_paused = true)]
    async fn a_head_read_together_with_the_request_before_it_starts_its_timeout_then() {
        let start = Instant::now();
        let (mut framed, activity) = framing(b"", &[b"GET /a HTTP/1.1\r\nhost: t\r\n\r\nGET /b HT"]);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some(GET_A), "only the first head");
        // hyper takes the request, which has no body, and serves it for 30 s.
        let busy = activity.busy();
        activity.told_body_length(Some(0));
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(busy);
        assert_eq!(deadline_after(&activity, start), 11.0, "the next head's time ran from its read at 1 s");
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some("GET /b HT"));
        assert_eq!(hyper_reads(&mut framed), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_is_handed_to_its_declared_end_and_bytes_after_it_begin_the_next_head() {
        let start = Instant::now();
        let head = "POST /p HTTP/1.1\r\ncontent-length: 5\r\n\r\n";
        let (mut framed, activity) = framing(head.as_bytes(), &[b"hel", b"lo\r\nGET /n"]);
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some(head), "the lane's bytes first");
        let busy = activity.busy();
        activity.told_body_length(Some(5));
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some("hel"));
        tokio::time::sleep(Duration::from_secs(2)).await;
        // The end of the body and the start of the next request come in one read, at 2 s.
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some("lo"));
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(busy);
        assert_eq!(deadline_after(&activity, start), 12.0);
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some("\r\nGET /n"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_ends_exactly_leaves_the_connection_idle() {
        let start = Instant::now();
        let (mut framed, activity) = framing(b"", &[b"PUT /p HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}"]);
        assert!(hyper_reads(&mut framed).unwrap().ends_with("\r\n\r\n"));
        let busy = activity.busy();
        activity.told_body_length(Some(2));
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some("{}"));
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(busy);
        assert_eq!(deadline_after(&activity, start), 63.0, "idle from the request's end");
        assert_eq!(hyper_reads(&mut framed), None);
    }

    #[tokio::test]
    async fn empty_lines_before_a_request_line_and_bare_line_feeds_are_read_as_hyper_reads_them() {
        let (mut framed, _) = framing(b"", &[b"\r\n\nGET / HTTP/1.1\nhost: t\n\nGET"]);
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some("\r\n\nGET / HTTP/1.1\nhost: t\n\n"));
        let (mut framed, _) = framing(b"", &[b"GET / HTTP/1.1\r\nhost: t\r", b"\n\r\nGET"]);
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some("GET / HTTP/1.1\r\nhost: t\r"));
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some("\n\r\n"), "a blank line across reads");
    }

    #[tokio::test]
    async fn a_chunked_body_or_a_head_hyper_did_not_take_turns_the_framing_off() {
        let chunked = "POST /p HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n";
        let (mut framed, activity) =
            framing(b"", &[b"POST /p HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\nGET"]);
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some(chunked));
        let _busy = activity.busy();
        activity.told_body_length(None);
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some("2\r\n{}\r\n0\r\n\r\nGET"), "all of it");
        assert_eq!(framed.phase, Phase::Through);

        // hyper reads on without taking the head it was handed (here: no service call at all).
        let (mut framed, _) = framing(b"", &[b"GET / HTTP/1.1\r\n\r\nrest", b"more"]);
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some("GET / HTTP/1.1\r\n\r\n"));
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some("rest"));
        assert_eq!(hyper_reads(&mut framed).as_deref(), Some("more"));
        assert_eq!(framed.phase, Phase::Through);
    }
}
