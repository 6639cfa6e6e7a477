//! The upstream-answer fuzz body: arbitrary bytes as an upstream's answer to one call, then a
//! second call to the same upstream, which must get exactly its own answer. Routes to one upstream
//! share its pooled connections, so whatever the first answer was (a body that does not end where
//! its head says, an unasked second answer, bytes after a chunked body), none of its bytes may
//! reach the next call.
//!
//! The upstream is a small server on 127.0.0.1 in this process; the client is the service's own
//! [`UpstreamClient`], allowed to reach only 127.0.0.1.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::policy::{AllowList, NoLookup, OutboundPolicy};
use crate::upstream::UpstreamRequest;
use crate::upstream::{Answer, UpstreamClient, UpstreamError, UpstreamSettings};

/// The second call's answer, the only one it may get.
pub(super) const SECOND: &str = r#"{"second":"call","n":2}"#;
/// Splits the input into the pieces the upstream writes one after another.
const SEPARATOR: u8 = 0xff;

/// How the first call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnswerReached {
    /// An answer, by status class (2 for 2xx, ...).
    Answered(u16),
    /// No answer: refused as malformed, too large, broken off or late.
    Failed,
}

/// What the upstream does with a call to `/first`.
struct Script {
    /// Which input this is, counted from 1.
    input: u64,
    pieces: Vec<Vec<u8>>,
    /// Close the connection after the pieces (else it waits for another request).
    close: bool,
}

struct Harness {
    runtime: tokio::runtime::Runtime,
    client: UpstreamClient,
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    /// The last input whose pieces the upstream has written whole.
    written: watch::Receiver<u64>,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let script = Arc::new(Mutex::new(Script { input: 0, pieces: Vec::new(), close: true }));
        let (wrote, written) = watch::channel(0);
        let (client, addr) = runtime.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
            let addr = listener.local_addr().expect("the upstream's address");
            tokio::spawn(serve_upstream(listener, script.clone(), Arc::new(wrote)));
            let client = client(false);
            (client, addr)
        });
        Harness { runtime, client, addr, script, written }
    })
}

/// The service's upstream client as the upstream fuzz bodies use it: 127.0.0.1 only, answers
/// bounded at 4096 bytes, no breaker (a breaker opened by failing answers would hide them).
pub(super) fn client(http2: bool) -> UpstreamClient {
    let settings = UpstreamSettings {
        connect_timeout: Duration::from_secs(1),
        total_timeout: Duration::from_secs(2),
        max_body: 4096,
        compression: true,
        workers: 1,
        breaker: crate::upstream::BreakerSettings { failures: 0, cooldown: Duration::from_secs(1) },
        http2,
    };
    let allow: AllowList = "127.0.0.1/32".parse().expect("a network");
    UpstreamClient::new(settings, Arc::new(OutboundPolicy::new(&allow)), Arc::new(NoLookup))
}

async fn serve_upstream(listener: TcpListener, script: Arc<Mutex<Script>>, wrote: Arc<watch::Sender<u64>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        tokio::spawn(connection(stream, script.clone(), wrote.clone()));
    }
}

/// Answers requests on one connection until it is closed, or no request comes for a moment.
async fn connection(mut stream: TcpStream, script: Arc<Mutex<Script>>, wrote: Arc<watch::Sender<u64>>) {
    let _ = stream.set_nodelay(true);
    loop {
        let Ok(Some(target)) =
            tokio::time::timeout(Duration::from_millis(50), request_target(&mut stream)).await
        else {
            return;
        };
        if target == "/second" {
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{SECOND}",
                SECOND.len()
            );
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        let (input, pieces, close) = {
            let script = script.lock().unwrap_or_else(PoisonError::into_inner);
            (script.input, script.pieces.clone(), script.close)
        };
        let mut delivered = true;
        for piece in pieces {
            if stream.write_all(&piece).await.is_err() || stream.flush().await.is_err() {
                delivered = false;
                break;
            }
            tokio::task::yield_now().await;
        }
        // On loopback, written bytes are in the client's socket once the write returns.
        wrote.send_replace(input);
        if close || !delivered {
            return;
        }
    }
}

/// Reads one request head and returns its target, or `None` when the client closed.
async fn request_target(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let line = head.split(|&b| b == b'\r').next()?;
    let target = line.split(|&b| b == b' ').nth(1)?;
    Some(String::from_utf8_lossy(target).into_owned())
}

pub(super) fn get(addr: SocketAddr, path: &str) -> UpstreamRequest {
    UpstreamRequest {
        method: Method::GET,
        uri: format!("http://{addr}{path}").parse().expect("a URL"),
        headers: HeaderMap::new(),
        body: Bytes::new(),
    }
}

/// The first input byte's low bit says whether the upstream closes after its answer; the rest,
/// split at each `0xff`, are the pieces it writes (one write each). Checks: nothing panics, and
/// the call after it, made once every piece has been written, gets exactly its own answer.
///
/// (Bytes an upstream sends later, unasked, while the next call is already on its way, cannot be
/// told from that call's answer by any HTTP/1.1 client; they are not part of this check.)
pub fn upstream_answer(data: &[u8]) -> AnswerReached {
    let harness = harness();
    let input = harness.script.lock().unwrap_or_else(PoisonError::into_inner).input + 1;
    let (close, rest) = match data.split_first() {
        Some((flags, rest)) => (flags & 1 == 1, rest),
        None => (true, data),
    };
    let pieces = rest.split(|&b| b == SEPARATOR).filter(|p| !p.is_empty()).map(<[u8]>::to_vec).collect();
    *harness.script.lock().unwrap_or_else(PoisonError::into_inner) = Script { input, pieces, close };
    let (first, second) = harness.runtime.block_on(async {
        let first = harness.client.call(get(harness.addr, "/first")).await;
        let mut written = harness.written.clone();
        // The upstream writes every piece (or finds the connection closed) within moments of
        // the request; without that the check below would prove less than it says.
        tokio::time::timeout(Duration::from_secs(1), written.wait_for(|&w| w >= input))
            .await
            .expect("the upstream wrote the first answer within a second")
            .expect("the upstream is running");
        let second = harness.client.call(get(harness.addr, "/second")).await;
        (first, second)
    });
    judged(first, second)
}

/// Checks that `second` is exactly the second call's answer; how `first` ended.
pub(super) fn judged(
    first: Result<Answer, UpstreamError>,
    second: Result<Answer, UpstreamError>,
) -> AnswerReached {
    match second {
        Ok(answer) => {
            assert_eq!(answer.status, StatusCode::OK, "the second call got another status");
            assert!(
                answer.body == SECOND.as_bytes(),
                "the second call got bytes that are not its answer: {}",
                String::from_utf8_lossy(&answer.body)
            );
        }
        Err(e) => panic!("the second call failed: {e}"),
    }
    match first {
        Ok(answer) => AnswerReached::Answered(answer.status.as_u16() / 100),
        Err(_) => AnswerReached::Failed,
    }
}
