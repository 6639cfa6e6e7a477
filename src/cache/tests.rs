//! Lifetimes, stale windows, flights and drops, on tokio's paused clock: no test sleeps.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use uuid::Uuid;

use super::*;

const OK: StatusCode = StatusCode::OK;

/// An upstream answer's header lines.
type Lines = &'static [(&'static str, &'static str)];

fn key(route: Uuid, n: u8) -> Key {
    Key { route, serial: 1, request: [n; 32] }
}

fn settings(ttl: u64, stale: u64) -> CacheSettings {
    CacheSettings { ttl_seconds: ttl, stale_while_revalidate_seconds: stale }
}

fn freshness(lines: &[(&str, &str)]) -> Freshness {
    Freshness::of(lines.iter().map(|(name, value)| (name.as_bytes(), value.as_bytes())))
}

/// Leads the flight of `key` and stores `body` with the upstream's `lines`; the seconds it was
/// stored fresh for.
fn store(
    cache: &Arc<AnswerCache<u32>>,
    key: &Key,
    body: &str,
    lines: &[(&str, &str)],
    settings: CacheSettings,
) -> Option<u64> {
    let Joined::Leader(leader) = cache.join(key) else { panic!("a flight was under way") };
    let body = Bytes::copy_from_slice(body.as_bytes());
    let stored = leader.store(Mapped { status: OK, body: &body, freshness: &freshness(lines) }, settings);
    leader.share(0);
    stored
}

/// What a lookup finds, in words.
fn found(cache: &AnswerCache<u32>, key: &Key) -> &'static str {
    match cache.find(key) {
        Lookup::Fresh(_) => "fresh",
        Lookup::Stale(_) => "stale",
        Lookup::Nothing => "nothing",
    }
}

async fn advance(seconds: f64) {
    tokio::time::advance(Duration::from_secs_f64(seconds)).await;
}

#[tokio::test(start_paused = true)]
async fn an_answer_is_fresh_for_its_ttl_then_stale_for_its_window_then_gone() {
    let cache = Arc::new(AnswerCache::new(1 << 20));
    let key = key(Uuid::new_v4(), 1);
    assert_eq!(store(&cache, &key, "{}", &[], settings(10, 5)), Some(10));
    let Lookup::Fresh(entry) = cache.find(&key) else { panic!("fresh") };
    assert_eq!((entry.ttl(Instant::now()), entry.age(Instant::now())), (10, 0));
    advance(9.5).await;
    assert_eq!(found(&cache, &key), "fresh");
    assert_eq!((entry.ttl(Instant::now()), entry.age(Instant::now())), (0, 9));
    advance(1.0).await;
    assert_eq!(found(&cache, &key), "stale");
    assert_eq!(entry.ttl(Instant::now()), -1);
    advance(4.0).await;
    assert_eq!(found(&cache, &key), "stale");
    advance(0.5).await;
    assert_eq!(found(&cache, &key), "nothing");
    // Without a stale window it is gone as soon as it is not fresh.
    let other = super::tests::key(key.route, 2);
    store(&cache, &other, "{}", &[], settings(10, 0));
    advance(10.0).await;
    assert_eq!(found(&cache, &other), "nothing");
}

#[tokio::test(start_paused = true)]
async fn no_freshness_keeps_nothing_whatever_the_stale_window() {
    let cache = Arc::new(AnswerCache::new(1 << 20));
    let route = Uuid::new_v4();
    let cases: [(&str, Lines, CacheSettings); 4] = [
        ("ttlSeconds 0", &[], settings(0, 30)),
        ("max-age=0", &[("cache-control", "max-age=0")], settings(60, 30)),
        ("an Age as old as max-age", &[("cache-control", "max-age=20"), ("age", "20")], settings(60, 30)),
        ("an Age older than max-age", &[("cache-control", "max-age=20"), ("age", "21")], settings(60, 30)),
    ];
    for (n, (case, lines, settings)) in cases.into_iter().enumerate() {
        let key = key(route, n as u8);
        assert_eq!(store(&cache, &key, "{}", lines, settings), None, "{case}");
        assert_eq!(found(&cache, &key), "nothing", "{case}");
    }
    assert_eq!(cache.gauges().entries, 0);
}

#[tokio::test(start_paused = true)]
async fn the_upstream_shortens_the_lifetime_and_may_forbid_stale_answers() {
    let cache = Arc::new(AnswerCache::new(1 << 20));
    let route = Uuid::new_v4();
    let cases: [(Lines, Option<u64>, f64, &str); 5] = [
        // 100 - 40 left, less than the route's 90.
        (&[("cache-control", "max-age=100"), ("age", "40")], Some(60), 61.0, "stale"),
        // Longer than the route's: the route's.
        (&[("cache-control", "max-age=1000")], Some(90), 91.0, "stale"),
        // s-maxage over max-age, and no stale answers after it.
        (&[("cache-control", "max-age=5, s-maxage=50")], Some(50), 51.0, "nothing"),
        (&[("cache-control", "max-age=50, must-revalidate")], Some(50), 51.0, "nothing"),
        // Never kept.
        (&[("cache-control", "private, max-age=50")], None, 0.0, "nothing"),
    ];
    for (n, (lines, stored, after, then)) in cases.into_iter().enumerate() {
        let key = key(route, n as u8);
        assert_eq!(store(&cache, &key, "{}", lines, settings(90, 30)), stored, "{lines:?}");
        advance(after).await;
        assert_eq!(found(&cache, &key), then, "{lines:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_age_of_any_size_counts_as_two_to_the_31_and_never_overflows() {
    let cache = Arc::new(AnswerCache::new(1 << 20));
    let key = key(Uuid::new_v4(), 1);
    assert_eq!(store(&cache, &key, "{}", &[("age", "18446744073709551615")], settings(60, 0)), Some(60));
    advance(5.0).await;
    let Lookup::Fresh(entry) = cache.find(&key) else { panic!("fresh: the route's TTL counts") };
    assert_eq!(entry.age(Instant::now()), MAX_DELTA_SECONDS);
    assert_eq!(entry.ttl(Instant::now()), 55);
}

#[tokio::test(start_paused = true)]
async fn waiters_get_the_leaders_outcome_or_start_over_when_it_goes() {
    let cache = Arc::new(AnswerCache::<u32>::new(1 << 20));
    let key = key(Uuid::new_v4(), 1);
    let Joined::Leader(leader) = cache.join(&key) else { panic!("the first call leads") };
    let Joined::Waiter(waiter) = cache.join(&key) else { panic!("the second call waits") };
    let deadline = Instant::now() + Duration::from_secs(5);
    let waiting = tokio::spawn(waiter.wait(deadline));
    leader.share(7);
    assert_eq!(waiting.await.unwrap(), Ok(Some(7)));
    // The flight is over: the next call leads a new one.
    let Joined::Leader(leader) = cache.join(&key) else { panic!("a new flight") };
    let Joined::Waiter(waiter) = cache.join(&key) else { panic!("waits") };
    drop(leader);
    assert_eq!(waiter.wait(deadline).await, Ok(None), "a leader gone hands nothing on");
    // A waiter waits no longer than its deadline.
    let Joined::Leader(_leader) = cache.join(&key) else { panic!("leads") };
    let Joined::Waiter(waiter) = cache.join(&key) else { panic!("waits") };
    assert_eq!(waiter.wait(Instant::now() + Duration::from_secs(1)).await, Err(TimedOut));
}

#[tokio::test(start_paused = true)]
async fn a_drop_detaches_the_flights_under_way_and_what_they_bring_is_not_kept() {
    let cache = Arc::new(AnswerCache::<u32>::new(1 << 20));
    let (route, other) = (Uuid::new_v4(), Uuid::new_v4());
    let (key, elsewhere) = (key(route, 1), super::tests::key(other, 1));
    let Joined::Leader(before) = cache.join(&key) else { panic!("leads") };
    let Joined::Waiter(waiter) = cache.join(&key) else { panic!("waits") };
    let Joined::Leader(unrelated) = cache.join(&elsewhere) else { panic!("leads") };
    cache.drop_route(route);
    // A call after the drop does not join the flight that began before it.
    let Joined::Leader(after) = cache.join(&key) else {
        panic!("a call after a drop must lead its own flight")
    };
    // The flight begun before stores nothing, but its waiters still get its outcome.
    let (body, freshness) = (Bytes::from_static(b"{}"), Freshness::default());
    let mapped = || Mapped { status: OK, body: &body, freshness: &freshness };
    assert_eq!(before.store(mapped(), settings(60, 0)), None);
    before.share(1);
    assert_eq!(waiter.wait(Instant::now() + Duration::from_secs(1)).await, Ok(Some(1)));
    assert_eq!(found(&cache, &key), "nothing");
    // The flight begun after, and the flights of other routes, store as usual.
    assert_eq!(after.store(mapped(), settings(60, 0)), Some(60));
    assert_eq!(unrelated.store(mapped(), settings(60, 0)), Some(60));
    assert_eq!((found(&cache, &key), found(&cache, &elsewhere)), ("fresh", "fresh"));
    // A drop takes the route's entries and leaves the others'.
    cache.drop_route(route);
    assert_eq!((found(&cache, &key), found(&cache, &elsewhere)), ("nothing", "fresh"));
}

#[test]
fn a_cache_of_no_bytes_keeps_nothing() {
    let cache = Arc::new(AnswerCache::<u32>::new(0));
    assert!(!cache.enabled());
    let key = key(Uuid::new_v4(), 1);
    assert_eq!(store(&cache, &key, "{}", &[], settings(60, 0)), None);
    assert_eq!(found(&cache, &key), "nothing");
}
