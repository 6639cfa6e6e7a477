//! One client connection, whether the lane or hyper serves it: this driver closes it gracefully
//! - when no request has begun for `RECAST_IDLE_TIMEOUT_MS` after the last one ended (or after
//!   the connection opened): an idle keep-alive connection;
//! - when a request head has begun but is not complete `RECAST_HEADER_TIMEOUT_MS` after its first
//!   byte: a slow client (slowloris);
//! - when the service stops.
//!
//! The driver tells the two waits apart by watching the bytes the connection reads ([`ActivityStream`]):
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
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

mod framed;

pub(super) use self::framed::{Framed, RequestBody};
use crate::metrics::Timeout;

const NONE: u64 = u64::MAX;
/// How long a connection serving no request is kept after the service stops: the moment between
/// a head's last byte and the request being served.
const STOPPING_HEAD: Duration = Duration::from_millis(50);
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

/// What a connection's bytes travel on: a TCP stream, or TLS over one.
pub(super) trait Stream: AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {}

impl<S: AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> Stream for S {}

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

    /// Whether the connection is reading the head of a request it does not serve yet: bytes of it
    /// came, and no request is in flight.
    fn reading_head(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0 && self.head_ms.load(Ordering::Acquire) != NONE
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

    /// When the connection is to be closed if nothing happens meanwhile, and which timeout that
    /// is; `None` while a request is in flight.
    fn deadline(&self, timeouts: Timeouts) -> Option<(Instant, Timeout)> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let at = |ms: u64, after: Duration| self.started + Duration::from_millis(ms) + after;
        match self.head_ms.load(Ordering::Acquire) {
            NONE => Some((at(self.last_ms.load(Ordering::Acquire), timeouts.idle), Timeout::Idle)),
            head => Some((at(head, timeouts.head), Timeout::Head)),
        }
    }
}

/// The client's stream, reporting reads to the connection's [`Activity`].
pub(super) struct ActivityStream<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T> ActivityStream<T> {
    pub(super) fn new(inner: T, activity: Arc<Activity>) -> ActivityStream<T> {
        ActivityStream { inner, activity }
    }

    /// The stream, no longer watched (HTTP/2 has no request heads to time).
    pub(super) fn into_inner(self) -> T {
        self.inner
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ActivityStream<T> {
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

crate::http1::write_through!(ActivityStream, inner);

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
pub(super) async fn drive<C>(connection: C, activity: Arc<Activity>, timeouts: Timeouts) -> Driven<C::Output>
where
    C: Graceful,
{
    let check = timeouts.head.min(timeouts.idle);
    let mut connection = std::pin::pin!(connection);
    let mut timer = std::pin::pin!(tokio::time::sleep_until(Instant::now() + check));
    let mut stopped = std::pin::pin!(activity.stop.notified());
    let mut closing = false;
    let mut drop_at = None;
    let mut timed_out = None;
    // Set when the service stops: a connection that is then reading the head of a request it
    // does not serve yet (its client sent part of one, and may never send the rest) is dropped
    // at this time, unless the request began meanwhile. A half-sent head must not hold the
    // process's exit until its client goes away (it did, for as long as the client waited).
    let mut idle_drop_at: Option<Instant> = None;
    loop {
        tokio::select! {
            biased;
            result = connection.as_mut() => return Driven { output: Some(result), timed_out },
            () = stopped.as_mut(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
                let at = *idle_drop_at.insert(Instant::now() + STOPPING_HEAD);
                timer.as_mut().reset(at);
            }
            () = timer.as_mut() => {
                let now = Instant::now();
                if let Some(at) = idle_drop_at
                    && at <= now
                {
                    if activity.reading_head() {
                        return Driven { output: None, timed_out };
                    }
                    // A request is served, or an answer written (the connection then closes
                    // after it, within the grace period), or the connection is idle (it closes
                    // at once by itself).
                    idle_drop_at = None;
                }
                let next = match drop_at {
                    Some(at) if at <= now => return Driven { output: None, timed_out },
                    Some(at) => at,
                    None if closing => now + check,
                    None => match activity.deadline(timeouts) {
                        Some((at, timeout)) if at <= now => {
                            tracing::debug!(?timeout, ?timeouts, "closing an idle or slow connection");
                            connection.as_mut().graceful_shutdown();
                            closing = true;
                            timed_out = Some(timeout);
                            *drop_at.insert(now + timeouts.head)
                        }
                        Some((at, _)) => at.min(now + check),
                        None => now + check,
                    },
                };
                timer.as_mut().reset(idle_drop_at.map_or(next, |at| next.min(at)));
            }
        }
    }
}

/// How [`drive`] ended.
#[derive(Debug)]
pub(super) struct Driven<T> {
    /// What the connection ended with; `None` when it was dropped after its deadline passed.
    pub output: Option<T>,
    /// The timeout that closed the connection, if one did.
    pub timed_out: Option<Timeout>,
}

impl<T> Driven<T> {
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Driven<U> {
        Driven { output: self.output.map(f), timed_out: self.timed_out }
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
mod tests;
