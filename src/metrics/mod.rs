//! The service's counters and histograms, and their Prometheus text form (`GET /metrics`).
//!
//! Everything here is a plain atomic, updated with relaxed ordering on the request path: a
//! request costs one increment for its status and two per histogram it feeds (its bucket and the
//! sum), with no lock and no allocation. Counts per route live with the route (see
//! [`StatusCounts`]), so a route's series disappear when it is deleted and survive an update.

mod counts;
mod outbound;
mod render;
mod stats;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};

pub use self::counts::{Histogram, STATUS_SLOTS, StatusCounts};
use self::counts::{MAPPING_BOUNDS, UPSTREAM_BOUNDS};
pub use self::outbound::{
    BreakerState, FetchReason, KeptCounts, LimiterCounts, OriginBreaker, OriginRetries, TokenCounts,
};
pub use self::render::OutboundCounts;
pub use self::stats::{ERROR_KINDS, MINUTES as STATS_MINUTES, RouteStats, Summary, unix_millis};

/// The endpoints other than route calls, as the `route` label names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Endpoint {
    Preview,
    Mapping,
    Routes,
    /// `/v1/keys`, `/v1/keys/reseal`.
    Keys,
    /// `/v1/consumers…`.
    Consumers,
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
    const ALL: [Endpoint; 11] = [
        Endpoint::Preview,
        Endpoint::Mapping,
        Endpoint::Routes,
        Endpoint::Keys,
        Endpoint::Consumers,
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
            Endpoint::Keys => "keys",
            Endpoint::Consumers => "consumers",
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
    /// A 2xx answer whose mapping built more than `RECAST_MAX_EXPR_BYTES` in expressions.
    MappingLimit,
    /// Refused by the upstream's open breaker; nothing was sent.
    BreakerOpen,
    /// A composed call's answers together passed `RECAST_MAX_COMPOSED_BYTES`.
    ComposedTooLarge,
    /// A composed call would have sent more than `RECAST_MAX_SOURCE_CALLS` requests.
    TooManyCalls,
    /// A composed call under way found `RECAST_MAX_BUFFERED_BYTES` passed; nothing more was
    /// sent.
    Buffered,
    /// Refused by the route's outbound rate limit; nothing was sent.
    RateLimited,
    /// The route's OAuth2 token endpoint gave no token; nothing was sent.
    AuthFailed,
    /// The TLS handshake with the upstream failed.
    Tls,
    /// A paged call's pages could not be followed (SPEC §2.3 "Pages").
    Paging,
}

impl UpstreamErrorKind {
    const ALL: [UpstreamErrorKind; 18] = [
        UpstreamErrorKind::Unreachable,
        UpstreamErrorKind::Timeout,
        UpstreamErrorKind::TooLarge,
        UpstreamErrorKind::NotJson,
        UpstreamErrorKind::Encoding,
        UpstreamErrorKind::NotAllowed,
        UpstreamErrorKind::Status4xx,
        UpstreamErrorKind::Status5xx,
        UpstreamErrorKind::StatusOther,
        UpstreamErrorKind::MappingLimit,
        UpstreamErrorKind::BreakerOpen,
        UpstreamErrorKind::RateLimited,
        UpstreamErrorKind::AuthFailed,
        UpstreamErrorKind::Tls,
        UpstreamErrorKind::ComposedTooLarge,
        UpstreamErrorKind::TooManyCalls,
        UpstreamErrorKind::Buffered,
        UpstreamErrorKind::Paging,
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
            UpstreamErrorKind::MappingLimit => "mapping_limit",
            UpstreamErrorKind::BreakerOpen => "breaker_open",
            UpstreamErrorKind::RateLimited => "rate_limited",
            UpstreamErrorKind::AuthFailed => "auth_failed",
            UpstreamErrorKind::Tls => "tls",
            UpstreamErrorKind::ComposedTooLarge => "composed_too_large",
            UpstreamErrorKind::TooManyCalls => "too_many_calls",
            UpstreamErrorKind::Buffered => "buffered",
            UpstreamErrorKind::Paging => "paging",
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
    /// In the upstream call of a cached route's flight, which its calls wait for.
    Flight,
    /// In the cluster follower or its snapshot writes (it starts over).
    Follower,
    /// In any other background task (the upstream pool's sweeper, the database's listening
    /// connection, stopping the workers).
    Background,
}

impl PanicSite {
    const ALL: [PanicSite; 8] = [
        PanicSite::Request,
        PanicSite::Connection,
        PanicSite::Storage,
        PanicSite::Loading,
        PanicSite::Refresh,
        PanicSite::Flight,
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
            PanicSite::Flight => "flight",
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

/// Why recast closed an HTTP/2 connection itself (SPEC §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Http2Closed {
    /// Its client sent control frames (SETTINGS, PING, PRIORITY, empty DATA or CONTINUATION)
    /// faster than the connection's allowance.
    Flood,
    /// Answers waited on it and its client took none of their bytes within
    /// `RECAST_HEADER_TIMEOUT_MS` (a window held shut).
    Stalled,
}

impl Http2Closed {
    pub(crate) const ALL: [Http2Closed; 2] = [Http2Closed::Flood, Http2Closed::Stalled];

    pub fn label(self) -> &'static str {
        match self {
            Http2Closed::Flood => "flood",
            Http2Closed::Stalled => "stalled",
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
    http2_closed: [AtomicU64; Http2Closed::ALL.len()],
    pub cache: CacheCounts,
    /// Rule expressions that failed while mapping an upstream answer (SPEC §1.8), on route
    /// calls and registrations' live calls; each one's value was missing.
    pub expression_errors: AtomicU64,
    /// What composed routes did (SPEC §2.3).
    pub composed: ComposedCounts,
}

/// What composed routes' calls did: calls, partial answers, and their sources' failures by
/// kind and by whether the source was required (no label per route or source name).
#[derive(Debug)]
pub struct ComposedCounts {
    /// Calls of composed routes (registrations' live calls included) that ran their sources.
    pub calls: AtomicU64,
    /// Calls answered with `Recast-Partial`.
    pub partial: AtomicU64,
    /// `forEach` sources whose value was not a list (nor an object): no call made.
    pub not_a_list: AtomicU64,
    /// By [`SourceFailureKind::index`], twice: required, then optional.
    failures: [AtomicU64; 2 * SourceFailureKind::COUNT],
}

/// Why a source of a composed route failed, as `recast_source_failures_total` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFailureKind {
    Upstream(UpstreamErrorKind),
    /// A template, `when` or `forEach` that failed.
    Template,
    /// A source it waits for failed.
    Dependency,
    /// `forEach` gave more elements than `maxCalls`.
    TooManyElements,
}

impl SourceFailureKind {
    const COUNT: usize = UpstreamErrorKind::ALL.len() + 3;

    fn all() -> impl Iterator<Item = SourceFailureKind> {
        UpstreamErrorKind::ALL.into_iter().map(SourceFailureKind::Upstream).chain([
            SourceFailureKind::Template,
            SourceFailureKind::Dependency,
            SourceFailureKind::TooManyElements,
        ])
    }

    fn index(self) -> usize {
        match self {
            SourceFailureKind::Upstream(kind) => kind as usize,
            SourceFailureKind::Template => UpstreamErrorKind::ALL.len(),
            SourceFailureKind::Dependency => UpstreamErrorKind::ALL.len() + 1,
            SourceFailureKind::TooManyElements => UpstreamErrorKind::ALL.len() + 2,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            SourceFailureKind::Upstream(kind) => kind.label(),
            SourceFailureKind::Template => "template",
            SourceFailureKind::Dependency => "dependency",
            SourceFailureKind::TooManyElements => "too_many_elements",
        }
    }
}

impl Default for ComposedCounts {
    fn default() -> ComposedCounts {
        ComposedCounts {
            calls: AtomicU64::new(0),
            partial: AtomicU64::new(0),
            not_a_list: AtomicU64::new(0),
            failures: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl ComposedCounts {
    pub fn failed(&self, kind: SourceFailureKind, optional: bool) {
        self.failures[kind.index() + usize::from(optional) * SourceFailureKind::COUNT]
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Every (kind, optional, count).
    pub(crate) fn failures(&self) -> impl Iterator<Item = (SourceFailureKind, bool, u64)> + '_ {
        [false, true].into_iter().flat_map(move |optional| {
            SourceFailureKind::all().map(move |kind| {
                let count = self.failures[kind.index() + usize::from(optional) * SourceFailureKind::COUNT]
                    .load(Ordering::Relaxed);
                (kind, optional, count)
            })
        })
    }
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
            http2_closed: Default::default(),
            cache: Default::default(),
            expression_errors: Default::default(),
            composed: Default::default(),
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
    /// The nodes alive as this node last heard from the database, itself included.
    pub nodes: u32,
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
    pub fn http2_closed(&self, why: Http2Closed) {
        self.http2_closed[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn timed_out(&self, timeout: Timeout) {
        self.timeouts[timeout as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The panics caught at `site` so far.
    pub fn panics(&self, site: PanicSite) -> u64 {
        self.panics[site as usize].load(Ordering::Relaxed)
    }
}

/// What became of the spans recorded for export (the trace exporter's), for `/metrics`.
#[derive(Debug, Default)]
pub struct SpanCounts {
    pub exported: AtomicU64,
    /// Dropped because the queue was full.
    pub dropped_full: AtomicU64,
    /// Dropped with a batch the collector did not take (down, slow, or an error answer).
    pub dropped_failed: AtomicU64,
    /// Exports the collector took, and those it did not.
    pub exports_ok: AtomicU64,
    pub exports_failed: AtomicU64,
}
