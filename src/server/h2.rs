//! HTTP/2 connections (SPEC §7): over TLS when the client chose `h2` by ALPN, and in the clear
//! with prior knowledge when `RECAST_H2C=true` (the lane hands such a connection over when its
//! first bytes are the HTTP/2 preface). Every stream is a request the router answers as it would
//! over HTTP/1.1: the same routes, limits and answers.
//!
//! hyper's server, bounded by recast's settings: at most `RECAST_H2_MAX_STREAMS` streams open at
//! once, header lists within `RECAST_MAX_HEADER_BYTES`, and the protections of its `h2` against
//! the HTTP/2 floods (a client that resets streams faster than they are served, rapid reset, or
//! makes the server reset them, gets GOAWAY; CONTINUATION frames count against the header list's
//! bound), and recast's own ([`conduct`](super::conduct)): a flood of control frames or a header
//! block past the bound, and answers waiting that the client takes none of, close the connection
//! with GOAWAY. A connection with no stream open is closed after `RECAST_IDLE_TIMEOUT_MS`, like
//! an idle HTTP/1.1 one.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::http2::{Builder, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, ReadBuf};

use super::State;
use super::conduct::{self, Conduct, Watched};
use super::connection::{Activity, Graceful, Stream};
use super::router::Client;
use crate::config::Config;
use crate::metrics::Http2Closed;

/// The HTTP/2 preface a client with prior knowledge begins with (RFC 9113 §3.4).
pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Streams a client may have reset before the server has served them, past which the connection
/// is closed (rapid reset, CVE-2023-44487); `h2`'s own default.
const PENDING_RESETS: usize = 20;
/// Streams the server may reset for a client's errors before it closes the connection.
const LOCAL_RESETS: usize = 1024;

/// The builder of every HTTP/2 connection, from the settings.
pub(super) fn builder(config: &Config) -> Builder<TokioExecutor> {
    let mut http = Builder::new(TokioExecutor::new());
    http.timer(TokioTimer::new())
        .max_concurrent_streams(config.h2_max_streams)
        .max_header_list_size(u32::try_from(config.max_header_bytes).unwrap_or(u32::MAX))
        .max_pending_accept_reset_streams(PENDING_RESETS)
        .max_local_error_reset_streams(LOCAL_RESETS)
        .max_send_buf_size(conduct::SEND_BUFFER);
    http
}

/// An HTTP/2 connection on `stream`, each stream answered by the router; `activity` counts the
/// streams in flight, for the idle timeout.
pub(super) fn connection(
    state: Arc<State>,
    stream: impl Stream,
    activity: Arc<Activity>,
    http: &Builder<TokioExecutor>,
    mut client: Client,
) -> impl Graceful<Output = Result<(), hyper::Error>> + Send {
    let conduct = Conduct::new();
    client.conduct = Some(conduct.clone());
    let stall = Duration::from_millis(state.config.header_timeout_ms);
    let service = super::router::hyper_service(state.clone(), activity, client);
    // A header list within the bound has a block within it too (`conduct.rs`).
    let stream = Watched::new(stream, conduct.clone(), state.config.max_header_bytes);
    let connection = Box::pin(http.serve_connection(TokioIo::new(stream), service));
    let check = stall.min(MOST_BETWEEN_CHECKS);
    let timer = Box::pin(tokio::time::sleep(check));
    Http2 { connection, state, conduct, stall, check, timer, closing_at: None }
}

/// The longest time between two looks at a connection's conduct.
const MOST_BETWEEN_CHECKS: Duration = Duration::from_secs(1);
/// How long a connection closed for its client's conduct has to send its GOAWAY.
const CLOSING: Duration = Duration::from_secs(1);

/// hyper's HTTP/2 connection (boxed: it is not `Unpin`), closed gracefully: GOAWAY, then the
/// streams under way finish; closed for its client's [`Conduct`] (a flood of control frames,
/// answers waiting and not taken within `stall`): GOAWAY, and dropped [`CLOSING`] later.
struct Http2<C> {
    connection: Pin<Box<C>>,
    state: Arc<State>,
    conduct: Arc<Conduct>,
    stall: Duration,
    check: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// When a connection closed for its client's conduct is dropped.
    closing_at: Option<tokio::time::Instant>,
}

impl<C: Future<Output = Result<(), hyper::Error>> + Graceful> Future for Http2<C> {
    type Output = C::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Poll::Ready(ended) = this.connection.as_mut().poll(cx) {
            return Poll::Ready(ended);
        }
        if this.closing_at.is_none() && this.conduct.flooded() {
            this.close(Http2Closed::Flood, cx);
        }
        while this.timer.as_mut().poll(cx).is_ready() {
            let now = tokio::time::Instant::now();
            match this.closing_at {
                Some(at) if at <= now => return Poll::Ready(Ok(())),
                Some(at) => this.timer.as_mut().reset(at),
                None if this.conduct.stalled(this.stall) => this.close(Http2Closed::Stalled, cx),
                None => this.timer.as_mut().reset(now + this.check),
            }
        }
        Poll::Pending
    }
}

impl<C: Graceful> Http2<C> {
    /// GOAWAY for the client's conduct; dropped [`CLOSING`] later, whatever its streams do. The
    /// connection is polled again at once, so that the GOAWAY it queued is written now.
    fn close(&mut self, why: Http2Closed, cx: &Context<'_>) {
        cx.waker().wake_by_ref();
        tracing::debug!(reason = why.label(), "closing an HTTP/2 connection for its client's conduct");
        self.state.metrics.http2_closed(why);
        self.connection.as_mut().graceful_shutdown();
        let at = tokio::time::Instant::now() + CLOSING;
        self.closing_at = Some(at);
        self.timer.as_mut().reset(at);
    }
}

impl<I, S, B> Graceful for Connection<I, S, TokioExecutor>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    TokioExecutor: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        Connection::graceful_shutdown(self);
    }
}

impl<C: Future<Output = Result<(), hyper::Error>> + Graceful> Graceful for Http2<C> {
    fn graceful_shutdown(mut self: Pin<&mut Self>) {
        self.connection.as_mut().graceful_shutdown();
    }
}

/// A stream whose first bytes were already read: they are read again first.
pub(super) struct Replay<S> {
    kept: Box<[u8]>,
    at: usize,
    inner: S,
}

impl<S> Replay<S> {
    pub(super) fn new(kept: &[u8], inner: S) -> Replay<S> {
        Replay { kept: kept.into(), at: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replay<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.kept.len() {
            let n = (self.kept.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.kept[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

crate::http1::write_through!(Replay, inner);
