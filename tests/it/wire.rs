//! The upstream client's HTTP/1.1 against raw TCP servers on 127.0.0.1: body framings (length in
//! pieces, chunked with extensions and trailers, up to the close), interim answers, keep-alive
//! and `Connection: close`, and a pooled connection the upstream closed while it was idle.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use recast::policy::{AllowList, OutboundPolicy, SystemLookup};
use recast::upstream::UpstreamRequest;
use recast::upstream::{UpstreamClient, UpstreamError, UpstreamSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What a scripted upstream does with one request on a connection.
enum Step {
    /// Write these pieces, pausing briefly between them, and keep the connection.
    Send(Vec<Vec<u8>>),
    /// Write these bytes and close.
    SendAndClose(Vec<u8>),
}

/// A TCP server that answers the `n`-th request it reads (over all connections) with
/// `script(n)`, and records each request head and body.
struct Scripted {
    url: String,
    connections: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
    /// Requests whose scripted answer has been written whole.
    answered: Arc<AtomicUsize>,
}

impl Scripted {
    async fn start(script: impl Fn(usize) -> Step + Send + Sync + 'static) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/data?x=1", listener.local_addr().unwrap());
        let (connections, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::new())));
        let answered = Arc::new(AtomicUsize::new(0));
        let (opened, seen, written, script) =
            (connections.clone(), requests.clone(), answered.clone(), Arc::new(script));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                opened.fetch_add(1, Ordering::SeqCst);
                let (seen, written, script) = (seen.clone(), written.clone(), script.clone());
                tokio::spawn(serve(stream, seen, written, script));
            }
        });
        Scripted { url, connections, requests, answered }
    }

    /// Waits until the answers to `n` requests have been written whole.
    async fn answered(&self, n: usize) {
        crate::support::reached(&self.answered, n, "the upstream did not finish writing").await;
    }
}

async fn serve(
    mut stream: TcpStream,
    seen: Arc<Mutex<Vec<String>>>,
    written: Arc<AtomicUsize>,
    script: Arc<impl Fn(usize) -> Step + Send + Sync + 'static>,
) {
    loop {
        let Some(request) = read_request(&mut stream).await else { return };
        let n = {
            let mut seen = seen.lock().unwrap();
            seen.push(request);
            seen.len() - 1
        };
        match script(n) {
            Step::Send(pieces) => {
                for piece in pieces {
                    if stream.write_all(&piece).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                written.fetch_add(1, Ordering::SeqCst);
            }
            Step::SendAndClose(bytes) => {
                let _ = stream.write_all(&bytes).await;
                return;
            }
        }
    }
}

/// A request head and its `Content-Length` body, or `None` at the end of the stream.
async fn read_request(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let length = text
        .lines()
        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_owned))
        .map_or(0, |n| n.trim().parse().unwrap());
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.ok()?;
    Some(text + &String::from_utf8_lossy(&body))
}

fn client() -> UpstreamClient {
    let settings = UpstreamSettings {
        connect_timeout: Duration::from_secs(2),
        total_timeout: Duration::from_secs(5),
        max_body: 1000,
        compression: true,
        workers: 1,
        breaker: recast::config::Config::default().upstream().breaker,
        http2: true,
    };
    let allow: AllowList = "127.0.0.1/32".parse().unwrap();
    UpstreamClient::new(settings, Arc::new(OutboundPolicy::new(&allow)), Arc::new(SystemLookup))
}

fn request(method: Method, url: &str, body: &str) -> UpstreamRequest {
    UpstreamRequest {
        method,
        uri: url.parse().unwrap(),
        headers: HeaderMap::new(),
        body: Bytes::from(body.to_owned()),
    }
}

fn get(url: &str) -> UpstreamRequest {
    request(Method::GET, url, "")
}

fn ok(head: &str, body: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\n{head}\r\n{body}").into_bytes()
}

#[tokio::test]
async fn bodies_are_read_by_each_framing_and_the_request_is_written_as_given() {
    let json = r#"{"meals":[{"idMeal":"1"}]}"#;
    let upstream = Scripted::start(move |n| match n {
        // Content-Length, the head and the body arriving in several pieces.
        0 => {
            let all = ok(&format!("content-length: {}\r\n", json.len()), json);
            Step::Send(all.chunks(7).map(<[u8]>::to_vec).collect())
        }
        // Chunked, with a chunk extension and a trailer, split across reads.
        1 => Step::Send(vec![
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\n{\"mea".to_vec(),
            b"\r\n15\r\nls\":[{\"idMeal\":\"1\"}]}\r".to_vec(),
            b"\n0\r\nx-trailer: yes\r\n\r\n".to_vec(),
        ]),
        // An interim answer before the real one.
        2 => Step::Send(vec![
            b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n".to_vec(),
            ok(&format!("content-length: {}\r\n", json.len()), json),
        ]),
        // No length: the body ends at the close.
        _ => Step::SendAndClose(ok("", json)),
    })
    .await;
    let client = client();
    for n in 0..4 {
        let answer = client.call(get(&upstream.url)).await.unwrap_or_else(|e| panic!("answer {n}: {e}"));
        assert_eq!(answer.status, StatusCode::OK, "answer {n}");
        assert_eq!(answer.body, json.as_bytes(), "answer {n}");
        assert!(answer.body.capacity() - answer.body.len() >= recast::json::PADDING, "answer {n}");
    }
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 1, "one kept-alive connection for all four");

    let port = upstream.url.split(['/', ':']).nth(4).unwrap().to_owned();
    let sent = client.call(request(Method::POST, &upstream.url, r#"{"q":1}"#)).await;
    assert!(sent.is_ok(), "{sent:?}");
    let requests = upstream.requests.lock().unwrap();
    assert!(requests[0].starts_with("GET /data?x=1 HTTP/1.1\r\nhost: 127.0.0.1:"), "{}", requests[0]);
    assert!(requests[0].contains(&format!("host: 127.0.0.1:{port}\r\n")), "{}", requests[0]);
    assert!(!requests[0].to_ascii_lowercase().contains("content-length"), "{}", requests[0]);
    assert!(requests[4].starts_with("POST /data?x=1 HTTP/1.1\r\n"), "{}", requests[4]);
    assert!(requests[4].ends_with("content-length: 7\r\n\r\n{\"q\":1}"), "{}", requests[4]);
}

#[tokio::test]
async fn a_pooled_connection_closed_by_the_upstream_is_replaced_for_idempotent_requests_only() {
    // Each connection answers one request and then closes without saying so, as an upstream
    // whose keep-alive timeout passed would.
    let answer = ok("content-length: 2\r\n", "{}");
    let upstream = Scripted::start(move |_| Step::SendAndClose(answer.clone())).await;
    let client = client();
    for n in 0..3 {
        let answer = client.call(get(&upstream.url)).await.unwrap_or_else(|e| panic!("call {n}: {e}"));
        assert_eq!(answer.body, b"{}");
        // Let the close arrive, so some calls find it at checkout and some only when sending.
        if n == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 3, "a new connection for each call");

    // A pooled connection closed as the request goes out: the GET is sent again on a new one.
    let closing = Scripted::start(|n| match n {
        1 => Step::SendAndClose(Vec::new()),
        _ => Step::Send(vec![ok("content-length: 2\r\n", "{}")]),
    })
    .await;
    assert!(client.call(get(&closing.url)).await.is_ok());
    let answer = client.call(get(&closing.url)).await.expect("sent again on a new connection");
    assert_eq!(answer.body, b"{}");
    assert_eq!(closing.requests.lock().unwrap().len(), 3, "the second call was sent twice");
    assert_eq!(closing.connections.load(Ordering::SeqCst), 2);

    // An upstream that reads a request and closes without answering: a POST is not sent twice.
    let once = Scripted::start(|n| match n {
        0 => Step::Send(vec![ok("content-length: 2\r\n", "{}")]),
        _ => Step::SendAndClose(Vec::new()),
    })
    .await;
    assert!(client.call(get(&once.url)).await.is_ok());
    let error = client.call(request(Method::POST, &once.url, "{}")).await.unwrap_err();
    assert!(matches!(error, UpstreamError::Broken(_)), "{error:?}");
    assert_eq!(once.requests.lock().unwrap().len(), 2, "the POST was sent once");
}

#[tokio::test]
async fn connection_close_and_http_1_0_answers_are_not_reused() {
    let upstream = Scripted::start(|n| {
        let head = if n % 2 == 0 { "HTTP/1.1 200 OK\r\nconnection: close" } else { "HTTP/1.0 200 OK" };
        Step::Send(vec![format!("{head}\r\ncontent-length: 2\r\n\r\n{{}}").into_bytes()])
    })
    .await;
    let client = client();
    for _ in 0..4 {
        assert_eq!(client.call(get(&upstream.url)).await.unwrap().body, b"{}");
    }
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn malformed_or_oversized_answers_are_errors() {
    let cases = [
        ("not HTTP", b"hello there\r\n\r\n".to_vec(), "broken"),
        ("two lengths", ok("content-length: 2\r\ncontent-length: 3\r\n", "{}"), "broken"),
        ("bad chunk size", ok("transfer-encoding: chunked\r\n", "zz\r\n"), "broken"),
        ("chunks over the limit", ok("transfer-encoding: chunked\r\n", "3e9\r\n"), "too large"),
        ("length over the limit", ok("content-length: 1001\r\n", ""), "too large"),
        ("until close over the limit", ok("", &"x".repeat(5000)), "too large"),
        (
            "head too large",
            ok(&format!("x-big: {}\r\n", "y".repeat(70_000)), ""),
            "broken: the answer's head is larger",
        ),
        (
            "a flood of interim answers",
            ["HTTP/1.1 100 Continue\r\n\r\n".repeat(20).into_bytes(), ok("content-length: 2\r\n", "{}")]
                .concat(),
            "broken: more than 16 interim answers",
        ),
        (
            "a chunk size line without end",
            ok("transfer-encoding: chunked\r\n", &format!("1;{}", "a".repeat(5000))),
            "broken: a chunk size line is too long",
        ),
        ("an empty chunk size", ok("transfer-encoding: chunked\r\n", "\r\n\r\n"), "broken"),
        ("a signed length", ok("content-length: +2\r\n", "{}"), "broken"),
        (
            "endless trailers",
            ok("transfer-encoding: chunked\r\n", &format!("0\r\n{}", "x-t: v\r\n".repeat(10_000))),
            "broken: the answer's trailers are too large",
        ),
    ];
    let client = client();
    for (name, bytes, expected) in cases {
        let upstream = Scripted::start(move |_| Step::SendAndClose(bytes.clone())).await;
        let error = client.call(get(&upstream.url)).await.expect_err(name);
        let kind = match &error {
            UpstreamError::Broken(why) => format!("broken: {why}"),
            UpstreamError::TooLarge { limit: 1000 } => "too large".to_owned(),
            _ => "another error".to_owned(),
        };
        assert!(kind.starts_with(expected), "{name}: {error:?}");
    }
}

/// The answer each reuse case expects for its second call.
const SECOND: &str = r#"{"second":true}"#;

#[tokio::test]
async fn a_connection_whose_answer_leaves_bytes_behind_is_never_reused() {
    let second = ok(&format!("content-length: {}\r\n", SECOND.len()), SECOND);
    // What the upstream sends for the first call, in pieces (a pause between them), keeping the
    // connection open; each leaves bytes that are no answer to anything asked.
    let cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("a 204 with a body", vec![b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello".to_vec()]),
        (
            "a 204 whose announced body comes later",
            vec![b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n".to_vec(), b"hello".to_vec()],
        ),
        (
            "a 304 with a chunked body",
            vec![
                b"HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\n\r\n".to_vec(),
                b"5\r\nhello\r\n0\r\n\r\n".to_vec(),
            ],
        ),
        (
            "an unasked second answer after a Content-Length body",
            vec![ok("content-length: 2\r\n", "{}"), ok("content-length: 7\r\n", r#"{"x":1}"#)],
        ),
        (
            "an unasked second answer in the same write",
            vec![[ok("content-length: 2\r\n", "{}"), ok("content-length: 7\r\n", r#"{"x":1}"#)].concat()],
        ),
        (
            "Content-Length with Transfer-Encoding",
            vec![ok("content-length: 5\r\ntransfer-encoding: chunked\r\n", "2\r\n{}\r\n0\r\n\r\n")],
        ),
        (
            "a chunked body followed by extra bytes",
            vec![
                ok("transfer-encoding: chunked\r\n", "2\r\n{}\r\n0\r\n\r\n"),
                b"HTTP/1.1 200 OK\r\n\r\n".to_vec(),
            ],
        ),
        (
            "a chunked body with extra bytes in the same write",
            vec![ok("transfer-encoding: chunked\r\n", "2\r\n{}\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n\r\n")],
        ),
    ];
    let client = client();
    for (name, first) in cases {
        let second = second.clone();
        let upstream = Scripted::start(move |n| match n {
            0 => Step::Send(first.clone()),
            _ => Step::Send(vec![second.clone()]),
        })
        .await;
        let _ = client.call(get(&upstream.url)).await;
        // Whatever was left to come has been sent (on loopback, it is there to read).
        upstream.answered(1).await;
        let answer = client.call(get(&upstream.url)).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(answer.body, SECOND.as_bytes(), "{name}");
        assert_eq!(
            upstream.connections.load(Ordering::SeqCst),
            2,
            "{name}: not sent on the first connection"
        );
    }
}

/// An answer whose status has no body but whose headers announce one, with the announced bytes
/// held back until the next request arrives on that connection: the pool's look before reuse
/// finds nothing, so only the head itself can keep the connection out of the pool.
#[tokio::test]
async fn a_bodiless_status_announcing_a_body_keeps_its_connection_out_of_the_pool() {
    let cases: [(&str, &[u8], &[u8]); 2] = [
        ("a 204 with Content-Length", b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n", b"hello"),
        (
            "a 304 with Transfer-Encoding",
            b"HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\n\r\n",
            b"5\r\nhello\r\n0\r\n\r\n",
        ),
    ];
    let smuggled = ok("content-length: 17\r\n", r#"{"smuggled":true}"#);
    let second = ok(&format!("content-length: {}\r\n", SECOND.len()), SECOND);
    let client = client();
    for (name, head, held) in cases {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/data", listener.local_addr().unwrap());
        let (held, smuggled, second) = (held.to_vec(), smuggled.clone(), second.clone());
        let server = tokio::spawn(async move {
            let (mut first, _) = listener.accept().await.unwrap();
            read_request(&mut first).await.unwrap();
            first.write_all(head).await.unwrap();
            // The held bytes and an unasked answer go out only if the next request comes on
            // this connection; a new connection gets the real second answer. (The client closing
            // the first connection and opening another can both be ready at once.)
            let mut open = true;
            loop {
                tokio::select! {
                    biased;
                    accepted = listener.accept() => {
                        let (mut fresh, _) = accepted.unwrap();
                        read_request(&mut fresh).await.unwrap();
                        fresh.write_all(&second).await.unwrap();
                        return 2;
                    }
                    request = read_request(&mut first), if open => match request {
                        Some(_) => {
                            first.write_all(&[held.clone(), smuggled.clone()].concat()).await.unwrap();
                            return 1;
                        }
                        None => open = false,
                    },
                }
            }
        });
        let first = client.call(get(&url)).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(first.body.is_empty(), "{name}: a bodiless status has no body");
        let answer = client.call(get(&url)).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(answer.body, SECOND.as_bytes(), "{name}");
        assert_eq!(server.await.unwrap(), 2, "{name}: the second request went on the first connection");
    }
}

#[tokio::test]
async fn bare_line_feeds_in_chunk_sizes_and_codings_in_http_1_0_are_refused() {
    let cases = [
        ("a chunk size line ending in LF", ok("transfer-encoding: chunked\r\n", "2\n{}\r\n0\r\n\r\n")),
        ("a last chunk line ending in LF", ok("transfer-encoding: chunked\r\n", "2\r\n{}\r\n0\n\r\n")),
        ("an LF inside a chunk extension", ok("transfer-encoding: chunked\r\n", "2;a\nb\r\n{}\r\n0\r\n\r\n")),
        (
            "HTTP/1.0 with Transfer-Encoding",
            b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n".to_vec(),
        ),
        (
            "HTTP/1.0 with Transfer-Encoding and Content-Length",
            b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 2\r\n\r\n{}".to_vec(),
        ),
    ];
    let client = client();
    for (name, bytes) in cases {
        let upstream = Scripted::start(move |_| Step::SendAndClose(bytes.clone())).await;
        let error = client.call(get(&upstream.url)).await.expect_err(name);
        assert!(matches!(error, UpstreamError::Broken(_)), "{name}: {error:?}");
    }
}

#[tokio::test]
async fn a_body_at_the_limit_takes_the_limit_in_memory_not_twice() {
    // The client's limit is 1000 bytes.
    let full = "x".repeat(1000);
    let chunked: String = full
        .as_bytes()
        .chunks(7)
        .map(|c| format!("{:x}\r\n{}\r\n", c.len(), std::str::from_utf8(c).unwrap()))
        .collect();
    let (length, close, chunks) = (full.clone(), full.clone(), chunked.clone());
    let upstream = Scripted::start(move |n| match n {
        0 => Step::Send(ok("content-length: 1000\r\n", &length).chunks(100).map(<[u8]>::to_vec).collect()),
        1 => Step::Send(
            ok("transfer-encoding: chunked\r\n", &format!("{chunks}0\r\n\r\n"))
                .chunks(50)
                .map(<[u8]>::to_vec)
                .collect(),
        ),
        _ => Step::SendAndClose(ok("", &close)),
    })
    .await;
    let client = client();
    for framing in ["Content-Length", "chunked", "up to the close"] {
        let answer = client.call(get(&upstream.url)).await.unwrap_or_else(|e| panic!("{framing}: {e}"));
        assert_eq!(answer.body.len(), 1000, "{framing}");
        // The padding the parser needs, and for a body read to the close the byte that tells
        // whether it went past the limit.
        let most = 1000 + 1 + recast::json::PADDING;
        assert!(answer.body.capacity() <= most, "{framing}: {} bytes held for 1000", answer.body.capacity());
    }
}

#[tokio::test]
async fn requests_ask_for_the_codings_recast_decodes_or_identity_when_compression_is_off() {
    for (compression, asked) in
        [(true, "accept-encoding: gzip, br\r\n"), (false, "accept-encoding: identity\r\n")]
    {
        let upstream = Scripted::start(|_| Step::Send(vec![ok("content-length: 2\r\n", "{}")])).await;
        let mut request = get(&upstream.url);
        request.headers.insert("accept-encoding", "zstd".parse().unwrap());
        let client = UpstreamClient::new(
            UpstreamSettings { compression, ..client().settings() },
            Arc::new(OutboundPolicy::new(&"127.0.0.1/32".parse().unwrap())),
            Arc::new(SystemLookup),
        );
        client.call(request).await.unwrap();
        let sent = upstream.requests.lock().unwrap()[0].to_ascii_lowercase();
        assert_eq!(sent.matches("accept-encoding").count(), 1, "{sent}");
        assert!(sent.contains(asked), "{sent}");
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn br(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    brotli::BrotliCompress(&mut &bytes[..], &mut out, &brotli::enc::BrotliEncoderParams::default()).unwrap();
    out
}

/// An answer with `head` lines and a body of raw bytes.
fn raw_ok(head: &str, body: &[u8]) -> Vec<u8> {
    let mut all = format!("HTTP/1.1 200 OK\r\n{head}\r\n").into_bytes();
    all.extend_from_slice(body);
    all
}

/// `body` in chunks of `size` bytes, with the last chunk.
fn chunked(body: &[u8], size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in body.chunks(size) {
        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

#[tokio::test]
async fn gzip_and_br_bodies_are_decoded_in_every_framing_and_the_connection_is_kept() {
    let json: String = format!(
        "{{\"items\":[{}]}}",
        (0..300).map(|i| format!("{{\"n\":{i}}}")).collect::<Vec<_>>().join(",")
    );
    let codings: [(&str, Vec<u8>); 3] =
        [("gzip", gzip(json.as_bytes())), ("x-gzip", gzip(json.as_bytes())), ("br", br(json.as_bytes()))];
    let answers: Vec<Step> = codings
        .iter()
        .flat_map(|(name, encoded)| {
            let length = raw_ok(
                &format!("content-encoding: {name}\r\ncontent-length: {}\r\n", encoded.len()),
                encoded,
            );
            let chunks = raw_ok(
                &format!("content-encoding: {name}\r\ntransfer-encoding: chunked\r\n"),
                &chunked(encoded, 100),
            );
            [
                // Content-Length, arriving in small pieces.
                Step::Send(length.chunks(50).map(<[u8]>::to_vec).collect()),
                Step::Send(vec![chunks]),
            ]
        })
        .collect();
    let count = answers.len();
    let answers = Mutex::new(answers.into_iter().map(Some).collect::<Vec<_>>());
    let upstream = Scripted::start(move |n| answers.lock().unwrap()[n].take().unwrap()).await;
    let client = client_with_limit(1 << 20);
    for n in 0..count {
        let answer = client.call(get(&upstream.url)).await.unwrap_or_else(|e| panic!("answer {n}: {e}"));
        assert_eq!(String::from_utf8_lossy(&answer.body), json, "answer {n}");
        assert!(answer.body.capacity() - answer.body.len() >= recast::json::PADDING, "answer {n}");
    }
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 1, "one kept-alive connection for all");

    // Up to the close.
    let encoded = br(json.as_bytes());
    let upstream =
        Scripted::start(move |_| Step::SendAndClose(raw_ok("content-encoding: br\r\n", &encoded))).await;
    let answer = client.call(get(&upstream.url)).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&answer.body), json);
}

#[tokio::test]
async fn coded_bodies_are_limited_on_their_decoded_size() {
    let body = vec![b' '; 5000];
    let encoded = gzip(&body);
    assert!(encoded.len() < 1000, "{} bytes", encoded.len());
    let head = format!("content-encoding: gzip\r\ncontent-length: {}\r\n", encoded.len());
    let upstream = Scripted::start(move |_| Step::Send(vec![raw_ok(&head, &encoded)])).await;
    // The client's limit is 1000 bytes: under it on the wire, over it decoded.
    let failed = client().call(get(&upstream.url)).await.unwrap_err();
    assert_eq!(failed, UpstreamError::TooLarge { limit: 1000 });
    let answer = client_with_limit(5000).call(get(&upstream.url)).await.unwrap();
    assert_eq!(answer.body, body);
}

#[tokio::test]
async fn unknown_or_broken_codings_fail_a_2xx_answer_with_their_name_but_not_an_error_status() {
    let json = r#"{"a":1}"#;
    let not_gzip =
        raw_ok(&format!("content-encoding: gzip\r\ncontent-length: {}\r\n", json.len()), json.as_bytes());
    let upstream = Scripted::start(move |n| match n {
        0 => Step::Send(vec![ok(
            &format!("content-encoding: zstd\r\ncontent-length: {}\r\n", json.len()),
            json,
        )]),
        1 => Step::Send(vec![ok(
            &format!("content-encoding: gzip\r\ncontent-encoding: br\r\ncontent-length: {}\r\n", json.len()),
            json,
        )]),
        2 => Step::Send(vec![not_gzip.clone()]),
        // An error status in an unknown coding: its body is never read, the status is what counts.
        _ => Step::Send(vec![
            format!(
                "HTTP/1.1 404 Not Found\r\ncontent-encoding: zstd\r\ncontent-length: {}\r\n\r\n{json}",
                json.len()
            )
            .into_bytes(),
        ]),
    })
    .await;
    let client = client();
    let failed = client.call(get(&upstream.url)).await.unwrap_err();
    assert!(matches!(&failed, UpstreamError::Coding(why) if why.contains("`zstd`")), "{failed:?}");
    let failed = client.call(get(&upstream.url)).await.unwrap_err();
    assert!(matches!(&failed, UpstreamError::Coding(why) if why.contains("`gzip, br`")), "{failed:?}");
    let failed = client.call(get(&upstream.url)).await.unwrap_err();
    assert!(
        matches!(&failed, UpstreamError::Coding(why) if why.contains("gzip body cannot be decoded")),
        "{failed:?}"
    );
    let answer = client.call(get(&upstream.url)).await.unwrap();
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
}

fn client_with_limit(max_body: usize) -> UpstreamClient {
    UpstreamClient::new(
        UpstreamSettings { max_body, ..client().settings() },
        Arc::new(OutboundPolicy::new(&"127.0.0.1/32".parse().unwrap())),
        Arc::new(SystemLookup),
    )
}
