//! Recorded spans on their way out: the bounded queue every span goes into ([`Recorder`]), and the
//! task that takes them out in batches and sends each batch to the collector as one OTLP/HTTP
//! `ExportTraceServiceRequest` in protobuf ([`Exporter`]).
//!
//! Nothing here is on a call's path but [`Recorder::record`], a push under a lock that is never
//! held across anything else. A full queue drops the span; a collector that is down, slow or
//! failing loses its batch, never a call's time; both are counted for `/metrics`. One export is
//! under way at a time, within `OTEL_EXPORTER_OTLP_TIMEOUT`; on shutdown, what is queued is
//! exported within the grace period.

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

use super::settings::ExportSettings;
use super::{Kind, Value};
use crate::metrics::SpanCounts;
use crate::trace_context::TraceParent;

/// Where recorded spans wait for the exporter, and what became of them.
pub struct Recorder {
    /// Each span as the protobuf of an OTLP `Span` (`super::Span::finish`).
    queue: Mutex<Vec<Vec<u8>>>,
    max_queue: usize,
    max_batch: usize,
    /// Told when the queue holds a batch.
    ready: Notify,
    pub counts: SpanCounts,
}

impl Recorder {
    pub fn new(max_queue: usize, max_batch: usize) -> Recorder {
        Recorder {
            queue: Mutex::new(Vec::with_capacity(max_batch.min(max_queue))),
            max_queue,
            max_batch: max_batch.clamp(1, max_queue.max(1)),
            ready: Notify::new(),
            counts: SpanCounts::default(),
        }
    }

    /// Queues a finished span, or drops it (counted) when the queue is full.
    pub fn record(&self, span: Vec<u8>) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.len() >= self.max_queue {
            drop(queue);
            self.counts.dropped_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        queue.push(span);
        let batch = queue.len() == self.max_batch;
        drop(queue);
        if batch {
            self.ready.notify_one();
        }
    }

    /// Up to a batch of the oldest spans queued.
    fn take(&self) -> Vec<Vec<u8>> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.len() <= self.max_batch {
            return std::mem::take(&mut *queue);
        }
        let rest = queue.split_off(self.max_batch);
        std::mem::replace(&mut *queue, rest)
    }

    /// How many spans wait.
    pub fn queued(&self) -> usize {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The task that sends queued spans to the collector.
pub struct Exporter {
    recorder: Arc<Recorder>,
    settings: ExportSettings,
    client: HttpsClient,
    writer: std::sync::Mutex<Writer>,
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
        let lost = std::mem::take(&mut *self.recorder.queue.lock().unwrap_or_else(PoisonError::into_inner))
            .len() as u64;
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
        let recorder = Arc::new(Recorder::new(settings.max_queue, settings.max_batch));
        let writer = std::sync::Mutex::new(Writer::new(&settings.resource));
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
                loop {
                    let batch = self.recorder.take();
                    if batch.is_empty() {
                        break;
                    }
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
    async fn export(&self, batch: Vec<Vec<u8>>) {
        let n = batch.len() as u64;
        let body = self.writer.lock().unwrap_or_else(PoisonError::into_inner).request(&batch);
        drop(batch);
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

    async fn send(&self, body: Vec<u8>) -> Result<(), String> {
        let mut request = Request::post(self.settings.endpoint.clone())
            .header(header::CONTENT_TYPE, HeaderValue::from_static("application/x-protobuf"))
            .body(Full::new(Bytes::from(body)))
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
/// written field by field as it was recorded (`super::Span`), with no message tree in between:
/// building `opentelemetry-proto`'s messages, every id, name and value its own allocation, and
/// dropping them would cost several times the writing. The tests decode what it writes with
/// those messages. The resource and the scope, the same in every batch, are written once.
pub struct Writer {
    /// `ResourceSpans.resource`, written.
    resource: Vec<u8>,
    /// `ScopeSpans.scope` and `ScopeSpans.schema_url`, written.
    scope: Vec<u8>,
    /// A batch's `ScopeSpans`, reused.
    spans: Vec<u8>,
}

impl Writer {
    pub fn new(resource: &[(String, String)]) -> Writer {
        let mut attributes = Vec::new();
        for (key, value) in resource {
            key_value(&mut attributes, 1, key, Value::Str(value));
        }
        let mut written = Vec::new();
        message(&mut written, 1, &attributes);
        let mut scope = Vec::new();
        let mut named = Vec::new();
        string(&mut named, 1, "recast");
        string(&mut named, 2, env!("CARGO_PKG_VERSION"));
        message(&mut scope, 1, &named);
        string(&mut scope, 3, SCHEMA_URL);
        Writer { resource: written, scope, spans: Vec::new() }
    }

    /// The request of `spans`, each the protobuf of a `Span`.
    pub fn request(&mut self, spans: &[Vec<u8>]) -> Vec<u8> {
        self.spans.clear();
        self.spans.extend_from_slice(&self.scope);
        for span in spans {
            message(&mut self.spans, 2, span);
        }
        let scope_spans = self.spans.len();
        let resource_spans = self.resource.len() + 1 + encoded_len_varint(scope_spans as u64) + scope_spans;
        let mut out = Vec::with_capacity(resource_spans + 16);
        field_key(1, WireType::LengthDelimited, &mut out);
        put_varint(resource_spans as u64, &mut out);
        out.extend_from_slice(&self.resource);
        message(&mut out, 2, &self.spans);
        out
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
    bytes(out, 1, &span.context.trace_id);
    bytes(out, 2, &span.context.parent_id);
    // A long `tracestate` is passed on whole but not copied into every span of the trace.
    if let Some(state) = span.state.filter(|state| state.len() <= MAX_STATE_RECORDED) {
        bytes(out, 3, state.as_bytes());
    }
    if let Some(parent) = &span.parent {
        bytes(out, 4, parent);
    }
    string(out, 5, span.name);
    varint(out, 6, span.kind as u64);
    fixed64(out, 7, span.start);
    let flags = u32::from(span.context.flags & crate::trace_context::SAMPLED)
        | HAS_IS_REMOTE
        | if remote_parent { IS_REMOTE } else { 0 };
    fixed32(out, 16, flags);
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

/// A `KeyValue` as field `tag`.
pub(super) fn key_value(out: &mut Vec<u8>, tag: u32, key: &str, value: Value<'_>) {
    let any = match value {
        Value::Str(text) => string_len(1, text),
        Value::Int(n) => 1 + encoded_len_varint(n as u64),
        Value::Bool(_) => 2,
    };
    let len = string_len(1, key) + 1 + encoded_len_varint(any as u64) + any;
    field_key(tag, WireType::LengthDelimited, out);
    put_varint(len as u64, out);
    string(out, 1, key);
    field_key(2, WireType::LengthDelimited, out);
    put_varint(any as u64, out);
    // A oneof's member is written whatever its value.
    match value {
        Value::Str(text) => string(out, 1, text),
        Value::Int(n) => {
            field_key(3, WireType::Varint, out);
            put_varint(n as u64, out);
        }
        Value::Bool(b) => {
            field_key(2, WireType::Varint, out);
            put_varint(u64::from(b), out);
        }
    }
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
    use crate::telemetry::{Span, now};

    fn span(n: u8) -> Vec<u8> {
        let context = TraceParent { trace_id: [n; 16], parent_id: [n; 8], flags: 1 };
        let mut span = Span::start(context, None, None, Kind::Internal, "map");
        span.set("recast.document.size", 10);
        span.finish(u64::MAX)
    }

    /// The trace ids' first bytes of the spans of a batch, as the collector decodes it.
    fn ids(batch: &[Vec<u8>]) -> Vec<u8> {
        let request = Writer::new(&[]).request(batch);
        let decoded = ExportTraceServiceRequest::decode(&request[..]).unwrap();
        decoded.resource_spans[0].scope_spans[0].spans.iter().map(|s| s.trace_id[0]).collect()
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_batches_come_out_oldest_first() {
        let recorder = Recorder::new(3, 2);
        for n in 1..=5 {
            recorder.record(span(n));
        }
        assert_eq!(recorder.counts.dropped_full.load(Ordering::Relaxed), 2);
        assert_eq!(ids(&recorder.take()), [1, 2]);
        assert_eq!(ids(&recorder.take()), [3]);
        assert!(recorder.take().is_empty());
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
        server.set("url.path", "/v1/ü");
        server.set("recast.abandoned", true);
        server.set("negative", -5);
        server.set("empty", "");
        server.set("long", &long);
        server.fail("upstream-timeout");
        server.link(TraceParent { trace_id: [3; 16], parent_id: [4; 8], flags: 1 });
        let started = now();
        let server = server.finish(started + 5);
        let client =
            Span::start(TraceParent { flags: 0, ..context }, None, Some([8; 8]), Kind::Client, "GET");
        let request = Writer::new(&resource).request(&[server, client.finish(0)]);
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
        let empty = ExportTraceServiceRequest::decode(&Writer::new(&resource).request(&[])[..]).unwrap();
        assert!(empty.resource_spans[0].scope_spans[0].spans.is_empty());
    }
}
