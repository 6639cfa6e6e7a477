//! The server as a whole: routing, health and readiness, and draining on shutdown.

use std::time::Duration;

use http::Method;
use recast::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{Service, send};

#[tokio::test]
async fn health_readiness_and_unknown_paths() {
    let service = Service::start(Config::default()).await;
    let health = send(Method::GET, &service.url("/healthz"), &[], "").await;
    assert_eq!((health.status.as_u16(), &health.body[..]), (200, &br#"{"status":"ok"}"#[..]));
    let ready = send(Method::GET, &service.url("/readyz"), &[], "").await;
    assert_eq!((ready.status.as_u16(), &ready.body[..]), (200, &br#"{"status":"running"}"#[..]));

    let missing = send(Method::GET, &service.url("/nothing/here"), &[], "").await;
    let problem = missing.assert_problem(404, "not-found");
    assert_eq!(problem.get("instance").and_then(|i| i.as_str()), Some("/nothing/here"));
    assert!(missing.header("x-request-id").is_some());

    let wrong = send(Method::GET, &service.url("/v1/preview"), &[], "").await;
    wrong.assert_problem(405, "method-not-allowed");
    assert_eq!(wrong.header("allow"), Some("POST"));
    let wrong = send(Method::DELETE, &service.url("/healthz"), &[], "").await;
    wrong.assert_problem(405, "method-not-allowed");
    assert_eq!(wrong.header("allow"), Some("GET"));
    service.stop().await;
}

/// Sends a preview request's head and the first half of its body, leaving the rest for later.
async fn half_sent_request(service: &Service) -> (TcpStream, &'static [u8]) {
    const BODY: &str = r#"{"originalResponse":{"a":"1"},"mappingRules":{"newBodyFields":{"a":{"key":"a","type":"Int"}},"oldBodyFields":{"a":{"keys":["a"]}}}}"#;
    let mut stream = TcpStream::connect(service.addr).await.expect("connect");
    let head = format!(
        "POST /v1/preview HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        BODY.len()
    );
    let (first, rest) = BODY.as_bytes().split_at(BODY.len() / 2);
    stream.write_all(head.as_bytes()).await.expect("write head");
    stream.write_all(first).await.expect("write half the body");
    (stream, rest)
}

#[tokio::test]
async fn shutdown_lets_a_request_in_flight_finish_and_refuses_new_connections() {
    let service = Service::start(Config::default()).await;
    let addr = service.addr;
    let (mut stream, rest) = half_sent_request(&service).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stopping = tokio::spawn(service.stop());

    let mut refused = false;
    for _ in 0..100 {
        if TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "new connections are still accepted while stopping");

    stream.write_all(rest).await.expect("write the rest");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read the answer");
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with(r#"{"a":1}"#), "{answer}");
    tokio::time::timeout(Duration::from_secs(10), stopping).await.expect("stops").expect("stop task");
}

// Real time, not tokio's paused clock: opening and loading the store run on blocking threads,
// which a paused clock would race past.
#[tokio::test]
async fn shutdown_closes_what_is_left_after_the_grace_period() {
    let service = Service::start(Config { shutdown_grace_ms: 200, ..Config::default() }).await;
    let (mut stream, _never_sent) = half_sent_request(&service).await;
    // Let the request reach the handler, so the connection is busy, not idle.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(10), service.stop())
        .await
        .expect("run returns after the grace period");
    assert!(started.elapsed() >= Duration::from_millis(200), "it waited for the grace period");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "the cut connection gets no answer: {read:?} {answer:?}");
}
