//! What the upstream client reports for `/metrics`: its breakers, retries, rate limits and token
//! fetches, as counts taken at the moment `/metrics` is read. The client fills them
//! (`UpstreamClient::breakers` and its siblings); [`render`](super::render) writes them.

/// A breaker's state, as `/metrics` shows it (`recast_upstream_breaker_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed = 0,
    Open = 1,
    /// Open, with its probe under way.
    HalfOpen = 2,
}

impl BreakerState {
    pub fn label(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half-open",
        }
    }
}

/// One breaker as `/metrics` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginBreaker {
    /// `scheme://host:port`.
    pub origin: String,
    /// The route whose calls alone it counts, for a route's own breaker.
    pub route: Option<uuid::Uuid>,
    pub state: BreakerState,
    /// Calls refused because the breaker was open.
    pub rejected: u64,
    /// Times it opened.
    pub opened: u64,
}

/// One origin's retries as `/metrics` shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginRetries {
    /// `scheme://host:port`.
    pub origin: String,
    /// Calls sent again.
    pub retries: u64,
    /// Retries not sent because the origin's budget was spent.
    pub over_budget: u64,
}

/// One limiter as `/metrics` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimiterCounts {
    /// `route:<uuid>` or `origin:<scheme://host:port>`.
    pub limit: String,
    /// Calls answered 429 without an outbound call.
    pub refused: u64,
}

/// Why a token was fetched (the `reason` label in `/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchReason {
    /// None was held, or the one held ran out.
    New,
    /// The one held is near its end (fetched in the background).
    Renewal,
    /// An upstream answered 401 to the one held.
    Rejected,
}

impl FetchReason {
    pub const ALL: [FetchReason; 3] = [FetchReason::New, FetchReason::Renewal, FetchReason::Rejected];

    pub fn label(self) -> &'static str {
        match self {
            FetchReason::New => "new",
            FetchReason::Renewal => "renewal",
            FetchReason::Rejected => "rejected",
        }
    }
}

/// The fetches of one token endpoint origin, as `/metrics` shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenCounts {
    pub origin: String,
    /// By [`FetchReason`]: fetches that gave a token, and fetches that failed.
    pub fetched: [[u64; 2]; 3],
}

/// How much the upstream client keeps per key, by kind (`recast_upstream_kept{kind}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeptCounts {
    pub breakers: usize,
    pub retry_budgets: usize,
    pub rate_limiters: usize,
    pub tls_connectors: usize,
    pub certificates_asked: usize,
    pub tokens: usize,
    pub h2_upstreams: usize,
}

impl KeptCounts {
    /// Each count with its `kind` label.
    pub fn labelled(&self) -> [(&'static str, usize); 7] {
        [
            ("breakers", self.breakers),
            ("retry_budgets", self.retry_budgets),
            ("rate_limiters", self.rate_limiters),
            ("tls_connectors", self.tls_connectors),
            ("certificates_asked", self.certificates_asked),
            ("tokens", self.tokens),
            ("h2_upstreams", self.h2_upstreams),
        ]
    }
}
