//! Traces (`docs/observability.md`) against a real OTLP/HTTP receiver on 127.0.0.1 that decodes
//! each `ExportTraceServiceRequest` with `opentelemetry-proto`: the spans of a call, a cached
//! hit and a coalesced miss, a retried call, an OAuth2 route's token fetch, a breaker's refusal,
//! 4xx and 5xx upstream answers and a composed route; the `traceparent` upstreams receive; the
//! samplers; a collector that is down, slow or failing while calls run; and the flush at
//! shutdown.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use recast::config::Config;
use serde_json::json;
use tokio::net::TcpListener;

use crate::retry::scripted;
use crate::routes::{MEALS, registered, registration};
use crate::support::{Held, PATIENCE, Reply, Service, Upstream, config, get, send};

/// What the collector does with an export.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Mode {
    Take,
    /// Answers 200 after this long.
    Slow(Duration),
    /// Answers this status.
    Fail(u16),
}

/// The attributes of a resource, as text.
type Attributes = Vec<(String, String)>;

/// An OTLP/HTTP receiver: every export's spans, decoded, and the resource they came with.
pub(crate) struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    resources: Arc<Mutex<Vec<Attributes>>>,
    exports: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Collector {
    pub(crate) async fn start(mode: Mode) -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let resources = Arc::new(Mutex::new(Vec::new()));
        let exports = Arc::new(AtomicUsize::new(0));
        let (kept, described, counted) = (spans.clone(), resources.clone(), exports.clone());
        let task = tokio::spawn(async move {
            let mut serving = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let (kept, described, counted) = (kept.clone(), described.clone(), counted.clone());
                serving.spawn(async move {
                    let service =
                        hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                            let (kept, described, counted) =
                                (kept.clone(), described.clone(), counted.clone());
                            async move {
                                assert_eq!(request.uri().path(), "/v1/traces");
                                assert_eq!(request.headers()["content-type"], "application/x-protobuf");
                                let body = request.into_body().collect().await.unwrap().to_bytes();
                                let status = match mode {
                                    Mode::Take => 200,
                                    Mode::Slow(delay) => {
                                        tokio::time::sleep(delay).await;
                                        200
                                    }
                                    Mode::Fail(status) => status,
                                };
                                if status == 200 {
                                    let decoded =
                                        ExportTraceServiceRequest::decode(&body[..]).expect("OTLP protobuf");
                                    for resource_spans in decoded.resource_spans {
                                        let resource = resource_spans.resource.unwrap_or_default();
                                        let attributes = resource
                                            .attributes
                                            .iter()
                                            .map(|kv| {
                                                (
                                                    kv.key.clone(),
                                                    text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                                                )
                                            })
                                            .collect();
                                        described.lock().unwrap().push(attributes);
                                        for scope in resource_spans.scope_spans {
                                            kept.lock().unwrap().extend(scope.spans);
                                        }
                                    }
                                    counted.fetch_add(1, Ordering::SeqCst);
                                }
                                let mut answer = http::Response::new(Full::new(Bytes::new()));
                                *answer.status_mut() = http::StatusCode::from_u16(status).unwrap();
                                Ok::<_, std::convert::Infallible>(answer)
                            }
                        });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        Collector { addr, spans, resources, exports, task }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans of `trace` once there are at least `n`; fails after [`PATIENCE`].
    pub(crate) async fn trace(&self, trace: &[u8], n: usize) -> Vec<Span> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let spans: Vec<Span> = self.spans().into_iter().filter(|s| s.trace_id == trace).collect();
            if spans.len() >= n {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of {n} spans of the trace came: {spans:#?}",
                spans.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(n)) => n.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

/// A span's attribute, as text.
fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
}

/// A route to `api` whose OAuth2 client credentials are asked of `tokens`' `/token`.
fn oauth_route(api: &Upstream, tokens: &Upstream) -> String {
    format!(
        r#"{{"path":"meals","originalRoute":{{"originalApi":{{"baseUrl":"{}"}},"path":"api"}},"authHeader":{{"type":"OAuth2ClientCredentials","tokenUrl":"{}","clientId":"c","clientSecret":"s"}},"rulesAsString":{}}}"#,
        api.url("/"),
        tokens.url("/token"),
        crate::routes::RULES
    )
}

/// Registers the route `body` with the caller's `traceparent`.
async fn register_under(service: &Service, body: String, traceparent: &str) -> crate::support::Answer {
    let headers = [("content-type", "application/json"), ("traceparent", traceparent)];
    send(Method::POST, &service.url("/v1/mapping"), &headers, body).await
}

pub(crate) fn has(span: &Span, key: &str, value: &str) -> bool {
    attr(span, key).as_deref() == Some(value)
}

pub(crate) const SERVER: i32 = 2;
const CLIENT: i32 = 3;
const INTERNAL: i32 = 1;
const ERROR: i32 = 2;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

/// A configuration that exports to `collector` at once.
pub(crate) fn traced(collector: &Collector) -> Config {
    Config { otel_exporter_otlp_endpoint: Some(collector.url()), otel_bsp_schedule_delay: 20, ..config() }
}

fn one<'a>(spans: &'a [Span], what: &str, test: impl Fn(&Span) -> bool) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| test(s)).collect();
    assert_eq!(found.len(), 1, "one {what} in {spans:#?}");
    found[0]
}

/// The trace id a `traceparent` an upstream received names, and its parent id and flags.
fn parent_of(received: &crate::support::Received) -> (String, String, String) {
    let value = received.headers.get("traceparent").expect("a traceparent").to_str().unwrap();
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "{value}");
    assert_eq!(parts[0], "00");
    (parts[1].to_owned(), parts[2].to_owned(), parts[3].to_owned())
}

#[tokio::test]
async fn a_call_is_a_server_span_with_its_attempt_and_mapping_and_the_upstream_joins_the_trace() {
    let collector = Collector::start(Mode::Take).await;
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(traced(&collector)).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let uuid = &path[4..40];
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let headers = [
        ("traceparent", caller),
        ("tracestate", "vendor=x,other=y"),
        ("baggage", "tenant=acme,user=42"),
        ("user-agent", "trace-test/1"),
    ];
    let answer = send(Method::GET, &service.url(&format!("{path}?q=1&api_key=s3cret")), &headers, "").await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let trace = unhex("4bf92f3577b34da6a3ce929d0e0e4736");
    let spans = collector.trace(&trace, 3).await;
    assert_eq!(spans.len(), 3, "{spans:#?}");

    let server = one(&spans, "SERVER span", |s| s.kind == SERVER);
    assert_eq!(server.name, "GET /v1/{uuid}/{path}");
    assert_eq!(hex(&server.parent_span_id), "00f067aa0ba902b7", "the caller's span is its parent");
    assert_eq!(server.flags & 0x3ff, 0x301, "sampled, with a remote parent");
    assert_eq!(server.trace_state, "vendor=x,other=y");
    for (key, value) in [
        ("http.request.method", "GET"),
        ("url.path", path.as_str()),
        ("url.scheme", "http"),
        ("http.route", "/v1/{uuid}/{path}"),
        ("http.response.status_code", "200"),
        ("server.address", "127.0.0.1"),
        ("server.port", &service.addr.port().to_string()),
        ("client.address", "127.0.0.1"),
        ("user_agent.original", "trace-test/1"),
        ("network.protocol.version", "1.1"),
        ("recast.route.id", uuid),
    ] {
        assert!(has(server, key, value), "{key}={value} in {server:#?}");
    }
    assert!(attr(server, "error.type").is_none() && server.status.is_none(), "{server:#?}");
    assert!(attr(server, "recast.cache").is_none(), "a route without cache says nothing of one");
    assert!(
        !server
            .attributes
            .iter()
            .any(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())).contains("s3cret"))
    );

    let client = one(&spans, "CLIENT span", |s| s.kind == CLIENT);
    assert_eq!(client.parent_span_id, server.span_id);
    assert_eq!(client.name, "GET");
    for (key, value) in [
        ("http.request.method", "GET"),
        ("server.address", "127.0.0.1"),
        ("server.port", &upstream.addr.port().to_string()),
        ("http.response.status_code", "200"),
        ("network.protocol.version", "1.1"),
    ] {
        assert!(has(client, key, value), "{key}={value} in {client:#?}");
    }
    let url = attr(client, "url.full").unwrap();
    assert_eq!(url, format!("http://{}/api/random.php?q=1&api_key=REDACTED", upstream.addr));
    assert!(attr(client, "http.request.resend_count").is_none());
    assert!(client.status.is_none());
    assert!(client.start_time_unix_nano >= server.start_time_unix_nano);
    assert!(client.end_time_unix_nano <= server.end_time_unix_nano);

    let map = one(&spans, "mapping span", |s| s.kind == INTERNAL);
    assert_eq!((map.name.as_str(), &map.parent_span_id), ("map", &server.span_id));
    assert!(has(map, "recast.document.size", &MEALS.len().to_string()), "{map:#?}");
    assert!(attr(map, "recast.output.size").is_some());

    // The upstream joined the trace under the attempt's span, with the caller's context.
    let received = upstream.received().pop().unwrap();
    let (trace_id, parent, flags) = parent_of(&received);
    assert_eq!(
        (trace_id.as_str(), parent, flags.as_str()),
        ("4bf92f3577b34da6a3ce929d0e0e4736", hex(&client.span_id), "01")
    );
    assert_eq!(received.headers["tracestate"], "vendor=x,other=y");
    assert!(received.headers.get("baggage").is_none(), "baggage stays without RECAST_PROPAGATE_BAGGAGE");
    let resource = collector.resources.lock().unwrap()[0].clone();
    assert!(resource.contains(&("service.name".to_owned(), "recast".to_owned())), "{resource:?}");

    // The registration's live call is traced too: POST /v1/mapping and its attempt.
    let all = collector.spans();
    let registration = one(&all, "registration", |s| s.name == "POST /v1/mapping");
    let live = collector.trace(&registration.trace_id, 3).await;
    assert!(live.iter().any(|s| s.kind == CLIENT && s.parent_span_id == registration.span_id));
    service.stop().await;
}

#[tokio::test]
async fn a_malformed_traceparent_starts_a_new_trace_and_a_callers_unsampled_one_is_not_recorded() {
    let collector = Collector::start(Mode::Take).await;
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(Config { propagate_baggage: true, ..traced(&collector) }).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    // Upper-case hex: not a traceparent; its tracestate goes with it, its baggage (passed on by
    // RECAST_PROPAGATE_BAGGAGE) does not.
    let bad = [
        ("traceparent", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"),
        ("tracestate", "vendor=x"),
        ("baggage", "k=v"),
    ];
    assert_eq!(send(Method::GET, &service.url(&path), &bad, "").await.status, 200);
    let received = upstream.received().pop().unwrap();
    let (trace_id, _, flags) = parent_of(&received);
    assert_ne!(trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(flags, "01", "a new trace, sampled by the default sampler");
    assert!(received.headers.get("tracestate").is_none());
    assert_eq!(received.headers["baggage"], "k=v");
    let spans = collector.trace(&unhex(&trace_id), 3).await;
    let server = one(&spans, "SERVER span", |s| s.kind == SERVER);
    assert!(server.parent_span_id.is_empty(), "a root: {server:#?}");

    // A caller that did not sample: the default sampler follows it, and says so upstream.
    let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    assert_eq!(send(Method::GET, &service.url(&path), &[("traceparent", unsampled)], "").await.status, 200);
    let (trace_id, _, flags) = parent_of(&upstream.received().pop().unwrap());
    assert_eq!((trace_id.as_str(), flags.as_str()), ("0af7651916cd43dd8448eb211c80319c", "00"));
    // A later call's spans arrive; the unsampled one's never do.
    let later = "00-11111111111111111111111111111111-2222222222222222-01";
    assert_eq!(send(Method::GET, &service.url(&path), &[("traceparent", later)], "").await.status, 200);
    collector.trace(&unhex("11111111111111111111111111111111"), 3).await;
    assert!(!collector.spans().iter().any(|s| hex(&s.trace_id) == "0af7651916cd43dd8448eb211c80319c"));
    service.stop().await;
}

#[tokio::test]
async fn a_cached_hit_goes_nowhere_and_a_coalesced_miss_links_to_the_call_that_went_upstream() {
    let collector = Collector::start(Mode::Take).await;
    let held = Held::start(MEALS).await;
    let service = Service::start(traced(&collector)).await;
    let body = registration(&held.url, "", r#","cache":{"ttlSeconds":60}"#);
    let path = registered(&service, &body, &[]).await;
    let url = service.url(&format!("{path}?hold=1"));
    let (first, second) = (
        "00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-0000000000000001-01",
        "00-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb-0000000000000002-01",
    );
    let leader = tokio::spawn({
        let url = url.clone();
        async move { send(Method::GET, &url, &[("traceparent", first)], "").await }
    });
    held.arrived(1).await;
    let waiter = tokio::spawn({
        let url = url.clone();
        async move { send(Method::GET, &url, &[("traceparent", second)], "").await }
    });
    // The waiter has joined the flight once the cache says so in /metrics.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let metrics = String::from_utf8(get(&service.url("/metrics")).await.body.to_vec()).unwrap();
        if metrics.lines().any(|l| l.starts_with("recast_cache_coalesced_total") && !l.ends_with(" 0")) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the second call never joined: {metrics}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.release();
    assert_eq!(leader.await.unwrap().status, 200);
    assert_eq!(waiter.await.unwrap().status, 200);
    let led = collector.trace(&[0xaa; 16], 3).await;
    let leader_span = one(&led, "leader", |s| s.kind == SERVER);
    assert!(has(leader_span, "recast.cache", "miss"));
    assert!(led.iter().any(|s| s.kind == CLIENT && s.parent_span_id == leader_span.span_id), "{led:#?}");
    let waited = collector.trace(&[0xbb; 16], 1).await;
    let waiter_span = one(&waited, "waiter", |s| s.kind == SERVER);
    assert!(has(waiter_span, "recast.cache", "miss"));
    assert!(!waited.iter().any(|s| s.kind == CLIENT), "the waiter sent nothing: {waited:#?}");
    assert_eq!(waiter_span.links.len(), 1, "{waiter_span:#?}");
    assert_eq!(
        (&waiter_span.links[0].trace_id, &waiter_span.links[0].span_id),
        (&leader_span.trace_id, &leader_span.span_id)
    );

    // A hit: answered from the cache, nothing upstream.
    let hit = "00-cccccccccccccccccccccccccccccccc-0000000000000003-01";
    assert_eq!(send(Method::GET, &url, &[("traceparent", hit)], "").await.status, 200);
    let spans = collector.trace(&[0xcc; 16], 1).await;
    let server = one(&spans, "hit", |s| s.kind == SERVER);
    assert!(has(server, "recast.cache", "hit"), "{server:#?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(collector.spans().iter().filter(|s| s.trace_id == [0xcc; 16]).count(), 1);
    service.stop().await;
}

#[tokio::test]
async fn each_retry_is_a_span_of_its_own_with_its_resend_count() {
    let collector = Collector::start(Mode::Take).await;
    let upstream = scripted(|n| if n == 1 { Reply::with(503, "{}") } else { Reply::json(MEALS) }).await;
    let service = Service::start(Config { breaker_failures: 0, ..traced(&collector) }).await;
    let body = registration(&upstream.url("/"), "", r#","retry":{"attempts":2,"on":[503]}"#);
    let path = registered(&service, &body, &[]).await;
    let caller = "00-dddddddddddddddddddddddddddddddd-0000000000000004-01";
    assert_eq!(send(Method::GET, &service.url(&path), &[("traceparent", caller)], "").await.status, 200);
    let spans = collector.trace(&[0xdd; 16], 4).await;
    let server = one(&spans, "SERVER span", |s| s.kind == SERVER);
    let mut attempts: Vec<&Span> = spans.iter().filter(|s| s.kind == CLIENT).collect();
    attempts.sort_by_key(|s| s.start_time_unix_nano);
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    assert!(attempts.iter().all(|s| s.parent_span_id == server.span_id));
    let (failed, resent) = (attempts[0], attempts[1]);
    assert!(
        has(failed, "http.response.status_code", "503") && has(failed, "error.type", "503"),
        "{failed:#?}"
    );
    assert_eq!(failed.status.as_ref().map(|s| s.code), Some(ERROR));
    assert!(attr(failed, "http.request.resend_count").is_none());
    assert!(has(resent, "http.request.resend_count", "1") && has(resent, "http.response.status_code", "200"));
    assert!(resent.status.is_none());
    // Each attempt told the upstream its own span.
    let received = upstream.received();
    let parents: Vec<String> = received[1..].iter().map(|r| parent_of(r).1).collect();
    assert_eq!(parents, [hex(&failed.span_id), hex(&resent.span_id)]);
    service.stop().await;
}

#[tokio::test]
async fn upstream_4xx_and_5xx_answers_and_a_breakers_refusal_are_errors_of_their_spans() {
    let collector = Collector::start(Mode::Take).await;
    let upstream = scripted(|n| match n {
        1 => Reply::with(404, "{}"),
        _ => Reply::with(500, "{}"),
    })
    .await;
    let service =
        Service::start(Config { breaker_failures: 1, breaker_cooldown_ms: 60_000, ..traced(&collector) })
            .await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let calls = [
        ("00-01010101010101010101010101010101-0000000000000005-01", "404"),
        ("00-02020202020202020202020202020202-0000000000000006-01", "500"),
        ("00-03030303030303030303030303030303-0000000000000007-01", "breaker_open"),
    ];
    let mut statuses = Vec::new();
    for (caller, _) in calls {
        statuses.push(send(Method::GET, &service.url(&path), &[("traceparent", caller)], "").await.status);
    }
    // An upstream's 4xx is answered with its status, its 5xx and the refusal with a 5xx.
    assert_eq!(statuses[0], 404);
    assert!(statuses[1..].iter().all(|s| s.is_server_error()), "{statuses:?}");
    for (caller, error) in calls {
        let trace = unhex(&caller[3..35]);
        let spans = collector.trace(&trace, 2).await;
        let client = one(&spans, "CLIENT span", |s| s.kind == CLIENT);
        assert!(has(client, "error.type", error), "{error}: {client:#?}");
        assert_eq!(client.status.as_ref().map(|s| s.code), Some(ERROR), "{client:#?}");
        let server = one(&spans, "SERVER span", |s| s.kind == SERVER);
        if error == "404" {
            assert!(server.status.is_none() && attr(server, "error.type").is_none(), "a 4xx: {server:#?}");
            continue;
        }
        assert_eq!(server.status.as_ref().map(|s| s.code), Some(ERROR), "a 5xx answer: {server:#?}");
        let kind = attr(server, "error.type").expect("an error.type");
        assert!(kind.starts_with("upstream-"), "the problem type: {kind}");
    }
    assert_eq!(upstream.received().len(), 3, "the breaker's refusal sent nothing");
    // recast's own 4xx is no error of its span.
    let caller = "00-04040404040404040404040404040404-0000000000000008-01";
    let answer =
        send(Method::GET, &service.url("/v1/routes/not-a-uuid"), &[("traceparent", caller)], "").await;
    assert_eq!(answer.status, 404);
    let spans = collector.trace(&[4; 16], 1).await;
    assert!(spans[0].status.is_none() && attr(&spans[0], "error.type").is_none(), "{spans:#?}");
    assert_eq!(spans[0].name, "GET /v1/routes/{uuid}");
    service.stop().await;
}

#[tokio::test]
async fn an_oauth2_routes_token_fetch_is_a_client_span_of_the_call_that_made_it() {
    let collector = Collector::start(Mode::Take).await;
    let tokens = Upstream::json(r#"{"access_token":"t0k3n","token_type":"Bearer","expires_in":3600}"#).await;
    let api = Upstream::json(MEALS).await;
    let service = Service::start(traced(&collector)).await;
    let body = oauth_route(&api, &tokens);
    let caller = "00-05050505050505050505050505050505-0000000000000009-01";
    let created = register_under(&service, body, caller).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let spans = collector.trace(&[5; 16], 4).await;
    let server = one(&spans, "SERVER span", |s| s.kind == SERVER);
    assert_eq!(server.name, "POST /v1/mapping");
    let token = one(&spans, "token fetch", |s| has(s, "recast.oauth2.token_request", "true"));
    assert_eq!((token.kind, token.name.as_str()), (CLIENT, "POST"));
    assert_eq!(token.parent_span_id, server.span_id);
    assert!(has(token, "url.full", &tokens.url("/token")) && has(token, "http.response.status_code", "200"));
    let call =
        one(&spans, "API call", |s| s.kind == CLIENT && !has(s, "recast.oauth2.token_request", "true"));
    assert!(call.start_time_unix_nano >= token.end_time_unix_nano, "the token first");
    // The token endpoint joined the trace under the fetch's span.
    let (trace_id, parent, _) = parent_of(&tokens.received()[0]);
    assert_eq!((trace_id, parent), ("05050505050505050505050505050505".to_owned(), hex(&token.span_id)));
    service.stop().await;
}

#[tokio::test]
async fn a_composed_routes_sources_are_client_spans_named_by_source() {
    let collector = Collector::start(Mode::Take).await;
    let (a, b) = (Upstream::json(r#"{"v":1}"#).await, Upstream::json(r#"{"v":2}"#).await);
    let service = Service::start(traced(&collector)).await;
    let source = |upstream: &Upstream| json!({"originalApi": {"baseUrl": upstream.url("/")}, "path": "x"});
    let body = json!({
        "path": "both",
        "sources": {"a": source(&a), "b": source(&b)},
        "rulesAsString": {"newBodyFields": {"sum": {"key": "sum", "type": "Json"}}, "oldBodyFields": {"sum": {"expr": "sum([a.v, b.v])"}}},
    });
    let path = registered(&service, &body.to_string(), &[]).await;
    let caller = "00-06060606060606060606060606060606-000000000000000a-01";
    assert_eq!(send(Method::GET, &service.url(&path), &[("traceparent", caller)], "").await.status, 200);
    let spans = collector.trace(&[6; 16], 4).await;
    let server = one(&spans, "SERVER span", |s| s.kind == SERVER);
    for name in ["a", "b"] {
        let client = one(&spans, name, |s| s.kind == CLIENT && has(s, "recast.source", name));
        assert_eq!(client.parent_span_id, server.span_id);
    }
    let map = one(&spans, "mapping", |s| s.kind == INTERNAL);
    assert!(has(map, "recast.document.size", "14"), "both answers: {map:#?}");
    service.stop().await;
}

/// A paged source's pages are calls: one CLIENT span per page, each named by the source, each
/// child of the call's SERVER span.
#[tokio::test]
async fn each_page_of_a_paged_source_is_a_client_span() {
    let collector = Collector::start(Mode::Take).await;
    let pages = Upstream::start(|received| {
        let page: u64 =
            received.uri.query().and_then(|q| q.strip_prefix("page=")).map_or(1, |p| p.parse().unwrap());
        Reply::json(&json!({"items": [page], "page": page, "total_pages": 3}).to_string())
    })
    .await;
    let service = Service::start(traced(&collector)).await;
    let body = json!({
        "path": "paged",
        "sources": {"orders": {"originalApi": {"baseUrl": pages.url("/")}, "path": "x",
            "paginate": {"items": "items", "next": {"query": {"page": "$page + `1`"}}, "while": "page < total_pages"}}},
        "rulesAsString": {"newBodyFields": {"all": {"key": "all", "type": "Json"}}, "oldBodyFields": {"all": {"expr": "orders"}}},
    });
    let path = registered(&service, &body.to_string(), &[]).await;
    let caller = "00-07070707070707070707070707070707-000000000000000a-01";
    assert_eq!(send(Method::GET, &service.url(&path), &[("traceparent", caller)], "").await.status, 200);
    // The SERVER span, three pages' CLIENT spans, the mapping.
    let spans = collector.trace(&[7; 16], 5).await;
    let server = one(&spans, "SERVER span", |s| s.kind == SERVER);
    let clients: Vec<&Span> =
        spans.iter().filter(|s| s.kind == CLIENT && has(s, "recast.source", "orders")).collect();
    assert_eq!(clients.len(), 3, "{spans:#?}");
    assert!(clients.iter().all(|s| s.parent_span_id == server.span_id));
    service.stop().await;
}

/// A 2xx answer that is not JSON is its upstream's failure: the CLIENT span of that source (and
/// of a route's own upstream) says `error.type` `not_json` with status Error; the others' don't.
#[tokio::test]
async fn a_source_whose_answer_is_not_json_has_a_client_span_that_says_so() {
    let collector = Collector::start(Mode::Take).await;
    let html =
        || Reply { content_type: "text/html", ..Reply::with(200, "<html>down for maintenance</html>") };
    let (a, b, own) = (
        Upstream::json(r#"{"v":1}"#).await,
        scripted(move |_| html()).await,
        scripted(move |_| html()).await,
    );
    let service = Service::start(traced(&collector)).await;
    let source = |upstream: &Upstream| json!({"originalApi": {"baseUrl": upstream.url("/")}, "path": "x"});
    let mut optional = source(&b);
    optional["optional"] = json!(true);
    let body = json!({
        "path": "html",
        "sources": {"a": source(&a), "b": optional},
        "rulesAsString": {"newBodyFields": {"v": {"key": "v", "type": "Json"}}, "oldBodyFields": {"v": {"expr": "a.v"}}},
    });
    let path = registered(&service, &body.to_string(), &[]).await;
    let caller = "00-0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b-000000000000000b-01";
    let answer = send(Method::GET, &service.url(&path), &[("traceparent", caller)], "").await;
    assert_eq!((answer.status.as_u16(), answer.header("recast-partial")), (200, Some("b;status=not_json")));
    let spans = collector.trace(&[0x0b; 16], 4).await;
    let b_span = one(&spans, "b", |s| s.kind == CLIENT && has(s, "recast.source", "b"));
    assert!(
        has(b_span, "error.type", "not_json") && has(b_span, "http.response.status_code", "200"),
        "{b_span:#?}"
    );
    assert_eq!(b_span.status.as_ref().map(|s| s.code), Some(ERROR), "{b_span:#?}");
    let a_span = one(&spans, "a", |s| s.kind == CLIENT && has(s, "recast.source", "a"));
    assert!(a_span.status.is_none() && attr(a_span, "error.type").is_none(), "{a_span:#?}");
    // A route's own upstream, the same.
    let path = registered(&service, &registration(&own.url("/"), "", ""), &[]).await;
    let caller = "00-0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c-000000000000000c-01";
    let answer = send(Method::GET, &service.url(&path), &[("traceparent", caller)], "").await;
    answer.assert_problem(502, "upstream-not-json");
    let spans = collector.trace(&[0x0c; 16], 3).await;
    let client = one(&spans, "CLIENT span", |s| s.kind == CLIENT);
    assert!(has(client, "error.type", "not_json"), "{client:#?}");
    assert_eq!(client.status.as_ref().map(|s| s.code), Some(ERROR), "{client:#?}");
    service.stop().await;
}

#[tokio::test]
async fn samplers_off_and_by_ratio_decide_what_is_recorded_and_say_so_upstream() {
    let collector = Collector::start(Mode::Take).await;
    let upstream = Upstream::json(MEALS).await;
    // Off: nothing recorded, the upstream told so, the trace still joined.
    let off = Config { otel_traces_sampler: "always_off".to_owned(), ..traced(&collector) };
    let service = Service::start(off).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let caller = "00-07070707070707070707070707070707-000000000000000b-01";
    assert_eq!(send(Method::GET, &service.url(&path), &[("traceparent", caller)], "").await.status, 200);
    let (trace_id, _, flags) = parent_of(&upstream.received().pop().unwrap());
    assert_eq!((trace_id.as_str(), flags.as_str()), ("07070707070707070707070707070707", "00"));
    service.stop().await;
    assert!(collector.spans().is_empty(), "{:#?}", collector.spans());

    // A ratio of one half, not following the caller: the trace id's last eight bytes decide.
    let half = Config {
        otel_traces_sampler: "traceidratio".to_owned(),
        otel_traces_sampler_arg: Some("0.5".to_owned()),
        ..traced(&collector)
    };
    let service = Service::start(half).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let low = "00-08080808080808080000000000000001-000000000000000c-00";
    let high = "00-0909090909090909ffffffffffffffff-000000000000000d-01";
    for caller in [low, high] {
        assert_eq!(send(Method::GET, &service.url(&path), &[("traceparent", caller)], "").await.status, 200);
    }
    let received = upstream.received();
    let flags: Vec<String> = received[received.len() - 2..].iter().map(|r| parent_of(r).2).collect();
    assert_eq!(flags, ["01", "00"], "the low id is taken whatever the caller did, the high one is not");
    collector.trace(&unhex("08080808080808080000000000000001"), 3).await;
    service.stop().await;
    assert!(!collector.spans().iter().any(|s| s.trace_id == unhex("0909090909090909ffffffffffffffff")));
}

#[tokio::test]
async fn without_a_collector_the_trace_context_is_still_passed_on() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let caller = "00-0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a-000000000000000e-01";
    assert_eq!(send(Method::GET, &service.url(&path), &[("traceparent", caller)], "").await.status, 200);
    let (trace_id, parent, flags) = parent_of(&upstream.received().pop().unwrap());
    assert_eq!((trace_id.as_str(), flags.as_str()), ("0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a", "01"));
    assert_ne!(parent, "000000000000000e", "the attempt's own span id");
    // No caller's trace: a new one.
    assert_eq!(get(&service.url(&path)).await.status, 200);
    let (fresh, _, _) = parent_of(&upstream.received().pop().unwrap());
    assert_ne!(fresh, trace_id);
    let metrics = String::from_utf8(get(&service.url("/metrics")).await.body.to_vec()).unwrap();
    assert!(metrics.contains("recast_trace_spans_total{outcome=\"exported\"} 0"), "{metrics}");
    service.stop().await;
}

/// Runs `n` calls of `url`, `at_once` at a time; every one must answer 200.
async fn calls(url: &str, n: usize, at_once: usize) {
    let next = Arc::new(AtomicUsize::new(0));
    let mut running = Vec::new();
    for _ in 0..at_once {
        let (next, url) = (next.clone(), url.to_owned());
        running.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::SeqCst) < n {
                let answer = get(&url).await;
                assert_eq!(answer.status, 200, "{:?}", answer.body);
            }
        }));
    }
    for task in running {
        task.await.unwrap();
    }
}

fn metric(metrics: &str, line: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(line).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {line} in {metrics}"))
}

#[tokio::test]
async fn a_collector_down_slow_or_failing_costs_calls_nothing_and_what_is_lost_is_counted() {
    let upstream = Upstream::json(MEALS).await;
    let down = Collector::start(Mode::Take).await;
    let down_url = down.url();
    drop(down);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let slow = Collector::start(Mode::Slow(Duration::from_secs(5))).await;
    let failing = Collector::start(Mode::Fail(500)).await;
    for (name, url) in [("down", down_url), ("slow", slow.url()), ("failing", failing.url())] {
        let config = Config {
            otel_exporter_otlp_endpoint: Some(url),
            otel_bsp_schedule_delay: 20,
            otel_bsp_max_queue_size: 64,
            otel_bsp_max_export_batch_size: 16,
            shutdown_grace_ms: 1_000,
            ..config()
        };
        let service = Service::start(config).await;
        let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
        let started = std::time::Instant::now();
        calls(&service.url(&path), 1_000, 16).await;
        let took = started.elapsed();
        assert!(took < Duration::from_secs(30), "{name}: 1,000 calls took {took:?}");
        let metrics = String::from_utf8(get(&service.url("/metrics")).await.body.to_vec()).unwrap();
        let lost = metric(&metrics, "recast_trace_spans_total{outcome=\"dropped_queue_full\"}")
            + metric(&metrics, "recast_trace_spans_total{outcome=\"dropped_export_failed\"}");
        assert!(lost > 0, "{name}: nothing counted as lost in\n{metrics}");
        if name == "slow" {
            assert!(
                metric(&metrics, "recast_trace_spans_total{outcome=\"dropped_queue_full\"}") > 0,
                "{metrics}"
            );
        } else {
            assert!(
                metric(&metrics, "recast_trace_exports_total{outcome=\"failed\"}") > 0,
                "{name}: {metrics}"
            );
            assert_eq!(metric(&metrics, "recast_trace_spans_total{outcome=\"exported\"}"), 0, "{name}");
        }
        // The stop waits for the last spans no longer than its grace period.
        let stopping = std::time::Instant::now();
        service.stop().await;
        assert!(
            stopping.elapsed() < Duration::from_secs(4),
            "{name}: the stop took {:?}",
            stopping.elapsed()
        );
    }
}

#[tokio::test]
async fn the_spans_queued_at_shutdown_are_exported_before_the_process_stops() {
    let collector = Collector::start(Mode::Take).await;
    let upstream = Upstream::json(MEALS).await;
    // Nothing is exported on its own within the test: only the flush at shutdown sends.
    let config = Config { otel_bsp_schedule_delay: 600_000, ..traced(&collector) };
    let service = Service::start(config).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let caller = "00-0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b-000000000000000f-01";
    assert_eq!(send(Method::GET, &service.url(&path), &[("traceparent", caller)], "").await.status, 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(collector.exports.load(Ordering::SeqCst), 0);
    service.stop().await;
    let spans: Vec<Span> = collector.spans().into_iter().filter(|s| s.trace_id == [0x0b; 16]).collect();
    assert_eq!(spans.len(), 3, "{spans:#?}");
}

#[tokio::test]
async fn a_rate_limits_refusal_is_a_client_span_that_sent_nothing() {
    let collector = Collector::start(Mode::Take).await;
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(traced(&collector)).await;
    let limit = r#","rateLimit":{"requestsPerSecond":1,"burst":1,"maxWaitMs":0}"#;
    let path = registered(&service, &registration(&upstream.url("/"), "", limit), &[]).await;
    // The live call took the one slot of this second.
    let caller = "00-0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c-0000000000000010-01";
    let answer = send(Method::GET, &service.url(&path), &[("traceparent", caller)], "").await;
    assert_eq!(answer.status, 429);
    let spans = collector.trace(&[0x0c; 16], 2).await;
    let client = one(&spans, "CLIENT span", |s| s.kind == CLIENT);
    assert!(has(client, "error.type", "rate_limited"), "{client:#?}");
    assert!(attr(client, "http.response.status_code").is_none(), "nothing was sent");
    assert_eq!(upstream.received().len(), 1, "the live call only");
    service.stop().await;
}

#[tokio::test]
async fn a_call_whose_client_went_away_ends_its_spans_as_abandoned_not_failed() {
    use tokio::io::AsyncWriteExt as _;
    let collector = Collector::start(Mode::Take).await;
    let held = Held::start(MEALS).await;
    let service = Service::start(traced(&collector)).await;
    let path = registered(&service, &registration(&held.url, "", ""), &[]).await;
    let mut client = tokio::net::TcpStream::connect(service.addr).await.unwrap();
    let caller = "00-0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d-0000000000000011-01";
    let head = format!("GET {path}?hold=1 HTTP/1.1\r\nhost: 127.0.0.1\r\ntraceparent: {caller}\r\n\r\n");
    client.write_all(head.as_bytes()).await.unwrap();
    held.arrived(1).await;
    drop(client);
    let spans = collector.trace(&[0x0d; 16], 2).await;
    let server = one(&spans, "SERVER span", |s| s.kind == SERVER);
    let client = one(&spans, "CLIENT span", |s| s.kind == CLIENT);
    for span in [server, client] {
        assert!(has(span, "recast.abandoned", "true"), "{span:#?}");
        assert!(span.status.is_none() && attr(span, "error.type").is_none(), "not an error: {span:#?}");
        assert!(attr(span, "http.response.status_code").is_none());
    }
    assert_eq!(client.parent_span_id, server.span_id);
    held.release();
    service.stop().await;
}

#[tokio::test]
async fn a_stop_during_an_export_still_exports_what_was_queued_meanwhile() {
    let collector = Collector::start(Mode::Slow(Duration::from_millis(400))).await;
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(traced(&collector)).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    // Wait out the registration's export, so the next one is the first call's alone.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while collector.exports.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the registration's spans never came");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = "00-0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e-0000000000000012-01";
    assert_eq!(send(Method::GET, &service.url(&path), &[("traceparent", first)], "").await.status, 200);
    // The exporter takes the first call's spans within its schedule delay and waits on the
    // collector; the second call's are queued meanwhile, and the stop comes before it is done.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = "00-0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f-0000000000000013-01";
    assert_eq!(send(Method::GET, &service.url(&path), &[("traceparent", second)], "").await.status, 200);
    service.stop().await;
    let spans = collector.spans();
    for trace in [[0x0e; 16], [0x0f; 16]] {
        let n = spans.iter().filter(|s| s.trace_id == trace).count();
        assert_eq!(n, 3, "the spans of trace {:02x}: {n}", trace[0]);
    }
}

/// A route's own `tracestate` and `baggage` headers are sent as configured, whatever the caller
/// sends (with `RECAST_PROPAGATE_BAGGAGE` on, too), by a route's own upstream and by a source
/// alike; its own `traceparent` is replaced by recast's. A token fetch, shared by every caller,
/// carries only its `traceparent`.
#[tokio::test]
async fn configured_baggage_and_tracestate_are_never_replaced_by_a_callers() {
    let upstream = Upstream::json(MEALS).await;
    let tokens = Upstream::json(r#"{"access_token":"t0k3n","token_type":"Bearer","expires_in":3600}"#).await;
    let service = Service::start(Config { propagate_baggage: true, ..config() }).await;
    let own = r#","headers":{"baggage":"route=1","tracestate":"r=1","traceparent":"00-11111111111111111111111111111111-1111111111111111-01"}"#;
    let single = registered(&service, &registration(&upstream.url("/"), own, ""), &[]).await;
    let composed = json!({
        "path": "composed",
        "sources": {"a": {"originalApi": {"baseUrl": upstream.url("/")}, "path": "x",
                          "headers": {"baggage": "source=1", "tracestate": "s=1"}}},
        "rulesAsString": {"newBodyFields": {"m": {"key": "m", "type": "Json"}}, "oldBodyFields": {"m": {"expr": "a.meals"}}},
    });
    let composed = registered(&service, &composed.to_string(), &[]).await;
    let caller = [
        ("traceparent", "00-12121212121212121212121212121212-0000000000000014-01"),
        ("tracestate", "c=2"),
        ("baggage", "caller=2"),
    ];
    let values = |received: &crate::support::Received, name: &str| {
        received.headers.get_all(name).iter().map(|v| v.to_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    for (path, baggage, state) in [(&single, "route=1", "r=1"), (&composed, "source=1", "s=1")] {
        for headers in [&[][..], &caller[..]] {
            assert_eq!(send(Method::GET, &service.url(path), headers, "").await.status, 200);
            let received = upstream.received().pop().unwrap();
            assert_eq!(values(&received, "baggage"), [baggage], "{path} {headers:?}");
            assert_eq!(values(&received, "tracestate"), [state], "{path} {headers:?}");
            let parents = values(&received, "traceparent");
            assert_eq!(parents.len(), 1, "recast's traceparent replaces the route's: {parents:?}");
            assert!(!parents[0].starts_with("00-1111"), "{parents:?}");
        }
    }
    // A route that configures neither passes the caller's on (here, a registration's live call);
    // its token endpoint gets neither.
    let mut headers = caller.to_vec();
    headers.push(("content-type", "application/json"));
    let created =
        send(Method::POST, &service.url("/v1/mapping"), &headers, oauth_route(&upstream, &tokens)).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let received = upstream.received().pop().unwrap();
    assert_eq!(values(&received, "baggage"), ["caller=2"]);
    assert_eq!(values(&received, "tracestate"), ["c=2"]);
    let token = tokens.received().pop().expect("a token fetch");
    assert!(token.headers.get("baggage").is_none() && token.headers.get("tracestate").is_none(), "{token:?}");
    assert!(token.headers.get("traceparent").is_some());
    service.stop().await;
}

/// An `http` upstream that speaks HTTP/2 only (prior knowledge), answering MEALS and keeping the
/// `traceparent` of every request.
async fn h2c_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    let task = tokio::spawn(async move {
        let mut serving = tokio::task::JoinSet::new();
        while let Ok((stream, _)) = listener.accept().await {
            let kept = kept.clone();
            serving.spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                        let kept = kept.clone();
                        async move {
                            let parent =
                                request.headers().get("traceparent").map(|v| v.to_str().unwrap().to_owned());
                            kept.lock().unwrap().push(parent.unwrap_or_default());
                            let mut answer =
                                http::Response::new(Full::new(Bytes::from_static(MEALS.as_bytes())));
                            answer.headers_mut().insert("content-type", "application/json".parse().unwrap());
                            Ok::<_, std::convert::Infallible>(answer)
                        }
                    });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    (addr, seen, task)
}

#[tokio::test]
async fn an_attempt_over_http2_says_so_and_carries_its_traceparent() {
    let collector = Collector::start(Mode::Take).await;
    let (addr, seen, task) = h2c_upstream().await;
    let service = Service::start(traced(&collector)).await;
    let body = registration(&format!("http://{addr}/"), "", r#","http2":"prior-knowledge""#);
    let path = registered(&service, &body, &[]).await;
    let caller = "00-13131313131313131313131313131313-0000000000000015-01";
    assert_eq!(send(Method::GET, &service.url(&path), &[("traceparent", caller)], "").await.status, 200);
    let spans = collector.trace(&[0x13; 16], 3).await;
    let client = one(&spans, "CLIENT span", |s| s.kind == CLIENT);
    assert!(has(client, "network.protocol.version", "2"), "{client:#?}");
    let last = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(last, format!("00-13131313131313131313131313131313-{}-01", hex(&client.span_id)));
    task.abort();
    service.stop().await;
}

#[tokio::test]
async fn a_token_endpoint_that_refuses_makes_a_token_span_and_an_attempt_that_sent_nothing() {
    let collector = Collector::start(Mode::Take).await;
    let tokens = Upstream::start(|_| Reply::with(400, r#"{"error":"invalid_client"}"#)).await;
    let api = Upstream::json(MEALS).await;
    let service = Service::start(traced(&collector)).await;
    let body = oauth_route(&api, &tokens);
    let caller = "00-14141414141414141414141414141414-0000000000000016-01";
    let refused = register_under(&service, body, caller).await;
    assert!(refused.status.is_client_error() || refused.status.is_server_error(), "{:?}", refused.status);
    let spans = collector.trace(&[0x14; 16], 3).await;
    let token = one(&spans, "token fetch", |s| has(s, "recast.oauth2.token_request", "true"));
    assert!(has(token, "http.response.status_code", "400") && has(token, "error.type", "400"), "{token:#?}");
    let attempt =
        one(&spans, "attempt", |s| s.kind == CLIENT && !has(s, "recast.oauth2.token_request", "true"));
    assert!(has(attempt, "error.type", "auth_failed"), "{attempt:#?}");
    assert!(attr(attempt, "http.response.status_code").is_none());
    assert!(api.received().is_empty(), "nothing reached the API");
    service.stop().await;
}
