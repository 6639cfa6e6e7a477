//! What operators watch: `GET /metrics` counting what really happened, and logs that carry the
//! request id on every line written while a request is served (text and JSON lines).

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use http::Method;
use recast::fuzzing::DELIBERATE_PANIC;
use recast::policy::{AllowList, Lookup, OutboundPolicy};
use recast::server::Outbound;
use serde_json::Value;

use crate::binary::Binary;
use crate::routes::{MEALS, registered, registration};
use crate::support::{Reply, Service, Upstream, config, get, post_json, send};

/// The value of the sample line `series` (name and labels exactly as written), 0 when absent.
pub(crate) fn sample(text: &str, series: &str) -> f64 {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}

pub(crate) async fn metrics(service: &Service) -> String {
    let answer = get(&service.url("/metrics")).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("content-type"), Some("text/plain; version=0.0.4; charset=utf-8"));
    String::from_utf8(answer.body.to_vec()).expect("UTF-8")
}

#[tokio::test]
async fn metrics_count_requests_latencies_failures_and_routes() {
    let failing = Arc::new(AtomicU16::new(0));
    let upstream = {
        let failing = failing.clone();
        Upstream::start(move |_| match failing.load(Ordering::Relaxed) {
            0 => Reply::json(MEALS),
            503 => Reply::with(503, "{}"),
            _ => Reply { content_type: "text/html", ..Reply::with(200, "<html>") },
        })
        .await
    };
    let service = Service::start(config()).await;
    let before = metrics(&service).await;
    assert_eq!(sample(&before, "recast_routes_loaded"), 0.0);
    assert_eq!(sample(&before, "recast_lifecycle_state"), 1.0);

    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let uuid = &path[4..40];
    for _ in 0..3 {
        assert_eq!(get(&service.url(&path)).await.status, 200);
    }
    failing.store(503, Ordering::Relaxed);
    assert_eq!(get(&service.url(&path)).await.status, 502);
    failing.store(1, Ordering::Relaxed);
    assert_eq!(get(&service.url(&path)).await.status, 502);
    assert_eq!(send(Method::POST, &service.url(&path), &[], "").await.status, 405);
    assert_eq!(get(&service.url("/v1/00000000-0000-4000-8000-000000000000/x")).await.status, 404);
    let bad_rules = r#"{"originalResponse":{},"mappingRules":{"newBodyFields":{"a":{"key":"a","type":"Nope"}},"oldBodyFields":{"a":{"keys":["a"]}}}}"#;
    assert_eq!(send(Method::POST, &service.url("/v1/preview"), &[], bad_rules).await.status, 400);

    let text = metrics(&service).await;
    let route = |status: u16| format!("recast_requests_total{{route=\"{uuid}\",status=\"{status}\"}}");
    assert_eq!(sample(&text, &route(200)), 3.0, "{text}");
    assert_eq!(sample(&text, &route(502)), 2.0);
    assert_eq!(sample(&text, &route(405)), 1.0);
    assert_eq!(sample(&text, r#"recast_requests_total{route="call",status="404"}"#), 1.0);
    assert_eq!(sample(&text, r#"recast_requests_total{route="mapping",status="201"}"#), 1.0);
    assert_eq!(sample(&text, r#"recast_requests_total{route="preview",status="400"}"#), 1.0);
    assert_eq!(
        sample(&text, r#"recast_requests_total{route="metrics",status="200"}"#),
        1.0,
        "the first scrape"
    );
    assert_eq!(sample(&text, r#"recast_upstream_errors_total{kind="status_5xx"}"#), 1.0);
    assert_eq!(sample(&text, r#"recast_upstream_errors_total{kind="not_json"}"#), 1.0);
    assert_eq!(sample(&text, r#"recast_rule_compile_failures_total{source="preview"}"#), 1.0);
    // The live call at registration and five route calls reached the upstream; four mapped.
    assert_eq!(sample(&text, "recast_upstream_duration_seconds_count"), 6.0);
    assert_eq!(sample(&text, "recast_mapping_duration_seconds_count"), 4.0);
    assert!(sample(&text, "recast_upstream_duration_seconds_sum") > 0.0);
    assert_eq!(sample(&text, r#"recast_upstream_duration_seconds_bucket{le="+Inf"}"#), 6.0);
    assert_eq!(sample(&text, "recast_routes_loaded"), 1.0);
    assert_eq!(sample(&text, "recast_in_flight_requests"), 1.0, "the scrape itself");

    // An update keeps the route's counts; a deletion removes its series.
    failing.store(0, Ordering::Relaxed);
    let update = registration(&upstream.url("/"), "", "");
    let updated = send(Method::PUT, &service.url(&format!("/v1/routes/{uuid}")), &[], update).await;
    assert_eq!(updated.status, 200, "{:?}", updated.body);
    assert_eq!(get(&service.url(&path)).await.status, 200);
    assert_eq!(sample(&metrics(&service).await, &route(200)), 4.0);
    assert_eq!(send(Method::DELETE, &service.url(&format!("/v1/routes/{uuid}")), &[], "").await.status, 204);
    let text = metrics(&service).await;
    assert!(!text.contains(uuid), "{text}");
    assert_eq!(sample(&text, "recast_routes_loaded"), 0.0);
    service.stop().await;
}

/// `RECAST_METRICS_ROUTE_LABEL=none`: route calls' answers are summed over every route, a series
/// per status however many routes there are, and no series names a route's uuid.
#[tokio::test]
async fn without_the_route_label_every_routes_answers_are_one_series_per_status() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(recast::config::Config {
        metrics_route_label: recast::config::RouteLabel::None,
        ..config()
    })
    .await;
    let mut uuids = Vec::new();
    for _ in 0..3 {
        let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
        for _ in 0..2 {
            assert_eq!(get(&service.url(&path)).await.status, 200);
        }
        assert_eq!(send(Method::POST, &service.url(&path), &[], "").await.status, 405);
        uuids.push(path[4..40].to_owned());
    }
    assert_eq!(get(&service.url("/v1/00000000-0000-4000-8000-000000000000/x")).await.status, 404);
    let text = metrics(&service).await;
    assert_eq!(sample(&text, r#"recast_requests_total{route="all_routes",status="200"}"#), 6.0, "{text}");
    assert_eq!(sample(&text, r#"recast_requests_total{route="all_routes",status="405"}"#), 3.0);
    assert_eq!(
        sample(&text, r#"recast_requests_total{route="call",status="404"}"#),
        1.0,
        "no route: as before"
    );
    for uuid in &uuids {
        assert!(!text.contains(uuid.as_str()), "{uuid} in\n{text}");
    }
    let series =
        text.lines().filter(|l| l.starts_with(r#"recast_requests_total{route="all_routes""#)).count();
    assert_eq!(series, 2, "{text}");
    service.stop().await;
}

/// The log lines written after the service became ready, parsed (JSON lines).
fn lines_after_ready(binary: &Binary) -> Vec<Value> {
    let text = binary.log_text();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let ready = lines
        .iter()
        .position(|l| l["fields"]["state"] == "Running")
        .unwrap_or_else(|| panic!("no Running line in\n{text}"));
    lines[ready + 1..].to_vec()
}

#[tokio::test]
async fn every_log_line_of_a_request_carries_its_request_id() {
    let upstream = Upstream::json(MEALS).await;
    let dir = tempfile::TempDir::new().unwrap();
    let binary =
        Binary::start_with(dir.path(), &[("RECAST_LOG", "debug"), ("RECAST_LOG_FORMAT", "json")]).await;
    let body = registration(&upstream.url("/"), "", "");
    let created =
        send(Method::POST, &binary.url("/v1/mapping"), &[("x-request-id", "req-register")], body).await;
    assert_eq!(created.status, 201);
    let path = created.json().get("path").and_then(|p| p.as_str().map(str::to_owned)).unwrap();
    let calls = [
        (Method::GET, path.clone(), "req-call"),
        (Method::POST, path.clone(), "req-wrong-method"),
        (Method::POST, "/v1/preview".to_owned(), "req-bad-preview"),
        (Method::DELETE, format!("/v1/routes/{}", &path[4..40]), "req-delete"),
    ];
    // A caller's trace: the lines of its request carry its trace id and the request's span id.
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for (method, at, id) in &calls {
        let answer =
            send(method.clone(), &binary.url(at), &[("x-request-id", id), ("traceparent", caller)], "{")
                .await;
        assert_eq!(answer.header("x-request-id"), Some(*id));
    }
    // The last answer is out before its last line is written; give the logger a moment.
    assert!(binary.wait_for_line(r#""path":"/v1/routes/"#).is_some());
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    let lines = lines_after_ready(&binary);
    for line in &lines {
        let message = line["fields"]["message"].as_str().unwrap_or("");
        if message.starts_with("connection") {
            // Connections outlive requests; they are not lines of a call.
            continue;
        }
        let id = line["span"]["id"].as_str();
        assert!(id.is_some_and(|id| !id.is_empty()), "a line without a request id: {line}");
        let (trace, span) = (line["span"]["trace_id"].as_str(), line["span"]["span_id"].as_str());
        assert!(trace.is_some_and(|t| t.len() == 32) && span.is_some_and(|s| s.len() == 16), "{line}");
        if calls.iter().any(|call| Some(call.2) == id) {
            assert_eq!(trace, Some("4bf92f3577b34da6a3ce929d0e0e4736"), "{line}");
            assert_ne!(span, Some("00f067aa0ba902b7"), "the request's own span, not the caller's: {line}");
        }
    }
    let ids: Vec<&str> = ["req-register"].into_iter().chain(calls.iter().map(|c| c.2)).collect();
    for id in &ids {
        let answered = lines.iter().find(|l| l["span"]["id"] == *id && l["fields"]["message"] == "answered");
        let answered = answered.unwrap_or_else(|| panic!("no `answered` line for {id}"));
        assert!(answered["fields"]["status"].is_u64(), "{answered}");
    }
    assert!(
        lines
            .iter()
            .any(|l| l["span"]["id"] == "req-register" && l["fields"]["message"] == "route registered"),
        "the registration's own line carries its id"
    );
}

#[tokio::test]
async fn text_log_lines_of_a_request_name_its_id() {
    let dir = tempfile::TempDir::new().unwrap();
    let binary = Binary::start_with(dir.path(), &[("RECAST_LOG", "debug")]).await;
    let answer = send(Method::GET, &binary.url("/nowhere"), &[("x-request-id", "text-7")], "").await;
    assert_eq!(answer.status, 404);
    let line = binary.wait_for_line("request{id=text-7 trace_id=").expect("a line of the request");
    assert!(line.contains("answered") && line.contains("status=404"), "{line}");
    assert!(line.contains(" span_id="), "{line}");
}

/// A resolver that panics: a stand-in for a bug in a handler, since registration resolves the
/// upstream's host within the request's own task.
struct Panicking;

impl Lookup for Panicking {
    fn lookup(&self, host: &str) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>> {
        panic!("{DELIBERATE_PANIC}: resolving {host}");
    }
}

#[tokio::test]
async fn a_panic_in_a_handler_is_answered_500_counted_and_the_service_goes_on() {
    let allow: AllowList = "127.0.0.0/8".parse().unwrap();
    let outbound = Outbound { policy: Arc::new(OutboundPolicy::new(&allow)), lookup: Arc::new(Panicking) };
    let service = Service::start_with(config(), outbound).await;
    let before = metrics(&service).await;
    assert_eq!(sample(&before, r#"recast_panics_total{site="request"}"#), 0.0);
    for n in 1..=2 {
        let answer =
            post_json(&service.url("/v1/mapping"), registration("http://broken.test:9/", "", "")).await;
        answer.assert_problem(500, "internal-error");
        // The id the panic's log line carries, for the client to quote.
        assert!(answer.header("x-request-id").is_some_and(|id| !id.is_empty()), "a request id");
        let text = metrics(&service).await;
        assert_eq!(sample(&text, r#"recast_panics_total{site="request"}"#), f64::from(n), "{text}");
    }
    // The service goes on serving (the panics were caught on its workers, which stay up).
    assert_eq!(get(&service.url("/healthz")).await.status, 200);
    let text = metrics(&service).await;
    assert_eq!(sample(&text, r#"recast_panics_total{site="connection"}"#), 0.0, "{text}");
    service.stop().await;
}
