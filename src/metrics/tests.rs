//! Counting, rendering, and the series each counter writes.

use std::time::Duration;

use super::counts::seconds;
use super::*;

#[test]
fn status_counts_keep_each_code_and_spill_into_other() {
    let counts = StatusCounts::default();
    assert!(counts.is_empty());
    for status in [200, 200, 404, 200, 502] {
        counts.record(status);
    }
    assert!(!counts.is_empty());
    assert_eq!(counts.snapshot(), (vec![(200, 3), (404, 1), (502, 1)], 0));
    for status in 400..410 {
        counts.record(status);
    }
    let (seen, other) = counts.snapshot();
    assert_eq!(seen.len(), STATUS_SLOTS);
    assert_eq!(seen[..4], [(200, 3), (404, 2), (502, 1), (400, 1)]);
    assert_eq!(seen[7], (405, 1), "the last free slot goes to the next new code");
    assert_eq!(other, 4, "406 to 409 found no slot");
}

#[test]
fn merged_status_counts_add_up_and_keep_their_bound() {
    let (a, b, all) = (StatusCounts::default(), StatusCounts::default(), StatusCounts::default());
    for status in [200, 200, 404, 500] {
        a.record(status);
    }
    for status in (0..9).map(|i| 201 + i) {
        b.record(status);
    }
    b.record(200);
    all.merge(&a);
    all.merge(&b);
    let (seen, other) = all.snapshot();
    let total: u64 = seen.iter().map(|(_, n)| n).sum::<u64>() + other;
    assert_eq!(total, 14, "{seen:?} {other}");
    assert_eq!(seen.len(), STATUS_SLOTS);
    // b's 200 came after its slots were full: it was b's `other`, and stays `other`.
    assert_eq!(seen[0], (200, 2));
    assert!(other > 0, "codes beyond the slots spill into other");
}

#[test]
fn status_counts_lose_nothing_when_threads_race_for_slots() {
    let counts = StatusCounts::default();
    std::thread::scope(|scope| {
        for t in 0..4u16 {
            let counts = &counts;
            scope.spawn(move || {
                for i in 0..10_000u16 {
                    counts.record(200 + (i + t) % 3);
                }
            });
        }
    });
    let (seen, other) = counts.snapshot();
    assert_eq!(other, 0);
    assert_eq!(seen.iter().map(|&(_, n)| n).sum::<u64>(), 40_000);
    let mut codes: Vec<u16> = seen.iter().map(|&(code, _)| code).collect();
    codes.sort_unstable();
    assert_eq!(codes, [200, 201, 202], "each code has one slot: {seen:?}");
}

#[test]
fn histograms_render_cumulative_buckets_sum_and_count() {
    let histogram = Histogram::new(&[1_000, 1_000_000]);
    for us in [0, 1, 500, 5_000] {
        histogram.observe(Duration::from_micros(us));
    }
    let mut out = String::new();
    histogram.write(&mut out, "h", "help");
    assert_eq!(
        out,
        "# HELP h help\n# TYPE h histogram\n\
             h_bucket{le=\"0.000001\"} 2\nh_bucket{le=\"0.001\"} 3\nh_bucket{le=\"+Inf\"} 4\n\
             h_sum 0.005501\nh_count 4\n"
    );
    assert_eq!(histogram.count(), 4);
}

#[test]
fn seconds_are_plain_decimals() {
    assert_eq!(seconds(0), "0");
    assert_eq!(seconds(500_000), "0.0005");
    assert_eq!(seconds(30_000_000_000), "30");
    assert_eq!(seconds(1_250_000_001), "1.250000001");
}

#[test]
fn the_exposition_has_every_family_with_help_and_type() {
    let metrics = Metrics::default();
    metrics.endpoint(Endpoint::Preview, 200);
    metrics.upstream_error(UpstreamErrorKind::Timeout);
    metrics.compile_failure(RulesSource::Stored);
    metrics.panicked(PanicSite::Connection);
    metrics.composed.not_a_list.store(2, std::sync::atomic::Ordering::Relaxed);
    let route = StatusCounts::default();
    route.record(201);
    let gauges = Gauges {
        routes_loaded: 3,
        routes_broken: 1,
        in_flight: 2,
        lifecycle: 1,
        store: None,
        cache: CacheGauges::default(),
    };
    let breakers = [
        crate::metrics::OriginBreaker {
            origin: "http://127.0.0.1:9".to_owned(),
            route: None,
            state: crate::metrics::BreakerState::Open,
            rejected: 4,
            opened: 1,
        },
        crate::metrics::OriginBreaker {
            origin: "http://127.0.0.1:9".to_owned(),
            route: Some(uuid::Uuid::from_u128(7)),
            state: crate::metrics::BreakerState::HalfOpen,
            rejected: 2,
            opened: 3,
        },
    ];
    let retries = [crate::metrics::OriginRetries {
        origin: "http://127.0.0.1:9".to_owned(),
        retries: 7,
        over_budget: 2,
    }];
    let limits = [crate::metrics::LimiterCounts { limit: "route:u-1".to_owned(), refused: 3 }];
    let tokens = [crate::metrics::TokenCounts {
        origin: "https://auth.example:443".to_owned(),
        fetched: [[2, 1], [5, 0], [1, 0]],
    }];
    let spans = crate::metrics::SpanCounts::default();
    for (count, n) in [
        (&spans.exported, 40),
        (&spans.dropped_full, 7),
        (&spans.dropped_failed, 3),
        (&spans.exports_ok, 2),
        (&spans.exports_failed, 1),
    ] {
        count.store(n, std::sync::atomic::Ordering::Relaxed);
    }
    let outbound = OutboundCounts {
        breakers: &breakers,
        retries: &retries,
        limits: &limits,
        tokens: &tokens,
        kept: crate::metrics::KeptCounts { breakers: 2, tokens: 1, ..Default::default() },
        spans: Some(&spans),
    };
    let text = metrics.render(gauges, [("u-1".to_owned(), &route)], outbound);
    for line in [
        "recast_trace_spans_total{outcome=\"exported\"} 40",
        "recast_trace_spans_total{outcome=\"dropped_queue_full\"} 7",
        "recast_trace_spans_total{outcome=\"dropped_export_failed\"} 3",
        "recast_trace_exports_total{outcome=\"ok\"} 2",
        "recast_trace_exports_total{outcome=\"failed\"} 1",
        "recast_requests_total{route=\"preview\",status=\"200\"} 1",
        "recast_requests_total{route=\"u-1\",status=\"201\"} 1",
        "recast_upstream_errors_total{kind=\"timeout\"} 1",
        "recast_upstream_errors_total{kind=\"not_json\"} 0",
        "recast_rule_compile_failures_total{source=\"stored\"} 1",
        "recast_panics_total{site=\"connection\"} 1",
        "recast_panics_total{site=\"request\"} 0",
        "recast_source_not_a_list_total 2",
        "recast_routes_loaded 3",
        "recast_routes_broken 1",
        "recast_in_flight_requests 2",
        "recast_lifecycle_state 1",
        "recast_upstream_duration_seconds_count 0",
        "recast_mapping_duration_seconds_bucket{le=\"+Inf\"} 0",
        "recast_upstream_breaker_state{origin=\"http://127.0.0.1:9\"} 1",
        "recast_upstream_breaker_rejections_total{origin=\"http://127.0.0.1:9\"} 4",
        "recast_upstream_breaker_opened_total{origin=\"http://127.0.0.1:9\"} 1",
        "recast_upstream_kept{kind=\"breakers\"} 2",
        "recast_upstream_kept{kind=\"tokens\"} 1",
        "recast_upstream_kept{kind=\"h2_upstreams\"} 0",
        "recast_upstream_breaker_state{origin=\"http://127.0.0.1:9\",route=\"00000000-0000-0000-0000-000000000007\"} 2",
        "recast_upstream_breaker_opened_total{origin=\"http://127.0.0.1:9\",route=\"00000000-0000-0000-0000-000000000007\"} 3",
        "recast_upstream_retries_total{origin=\"http://127.0.0.1:9\"} 7",
        "recast_upstream_retries_over_budget_total{origin=\"http://127.0.0.1:9\"} 2",
        "recast_upstream_rate_limited_total{limit=\"route:u-1\"} 3",
        "recast_upstream_token_fetches_total{origin=\"https://auth.example:443\",reason=\"new\",outcome=\"ok\"} 2",
        "recast_upstream_token_fetches_total{origin=\"https://auth.example:443\",reason=\"new\",outcome=\"failed\"} 1",
        "recast_upstream_token_fetches_total{origin=\"https://auth.example:443\",reason=\"renewal\",outcome=\"ok\"} 5",
        "recast_upstream_token_fetches_total{origin=\"https://auth.example:443\",reason=\"rejected\",outcome=\"ok\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing `{line}` in\n{text}");
    }
    // Every sample line belongs to a family announced by HELP and TYPE before it.
    let mut announced = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            announced.push(rest.split(' ').next().unwrap().to_owned());
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| announced.iter().any(|a| a == f)))
                .unwrap_or(name);
            assert!(announced.iter().any(|a| a == family), "`{line}` has no TYPE");
        }
    }
}
