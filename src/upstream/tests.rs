//! The upstream client against real servers on 127.0.0.1: the pool's resends on a server that
//! keeps every connection open, HTTP/2 connections shared by busy workers, and what routes that
//! came and went leave behind.

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{HeaderMap, Method};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::policy::{AllowList, SystemLookup};

/// A server that answers `{}` to every request and never closes a connection, also once the
/// client stops writing; with its counts of connections and requests.
async fn keeper() -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/x", listener.local_addr().unwrap());
    let (connections, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (accepted, answered) = (connections.clone(), requests.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            accepted.fetch_add(1, Ordering::SeqCst);
            let answered = answered.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut chunk = [0u8; 4096];
                    match stream.read(&mut chunk).await {
                        // Kept open: a connection the client stopped writing on stays readable.
                        Ok(0) | Err(_) => return std::future::pending::<()>().await,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    // Every request here has a head and a 2-byte body.
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        if buf.len() < end + 4 + 2 {
                            break;
                        }
                        buf.drain(..end + 4 + 2);
                        answered.fetch_add(1, Ordering::SeqCst);
                        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").await;
                    }
                }
            });
        }
    });
    (url, connections, requests)
}

fn client() -> UpstreamClient {
    let settings = UpstreamSettings {
        connect_timeout: Duration::from_secs(2),
        total_timeout: Duration::from_secs(5),
        max_body: 1000,
        compression: false,
        workers: 1,
        breaker: BreakerSettings { failures: 5, cooldown: Duration::from_secs(5) },
        http2: true,
    };
    let allow: AllowList = "127.0.0.1/32".parse().unwrap();
    UpstreamClient::new(settings, Arc::new(OutboundPolicy::new(&allow)), Arc::new(SystemLookup))
}

fn post(url: &str) -> UpstreamRequest {
    UpstreamRequest {
        method: Method::POST,
        uri: url.parse().unwrap(),
        headers: HeaderMap::new(),
        body: Bytes::from_static(b"{}"),
    }
}

#[tokio::test]
async fn a_post_whose_pooled_connection_takes_no_byte_is_sent_on_a_new_one() {
    let (url, connections, requests) = keeper().await;
    let client = client();
    assert_eq!(client.call(post(&url)).await.unwrap().body, b"{}");
    // The pooled connection still looks open (nothing came from the upstream), but it will not
    // take a byte: a write fails before anything goes out.
    let pool = client.pools.here();
    let key = Key::of(&url.parse().unwrap(), None).unwrap();
    let mut pooled = pool.take(&key, Instant::now()).expect("the connection was kept");
    pooled.stop_writing().await;
    assert!(pooled.is_open(), "the pool would hand it out");
    pool.put(key, pooled, Instant::now());

    let answer = client.call(post(&url)).await.expect("sent again on a new connection");
    assert_eq!(answer.body, b"{}");
    assert_eq!(requests.load(Ordering::SeqCst), 2, "the upstream received the POST once");
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_first_write_refused_on_a_plain_connection_is_known_to_have_sent_nothing() {
    let (url, _, requests) = keeper().await;
    let client = client();
    let connector = client.connector_for(None).unwrap();
    let (stream, _) = client.connect(connector, &url.parse().unwrap()).await.ok().expect("connected");
    let mut connection = wire::Connection::new(stream);
    connection.stop_writing().await;
    let bytes = wire::encode(&post(&url), Default::default(), false);
    let failed = connection.exchange(&bytes, false, 1000, false).await.expect_err("the send fails");
    assert!(matches!(failed, wire::Failed::Unsent(_)), "{failed:?}");
    assert_eq!(requests.load(Ordering::SeqCst), 0);
}

/// A runtime of one thread, driven on a thread of its own until the program ends.
fn runtime_thread() -> tokio::runtime::Handle {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let handle = runtime.handle().clone();
    std::thread::spawn(move || runtime.block_on(std::future::pending::<()>()));
    handle
}

/// An h2c server answering `{}`, on a thread of its own; its URL and its count of connections.
fn h2c_server() -> (String, Arc<AtomicUsize>) {
    let server = runtime_thread();
    let listener = server.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let url = format!("http://{}/x", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    server.spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            counted.fetch_add(1, Ordering::SeqCst);
            let service = hyper::service::service_fn(|_| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                    Bytes::from_static(b"{}"),
                )))
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    (url, accepted)
}

#[test]
fn an_http2_connection_serves_every_worker_while_the_one_that_opened_it_is_busy() {
    let (url, accepted) = h2c_server();
    // The service's runtime for the client's own tasks, and two workers.
    let client = client().with_tasks(Tasks::new(Arc::default()), runtime_thread());
    let first = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let second = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let outbound = Outbound { h2c: true, ..Outbound::default() };
    let get = || UpstreamRequest { method: Method::GET, ..post(&url) };
    // The first worker opens the connection, then is busy: its event loop is not driven again.
    let answer = first.block_on(client.call_with(&get(), &outbound)).expect("an answer");
    assert_eq!(answer.body, b"{}");
    // The second worker's calls ride that connection, whose frames are read elsewhere.
    for _ in 0..3 {
        let request = get();
        let call = async {
            tokio::time::timeout(Duration::from_secs(2), client.call_with(&request, &outbound)).await
        };
        let answer = second.block_on(call).expect("the call is not held up by the busy worker");
        assert_eq!(answer.expect("an answer").body, b"{}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection carried every call");
    drop(first);
}

#[test]
fn an_http2_connection_a_worker_made_for_http1_serves_its_call_alone() {
    let (url, accepted) = h2c_server();
    let client = client().with_tasks(Tasks::new(Arc::default()), runtime_thread());
    let first = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let second = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let outbound = Outbound { h2c: true, ..Outbound::default() };
    let get = || UpstreamRequest { method: Method::GET, ..post(&url) };
    // The upstream picked HTTP/1.1 last: the first worker makes a connection of its own, which
    // speaks HTTP/2 anyway.
    let key = Key::of(&url.parse().unwrap(), None).unwrap();
    client.h2.picked_http1(&key);
    let answer = first.block_on(client.call_with(&get(), &outbound)).expect("an answer");
    assert_eq!(answer.body, b"{}");
    // That worker is busy from now on. Its connection served its call alone: the second
    // worker's calls open one shared by every worker, and are not held up.
    for _ in 0..3 {
        let request = get();
        let call = async {
            tokio::time::timeout(Duration::from_secs(2), client.call_with(&request, &outbound)).await
        };
        let answer = second.block_on(call).expect("the call is not held up by the busy worker");
        assert_eq!(answer.expect("an answer").body, b"{}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "the first worker's connection, and one shared");
    drop(first);
}

#[tokio::test]
async fn what_routes_that_came_and_went_left_behind_is_let_go_once_unused() {
    // Five upstreams, each called by ten routes (made and forgotten, as routes registered and
    // deleted are), each route with a rate limit, retries and a breaker of its own.
    let mut upstreams = Vec::new();
    for _ in 0..5 {
        upstreams.push(keeper().await.0);
    }
    let client = client();
    let retry = RetrySettings { attempts: 1, on: Vec::new(), allow_unsafe: false };
    let limit =
        RateLimitSettings { requests_per_second: 100.0, burst: 10, scope: LimitScope::Route, max_wait_ms: 0 };
    for (n, url) in upstreams.iter().enumerate() {
        for route in 0..10 {
            let route = uuid::Uuid::from_u128((n * 10 + route) as u128);
            let outbound = Outbound {
                rate_limit: Some((&limit, route)),
                retry: Some(&retry),
                breaker: Some(route),
                ..Outbound::default()
            };
            client.call_with(&post(url), &outbound).await.expect("an answer");
        }
    }
    let kept = client.kept();
    assert_eq!((kept.breakers, kept.retry_budgets, kept.rate_limiters), (50, 5, 50), "{kept:?}");
    // Used a moment ago: everything is kept, however many sweeps pass (a sweep counts uses).
    let now = Instant::now();
    client.sweep(now);
    assert_eq!(client.kept(), kept);
    // Unused for ten minutes of sweeps: let go, back to nothing.
    for _ in 0..=per_key::UNUSED_SWEEPS {
        client.sweep(now);
    }
    let left = client.kept();
    assert_eq!((left.breakers, left.retry_budgets, left.rate_limiters), (0, 0, 0), "{left:?}");
}

#[test]
fn state_per_key_is_let_go_only_unheld_unused_and_at_rest() {
    let kept: per_key::PerKey<String, u32> = per_key::PerKey::default();
    let every = Duration::from_secs(30);
    let held = kept.get_or("held", || 1);
    drop(kept.get_or("busy", || 2));
    drop(kept.get_or("idle", || 3));
    for _ in 0..per_key::UNUSED_SWEEPS {
        kept.sweep(every, |_, _| true);
        drop(kept.get("busy"));
    }
    assert_eq!(kept.len(), 3, "none unused for long yet");
    let mut asked = Vec::new();
    // "idle" goes unused past the limit; "busy" was used the sweep before; "held" is held.
    kept.sweep(every, |state, unused_for| {
        asked.push((*state, unused_for));
        true
    });
    assert_eq!(asked, [(3, every * per_key::UNUSED_SWEEPS as u32)]);
    assert_eq!(kept.each(|key, _| key.clone()), ["busy", "held"]);
    // Not at rest: kept, however long unused.
    drop(held);
    for _ in 0..=per_key::UNUSED_SWEEPS {
        kept.sweep(every, |state, _| *state != 1);
    }
    assert_eq!(kept.each(|key, _| key.clone()), ["held"]);
}
