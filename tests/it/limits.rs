//! Admin authentication and the limits of SPEC §5: request head size and header count (431),
//! slow request heads, idle keep-alive connections, and the in-flight limit with its 503.

use std::time::Duration;

use http::Method;
use recast::config::Config;
use recast::secrets::Secret;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::routes::{MEALS, registered, registration};
use crate::support::{Held, PATIENCE, Service, Upstream, config, get, send};

const PREVIEW: &str = r#"{"originalResponse":{"a":"1"},"mappingRules":{"newBodyFields":{"a":{"key":"a","type":"Int"}},"oldBodyFields":{"a":{"keys":["a"]}}}}"#;

#[tokio::test]
async fn the_admin_token_guards_mapping_routes_and_metrics_and_nothing_else() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(Config { admin_token: Some(Secret::new("admin-7c1e")), ..config() }).await;
    let body = registration(&upstream.url("/"), "", "");
    let json = ("content-type", "application/json");
    let right = ("authorization", "Bearer admin-7c1e");

    for authorization in [
        None,
        Some("Bearer admin-7c1"),
        Some("Bearer admin-7c1ee"),
        Some("Basic admin-7c1e"),
        Some("admin-7c1e"),
    ] {
        let mut headers = vec![json];
        headers.extend(authorization.map(|a| ("authorization", a)));
        let answer = send(Method::POST, &service.url("/v1/mapping"), &headers, body.clone()).await;
        answer.assert_problem(401, "admin-token-required");
        assert_eq!(answer.header("www-authenticate"), Some(r#"Bearer realm="recast admin""#));
    }
    assert_eq!(upstream.connections(), 0, "refused registrations make no live call");

    let created = send(Method::POST, &service.url("/v1/mapping"), &[json, right], body.clone()).await;
    assert_eq!(created.status, 201);
    let path = created.json().get("path").and_then(|p| p.as_str()).unwrap().to_owned();
    let one = format!("/v1/routes/{}", &path[4..40]);
    let stats = format!("{one}/stats");
    for (method, at) in [
        (Method::GET, "/v1/routes"),
        (Method::GET, one.as_str()),
        (Method::GET, stats.as_str()),
        (Method::GET, "/v1/keys"),
        (Method::POST, "/v1/keys/reseal"),
        (Method::PUT, one.as_str()),
        (Method::DELETE, one.as_str()),
        (Method::GET, "/v1/routes/not-a-uuid"),
        (Method::PATCH, "/v1/mapping"),
        (Method::GET, "/metrics"),
    ] {
        let answer = send(method.clone(), &service.url(at), &[json], body.clone()).await;
        answer.assert_problem(401, "admin-token-required");
    }
    assert_eq!(get(&service.url(&one)).await.status, 401);
    let shown = send(Method::GET, &service.url(&one), &[right], "").await;
    assert_eq!(shown.status, 200);
    assert_eq!(send(Method::GET, &service.url(&stats), &[right], "").await.status, 200);
    assert_eq!(send(Method::GET, &service.url("/v1/keys"), &[right], "").await.status, 200);
    let metrics = send(Method::GET, &service.url("/metrics"), &[right], "").await;
    assert_eq!(metrics.status, 200);

    // Route calls, previews, health checks and the API description need no admin token.
    assert_eq!(get(&service.url(&path)).await.status, 200);
    assert_eq!(get(&service.url("/openapi.json")).await.status, 200);
    let preview = send(Method::POST, &service.url("/v1/preview"), &[json], PREVIEW).await;
    assert_eq!(preview.status, 200);
    assert_eq!(get(&service.url("/healthz")).await.status, 200);

    let deleted = send(Method::DELETE, &service.url(&one), &[right], "").await;
    assert_eq!(deleted.status, 204);
    service.stop().await;
}

#[test]
fn open_admin_endpoints_are_refused_beyond_loopback() {
    let open = Config::default();
    for listen in ["127.0.0.1:8080", "127.8.9.10:1", "[::1]:8080", "[::ffff:127.0.0.1]:80"] {
        assert_eq!(open.check_exposure(listen.parse().unwrap()), Ok(()), "{listen}");
    }
    for listen in [
        "0.0.0.0:8080",
        "[::]:8080",
        "192.0.2.10:8080",
        "10.0.0.1:80",
        "[2001:db8::1]:80",
        "[64:ff9b::7f00:1]:80",
        "[2002:7f00:1::1]:80",
    ] {
        let refused = open.check_exposure(listen.parse().unwrap()).unwrap_err();
        assert!(refused.contains("RECAST_ADMIN_TOKEN"), "{listen}: {refused}");
    }
    let guarded = Config { admin_token: Some(Secret::new("t")), ..Config::default() };
    assert_eq!(guarded.check_exposure("0.0.0.0:8080".parse().unwrap()), Ok(()));
    let empty = Config { admin_token: Some(Secret::new(" ")), ..Config::default() };
    assert!(empty.check_exposure("127.0.0.1:8080".parse().unwrap()).unwrap_err().contains("empty"));
}

/// Sends `request` on a fresh connection and returns everything the server sends back until it
/// closes (or five seconds pass).
async fn raw(service: &Service, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(service.addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn request_heads_over_the_limits_get_431() {
    let service =
        Service::start(Config { max_header_bytes: 4096, max_headers: 20, ..Config::default() }).await;
    let big = format!(
        "GET /healthz HTTP/1.1\r\nhost: t\r\nx-big: {}\r\nconnection: close\r\n\r\n",
        "a".repeat(5000)
    );
    let answer = raw(&service, big.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    let many: String = (0..30).map(|i| format!("x-h{i}: v\r\n")).collect();
    let many = format!("GET /healthz HTTP/1.1\r\nhost: t\r\n{many}connection: close\r\n\r\n");
    let answer = raw(&service, many.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    // Within the limits, the same request is served.
    let fine = raw(&service, b"GET /healthz HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").await;
    assert!(fine.starts_with("HTTP/1.1 200 "), "{fine}");
    service.stop().await;
}

// The timings below are the service's timeouts against waits at least twenty times longer, so a
// loaded machine cannot turn a pass into a failure; how exactly the deadlines are kept is pinned
// with tokio's paused clock in `server::connection`'s own tests.

#[tokio::test]
async fn a_client_that_never_finishes_its_head_is_cut_off() {
    // The idle timeout is far beyond the drip: only the head timeout can close the connection.
    let service =
        Service::start(Config { header_timeout_ms: 300, idle_timeout_ms: 600_000, ..Config::default() })
            .await;
    let mut slow = TcpStream::connect(service.addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\n").await.unwrap();
    let (mut reading, mut writing) = slow.split();
    // One more header line every 100 ms for a minute, never the blank line that ends the head.
    // Ends `true` when a write fails: the service closed the connection.
    let dripping = async {
        for i in 0..600 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if writing.write_all(format!("x-{i}: v\r\n").as_bytes()).await.is_err() {
                return true;
            }
        }
        false
    };
    let mut rest = Vec::new();
    let closed = tokio::select! {
        cut = dripping => cut,
        _ = reading.read_to_end(&mut rest) => true,
    };
    assert!(closed, "the slow head was still open after a minute");
    assert!(rest.is_empty(), "an unfinished head gets no answer: {}", String::from_utf8_lossy(&rest));
    // Meanwhile and afterwards the service answers others.
    assert_eq!(get(&service.url("/healthz")).await.status, 200);
    service.stop().await;
}

#[tokio::test]
async fn a_body_that_drips_gets_408_and_frees_its_place() {
    let service =
        Service::start(Config { header_timeout_ms: 300, max_inflight: 1, ..Config::default() }).await;
    let mut slow = TcpStream::connect(service.addr).await.unwrap();
    // White space after the document keeps it valid and makes the drip last a minute.
    let body = format!("{PREVIEW}{}", " ".repeat(600 - PREVIEW.len()));
    let head = format!(
        "POST /v1/preview HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut sent = 0;
    let mut buf = vec![0u8; 4096];
    for byte in body.bytes() {
        if slow.write_all(&[byte]).await.is_err() {
            break;
        }
        sent += 1;
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(100), slow.read(&mut buf)).await {
            answer.extend_from_slice(&buf[..n]);
            break;
        }
    }
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(answer.contains("body-timeout"), "{answer}");
    assert!(sent < body.len(), "answered only once the whole body was sent");
    // The one in-flight place is free again.
    let preview = send(Method::POST, &service.url("/v1/preview"), &[], PREVIEW).await;
    assert_eq!(preview.status, 200);
    service.stop().await;
}

/// Reads one answer's worth of bytes (the answers here fit one read).
async fn read_answer(stream: &mut TcpStream) -> String {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(PATIENCE, stream.read(&mut buf)).await.expect("answered").unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn an_idle_connection_is_timed_by_the_idle_timeout_not_the_head_timeout() {
    let service =
        Service::start(Config { header_timeout_ms: 200, idle_timeout_ms: 60_000, ..Config::default() }).await;
    let mut stream = TcpStream::connect(service.addr).await.unwrap();
    // Quiet for four head timeouts: still open, and the next request is served.
    tokio::time::sleep(Duration::from_millis(800)).await;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n").await.unwrap();
    let answer = read_answer(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    // Between requests too.
    tokio::time::sleep(Duration::from_millis(800)).await;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").await.unwrap();
    let answer = read_answer(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    service.stop().await;
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed_but_busy_ones_are_not() {
    let held = Held::start(MEALS).await;
    let service = Service::start(Config { idle_timeout_ms: 300, ..config() }).await;
    let path = registered(&service, &registration(&held.url, "", ""), &[]).await;

    // A call in flight for far longer than the idle timeout...
    let mut stream = TcpStream::connect(service.addr).await.unwrap();
    stream.write_all(format!("GET {path}?hold HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes()).await.unwrap();
    held.arrived(1).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    held.release();
    // ...is answered on its keep-alive connection...
    let answer = read_answer(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(!answer.to_ascii_lowercase().contains("connection: close"), "kept alive: {answer}");
    // ...and serves the next request on it...
    stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n").await.unwrap();
    let answer = read_answer(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "still open after the call: {answer}");
    // ...until it has been idle for the timeout.
    let mut rest = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut rest))
        .await
        .expect("the idle connection is closed")
        .unwrap();
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    service.stop().await;
}

#[tokio::test]
async fn above_the_in_flight_limit_calls_get_503_at_once_and_health_stays_up() {
    let held = Held::start(MEALS).await;
    let service = Service::start(Config { max_inflight: 2, ..config() }).await;
    let path = registered(&service, &registration(&held.url, "", ""), &[]).await;
    let url = service.url(&path);

    let slow: Vec<_> = (0..2)
        .map(|_| {
            let url = format!("{url}?hold");
            tokio::spawn(async move { get(&url).await })
        })
        .collect();
    held.arrived(2).await;
    // The two places stay taken until the upstream is released, so these answers did not wait
    // for one.
    let refused = get(&url).await;
    refused.assert_problem(503, "overloaded");
    assert_eq!(refused.header("retry-after"), Some("1"));
    // A route call's answer says what its steps took, here that none ran (SPEC §2.2).
    assert_eq!(refused.header("server-timing"), Some("upstream;dur=0.000, map;dur=0.000"));
    let preview = send(Method::POST, &service.url("/v1/preview"), &[], PREVIEW).await;
    preview.assert_problem(503, "overloaded");
    assert_eq!(get(&service.url("/healthz")).await.status, 200);
    assert_eq!(get(&service.url("/readyz")).await.status, 200);
    assert!(slow.iter().all(|call| !call.is_finished()), "the held calls are still in flight");

    held.release();
    for call in slow {
        assert_eq!(call.await.unwrap().status, 200);
    }
    assert_eq!(get(&url).await.status, 200, "places are freed when calls finish");
    service.stop().await;
}

#[test]
fn the_binary_will_not_listen_beyond_loopback_with_open_admin_endpoints() {
    let dir = tempfile::TempDir::new().unwrap();
    // 192.0.2.1 is a documentation address: the check refuses before any socket is made, and
    // if it did not, binding would fail rather than expose anything.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_recast"))
        .args(["serve", "--listen", "192.0.2.1:8080", "--data-dir"])
        .arg(dir.path())
        .env_remove("RECAST_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not a loopback address") && stderr.contains("RECAST_ADMIN_TOKEN"), "{stderr}");
    assert!(!stderr.contains("cannot listen"), "refused before binding: {stderr}");
}
