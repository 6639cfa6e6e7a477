//! Traces (`docs/observability.md`): W3C Trace Context read from callers and written into every
//! upstream call, and, when a collector is configured, OpenTelemetry spans of each request, each
//! upstream attempt, each token fetch and each mapping, exported over OTLP/HTTP.
//!
//! The request being served on a thread has a [`Scope`] there while it is polled ([`within`],
//! like the request id of [`crate::logging`]): the upstream client reads it to make each
//! attempt's span a child of the call's, and to write that span's `traceparent`. Work that
//! outlives the call (a cache flight, a token fetch) takes the scope into its task.
//!
//! A span is written as the protobuf of an OTLP `Span` as it is recorded ([`Span`]: one buffer,
//! its attributes written as they are given, nothing kept as values) and pushed into a bounded
//! queue ([`export::Recorder`]); the exporter's task puts batches of them into requests away from
//! the request path. A full queue drops the span and counts it. Without an exporter nothing is
//! recorded: a call pays for its ids and its `traceparent` only.

pub mod export;
pub mod keys;
pub mod settings;
mod value;

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue};

pub use self::export::Recorder;
pub use self::keys::{Attribute, Key};
pub use self::settings::{Sampler, TraceSettings};
pub use self::value::{Kind, Value};
use crate::trace_context::{SAMPLED, TraceParent, trace_state};

/// The W3C `baggage` header, passed on to upstreams as the caller sent it.
pub const BAGGAGE: HeaderName = HeaderName::from_static("baggage");

/// Where the work being done stands in its trace: the span it belongs to, and what of the
/// caller's context is carried on.
#[derive(Debug, Clone)]
pub struct Scope {
    /// The trace, this scope's span (as `parent_id`: the parent of what is made under it) and the
    /// flags.
    pub span: TraceParent,
    /// Whether spans made under it are recorded: sampled, and an exporter to take them.
    pub recording: bool,
    /// What of the caller's context is passed on as it came, if anything.
    pub carried: Option<Arc<Carried>>,
}

/// What of a caller's trace context is passed on as it came. Shared, and apart from the scope,
/// which is moved in and out of a thread-local at every poll: most requests carry nothing.
#[derive(Debug, Default)]
pub struct Carried {
    /// The caller's `tracestate`, when its `traceparent` was taken.
    pub state: Option<HeaderValue>,
    /// The caller's `baggage`, passed on unchanged.
    pub baggage: Option<HeaderValue>,
}

impl Carried {
    /// Shared, when there is anything to carry.
    fn shared(state: Option<HeaderValue>, baggage: Option<HeaderValue>) -> Option<Arc<Carried>> {
        (state.is_some() || baggage.is_some()).then(|| Arc::new(Carried { state, baggage }))
    }
}

impl Scope {
    /// The caller's `tracestate`, when its `traceparent` was taken.
    pub fn state(&self) -> Option<&HeaderValue> {
        self.carried.as_deref().and_then(|carried| carried.state.as_ref())
    }

    /// The caller's `baggage`.
    pub fn baggage(&self) -> Option<&HeaderValue> {
        self.carried.as_deref().and_then(|carried| carried.baggage.as_ref())
    }

    /// The ids its log lines carry: its trace's and its span's.
    pub fn ids(&self) -> crate::logging::TraceIds {
        crate::logging::TraceIds { trace_id: self.span.trace_id, span_id: self.span.parent_id }
    }
}

thread_local! {
    /// The scope of the work being polled on this thread, if any.
    static CURRENT: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

/// Runs `future` in `scope`: while it is polled, [`current`] is that scope.
pub async fn within<T>(scope: Scope, future: impl Future<Output = T>) -> T {
    let mut future = pin!(future);
    let mut scope = Some(scope);
    std::future::poll_fn(|cx| {
        let current = Current { previous: CURRENT.replace(scope.take()), into: &mut scope };
        let poll = future.as_mut().poll(cx);
        drop(current);
        poll
    })
    .await
}

/// Runs `future` in `scope` when there is one, else as it is.
pub async fn maybe_within<T>(scope: Option<Scope>, future: impl Future<Output = T>) -> T {
    match scope {
        Some(scope) => within(scope, future).await,
        None => future.await,
    }
}

/// Puts back what the thread-local held before a poll, and moves the scope back out, also when
/// the poll panics.
struct Current<'a> {
    previous: Option<Scope>,
    into: &'a mut Option<Scope>,
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        *self.into = CURRENT.replace(self.previous.take());
    }
}

/// Calls `f` with the scope of the work being polled on this thread.
pub fn with_current<T>(f: impl FnOnce(Option<&Scope>) -> T) -> T {
    CURRENT.with_borrow(|scope| f(scope.as_ref()))
}

/// The scope of the work being polled on this thread, for work that goes on in another task.
pub fn current() -> Option<Scope> {
    with_current(|scope| scope.cloned())
}

/// Whether the work being polled on this thread records spans.
pub fn recording() -> bool {
    with_current(|scope| scope.is_some_and(|s| s.recording))
}

thread_local! {
    /// This thread's generator of ids (wyrand), seeded from the system's random source.
    static IDS: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    let mut bytes = [0u8; 8];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).is_err() {
        // No system randomness: the time and the thread still set threads and processes apart.
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let thread = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0u8);
        bytes = (nanos ^ thread).to_le_bytes();
    }
    u64::from_le_bytes(bytes)
}

fn next_u64() -> u64 {
    IDS.with(|state| {
        let s = state.get().wrapping_add(0xa076_1d64_78bd_642f);
        state.set(s);
        let t = u128::from(s) * u128::from(s ^ 0xe703_7ed1_a0b4_28db);
        (t >> 64) as u64 ^ t as u64
    })
}

/// A new span id: eight random bytes, never all zero.
pub fn span_id() -> [u8; 8] {
    loop {
        let id = next_u64();
        if id != 0 {
            return id.to_be_bytes();
        }
    }
}

/// A new trace id: sixteen random bytes, never all zero.
pub fn trace_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&next_u64().to_be_bytes());
    id[8..].copy_from_slice(&span_id());
    id
}

/// Nanoseconds since the Unix epoch, a span's clock.
pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The traces of one service: how it samples, and where recorded spans go.
pub struct Tracer {
    sampler: Sampler,
    recorder: Option<Arc<Recorder>>,
    /// `RECAST_PROPAGATE_BAGGAGE`: whether a caller's `baggage` is passed on to upstreams.
    baggage: bool,
}

impl Tracer {
    pub fn new(sampler: Sampler, recorder: Option<Arc<Recorder>>) -> Tracer {
        Tracer { sampler, recorder, baggage: false }
    }

    /// The tracer that passes a caller's `baggage` on to upstreams (`RECAST_PROPAGATE_BAGGAGE`).
    pub fn with_baggage(self, baggage: bool) -> Tracer {
        Tracer { baggage, ..self }
    }

    /// Where recorded spans go, when anywhere.
    pub fn recorder(&self) -> Option<&Arc<Recorder>> {
        self.recorder.as_ref()
    }

    /// A span under the one being polled on this thread, begun now, when that one is recorded.
    pub fn child(&self, kind: Kind, name: &'static str) -> Option<Span> {
        self.recorder.as_ref()?;
        with_current(|scope| {
            let scope = scope.filter(|scope| scope.recording)?;
            let context = scope.span.child(span_id());
            Some(Span::start(context, scope.state(), Some(scope.span.parent_id), kind, name))
        })
    }

    /// Ends a span [`Tracer::child`] began.
    pub fn end(&self, span: Span) {
        if let Some(recorder) = &self.recorder {
            span.end(recorder);
        }
    }

    /// Ends a span [`Tracer::child`] began, `took` after its start: the duration of the work
    /// it covers, measured already, so the clock is not read again.
    pub fn end_after(&self, span: Span, took: std::time::Duration) {
        if let Some(recorder) = &self.recorder {
            let end = span.start.saturating_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
            span.end_at(recorder, end);
        }
    }

    /// The scope of a request with `headers`: the caller's trace when its `traceparent` is well
    /// formed (its `tracestate` with it), else a new trace; a new span id; sampled as the sampler
    /// says; the caller's `baggage` carried whatever its trace, when the tracer passes it on.
    pub fn serve(&self, headers: &HeaderMap) -> (Scope, Option<[u8; 8]>) {
        let sent = Sent::of(headers);
        let parent = if sent.traceparent { TraceParent::from_headers(headers) } else { None };
        let trace_id = parent.map_or_else(trace_id, |p| p.trace_id);
        let sampled = self.sampler.sampled(parent.map(|p| p.sampled()), &trace_id);
        // Only the sampled flag is ours to set; flags this version does not know are not passed on.
        let flags = if sampled { SAMPLED } else { 0 };
        let scope = Scope {
            span: TraceParent { trace_id, parent_id: span_id(), flags },
            recording: sampled && self.recorder.is_some(),
            carried: Carried::shared(
                parent.filter(|_| sent.tracestate).and_then(|_| trace_state(headers)),
                if sent.baggage && self.baggage { baggage(headers) } else { None },
            ),
        };
        (scope, parent.map(|p| p.parent_id))
    }
}

/// Which of the trace context's headers a request has, found in one pass over its headers: a
/// request has few, and most have none of these, so this costs less than looking each name up
/// (a hash of it); those it has are then read by name.
#[derive(Debug, Default, Clone, Copy)]
struct Sent {
    traceparent: bool,
    tracestate: bool,
    baggage: bool,
}

impl Sent {
    fn of(headers: &HeaderMap) -> Sent {
        let mut sent = Sent::default();
        for name in headers.keys() {
            if *name == crate::trace_context::TRACEPARENT_NAME {
                sent.traceparent = true;
            } else if *name == crate::trace_context::TRACESTATE_NAME {
                sent.tracestate = true;
            } else if *name == BAGGAGE {
                sent.baggage = true;
            }
        }
        sent
    }
}

/// The longest `baggage` passed on, in bytes: W3C Baggage's limit.
pub const MAX_BAGGAGE: usize = 8192;

/// The caller's `baggage`, its lines joined with commas, as the W3C Baggage header is combined;
/// `None` when there is none or it is longer than [`MAX_BAGGAGE`] bytes.
fn baggage(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut lines = headers.get_all(BAGGAGE).iter();
    let first = lines.next()?;
    let Some(second) = lines.next() else {
        return (first.len() <= MAX_BAGGAGE).then(|| first.clone());
    };
    let mut joined = Vec::with_capacity(first.len() + second.len() + 1);
    for line in [first, second].into_iter().chain(lines) {
        if !joined.is_empty() {
            joined.push(b',');
        }
        joined.extend_from_slice(line.as_bytes());
        if joined.len() > MAX_BAGGAGE {
            return None;
        }
    }
    HeaderValue::from_bytes(&joined).ok()
}

/// The longest `url.path` or `url.full` recorded, in bytes.
pub const MAX_URL: usize = 2048;

/// `text` cut to at most `max` bytes, at a character's boundary.
pub fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A span being recorded: started now in a trace, and written as the protobuf of an OTLP `Span`
/// as it goes (its ids, name and start at once, each attribute, its status and links as they are
/// given, its end last), so that nothing of it is kept as values and it moves as one pointer to
/// one buffer; at its end the buffer is handed to a recorder.
#[derive(Debug)]
pub struct Span {
    written: Vec<u8>,
    start: u64,
}

/// Room for a span's fields: a request's span with its attributes takes about 500 bytes.
const SPAN_ROOM: usize = 640;

/// Buffers of ended spans kept on a thread, and the largest kept: a span's buffer is copied into
/// the recorder's queue, and begins the next span there instead of an allocation.
const MAX_SPARES: usize = 4;
const MAX_SPARE_ROOM: usize = 8 * SPAN_ROOM;

thread_local! {
    static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

impl Span {
    /// A span of `kind` named `name` whose own context is `context`, under `parent`, in a
    /// trace whose `tracestate` is `state`.
    pub fn start(
        context: TraceParent,
        state: Option<&HeaderValue>,
        parent: Option<[u8; 8]>,
        kind: Kind,
        name: &str,
    ) -> Span {
        let start = now();
        let spare = SPARE.try_with(|spare| spare.borrow_mut().pop()).ok().flatten();
        let mut written = spare.unwrap_or_else(|| Vec::with_capacity(SPAN_ROOM));
        export::span_head(&mut written, export::Head { context, parent, state, kind, name, start });
        Span { written, start }
    }

    /// Adds the attribute `key` with `value`.
    #[inline]
    pub fn set<'a>(&mut self, key: &Key, value: impl Into<Value<'a>>) {
        export::attribute(&mut self.written, key, value.into());
    }

    /// Adds an attribute written whole.
    #[inline]
    pub fn put(&mut self, attribute: &Attribute) {
        self.written.extend_from_slice(attribute.bytes());
    }

    /// Status Error, described. Once per span.
    pub fn fail(&mut self, why: &str) {
        export::status_error(&mut self.written, why);
    }

    pub fn link(&mut self, to: TraceParent) {
        export::link(&mut self.written, &to);
    }

    /// Ends the span now and hands it to `recorder`; its buffer is kept for the next span begun
    /// on this thread.
    pub fn end(self, recorder: &Recorder) {
        self.end_at(recorder, now());
    }

    /// Ends the span at `end` (nanoseconds since the Unix epoch) and hands it to `recorder`.
    pub fn end_at(self, recorder: &Recorder, end: u64) {
        let mut written = self.finish(end);
        recorder.record(&written);
        if written.capacity() <= MAX_SPARE_ROOM {
            written.clear();
            // Not kept on a thread that is ending.
            let _ = SPARE.try_with(|spare| {
                let mut spare = spare.borrow_mut();
                if spare.len() < MAX_SPARES {
                    spare.push(written);
                }
            });
        }
    }

    /// The span's protobuf, ended at `end` (its start, if that is earlier).
    pub fn finish(self, end: u64) -> Vec<u8> {
        let Span { mut written, start } = self;
        export::span_end(&mut written, end.max(start));
        written
    }
}

/// Whether a query parameter's name says it holds a secret (any case, anywhere in the name):
/// `url.full` shows such a parameter's value as `REDACTED`.
pub fn secret_name(name: &str) -> bool {
    const WORDS: [&str; 14] = [
        "key",
        "token",
        "secret",
        "password",
        "passwd",
        "pwd",
        "auth",
        "signature",
        "sig",
        "credential",
        "session",
        "code",
        "jwt",
        "appid",
    ];
    let name = name.as_bytes();
    WORDS
        .iter()
        .any(|word| name.windows(word.len()).any(|window| window.eq_ignore_ascii_case(word.as_bytes())))
}

/// Calls `with` with `uri` as a `url.full` ([`url_full`]): in pieces borrowed from `uri` when
/// nothing in it is redacted or cut (a call's usual upstream URL), so that nothing is put
/// together first.
pub fn with_url_full<T>(uri: &http::Uri, with: impl FnOnce(Value<'_>) -> T) -> T {
    let scheme = uri.scheme_str().unwrap_or("http");
    let authority = uri.authority().map_or("", |a| a.as_str());
    let path = uri.path();
    let query = uri.query();
    let plain = !authority.contains('@')
        && scheme.len() + 3 + authority.len() + path.len() + query.map_or(0, |q| q.len() + 1) <= MAX_URL
        && !query.is_some_and(|query| {
            query.split('&').any(|pair| {
                pair.split_once('=').is_some_and(|(name, _)| {
                    secret_name(&percent_encoding::percent_decode_str(name).decode_utf8_lossy())
                })
            })
        });
    match (plain, query) {
        (true, Some(query)) => with(Value::Parts(&[scheme, "://", authority, path, "?", query])),
        (true, None) => with(Value::Parts(&[scheme, "://", authority, path])),
        (false, _) => with(Value::Str(&url_full(uri))),
    }
}

/// `uri` as a `url.full`: without user information, the values of query parameters whose names
/// look like secrets replaced by `REDACTED`, as OpenTelemetry's conventions ask.
pub fn url_full(uri: &http::Uri) -> String {
    let scheme = uri.scheme_str().unwrap_or("http");
    let authority = uri.authority().map_or("", |a| a.as_str());
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let path = cut(uri.path(), MAX_URL);
    let query = uri.query().map_or(0, |q| q.len() + 1);
    let mut out = String::with_capacity(scheme.len() + 3 + authority.len() + path.len() + query.min(MAX_URL));
    for part in [scheme, "://", authority, path] {
        out.push_str(part);
    }
    if let Some(query) = uri.query() {
        out.push('?');
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((name, _)) => {
                    let decoded = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
                    if secret_name(&decoded) {
                        out.push_str(name);
                        out.push_str("=REDACTED");
                    } else {
                        out.push_str(pair);
                    }
                }
                None => out.push_str(pair),
            }
            if out.len() > MAX_URL {
                break;
            }
        }
    }
    let kept = cut(&out, MAX_URL).len();
    out.truncate(kept);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_random_and_never_zero() {
        let ids: std::collections::HashSet<[u8; 8]> = (0..10_000).map(|_| span_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(!ids.contains(&[0; 8]));
        assert_ne!(trace_id(), trace_id());
    }

    #[test]
    fn a_request_joins_its_callers_trace_or_starts_one() {
        let tracer = Tracer::new(Sampler { parent_based: true, ratio: 1.0 }, None).with_baggage(true);
        let mut headers = HeaderMap::new();
        headers.insert(
            "traceparent",
            HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"),
        );
        headers.insert("tracestate", HeaderValue::from_static("congo=t61rcWkgMzE"));
        headers.insert("baggage", HeaderValue::from_static("userId=alice"));
        let (scope, parent) = tracer.serve(&headers);
        assert_eq!(crate::hex::encode(&scope.span.trace_id), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(parent.map(|p| crate::hex::encode(&p)).as_deref(), Some("b7ad6b7169203331"));
        assert_eq!(scope.span.flags, 0, "the caller did not sample: nor does a parent-based sampler");
        assert!(!scope.recording, "no recorder");
        assert_eq!(scope.state().unwrap(), "congo=t61rcWkgMzE");
        assert_eq!(scope.baggage().unwrap(), "userId=alice");
        // A malformed traceparent starts a new trace, and its tracestate goes with it.
        headers.insert(
            "traceparent",
            HeaderValue::from_static("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"),
        );
        let (fresh, parent) = tracer.serve(&headers);
        assert!(parent.is_none());
        assert_ne!(fresh.span.trace_id, scope.span.trace_id);
        assert_eq!(fresh.span.flags, SAMPLED);
        assert!(fresh.state().is_none());
        assert_eq!(fresh.baggage().unwrap(), "userId=alice", "baggage is passed on whatever the trace");
        // Unless the tracer does not pass baggage on (the default).
        let (scope, _) = Tracer::new(Sampler { parent_based: true, ratio: 1.0 }, None).serve(&headers);
        assert!(scope.baggage().is_none());
    }

    #[test]
    fn the_scope_is_there_while_polled_and_only_then() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let tracer = Tracer::new(Sampler { parent_based: true, ratio: 1.0 }, None);
        let (scope, _) = tracer.serve(&HeaderMap::new());
        let id = scope.span.parent_id;
        let seen = runtime.block_on(within(scope, async {
            tokio::task::yield_now().await;
            current().map(|s| s.span.parent_id)
        }));
        assert_eq!(seen, Some(id));
        assert!(current().is_none());
        // Nested (a flight's task polled inside a call's poll): the inner scope, then the outer.
        let (outer, _) = tracer.serve(&HeaderMap::new());
        let (inner, _) = tracer.serve(&HeaderMap::new());
        let (outer_id, inner_id) = (outer.span.parent_id, inner.span.parent_id);
        let seen = runtime.block_on(within(outer, async {
            let before = current().map(|s| s.span.parent_id);
            let nested = within(inner, async {
                tokio::task::yield_now().await;
                current().map(|s| s.span.parent_id)
            })
            .await;
            (before, nested, current().map(|s| s.span.parent_id))
        }));
        assert_eq!(seen, (Some(outer_id), Some(inner_id), Some(outer_id)));
        // A poll that panics leaves nothing behind.
        let (doomed, _) = tracer.serve(&HeaderMap::new());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(within(doomed, async { panic!("in the handler") }))
        }));
        assert!(panicked.is_err());
        assert!(current().is_none());
    }

    #[test]
    fn url_full_redacts_secret_query_values() {
        let uri: http::Uri =
            "https://u:p@api.example:8443/v1/x?q=soup&api_key=abc&Access%5FToken=t&sig=1&page=2&flag"
                .parse()
                .unwrap();
        assert_eq!(
            url_full(&uri),
            "https://api.example:8443/v1/x?q=soup&api_key=REDACTED&Access%5FToken=REDACTED&sig=REDACTED&page=2&flag"
        );
        assert_eq!(url_full(&"http://h/p".parse().unwrap()), "http://h/p");
        // In pieces when nothing is taken out, whole when something is; the same text.
        for uri in [
            "https://u:p@api.example:8443/v1/x?q=soup&api_key=abc&page=2&flag",
            "http://api.example/v1/x?q=soup&page=2&flag",
            "http://api.example:81",
            "http://api.example/a?tok%65n=1",
        ] {
            let uri: http::Uri = uri.parse().unwrap();
            let written = with_url_full(&uri, |value| match value {
                Value::Parts(parts) => ("parts", parts.concat()),
                Value::Str(text) => ("whole", text.to_owned()),
                other => panic!("{other:?}"),
            });
            let plain = !uri.to_string().contains('@')
                && !uri.to_string().contains("key")
                && !uri.to_string().contains("%65");
            assert_eq!(written, (if plain { "parts" } else { "whole" }, url_full(&uri)), "{uri}");
        }
        let long: http::Uri =
            format!("http://h/{}?a={}", "é".repeat(2000), "b".repeat(5000)).parse().unwrap();
        let full = url_full(&long);
        assert!(full.len() <= MAX_URL && full.starts_with("http://h/"), "{}", full.len());
    }

    #[test]
    fn baggage_is_passed_on_whole_joined_or_not_at_all() {
        let mut headers = HeaderMap::new();
        assert!(baggage(&headers).is_none());
        headers.append("baggage", HeaderValue::from_static("a=1"));
        assert_eq!(baggage(&headers).unwrap(), "a=1");
        headers.append("baggage", HeaderValue::from_static("b=2;p"));
        assert_eq!(baggage(&headers).unwrap(), "a=1,b=2;p");
        headers.append("baggage", HeaderValue::from_str(&"c".repeat(MAX_BAGGAGE)).unwrap());
        assert!(baggage(&headers).is_none(), "over 8192 bytes together");
        let mut one = HeaderMap::new();
        one.insert("baggage", HeaderValue::from_str(&"c".repeat(MAX_BAGGAGE + 1)).unwrap());
        assert!(baggage(&one).is_none());
        assert_eq!(cut("aé", 2), "a");
    }
}
