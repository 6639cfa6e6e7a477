//! HTTP/1.1 on one upstream connection: writes a request, reads the answer's head and its body
//! (by `Content-Length`, chunked, or up to the close) into one buffer with room for the JSON
//! parser's padding, and says whether the connection can carry another request.
//!
//! The calling task drives the connection itself, from the write to the last byte of the body:
//! no task per connection and no hand-off between tasks per request.

use std::mem::MaybeUninit;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Method, StatusCode, header};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

use super::UpstreamRequest;
use super::answer::{Answer, MediaType};
use super::coding::{Body, Coding, Sink};
use super::freshness::Freshness;
use super::request::Extra;
pub(super) use super::stream::{Failed, READ_SIZE, Stream};
use crate::http1::{self, line};
use crate::json::PADDING;

/// The largest answer head read.
const MAX_HEAD: usize = 64 * 1024;
/// The most header lines an answer may have.
const MAX_HEADERS: usize = 128;
/// The most interim (1xx) answers skipped before the answer.
const MAX_INTERIM: usize = 16;
/// The longest chunk size line, extensions included.
const MAX_CHUNK_LINE: usize = 4 * 1024;
/// A read buffer larger than this after an exchange (a big chunk passed through it) is not kept
/// while the connection sits in the pool.
const KEEP_BUFFER: usize = 64 * 1024;

/// One open connection to an upstream.
pub(super) struct Connection {
    /// Boxed: a TLS stream is large, and a connection moves in and out of the pool and the
    /// call's future.
    stream: Box<Stream>,
    /// Bytes read and not yet used; empty between exchanges.
    buf: Vec<u8>,
    /// When the connection was put back in the pool.
    pub(super) idle_since: Instant,
    /// Whether its upstream asked for a client certificate (told with each answer).
    pub(super) certificate_asked: Option<super::tls::CertificateAsked>,
    /// Whether it may go back to the pool of the worker that used it: not when it was made on
    /// another runtime (by a shared open), whose event loop drives it.
    pub(super) poolable: bool,
}

/// Whether a connection may carry another request once its answer is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reuse {
    Keep,
    Close,
}

/// How an answer's body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

/// Headers as an answer's `headers` keeps them: names in lower case, the lines of one name
/// joined by `, `, values that are not text left out.
pub(super) fn joined_headers<'h>(lines: impl Iterator<Item = (&'h str, &'h [u8])>) -> Vec<(String, String)> {
    let mut headers: Vec<(String, String)> = Vec::new();
    for (name, value) in lines {
        let Ok(value) = std::str::from_utf8(value) else { continue };
        let name = name.to_ascii_lowercase();
        match headers.iter_mut().find(|(n, _)| *n == name) {
            Some((_, joined)) => {
                joined.push_str(", ");
                joined.push_str(value.trim());
            }
            None => headers.push((name, value.trim().to_owned())),
        }
    }
    headers
}

/// What the head of an answer says.
struct AnswerHead {
    status: StatusCode,
    length: usize,
    framing: Framing,
    keep_alive: bool,
    coding: Coding,
    freshness: Freshness,
    retry_after: Option<Duration>,
    content_type: MediaType,
    /// A 2xx answer's headers, when kept.
    headers: Option<Vec<(String, String)>>,
}

/// A `Retry-After` value (RFC 9110 §10.2.3): whole seconds, or a date, as the time from now
/// (zero for a date past), at most [`MAX_RETRY_AFTER`]; `None` when it is neither.
pub(super) fn retry_after_of(value: &[u8]) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let asked = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than a u64 holds: as long as can be said.
        Duration::from_secs(text.parse().unwrap_or(u64::MAX))
    } else {
        let at = httpdate::parse_http_date(text).ok()?;
        at.duration_since(std::time::SystemTime::now()).unwrap_or_default()
    };
    Some(asked.min(MAX_RETRY_AFTER))
}

/// The longest `Retry-After` taken as it is: a day, far past any call's deadline, and small
/// enough that no clock arithmetic with it can overflow.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(86_400);

/// The bytes of `request` on the wire: request line, `Host`, `Accept-Encoding` (`gzip, br` when
/// `compression` is on, else `identity`), the request's headers (with `authorization` in place of
/// its own `Authorization`, when given), `Content-Length` when there is a body or the method
/// carries one, and the body.
pub(super) fn encode(request: &UpstreamRequest, extra: Extra<'_>, compression: bool) -> Vec<u8> {
    let authorization = extra.authorization;
    let mut out = Vec::with_capacity(256 + request.body.len());
    out.extend_from_slice(request.method.as_str().as_bytes());
    out.push(b' ');
    let target = request.uri.path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(if target.is_empty() { b"/" } else { target.as_bytes() });
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if !request.headers.contains_key(header::HOST)
        && let Some(authority) = request.uri.authority()
    {
        line(&mut out, b"host", authority.as_str().as_bytes());
    }
    // Only the codings recast decodes (no header at all would mean any coding, RFC 9110 §12.5.3).
    line(&mut out, b"accept-encoding", if compression { b"gzip, br" } else { b"identity" });
    for (name, value) in &request.headers {
        if name != header::CONTENT_LENGTH
            && name != header::ACCEPT_ENCODING
            && !(authorization.is_some() && name == header::AUTHORIZATION)
            && !extra.trace.is_some_and(|trace| trace.replaces(name))
        {
            line(&mut out, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    if let Some(value) = authorization {
        line(&mut out, b"authorization", value.as_bytes());
    }
    for (name, value) in extra.trace.iter().flat_map(|trace| trace.lines(&request.headers)) {
        line(&mut out, name.as_bytes(), value);
    }
    if !request.body.is_empty() || matches!(request.method, Method::POST | Method::PUT | Method::PATCH) {
        http1::content_length(&mut out, request.body.len());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&request.body);
    out
}

impl Connection {
    pub(super) fn new(stream: Stream) -> Connection {
        Connection {
            stream: Box::new(stream),
            buf: Vec::with_capacity(READ_SIZE),
            idle_since: Instant::now(),
            certificate_asked: None,
            poolable: true,
        }
    }

    /// Whether an idle connection can still be used: the upstream has neither closed it nor sent
    /// anything unasked. Looks without waiting.
    pub(super) fn is_open(&mut self) -> bool {
        let mut byte = [0u8; 1];
        let mut probe = ReadBuf::new(&mut byte);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        matches!(std::pin::Pin::new(&mut *self.stream).poll_read(&mut cx, &mut probe), Poll::Pending)
    }

    /// Sends `request` (from [`encode`]) and reads the whole answer, the body at most `limit`
    /// bytes. `head_only` is true for a `HEAD` request, whose answer has no body; `keep_headers`
    /// keeps a 2xx answer's headers.
    pub(super) async fn exchange(
        &mut self,
        request: &[u8],
        head_only: bool,
        limit: usize,
        keep_headers: bool,
    ) -> Result<(Answer, Reuse), Failed> {
        self.buf.clear();
        self.send(request).await?;
        let mut head = self.read_head(head_only).await?;
        let headers = if keep_headers && head.status.is_success() { self.headers_of(&head) } else { None };
        head.headers = headers;
        // Only a 2xx answer's body is ever read by recast; any other is read to keep the framing
        // and dropped, whatever its coding.
        let decode = head.status.is_success() && head.framing != Framing::Length(0);
        let mut body = Body::new(&head.coding, decode, limit)?;
        let clean = self.read_body(&mut body, &head, limit).await?;
        let body = body.finish()?;
        if self.buf.capacity() > KEEP_BUFFER {
            self.buf = Vec::with_capacity(READ_SIZE);
        }
        self.buf.clear();
        // Bytes that came with the answer's last read but after it are nobody's answer: the
        // connection must not carry another request. (Bytes that come later are found by the
        // pool, which looks before it reuses a connection.)
        let reuse = if clean && head.keep_alive { Reuse::Keep } else { Reuse::Close };
        let answer = Answer {
            status: head.status,
            body,
            freshness: head.freshness,
            retry_after: head.retry_after,
            certificate_asked: self.certificate_asked,
            content_type: head.content_type,
            http2: false,
            headers: head.headers,
            span: None,
        };
        Ok((answer, reuse))
    }

    /// Stops this side's writing, as a connection the kernel no longer lets write would be (tests
    /// of what a failed send does).
    #[cfg(test)]
    pub(super) async fn stop_writing(&mut self) {
        let _ = self.stream.shutdown().await;
    }

    /// Writes `request` whole. A first write that fails on a plain connection sent nothing
    /// ([`Failed::Unsent`]); any other failure may have let bytes out ([`Failed::Stale`]), also a
    /// first one over TLS, whose write may fail after a record of it went out.
    async fn send(&mut self, request: &[u8]) -> Result<(), Failed> {
        let plain = matches!(self.stream.inner(), hyper_rustls::MaybeHttpsStream::Http(_));
        let failed = |written: usize, e: std::io::Error| {
            let why = format!("sending the request failed: {e}");
            if super::tls::is_tls_failure(&e) {
                Failed::Tls(why)
            } else if written == 0 && plain {
                Failed::Unsent(why)
            } else {
                Failed::Stale(why)
            }
        };
        let mut written = 0;
        while written < request.len() {
            match self.stream.write(&request[written..]).await {
                Ok(0) => return Err(failed(written, std::io::ErrorKind::WriteZero.into())),
                Ok(n) => written += n,
                Err(e) => return Err(failed(written, e)),
            }
        }
        self.stream.flush().await.map_err(|e| failed(written, e))
    }

    /// Reads more bytes into the buffer; `Ok(0)` at the end of the stream.
    async fn fill(&mut self) -> std::io::Result<usize> {
        self.buf.reserve(READ_SIZE);
        self.stream.read_buf(&mut self.buf).await
    }

    /// Reads until a whole head is in the buffer and interprets it; skips interim (1xx) answers.
    async fn read_head(&mut self, head_only: bool) -> Result<AnswerHead, Failed> {
        let mut interim = 0;
        let mut received = false;
        // Where the buffer ended when a parse last found the head incomplete: a head that
        // arrives in many small reads is parsed again only once a blank line has come.
        let mut incomplete_at: Option<usize> = None;
        loop {
            let worth_parsing =
                !self.buf.is_empty() && incomplete_at.is_none_or(|end| http1::has_blank_line(&self.buf, end));
            if worth_parsing {
                match self.parse_head(head_only)? {
                    Some(head) if !head.status.is_informational() => return Ok(head),
                    Some(interim_answer) => {
                        interim += 1;
                        if interim > MAX_INTERIM {
                            return Err(Failed::Broken(format!("more than {MAX_INTERIM} interim answers")));
                        }
                        self.buf.drain(..interim_answer.length);
                        incomplete_at = None;
                        continue;
                    }
                    None => incomplete_at = Some(self.buf.len()),
                }
            }
            if self.buf.len() > MAX_HEAD {
                return Err(head_too_large());
            }
            let nothing_yet = !received;
            received = true;
            match self.fill().await {
                Ok(0) if nothing_yet => {
                    return Err(Failed::Stale("the upstream closed the connection".into()));
                }
                Ok(0) => return Err(Failed::Broken("the upstream closed the connection mid-answer".into())),
                Ok(_) => {}
                // An alert instead of an answer: TLS 1.3 servers refuse a client certificate so.
                Err(e) if super::tls::is_tls_failure(&e) => return Err(Failed::Tls(e.to_string())),
                Err(e) if nothing_yet => return Err(Failed::Stale(e.to_string())),
                Err(e) => return Err(Failed::Broken(e.to_string())),
            }
        }
    }

    /// The headers of the head at the start of the buffer (read by [`Connection::read_head`]),
    /// names in lower case, the lines of one name joined by `, ` (RFC 9110 §5.3).
    fn headers_of(&self, head: &AnswerHead) -> Option<Vec<(String, String)>> {
        let mut lines = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut answer = httparse::Response::new(&mut lines);
        answer.parse(self.buf.get(..head.length)?).ok()?;
        Some(joined_headers(answer.headers.iter().map(|h| (h.name, h.value))))
    }

    /// The head at the start of the buffer, if it is all there.
    fn parse_head(&self, head_only: bool) -> Result<Option<AnswerHead>, Failed> {
        // Left uninitialised: the parser writes each line before it is read.
        let mut lines = [const { MaybeUninit::<httparse::Header>::uninit() }; MAX_HEADERS];
        let mut answer = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut answer,
            &self.buf,
            &mut lines,
        );
        let length = match parsed {
            Ok(httparse::Status::Complete(length)) if length <= MAX_HEAD => length,
            Ok(httparse::Status::Complete(_)) => return Err(head_too_large()),
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(Failed::Broken(format!("the answer is not HTTP/1.1: {e}"))),
        };
        let status = answer
            .code
            .and_then(|code| StatusCode::from_u16(code).ok())
            .ok_or_else(|| Failed::Broken("the answer has no valid status".into()))?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(Failed::Broken("the upstream switched protocols".into()));
        }
        let mut keep_alive = answer.version == Some(1);
        let mut declared: Option<u64> = None;
        let mut chunked = None;
        let mut coding = Coding::Identity;
        let mut freshness = Freshness::default();
        let mut retry_after = None;
        let mut content_type = MediaType::default();
        for line in answer.headers.iter() {
            let name = line.name.as_bytes();
            if name.eq_ignore_ascii_case(b"content-length") {
                let digits = line.value.trim_ascii();
                let n = (!digits.is_empty() && digits.iter().all(u8::is_ascii_digit))
                    .then(|| std::str::from_utf8(digits).ok()?.parse::<u64>().ok())
                    .flatten()
                    .ok_or_else(|| Failed::Broken("the answer's Content-Length is not a number".into()))?;
                if declared.is_some_and(|d| d != n) {
                    return Err(Failed::Broken("the answer has two different Content-Lengths".into()));
                }
                declared = Some(n);
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                // Chunked only when it is the last coding; any other ends at the close.
                let last = line.value.rsplit(|&b| b == b',').next().unwrap_or_default();
                chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            } else if name.eq_ignore_ascii_case(b"content-encoding") {
                // Several lines are one list; a list of codings is not one recast decodes.
                coding = match coding {
                    Coding::Identity => Coding::of(line.value),
                    earlier => Coding::Unknown(format!(
                        "{earlier}, {}",
                        String::from_utf8_lossy(line.value.trim_ascii())
                    )),
                };
            } else if name.eq_ignore_ascii_case(b"connection") {
                if line.value.split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close")) {
                    keep_alive = false;
                }
            } else if name.eq_ignore_ascii_case(b"retry-after") {
                retry_after = retry_after_of(line.value);
            } else if name.eq_ignore_ascii_case(b"content-type") {
                content_type = MediaType::of(line.value);
            } else {
                freshness.line(name, line.value);
            }
        }
        // Transfer codings are HTTP/1.1: one in an HTTP/1.0 answer means its framing is faulty
        // (RFC 9112 §6.1).
        if chunked.is_some() && answer.version != Some(1) {
            return Err(Failed::Broken("an HTTP/1.0 answer has Transfer-Encoding".into()));
        }
        let bodiless = head_only || http1::has_no_body(status);
        // Both a length and a coding: the coding frames the body, and the connection is not
        // trusted with another request (RFC 9112 §6.3). Nor is it after an answer whose status
        // has no body but whose headers announce one: the bytes that may follow are not read.
        let announces_body = chunked.is_some() || declared.is_some_and(|n| n > 0);
        if chunked.is_some() && declared.is_some() || http1::has_no_body(status) && announces_body {
            keep_alive = false;
        }
        let framing = match (bodiless, chunked, declared) {
            (true, _, _) => Framing::Length(0),
            (false, Some(true), _) => Framing::Chunked,
            (false, Some(false), _) => Framing::UntilClose,
            (false, None, Some(n)) => Framing::Length(n),
            (false, None, None) => Framing::UntilClose,
        };
        Ok(Some(AnswerHead {
            status,
            length,
            framing,
            keep_alive,
            coding,
            freshness,
            retry_after,
            content_type,
            headers: None,
        }))
    }

    /// Reads the body the head announces into `body`; true when nothing followed it.
    async fn read_body(
        &mut self,
        body: &mut impl Sink,
        head: &AnswerHead,
        limit: usize,
    ) -> Result<bool, Failed> {
        match head.framing {
            Framing::Length(0) => Ok(self.buf.len() == head.length),
            Framing::Length(n) => self.read_length(body, head.length, n, limit).await,
            Framing::Chunked => self.read_chunked(body, head.length, limit).await,
            Framing::UntilClose => self.read_to_close(body, head.length, limit).await.map(|()| false),
        }
    }

    /// A body of `n` bytes, `from` the buffer on; clean when nothing followed it.
    async fn read_length(
        &mut self,
        body: &mut impl Sink,
        from: usize,
        n: u64,
        limit: usize,
    ) -> Result<bool, Failed> {
        if n > limit as u64 {
            return Err(Failed::TooLarge);
        }
        let n = n as usize;
        body.reserve(n.min(http1::RESERVE_LIMIT) + PADDING, n + PADDING);
        let buffered = &self.buf[from..];
        body.take_slice(&buffered[..buffered.len().min(n)])?;
        let clean = buffered.len() <= n;
        self.read_exactly(body, n, n + PADDING).await?;
        Ok(clean)
    }

    /// Reads from the stream into `body` until it has taken `n` bytes, growing a plain body as the
    /// bytes come (a declared length is not trusted with memory up front) to at most `most` bytes.
    async fn read_exactly(&mut self, body: &mut impl Sink, n: usize, most: usize) -> Result<(), Failed> {
        while body.taken() < n {
            let wanted = n - body.taken();
            body.reserve(wanted.min(http1::RESERVE_LIMIT) + PADDING, most);
            if body.read_from(&mut self.stream, wanted).await? == 0 {
                return Err(Failed::Broken("the upstream closed the connection mid-body".into()));
            }
        }
        Ok(())
    }

    /// A chunked body, `from` the buffer on; clean when nothing followed it. Chunk data goes
    /// straight into the body, not through the read buffer, so a large chunk is held once.
    async fn read_chunked(
        &mut self,
        body: &mut impl Sink,
        from: usize,
        limit: usize,
    ) -> Result<bool, Failed> {
        body.reserve(READ_SIZE.min(limit) + PADDING, limit + PADDING);
        let mut at = from;
        loop {
            let size = self.chunk_size(&mut at).await?;
            if size == 0 {
                break;
            }
            if size > (limit - body.taken()) as u64 {
                return Err(Failed::TooLarge);
            }
            // The chunk's data: what the buffer holds of it, then the rest from the stream.
            let end = body.taken() + size as usize;
            let buffered = (self.buf.len() - at).min(end - body.taken());
            body.reserve(buffered + PADDING, limit + PADDING);
            body.take_slice(&self.buf[at..at + buffered])?;
            at += buffered;
            if body.taken() < end {
                self.read_exactly(body, end, limit + PADDING).await?;
            }
            // Its CRLF.
            while self.buf.len() - at < 2 {
                self.more(&mut at).await?;
            }
            if &self.buf[at..at + 2] != b"\r\n" {
                return Err(Failed::Broken("a chunk does not end with CRLF".into()));
            }
            at += 2;
        }
        self.skip_trailers(&mut at).await?;
        Ok(self.buf.len() == at)
    }

    /// Reads the chunk size line at `at` and moves past it.
    async fn chunk_size(&mut self, at: &mut usize) -> Result<u64, Failed> {
        let invalid = || Failed::Broken("the answer's chunk size is invalid".into());
        loop {
            // The line begins with the size in hex (an empty size is not zero).
            if self.buf.get(*at).is_some_and(|b| !b.is_ascii_hexdigit()) {
                return Err(invalid());
            }
            match httparse::parse_chunk_size(&self.buf[*at..]) {
                Ok(httparse::Status::Complete((taken, size))) => {
                    // The line ends with CRLF, and holds no other CR or LF (the parser lets a
                    // bare LF pass inside an extension): a line end that two readers of the same
                    // bytes see in different places is how framing tricks begin (RFC 9112 §7.1).
                    let line = &self.buf[*at..*at + taken];
                    if !line.ends_with(b"\r\n") || line[..taken - 2].iter().any(|&b| b == b'\r' || b == b'\n')
                    {
                        return Err(Failed::Broken("a chunk size line does not end with CRLF alone".into()));
                    }
                    *at += taken;
                    return Ok(size);
                }
                Ok(httparse::Status::Partial) if self.buf.len() - *at > MAX_CHUNK_LINE => {
                    return Err(Failed::Broken("a chunk size line is too long".into()));
                }
                Ok(httparse::Status::Partial) => self.more(at).await?,
                Err(_) => return Err(invalid()),
            }
        }
    }

    /// Moves past the trailer lines after the last chunk, up to the empty line; at most `MAX_HEAD`
    /// bytes of them in all.
    async fn skip_trailers(&mut self, at: &mut usize) -> Result<(), Failed> {
        let mut trailers = 0;
        // How far past `at` the buffer is known to hold no CRLF.
        let mut searched: usize = 0;
        loop {
            let line = self.buf[*at + searched.saturating_sub(1)..]
                .windows(2)
                .position(|w| w == b"\r\n")
                .map(|i| i + searched.saturating_sub(1));
            searched = self.buf.len() - *at;
            if trailers + line.unwrap_or(self.buf.len() - *at) > MAX_HEAD {
                return Err(Failed::Broken("the answer's trailers are too large".into()));
            }
            match line {
                Some(0) => {
                    *at += 2;
                    return Ok(());
                }
                Some(line) => {
                    *at += line + 2;
                    trailers += line + 2;
                    searched = 0;
                }
                None => self.more(at).await?,
            }
        }
    }

    /// For the chunked reader: drops the bytes before `at` and reads more.
    async fn more(&mut self, at: &mut usize) -> Result<(), Failed> {
        self.buf.drain(..*at);
        *at = 0;
        match self.fill().await {
            Ok(0) => Err(Failed::Broken("the upstream closed the connection mid-body".into())),
            Ok(_) => Ok(()),
            Err(e) => Err(Failed::Broken(e.to_string())),
        }
    }

    /// A body that ends when the upstream closes the connection. It is read at most a byte past
    /// the limit, so a plain body's buffer never grows beyond it.
    async fn read_to_close(&mut self, body: &mut impl Sink, from: usize, limit: usize) -> Result<(), Failed> {
        let buffered = &self.buf[from..];
        if buffered.len() > limit {
            return Err(Failed::TooLarge);
        }
        body.reserve(buffered.len().max(READ_SIZE).min(limit) + PADDING, limit + 1 + PADDING);
        body.take_slice(buffered)?;
        loop {
            // Room for one byte more than the limit: reading it tells a body over the limit.
            let room = limit + 1 - body.taken();
            body.reserve(room.min(READ_SIZE) + PADDING, limit + 1 + PADDING);
            match body.read_from(&mut self.stream, room).await? {
                0 => return Ok(()),
                _ if body.taken() > limit => return Err(Failed::TooLarge),
                _ => {}
            }
        }
    }
}

fn head_too_large() -> Failed {
    Failed::Broken(format!("the answer's head is larger than {MAX_HEAD} bytes"))
}
