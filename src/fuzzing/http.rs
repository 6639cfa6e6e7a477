//! The HTTP fuzz body: arbitrary request bytes against the whole service, in this process.
//!
//! The service runs once per process on 127.0.0.1 with a real store in a temporary directory and
//! one stored route, whose upstream is a small server on 127.0.0.77. Its outbound policy allows
//! only 127.0.0.77 and resolves no names, so no input can make it connect anywhere else.
//!
//! A panic anywhere in the service fails the input twice over: the service counts every panic it
//! catches (`recast_panics_total`, read after each input), and a panic hook flags any panic on
//! the service's threads (`recast-*`: the workers, their blocking threads, the loaders, and this
//! harness's runtime, which runs the accept loop).

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use uuid::Uuid;

use crate::config::Config;
use crate::policy::{NoLookup, OutboundPolicy};
use crate::route::{Registration, Route};
use crate::secrets::Secret;
use crate::server::{Outbound, run_with};
use crate::storage::Store;

/// The stored route's public path.
pub const ROUTE_PATH: &str = "/v1/00000000-0000-4000-8000-000000000001/meals";
const ROUTE_UUID: Uuid = Uuid::from_u128(0x00000000_0000_4000_8000_000000000001);
const UPSTREAM_ANSWER: &str = r#"{"meals":[{"idMeal":"52772","strMeal":"Teriyaki","tags":null,"n":1.5e3}]}"#;
/// The harness's own runtime threads; the service names its threads `recast-…` too.
const THREAD_PREFIX: &str = "recast-fuzz";
/// The prefix of every thread that serves.
const SERVICE_THREADS: &str = "recast-";

/// Set when any thread of the service panics.
static PANICKED: AtomicBool = AtomicBool::new(false);

/// The start of a panic message that a test raises on purpose, in a service of its own in the same
/// process (whose threads have the same names): not a finding of this harness.
pub const DELIBERATE_PANIC: &str = "a deliberate panic";

/// What one input got back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HttpReached {
    /// The connection closed without an answer (hyper refused the bytes).
    Closed,
    /// The first answer's status class (2 for 2xx, ...).
    Answered(u16),
}

struct Harness {
    runtime: tokio::runtime::Runtime,
    addr: SocketAddr,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied());
            let deliberate = message.is_some_and(|m| m.starts_with(DELIBERATE_PANIC));
            if std::thread::current().name().is_some_and(|n| n.starts_with(SERVICE_THREADS)) && !deliberate {
                PANICKED.store(true, Ordering::SeqCst);
            }
            previous(info);
        }));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(THREAD_PREFIX)
            .enable_all()
            .build()
            .expect("a runtime");
        let addr = runtime.block_on(start());
        Harness { runtime, addr }
    })
}

async fn start() -> SocketAddr {
    let upstream = TcpListener::bind("127.0.0.77:0").await.expect("bind 127.0.0.77:0");
    let upstream_addr = upstream.local_addr().expect("upstream address");
    tokio::spawn(serve_upstream(upstream));

    remove_stale_dirs();
    let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let key = Secret::new("5a".repeat(32));
    let config = Config {
        data_dir: dir.clone(),
        secret_key: Some(key.clone()),
        upstream_timeout_ms: 2_000,
        upstream_connect_timeout_ms: 500,
        // Short: an input that leaves a head or a body unfinished waits for it.
        header_timeout_ms: 250,
        idle_timeout_ms: 2_000,
        max_request_bytes: 64 << 10,
        log: "off".to_owned(),
        ..Config::default()
    };
    let registration = format!(
        r#"{{"path":"meals","originalRoute":{{"originalApi":{{"baseUrl":"http://{upstream_addr}/"}},"path":"api?x=1","authHeader":{{"type":"Bearer","token":"t"}}}},"rulesAsString":{{"newBodyFields":{{"id":{{"key":"id","type":"Int"}},"name":{{"key":"name","type":"String"}}}},"oldBodyFields":{{"id":{{"keys":["idMeal"],"parents":["meals"]}},"name":{{"keys":["strMeal, tags"],"parents":["meals"]}}}}}}}}"#
    );
    let registration: Registration = serde_json::from_str(&registration).expect("the harness route parses");
    let route_config = registration.validate(false, None).expect("the harness route is valid");
    let route = Route::new(ROUTE_UUID, 1, 1, route_config, &config.limits());
    Store::open(&dir, Some(&key)).and_then(|store| store.put(&route.to_stored())).expect("the harness store");

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("service address");
    let outbound = Outbound {
        policy: std::sync::Arc::new(OutboundPolicy::only(&"127.0.0.77/32".parse().expect("a network"))),
        lookup: std::sync::Arc::new(NoLookup),
    };
    tokio::spawn(async move {
        if let Err(e) = run_with(listener, config, outbound, std::future::pending()).await {
            panic!("the harness service stopped: {e}");
        }
    });
    for _ in 0..500 {
        if exchange(addr, b"GET /readyz HTTP/1.1\r\nhost: f\r\n", Ending::Closing)
            .await
            .starts_with(b"HTTP/1.1 200")
        {
            return addr;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the harness service did not become ready");
}

const DIR_PREFIX: &str = "recast-fuzz-http-";

/// Removes the data directories of earlier harness processes that are gone.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(DIR_PREFIX) else { continue };
        if !std::path::Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

async fn serve_upstream(listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|_request| async {
                let mut response =
                    http::Response::new(Full::new(Bytes::from_static(UPSTREAM_ANSWER.as_bytes())));
                response
                    .headers_mut()
                    .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
                Ok::<_, std::convert::Infallible>(response)
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
        });
    }
}

/// How an input's connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The client closes its sending side after the bytes: a call still in flight then is
    /// dropped unanswered, as for a client that went away.
    HalfClose,
    /// The client sends `\r\n\r\n` (which ends a head left open) and a health check that asks
    /// to close, and keeps its side open: every request before it is answered.
    Closing,
}

/// The request [`Ending::Closing`] sends after an input.
const CLOSING: &[u8] = b"\r\n\r\nGET /healthz HTTP/1.1\r\nhost: f\r\nconnection: close\r\n\r\n";

/// Writes `bytes`, ends as `ending` says, and reads what comes back until the service closes
/// the connection (for up to five seconds).
async fn exchange(addr: SocketAddr, bytes: &[u8], ending: Ending) -> Vec<u8> {
    let Ok(mut stream) = TcpStream::connect(addr).await else { return Vec::new() };
    // The service may close early (a refused head); what it answered is still read.
    let _ = stream.write_all(bytes).await;
    match ending {
        Ending::HalfClose => {
            let _ = stream.shutdown().await;
        }
        Ending::Closing => {
            let _ = stream.write_all(CLOSING).await;
        }
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    answer
}

/// Arbitrary bytes sent to the service as one or more HTTP/1.x requests, the connection ended
/// by half-closing it when there is an even number of bytes and by a closing request otherwise
/// (see [`Ending`]). Checks: no panic, every answer is an HTTP/1.1 response, none is a 500, and
/// the service still answers.
pub fn http_request(data: &[u8]) -> HttpReached {
    let ending = if data.len().is_multiple_of(2) { Ending::HalfClose } else { Ending::Closing };
    http_request_ending(data, ending)
}

/// [`http_request`] with the ending given.
pub fn http_request_ending(data: &[u8], ending: Ending) -> HttpReached {
    let harness = harness();
    let answer = harness.runtime.block_on(exchange(harness.addr, data, ending));
    assert!(!PANICKED.load(Ordering::SeqCst), "a thread of the service panicked");
    // Every input, answered or not: the service still answers, and caught no panic.
    let metrics = harness.runtime.block_on(exchange(
        harness.addr,
        b"GET /metrics HTTP/1.1\r\nhost: f\r\n",
        Ending::Closing,
    ));
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(metrics.starts_with("HTTP/1.1 200"), "the service stopped answering: {metrics}");
    let panics: Vec<&str> = metrics
        .lines()
        .filter(|line| line.starts_with("recast_panics_total{") && !line.ends_with(" 0"))
        .collect();
    assert!(panics.is_empty(), "the service caught panics: {panics:?}");
    if answer.is_empty() {
        return HttpReached::Closed;
    }
    assert!(
        answer.starts_with(b"HTTP/1.1 ") || answer.starts_with(b"HTTP/1.0 "),
        "not an HTTP answer: {}",
        String::from_utf8_lossy(&answer)
    );
    // Bodies are JSON with escaped control characters, so every line that begins with
    // `HTTP/1.` is a status line.
    for line in answer.split(|&b| b == b'\n') {
        let status = line.strip_prefix(b"HTTP/1.1 ").or_else(|| line.strip_prefix(b"HTTP/1.0 "));
        assert!(
            !status.is_some_and(|s| s.starts_with(b"500")),
            "a 500: {}",
            String::from_utf8_lossy(&answer)
        );
    }
    let class = answer.get(9).map_or(0, |d| u16::from(d.wrapping_sub(b'0')));
    HttpReached::Answered(class)
}
