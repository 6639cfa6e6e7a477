//! Retries a route opts into (`"retry"`, `docs/upstreams.md`), against real upstreams on
//! 127.0.0.1 that count what they receive: what is named is sent again and nothing else, waits
//! heed `Retry-After`, the whole call stays within its deadline, methods that are not idempotent
//! need `unsafe`, and the budget per origin caps retries at a fifth of the calls. A retry that
//! should not happen fails a test through the upstream's own count.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::Method;
use recast::config::Config;

use crate::routes::{MEALS, register, registered, registration};
use crate::support::{Json, Reply, Service, Upstream, config, error_locations, get, send};

/// An upstream that answers MEALS to the live call (request 0), then `script(n)` to request n
/// (counted from 1).
pub(crate) async fn scripted(script: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Upstream {
    let seen = AtomicUsize::new(0);
    Upstream::start(move |_| match seen.fetch_add(1, Ordering::SeqCst) {
        0 => Reply::json(MEALS),
        n => script(n),
    })
    .await
}

fn with_retry(upstream: &Upstream, retry: &str) -> String {
    registration(&upstream.url("/"), "", &format!(r#","retry":{retry}"#))
}

/// Breakers off, so that these counts are the retries' alone.
fn retry_config() -> Config {
    Config { breaker_failures: 0, ..config() }
}

#[tokio::test]
async fn the_statuses_named_are_sent_again_until_one_succeeds() {
    let upstream = scripted(|n| if n <= 2 { Reply::with(503, "{}") } else { Reply::json(MEALS) }).await;
    let service = Service::start(retry_config()).await;
    let path = registered(&service, &with_retry(&upstream, r#"{"attempts":3,"on":[502,503]}"#), &[]).await;
    let answer = get(&service.url(&path)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(upstream.received().len(), 4, "the live call, two 503s and the success");
    let metrics = String::from_utf8(get(&service.url("/metrics")).await.body.to_vec()).unwrap();
    let line = format!("recast_upstream_retries_total{{origin=\"http://{}\"}} 2", upstream.addr);
    assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    service.stop().await;
}

#[tokio::test]
async fn what_is_not_named_and_what_is_left_after_the_attempts_is_answered_as_is() {
    let upstream = scripted(|n| Reply::with(if n == 1 { 500 } else { 503 }, "{}")).await;
    let service = Service::start(retry_config()).await;
    let path = registered(&service, &with_retry(&upstream, r#"{"attempts":2,"on":[503]}"#), &[]).await;
    // A 500 is not named: answered at once.
    get(&service.url(&path)).await.assert_problem(502, "upstream-error");
    assert_eq!(upstream.received().len(), 2);
    // 503 three times: the first and two retries, then the last 503 is the answer.
    let answer = get(&service.url(&path)).await;
    let problem = answer.assert_problem(502, "upstream-error");
    assert_eq!(problem.get("upstreamStatus").map(Json::to_string).as_deref(), Some("503"));
    assert_eq!(upstream.received().len(), 5);
    service.stop().await;
}

#[tokio::test]
async fn retry_after_is_waited_for_and_one_past_the_deadline_ends_the_call() {
    let asks = Arc::new(AtomicUsize::new(1));
    let seconds = asks.clone();
    let upstream = scripted(move |n| {
        if n % 2 == 1 {
            let mut reply = Reply::with(503, "{}");
            reply.headers.push(("retry-after", seconds.load(Ordering::SeqCst).to_string()));
            reply
        } else {
            Reply::json(MEALS)
        }
    })
    .await;
    let service = Service::start(Config { upstream_timeout_ms: 3_000, ..retry_config() }).await;
    let path = registered(&service, &with_retry(&upstream, r#"{"attempts":1,"on":[503]}"#), &[]).await;
    let started = Instant::now();
    assert_eq!(get(&service.url(&path)).await.status, 200);
    assert!(started.elapsed() >= Duration::from_secs(1), "waited {:?}", started.elapsed());
    assert_eq!(upstream.received().len(), 3);

    // Asked to wait past the call's deadline: no retry, the 503 is the answer, at once.
    asks.store(10, Ordering::SeqCst);
    let started = Instant::now();
    get(&service.url(&path)).await.assert_problem(502, "upstream-error");
    assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
    assert_eq!(upstream.received().len(), 4);
    // As long as a u64 can say: no clock arithmetic overflows, the 503 is the answer.
    asks.store(usize::MAX, Ordering::SeqCst);
    assert_eq!(get(&service.url(&path)).await.status, 200, "request 4 is answered");
    get(&service.url(&path)).await.assert_problem(502, "upstream-error");
    assert_eq!(upstream.received().len(), 6);
    assert_eq!(get(&service.url("/healthz")).await.status, 200);
    service.stop().await;
}

#[tokio::test]
async fn timeouts_are_retried_within_one_deadline_for_the_whole_call() {
    // Request 1 is slow, request 2 fast; from request 3 on, all are slow.
    let upstream = scripted(|n| {
        let delay = if n == 2 { Duration::ZERO } else { Duration::from_secs(10) };
        Reply { delay, ..Reply::json(MEALS) }
    })
    .await;
    let service = Service::start(Config { upstream_timeout_ms: 3_000, ..retry_config() }).await;
    let path = registered(&service, &with_retry(&upstream, r#"{"attempts":2,"on":["timeout"]}"#), &[]).await;
    // Each of the three attempts has a third of the time left: the first gives up after about
    // a second, and the second is answered.
    let started = Instant::now();
    assert_eq!(get(&service.url(&path)).await.status, 200);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_millis(2_000), "{took:?}");
    assert_eq!(upstream.received().len(), 3);
    // All slow: three attempts, and the answer within the call's deadline.
    let started = Instant::now();
    get(&service.url(&path)).await.assert_problem(504, "upstream-timeout");
    let took = started.elapsed();
    assert!(took < Duration::from_millis(3_300), "the deadline is the whole call's: {took:?}");
    assert_eq!(upstream.received().len(), 6);
    service.stop().await;
}

#[tokio::test]
async fn resets_are_retried_when_named() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(retry_config()).await;
    let path = registered(&service, &with_retry(&upstream, r#"{"attempts":2,"on":["reset"]}"#), &[]).await;
    let port = upstream.addr.port();
    drop(upstream);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Refused three times (the call and two retries), then answered as unreachable.
    get(&service.url(&path)).await.assert_problem(502, "upstream-unreachable");
    let metrics = String::from_utf8(get(&service.url("/metrics")).await.body.to_vec()).unwrap();
    let line = format!("recast_upstream_retries_total{{origin=\"http://127.0.0.1:{port}\"}} 2");
    assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    service.stop().await;
}

#[tokio::test]
async fn a_method_that_is_not_idempotent_needs_unsafe() {
    let upstream = scripted(|n| if n == 1 { Reply::with(503, "{}") } else { Reply::json(MEALS) }).await;
    let service = Service::start(retry_config()).await;
    let post = |retry: &str| {
        registration(&upstream.url("/"), r#","method":"POST""#, &format!(r#","retry":{retry}"#))
    };
    let refused = register(&service, &post(r#"{"attempts":1,"on":[503]}"#), &[]).await;
    let problem = refused.assert_problem(400, "invalid-request");
    let errors = problem.get("errors").unwrap().as_array();
    assert_eq!(errors[0].get("location").and_then(Json::as_str), Some("/retry"));
    assert!(errors[0].get("message").and_then(Json::as_str).unwrap().contains("\"unsafe\": true"));
    assert_eq!(upstream.received().len(), 0, "nothing is called for a registration refused");

    let path = registered(&service, &post(r#"{"attempts":1,"on":[503],"unsafe":true}"#), &[]).await;
    let answer = send(Method::GET, &service.url(&path), &[], "").await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let received = upstream.received();
    assert_eq!(received.len(), 3);
    assert!(received.iter().all(|r| r.method == Method::POST));
    // The listing shows the member as stored.
    let listed = get(&service.url(&format!("/v1/routes/{}", path.split('/').nth(2).unwrap()))).await;
    assert_eq!(
        listed.json().get("retry").map(Json::to_string).as_deref(),
        Some(r#"{"attempts":1,"on":[503],"unsafe":true}"#)
    );
    service.stop().await;
}

#[tokio::test]
async fn a_retry_member_with_problems_is_refused_with_each_located() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(retry_config()).await;
    let cases = [
        (r#""often""#, vec!["/retry"]),
        (r#"{"on":[503]}"#, vec!["/retry/attempts"]),
        (r#"{"attempts":6,"on":[503]}"#, vec!["/retry/attempts"]),
        (r#"{"attempts":0,"on":[503]}"#, vec!["/retry/attempts"]),
        (r#"{"attempts":1}"#, vec!["/retry/on"]),
        (r#"{"attempts":1,"on":[]}"#, vec!["/retry/on"]),
        (r#"{"attempts":1,"on":[404,503,"soon"]}"#, vec!["/retry/on/0", "/retry/on/2"]),
        (r#"{"attempts":1,"on":[503],"unsafe":"yes","tries":2}"#, vec!["/retry/tries", "/retry/unsafe"]),
    ];
    for (retry, locations) in cases {
        let answer = register(&service, &with_retry(&upstream, retry), &[]).await;
        let found = error_locations(&answer.assert_problem(400, "invalid-request"));
        assert_eq!(found, locations, "{retry}");
    }
    assert_eq!(upstream.received().len(), 0);
    service.stop().await;
}

#[tokio::test]
async fn the_budget_keeps_retries_to_a_fifth_of_the_calls_beyond_its_reserve() {
    let upstream = scripted(|_| Reply::with(503, "{}")).await;
    let service = Service::start(retry_config()).await;
    let path = registered(&service, &with_retry(&upstream, r#"{"attempts":5,"on":[503]}"#), &[]).await;
    let calls = 100;
    for _ in 0..calls {
        get(&service.url(&path)).await.assert_problem(502, "upstream-error");
    }
    // Without a budget: 600 requests. With it: the calls, the reserve of 10, and a fifth more.
    let sent = upstream.received().len() - 1;
    let retries = sent - calls;
    assert!(retries <= 10 + calls / 5 + 1, "{retries} retries for {calls} calls");
    assert!(retries >= calls / 5, "the budget allows retries too: {retries}");
    service.stop().await;
}
