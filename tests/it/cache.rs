//! The cache of mapped answers through the service, against real upstreams on 127.0.0.1 that
//! count what they receive: coalescing, lifetimes and the upstream's `Cache-Control`,
//! stale-while-revalidate, callers with different tokens, drops on update, delete and purge,
//! the byte bound, and the settings' validation.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::Method;
use recast::config::Config;

use crate::observability::{metrics, sample};
use crate::routes::{register, registered, registration};
use crate::support::{Answer, Json, Reply, Service, Upstream, config, get, send};

/// `{"id": n, "name": name}` once mapped by the registration's rules.
fn meal(n: usize, name: &str) -> String {
    format!(r#"{{"meals":[{{"idMeal":"{n}","strMeal":"{name}"}}]}}"#)
}

/// An upstream whose n-th answer (from 1) maps to `{"id":n,...}`, after `delay`, with the
/// headers `headers` gives for the request's query.
async fn counting(
    delay: Duration,
    headers: fn(&str) -> Vec<(&'static str, String)>,
) -> (Upstream, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    let upstream = Upstream::start(move |request| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        let mut reply = Reply::json(&meal(n, "Soup"));
        reply.delay = delay;
        reply.headers = headers(request.uri.query().unwrap_or_default());
        reply
    })
    .await;
    (upstream, count)
}

fn none(_: &str) -> Vec<(&'static str, String)> {
    Vec::new()
}

async fn cached_route(service: &Service, upstream: &Upstream, cache: &str) -> String {
    registered(service, &registration(&upstream.url("/"), "", &format!(r#","cache":{cache}"#)), &[]).await
}

fn id(answer: &Answer) -> i64 {
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    match answer.json().get("id") {
        Some(Json::Number(n)) => n.as_i64().unwrap(),
        other => panic!("no id: {other:?}"),
    }
}

fn cache_status(answer: &Answer) -> &str {
    answer.header("cache-status").unwrap_or_else(|| panic!("no Cache-Status: {:?}", answer.headers))
}

/// The `Cache-Status` of a hit on an entry stored fresh for `ttl` seconds a moment ago: the
/// seconds left are counted down, so a second may have begun to pass.
fn assert_fresh_hit(answer: &Answer, ttl: u64) {
    let status = cache_status(answer);
    let left: u64 = status
        .strip_prefix("recast; hit; ttl=")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{status}"));
    assert!(left + 1 >= ttl && left <= ttl, "{status}, stored for {ttl} s");
}

#[tokio::test]
async fn fifty_concurrent_calls_to_a_cold_route_make_one_upstream_call_and_get_one_body() {
    let (upstream, count) = counting(Duration::from_millis(300), none).await;
    let service = Service::start(config()).await;
    let path = cached_route(&service, &upstream, r#"{"ttlSeconds":60}"#).await;
    assert_eq!(count.load(Ordering::SeqCst), 1, "the live call");
    let url = service.url(&path);
    let calls: Vec<_> = (0..50).map(|_| tokio::spawn(get_owned(url.clone()))).collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    assert_eq!(count.load(Ordering::SeqCst), 2, "one upstream call for the fifty");
    let bodies: std::collections::BTreeSet<_> = answers.iter().map(|a| a.body.clone()).collect();
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    assert_eq!(id(&answers[0]), 2);
    // One call led; the others waited for it, or (had they come after it) were hits.
    let statuses: Vec<&str> = answers.iter().map(cache_status).collect();
    let led = statuses.iter().filter(|s| **s == "recast; fwd=miss; stored; ttl=60").count();
    let waited = statuses.iter().filter(|s| **s == "recast; fwd=miss; stored; ttl=60; collapsed").count();
    let hits = statuses.iter().filter(|s| s.starts_with("recast; hit; ")).count();
    assert_eq!((led, waited + hits), (1, 49), "{statuses:?}");
    assert!(waited > 0, "{statuses:?}");
    let text = metrics(&service).await;
    assert_eq!(sample(&text, "recast_cache_misses_total"), 1.0);
    assert_eq!(sample(&text, "recast_cache_coalesced_total"), waited as f64);
    assert_eq!(sample(&text, "recast_cache_entries"), 1.0);
    service.stop().await;
}

async fn get_owned(url: String) -> Answer {
    get(&url).await
}

/// Waits until `recast_cache_coalesced_total` is `n`: that many calls wait on another's flight.
async fn coalesced(service: &Service, n: f64) {
    let deadline = std::time::Instant::now() + crate::support::PATIENCE;
    while sample(&metrics(service).await, "recast_cache_coalesced_total") < n {
        assert!(std::time::Instant::now() < deadline, "no call waited on another's flight");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn hits_within_the_ttl_make_no_upstream_call_and_say_how_old_they_are() {
    let (upstream, count) = counting(Duration::ZERO, none).await;
    let service = Service::start(config()).await;
    let path = cached_route(&service, &upstream, r#"{"ttlSeconds":1}"#).await;
    let url = service.url(&path);
    let first = get(&url).await;
    assert_eq!((id(&first), cache_status(&first)), (2, "recast; fwd=miss; stored; ttl=1"));
    assert!(first.header("age").is_none());
    let hit = get(&url).await;
    assert_eq!(id(&hit), 2);
    assert_eq!(cache_status(&hit), "recast; hit; ttl=0");
    assert_eq!(hit.header("age"), Some("0"));
    let timing = hit.header("server-timing").unwrap();
    assert!(timing.starts_with("cache;dur=") && !timing.contains("upstream"), "{timing}");
    assert_eq!(count.load(Ordering::SeqCst), 2, "the hit made no upstream call");
    assert!(first.header("server-timing").unwrap().starts_with("upstream;dur="));
    let text = metrics(&service).await;
    assert_eq!(sample(&text, "recast_cache_hits_total"), 1.0);
    assert_eq!(sample(&text, "recast_cache_misses_total"), 1.0);
    // When an entry's time is up is the cache's own unit tests' matter, on a paused clock
    // (`src/cache/tests.rs`); a call that finds nothing goes upstream as the first call did.
    service.stop().await;
}

#[tokio::test]
async fn the_upstreams_cache_control_is_honoured() {
    let (upstream, count) = counting(Duration::ZERO, |query| {
        let control = match query {
            "c=no-store" => "no-store",
            "c=private" => "private, max-age=600",
            "c=no-cache" => "no-cache",
            "c=short" => "max-age=1",
            "c=aged" => "max-age=100, public",
            "c=older" => "public, s-maxage=100, max-age=5",
            _ => return Vec::new(),
        };
        let mut headers = vec![("cache-control", control.to_owned())];
        match query {
            "c=aged" => headers.push(("age", "40".to_owned())),
            "c=older" => headers.push(("age", "70".to_owned())),
            _ => {}
        }
        headers
    })
    .await;
    let service = Service::start(config()).await;
    let path = cached_route(&service, &upstream, r#"{"ttlSeconds":60}"#).await;
    for never in ["no-store", "private", "no-cache"] {
        let url = service.url(&format!("{path}?c={never}"));
        let before = count.load(Ordering::SeqCst);
        let answers = [get(&url).await, get(&url).await];
        assert_eq!(count.load(Ordering::SeqCst), before + 2, "{never}: never reused");
        assert_ne!(id(&answers[0]), id(&answers[1]), "{never}");
        assert_eq!(cache_status(&answers[1]), "recast; fwd=miss", "{never}");
    }
    // max-age below the route's TTL wins.
    let url = service.url(&format!("{path}?c=short"));
    assert_eq!(cache_status(&get(&url).await), "recast; fwd=miss; stored; ttl=1");
    let hit = get(&url).await;
    assert_eq!(cache_status(&hit), "recast; hit; ttl=0");
    // The age the answer already has counts against the upstream's lifetime (100 - 40 = 60 s
    // left: the route's 60 s), and shows in `Age`.
    let url = service.url(&format!("{path}?c=aged"));
    assert_eq!(cache_status(&get(&url).await), "recast; fwd=miss; stored; ttl=60");
    let hit = get(&url).await;
    assert_eq!(hit.header("age"), Some("40"));
    assert_fresh_hit(&hit, 60);
    let url = service.url(&format!("{path}?c=older"));
    assert_eq!(cache_status(&get(&url).await), "recast; fwd=miss; stored; ttl=30");
    // A lifetime above the route's TTL does not lengthen it.
    let url = service.url(&format!("{path}?c=long"));
    assert_eq!(cache_status(&get(&url).await), "recast; fwd=miss; stored; ttl=60");
    service.stop().await;
}

#[tokio::test]
async fn a_stale_answer_is_given_at_once_while_one_refresh_runs_and_the_next_call_sees_it() {
    // The upstream holds its answers while the gate is shut.
    let (gate, shut) = tokio::sync::watch::channel(true);
    let count = Arc::new(AtomicUsize::new(0));
    let upstream = {
        let count = count.clone();
        Upstream::start(move |_| {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            Reply { gate: Some(shut.clone()), ..Reply::json(&meal(n, "Soup")) }
        })
        .await
    };
    let service = Service::start(config()).await;
    let path =
        cached_route(&service, &upstream, r#"{"ttlSeconds":1,"staleWhileRevalidateSeconds":30}"#).await;
    let url = service.url(&path);
    assert_eq!(id(&get(&url).await), 2);
    // A second passes for real (here and in the refresh-panic test): the service's calls run on
    // its workers' own runtimes, whose clocks a test cannot pause. The cache's lifetimes are its
    // unit tests' matter, on a paused clock; this one is about the refresh a stale answer starts.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    gate.send_replace(false);
    // Both are answered from the entry while the refresh is held at the upstream.
    let stale = [get(&url).await, get(&url).await];
    crate::support::reached(&count, 3, "the refresh did not reach the upstream").await;
    for answer in &stale {
        assert_eq!(id(answer), 2);
        assert!(cache_status(answer).starts_with("recast; fwd=stale; ttl=-"), "{}", cache_status(answer));
        assert!(answer.header("server-timing").unwrap().starts_with("cache;dur="));
    }
    gate.send_replace(true);
    // One refresh for both; once it has landed, calls get its answer from the cache.
    let deadline = std::time::Instant::now() + crate::support::PATIENCE;
    let refreshed = loop {
        let answer = get(&url).await;
        if id(&answer) == 3 {
            break answer;
        }
        assert!(cache_status(&answer).starts_with("recast; fwd=stale"), "{}", cache_status(&answer));
        assert!(std::time::Instant::now() < deadline, "the refresh never landed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(cache_status(&refreshed), "recast; hit; ttl=0");
    assert_eq!(count.load(Ordering::SeqCst), 3, "one refresh, however many stale answers");
    assert!(sample(&metrics(&service).await, "recast_cache_stale_total") >= 2.0);
    service.stop().await;
}

/// A route called with GET whose upstream takes the caller's body by POST, like a search or
/// GraphQL upstream behind a cached route; the upstream answers with the user the body names and
/// the body's type.
async fn body_route(service: &Service, upstream: &Upstream) -> String {
    let rules = r#"{"newBodyFields":{"s":{"key":"s","type":"String"}},"oldBodyFields":{"s":{"keys":["s"]}}}"#;
    let body = format!(
        r#"{{"path":"search","method":"GET","originalRoute":{{"originalApi":{{"baseUrl":"{}"}},"path":"graphql","method":"POST"}},"rulesAsString":{rules},"cache":{{"ttlSeconds":60}}}}"#,
        upstream.url("/")
    );
    registered(service, &body, &[]).await
}

async fn body_upstream() -> Upstream {
    Upstream::start(|request| {
        let text = String::from_utf8_lossy(&request.body);
        let user =
            text.split(r#""user":""#).nth(1).and_then(|rest| rest.split('"').next()).unwrap_or("nobody");
        let kind = request.headers.get("content-type").map_or("none", |v| v.to_str().unwrap());
        Reply::json(&format!(r#"{{"s":"data-of-{user} as {kind}"}}"#))
    })
    .await
}

#[tokio::test]
async fn a_callers_body_and_its_type_are_in_the_key_so_no_caller_picks_anothers_answer() {
    let upstream = body_upstream().await;
    let service = Service::start(config()).await;
    let url = service.url(&body_route(&service, &upstream).await);
    let call = |body: &'static str, kind: &'static str| {
        let url = url.clone();
        async move { send(Method::GET, &url, &[("content-type", kind)], body).await }
    };
    let s = |answer: &Answer| answer.json().get("s").and_then(Json::as_str).unwrap().to_owned();
    let alice = call(r#"{"user":"alice"}"#, "application/json").await;
    assert_eq!(
        (s(&alice).as_str(), cache_status(&alice)),
        ("data-of-alice as application/json", "recast; fwd=miss; stored; ttl=60")
    );
    // Within the TTL, another caller's body gets its own answer, not alice's.
    let bob = call(r#"{"user":"bob"}"#, "application/json").await;
    assert_eq!(
        (s(&bob).as_str(), cache_status(&bob)),
        ("data-of-bob as application/json", "recast; fwd=miss; stored; ttl=60")
    );
    // The same body as another type is another request.
    let typed = call(r#"{"user":"alice"}"#, "text/plain").await;
    assert_eq!(
        (s(&typed).as_str(), cache_status(&typed)),
        ("data-of-alice as text/plain", "recast; fwd=miss; stored; ttl=60")
    );
    // The same request again is a hit on its own answer.
    let again = call(r#"{"user":"alice"}"#, "application/json").await;
    assert_eq!(s(&again), "data-of-alice as application/json");
    assert_fresh_hit(&again, 60);
    let bodies: Vec<String> =
        upstream.received()[1..].iter().map(|r| String::from_utf8_lossy(&r.body).into_owned()).collect();
    assert_eq!(bodies, [r#"{"user":"alice"}"#, r#"{"user":"bob"}"#, r#"{"user":"alice"}"#]);
    service.stop().await;
}

#[tokio::test]
async fn a_call_after_a_purge_goes_upstream_and_does_not_join_a_call_begun_before() {
    let (gate, shut) = tokio::sync::watch::channel(false);
    let count = Arc::new(AtomicUsize::new(0));
    let upstream = {
        let count = count.clone();
        Upstream::start(move |request| {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            // The registration's live call is answered at once; route calls wait at the gate.
            let gate = request.uri.query().is_some_and(|q| q.contains("hold")).then(|| shut.clone());
            Reply { gate, ..Reply::json(&meal(n, "Soup")) }
        })
        .await
    };
    let service = Service::start(config()).await;
    let path = cached_route(&service, &upstream, r#"{"ttlSeconds":60}"#).await;
    let uuid = path.split('/').nth(2).unwrap().to_owned();
    let url = service.url(&format!("{path}?hold=1"));
    let before = tokio::spawn(get_owned(url.clone()));
    crate::support::reached(&count, 2, "the first call did not reach the upstream").await;
    assert_eq!(
        send(Method::DELETE, &service.url(&format!("/v1/routes/{uuid}/cache")), &[], "").await.status,
        204
    );
    let after = tokio::spawn(get_owned(url.clone()));
    // The call after the purge makes its own upstream call, though one for its key is under way.
    crate::support::reached(&count, 3, "the call after the purge joined the call begun before it").await;
    gate.send_replace(true);
    let (before, after) = (before.await.unwrap(), after.await.unwrap());
    // What the call begun before the purge brought is not kept; the later call's answer is.
    assert_eq!((id(&before), cache_status(&before)), (2, "recast; fwd=miss"));
    assert_eq!((id(&after), cache_status(&after)), (3, "recast; fwd=miss; stored; ttl=60"));
    let hit = get(&url).await;
    assert_eq!(id(&hit), 3);
    assert_fresh_hit(&hit, 60);
    assert_eq!(sample(&metrics(&service).await, "recast_cache_coalesced_total"), 0.0);
    service.stop().await;
}

#[tokio::test]
async fn no_freshness_keeps_nothing_and_an_age_of_any_size_is_answered_as_two_to_the_31() {
    let (upstream, count) = counting(Duration::ZERO, |query| match query {
        "c=max-age-0" => vec![("cache-control", "max-age=0".to_owned())],
        "c=huge-age" => vec![("age", "18446744073709551615".to_owned())],
        _ => Vec::new(),
    })
    .await;
    let service = Service::start(config()).await;
    // `ttlSeconds: 0` with a stale window keeps nothing, and so does `max-age=0`.
    let zero =
        cached_route(&service, &upstream, r#"{"ttlSeconds":0,"staleWhileRevalidateSeconds":60}"#).await;
    let ttl =
        cached_route(&service, &upstream, r#"{"ttlSeconds":60,"staleWhileRevalidateSeconds":60}"#).await;
    for url in [service.url(&zero), service.url(&format!("{ttl}?c=max-age-0"))] {
        let before = count.load(Ordering::SeqCst);
        for _ in 0..2 {
            assert_eq!(cache_status(&get(&url).await), "recast; fwd=miss", "{url}");
        }
        assert_eq!(count.load(Ordering::SeqCst), before + 2, "{url}: nothing kept");
    }
    assert_eq!(sample(&metrics(&service).await, "recast_cache_entries"), 0.0);
    // An upstream `Age` past any number counts as 2^31 seconds, in a hit's `Age` too.
    let url = service.url(&format!("{ttl}?c=huge-age"));
    assert_eq!(cache_status(&get(&url).await), "recast; fwd=miss; stored; ttl=60");
    let hit = get(&url).await;
    assert_eq!(hit.status, 200, "{}", String::from_utf8_lossy(&hit.body));
    assert_eq!(hit.header("age"), Some("2147483648"));
    assert_fresh_hit(&hit, 60);
    assert_eq!(sample(&metrics(&service).await, r#"recast_panics_total{site="request"}"#), 0.0);
    service.stop().await;
}

#[tokio::test]
async fn callers_with_different_tokens_never_get_each_others_answers() {
    // The upstream answers each token with its own name.
    let upstream = Upstream::start(|request| {
        let token = request.headers.get("authorization").map_or("none", |v| v.to_str().unwrap());
        Reply::json(&meal(1, token))
    })
    .await;
    let service = Service::start(config()).await;
    let body = registration(&upstream.url("/"), "", r#","cache":{"ttlSeconds":60}"#);
    let path = registered(&service, &body, &[("x-mapped-auth", "Bearer first")]).await;
    let url = service.url(&path);
    let call = |token: &'static str| {
        let url = url.clone();
        async move { send(Method::GET, &url, &[("x-mapped-auth", token)], "").await }
    };
    let name = |answer: &Answer| answer.json().get("name").and_then(Json::as_str).unwrap().to_owned();
    for round in 0..2 {
        let (a, b) = tokio::join!(call("Bearer alice"), call("Bearer bob"));
        assert_eq!(name(&a), "Bearer alice", "round {round}");
        assert_eq!(name(&b), "Bearer bob", "round {round}");
        for answer in [&a, &b] {
            match round {
                0 => assert_eq!(cache_status(answer), "recast; fwd=miss; stored; ttl=60"),
                _ => assert_fresh_hit(answer, 60),
            }
        }
    }
    let sent: Vec<String> = upstream.received()[1..]
        .iter()
        .map(|r| r.headers["authorization"].to_str().unwrap().to_owned())
        .collect();
    let mut sorted = sent.clone();
    sorted.sort();
    assert_eq!(sorted, ["Bearer alice", "Bearer bob"], "each token went upstream once: {sent:?}");
    // Without a token the runtime-auth route still answers 401, cache or not.
    get(&url).await.assert_problem(401, "auth-required");
    service.stop().await;
}

#[tokio::test]
async fn an_update_drops_the_old_entries_a_delete_404s_and_a_purge_sends_the_next_call_upstream() {
    let (upstream, count) = counting(Duration::ZERO, none).await;
    let service = Service::start(config()).await;
    let cache = r#","cache":{"ttlSeconds":600}"#;
    let path = registered(&service, &registration(&upstream.url("/"), "", cache), &[]).await;
    let uuid = path.split('/').nth(2).unwrap().to_owned();
    let url = service.url(&path);
    assert_eq!(id(&get(&url).await), 2);
    assert_fresh_hit(&get(&url).await, 600);

    // Purge: the next call goes upstream.
    let purge = service.url(&format!("/v1/routes/{uuid}/cache"));
    let purged = send(Method::DELETE, &purge, &[], "").await;
    assert_eq!(purged.status, 204);
    assert_eq!(sample(&metrics(&service).await, "recast_cache_entries"), 0.0);
    let after = get(&url).await;
    assert_eq!((id(&after), cache_status(&after)), (3, "recast; fwd=miss; stored; ttl=600"));
    send(Method::GET, &purge, &[], "").await.assert_problem(405, "method-not-allowed");
    let unknown = service.url(&format!("/v1/routes/{}/cache", uuid::Uuid::new_v4()));
    send(Method::DELETE, &unknown, &[], "").await.assert_problem(404, "not-found");

    // An update (its live call is upstream call 4) drops the entries at once.
    let manage = service.url(&format!("/v1/routes/{uuid}"));
    let updated = send(Method::PUT, &manage, &[], registration(&upstream.url("/"), "", cache)).await;
    assert_eq!(updated.status, 200);
    assert_eq!(sample(&metrics(&service).await, "recast_cache_entries"), 0.0);
    let after = get(&url).await;
    assert_eq!((id(&after), cache_status(&after)), (5, "recast; fwd=miss; stored; ttl=600"));
    // The listing shows the settings.
    let shown = get(&manage).await.json();
    assert_eq!(
        shown.get("cache").unwrap().to_string(),
        r#"{"ttlSeconds":600,"staleWhileRevalidateSeconds":0}"#
    );

    // A delete: 404 at once, nothing answered from the cache.
    assert_eq!(send(Method::DELETE, &manage, &[], "").await.status, 204);
    get(&url).await.assert_problem(404, "not-found");
    assert_eq!(sample(&metrics(&service).await, "recast_cache_entries"), 0.0);
    assert_eq!(count.load(Ordering::SeqCst), 5);
    service.stop().await;
}

#[tokio::test]
async fn a_cache_smaller_than_the_working_set_stays_within_its_bytes() {
    // Answers of about 4 KB each (a long name), 100 different queries, a 64 KiB cache.
    let name = "x".repeat(4000);
    let upstream = Upstream::start(move |_| Reply::json(&meal(1, &name))).await;
    let bound = 64 << 10;
    let service = Service::start(Config { cache_bytes: bound, ..config() }).await;
    let path = cached_route(&service, &upstream, r#"{"ttlSeconds":600}"#).await;
    for n in 0..100 {
        let answer = get(&service.url(&format!("{path}?n={n}"))).await;
        assert_eq!(cache_status(&answer), "recast; fwd=miss; stored; ttl=600", "query {n}");
        let text = metrics(&service).await;
        let held = sample(&text, "recast_cache_bytes");
        assert!(held <= bound as f64, "{held} bytes held after query {n}, over {bound}");
    }
    let text = metrics(&service).await;
    let entries = sample(&text, "recast_cache_entries");
    assert!((10.0..16.0).contains(&entries), "{entries} entries of about 4 KB in 64 KiB");
    assert!(sample(&text, "recast_cache_evictions_total") >= 100.0 - entries, "{text}");
    // The most recent query is still held.
    assert_fresh_hit(&get(&service.url(&format!("{path}?n=99"))).await, 600);
    service.stop().await;
}

#[tokio::test]
async fn cache_settings_are_validated_with_locations_and_only_for_get_routes() {
    let upstream = Upstream::json(crate::routes::MEALS).await;
    let service = Service::start(config()).await;
    let cases = [
        (r#","method":"POST","cache":{"ttlSeconds":5}"#, "/cache"),
        (r#","cache":{"ttlSeconds":-1}"#, "/cache/ttlSeconds"),
        (r#","cache":{"ttlSeconds":1.5}"#, "/cache/ttlSeconds"),
        (r#","cache":{"ttlSeconds":"60"}"#, "/cache/ttlSeconds"),
        (r#","cache":{"ttlSeconds":31536001}"#, "/cache/ttlSeconds"),
        (r#","cache":{"staleWhileRevalidateSeconds":5}"#, "/cache/ttlSeconds"),
        (
            r#","cache":{"ttlSeconds":5,"staleWhileRevalidateSeconds":null}"#,
            "/cache/staleWhileRevalidateSeconds",
        ),
        (r#","cache":{"ttlSeconds":5,"ttl":5}"#, "/cache/ttl"),
        (r#","cache":60"#, "/cache"),
    ];
    for (extra, location) in cases {
        let answer = register(&service, &registration(&upstream.url("/"), "", extra), &[]).await;
        let problem = answer.assert_problem(400, "invalid-request");
        let errors = problem.get("errors").unwrap().as_array();
        let locations: Vec<&str> =
            errors.iter().map(|e| e.get("location").and_then(Json::as_str).unwrap()).collect();
        assert_eq!(locations, [location], "{extra}");
    }
    assert_eq!(upstream.received().len(), 0, "nothing invalid was called");
    // `null` is no cache, as is no member at all; a route without one carries no Cache-Status.
    let path = registered(&service, &registration(&upstream.url("/"), "", r#","cache":null"#), &[]).await;
    let answer = get(&service.url(&path)).await;
    assert_eq!(answer.status, 200);
    assert!(answer.header("cache-status").is_none());
    let uuid = path.split('/').nth(2).unwrap();
    assert!(get(&service.url(&format!("/v1/routes/{uuid}"))).await.json().get("cache").is_none());
    service.stop().await;
}

#[tokio::test]
async fn with_the_cache_off_every_call_goes_upstream_and_says_so() {
    let (upstream, count) = counting(Duration::ZERO, none).await;
    let service = Service::start(Config { cache_bytes: 0, ..config() }).await;
    let path = cached_route(&service, &upstream, r#"{"ttlSeconds":60}"#).await;
    let url = service.url(&path);
    let answers = [get(&url).await, get(&url).await];
    assert_eq!((id(&answers[0]), id(&answers[1])), (2, 3));
    assert_eq!(cache_status(&answers[1]), "recast; fwd=bypass; detail=cache-off");
    assert_eq!(count.load(Ordering::SeqCst), 3);
    service.stop().await;
}

#[tokio::test]
async fn a_flight_outlives_the_caller_who_began_it_and_its_waiters_take_its_answer() {
    use tokio::io::AsyncWriteExt as _;
    let (upstream, count) = counting(Duration::from_millis(1500), none).await;
    let service = Service::start(config()).await;
    let path = cached_route(&service, &upstream, r#"{"ttlSeconds":60}"#).await;
    // The leader: a client that sends its call and hangs up before the upstream answers.
    let mut leader = tokio::net::TcpStream::connect(service.addr).await.unwrap();
    leader.write_all(format!("GET {path} HTTP/1.1\r\nhost: recast\r\n\r\n").as_bytes()).await.unwrap();
    crate::support::reached(&count, 2, "the leader's call did not reach the upstream").await;
    // A second call waits on the leader's flight; then the leader goes.
    let waiter = tokio::spawn(get_owned(service.url(&path)));
    coalesced(&service, 1.0).await;
    drop(leader);
    // The flight's upstream call goes on, and its answer is the waiter's: the request is not
    // sent a second time.
    let answer = waiter.await.unwrap();
    assert_eq!((id(&answer), cache_status(&answer)), (2, "recast; fwd=miss; stored; ttl=60; collapsed"));
    assert_eq!(count.load(Ordering::SeqCst), 2, "one call at registration, one flight");
    // And it was kept.
    let hit = get(&service.url(&path)).await;
    assert_eq!(id(&hit), 2);
    let text = metrics(&service).await;
    assert_eq!(sample(&text, "recast_cache_coalesced_total"), 1.0);
    assert_eq!(sample(&text, "recast_cache_misses_total"), 1.0);
    service.stop().await;
}

#[tokio::test]
async fn a_flight_no_caller_waits_for_any_more_is_called_off() {
    use tokio::io::AsyncWriteExt as _;
    let (upstream, count) = counting(Duration::from_millis(1500), none).await;
    let service = Service::start(config()).await;
    let path = cached_route(&service, &upstream, r#"{"ttlSeconds":60}"#).await;
    // The only caller sends its call and hangs up before the upstream answers.
    let mut caller = tokio::net::TcpStream::connect(service.addr).await.unwrap();
    caller.write_all(format!("GET {path} HTTP/1.1\r\nhost: recast\r\n\r\n").as_bytes()).await.unwrap();
    crate::support::reached(&count, 2, "the call did not reach the upstream").await;
    drop(caller);
    // No one waits for the flight: it is called off, so the next call begins its own (it does
    // not wait on the one no admitted call holds).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let answer = get(&service.url(&path)).await;
    assert_eq!((id(&answer), cache_status(&answer)), (3, "recast; fwd=miss; stored; ttl=60"));
    assert_eq!(count.load(Ordering::SeqCst), 3);
    service.stop().await;
}

#[tokio::test]
async fn a_flight_that_panics_answers_500_to_its_callers_and_is_not_sent_again() {
    let (service, _upstream, panicking, path) = panicking_service(r#"{"ttlSeconds":60}"#).await;
    // A miss whose flight panics (resolving the upstream's name): each caller gets 500, once,
    // and the flight is not led again (as often as it panics, until the deadline).
    panicking.store(true, Ordering::SeqCst);
    let url = service.url(&path);
    let calls: Vec<_> = (0..3).map(|_| tokio::spawn(get_owned(url.clone()))).collect();
    for call in calls {
        call.await.unwrap().assert_problem(500, "internal-error");
    }
    let text = metrics(&service).await;
    let flights = sample(&text, r#"recast_panics_total{site="flight"}"#);
    assert!((1.0..=3.0).contains(&flights), "{flights} flights panicked for three calls");
    panicking.store(false, Ordering::SeqCst);
    let answer = get(&url).await;
    assert_eq!(answer.status, 200);
    service.stop().await;
}

#[tokio::test]
async fn the_registration_in_the_caching_doc_registers_a_cached_route() {
    let doc = include_str!("../../docs/caching.md");
    let start = doc.find("```json\n").expect("a json block") + "```json\n".len();
    let end = start + doc[start..].find("```").expect("closed");
    let upstream = Upstream::json(crate::routes::MEALS).await;
    let body = doc[start..end].replace("https://www.themealdb.com/", &upstream.url("/"));
    let service = Service::start(config()).await;
    let answer = register(&service, &body, &[]).await;
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    let uuid = answer.json().get("uuid").and_then(Json::as_str).unwrap().to_owned();
    let shown = get(&service.url(&format!("/v1/routes/{uuid}"))).await.json();
    assert_eq!(
        shown.get("cache").unwrap().to_string(),
        r#"{"ttlSeconds":60,"staleWhileRevalidateSeconds":30}"#
    );
    let path = answer.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    assert_eq!(cache_status(&get(&service.url(&path)).await), "recast; fwd=miss; stored; ttl=60");
    service.stop().await;
}

#[tokio::test]
async fn concurrent_calls_share_one_upstream_error_and_the_next_call_tries_again() {
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let count = Arc::new(AtomicUsize::new(0));
    let upstream = {
        let (failing, count) = (failing.clone(), count.clone());
        Upstream::start(move |_| {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            let mut reply = if failing.load(Ordering::SeqCst) {
                Reply::with(500, "{}")
            } else {
                Reply::json(&meal(n, "Soup"))
            };
            // Long enough for all ten calls to arrive while the first is under way.
            reply.delay = Duration::from_millis(1000);
            reply
        })
        .await
    };
    let service = Service::start(config()).await;
    let path = cached_route(&service, &upstream, r#"{"ttlSeconds":60}"#).await;
    failing.store(true, Ordering::SeqCst);
    let url = service.url(&path);
    let calls: Vec<_> = (0..10).map(|_| tokio::spawn(get_owned(url.clone()))).collect();
    for call in calls {
        let answer = call.await.unwrap();
        answer.assert_problem(502, "upstream-error");
        assert!(cache_status(&answer).starts_with("recast; fwd=miss"), "{}", cache_status(&answer));
    }
    assert_eq!(count.load(Ordering::SeqCst), 2, "the live call and one call for the ten");
    // Errors are not kept: the next call goes upstream, and its answer is.
    failing.store(false, Ordering::SeqCst);
    let answer = get(&url).await;
    assert_eq!((id(&answer), cache_status(&answer)), (3, "recast; fwd=miss; stored; ttl=60"));
    service.stop().await;
}

/// Resolves every name to 127.0.0.1, and panics while told to: a stand-in for a bug in a
/// background refresh, which resolves its upstream's host on a connection of its own.
struct PanicsWhenTold(Arc<std::sync::atomic::AtomicBool>);

impl recast::policy::Lookup for PanicsWhenTold {
    fn lookup(
        &self,
        host: &str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Vec<std::net::IpAddr>>> + Send>>
    {
        if self.0.load(Ordering::SeqCst) {
            panic!("{}: resolving {host}", recast::fuzzing::DELIBERATE_PANIC);
        }
        Box::pin(std::future::ready(Ok(vec![std::net::IpAddr::from([127, 0, 0, 1])])))
    }
}

/// A service whose upstream's name resolves through [`PanicsWhenTold`] (panicking once told), and
/// a route to it registered with `cache`; each answer, numbered, closes its connection, so each
/// upstream call resolves the name again. Returns the service, the upstream, the switch and the
/// route's path.
async fn panicking_service(cache: &str) -> (Service, Upstream, Arc<std::sync::atomic::AtomicBool>, String) {
    let count = Arc::new(AtomicUsize::new(0));
    let upstream = Upstream::start(move |_| {
        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
        Reply { headers: vec![("connection", "close".to_owned())], ..Reply::json(&meal(n, "Soup")) }
    })
    .await;
    let panicking = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let allow: recast::policy::AllowList = "127.0.0.0/8".parse().unwrap();
    let outbound = recast::server::Outbound {
        policy: Arc::new(recast::policy::OutboundPolicy::new(&allow)),
        lookup: Arc::new(PanicsWhenTold(panicking.clone())),
    };
    let service = Service::start_with(config(), outbound).await;
    let base = format!("http://upstream.test:{}/", upstream.addr.port());
    let path = registered(&service, &registration(&base, "", &format!(r#","cache":{cache}"#)), &[]).await;
    (service, upstream, panicking, path)
}

#[tokio::test]
async fn a_panic_in_a_background_refresh_is_counted_and_the_next_stale_call_refreshes_again() {
    let (service, _upstream, panicking, path) =
        panicking_service(r#"{"ttlSeconds":1,"staleWhileRevalidateSeconds":60}"#).await;
    let url = service.url(&path);
    assert_eq!(id(&get(&url).await), 2);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    panicking.store(true, Ordering::SeqCst);
    let refreshes = |text: &str| sample(text, r#"recast_panics_total{site="refresh"}"#);
    for n in 1..=2 {
        // Answered from the stale entry; its refresh panics, and is counted.
        let stale = get(&url).await;
        assert_eq!(id(&stale), 2);
        assert!(cache_status(&stale).starts_with("recast; fwd=stale"), "{}", cache_status(&stale));
        let deadline = std::time::Instant::now() + crate::support::PATIENCE;
        while refreshes(&metrics(&service).await) < f64::from(n) {
            assert!(std::time::Instant::now() < deadline, "the refresh's panic was not counted");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // The panicking refresh handed nothing on, so a later one leads again and lands.
    panicking.store(false, Ordering::SeqCst);
    let deadline = std::time::Instant::now() + crate::support::PATIENCE;
    while id(&get(&url).await) != 3 {
        assert!(std::time::Instant::now() < deadline, "no refresh landed after the panics");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = metrics(&service).await;
    assert_eq!(refreshes(&text), 2.0);
    assert_eq!(sample(&text, r#"recast_panics_total{site="request"}"#), 0.0);
    service.stop().await;
}
