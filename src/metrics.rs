//! The service's counters and histograms, and their Prometheus text form (`GET /metrics`).
//!
//! Everything here is a plain atomic, updated with relaxed ordering on the request path: a
//! request costs one increment for its status and two per histogram it feeds (its bucket and the
//! sum), with no lock and no allocation. Counts per route live with the route (see
//! [`StatusCounts`]), so a route's series disappear when it is deleted and survive an update.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

/// Answers by status code, for one route or one endpoint.
///
/// A few distinct codes are counted exactly (an endpoint or a route answers only a handful of
/// them); when more than [`STATUS_SLOTS`] codes have been seen, the rest are counted under
/// `status="other"` rather than growing per route.
#[derive(Debug, Default)]
pub struct StatusCounts {
    codes: [AtomicU16; STATUS_SLOTS],
    counts: [AtomicU64; STATUS_SLOTS],
    other: AtomicU64,
}

/// Distinct status codes counted exactly per route or endpoint.
pub const STATUS_SLOTS: usize = 8;

impl StatusCounts {
    /// Counts one answer with `status`.
    #[inline]
    pub fn record(&self, status: u16) {
        for (code, count) in self.codes.iter().zip(&self.counts) {
            let mut seen = code.load(Ordering::Relaxed);
            if seen == 0 {
                // A free slot: claim it, unless another thread just did (maybe for this code).
                seen = match code.compare_exchange(0, status, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => status,
                    Err(now) => now,
                };
            }
            if seen == status {
                count.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        self.other.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether nothing was counted yet (the first slot is claimed by the first answer).
    pub fn is_empty(&self) -> bool {
        self.codes[0].load(Ordering::Relaxed) == 0
    }

    /// `(status, count)` of every code seen, in slot order, and the count of the rest.
    pub fn snapshot(&self) -> (Vec<(u16, u64)>, u64) {
        let seen = self
            .codes
            .iter()
            .zip(&self.counts)
            .map(|(code, count)| (code.load(Ordering::Relaxed), count.load(Ordering::Relaxed)))
            .filter(|&(code, count)| code != 0 && count > 0)
            .collect();
        (seen, self.other.load(Ordering::Relaxed))
    }

    /// Writes one `name{label="value",status="…"} count` line per status seen.
    fn write(&self, out: &mut String, name: &str, label: &str, value: &str) {
        let (seen, other) = self.snapshot();
        for (status, count) in seen {
            let _ = writeln!(out, "{name}{{{label}=\"{value}\",status=\"{status}\"}} {count}");
        }
        if other > 0 {
            let _ = writeln!(out, "{name}{{{label}=\"{value}\",status=\"other\"}} {other}");
        }
    }
}

/// A histogram of durations with fixed bucket bounds, in seconds as Prometheus wants them.
#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds in nanoseconds, ascending.
    bounds: &'static [u64],
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    buckets: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [u64]) -> Histogram {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    #[inline]
    pub fn observe(&self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let bucket = self.bounds.partition_point(|&bound| bound < ns);
        if let Some(count) = self.buckets.get(bucket) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in self.buckets.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            match self.bounds.get(i) {
                Some(&bound) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cumulative}", seconds(bound));
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let _ = writeln!(out, "{name}_sum {}", seconds(self.sum_ns.load(Ordering::Relaxed)));
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

/// Nanoseconds as seconds in plain decimal (no exponent), trailing zeros trimmed.
fn seconds(ns: u64) -> String {
    let text = format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000);
    let trimmed = text.trim_end_matches('0');
    trimmed.strip_suffix('.').unwrap_or(trimmed).to_owned()
}

/// Bounds of the upstream latency histogram: 0.5 ms to 30 s.
const UPSTREAM_BOUNDS: &[u64] = &[
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
];

/// Bounds of the mapping latency histogram: 1 µs to 100 ms (parse and execute of one answer).
const MAPPING_BOUNDS: &[u64] = &[
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    100_000_000,
];

/// The endpoints other than route calls, as the `route` label names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Endpoint {
    Preview,
    Mapping,
    Routes,
    Health,
    Metrics,
    OpenApi,
    Playground,
    /// A route call that did not reach a route: unknown uuid, or refused before routing.
    Call,
    /// Any other path.
    Other,
}

impl Endpoint {
    const ALL: [Endpoint; 9] = [
        Endpoint::Preview,
        Endpoint::Mapping,
        Endpoint::Routes,
        Endpoint::Health,
        Endpoint::Metrics,
        Endpoint::OpenApi,
        Endpoint::Playground,
        Endpoint::Call,
        Endpoint::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Preview => "preview",
            Endpoint::Mapping => "mapping",
            Endpoint::Routes => "routes",
            Endpoint::Health => "health",
            Endpoint::Metrics => "metrics",
            Endpoint::OpenApi => "openapi",
            Endpoint::Playground => "playground",
            Endpoint::Call => "call",
            Endpoint::Other => "other",
        }
    }
}

/// Kinds of failed upstream exchanges, as the `kind` label names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum UpstreamErrorKind {
    /// Refused, reset, name not resolved, TLS failed, connection broke.
    Unreachable,
    Timeout,
    TooLarge,
    /// A 2xx answer that is not JSON.
    NotJson,
    /// A 2xx answer in a content coding recast does not decode, or that does not decode.
    Encoding,
    /// The outbound policy refused the address; nothing was sent.
    NotAllowed,
    /// An answer with a 4xx status.
    Status4xx,
    /// An answer with a 5xx status.
    Status5xx,
    /// An answer with another status that is not 2xx (redirects, which are not followed).
    StatusOther,
}

impl UpstreamErrorKind {
    const ALL: [UpstreamErrorKind; 9] = [
        UpstreamErrorKind::Unreachable,
        UpstreamErrorKind::Timeout,
        UpstreamErrorKind::TooLarge,
        UpstreamErrorKind::NotJson,
        UpstreamErrorKind::Encoding,
        UpstreamErrorKind::NotAllowed,
        UpstreamErrorKind::Status4xx,
        UpstreamErrorKind::Status5xx,
        UpstreamErrorKind::StatusOther,
    ];

    pub fn label(self) -> &'static str {
        match self {
            UpstreamErrorKind::Unreachable => "unreachable",
            UpstreamErrorKind::Timeout => "timeout",
            UpstreamErrorKind::TooLarge => "too_large",
            UpstreamErrorKind::NotJson => "not_json",
            UpstreamErrorKind::Encoding => "encoding",
            UpstreamErrorKind::NotAllowed => "not_allowed",
            UpstreamErrorKind::Status4xx => "status_4xx",
            UpstreamErrorKind::Status5xx => "status_5xx",
            UpstreamErrorKind::StatusOther => "status_other",
        }
    }
}

/// Where rules that failed to compile came from, as the `source` label names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum RulesSource {
    Preview,
    /// A registration or an update.
    Registration,
    /// A stored route loaded at start.
    Stored,
}

impl RulesSource {
    const ALL: [RulesSource; 3] = [RulesSource::Preview, RulesSource::Registration, RulesSource::Stored];

    pub fn label(self) -> &'static str {
        match self {
            RulesSource::Preview => "preview",
            RulesSource::Registration => "registration",
            RulesSource::Stored => "stored",
        }
    }
}

/// Where a panic was caught, as the `site` label names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum PanicSite {
    /// While a request was answered (it got a 500).
    Request,
    /// While a connection was served outside any request (reading heads, writing answers).
    Connection,
    /// In a store operation begun by a request.
    Storage,
    /// While the stored routes were loaded at start (the service stays not ready).
    Loading,
    /// In a background refresh of a stale cached answer.
    Refresh,
    /// In the cluster follower or its snapshot writes (it starts over).
    Follower,
    /// In any other background task (the upstream pool's sweeper, the database's listening
    /// connection, stopping the workers).
    Background,
}

impl PanicSite {
    const ALL: [PanicSite; 7] = [
        PanicSite::Request,
        PanicSite::Connection,
        PanicSite::Storage,
        PanicSite::Loading,
        PanicSite::Refresh,
        PanicSite::Follower,
        PanicSite::Background,
    ];

    pub fn label(self) -> &'static str {
        match self {
            PanicSite::Request => "request",
            PanicSite::Connection => "connection",
            PanicSite::Storage => "storage",
            PanicSite::Loading => "loading",
            PanicSite::Refresh => "refresh",
            PanicSite::Follower => "follower",
            PanicSite::Background => "background",
        }
    }
}

/// Which timeout closed a client's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Timeout {
    /// No request began within `RECAST_IDLE_TIMEOUT_MS`.
    Idle,
    /// A request head began but was not whole within `RECAST_HEADER_TIMEOUT_MS`.
    Head,
}

impl Timeout {
    const ALL: [Timeout; 2] = [Timeout::Idle, Timeout::Head];

    pub fn label(self) -> &'static str {
        match self {
            Timeout::Idle => "idle",
            Timeout::Head => "head",
        }
    }
}

/// The service-wide metrics.
#[derive(Debug)]
pub struct Metrics {
    endpoints: [StatusCounts; Endpoint::ALL.len()],
    pub upstream: Histogram,
    pub mapping: Histogram,
    upstream_errors: [AtomicU64; UpstreamErrorKind::ALL.len()],
    compile_failures: [AtomicU64; RulesSource::ALL.len()],
    panics: [AtomicU64; PanicSite::ALL.len()],
    timeouts: [AtomicU64; Timeout::ALL.len()],
    pub cache: CacheCounts,
}

/// What the cache of mapped answers did (`docs/caching.md`).
#[derive(Debug, Default)]
pub struct CacheCounts {
    /// Calls answered from a fresh entry.
    pub hits: AtomicU64,
    /// Calls that went upstream for their key (coalesced waiters not counted).
    pub misses: AtomicU64,
    /// Calls answered from an entry past its freshness, within `staleWhileRevalidateSeconds`.
    pub stale: AtomicU64,
    /// Calls that waited for another call's upstream call instead of making their own.
    pub coalesced: AtomicU64,
}

impl CacheCounts {
    #[inline]
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the cache of mapped answers holds, read when the metrics are rendered.
#[derive(Debug, Clone, Copy, Default)]
pub struct CacheGauges {
    pub entries: usize,
    pub bytes: u64,
    /// Entries dropped to stay within `RECAST_CACHE_BYTES`, or refused as too large for it.
    pub evictions: u64,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            endpoints: Default::default(),
            upstream: Histogram::new(UPSTREAM_BOUNDS),
            mapping: Histogram::new(MAPPING_BOUNDS),
            upstream_errors: Default::default(),
            compile_failures: Default::default(),
            panics: Default::default(),
            timeouts: Default::default(),
            cache: Default::default(),
        }
    }
}

/// Gauges read when the metrics are rendered, from state the server keeps anyway.
#[derive(Debug, Clone, Copy)]
pub struct Gauges {
    pub routes_loaded: usize,
    pub routes_broken: usize,
    pub in_flight: usize,
    /// 0 starting, 1 running, 2 stopping.
    pub lifecycle: u8,
    /// Cluster mode: how the node stands with the database.
    pub store: Option<StoreGauges>,
    pub cache: CacheGauges,
}

/// Cluster mode: how a node stands with the route database.
#[derive(Debug, Clone, Copy)]
pub struct StoreGauges {
    pub up: bool,
    /// The last revision applied.
    pub revision: u64,
    /// Seconds since the node last knew it had every change.
    pub lag_seconds: f64,
}

impl Metrics {
    #[inline]
    pub fn endpoint(&self, endpoint: Endpoint, status: u16) {
        self.endpoints[endpoint as usize].record(status);
    }

    #[inline]
    pub fn upstream_error(&self, kind: UpstreamErrorKind) {
        self.upstream_errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn compile_failure(&self, source: RulesSource) {
        self.compile_failures[source as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A panic was caught at `site`: a bug, which the service survived.
    pub fn panicked(&self, site: PanicSite) {
        self.panics[site as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A client's connection was closed by `timeout`.
    pub fn timed_out(&self, timeout: Timeout) {
        self.timeouts[timeout as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The panics caught at `site` so far.
    pub fn panics(&self, site: PanicSite) -> u64 {
        self.panics[site as usize].load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition (format 0.0.4) of everything, with the counts of each
    /// route given by `routes` as `(uuid, counts)`.
    pub fn render<'a>(
        &self,
        gauges: Gauges,
        routes: impl IntoIterator<Item = (String, &'a StatusCounts)>,
    ) -> String {
        let mut out = String::with_capacity(4096);
        let requests = "recast_requests_total";
        out.push_str(
            "# HELP recast_requests_total Answers by route (a route's uuid, or the endpoint) and status.\n",
        );
        let _ = writeln!(out, "# TYPE {requests} counter");
        for endpoint in Endpoint::ALL {
            self.endpoints[endpoint as usize].write(&mut out, requests, "route", endpoint.label());
        }
        for (uuid, counts) in routes {
            counts.write(&mut out, requests, "route", &uuid);
        }
        self.upstream.write(
            &mut out,
            "recast_upstream_duration_seconds",
            "Time from sending an upstream request to having its whole answer, route calls and live calls.",
        );
        self.mapping.write(
            &mut out,
            "recast_mapping_duration_seconds",
            "Time to parse an upstream answer and map it by the route's rules.",
        );
        out.push_str("# HELP recast_upstream_errors_total Upstream exchanges that failed, by kind.\n");
        out.push_str("# TYPE recast_upstream_errors_total counter\n");
        for kind in UpstreamErrorKind::ALL {
            let count = self.upstream_errors[kind as usize].load(Ordering::Relaxed);
            let _ = writeln!(out, "recast_upstream_errors_total{{kind=\"{}\"}} {count}", kind.label());
        }
        out.push_str(
            "# HELP recast_rule_compile_failures_total Rules documents that did not compile, by where they came from.\n",
        );
        out.push_str("# TYPE recast_rule_compile_failures_total counter\n");
        for source in RulesSource::ALL {
            let count = self.compile_failures[source as usize].load(Ordering::Relaxed);
            let _ =
                writeln!(out, "recast_rule_compile_failures_total{{source=\"{}\"}} {count}", source.label());
        }
        out.push_str("# HELP recast_panics_total Panics caught while serving, by where; each is a bug and is logged.\n");
        out.push_str("# TYPE recast_panics_total counter\n");
        for site in PanicSite::ALL {
            let count = self.panics[site as usize].load(Ordering::Relaxed);
            let _ = writeln!(out, "recast_panics_total{{site=\"{}\"}} {count}", site.label());
        }
        out.push_str(
            "# HELP recast_connections_timed_out_total Client connections closed by a timeout: idle (no request began) or head (a head begun was not whole in time).\n",
        );
        out.push_str("# TYPE recast_connections_timed_out_total counter\n");
        for timeout in Timeout::ALL {
            let count = self.timeouts[timeout as usize].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "recast_connections_timed_out_total{{timeout=\"{}\"}} {count}",
                timeout.label()
            );
        }
        let gauge = |out: &mut String, name: &str, help: &str, value: usize| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        };
        let cache = &self.cache;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let counters = [
            (
                "recast_cache_hits_total",
                "Route calls answered from a fresh cached answer.",
                load(&cache.hits),
            ),
            (
                "recast_cache_misses_total",
                "Route calls of cached routes that went upstream for their answer.",
                load(&cache.misses),
            ),
            (
                "recast_cache_stale_total",
                "Route calls answered at once from a stale cached answer while it was refreshed.",
                load(&cache.stale),
            ),
            (
                "recast_cache_coalesced_total",
                "Route calls that waited for a concurrent call's upstream call instead of making their own.",
                load(&cache.coalesced),
            ),
            (
                "recast_cache_evictions_total",
                "Cached answers dropped to stay within RECAST_CACHE_BYTES, or refused as too large for it.",
                gauges.cache.evictions,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        }
        gauge(&mut out, "recast_cache_entries", "Answers the cache holds.", gauges.cache.entries);
        let _ = writeln!(
            out,
            "# HELP recast_cache_bytes Bytes the cache holds (answers, keys and bookkeeping), at most RECAST_CACHE_BYTES.\n# TYPE recast_cache_bytes gauge\nrecast_cache_bytes {}",
            gauges.cache.bytes
        );
        gauge(&mut out, "recast_routes_loaded", "Routes in the route table.", gauges.routes_loaded);
        gauge(
            &mut out,
            "recast_routes_broken",
            "Loaded routes that cannot serve calls (they answer 503).",
            gauges.routes_broken,
        );
        gauge(
            &mut out,
            "recast_in_flight_requests",
            "Requests being served, this one included.",
            gauges.in_flight,
        );
        gauge(
            &mut out,
            "recast_lifecycle_state",
            "0 while loading routes, 1 while running, 2 while stopping.",
            usize::from(gauges.lifecycle),
        );
        if let Some(store) = &gauges.store {
            gauge(
                &mut out,
                "recast_store_up",
                "1 while the route database answers this node, 0 while it does not.",
                usize::from(store.up),
            );
            let _ = writeln!(
                out,
                "# HELP recast_store_revision The last revision of the route database this node applied.\n# TYPE recast_store_revision gauge\nrecast_store_revision {}",
                store.revision
            );
            let _ = writeln!(
                out,
                "# HELP recast_store_sync_lag_seconds Time since this node last knew it had every change of the route database.\n# TYPE recast_store_sync_lag_seconds gauge\nrecast_store_sync_lag_seconds {:.3}",
                store.lag_seconds
            );
        }
        let _ = writeln!(
            out,
            "# HELP recast_build_info The running version.\n# TYPE recast_build_info gauge\nrecast_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        out
    }
}

#[cfg(test)]
mod tests {
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
        let text = metrics.render(gauges, [("u-1".to_owned(), &route)]);
        for line in [
            "recast_requests_total{route=\"preview\",status=\"200\"} 1",
            "recast_requests_total{route=\"u-1\",status=\"201\"} 1",
            "recast_upstream_errors_total{kind=\"timeout\"} 1",
            "recast_upstream_errors_total{kind=\"not_json\"} 0",
            "recast_rule_compile_failures_total{source=\"stored\"} 1",
            "recast_panics_total{site=\"connection\"} 1",
            "recast_panics_total{site=\"request\"} 0",
            "recast_routes_loaded 3",
            "recast_routes_broken 1",
            "recast_in_flight_requests 2",
            "recast_lifecycle_state 1",
            "recast_upstream_duration_seconds_count 0",
            "recast_mapping_duration_seconds_bucket{le=\"+Inf\"} 0",
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
}
