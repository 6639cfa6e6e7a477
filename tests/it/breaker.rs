//! The circuit breaker per upstream origin (`docs/upstreams.md`), against real upstreams on
//! 127.0.0.1 that count what they receive: a breaker opens after failures in a row, refuses calls
//! without sending them, lets one probe through after its cooldown, and closes or opens again by
//! the probe's outcome. Each check reads the upstream's own count of calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use recast::config::Config;
use tokio::sync::watch;

use crate::routes::{MEALS, register, registered, registration, route_count};
use crate::support::{Answer, Reply, Service, Upstream, config, get};

/// An upstream that answers MEALS, or the status set in the returned cell (200 answers MEALS).
async fn switchable() -> (Upstream, Arc<AtomicU16>) {
    let status = Arc::new(AtomicU16::new(200));
    let answer = status.clone();
    let upstream = Upstream::start(move |_| match answer.load(Ordering::SeqCst) {
        200 => Reply::json(MEALS),
        status => Reply::with(status, r#"{"error":"down"}"#),
    })
    .await;
    (upstream, status)
}

/// Waits (up to five seconds) until `upstream` has received `n` requests.
async fn until_received(upstream: &Upstream, n: usize) {
    for _ in 0..500 {
        if upstream.received().len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the upstream received {} requests, not {n}", upstream.received().len());
}

fn breaker_config(failures: u32, cooldown_ms: u64) -> Config {
    Config { breaker_failures: failures, breaker_cooldown_ms: cooldown_ms, ..config() }
}

async fn call(service: &Service, path: &str) -> Answer {
    get(&service.url(path)).await
}

/// The value of `name{origin="..."}` in `/metrics`.
async fn breaker_metric(service: &Service, name: &str, origin: &str) -> Option<String> {
    let text = String::from_utf8(get(&service.url("/metrics")).await.body.to_vec()).unwrap();
    let prefix = format!("{name}{{origin=\"{origin}\"}} ");
    text.lines().find_map(|line| line.strip_prefix(&prefix).map(str::to_owned))
}

#[tokio::test]
async fn failures_in_a_row_open_the_breaker_and_a_probe_closes_it() {
    let (upstream, status) = switchable().await;
    let origin = format!("http://{}", upstream.addr);
    let service = Service::start(breaker_config(3, 400)).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    assert_eq!(upstream.received().len(), 1, "the live call");

    status.store(503, Ordering::SeqCst);
    for _ in 0..3 {
        call(&service, &path).await.assert_problem(502, "upstream-error");
    }
    assert_eq!(upstream.received().len(), 4, "each failure was a call");
    assert_eq!(
        breaker_metric(&service, "recast_upstream_breaker_state", &origin).await.as_deref(),
        Some("1")
    );

    // Open: refused at once, nothing sent.
    for _ in 0..5 {
        let refused = call(&service, &path).await;
        let problem = refused.assert_problem(503, "upstream-unavailable");
        assert_eq!(refused.header("retry-after"), Some("1"), "400 ms, in whole seconds rounded up");
        let detail = problem.get("detail").and_then(|d| d.as_str().map(str::to_owned)).unwrap();
        assert!(detail.contains("RECAST_BREAKER_COOLDOWN_MS"), "{detail}");
    }
    assert_eq!(upstream.received().len(), 4, "an open breaker sends nothing");
    assert_eq!(
        breaker_metric(&service, "recast_upstream_breaker_rejections_total", &origin).await.as_deref(),
        Some("5")
    );

    // After the cooldown a probe goes; it fails, so the breaker opens again at once.
    tokio::time::sleep(Duration::from_millis(450)).await;
    call(&service, &path).await.assert_problem(502, "upstream-error");
    assert_eq!(upstream.received().len(), 5, "one probe");
    call(&service, &path).await.assert_problem(503, "upstream-unavailable");
    assert_eq!(upstream.received().len(), 5);

    // The next probe succeeds and closes it: calls go through again.
    status.store(200, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(450)).await;
    for n in 6..=8 {
        let answer = call(&service, &path).await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        assert_eq!(upstream.received().len(), n);
    }
    assert_eq!(
        breaker_metric(&service, "recast_upstream_breaker_state", &origin).await.as_deref(),
        Some("0")
    );
    assert_eq!(
        breaker_metric(&service, "recast_upstream_breaker_opened_total", &origin).await.as_deref(),
        Some("2")
    );
    service.stop().await;
}

#[tokio::test]
async fn one_probe_goes_while_concurrent_calls_are_refused() {
    let (gate, opened) = watch::channel(false);
    let status = Arc::new(AtomicU16::new(200));
    let answer = status.clone();
    let upstream = Upstream::start(move |_| match answer.load(Ordering::SeqCst) {
        200 => Reply { gate: Some(opened.clone()), ..Reply::json(MEALS) },
        status => Reply::with(status, "{}"),
    })
    .await;
    gate.send_replace(true);
    let service = Service::start(breaker_config(2, 300)).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    status.store(500, Ordering::SeqCst);
    for _ in 0..2 {
        call(&service, &path).await.assert_problem(502, "upstream-error");
    }
    assert_eq!(upstream.received().len(), 3);

    // The upstream is back but holds its answers: the probe waits, ten calls beside it do not.
    status.store(200, Ordering::SeqCst);
    gate.send_replace(false);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let probe = {
        let url = service.url(&path);
        tokio::spawn(async move { get(&url).await })
    };
    until_received(&upstream, 4).await;
    let mut others = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let url = service.url(&path);
        others.spawn(async move { get(&url).await });
    }
    while let Some(refused) = others.join_next().await {
        refused.unwrap().assert_problem(503, "upstream-unavailable");
    }
    assert_eq!(upstream.received().len(), 4, "only the probe was sent");
    gate.send_replace(true);
    assert_eq!(probe.await.unwrap().status, 200);
    assert_eq!(call(&service, &path).await.status, 200, "closed by the probe");
    assert_eq!(upstream.received().len(), 5);
    service.stop().await;
}

#[tokio::test]
async fn an_unreachable_upstream_opens_its_breaker_and_other_origins_are_untouched() {
    let (doomed, _) = switchable().await;
    let healthy = Upstream::json(MEALS).await;
    let service = Service::start(breaker_config(3, 5_000)).await;
    let body = registration(&doomed.url("/"), "", "");
    let broken = registered(&service, &body, &[]).await;
    let fine = registered(&service, &registration(&healthy.url("/"), "", ""), &[]).await;
    drop(doomed);
    // The port closes once the upstream's task is gone.
    tokio::time::sleep(Duration::from_millis(50)).await;

    for _ in 0..3 {
        call(&service, &broken).await.assert_problem(502, "upstream-unreachable");
    }
    let refused = call(&service, &broken).await;
    refused.assert_problem(503, "upstream-unavailable");
    assert_eq!(refused.header("retry-after"), Some("5"));
    // A registration's live call to that origin is refused the same way, and stores nothing.
    let before = route_count(&service).await;
    register(&service, &body, &[]).await.assert_problem(503, "upstream-unavailable");
    assert_eq!(route_count(&service).await, before);

    for _ in 0..3 {
        assert_eq!(call(&service, &fine).await.status, 200);
    }
    assert_eq!(healthy.received().len(), 4);
    service.stop().await;
}

#[tokio::test]
async fn client_errors_never_open_the_breaker_and_a_success_starts_the_count_again() {
    let (upstream, status) = switchable().await;
    let service = Service::start(breaker_config(2, 5_000)).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;

    // 4xx answers are the upstream working: they never open it.
    status.store(404, Ordering::SeqCst);
    for _ in 0..6 {
        call(&service, &path).await.assert_problem(404, "upstream-error");
    }
    assert_eq!(upstream.received().len(), 7);

    // A 5xx, then a success: the count starts again.
    status.store(502, Ordering::SeqCst);
    call(&service, &path).await.assert_problem(502, "upstream-error");
    status.store(200, Ordering::SeqCst);
    assert_eq!(call(&service, &path).await.status, 200);
    status.store(502, Ordering::SeqCst);
    call(&service, &path).await.assert_problem(502, "upstream-error");
    assert_eq!(upstream.received().len(), 10, "not two failures in a row yet");
    call(&service, &path).await.assert_problem(502, "upstream-error");
    call(&service, &path).await.assert_problem(503, "upstream-unavailable");
    assert_eq!(upstream.received().len(), 11);
    service.stop().await;
}

#[tokio::test]
async fn zero_failures_turns_the_breaker_off() {
    let (upstream, status) = switchable().await;
    let service = Service::start(breaker_config(0, 5_000)).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    status.store(503, Ordering::SeqCst);
    for _ in 0..20 {
        call(&service, &path).await.assert_problem(502, "upstream-error");
    }
    assert_eq!(upstream.received().len(), 21);
    let text = String::from_utf8(get(&service.url("/metrics")).await.body.to_vec()).unwrap();
    assert!(!text.contains("recast_upstream_breaker_state{"), "no breaker is kept");
    service.stop().await;
}

#[tokio::test]
async fn answers_past_the_deadline_are_failures() {
    let slow = Arc::new(AtomicU16::new(0));
    let delay = slow.clone();
    let upstream = Upstream::start(move |_| Reply {
        delay: Duration::from_millis(u64::from(delay.load(Ordering::SeqCst))),
        ..Reply::json(MEALS)
    })
    .await;
    let service = Service::start(Config { upstream_timeout_ms: 200, ..breaker_config(2, 5_000) }).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    slow.store(600, Ordering::SeqCst);
    for _ in 0..2 {
        call(&service, &path).await.assert_problem(504, "upstream-timeout");
    }
    call(&service, &path).await.assert_problem(503, "upstream-unavailable");
    assert_eq!(upstream.received().len(), 3);
    service.stop().await;
}
