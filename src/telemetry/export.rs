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
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};
use tokio::sync::{Notify, watch};

use super::settings::ExportSettings;
use super::{Kind, SpanRecord, Value};
use crate::metrics::SpanCounts;

/// Where recorded spans wait for the exporter, and what became of them.
pub struct Recorder {
    queue: Mutex<Vec<SpanRecord>>,
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
    pub fn record(&self, span: SpanRecord) {
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
    fn take(&self) -> Vec<SpanRecord> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.len() <= self.max_batch {
            return std::mem::take(&mut *queue);
        }
        let rest = queue.split_off(self.max_batch);
        std::mem::replace(&mut *queue, rest)
    }

    fn queued(&self) -> usize {
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
}

impl Flush {
    /// Says stop: the exporter exports what is queued and ends; the caller awaits its task.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
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
                if stopping || *stopped.borrow() {
                    return;
                }
            }
        };
        (Flush { stop }, task)
    }

    /// Sends one batch; counts what became of it.
    async fn export(&self, batch: Vec<SpanRecord>) {
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

/// `STATUS_CODE_ERROR`.
const STATUS_ERROR: u64 = 2;

/// Writes a batch as the protobuf of one `ExportTraceServiceRequest`, field by field from the
/// records, with no message tree in between (building `opentelemetry-proto`'s messages, every id
/// and name its own allocation, and dropping them cost several times the writing); the tests
/// hold it to those messages' own encoding. The resource and the scope, the same in every
/// batch, are written once.
pub struct Writer {
    /// `ResourceSpans.resource`, written.
    resource: Vec<u8>,
    /// `ScopeSpans.scope` and `ScopeSpans.schema_url`, written.
    scope: Vec<u8>,
    /// One span, then a batch's spans, reused.
    span: Vec<u8>,
    spans: Vec<u8>,
}

impl Writer {
    pub fn new(resource: &[(String, String)]) -> Writer {
        let mut attributes = Vec::new();
        for (key, value) in resource {
            key_value(&mut attributes, 1, key, &Value::Text(value.clone()));
        }
        let mut written = Vec::new();
        message(&mut written, 1, &attributes);
        let mut scope = Vec::new();
        let mut named = Vec::new();
        string(&mut named, 1, "recast");
        string(&mut named, 2, env!("CARGO_PKG_VERSION"));
        message(&mut scope, 1, &named);
        string(&mut scope, 3, SCHEMA_URL);
        Writer { resource: written, scope, span: Vec::new(), spans: Vec::new() }
    }

    /// The request of `spans`.
    pub fn request(&mut self, spans: &[SpanRecord]) -> Vec<u8> {
        self.spans.clear();
        self.spans.extend_from_slice(&self.scope);
        for record in spans {
            self.span.clear();
            write_span(&mut self.span, record);
            message(&mut self.spans, 2, &self.span);
        }
        let scope_spans = self.spans.len();
        let resource_spans = self.resource.len() + 1 + encoded_len_varint(scope_spans as u64) + scope_spans;
        let mut out = Vec::with_capacity(resource_spans + 16);
        encode_key(1, WireType::LengthDelimited, &mut out);
        encode_varint(resource_spans as u64, &mut out);
        out.extend_from_slice(&self.resource);
        message(&mut out, 2, &self.spans);
        out
    }
}

fn write_span(out: &mut Vec<u8>, record: &SpanRecord) {
    let remote_parent = record.kind == Kind::Server && record.parent.is_some();
    bytes(out, 1, &record.context.trace_id);
    bytes(out, 2, &record.context.parent_id);
    if let Some(state) = &record.state {
        bytes(out, 3, state.as_bytes());
    }
    if let Some(parent) = &record.parent {
        bytes(out, 4, parent);
    }
    string(out, 5, &record.name);
    varint(out, 6, record.kind as u64);
    fixed64(out, 7, record.start);
    fixed64(out, 8, record.end.max(record.start));
    for (key, value) in &record.attributes {
        key_value(out, 9, key, value);
    }
    for link in &record.links {
        let flags = u32::from(link.flags & crate::trace_context::SAMPLED) | HAS_IS_REMOTE;
        let len = 2 * 2 + link.trace_id.len() + link.parent_id.len() + 1 + 4;
        encode_key(13, WireType::LengthDelimited, out);
        encode_varint(len as u64, out);
        bytes(out, 1, &link.trace_id);
        bytes(out, 2, &link.parent_id);
        fixed32(out, 6, flags);
    }
    if let Some(why) = &record.error {
        let len = string_len(2, why) + 1 + encoded_len_varint(STATUS_ERROR);
        encode_key(15, WireType::LengthDelimited, out);
        encode_varint(len as u64, out);
        string(out, 2, why);
        varint(out, 3, STATUS_ERROR);
    }
    let flags = u32::from(record.context.flags & crate::trace_context::SAMPLED)
        | HAS_IS_REMOTE
        | if remote_parent { IS_REMOTE } else { 0 };
    fixed32(out, 16, flags);
}

/// A `KeyValue` as field `tag`.
fn key_value(out: &mut Vec<u8>, tag: u32, key: &str, value: &Value) {
    let any = match value {
        Value::Static(text) => string_len(1, text),
        Value::Text(text) => string_len(1, text),
        Value::Int(n) => 1 + encoded_len_varint(*n as u64),
        Value::Bool(_) => 2,
    };
    let len = string_len(1, key) + 1 + encoded_len_varint(any as u64) + any;
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(len as u64, out);
    string(out, 1, key);
    encode_key(2, WireType::LengthDelimited, out);
    encode_varint(any as u64, out);
    // A oneof's member is written whatever its value.
    match value {
        Value::Static(text) => string(out, 1, text),
        Value::Text(text) => string(out, 1, text),
        Value::Int(n) => {
            encode_key(3, WireType::Varint, out);
            encode_varint(*n as u64, out);
        }
        Value::Bool(b) => {
            encode_key(2, WireType::Varint, out);
            encode_varint(u64::from(*b), out);
        }
    }
}

/// What [`string`] writes, in bytes.
fn string_len(tag: u32, text: &str) -> usize {
    prost::encoding::key_len(tag) + encoded_len_varint(text.len() as u64) + text.len()
}

fn string(out: &mut Vec<u8>, tag: u32, text: &str) {
    bytes(out, tag, text.as_bytes());
}

fn bytes(out: &mut Vec<u8>, tag: u32, value: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(value.len() as u64, out);
    out.extend_from_slice(value);
}

fn message(out: &mut Vec<u8>, tag: u32, body: &[u8]) {
    bytes(out, tag, body);
}

fn varint(out: &mut Vec<u8>, tag: u32, value: u64) {
    encode_key(tag, WireType::Varint, out);
    encode_varint(value, out);
}

fn fixed64(out: &mut Vec<u8>, tag: u32, value: u64) {
    encode_key(tag, WireType::SixtyFourBit, out);
    out.extend_from_slice(&value.to_le_bytes());
}

fn fixed32(out: &mut Vec<u8>, tag: u32, value: u32) {
    encode_key(tag, WireType::ThirtyTwoBit, out);
    out.extend_from_slice(&value.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Status, span};
    use prost::Message as _;

    use super::*;
    use crate::trace_context::TraceParent;

    /// The same request built from `opentelemetry-proto`'s messages and encoded by prost: the
    /// reference the writer is held to.
    fn encode(resource: &Resource, spans: &[SpanRecord]) -> Vec<u8> {
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "recast".to_owned(),
                        version: env!("CARGO_PKG_VERSION").to_owned(),
                        ..Default::default()
                    }),
                    spans: spans.iter().map(proto_span).collect(),
                    schema_url: SCHEMA_URL.to_owned(),
                }],
                schema_url: String::new(),
            }],
        };
        request.encode_to_vec()
    }

    fn proto_span(record: &SpanRecord) -> opentelemetry_proto::tonic::trace::v1::Span {
        let remote_parent = record.kind == Kind::Server && record.parent.is_some();
        opentelemetry_proto::tonic::trace::v1::Span {
            trace_id: record.context.trace_id.to_vec(),
            span_id: record.context.parent_id.to_vec(),
            trace_state: record.state.as_ref().and_then(|s| s.to_str().ok()).unwrap_or_default().to_owned(),
            parent_span_id: record.parent.map_or_else(Vec::new, |p| p.to_vec()),
            flags: u32::from(record.context.flags & crate::trace_context::SAMPLED)
                | HAS_IS_REMOTE
                | if remote_parent { IS_REMOTE } else { 0 },
            name: record.name.to_string(),
            kind: record.kind as i32,
            start_time_unix_nano: record.start,
            end_time_unix_nano: record.end.max(record.start),
            attributes: record
                .attributes
                .iter()
                .map(|(key, value)| key_value((*key).to_owned(), any(value)))
                .collect(),
            links: record
                .links
                .iter()
                .map(|link| span::Link {
                    trace_id: link.trace_id.to_vec(),
                    span_id: link.parent_id.to_vec(),
                    flags: u32::from(link.flags & crate::trace_context::SAMPLED) | HAS_IS_REMOTE,
                    ..Default::default()
                })
                .collect(),
            status: record
                .error
                .as_ref()
                .map(|why| Status { message: why.to_string(), code: STATUS_ERROR as i32 }),
            ..Default::default()
        }
    }

    fn any(value: &Value) -> any_value::Value {
        match value {
            Value::Static(text) => any_value::Value::StringValue((*text).to_owned()),
            Value::Text(text) => any_value::Value::StringValue(text.clone()),
            Value::Int(n) => any_value::Value::IntValue(*n),
            Value::Bool(b) => any_value::Value::BoolValue(*b),
        }
    }

    fn key_value(key: String, value: any_value::Value) -> KeyValue {
        KeyValue { key, value: Some(AnyValue { value: Some(value) }), ..Default::default() }
    }

    fn record(n: u8) -> Box<SpanRecord> {
        Box::new(SpanRecord {
            context: TraceParent { trace_id: [n; 16], parent_id: [n; 8], flags: 1 },
            parent: None,
            state: None,
            kind: Kind::Internal,
            name: "map".into(),
            start: 1,
            end: 2,
            attributes: vec![("recast.document.size", Value::Int(10))],
            error: None,
            links: Vec::new(),
        })
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_batches_come_out_oldest_first() {
        let recorder = Recorder::new(3, 2);
        for n in 1..=5 {
            recorder.record(*record(n));
        }
        assert_eq!(recorder.counts.dropped_full.load(Ordering::Relaxed), 2);
        let first: Vec<u8> = recorder.take().iter().map(|r| r.context.trace_id[0]).collect();
        assert_eq!(first, [1, 2]);
        let second: Vec<u8> = recorder.take().iter().map(|r| r.context.trace_id[0]).collect();
        assert_eq!(second, [3]);
        assert!(recorder.take().is_empty());
    }

    #[test]
    fn spans_are_written_as_the_otlp_messages_encode_them() {
        let attributes =
            [("service.name".to_owned(), "recast".to_owned()), ("team".to_owned(), "é,b".to_owned())];
        let resource = Resource {
            attributes: attributes
                .iter()
                .map(|(k, v)| key_value(k.clone(), any_value::Value::StringValue(v.clone())))
                .collect(),
            ..Default::default()
        };
        let mut server = record(7);
        server.kind = Kind::Server;
        server.parent = Some([9; 8]);
        server.state = Some(http::HeaderValue::from_static("congo=t61rcWkgMzE"));
        server.name = "GET /v1/{uuid}/{path}".into();
        server.error = Some("upstream-timeout".into());
        server.links.push(TraceParent { trace_id: [3; 16], parent_id: [4; 8], flags: 1 });
        server.attributes.extend([
            ("url.path", Value::Text("/v1/ü".to_owned())),
            ("recast.abandoned", Value::Bool(true)),
            ("negative", Value::Int(-5)),
            ("empty", Value::Static("")),
            ("long", Value::Text("x".repeat(300))),
        ]);
        let mut client = record(8);
        client.kind = Kind::Client;
        client.parent = Some([7; 8]);
        client.context.flags = 0;
        let batch = [*server, *client, *record(9)];
        let written = Writer::new(&attributes).request(&batch);
        let reference = encode(&resource, &batch);
        let (written, reference) = (
            ExportTraceServiceRequest::decode(&written[..]).expect("the writer's bytes decode"),
            ExportTraceServiceRequest::decode(&reference[..]).unwrap(),
        );
        assert_eq!(written, reference);
        let scope = &written.resource_spans[0].scope_spans[0];
        assert_eq!(scope.scope.as_ref().unwrap().name, "recast");
        assert_eq!(scope.schema_url, SCHEMA_URL);
        let span = &scope.spans[0];
        assert_eq!((span.trace_id.clone(), span.span_id.clone()), (vec![7; 16], vec![7; 8]));
        assert_eq!(span.parent_span_id, vec![9; 8]);
        assert_eq!(span.kind, Kind::Server as i32);
        assert_eq!(span.flags, 1 | HAS_IS_REMOTE | IS_REMOTE);
        assert_eq!(span.status.as_ref().unwrap().code, STATUS_ERROR as i32);
        assert_eq!(span.links[0].span_id, vec![4; 8]);
        assert_eq!(scope.spans[1].flags, HAS_IS_REMOTE, "not sampled, a local parent");
        assert_eq!(scope.spans[2].parent_span_id, Vec::<u8>::new());
        assert_eq!(scope.spans[2].attributes[0].key, "recast.document.size");
        // An empty batch is a request with no spans.
        let empty = Writer::new(&attributes).request(&[]);
        let empty = ExportTraceServiceRequest::decode(&empty[..]).unwrap();
        assert!(empty.resource_spans[0].scope_spans[0].spans.is_empty());
    }
}
