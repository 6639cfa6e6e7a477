//! HTTP edges on raw connections, for the lane and for hyper alike: requests with bodies or
//! conflicting framing get one answer each and never a smuggled second; the same bytes get the
//! same answers whether the lane or hyper reads them; a pipelined head that stalls while a call
//! is in flight is cut off by the head timeout; and a client that goes away during a call frees
//! its in-flight place at once and is not counted.

use std::sync::atomic::Ordering;
use std::time::Duration;

use recast::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::routes::{MEALS, registered, registration};
use crate::support::{Held, PATIENCE, Service, Upstream, config, get};

/// The mapped answer of [`MEALS`] under the routes' rules.
const MAPPED: &str = r#"{"id":52772,"name":"Teriyaki Chicken"}"#;

/// Everything a connection sends back until the service closes it, or `None` if it stays open
/// for [`PATIENCE`].
async fn until_closed(stream: &mut TcpStream) -> Option<String> {
    let mut read = Vec::new();
    match tokio::time::timeout(PATIENCE, stream.read_to_end(&mut read)).await {
        Ok(_) => Some(String::from_utf8_lossy(&read).into_owned()),
        Err(_) => None,
    }
}

/// The status lines in what a connection sent back (bodies here are JSON without line breaks).
fn status_lines(answers: &str) -> Vec<&str> {
    answers.split("\r\n").filter(|line| line.starts_with("HTTP/1.")).collect()
}

/// The answers a connection gets for `bytes`, as status line and body each, with the headers that
/// differ from request to request (`date`, `server-timing`, `x-request-id`) left out.
async fn answers_to(service: &Service, bytes: &[u8]) -> Vec<(String, String)> {
    let mut stream = TcpStream::connect(service.addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let text = until_closed(&mut stream).await.expect("the service closes the connection");
    let mut answers = Vec::new();
    let mut rest = text.as_str();
    while let Some(end) = rest.find("\r\n\r\n") {
        let head = &rest[..end];
        let length: usize = head
            .lines()
            .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_owned))
            .map_or(0, |n| n.trim().parse().unwrap());
        let body = &rest[end + 4..(end + 4 + length).min(rest.len())];
        answers.push((head.lines().next().unwrap_or_default().to_owned(), body.to_owned()));
        rest = &rest[(end + 4 + length).min(rest.len())..];
    }
    answers
}

/// `request` (a head without a body) asking to close the connection after its answer.
fn close(request: &str) -> String {
    request.replacen("\r\n\r\n", "\r\nconnection: close\r\n\r\n", 1)
}

/// Requests whose framing a gateway must not get wrong, each with `connection: close`, so the
/// connection ends after exactly the answers it was due. The body of the first is itself a whole
/// request for `path`: answering it would be a smuggled second answer.
fn framing_cases(path: &str) -> Vec<(&'static str, String, usize)> {
    let inner = format!("GET {path} HTTP/1.1\r\nhost: t\r\n\r\n");
    vec![
        (
            "a GET whose Content-Length body is a request",
            format!(
                "GET {path} HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{inner}",
                inner.len()
            ),
            1,
        ),
        (
            "a GET with a chunked body that is a request",
            format!(
                "GET {path} HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{inner}\r\n0\r\n\r\n",
                inner.len()
            ),
            1,
        ),
        (
            "Content-Length: 0 with Transfer-Encoding: chunked",
            format!(
                "GET {path} HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{inner}\r\n0\r\n\r\n",
                inner.len()
            ),
            1,
        ),
        (
            "two different Content-Lengths",
            format!(
                "GET {path} HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{inner}",
                inner.len()
            ),
            1,
        ),
        (
            "two equal Content-Lengths of 0, then a pipelined call",
            format!(
                "GET {path} HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\ncontent-length: 0\r\n\r\n{}",
                close(&inner)
            ),
            2,
        ),
        ("a plain call, then a call that closes", format!("{inner}{}", close(&inner)), 2),
    ]
}

#[tokio::test]
async fn bodies_and_conflicting_framing_get_one_answer_each_never_a_smuggled_one() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    for (name, bytes, due) in framing_cases(&path) {
        let calls_before = upstream.received().len();
        let answers = answers_to(&service, bytes.as_bytes()).await;
        assert_eq!(answers.len(), due, "{name}: {} answers for {due}: {answers:?}", answers.len());
        // Whatever the verdict on a doubtful framing (a call, or 400), no more upstream calls
        // than answers; requests framed well (two of them) are both served.
        let calls = upstream.received().len() - calls_before;
        assert!(calls <= answers.len(), "{name}: {calls} upstream calls for {} answers", answers.len());
        for (status, body) in &answers {
            let served = status == "HTTP/1.1 200 OK" && body == MAPPED;
            assert!(served || due == 1 && status.starts_with("HTTP/1.1 400 "), "{name}: {status} {body}");
        }
    }
    service.stop().await;
}

#[tokio::test]
async fn the_same_bytes_get_the_same_answers_from_the_lane_and_from_hyper() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    // A health check first sends the connection to hyper before the bytes under test arrive.
    let to_hyper = "GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n";
    let mut cases = framing_cases(&path);
    for (name, bytes) in [
        ("a route call", format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")),
        (
            "a call to an unknown route",
            format!("GET {path}x HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n"),
        ),
        ("a call with a query", format!("GET {path}?a=1&b HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")),
        (
            "an Expect header",
            format!("GET {path} HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n"),
        ),
        ("HTTP/1.0", format!("GET {path} HTTP/1.0\r\nhost: t\r\n\r\n")),
        ("a header without a colon", format!("GET {path} HTTP/1.1\r\nhost t\r\n\r\n")),
        ("a bare LF line end", format!("GET {path} HTTP/1.1\nhost: t\nconnection: close\n\n")),
        (
            "leading empty lines",
            format!("\r\n\r\nGET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n"),
        ),
        ("a space before a colon", format!("GET {path} HTTP/1.1\r\nhost : t\r\nconnection: close\r\n\r\n")),
        (
            "a folded header",
            format!("GET {path} HTTP/1.1\r\nhost: t\r\nx-a: 1\r\n 2\r\nconnection: close\r\n\r\n"),
        ),
    ] {
        cases.push((name, bytes, 1));
    }
    for (name, bytes, _) in cases {
        let lane = answers_to(&service, bytes.as_bytes()).await;
        let hyper = answers_to(&service, format!("{to_hyper}{bytes}").as_bytes()).await;
        assert_eq!(hyper.first().map(|(status, _)| status.as_str()), Some("HTTP/1.1 200 OK"), "{name}");
        assert_eq!(lane, hyper[1..], "{name}: the lane answered {lane:?}, hyper {:?}", &hyper[1..]);
    }
    service.stop().await;
}

/// Routes to `held` for the lane (`GET`) and for hyper (`POST`, which the lane hands on), as
/// `(name, path, request with the query `hold`)`.
async fn held_routes(service: &Service, held: &Held) -> Vec<(&'static str, String, String)> {
    let get = registered(service, &registration(&held.url, "", ""), &[]).await;
    let post = registered(service, &registration(&held.url, "", r#","method":"POST""#), &[]).await;
    vec![
        ("lane", get.clone(), format!("GET {get}?hold HTTP/1.1\r\nhost: t\r\n\r\n")),
        (
            "hyper",
            post.clone(),
            format!("POST {post}?hold HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{{}}"),
        ),
    ]
}

#[tokio::test]
async fn a_head_that_stalls_behind_a_call_in_flight_is_cut_off_by_the_head_timeout() {
    let held = Held::start(MEALS).await;
    // The idle timeout is far beyond `PATIENCE`: a connection closed within it was closed by the
    // head timeout.
    let service =
        Service::start(Config { header_timeout_ms: 300, idle_timeout_ms: 600_000, ..config() }).await;
    let routes = held_routes(&service, &held).await;
    let partial = "GET /healthz HTTP/1.1\r\nhost:";
    let mut arrived = 0;
    for (name, _, call) in &routes {
        for with_the_call in [true, false] {
            let case = if with_the_call { "read with the call" } else { "sent while it is in flight" };
            let mut stream = TcpStream::connect(service.addr).await.unwrap();
            if with_the_call {
                stream.write_all(format!("{call}{partial}").as_bytes()).await.unwrap();
                arrived += 1;
                held.arrived(arrived).await;
            } else {
                stream.write_all(call.as_bytes()).await.unwrap();
                arrived += 1;
                held.arrived(arrived).await;
                stream.write_all(partial.as_bytes()).await.unwrap();
                // Long enough past the head timeout that a clock started by these bytes is due
                // when the call ends.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let before = timeouts(&service).await;
            held.release();
            let answers = until_closed(&mut stream).await;
            let answers = answers.unwrap_or_else(|| panic!("{name}, {case}: still open after {PATIENCE:?}"));
            assert_eq!(status_lines(&answers), ["HTTP/1.1 200 OK"], "{name}, {case}: {answers}");
            // Closed by the head timeout, not the idle one nor anything else. The service counts
            // the timeout once the connection is gone, so the count may come just after the close.
            let after = timeouts_since(&service, before).await;
            assert_eq!(
                (after.0 - before.0, after.1 - before.1),
                (1, 0),
                "{name}, {case}: (head, idle) timeouts"
            );
            let _ = held.release.send(false);
        }
    }
    service.stop().await;
}

/// How many connections the head timeout and the idle timeout closed so far.
async fn timeouts(service: &Service) -> (u64, u64) {
    let text = String::from_utf8(get(&service.url("/metrics")).await.body.to_vec()).unwrap();
    let count = |timeout: &str| {
        let series = format!("recast_connections_timed_out_total{{timeout=\"{timeout}\"}} ");
        text.lines().find_map(|line| line.strip_prefix(&series)?.parse().ok()).expect("a timeout series")
    };
    (count("head"), count("idle"))
}

/// The timeout counts once either has moved since `before`, or as they are after [`PATIENCE`].
async fn timeouts_since(service: &Service, before: (u64, u64)) -> (u64, u64) {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let now = timeouts(service).await;
        if now != before || std::time::Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `recast_in_flight_requests` and the `route` series of `recast_requests_total`, read through
/// `/metrics` (whose own request is in flight while it answers).
async fn metrics(service: &Service, uuid: &str) -> (usize, Vec<String>) {
    let text = String::from_utf8(get(&service.url("/metrics")).await.body.to_vec()).unwrap();
    let in_flight = text
        .lines()
        .find_map(|line| line.strip_prefix("recast_in_flight_requests "))
        .and_then(|n| n.parse().ok())
        .expect("the in-flight gauge");
    let counted = text
        .lines()
        .filter(|line| line.starts_with(&format!("recast_requests_total{{route=\"{uuid}\"")))
        .map(str::to_owned)
        .collect();
    (in_flight, counted)
}

#[tokio::test]
async fn a_client_that_goes_away_during_a_call_frees_its_place_at_once_and_is_not_counted() {
    let held = Held::start(MEALS).await;
    let service = Service::start(config()).await;
    for (name, path, call) in held_routes(&service, &held).await {
        let uuid = &path[4..40];
        for how in ["closes", "closes its sending side"] {
            let mut stream = TcpStream::connect(service.addr).await.unwrap();
            stream.write_all(call.as_bytes()).await.unwrap();
            held.arrived(held.arrived.load(Ordering::SeqCst) + 1).await;
            assert_eq!(metrics(&service, uuid).await.0, 2, "{name}: the call and the scrape");
            if how == "closes" {
                drop(stream);
            } else {
                stream.shutdown().await.unwrap();
            }
            // The upstream still holds the call, so only the client's going can free its place.
            let deadline = tokio::time::Instant::now() + PATIENCE;
            while metrics(&service, uuid).await.0 != 1 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{name}: a client that {how} still holds its place"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        held.release();
        let (_, counted) = metrics(&service, uuid).await;
        assert!(counted.is_empty(), "{name}: calls whose client went away are not counted: {counted:?}");
        let _ = held.release.send(false);
    }
    service.stop().await;
}
