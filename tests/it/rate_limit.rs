//! Outbound rate limits (`"rateLimit"`, `docs/upstreams.md`), against a real upstream on
//! 127.0.0.1 that counts what it receives: callers driving a route far above its limit get 429
//! with `Retry-After` and the upstream sees about the limit; a call may wait for its slot; an
//! origin's limit is shared by the routes that declare it. Every load loop here is bounded in time.

use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::routes::{MEALS, register, registered, registration};
use crate::support::{Json, Service, Upstream, config, error_locations, get};

fn with_limit(upstream: &Upstream, path: &str, limit: &str) -> String {
    registration(&upstream.url("/"), "", &format!(r#","rateLimit":{limit}"#)).replacen(
        r#""path":"meals/random""#,
        &format!(r#""path":"{path}""#),
        1,
    )
}

#[tokio::test]
async fn callers_far_above_the_limit_get_429_and_the_upstream_sees_the_limit() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let path =
        registered(&service, &with_limit(&upstream, "limited", r#"{"requestsPerSecond":20,"burst":2}"#), &[])
            .await;
    // Let the burst spent by the live call come back.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = upstream.received().len();
    let started = Instant::now();
    let run = Duration::from_secs(2);
    let mut callers = JoinSet::new();
    for _ in 0..8 {
        let url = service.url(&path);
        callers.spawn(async move {
            let (mut ok, mut limited) = (0, 0);
            while started.elapsed() < run {
                let answer = get(&url).await;
                match answer.status.as_u16() {
                    200 => ok += 1,
                    429 => {
                        let problem = answer.json();
                        assert_eq!(
                            problem.get("type").and_then(Json::as_str),
                            Some("https://recast.dev/problems/upstream-rate-limited")
                        );
                        assert_eq!(answer.header("retry-after"), Some("1"));
                        limited += 1;
                    }
                    other => panic!("answered {other}"),
                }
            }
            (ok, limited)
        });
    }
    let (mut ok, mut limited) = (0, 0);
    while let Some(counts) = callers.join_next().await {
        let (o, l) = counts.unwrap();
        ok += o;
        limited += l;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let sent = upstream.received().len() - before;
    assert_eq!(sent, ok, "each 200 was one upstream call, each 429 none");
    // 20 a second and a burst of 2: within 5% of that, and the callers asked for far more.
    let expected = 20.0 * elapsed + 2.0;
    assert!((sent as f64) <= expected * 1.05 + 1.0, "{sent} calls in {elapsed:.2} s");
    assert!((sent as f64) >= 20.0 * elapsed * 0.95 - 1.0, "{sent} calls in {elapsed:.2} s");
    assert!(limited > 10 * ok, "the callers were far above the limit: {limited} refused, {ok} sent");
    let metrics = String::from_utf8(get(&service.url("/metrics")).await.body.to_vec()).unwrap();
    let uuid = path.split('/').nth(2).unwrap();
    let line = format!("recast_upstream_rate_limited_total{{limit=\"route:{uuid}\"}} {limited}");
    assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    service.stop().await;
}

#[tokio::test]
async fn a_call_waits_for_its_slot_up_to_max_wait() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let limit = r#"{"requestsPerSecond":10,"burst":1,"maxWaitMs":1000}"#;
    let path = registered(&service, &with_limit(&upstream, "waits", limit), &[]).await;
    let started = Instant::now();
    let mut calls = JoinSet::new();
    for _ in 0..5 {
        let url = service.url(&path);
        calls.spawn(async move { get(&url).await.status });
    }
    while let Some(status) = calls.join_next().await {
        assert_eq!(status.unwrap(), 200);
    }
    // One slot every 100 ms, the first taken by the live call: the fifth call went at 500 ms.
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(400) && took < Duration::from_millis(1_000), "{took:?}");
    assert_eq!(upstream.received().len(), 6);
    service.stop().await;
}

#[tokio::test]
async fn routes_share_their_origin_s_limit_and_keep_their_own() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let shared = r#"{"requestsPerSecond":0.5,"burst":3,"scope":"origin"}"#;
    // Two registrations' live calls take two of the three slots.
    let a = registered(&service, &with_limit(&upstream, "a", shared), &[]).await;
    let b = registered(&service, &with_limit(&upstream, "b", shared), &[]).await;
    assert_eq!(get(&service.url(&a)).await.status, 200);
    get(&service.url(&b)).await.assert_problem(429, "upstream-rate-limited");
    get(&service.url(&a)).await.assert_problem(429, "upstream-rate-limited");
    // A route with a limit of its own is not held back by theirs.
    let own = r#"{"requestsPerSecond":0.5,"burst":3}"#;
    let c = registered(&service, &with_limit(&upstream, "c", own), &[]).await;
    assert_eq!(get(&service.url(&c)).await.status, 200);
    assert_eq!(upstream.received().len(), 5);
    // The listing shows the limit as stored, defaults filled in.
    let listed = get(&service.url(&format!("/v1/routes/{}", c.split('/').nth(2).unwrap()))).await;
    assert_eq!(
        listed.json().get("rateLimit").map(Json::to_string).as_deref(),
        Some(r#"{"requestsPerSecond":0.5,"burst":3,"scope":"route","maxWaitMs":0}"#)
    );
    service.stop().await;
}

#[tokio::test]
async fn a_rate_limit_with_problems_is_refused_with_each_located() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let cases = [
        (r#"10"#, vec!["/rateLimit"]),
        (r#"{"burst":2}"#, vec!["/rateLimit/requestsPerSecond"]),
        (r#"{"requestsPerSecond":0}"#, vec!["/rateLimit/requestsPerSecond"]),
        (r#"{"requestsPerSecond":"fast"}"#, vec!["/rateLimit/requestsPerSecond"]),
        (r#"{"requestsPerSecond":5,"burst":0}"#, vec!["/rateLimit/burst"]),
        (r#"{"requestsPerSecond":0.0000116,"burst":1000000}"#, vec!["/rateLimit/burst"]),
        (
            r#"{"requestsPerSecond":5,"scope":"cluster","maxWaitMs":60001,"per":"s"}"#,
            vec!["/rateLimit/maxWaitMs", "/rateLimit/per", "/rateLimit/scope"],
        ),
    ];
    for (limit, locations) in cases {
        let answer = register(&service, &with_limit(&upstream, "x", limit), &[]).await;
        let found = error_locations(&answer.assert_problem(400, "invalid-request"));
        assert_eq!(found, locations, "{limit}");
    }
    assert_eq!(upstream.received().len(), 0);
    service.stop().await;
}
