//! Each client connection starts in the lane for route calls: a plain `GET /v1/{uuid}/{path}`
//! over HTTP/1.1 without a body is read, served and answered here, from one fixed buffer, with
//! no per-request task or body machinery. The first request of any other kind (another method
//! or endpoint, a body, `Expect`, `Upgrade`, a `Connection` option, HTTP/1.0, a head the lane
//! cannot parse or that outgrows its buffer) hands the connection, with every byte already read,
//! to hyper for the rest of its life, so hyper answers everything the lane does not take,
//! errors and limits included.
//!
//! A call in the lane goes through the same steps as one through hyper (`router::stamped`,
//! `router::answered`, `call::call`): request id, span, admission, metrics, log line and problems.

use std::future::{Future, poll_fn};
use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use hyper::body::Body as _;
use hyper::server::conn::http1::Builder;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};

use super::connection::{Activity, ActivityStream, Framed, Graceful, Stream};
use super::router::{Client, answered, endpoint, segments, stamped};
use super::traced;
use super::{Response, State, call, h2};
use crate::callers::{Memo, X_API_KEY};
use crate::http1::{self, line};
use crate::metrics::Endpoint;

/// The most bytes of a request head the lane reads before it hands the connection to hyper.
const BUFFER: usize = 16 * 1024;
/// The most header lines the lane parses.
const HEADERS: usize = 64;

/// Why a connection ended badly.
pub(super) type LaneError = Box<dyn std::error::Error + Send + Sync>;

/// One client connection, in the lane and then perhaps with hyper; closes gracefully when told.
pub(super) struct Lane {
    closing: Arc<AtomicBool>,
    serving: Pin<Box<dyn Future<Output = Result<(), LaneError>> + Send>>,
}

impl Lane {
    pub(super) fn new(
        state: Arc<State>,
        stream: ActivityStream<impl Stream>,
        activity: Arc<Activity>,
        http: Arc<Builders>,
        client: Client,
    ) -> Lane {
        let closing = Arc::new(AtomicBool::new(false));
        let serving =
            crate::tasks::boxed(|| run_connection(state, stream, activity, http, closing.clone(), client));
        Lane { closing, serving }
    }
}

impl Future for Lane {
    type Output = Result<(), LaneError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.serving.as_mut().poll(cx)
    }
}

/// The connection's driver polls it again right after telling it, which is when it looks.
impl Graceful for Lane {
    fn graceful_shutdown(self: Pin<&mut Self>) {
        self.closing.store(true, Ordering::Relaxed);
    }
}

/// A route call's head, owned.
struct CallHead {
    /// Bytes of the head in the buffer.
    length: usize,
    target: PathAndQuery,
    /// Where the uuid segment of the target's path ends: `/v1/{uuid}` is `path[..id_end]`.
    id_end: usize,
    headers: HeaderMap,
}

enum Parsed {
    Call(CallHead),
    /// The head is not all there yet.
    Partial,
    /// Not for the lane: hyper serves it.
    Other,
}

async fn run_connection(
    state: Arc<State>,
    mut stream: ActivityStream<impl Stream>,
    activity: Arc<Activity>,
    http: Arc<Builders>,
    closing: Arc<AtomicBool>,
    client: Client,
) -> Result<(), LaneError> {
    let mut buffer = Buffer::new(BUFFER.min(state.config.max_header_bytes));
    let max_headers = HEADERS.min(state.config.max_headers);
    let mut out = Vec::with_capacity(1024);
    let Client { peer, memo, .. } = client;
    loop {
        let head = loop {
            match next_head(&mut buffer, max_headers) {
                Parsed::Call(head) => break head,
                Parsed::Partial if !buffer.is_full() => {}
                Parsed::Partial | Parsed::Other => {
                    drop(out);
                    return hand_off(
                        state,
                        stream,
                        activity,
                        &http,
                        closing,
                        buffer,
                        Client::new(peer, memo),
                    )
                    .await;
                }
            }
            // Between requests, a graceful close closes at once, a head begun or not: the driver
            // asks for it when the connection is idle too long or its head too slow.
            let read = poll_fn(|cx| {
                if closing.load(Ordering::Relaxed) {
                    return Poll::Ready(Ok(0));
                }
                buffer.poll_fill(&mut stream, cx)
            })
            .await;
            match read {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(e.into()),
            }
        };
        buffer.consume(head.length);
        let busy = activity.busy();
        // A route call in the lane has no body: bytes after its head are the start of the next
        // one, and so are bytes read while it is served. The next head's time runs from then.
        activity.body_read();
        if !buffer.filled().is_empty() {
            activity.head_begun();
        }
        let answered = {
            // Built in place: moved into `watching`, the call's future would be copied whole.
            let call = std::pin::pin!(respond_to_call(&state, &head, peer, &memo));
            watching(call, &mut buffer, &mut stream).await
        };
        // By here the call is dropped, answered or not: an unanswered one has freed its
        // in-flight place and closed its upstream connection.
        let Some(mut response) = answered else {
            tracing::debug!("the client went away during a route call; the call was dropped unanswered");
            return Ok(());
        };
        // Closing after this answer: say so, as hyper does.
        if closing.load(Ordering::Relaxed) {
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        encode(&mut out, response);
        stream.write_all(&out).await?;
        // Over TLS, what was written may wait in the session's buffer until flushed.
        stream.flush().await?;
        // Served once its answer is written: a stop leaves a connection writing one alone.
        drop(busy);
        if closing.load(Ordering::Relaxed) {
            return Ok(());
        }
    }
}

/// Polls `call` while reading what the client sends meanwhile: bytes begin its next head (the
/// stream tells the connection's driver, so its head timeout runs), and the end of the stream or
/// an error means the client has gone: `None` is returned at once, and the caller drops the call.
/// With the buffer full, the client is not read until the call ends.
async fn watching(
    mut call: Pin<&mut impl Future<Output = Response>>,
    buffer: &mut Buffer,
    stream: &mut ActivityStream<impl Stream>,
) -> Option<Response> {
    poll_fn(|cx| {
        if let Poll::Ready(response) = call.as_mut().poll(cx) {
            return Poll::Ready(Some(response));
        }
        while !buffer.is_full() {
            match buffer.poll_fill(stream, cx) {
                Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(None),
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => break,
            }
        }
        Poll::Pending
    })
    .await
}

/// Answers a route call as [`handle`] would.
async fn respond_to_call(state: &State, head: &CallHead, peer: Option<IpAddr>, memo: &Memo) -> Response {
    let path = head.target.path();
    // `parse` let only route calls in, and found where the uuid ends.
    let (id, rest) = (&path["/v1/".len()..head.id_end], &path[head.id_end + 1..]);
    let request = call::RouteCall {
        method: &Method::GET,
        path,
        query: head.target.query(),
        headers: &head.headers,
        body: None,
        memo: Some(memo),
    };
    // Boxed: the call's future is large, and `answered` and `stamped` each hold the future
    // they are given and move it again to await it; a box makes those moves a pointer's.
    let called = crate::tasks::boxed(|| async { Ok(call::call(state, request, id, rest).await) });
    let request_id = state.request_ids.for_headers(&head.headers);
    let inbound = traced::Inbound {
        method: &Method::GET,
        path,
        headers: &head.headers,
        authority: None,
        peer,
        version: &crate::telemetry::keys::PROTOCOL_1_1,
        route: Some(&traced::CALL),
    };
    let (scope, span) = traced::begin(state, &inbound);
    // Boxed as well: the trace's and the request id's wrappers each move what they are given.
    let answered = crate::tasks::boxed(|| answered(state, &Method::GET, path, Endpoint::Call, called));
    let ids = scope.ids();
    stamped(request_id, Some(ids), traced::serve(scope, span, answered)).await
}

/// The next request head in the buffer: a route call the lane serves, not yet all there, or
/// anything else. Once a look found the head incomplete, the buffer is parsed again only when a
/// blank line has arrived since (or it is full), so a head that comes a byte at a time is parsed
/// a few times, not once per byte; and bytes that cannot begin `GET /v1/` go to hyper at once.
fn next_head(buffer: &mut Buffer, max_headers: usize) -> Parsed {
    let bytes = buffer.filled();
    if !may_be_call(bytes) {
        return Parsed::Other;
    }
    let parsed = if buffer.worth_a_look() { parse(bytes, max_headers) } else { Parsed::Partial };
    buffer.looked = bytes.len();
    parsed
}

/// Whether `bytes` may begin a route call: after any empty lines, which a server ignores before a
/// request line (RFC 9112 §2.2), they agree with `GET /v1/` as far as they go.
fn may_be_call(bytes: &[u8]) -> bool {
    let start = bytes.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(bytes.len());
    let prefix = b"GET /v1/";
    let n = (bytes.len() - start).min(prefix.len());
    bytes[start..start + n] == prefix[..n]
}

/// Reads a request head from `bytes`: a route call the lane serves, or not yet all there, or
/// anything else.
fn parse(bytes: &[u8], max_headers: usize) -> Parsed {
    #[cfg(test)]
    tests::PARSES.with(|n| n.set(n.get() + 1));
    if bytes.is_empty() {
        return Parsed::Partial;
    }
    // Left uninitialised: the parser writes each line before it is read.
    let mut lines = [const { MaybeUninit::<httparse::Header>::uninit() }; HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let length = match request.parse_with_uninit_headers(bytes, &mut lines[..max_headers]) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Other,
    };
    if request.method != Some("GET") || request.version != Some(1) {
        return Parsed::Other;
    }
    let Some(target) = request.path.filter(|p| p.starts_with("/v1/")) else { return Parsed::Other };
    let Ok(target) = PathAndQuery::try_from(target) else { return Parsed::Other };
    let Some((id, _)) = call_segments(target.path()) else { return Parsed::Other };
    let id_end = "/v1/".len() + id.len();
    let mut headers = HeaderMap::with_capacity(request.headers.len());
    for line in request.headers.iter() {
        // A protected route's key header, named without parsing or allocating its name.
        let name = if line.name.len() == X_API_KEY.as_str().len()
            && line.name.eq_ignore_ascii_case(X_API_KEY.as_str())
        {
            Ok(X_API_KEY)
        } else {
            HeaderName::from_bytes(line.name.as_bytes())
        };
        let (Ok(name), Ok(value)) = (name, HeaderValue::from_bytes(line.value)) else {
            return Parsed::Other;
        };
        let plain = match name {
            header::CONTENT_LENGTH => value == "0",
            header::CONNECTION => value.as_bytes().eq_ignore_ascii_case(b"keep-alive"),
            header::TRANSFER_ENCODING | header::EXPECT | header::UPGRADE => false,
            _ => true,
        };
        if !plain {
            return Parsed::Other;
        }
        headers.append(name, value);
    }
    Parsed::Call(CallHead { length, target, id_end, headers })
}

/// The uuid and path segments of a route call's path, `/v1/{uuid}/{path}`, by the same rule the
/// router uses ([`endpoint`]); `None` for a path of another endpoint.
fn call_segments(path: &str) -> Option<(&str, &str)> {
    let segments = segments(path);
    match (endpoint(&segments), segments.as_slice()) {
        (Endpoint::Call, [_, id, rest]) => Some((id, rest)),
        _ => None,
    }
}

/// Writes `response` as HTTP/1.1 bytes into `out`, as hyper writes it: status line, the
/// response's headers, `content-length`, `date`, then the body.
fn encode(out: &mut Vec<u8>, response: Response) {
    let (parts, body) = response.into_parts();
    let body = whole(body);
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        line(out, name.as_str().as_bytes(), value.as_bytes());
    }
    let bodiless = http1::has_no_body(parts.status);
    if !bodiless && !parts.headers.contains_key(header::CONTENT_LENGTH) {
        http1::content_length(out, body.len());
    }
    DATE.with(|date| date.write(out));
    out.extend_from_slice(b"\r\n");
    if !bodiless {
        out.extend_from_slice(&body);
    }
}

/// The bytes of a whole body, which is ready at once.
fn whole(body: http_body_util::Full<Bytes>) -> Bytes {
    let mut body = std::pin::pin!(body);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match body.as_mut().poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(),
    }
}

thread_local! {
    static DATE: DateCache = const { DateCache { second: std::cell::Cell::new(u64::MAX), text: std::cell::RefCell::new(String::new()) } };
}

/// The `Date` header's value, made at most once a second per thread.
struct DateCache {
    second: std::cell::Cell<u64>,
    text: std::cell::RefCell<String>,
}

impl DateCache {
    /// Writes the `date` header line.
    fn write(&self, out: &mut Vec<u8>) {
        let now = SystemTime::now();
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if self.second.get() != second {
            *self.text.borrow_mut() = httpdate::fmt_http_date(now);
            self.second.set(second);
        }
        line(out, b"date", self.text.borrow().as_bytes());
    }
}

/// The connection's read buffer: a fixed slice with the unread bytes between `start` and `end`.
struct Buffer {
    bytes: Box<[u8]>,
    start: usize,
    end: usize,
    /// How many of the unread bytes are known to hold no complete head.
    looked: usize,
}

impl Buffer {
    fn new(size: usize) -> Buffer {
        Buffer { bytes: vec![0; size.max(1)].into_boxed_slice(), start: 0, end: 0, looked: 0 }
    }

    fn filled(&self) -> &[u8] {
        &self.bytes[self.start..self.end]
    }

    fn is_full(&self) -> bool {
        self.end - self.start == self.bytes.len()
    }

    /// Whether the unread bytes may hold a head the last look did not find complete: nothing was
    /// looked at yet, a blank line has arrived since, or the buffer is full (and goes to hyper).
    fn worth_a_look(&self) -> bool {
        self.looked == 0 || self.is_full() || http1::has_blank_line(self.filled(), self.looked)
    }

    /// Reads more bytes after the unread ones (moved to the front first when the end is reached).
    fn poll_fill<S: AsyncRead + Unpin>(
        &mut self,
        stream: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<usize>> {
        if self.end == self.bytes.len() {
            self.bytes.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let mut read = ReadBuf::new(&mut self.bytes[self.end..]);
        ready!(Pin::new(stream).poll_read(cx, &mut read))?;
        let n = read.filled().len();
        self.end += n;
        Poll::Ready(Ok(n))
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        self.looked = 0;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
    }
}

/// hyper's servers of the connections the lane hands over.
pub(super) struct Builders {
    pub http1: Builder,
    /// HTTP/2: over TLS when the client chose `h2`, and with prior knowledge when `h2c`.
    pub http2: hyper::server::conn::http2::Builder<hyper_util::rt::TokioExecutor>,
    /// `RECAST_H2C=true`.
    pub h2c: bool,
}

/// Gives the connection to hyper, which reads the bytes left in `read` first, a request at a time
/// ([`Framed`]), and serves it there to its end; or, with h2c on and the HTTP/2 preface first,
/// serves it as HTTP/2.
async fn hand_off(
    state: Arc<State>,
    mut stream: ActivityStream<impl Stream>,
    activity: Arc<Activity>,
    http: &Builders,
    closing: Arc<AtomicBool>,
    mut read: Buffer,
    client: Client,
) -> Result<(), LaneError> {
    if http.h2c {
        // Enough of the head to tell the preface from an HTTP/1.1 request line.
        while read.filled().len() < h2::PREFACE.len()
            && h2::PREFACE.starts_with(read.filled())
            && !read.is_full()
        {
            match poll_fn(|cx| read.poll_fill(&mut stream, cx)).await? {
                0 => return Ok(()),
                _ => continue,
            }
        }
        if read.filled().starts_with(h2::PREFACE) {
            let stream = h2::Replay::new(read.filled(), stream.into_inner());
            drop(read);
            let connection = h2::connection(state, stream, activity, &http.http2, client);
            return until_closed(connection, &closing).await.map_err(Into::into);
        }
    }
    let io = TokioIo::new(Framed::new(stream, read.filled(), activity.clone()));
    drop(read);
    let service = super::router::hyper_service(state, activity, client);
    until_closed(http.http1.serve_connection(io, service), &closing).await.map_err(Into::into)
}

/// Serves `connection` to its end, closing it gracefully once `closing` is set.
async fn until_closed<C: Graceful>(connection: C, closing: &AtomicBool) -> C::Output {
    let mut connection = std::pin::pin!(connection);
    let mut told = false;
    poll_fn(|cx| {
        if !told && closing.load(Ordering::Relaxed) {
            told = true;
            connection.as_mut().graceful_shutdown();
        }
        connection.as_mut().poll(cx)
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    thread_local! {
        /// How many times `parse` ran on this thread.
        pub(super) static PARSES: Cell<usize> = const { Cell::new(0) };
    }

    impl Buffer {
        /// Appends `bytes` as a read would.
        fn receive(&mut self, bytes: &[u8]) {
            self.bytes[self.end..self.end + bytes.len()].copy_from_slice(bytes);
            self.end += bytes.len();
        }
    }

    /// A route call's head of about `size` bytes, padded with header lines (fewer than
    /// [`HEADERS`]).
    fn long_head(size: usize) -> Vec<u8> {
        let mut head = b"GET /v1/0b7f0ab4-7e50-4d8e-9a35-35b8e7a0d3c1/meal HTTP/1.1\r\nhost: t\r\n".to_vec();
        let mut n = 0;
        // Lines of 256 bytes, and room for the blank line.
        while head.len() + 256 + 2 <= size {
            head.extend_from_slice(format!("x-padding-{n:02}: {}\r\n", "p".repeat(240)).as_bytes());
            n += 1;
        }
        head.extend_from_slice(b"\r\n");
        head
    }

    #[test]
    fn a_head_that_comes_a_byte_at_a_time_is_parsed_twice_not_once_per_byte() {
        let head = long_head(BUFFER - 100);
        let mut buffer = Buffer::new(BUFFER);
        let before = PARSES.with(Cell::get);
        for (i, byte) in head.iter().enumerate() {
            buffer.receive(&[*byte]);
            match next_head(&mut buffer, HEADERS) {
                Parsed::Partial => assert!(i + 1 < head.len(), "complete, yet partial"),
                Parsed::Call(call) => {
                    assert_eq!((i + 1, call.length), (head.len(), head.len()));
                    assert!(call.headers.len() > 50, "{} header lines", call.headers.len());
                }
                Parsed::Other => panic!("handed on at byte {i}"),
            }
        }
        // Once at the first byte, once when the blank line came.
        assert_eq!(PARSES.with(Cell::get) - before, 2, "{} bytes", head.len());
    }

    #[test]
    fn each_new_blank_line_and_a_full_buffer_get_a_look() {
        let mut buffer = Buffer::new(64);
        buffer.receive(b"\r\n\r\nGET /v1/x");
        assert!(buffer.worth_a_look(), "the first look");
        assert!(matches!(next_head(&mut buffer, HEADERS), Parsed::Partial));
        buffer.receive(b"/y HTTP/1.1\r\nhost: t\r");
        assert!(!buffer.worth_a_look(), "blank lines before the request line were looked at");
        buffer.receive(b"\n\r\n");
        assert!(buffer.worth_a_look(), "a blank line split across reads");
        let mut full = Buffer::new(16);
        full.receive(b"GET /v1/");
        let _ = next_head(&mut full, HEADERS);
        full.receive(b"abcdefgh");
        assert!(full.is_full() && full.worth_a_look());
        assert!(matches!(next_head(&mut full, HEADERS), Parsed::Partial), "full: the caller hands on");
    }
}
