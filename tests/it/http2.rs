//! HTTP/2 to upstreams (`RECAST_UPSTREAM_HTTP2`, `docs/upstreams.md`), against nginx (Debian's,
//! `listen … ssl http2`) with a certificate of a CA the test makes: the same answers as over
//! HTTP/1.1, many calls on one connection, and no call lost when nginx ends a connection with
//! `GOAWAY` under load. nginx's access log says which protocol and which connection carried each
//! request.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tempfile::TempDir;
use tokio::task::JoinSet;

use crate::nginx::{Nginx, set_mode};
use crate::routes::{MEALS, registration};
use crate::support::{Held, Json, Service, config, free_port, get, post_json};
use crate::tls::{Pki, pki};

/// nginx with three servers answering `MEALS`: HTTPS offering HTTP/2 (ending a connection after
/// `keepalive` requests), HTTPS with HTTP/1.1 only, and plain HTTP/2 (h2c, prior knowledge). The two HTTPS ports, and the access log (`$connection $server_protocol
/// $request_uri $sent_http_content_encoding`).
fn nginx(pki: &Pki, keepalive: u32) -> Servers {
    let (h2, h1, h2c) = (free_port(), free_port(), free_port());
    let logs = TempDir::new().unwrap();
    set_mode(logs.path(), 0o777);
    let log = logs.keep().join("access.log");
    let tls = pki.nginx_certificate();
    // Compressed, so that decoding is part of what is compared.
    let answer = format!(
        "default_type application/json;\n    gzip on;\n    gzip_types application/json;\n    gzip_min_length 1;\n    location / {{ return 200 '{MEALS}'; }}"
    );
    let site = format!(
        "log_format calls '$connection $server_protocol $request_uri $sent_http_content_encoding';\n\
         server {{\n    listen 127.0.0.1:{h2} ssl http2;\n    {tls}\n    keepalive_requests {keepalive};\n    access_log {} calls;\n    {answer}\n}}\n\
         server {{\n    listen 127.0.0.1:{h1} ssl;\n    {tls}\n    access_log {} calls;\n    {answer}\n}}\n\
         server {{\n    listen 127.0.0.1:{h2c} http2;\n    access_log {} calls;\n    {answer}\n}}\n",
        log.display(),
        log.display(),
        log.display()
    );
    Servers { _nginx: Nginx::serve(&site, h1, TempDir::new().unwrap()), h2, h1, h2c, log }
}

struct Servers {
    _nginx: Nginx,
    h2: u16,
    h1: u16,
    h2c: u16,
    log: std::path::PathBuf,
}

/// The access log's lines: connection serial, protocol, path and content coding.
fn calls(log: &std::path::Path) -> Vec<(u64, String, String)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let mut parts = line.split(' ');
            let connection = parts.next().unwrap().parse().unwrap();
            let protocol = parts.next().unwrap().to_owned();
            (connection, protocol, parts.collect::<Vec<_>>().join(" "))
        })
        .collect()
}

/// Registers a route `path` to nginx's port `port` trusting the test's CA; its public path.
async fn route(service: &Service, pki: &Pki, port: u16, path: &str) -> String {
    let tls = serde_json::json!({ "ca": pki.pem("server-ca.pem") });
    let body = registration(&format!("https://127.0.0.1:{port}/"), "", &format!(r#","tls":{tls}"#)).replacen(
        r#""path":"meals/random""#,
        &format!(r#""path":"{path}""#),
        1,
    );
    let answer = post_json(&service.url("/v1/mapping"), body).await;
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    answer.json().get("path").and_then(Json::as_str).unwrap().to_owned()
}

#[tokio::test]
async fn answers_over_http2_match_http1_and_a_hundred_calls_share_one_connection() {
    let pki = pki();
    let Servers { _nginx, h2, h1, log, .. } = nginx(&pki, 1000);
    let service = Service::start(config()).await;
    let over_h2 = route(&service, &pki, h2, "two").await;
    let over_h1 = route(&service, &pki, h1, "one").await;
    let (a, b) = (get(&service.url(&over_h2)).await, get(&service.url(&over_h1)).await);
    assert_eq!((a.status.as_u16(), b.status.as_u16()), (200, 200));
    assert_eq!(a.body, b.body, "the same answer byte for byte");
    assert_eq!(a.header("content-type"), b.header("content-type"));

    let mut callers = JoinSet::new();
    for _ in 0..100 {
        let url = service.url(&over_h2);
        callers.spawn(async move { get(&url).await });
    }
    while let Some(answer) = callers.join_next().await {
        let answer = answer.unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body, a.body);
    }
    let logged = logged_calls(&log, 104).await;
    let h2_calls: Vec<_> = logged.iter().filter(|(_, protocol, _)| protocol == "HTTP/2.0").collect();
    let h1_calls = logged.iter().filter(|(_, protocol, _)| protocol == "HTTP/1.1").count();
    assert_eq!(h2_calls.len(), 102, "the live call, one call and 100 more, over HTTP/2: {logged:?}");
    assert_eq!(h1_calls, 2, "the HTTP/1.1 server's live call and call");
    assert!(
        logged.iter().all(|(_, _, rest)| rest.ends_with(" gzip")),
        "every answer came in gzip: {logged:?}"
    );
    let connections: std::collections::BTreeSet<u64> = h2_calls.iter().map(|(c, _, _)| *c).collect();
    assert_eq!(connections.len(), 1, "one connection carried every HTTP/2 call: {connections:?}");
    service.stop().await;

    // RECAST_UPSTREAM_HTTP2=off: HTTP/1.1 to the same server.
    let off = Service::start(recast::config::Config { upstream_http2: "off".to_owned(), ..config() }).await;
    let path = route(&off, &pki, h2, "off").await;
    assert_eq!(get(&off.url(&path)).await.body, a.body);
    let last = logged_calls(&log, 106).await.into_iter().last().unwrap();
    assert_eq!(last.1, "HTTP/1.1", "{last:?}");
    off.stop().await;
}

#[tokio::test]
async fn an_http_upstream_is_spoken_to_in_http2_when_its_route_says_prior_knowledge() {
    let pki = pki();
    let Servers { _nginx, h2c: port, log, .. } = nginx(&pki, 1000);
    let service = Service::start(config()).await;
    let base = format!("http://127.0.0.1:{port}/");
    let body = registration(&base, "", r#","http2":"prior-knowledge""#);
    let created = post_json(&service.url("/v1/mapping"), body).await;
    assert_eq!(created.status, 201, "{}", String::from_utf8_lossy(&created.body));
    let path = created.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    for _ in 0..3 {
        assert_eq!(get(&service.url(&path)).await.status, 200);
    }
    let logged = logged_calls(&log, 4).await;
    assert_eq!(logged.len(), 4);
    assert!(logged.iter().all(|(_, protocol, _)| protocol == "HTTP/2.0"), "{logged:?}");
    let listed = String::from_utf8(get(&service.url("/v1/routes")).await.body.to_vec()).unwrap();
    assert!(listed.contains(r#""http2":"prior-knowledge""#), "{listed}");
    // Only for an http upstream, and only that value.
    for (base, http2) in
        [("https://127.0.0.1:9/", r#""prior-knowledge""#), ("http://127.0.0.1:9/", r#""always""#)]
    {
        let body = registration(base, "", &format!(r#","http2":{http2}"#));
        let problem =
            post_json(&service.url("/v1/mapping"), body).await.assert_problem(400, "invalid-request");
        assert_eq!(crate::support::error_locations(&problem), ["/http2"]);
    }
    service.stop().await;
}

#[tokio::test]
async fn a_server_ending_its_connections_with_goaway_under_load_loses_no_call() {
    let pki = pki();
    // nginx ends each connection with GOAWAY after 25 requests.
    let Servers { _nginx, h2, log, .. } = nginx(&pki, 25);
    let service = Service::start(config()).await;
    let path = route(&service, &pki, h2, "load").await;
    let mut callers = JoinSet::new();
    for _ in 0..20 {
        let url = service.url(&path);
        callers.spawn(async move {
            for _ in 0..15 {
                let answer = get(&url).await;
                assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
            }
        });
    }
    while let Some(done) = callers.join_next().await {
        done.unwrap();
    }
    let logged = logged_calls(&log, 301).await;
    let connections: std::collections::BTreeSet<u64> = logged.iter().map(|(c, _, _)| *c).collect();
    assert_eq!(logged.len(), 301, "every call answered once, the live call too");
    assert!(connections.len() >= 12, "nginx ended its connections as asked: {}", connections.len());
    assert!(logged.iter().all(|(_, protocol, _)| protocol == "HTTP/2.0"));
    service.stop().await;
}

/// `calls` strung across `callers` at once to `url` with the query `?{query}{n}` (distinct, so
/// that no two are one cached or coalesced call); each must answer 200.
async fn at_once(url: &str, query: &str, callers: usize) {
    let mut calls = JoinSet::new();
    for n in 0..callers {
        let url = format!("{url}?{query}{n}");
        calls.spawn(async move {
            let answer = get(&url).await;
            assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
        });
    }
    while let Some(done) = calls.join_next().await {
        done.unwrap();
    }
}

/// The access log's lines once there are `n` of them (nginx logs a call after its answer went
/// out), or after [`crate::support::PATIENCE`].
async fn logged_calls(log: &std::path::Path, n: usize) -> Vec<(u64, String, String)> {
    let deadline = tokio::time::Instant::now() + crate::support::PATIENCE;
    loop {
        let logged = calls(log);
        if logged.len() >= n || tokio::time::Instant::now() > deadline {
            return logged;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The connections (nginx's serials) that carried the `n` calls whose target holds `marker`,
/// once nginx has logged them all (it logs a call after its answer went out).
async fn connections_of(log: &std::path::Path, marker: &str, n: usize) -> std::collections::BTreeSet<u64> {
    let deadline = tokio::time::Instant::now() + crate::support::PATIENCE;
    loop {
        let marked: Vec<_> = calls(log).into_iter().filter(|(_, _, rest)| rest.contains(marker)).collect();
        if marked.len() >= n || tokio::time::Instant::now() > deadline {
            assert_eq!(marked.len(), n, "nginx logged the calls marked {marker}");
            return marked.iter().map(|(c, _, _)| *c).collect();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A loopback relay to a server's port: it hands on what the server sends `delay` late, as a
/// far server's would come, and what the client sends at once; or, once `silent`, accepts
/// connections and says nothing on them. It counts the connections it accepted.
struct Relay {
    port: u16,
    accepted: Arc<AtomicUsize>,
    silent: Arc<AtomicBool>,
}

impl Relay {
    async fn start(port: u16, delay: Duration) -> Relay {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = Relay {
            port: listener.local_addr().unwrap().port(),
            accepted: Arc::new(AtomicUsize::new(0)),
            silent: Arc::new(AtomicBool::new(false)),
        };
        let (accepted, silent) = (relay.accepted.clone(), relay.silent.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                if silent.load(Ordering::SeqCst) {
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        drop(client);
                    });
                    continue;
                }
                let server = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                let ((mut from_client, mut to_client), (mut from_server, mut to_server)) =
                    (client.into_split(), server.into_split());
                tokio::spawn(async move { tokio::io::copy(&mut from_client, &mut to_server).await });
                let (sent, mut arriving) = tokio::sync::mpsc::unbounded_channel();
                tokio::spawn(async move {
                    let mut buffer = vec![0; 64 * 1024];
                    while let Ok(n @ 1..) = from_server.read(&mut buffer).await {
                        let _ = sent.send((tokio::time::Instant::now() + delay, buffer[..n].to_vec()));
                    }
                });
                tokio::spawn(async move {
                    while let Some((due, bytes)) = arriving.recv().await {
                        tokio::time::sleep_until(due).await;
                        if to_client.write_all(&bytes).await.is_err() {
                            break;
                        }
                    }
                    let _ = to_client.shutdown().await;
                });
            }
        });
        relay
    }
}

#[tokio::test]
async fn a_connection_carries_as_many_calls_as_the_server_allows_then_another_is_opened() {
    let pki = pki();
    // nginx allowing 10 streams per connection, 100 ms away, over TLS and over h2c, in front of
    // an upstream that holds each call until released: after a restart, 30 calls at once to
    // each reach it over three connections each. A new connection's first calls wait until
    // nginx has said how many streams it allows: taken at 100 meanwhile, the connection would
    // carry 20 streams nginx refuses ("concurrent streams exceeded"; h2c shows it, whose
    // handshake does not wait a round trip as TLS's does), sent again on more connections.
    let held = Held::start(MEALS).await;
    let (tls, h2c) = (free_port(), free_port());
    let logs = TempDir::new().unwrap();
    set_mode(logs.path(), 0o777);
    let (log, errors) = (logs.path().join("access.log"), logs.path().join("error.log"));
    let common = format!(
        "http2_max_concurrent_streams 10;\n    access_log {} calls;\n    error_log {} info;\n    \
         location / {{ proxy_pass {}; }}",
        log.display(),
        errors.display(),
        held.url,
    );
    let site = format!(
        "log_format calls '$connection $server_protocol $request_uri';\n\
         server {{\n    listen 127.0.0.1:{tls} ssl http2;\n    {}\n    {common}\n}}\n\
         server {{\n    listen 127.0.0.1:{h2c} http2;\n    {common}\n}}\n",
        pki.nginx_certificate(),
    );
    let _nginx = Nginx::serve(&site, tls, TempDir::new().unwrap());
    let (over_tls, over_h2c) = (
        Relay::start(tls, Duration::from_millis(100)).await,
        Relay::start(h2c, Duration::from_millis(100)).await,
    );
    let dir = TempDir::new().unwrap();
    let first = Service::start_in(config(), dir.path()).await;
    let tls_path = route(&first, &pki, over_tls.port, "tls").await;
    let body =
        registration(&format!("http://127.0.0.1:{}/", over_h2c.port), "", r#","http2":"prior-knowledge""#)
            .replacen(r#""path":"meals/random""#, r#""path":"h2c""#, 1);
    let created = post_json(&first.url("/v1/mapping"), body).await;
    assert_eq!(created.status, 201, "{}", String::from_utf8_lossy(&created.body));
    let h2c_path = created.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    first.stop().await;
    let before = [&over_tls, &over_h2c].map(|relay| relay.accepted.load(Ordering::SeqCst));
    let service = Service::start_in(config(), dir.path()).await;
    let (tls_url, h2c_url) = (service.url(&tls_path), service.url(&h2c_path));
    let calls = tokio::spawn(async move {
        tokio::join!(at_once(&tls_url, "hold&tls=", 30), at_once(&h2c_url, "hold&h2c=", 30))
    });
    held.arrived(60).await;
    held.release();
    calls.await.unwrap();
    for (marker, relay, before) in [("tls=", &over_tls, before[0]), ("h2c=", &over_h2c, before[1])] {
        let connections = connections_of(&log, marker, 30).await;
        assert_eq!(connections.len(), 3, "{marker} 30 calls, 10 streams per connection: {connections:?}");
        assert_eq!(
            relay.accepted.load(Ordering::SeqCst) - before,
            3,
            "{marker} no other connection was opened"
        );
    }
    let errors = std::fs::read_to_string(&errors).unwrap();
    assert!(!errors.contains("concurrent streams exceeded"), "{errors}");
    service.stop().await;
}

#[tokio::test]
async fn the_first_calls_to_an_upstream_not_met_yet_wait_for_one_connection_to_it() {
    let pki = pki();
    let Servers { _nginx, h2, h1, log, .. } = nginx(&pki, 1000);
    let dir = TempDir::new().unwrap();
    let first = Service::start_in(config(), dir.path()).await;
    let over_h2 = route(&first, &pki, h2, "two").await;
    let over_h1 = route(&first, &pki, h1, "one").await;
    first.stop().await;
    // After a restart nothing is known of either upstream: 50 calls at once to the one that
    // picks HTTP/2 make one connection; those to the one that picks HTTP/1.1 each go on in it.
    let service = Service::start_in(config(), dir.path()).await;
    at_once(&service.url(&over_h2), "cold=", 50).await;
    let connections = connections_of(&log, "cold=", 50).await;
    assert_eq!(connections.len(), 1, "one connection carried the 50 calls: {connections:?}");
    at_once(&service.url(&over_h1), "one=", 20).await;
    connections_of(&log, "one=", 20).await;
    let logged = calls(&log);
    let over_http1 =
        logged.iter().filter(|(_, protocol, rest)| rest.contains("one=") && protocol == "HTTP/1.1");
    assert_eq!(over_http1.count(), 20, "{logged:?}");
    service.stop().await;
}

#[tokio::test]
async fn calls_waiting_for_a_connection_that_cannot_be_made_answer_its_failure_at_the_connect_timeout() {
    let pki = pki();
    let Servers { _nginx, h2, .. } = nginx(&pki, 1000);
    let relay = Relay::start(h2, Duration::ZERO).await;
    let dir = TempDir::new().unwrap();
    let first = Service::start_in(config(), dir.path()).await;
    let path = route(&first, &pki, relay.port, "silent").await;
    first.stop().await;
    // After a restart the upstream's address takes connections and says nothing: no TLS
    // handshake. The first call's connection gives up at the connect timeout (not the call's
    // deadline), and the calls that waited for it answer its failure without trying their own.
    relay.silent.store(true, Ordering::SeqCst);
    let before = relay.accepted.load(Ordering::SeqCst);
    let config = recast::config::Config { upstream_connect_timeout_ms: 1_000, ..config() };
    let service = Service::start_in(config, dir.path()).await;
    let mut calls = JoinSet::new();
    for n in 0..20 {
        let url = format!("{}?n={n}", service.url(&path));
        calls.spawn(async move { get(&url).await });
    }
    while let Some(answer) = calls.join_next().await {
        let problem = answer.unwrap().assert_problem(502, "upstream-unreachable");
        let detail = problem.get("detail").and_then(Json::as_str).unwrap_or_default().to_owned();
        assert!(detail.contains("RECAST_UPSTREAM_CONNECT_TIMEOUT_MS"), "{detail}");
    }
    assert_eq!(relay.accepted.load(Ordering::SeqCst) - before, 1, "one connection was tried");
    // One attempt failed, and the origin's breaker counted one failure (of the 5 that open it):
    // the next call tries again.
    let problem = get(&service.url(&path)).await.assert_problem(502, "upstream-unreachable");
    assert!(format!("{problem:?}").contains("RECAST_UPSTREAM_CONNECT_TIMEOUT_MS"), "{problem:?}");
    assert_eq!(relay.accepted.load(Ordering::SeqCst) - before, 2);
    service.stop().await;
}
