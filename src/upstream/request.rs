//! What the client sends upstream: a request, built by a route for each call
//! (`crate::route`), and the digest that tells which requests are the same.

use bytes::Bytes;
use http::header::HeaderName;
use http::{HeaderMap, HeaderValue, Method, Uri};

/// The request a call sends upstream.
#[derive(Debug, Clone)]
pub struct UpstreamRequest {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl UpstreamRequest {
    /// About the memory it holds: its parts' bytes and what keeps them (for
    /// `RECAST_MAX_BUFFERED_BYTES`, which counts the requests a composed call has rendered).
    pub fn held_bytes(&self) -> usize {
        const PER_HEADER: usize = 64;
        let headers: usize =
            self.headers.iter().map(|(name, value)| name.as_str().len() + value.len() + PER_HEADER).sum();
        let uri = self.uri.authority().map_or(0, |a| a.as_str().len())
            + self.uri.path_and_query().map_or(0, |p| p.as_str().len());
        std::mem::size_of::<UpstreamRequest>() + uri + headers + self.body.len()
    }

    /// A SHA-256 of everything this request sends upstream: its method, its target, every header
    /// (name and value) and its body. Two calls of one route version share a cached answer only
    /// when their requests have the same digest, that is only when they would send the same
    /// request: whatever a caller contributes (query, `Accept`, `Accept-Language`,
    /// `X-Mapped-Auth`, body, `Content-Type`) is in it, and so is any part added to the request
    /// later, since the request is taken apart whole below.
    pub fn digest(&self) -> [u8; 32] {
        let UpstreamRequest { method, uri, headers, body } = self;
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        // Every part is preceded by its length, so no two different requests hash the same text.
        let mut part = |bytes: &[u8]| {
            context.update(&(bytes.len() as u64).to_be_bytes());
            context.update(bytes);
        };
        part(method.as_str().as_bytes());
        part(uri.scheme_str().unwrap_or_default().as_bytes());
        part(uri.authority().map_or("", |authority| authority.as_str()).as_bytes());
        part(uri.path_and_query().map_or("", |target| target.as_str()).as_bytes());
        // In name order, so two requests that hold the same headers hash the same whatever order
        // they were set in; the values of one name keep theirs, which is sent.
        let mut names: smallvec::SmallVec<[&HeaderName; 8]> = headers.keys().collect();
        names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
        part(&(names.len() as u64).to_be_bytes());
        for name in names {
            part(name.as_str().as_bytes());
            let values = headers.get_all(name);
            part(&(values.iter().count() as u64).to_be_bytes());
            for value in values {
                part(value.as_bytes());
            }
        }
        part(body);
        let mut digest = [0u8; 32];
        digest.copy_from_slice(context.finish().as_ref());
        digest
    }

    /// Whether `other` sends the same as this request: the same method, URL, headers (each
    /// name's values in the same order, the names in any) and body, what [`digest`] covers.
    ///
    /// [`digest`]: UpstreamRequest::digest
    pub fn same_as(&self, other: &UpstreamRequest) -> bool {
        self.method == other.method
            && self.uri == other.uri
            && self.headers == other.headers
            && self.body == other.body
    }

    /// A 64-bit hash of what [`same_as`] compares, for finding the same request among others
    /// cheaply: requests that are the same have the same fingerprint; a shared fingerprint is
    /// confirmed by comparing them. Far cheaper than the digest. Its keys are drawn at random
    /// once per process, so a caller who steers what requests hold cannot make many of them
    /// share a fingerprint, which would cost a whole comparison of each pair.
    ///
    /// [`same_as`]: UpstreamRequest::same_as
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{BuildHasher, Hash, Hasher, RandomState};
        static KEYS: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
        let keys = KEYS.get_or_init(RandomState::new);
        let mut hasher = keys.build_hasher();
        self.method.hash(&mut hasher);
        self.uri.hash(&mut hasher);
        // Each name with its values hashed alone and the hashes added: the order of the names
        // does not change it, as it does not change `same_as`.
        let mut headers = 0u64;
        for name in self.headers.keys() {
            let mut one = keys.build_hasher();
            name.hash(&mut one);
            for value in self.headers.get_all(name) {
                value.hash(&mut one);
            }
            headers = headers.wrapping_add(one.finish());
        }
        headers.hash(&mut hasher);
        self.body.hash(&mut hasher);
        hasher.finish()
    }
}

/// What an attempt writes into its request beside the request itself, and into no cache key:
/// the token held, and the trace context of the attempt's span.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Extra<'a> {
    pub authorization: Option<&'a HeaderValue>,
    pub trace: Option<&'a Propagated>,
    /// Whether a 2xx answer's headers are kept ([`super::Answer::headers`]).
    pub keep_headers: bool,
}

/// The trace context an attempt passes on: its span as the parent (`traceparent`), and the
/// caller's `tracestate` and `baggage` as they came.
#[derive(Debug, Clone)]
pub struct Propagated {
    /// Its text, written as it is (no header value made for it on HTTP/1.1).
    pub traceparent: [u8; crate::trace_context::LENGTH],
    /// The caller's `tracestate` and `baggage`.
    pub carried: Option<std::sync::Arc<crate::telemetry::Carried>>,
}

impl Propagated {
    fn state(&self) -> Option<&HeaderValue> {
        self.carried.as_deref().and_then(|carried| carried.state.as_ref())
    }

    fn baggage(&self) -> Option<&HeaderValue> {
        self.carried.as_deref().and_then(|carried| carried.baggage.as_ref())
    }

    /// The header lines it adds to `request`'s own, by name: its `traceparent` always (in place
    /// of one the request has), the caller's `tracestate` and `baggage` only where the request
    /// has none of its own (a header a route configures is never replaced by a caller's).
    pub(crate) fn lines<'a>(
        &'a self,
        request: &'a http::HeaderMap,
    ) -> impl Iterator<Item = (&'static str, &'a [u8])> + 'a {
        [
            (crate::trace_context::TRACEPARENT, Some(&self.traceparent[..])),
            (crate::trace_context::TRACESTATE, self.state().map(HeaderValue::as_bytes)),
            ("baggage", self.baggage().map(HeaderValue::as_bytes)),
        ]
        .into_iter()
        .filter(move |(name, _)| *name == crate::trace_context::TRACEPARENT || !request.contains_key(*name))
        .filter_map(|(name, value)| value.map(|value| (name, value)))
    }

    /// Whether a header of the request is one it replaces: `traceparent`, recast's own.
    pub(crate) fn replaces(&self, name: &http::HeaderName) -> bool {
        name.as_str() == crate::trace_context::TRACEPARENT
    }
}

/// `scheme://host:port` of `uri`, the host in lower case and the port always written: what a
/// breaker is kept by.
pub(super) fn origin(uri: &http::Uri) -> String {
    let scheme = uri.scheme_str().unwrap_or("http");
    let host = uri.host().unwrap_or_default().to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or(if scheme == "https" { 443 } else { 80 });
    format!("{scheme}://{host}:{port}")
}
