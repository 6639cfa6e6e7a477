//! Misbehaving upstreams, each a raw TCP server on 127.0.0.1 that answers the registration's live
//! call properly and then misbehaves. Every fault gets its documented status at once (never a
//! partial 200, never a panic), and the service keeps serving a healthy route meanwhile.

use std::future::Future;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use recast::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::routes::{MEALS, registered, registration};
use crate::support::{Answer, Service, Upstream, config, get};

/// A TCP server that reads each request head and then runs `behave(n, stream)`, where `n`
/// counts connections from 0.
struct RawUpstream {
    addr: SocketAddr,
    task: JoinHandle<()>,
    heads: Arc<std::sync::Mutex<Vec<String>>>,
}

impl RawUpstream {
    async fn start<F, Fut>(behave: F) -> RawUpstream
    where
        F: Fn(usize, TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = heads.clone();
        let behave = Arc::new(behave);
        let task = tokio::spawn(async move {
            let count = AtomicUsize::new(0);
            let mut serving = tokio::task::JoinSet::new();
            loop {
                let Ok((mut stream, _)) = listener.accept().await else { continue };
                let n = count.fetch_add(1, Ordering::SeqCst);
                let (behave, seen) = (behave.clone(), seen.clone());
                serving.spawn(async move {
                    let head = read_head(&mut stream).await;
                    seen.lock().unwrap().push(head);
                    behave(n, stream).await;
                });
            }
        });
        RawUpstream { addr, task, heads }
    }

    fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap_or(0) == 1 {
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn answer(head: &str, body: &[u8]) -> Vec<u8> {
    let mut bytes = format!("HTTP/1.1 200 OK\r\n{head}connection: close\r\n\r\n").into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

fn json_answer(body: &[u8]) -> Vec<u8> {
    answer(&format!("content-type: application/json\r\ncontent-length: {}\r\n", body.len()), body)
}

/// The first connection (the registration's live call) gets a good answer; later ones `fault`.
async fn faulty<F, Fut>(fault: F) -> RawUpstream
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let fault = Arc::new(fault);
    RawUpstream::start(move |n, mut stream| {
        let fault = fault.clone();
        async move {
            if n == 0 {
                let _ = stream.write_all(&json_answer(MEALS.as_bytes())).await;
            } else {
                fault(stream).await;
            }
        }
    })
    .await
}

/// Answers the live call properly, then `bytes` to every call.
async fn sending(bytes: Vec<u8>) -> RawUpstream {
    let bytes = Arc::new(bytes);
    faulty(move |mut stream| {
        let bytes = bytes.clone();
        async move {
            let _ = stream.write_all(&bytes).await;
        }
    })
    .await
}

/// A gzip stream of `size` zero bytes: small on the wire, large when decompressed.
fn gzip_bomb(size: usize) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..size >> 20 {
        encoder.write_all(&zeros).unwrap();
    }
    encoder.finish().unwrap()
}

#[tokio::test]
async fn every_upstream_fault_gets_its_status_and_the_service_keeps_serving() {
    let config = Config { upstream_timeout_ms: 1_500, max_upstream_bytes: 1 << 20, ..config() };
    let service = Service::start(config).await;
    let healthy = Upstream::json(MEALS).await;
    let healthy_path = registered(&service, &registration(&healthy.url("/"), "", ""), &[]).await;

    let bomb = gzip_bomb(64 << 20);
    assert!(bomb.len() < 256 << 10, "the bomb is small on the wire ({} bytes)", bomb.len());
    let bomb = answer(
        &format!(
            "content-type: application/json\r\ncontent-encoding: gzip\r\ncontent-length: {}\r\n",
            bomb.len()
        ),
        &bomb,
    );
    let html = b"<html><body>{\"meals\":[]}</body></html>";
    let html = answer(&format!("content-type: text/html\r\ncontent-length: {}\r\n", html.len()), html);
    // One chunk, then the connection closes without the last chunk.
    let chunked =
        answer("content-type: application/json\r\ntransfer-encoding: chunked\r\n", b"a\r\n{\"meals\":[\r\n");
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let faults: Vec<(&str, RawUpstream, u16, &str)> = vec![
        (
            "reset mid-body",
            faulty(|mut s| async move {
                let _ = s
                    .write_all(&answer(
                        "content-type: application/json\r\ncontent-length: 1000\r\n",
                        b"{\"meals\":[",
                    ))
                    .await;
                let _ = s.set_zero_linger();
                drop(s);
            })
            .await,
            502,
            "upstream-unreachable",
        ),
        ("truncated chunked body", sending(chunked).await, 502, "upstream-unreachable"),
        (
            "one byte per second",
            faulty(|mut s| async move {
                let body = MEALS.as_bytes();
                let head = format!("content-type: application/json\r\ncontent-length: {}\r\n", body.len());
                let _ = s.write_all(&answer(&head, b"")).await;
                for byte in body {
                    if s.write_all(&[*byte]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            })
            .await,
            504,
            "upstream-timeout",
        ),
        (
            "huge Content-Length",
            faulty(|mut s| async move {
                let head = "content-type: application/json\r\ncontent-length: 99999999999\r\n";
                let _ = s.write_all(&answer(head, b"{\"meals\":")).await;
                tokio::time::sleep(Duration::from_secs(60)).await;
            })
            .await,
            502,
            "upstream-too-large",
        ),
        ("gzip bomb", sending(bomb).await, 502, "upstream-too-large"),
        ("HTML with 200", sending(html).await, 502, "upstream-not-json"),
        (
            "invalid UTF-8",
            sending(json_answer(b"{\"meals\":[{\"idMeal\":\"7\",\"strMeal\":\"\xff\xfe\"}]}")).await,
            502,
            "upstream-not-json",
        ),
        ("deeply nested JSON", sending(json_answer(deep.as_bytes())).await, 502, "upstream-not-json"),
        ("closed before answering", faulty(|s| async move { drop(s) }).await, 502, "upstream-unreachable"),
    ];

    let mut paths = Vec::new();
    for (name, upstream, _, _) in &faults {
        let path = registered(&service, &registration(&upstream.url(), "", ""), &[]).await;
        paths.push((name, path));
    }
    // Refused: a port where nothing listens any more (registered while something did).
    let gone = RawUpstream::start(|_, mut s| async move {
        let _ = s.write_all(&json_answer(MEALS.as_bytes())).await;
    })
    .await;
    let gone_path = registered(&service, &registration(&gone.url(), "", ""), &[]).await;
    drop(gone);
    tokio::time::sleep(Duration::from_millis(50)).await;

    let check = |answer: &Answer, status: u16, slug: &str, name: &str| {
        assert_eq!(answer.status, status, "{name}: {}", String::from_utf8_lossy(&answer.body));
        answer.assert_problem(status, slug);
        assert!(answer.header("server-timing").is_some(), "{name}");
    };
    // All faults at once, with calls to the healthy route in between.
    let calls: Vec<_> = paths
        .iter()
        .map(|(_, path)| {
            let url = service.url(path);
            tokio::spawn(async move {
                let started = Instant::now();
                let answer = get(&url).await;
                (answer, started.elapsed())
            })
        })
        .collect();
    let healthy_url = service.url(&healthy_path);
    let collect = async {
        let mut results = Vec::new();
        for call in calls {
            results.push(call.await.unwrap());
        }
        results
    };
    let (results, healthy_answers) = tokio::join!(collect, async {
        let mut answers = Vec::new();
        for _ in 0..5 {
            answers.push(get(&healthy_url).await.status.as_u16());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        answers
    });
    // Each status shows which deadline or limit ended the call; the time only has to rule out
    // waiting for the upstream: twenty times the 1.5 s deadline, while the dripping answer would
    // take over a minute and the huge one holds its connection for a minute.
    for ((name, _, status, slug), (answer, took)) in faults.iter().zip(&results) {
        check(answer, *status, slug, name);
        assert!(*took < Duration::from_secs(30), "{name} took {took:?}");
    }
    assert_eq!(healthy_answers, [200; 5], "the healthy route kept answering");
    let refused = get(&service.url(&gone_path)).await;
    check(&refused, 502, "upstream-unreachable", "refused");

    // recast asks for compressed answers, and decoded the bomb only up to the limit.
    let (_, bomb_upstream, _, _) = &faults[4];
    for head in bomb_upstream.heads.lock().unwrap().iter() {
        assert!(head.to_ascii_lowercase().contains("\r\naccept-encoding: gzip, br\r\n"), "{head}");
    }
    assert_eq!(get(&healthy_url).await.status, 200);
    assert_eq!(get(&service.url("/healthz")).await.status, 200);
    service.stop().await;
}
