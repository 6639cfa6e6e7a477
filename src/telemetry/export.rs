//! Recorded spans on their way out: the bounded queue every span goes into ([`Recorder`]), and the
//! task that takes them out in batches and sends each batch to the collector as one OTLP/HTTP
//! `ExportTraceServiceRequest` in protobuf ([`Exporter`]).
//!
//! Nothing here is on a call's path but [`Recorder::record`], a push under a lock that is never
//! held across anything else. A full queue drops the span; a collector that is down, slow or
//! failing loses its batch, never a call's time; both are counted for `/metrics`. One export is
//! under way at a time, within `OTEL_EXPORTER_OTLP_TIMEOUT`; on shutdown, what is queued is
//! exported within the grace period.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use prost::encoding::{WireType, encoded_len_varint};
use tokio::sync::{Notify, watch};

use super::keys::{KEY_ROOM, Key};
use super::settings::ExportSettings;
use super::value::{Kind, Value};
use crate::metrics::SpanCounts;
use crate::trace_context::TraceParent;

/// Where recorded spans wait for the exporter, and what became of them.
pub struct Recorder {
    queue: Mutex<Queue>,
    max_queue: usize,
    max_batch: usize,
    /// The bytes kept free at the start of each batch for the request's head ([`Writer::head_room`]).
    head_room: usize,
    /// Told when the queue holds a batch.
    ready: Notify,
    pub counts: SpanCounts,
}

/// The queued spans: batches of at most `max_batch`, oldest first, each its spans already
/// framed as the `ScopeSpans.spans` of a request, so that a span is copied once on its way out.
struct Queue {
    batches: VecDeque<Batch>,
    /// Spans in all batches.
    spans: usize,
    /// The capacity a new batch starts with: the longest a batch has been, so that a batch
    /// grows by copying only until the first few were exported.
    room: usize,
}

/// Spans framed for a request, after room for its head.
pub struct Batch {
    written: Vec<u8>,
    spans: usize,
}

impl Batch {
    fn len(&self) -> usize {
        self.spans
    }
}

impl Recorder {
    /// A recorder holding at most `max_queue` spans, in batches of `max_batch`, each with
    /// `head_room` bytes free for its request's head.
    pub fn new(max_queue: usize, max_batch: usize, head_room: usize) -> Recorder {
        let max_batch = max_batch.clamp(1, max_queue.max(1));
        Recorder {
            queue: Mutex::new(Queue {
                batches: VecDeque::new(),
                spans: 0,
                // A first guess, about 500 bytes a span; then what batches took.
                room: head_room + max_batch.min(1024) * 512,
            }),
            max_queue,
            max_batch,
            head_room,
            ready: Notify::new(),
            counts: SpanCounts::default(),
        }
    }

    /// Queues a finished span (the protobuf of an OTLP `Span`), or drops it (counted) when the
    /// queue is full.
    pub fn record(&self, span: &[u8]) {
        let mut guard = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let queue = &mut *guard;
        if queue.spans >= self.max_queue {
            drop(guard);
            self.counts.dropped_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if queue.batches.back().is_none_or(|batch| batch.spans == self.max_batch) {
            let mut written = Vec::with_capacity(queue.room);
            written.resize(self.head_room, 0);
            queue.batches.push_back(Batch { written, spans: 0 });
        }
        let mut full = false;
        if let Some(batch) = queue.batches.back_mut() {
            message(&mut batch.written, 2, span);
            batch.spans += 1;
            queue.spans += 1;
            full = batch.spans == self.max_batch;
        }
        drop(guard);
        if full {
            self.ready.notify_one();
        }
    }

    /// The oldest batch, if any span is queued.
    fn take(&self) -> Option<Batch> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let batch = queue.batches.pop_front()?;
        queue.spans -= batch.spans;
        queue.room = queue.room.max(batch.written.len());
        Some(batch)
    }

    /// How many spans wait.
    pub fn queued(&self) -> usize {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner).spans
    }

    /// Drops every queued span; returns how many.
    fn clear(&self) -> usize {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        queue.batches.clear();
        std::mem::take(&mut queue.spans)
    }
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The task that sends queued spans to the collector.
pub struct Exporter {
    recorder: Arc<Recorder>,
    settings: ExportSettings,
    client: HttpsClient,
    writer: Writer,
}

/// Asks a running exporter to export what is queued and stop.
pub struct Flush {
    stop: watch::Sender<bool>,
    recorder: Arc<Recorder>,
}

impl Flush {
    /// Says stop: the exporter exports what is queued and ends; the caller awaits its task.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Drops what is still queued once the exporter was given up on, counted as lost with an
    /// export; returns how many.
    pub fn abandon(&self) -> u64 {
        let lost = self.recorder.clear() as u64;
        self.recorder.counts.dropped_failed.fetch_add(lost, Ordering::Relaxed);
        lost
    }
}

impl Exporter {
    /// An exporter by `settings`, speaking TLS (to an `https` collector) by `tls`, and its
    /// recorder.
    pub fn new(settings: ExportSettings, tls: rustls::ClientConfig) -> (Exporter, Arc<Recorder>) {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(settings.timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(1)
            .build(connector);
        let writer = Writer::new(&settings.resource);
        let recorder = Arc::new(Recorder::new(settings.max_queue, settings.max_batch, writer.head_room()));
        (Exporter { recorder: recorder.clone(), settings, client, writer }, recorder)
    }

    /// The exporter's task: a batch whenever one is queued or the schedule delay has passed,
    /// until [`Flush::stop`]; then what is left, and it returns.
    pub fn run(self) -> (Flush, impl Future<Output = ()> + Send + 'static) {
        let (stop, mut stopped) = watch::channel(false);
        let self_recorder = self.recorder.clone();
        let task = async move {
            loop {
                let stopping = tokio::select! {
                    () = tokio::time::sleep(self.settings.schedule_delay) => false,
                    () = self.recorder.ready.notified() => false,
                    _ = stopped.changed() => true,
                };
                while let Some(batch) = self.recorder.take() {
                    self.export(batch).await;
                    // More than a batch left: at once; less: at the next turn.
                    if !stopping && self.recorder.queued() < self.recorder.max_batch {
                        break;
                    }
                }
                // A stop that came during an export is seen at the next turn, at once, and what
                // was queued meanwhile is exported then.
                if stopping {
                    return;
                }
            }
        };
        (Flush { stop, recorder: self_recorder }, task)
    }

    /// Sends one batch; counts what became of it.
    async fn export(&self, batch: Batch) {
        let n = batch.len() as u64;
        let body = self.writer.request(batch);
        let outcome = tokio::time::timeout(self.settings.timeout, self.send(body)).await;
        let counts = &self.recorder.counts;
        let failure = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(why)) => Some(why),
            Err(_) => Some(format!("no answer within {} ms", self.settings.timeout.as_millis())),
        };
        match failure {
            None => {
                counts.exports_ok.fetch_add(1, Ordering::Relaxed);
                counts.exported.fetch_add(n, Ordering::Relaxed);
            }
            Some(why) => {
                counts.exports_failed.fetch_add(1, Ordering::Relaxed);
                counts.dropped_failed.fetch_add(n, Ordering::Relaxed);
                // Once per failed export at most: a collector that is down for long writes a
                // line per schedule delay, not per span.
                tracing::warn!(collector = %self.settings.endpoint, spans = n, error = %why, "spans were not exported");
            }
        }
    }

    async fn send(&self, body: Bytes) -> Result<(), String> {
        let mut request = Request::post(self.settings.endpoint.clone())
            .header(header::CONTENT_TYPE, HeaderValue::from_static("application/x-protobuf"))
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        for (name, value) in &self.settings.headers {
            request.headers_mut().insert(name.clone(), value.clone());
        }
        let response = self.client.request(request).await.map_err(|e| crate::logging::error_chain(&e))?;
        let status = response.status();
        // Read (at most 64 KiB) so the connection can carry the next export.
        let body = http_body_util::Limited::new(response.into_body(), 64 << 10);
        let _ = body.collect().await;
        if status.is_success() { Ok(()) } else { Err(format!("the collector answered {status}")) }
    }
}

/// The version of OpenTelemetry's semantic conventions the attributes follow.
pub const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.26.0";

/// OTLP's span flags: the context's "is remote" is known (bit 8), and the parent is remote
/// (bit 9).
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;

/// The longest `tracestate` recorded in a span, in bytes (W3C Trace Context's own
/// recommendation for what a vendor should propagate at least).
const MAX_STATE_RECORDED: usize = 512;

/// `STATUS_CODE_ERROR`.
const STATUS_ERROR: u64 = 2;

/// Writes a batch as the protobuf of one `ExportTraceServiceRequest` around its spans, each
/// written field by field as it was recorded (`super::Span`) and framed as it was queued
/// ([`Recorder::record`]), with no message tree in between: building `opentelemetry-proto`'s
/// messages, every id, name and value its own allocation, and dropping them would cost several
/// times the writing. The tests decode what it writes with those messages. The resource and the
/// scope, the same in every batch, are written once; a batch's head goes into the room left at
/// its start, so its spans are not copied again.
pub struct Writer {
    /// `ResourceSpans.resource`, written.
    resource: Vec<u8>,
    /// `ScopeSpans.scope` and `ScopeSpans.schema_url`, written.
    scope: Vec<u8>,
}

impl Writer {
    pub fn new(resource: &[(String, String)]) -> Writer {
        let mut attributes = Vec::new();
        for (key, value) in resource {
            text_key_value(&mut attributes, 1, key, value);
        }
        let mut written = Vec::new();
        message(&mut written, 1, &attributes);
        let mut scope = Vec::new();
        let mut named = Vec::new();
        string(&mut named, 1, "recast");
        string(&mut named, 2, env!("CARGO_PKG_VERSION"));
        message(&mut scope, 1, &named);
        string(&mut scope, 3, SCHEMA_URL);
        Writer { resource: written, scope }
    }

    /// The bytes a batch keeps free for the head of its request: the resource, the scope and
    /// two fields' tags and lengths (a length takes at most five bytes below 32 GiB).
    pub fn head_room(&self) -> usize {
        2 * (1 + 5) + self.resource.len() + self.scope.len()
    }

    /// The request of a batch (made by a recorder with [`Writer::head_room`]).
    pub fn request(&self, batch: Batch) -> Bytes {
        let room = self.head_room();
        let Batch { mut written, .. } = batch;
        debug_assert!(written.len() >= room);
        let scope_spans = self.scope.len() + (written.len() - room);
        let resource_spans = self.resource.len() + 1 + encoded_len_varint(scope_spans as u64) + scope_spans;
        let mut head = Vec::with_capacity(room);
        field_key(1, WireType::LengthDelimited, &mut head);
        put_varint(resource_spans as u64, &mut head);
        head.extend_from_slice(&self.resource);
        field_key(2, WireType::LengthDelimited, &mut head);
        put_varint(scope_spans as u64, &mut head);
        head.extend_from_slice(&self.scope);
        let start = room - head.len();
        written[start..room].copy_from_slice(&head);
        Bytes::from(written).slice(start..)
    }

    /// A request of `spans`, each the protobuf of a `Span`, queued through a recorder of its own.
    #[cfg(test)]
    pub fn request_of(&self, spans: &[Vec<u8>]) -> Bytes {
        let recorder = Recorder::new(spans.len().max(1), spans.len().max(1), self.head_room());
        spans.iter().for_each(|span| recorder.record(span));
        let batch = recorder.take().unwrap_or(Batch { written: vec![0; self.head_room()], spans: 0 });
        self.request(batch)
    }
}

/// What a span is from its start.
pub struct Head<'a> {
    pub context: TraceParent,
    pub parent: Option<[u8; 8]>,
    pub state: Option<&'a HeaderValue>,
    pub kind: Kind,
    pub name: &'a str,
    pub start: u64,
}

/// Writes the fields a span has from its start (protobuf asks for no order: its attributes,
/// status, links and end follow).
pub fn span_head(out: &mut Vec<u8>, span: Head<'_>) {
    let remote_parent = span.kind == Kind::Server && span.parent.is_some();
    // The fields of fixed size are put together first and copied in one go.
    let mut ids = [0u8; 2 + 16 + 2 + 8];
    ids[..2].copy_from_slice(&[1 << 3 | 2, 16]);
    ids[2..18].copy_from_slice(&span.context.trace_id);
    ids[18..20].copy_from_slice(&[2 << 3 | 2, 8]);
    ids[20..].copy_from_slice(&span.context.parent_id);
    out.extend_from_slice(&ids);
    // A long `tracestate` is passed on whole but not copied into every span of the trace.
    if let Some(state) = span.state.filter(|state| state.len() <= MAX_STATE_RECORDED) {
        bytes(out, 3, state.as_bytes());
    }
    if let Some(parent) = &span.parent {
        let mut field = [4 << 3 | 2, 8, 0, 0, 0, 0, 0, 0, 0, 0];
        field[2..].copy_from_slice(parent);
        out.extend_from_slice(&field);
    }
    string(out, 5, span.name);
    let flags = u32::from(span.context.flags & crate::trace_context::SAMPLED)
        | HAS_IS_REMOTE
        | if remote_parent { IS_REMOTE } else { 0 };
    // kind (6), start (7), flags (16: a key of two bytes).
    let mut rest = [0u8; 2 + 9 + 6];
    rest[..2].copy_from_slice(&[6 << 3, span.kind as u8]);
    rest[2] = 7 << 3 | 1;
    rest[3..11].copy_from_slice(&span.start.to_le_bytes());
    rest[11..13].copy_from_slice(&[16 << 3 | 5 | 0x80, 1]);
    rest[13..].copy_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&rest);
}

/// A span's link to another (field 13).
pub fn link(out: &mut Vec<u8>, to: &TraceParent) {
    let flags = u32::from(to.flags & crate::trace_context::SAMPLED) | HAS_IS_REMOTE;
    let len = 2 * 2 + to.trace_id.len() + to.parent_id.len() + 1 + 4;
    field_key(13, WireType::LengthDelimited, out);
    put_varint(len as u64, out);
    bytes(out, 1, &to.trace_id);
    bytes(out, 2, &to.parent_id);
    fixed32(out, 6, flags);
}

/// A span's status, Error with its description (field 15).
pub fn status_error(out: &mut Vec<u8>, why: &str) {
    let len = string_len(2, why) + 1 + encoded_len_varint(STATUS_ERROR);
    field_key(15, WireType::LengthDelimited, out);
    put_varint(len as u64, out);
    string(out, 2, why);
    varint(out, 3, STATUS_ERROR);
}

/// A span's end (field 8), its last field.
pub fn span_end(out: &mut Vec<u8>, end: u64) {
    fixed64(out, 8, end);
}

/// A span's attribute (field 9) of `key` and `value`, its key's bytes copied as written at
/// compile time. Inlined into each caller, whose key is a constant: this runs a dozen times per
/// call.
#[inline(always)]
pub(super) fn attribute(out: &mut Vec<u8>, key: &Key, value: Value<'_>) {
    // KeyValue { key (1), value (2): AnyValue { string_value (1) | bool_value (2) | int_value (3) } }
    let (any, member, number) = match value {
        Value::Str(text) => {
            (1 + encoded_len_varint(text.len() as u64) + text.len(), 1 << 3 | 2, text.len() as u64)
        }
        Value::Parts(parts) => {
            let n = parts.iter().map(|part| part.len()).sum::<usize>();
            (1 + encoded_len_varint(n as u64) + n, 1 << 3 | 2, n as u64)
        }
        Value::Int(n) => (1 + encoded_len_varint(n as u64), 3 << 3, n as u64),
        Value::Bool(b) => (2, 2 << 3, u64::from(b)),
    };
    let len = key.len + 2 + any;
    if len < 0x80 {
        // The usual: every length one byte. The key is copied as its whole fixed-size block
        // (no call to copy a length known only now), then the bytes past it are taken back.
        out.reserve(2 + KEY_ROOM + 3 + 10);
        out.extend_from_slice(&[9 << 3 | 2, len as u8]);
        let at = out.len();
        out.extend_from_slice(&key.written);
        out.truncate(at + key.len);
        out.extend_from_slice(&[2 << 3 | 2, any as u8, member]);
        put_varint(number, out);
    } else {
        let len = key.len + 1 + encoded_len_varint(any as u64) + any;
        field_key(9, WireType::LengthDelimited, out);
        put_varint(len as u64, out);
        out.extend_from_slice(key.bytes());
        field_key(2, WireType::LengthDelimited, out);
        put_varint(any as u64, out);
        out.push(member);
        put_varint(number, out);
    }
    match value {
        Value::Str(text) => out.extend_from_slice(text.as_bytes()),
        Value::Parts(parts) => parts.iter().for_each(|part| out.extend_from_slice(part.as_bytes())),
        Value::Int(_) | Value::Bool(_) => {}
    }
}

/// A `KeyValue` of any key and a text as field `tag`: the resource's attributes.
fn text_key_value(out: &mut Vec<u8>, tag: u32, key: &str, value: &str) {
    let any = string_len(1, value);
    let len = string_len(1, key) + 1 + encoded_len_varint(any as u64) + any;
    field_key(tag, WireType::LengthDelimited, out);
    put_varint(len as u64, out);
    string(out, 1, key);
    field_key(2, WireType::LengthDelimited, out);
    put_varint(any as u64, out);
    string(out, 1, value);
}

/// A field's key: its tag and wire type, as a varint.
#[inline]
fn field_key(tag: u32, wire: WireType, out: &mut Vec<u8>) {
    put_varint(u64::from(tag << 3 | wire as u32), out);
}

/// `value` as a varint: one byte below 128, a byte per seven bits above.
#[inline]
fn put_varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// What [`string`] writes, in bytes.
#[inline]
fn string_len(tag: u32, text: &str) -> usize {
    prost::encoding::key_len(tag) + encoded_len_varint(text.len() as u64) + text.len()
}

#[inline]
fn string(out: &mut Vec<u8>, tag: u32, text: &str) {
    bytes(out, tag, text.as_bytes());
}

#[inline]
fn bytes(out: &mut Vec<u8>, tag: u32, value: &[u8]) {
    field_key(tag, WireType::LengthDelimited, out);
    put_varint(value.len() as u64, out);
    out.extend_from_slice(value);
}

#[inline]
fn message(out: &mut Vec<u8>, tag: u32, body: &[u8]) {
    bytes(out, tag, body);
}

#[inline]
fn varint(out: &mut Vec<u8>, tag: u32, value: u64) {
    field_key(tag, WireType::Varint, out);
    put_varint(value, out);
}

#[inline]
fn fixed64(out: &mut Vec<u8>, tag: u32, value: u64) {
    field_key(tag, WireType::SixtyFourBit, out);
    out.extend_from_slice(&value.to_le_bytes());
}

#[inline]
fn fixed32(out: &mut Vec<u8>, tag: u32, value: u32) {
    field_key(tag, WireType::ThirtyTwoBit, out);
    out.extend_from_slice(&value.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::trace::v1 as proto;
    use prost::Message as _;

    use super::*;
    use crate::telemetry::{Span, keys, now};

    fn span(n: u8) -> Vec<u8> {
        let context = TraceParent { trace_id: [n; 16], parent_id: [n; 8], flags: 1 };
        let mut span = Span::start(context, None, None, Kind::Internal, "map");
        span.set(&keys::DOCUMENT_SIZE, 10);
        span.finish(u64::MAX)
    }

    /// The trace ids' first bytes of the spans of a batch, as the collector decodes it.
    fn ids(batch: Option<Batch>) -> Vec<u8> {
        let Some(batch) = batch else { return Vec::new() };
        let request = Writer::new(&[]).request(batch);
        let decoded = ExportTraceServiceRequest::decode(&request[..]).unwrap();
        decoded.resource_spans[0].scope_spans[0].spans.iter().map(|s| s.trace_id[0]).collect()
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_batches_come_out_oldest_first() {
        let recorder = Recorder::new(3, 2, Writer::new(&[]).head_room());
        for n in 1..=5 {
            recorder.record(&span(n));
        }
        assert_eq!(recorder.counts.dropped_full.load(Ordering::Relaxed), 2);
        assert_eq!(recorder.queued(), 3);
        assert_eq!(ids(recorder.take()), [1, 2]);
        assert_eq!(recorder.queued(), 1);
        recorder.record(&span(6));
        recorder.record(&span(7));
        assert_eq!(recorder.counts.dropped_full.load(Ordering::Relaxed), 2, "room again");
        assert_eq!(ids(recorder.take()), [3, 6]);
        assert_eq!(ids(recorder.take()), [7]);
        assert!(recorder.take().is_none());
    }

    fn kv(key: &str, value: any_value::Value) -> KeyValue {
        KeyValue { key: key.to_owned(), value: Some(AnyValue { value: Some(value) }), ..Default::default() }
    }

    fn text(value: &str) -> any_value::Value {
        any_value::Value::StringValue(value.to_owned())
    }

    #[test]
    fn spans_are_written_as_the_otlp_messages_say() {
        let resource =
            [("service.name".to_owned(), "recast".to_owned()), ("team".to_owned(), "é,b".to_owned())];
        let context = TraceParent { trace_id: [7; 16], parent_id: [8; 8], flags: 1 };
        let state = HeaderValue::from_static("congo=t61rcWkgMzE");
        let mut server =
            Span::start(context, Some(&state), Some([9; 8]), Kind::Server, "GET /v1/{uuid}/{path}");
        let long = "x".repeat(300);
        server.set(&keys::URL_PATH, "/v1/ü");
        server.set(&keys::ABANDONED, true);
        server.set(&Key::new("negative"), -5);
        server.set(&Key::new("empty"), "");
        server.set(&Key::new("long"), &long);
        server.set(&Key::new("parts"), Value::Parts(&["a", "", "bc"]));
        server.set(&Key::new("large"), i64::MAX);
        server.put(&keys::SCHEME_HTTP);
        server.fail("upstream-timeout");
        server.link(TraceParent { trace_id: [3; 16], parent_id: [4; 8], flags: 1 });
        let started = now();
        let server = server.finish(started + 5);
        let client =
            Span::start(TraceParent { flags: 0, ..context }, None, Some([8; 8]), Kind::Client, "GET");
        let request = Writer::new(&resource).request_of(&[server, client.finish(0)]);
        let decoded = ExportTraceServiceRequest::decode(&request[..]).expect("the writer's bytes decode");
        let resource_spans = &decoded.resource_spans[0];
        let attributes = &resource_spans.resource.as_ref().unwrap().attributes;
        assert_eq!(attributes, &[kv("service.name", text("recast")), kv("team", text("é,b"))]);
        let scope = &resource_spans.scope_spans[0];
        assert_eq!(scope.scope.as_ref().unwrap().name, "recast");
        assert_eq!(scope.scope.as_ref().unwrap().version, env!("CARGO_PKG_VERSION"));
        assert_eq!(scope.schema_url, SCHEMA_URL);
        let expected = proto::Span {
            trace_id: vec![7; 16],
            span_id: vec![8; 8],
            trace_state: "congo=t61rcWkgMzE".to_owned(),
            parent_span_id: vec![9; 8],
            flags: 1 | HAS_IS_REMOTE | IS_REMOTE,
            name: "GET /v1/{uuid}/{path}".to_owned(),
            kind: Kind::Server as i32,
            start_time_unix_nano: scope.spans[0].start_time_unix_nano,
            end_time_unix_nano: started + 5,
            attributes: vec![
                kv("url.path", text("/v1/ü")),
                kv("recast.abandoned", any_value::Value::BoolValue(true)),
                kv("negative", any_value::Value::IntValue(-5)),
                kv("empty", text("")),
                kv("long", text(&long)),
                kv("parts", text("abc")),
                kv("large", any_value::Value::IntValue(i64::MAX)),
                kv("url.scheme", text("http")),
            ],
            links: vec![proto::span::Link {
                trace_id: vec![3; 16],
                span_id: vec![4; 8],
                flags: 1 | HAS_IS_REMOTE,
                ..Default::default()
            }],
            status: Some(proto::Status { message: "upstream-timeout".to_owned(), code: STATUS_ERROR as i32 }),
            ..Default::default()
        };
        assert_eq!(scope.spans[0], expected);
        assert!(scope.spans[0].start_time_unix_nano <= started);
        let client = &scope.spans[1];
        assert_eq!(client.flags, HAS_IS_REMOTE, "not sampled, a local parent");
        assert_eq!(
            client.end_time_unix_nano, client.start_time_unix_nano,
            "an end before the start is the start"
        );
        assert!(client.trace_state.is_empty() && client.status.is_none() && client.attributes.is_empty());
        // An empty batch is a request with no spans.
        let empty = ExportTraceServiceRequest::decode(&Writer::new(&resource).request_of(&[])[..]).unwrap();
        assert!(empty.resource_spans[0].scope_spans[0].spans.is_empty());
    }
}
