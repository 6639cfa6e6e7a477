//! The HTTP/2 upstream-answer fuzz body: arbitrary bytes make an HTTP/2 upstream's answer to one
//! call (its status, its headers, its data frames, trailers, a reset mid-body), then a second call
//! on the same connection must get exactly its own answer. The upstream is hyper's HTTP/2 server
//! on 127.0.0.1 in this process, spoken to with prior knowledge (h2c) by the service's own
//! [`UpstreamClient`]; what is fuzzed is recast's reading of the answer (the size bound, the
//! decoding, the caching headers, `Retry-After`) and its keeping of the connection.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use super::upstream::{AnswerReached, SECOND, client, get, judged};
use crate::upstream::{Outbound, UpstreamClient};

/// Splits the input into the header block and the data frames.
const SEPARATOR: u8 = 0xff;
/// The statuses the first byte picks from.
const STATUSES: [u16; 12] = [200, 200, 201, 204, 206, 301, 304, 400, 404, 429, 500, 503];

/// What the upstream answers to `/first`.
#[derive(Default, Clone)]
struct Script {
    status: u16,
    headers: Vec<(HeaderName, HeaderValue)>,
    frames: Vec<Bytes>,
    trailers: bool,
    reset: bool,
}

struct Harness {
    runtime: tokio::runtime::Runtime,
    client: UpstreamClient,
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    /// Takes SIGPIPE, which a vectored write to a connection the peer closed raises: a Rust
    /// program's `main` ignores it (as recast's does), libFuzzer's `main` does not.
    _pipe: tokio::signal::unix::Signal,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let script = Arc::new(Mutex::new(Script::default()));
        let (client, addr, pipe) = runtime.block_on(async {
            let pipe =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::pipe()).expect("SIGPIPE taken");
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
            let addr = listener.local_addr().expect("the upstream's address");
            tokio::spawn(serve(listener, script.clone()));
            let client = client(true);
            (client, addr, pipe)
        });
        Harness { runtime, client, addr, script, _pipe: pipe }
    })
}

type Body = StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::io::Error>>>>;

async fn serve(listener: TcpListener, script: Arc<Mutex<Script>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let script = script.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                let script = script.lock().unwrap_or_else(PoisonError::into_inner).clone();
                async move { Ok::<_, Infallible>(answer(request.uri().path(), script)) }
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer(path: &str, script: Script) -> Response<Body> {
    let mut frames: Vec<Result<Frame<Bytes>, std::io::Error>> = Vec::new();
    if path == "/second" {
        frames.push(Ok(Frame::data(Bytes::from_static(SECOND.as_bytes()))));
        let mut response = Response::new(StreamBody::new(futures_util::stream::iter(frames)));
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return response;
    }
    frames.extend(script.frames.into_iter().map(|data| Ok(Frame::data(data))));
    if script.reset {
        frames.push(Err(std::io::Error::other("reset by the script")));
    } else if script.trailers {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-trailer", HeaderValue::from_static("yes"));
        frames.push(Ok(Frame::trailers(trailers)));
    }
    let mut response = Response::new(StreamBody::new(futures_util::stream::iter(frames)));
    *response.status_mut() = StatusCode::from_u16(script.status).unwrap_or(StatusCode::OK);
    for (name, value) in script.headers {
        response.headers_mut().append(name, value);
    }
    response
}

/// Reads `data` as a script: byte 0 picks the status, byte 1's bits ask for trailers (1) or a
/// reset after the data (2); the rest, split at each `0xff`, is a header block (`name: value`
/// lines; lines that are no header are skipped) and then one data frame per piece. Checks:
/// nothing panics, and the call after it, on the same connection, gets exactly its own answer.
pub fn upstream_answer_h2(data: &[u8]) -> AnswerReached {
    let harness = harness();
    let status = STATUSES[usize::from(data.first().copied().unwrap_or(0)) % STATUSES.len()];
    let flags = data.get(1).copied().unwrap_or(0);
    let mut pieces = data.get(2..).unwrap_or_default().split(|&b| b == SEPARATOR);
    let headers = pieces
        .next()
        .unwrap_or_default()
        .split(|&b| b == b'\n')
        .filter_map(|line| {
            let colon = line.iter().position(|&b| b == b':')?;
            let name = HeaderName::from_bytes(&line[..colon]).ok()?;
            let value = HeaderValue::from_bytes(line[colon + 1..].trim_ascii()).ok()?;
            // Connection-specific headers are not HTTP/2's; the server refuses to send them.
            let forbidden =
                ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te"];
            (!forbidden.contains(&name.as_str())).then_some((name, value))
        })
        .collect();
    let frames = pieces.map(Bytes::copy_from_slice).collect();
    *harness.script.lock().unwrap_or_else(PoisonError::into_inner) =
        Script { status, headers, frames, trailers: flags & 1 == 1, reset: flags & 2 == 2 };
    let outbound = Outbound { h2c: true, ..Outbound::default() };
    let (first, second) = harness.runtime.block_on(async {
        let first = harness.client.call_with(&get(harness.addr, "/first"), &outbound).await;
        let second = harness.client.call_with(&get(harness.addr, "/second"), &outbound).await;
        (first, second)
    });
    judged(first, second)
}
