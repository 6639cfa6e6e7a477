//! An upstream's answer as the client reads it: its status, its body (with room for the JSON
//! parser's padding), what its headers say of caching it and of its type, and how it came.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use super::freshness::Freshness;
use super::tls::CertificateAsked;
use crate::telemetry::{Recorder, Span, keys};

/// An upstream's answer, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    /// The body, with spare capacity for the JSON parser's padding.
    pub body: Vec<u8>,
    /// What its headers say about caching it.
    pub freshness: Freshness,
    /// What its `Retry-After` asks (a 429 or 503 answer's is heeded by a route's retries).
    pub retry_after: Option<Duration>,
    /// Whether the upstream asked for a client certificate when the connection was made (a
    /// 400 or 403 may be its refusal of the one given, or of none).
    pub certificate_asked: Option<CertificateAsked>,
    /// What its `Content-Type` says it is (told when the body is not JSON).
    pub content_type: MediaType,
    /// Whether it came over HTTP/2 (else HTTP/1.1).
    pub http2: bool,
    /// A 2xx answer's headers, names in lower case, when the call asked for them
    /// (`Outbound::keep_headers`: a page's `$headers` and `Link`).
    pub headers: Option<Vec<(String, String)>>,
    /// A 2xx answer's CLIENT span, when the call's is recorded: recorded when dropped, or as
    /// failed by its reader ([`AnsweredSpan::fail`]: a body that is not JSON).
    pub span: Option<AnsweredSpan>,
}

/// The CLIENT span of an attempt the upstream answered 2xx: ended when the answer was read,
/// recorded when dropped, unless its reader finds the body is not what the call needs
/// ([`AnsweredSpan::fail`]).
pub struct AnsweredSpan {
    span: Option<Span>,
    recorder: Arc<Recorder>,
    /// When the answer was read (nanoseconds since the Unix epoch).
    end: u64,
}

impl AnsweredSpan {
    pub(super) fn new(span: Span, recorder: Arc<Recorder>) -> AnsweredSpan {
        AnsweredSpan { span: Some(span), recorder, end: crate::telemetry::now() }
    }

    /// Records the span as failed: its `error.type` (`not_json`) and why, in words that name no
    /// value.
    pub fn fail(mut self, kind: &str, why: &str) {
        if let Some(mut span) = self.span.take() {
            span.set(&keys::ERROR_TYPE, kind);
            span.fail(why);
            span.end_at(&self.recorder, self.end);
        }
    }
}

impl Drop for AnsweredSpan {
    fn drop(&mut self) {
        if let Some(span) = self.span.take() {
            span.end_at(&self.recorder, self.end);
        }
    }
}

impl std::fmt::Debug for AnsweredSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnsweredSpan")
    }
}

/// The media type a `Content-Type` names (`text/html`), without its parameters, lowercased and
/// cut to [`MediaType::MAX`] bytes; kept inline, so that no answer allocates for it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MediaType {
    bytes: [u8; MediaType::MAX],
    len: u8,
}

impl Default for MediaType {
    fn default() -> MediaType {
        MediaType { bytes: [0; MediaType::MAX], len: 0 }
    }
}

impl MediaType {
    /// Longest media type kept.
    pub const MAX: usize = 64;

    /// The media type of a `Content-Type` value; none when it holds no plain token.
    pub fn of(value: &[u8]) -> MediaType {
        let essence = value.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
        let mut kept = MediaType::default();
        if essence.iter().all(|b| b.is_ascii_graphic()) {
            let len = essence.len().min(MediaType::MAX);
            kept.bytes[..len].copy_from_slice(&essence[..len]);
            kept.bytes[..len].make_ascii_lowercase();
            kept.len = len as u8;
        }
        kept
    }

    /// The media type, if the answer named one.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).ok().filter(|s| !s.is_empty())
    }

    /// Whether it names JSON (`application/json`, `application/problem+json`, ...).
    pub fn is_json(&self) -> bool {
        self.as_str().is_some_and(|t| t == "application/json" || t.ends_with("+json"))
    }
}

impl std::fmt::Debug for MediaType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}
