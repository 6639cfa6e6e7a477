//! The lane for route calls (`src/server/lane.rs`) on raw connections: its answers are the ones
//! hyper gives, pipelined calls are answered in order, a connection moves to hyper with the bytes
//! already read, heads that arrive a byte at a time or outgrow the lane's buffer are served, and
//! a call in flight at shutdown finishes before its connection closes.

use std::time::Duration;

use recast::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::routes::{MEALS, registered, registration};
use crate::support::{Reply, Service, Upstream, config};

/// One answer read off a connection.
#[derive(Debug)]
struct Raw {
    status_line: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn names(&self) -> Vec<&str> {
        self.headers.iter().map(|(n, _)| n.as_str()).collect()
    }
}

/// Splits everything a connection sent back into answers (each with a `content-length`).
fn answers(mut bytes: &[u8]) -> Vec<Raw> {
    let mut answers = Vec::new();
    while !bytes.is_empty() {
        let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").expect("a whole head") + 4;
        let head = String::from_utf8(bytes[..end - 4].to_vec()).unwrap();
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap().to_owned();
        let headers: Vec<(String, String)> = lines
            .map(|line| {
                let (name, value) = line.split_once(": ").unwrap();
                (name.to_owned(), value.to_owned())
            })
            .collect();
        let length: usize = headers.iter().find(|(n, _)| n == "content-length").unwrap().1.parse().unwrap();
        let body = String::from_utf8(bytes[end..end + length].to_vec()).unwrap();
        answers.push(Raw { status_line, headers, body });
        bytes = &bytes[end + length..];
    }
    answers
}

/// Writes `request` in pieces of `piece` bytes and reads until the service closes.
async fn exchange(service: &Service, request: &[u8], piece: usize) -> Vec<Raw> {
    let mut stream = TcpStream::connect(service.addr).await.unwrap();
    for part in request.chunks(piece) {
        stream.write_all(part).await.unwrap();
        if piece < request.len() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    read_all(&mut stream).await
}

/// Writes `request` on an open connection and reads until the service closes it.
async fn send_all(stream: &mut TcpStream, request: String) -> Vec<Raw> {
    stream.write_all(request.as_bytes()).await.unwrap();
    read_all(stream).await
}

/// Reads until the service closes the connection, and splits what came into answers.
async fn read_all(stream: &mut TcpStream) -> Vec<Raw> {
    let mut read = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut read))
        .await
        .expect("the service closes the connection")
        .unwrap();
    answers(&read)
}

fn call(path: &str, id: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: t\r\nx-request-id: {id}\r\n{extra}\r\n")
}

#[tokio::test]
async fn pipelined_calls_are_answered_in_order_in_the_lane_and_after_the_move_to_hyper() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    // Two calls for the lane, a health check that moves the connection to hyper with the rest of
    // the bytes already read, a call hyper serves, and one that asks to close.
    let request = [
        call(&path, "one", ""),
        call(&format!("{path}?x=1"), "two", "connection: keep-alive\r\n"),
        "GET /healthz HTTP/1.1\r\nhost: t\r\nx-request-id: three\r\n\r\n".to_owned(),
        call(&path, "four", ""),
        call(&path, "five", "connection: close\r\n"),
    ]
    .concat();
    let answers = exchange(&service, request.as_bytes(), request.len()).await;
    let ids: Vec<_> = answers.iter().map(|a| a.header("x-request-id").unwrap()).collect();
    assert_eq!(ids, ["one", "two", "three", "four", "five"]);
    for answer in &answers {
        assert_eq!(answer.status_line, "HTTP/1.1 200 OK", "{answer:?}");
    }
    // The lane's answers are hyper's: the same headers in the same order, the same body.
    let (lane, hyper) = (&answers[0], &answers[3]);
    assert_eq!(lane.names(), ["content-type", "server-timing", "x-request-id", "content-length", "date"]);
    assert_eq!(lane.names(), hyper.names());
    assert_eq!(lane.body, hyper.body);
    assert_eq!(lane.body, r#"{"id":52772,"name":"Teriyaki Chicken"}"#);
    assert_eq!(answers[1].body, lane.body);
    assert_eq!(upstream.received()[2].uri.query(), Some("x=1"), "the lane passed the query on");
    assert_eq!(answers[4].header("connection"), Some("close"));

    // A problem answered in the lane is hyper's problem too.
    let missing = format!("{path}-not");
    let request = [call(&missing, "lane", ""), call(&missing, "hyper", "connection: close\r\n")].concat();
    let answers = exchange(&service, request.as_bytes(), request.len()).await;
    assert_eq!(answers[0].status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(answers[0].body, answers[1].body);
    let mut hyper_names = answers[1].names();
    hyper_names.retain(|name| *name != "connection");
    assert_eq!(answers[0].names(), hyper_names);
    service.stop().await;
}

#[tokio::test]
async fn two_connections_on_a_two_worker_service_are_each_answered_in_full() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(Config { workers: Some(2), ..config() }).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    // Both open before either sends, and they send at once. Which worker takes which connection
    // is checked in `recast::workers`' own test; this checks that calls on two connections of a
    // two-worker service, each with its own upstream pool, are all answered, in order.
    let mut first = TcpStream::connect(service.addr).await.unwrap();
    let mut second = TcpStream::connect(service.addr).await.unwrap();
    let three = |name: &str| {
        [call(&path, name, ""), call(&path, name, ""), call(&path, name, "connection: close\r\n")].concat()
    };
    let (a, b) = tokio::join!(send_all(&mut first, three("a")), send_all(&mut second, three("b")));
    for (answers, id) in [(a, "a"), (b, "b")] {
        assert_eq!(answers.len(), 3);
        for answer in &answers {
            assert_eq!(answer.status_line, "HTTP/1.1 200 OK", "{answer:?}");
            assert_eq!(answer.header("x-request-id"), Some(id));
            assert_eq!(answer.body, r#"{"id":52772,"name":"Teriyaki Chicken"}"#);
        }
    }
    service.stop().await;
}

#[tokio::test]
async fn heads_a_byte_at_a_time_or_beyond_the_lane_buffer_are_served() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(Config { max_header_bytes: 64 << 10, ..config() }).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let request = [call(&path, "slow", ""), call(&path, "end", "connection: close\r\n")].concat();
    let answers = exchange(&service, request.as_bytes(), 1).await;
    assert_eq!(answers.len(), 2);
    assert!(answers.iter().all(|a| a.status_line == "HTTP/1.1 200 OK"), "{answers:?}");

    // 20 KB of headers: more than the lane reads, less than the limit.
    let big = call(&path, "big", &format!("x-big: {}\r\nconnection: close\r\n", "b".repeat(20 << 10)));
    let answers = exchange(&service, big.as_bytes(), 4096).await;
    assert_eq!(answers[0].status_line, "HTTP/1.1 200 OK", "{answers:?}");
    service.stop().await;

    // Beyond the limit: 431 from hyper, as for any other path.
    let service = Service::start(Config { max_header_bytes: 4096, ..config() }).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let big = call(&path, "big", &format!("x-big: {}\r\nconnection: close\r\n", "b".repeat(5000)));
    let mut stream = TcpStream::connect(service.addr).await.unwrap();
    stream.write_all(big.as_bytes()).await.unwrap();
    let mut read = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut read)).await;
    let read = String::from_utf8_lossy(&read);
    assert!(read.starts_with("HTTP/1.1 431 "), "{read}");
    service.stop().await;
}

#[tokio::test]
async fn a_call_in_flight_at_shutdown_is_answered_and_its_connection_closed() {
    let upstream =
        Upstream::start(|_| Reply { delay: Duration::from_millis(400), ..Reply::json(MEALS) }).await;
    let service = Service::start(config()).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let mut stream = TcpStream::connect(service.addr).await.unwrap();
    stream.write_all(call(&path, "late", "").as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopping = tokio::spawn(service.stop());
    let mut read = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut read))
        .await
        .expect("the connection closes after its answer")
        .unwrap();
    let answers = answers(&read);
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].status_line, "HTTP/1.1 200 OK");
    assert_eq!(answers[0].header("x-request-id"), Some("late"));
    assert_eq!(answers[0].header("connection"), Some("close"), "the answer says the connection closes");
    tokio::time::timeout(Duration::from_secs(10), stopping).await.expect("stops").unwrap();
}
