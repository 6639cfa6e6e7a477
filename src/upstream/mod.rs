//! The upstream client: pooled keep-alive HTTP/1.1 connections, plain or TLS (rustls, Mozilla's
//! roots and those `tls` adds), or shared HTTP/2 connections to upstreams that pick `h2` ([`h2`]),
//! over which a route's request is sent and the answer read under a connect timeout, one
//! total deadline for the whole exchange, and a size limit on the body. Redirects are not
//! followed. Connections are made by hyper's connector behind the outbound policy
//! ([`crate::policy::Guarded`]); the exchange itself is [`wire`], driven by the calling task.

mod breaker;
mod call;
mod coding;
mod connect;
mod exchange;
mod freshness;
mod h2;
mod limit;
mod oauth;
mod open;
mod per_key;
mod pool;
mod request;
mod retry;
mod tls;
mod traced;
mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use http::{HeaderValue, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::time::Instant;

pub(crate) use self::connect::https_or_http;
use self::connect::with_config;
use self::per_key::PerKey;
use self::pool::{Key, Pool, Pools};
use crate::metrics::{KeptCounts, LimiterCounts, OriginBreaker, OriginRetries, PanicSite, TokenCounts};
use crate::policy::{Guarded, Lookup, NotAllowed, OutboundPolicy, PolicyResolver, literal_address};
use crate::tasks::Tasks;
pub use breaker::{BreakerScope, BreakerSettings, Breakers};
pub use freshness::{Freshness, MAX_DELTA_SECONDS};
pub use limit::{LimitScope, MAX_BURST, MAX_RATE, MAX_WAIT_MS, RateLimitSettings};
pub use oauth::{AuthFailure, ClientAuth, ClientCredentials, TokenRequest};
pub use request::UpstreamRequest;
pub use retry::{Failure, MAX_ATTEMPTS, RetryOn, RetrySettings, retriable_status};
pub use tls::{CertificateAsked, RouteTls, TlsProblem, TlsSettings, collector_config, read_ca_file};

/// Settings of the upstream client.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamSettings {
    pub connect_timeout: Duration,
    /// Deadline for sending the request and reading the whole answer.
    pub total_timeout: Duration,
    /// Largest answer body read (decoded, when it comes in a content coding).
    pub max_body: usize,
    /// Whether upstreams are asked for `gzip` or `br` answers (`RECAST_UPSTREAM_COMPRESSION`).
    /// Answers in those codings are decoded either way.
    pub compression: bool,
    /// How many workers serve connections ([`crate::workers`]): each keeps its own idle
    /// connections, so a connection is only ever used on the thread whose event loop it is on.
    pub workers: usize,
    /// When an upstream origin's calls are refused after failures ([`breaker`]).
    pub breaker: BreakerSettings,
    /// Whether `https` upstreams are offered HTTP/2 by ALPN (`RECAST_UPSTREAM_HTTP2=auto`).
    pub http2: bool,
}

/// An upstream's answer, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    /// The body, with spare capacity for the JSON parser's padding.
    pub body: Vec<u8>,
    /// What its headers say about caching it.
    pub freshness: Freshness,
    /// What its `Retry-After` asks (a 429 or 503 answer's is heeded by a route's retries).
    pub retry_after: Option<Duration>,
    /// Whether the upstream asked for a client certificate when the connection was made (a
    /// 400 or 403 may be its refusal of the one given, or of none).
    pub certificate_asked: Option<tls::CertificateAsked>,
    /// What its `Content-Type` says it is (told when the body is not JSON).
    pub content_type: MediaType,
    /// Whether it came over HTTP/2 (else HTTP/1.1).
    pub http2: bool,
}

/// The media type a `Content-Type` names (`text/html`), without its parameters, lowercased and
/// cut to [`MediaType::MAX`] bytes; kept inline, so that no answer allocates for it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MediaType {
    bytes: [u8; MediaType::MAX],
    len: u8,
}

impl Default for MediaType {
    fn default() -> MediaType {
        MediaType { bytes: [0; MediaType::MAX], len: 0 }
    }
}

impl MediaType {
    /// Longest media type kept.
    pub const MAX: usize = 64;

    /// The media type of a `Content-Type` value; none when it holds no plain token.
    pub fn of(value: &[u8]) -> MediaType {
        let essence = value.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
        let mut kept = MediaType::default();
        if essence.iter().all(|b| b.is_ascii_graphic()) {
            let len = essence.len().min(MediaType::MAX);
            kept.bytes[..len].copy_from_slice(&essence[..len]);
            kept.bytes[..len].make_ascii_lowercase();
            kept.len = len as u8;
        }
        kept
    }

    /// The media type, if the answer named one.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).ok().filter(|s| !s.is_empty())
    }

    /// Whether it names JSON (`application/json`, `application/problem+json`, ...).
    pub fn is_json(&self) -> bool {
        self.as_str().is_some_and(|t| t == "application/json" || t.ends_with("+json"))
    }
}

impl std::fmt::Debug for MediaType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// Why no answer came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamError {
    /// No connection: refused, unreachable, name not resolved.
    Connect(String),
    /// TLS refused the connection: the upstream's certificate is not trusted, or the upstream
    /// refused the handshake or the certificate recast presented (why).
    Tls(String),
    /// The connection broke during the exchange.
    Broken(String),
    /// The deadline passed.
    Timeout,
    /// The body is larger than allowed (decoded, when it comes in a content coding).
    TooLarge { limit: usize },
    /// A 2xx answer in a content coding recast does not decode (its name), or a coded body that
    /// does not decode (why).
    Coding(String),
    /// The outbound policy refuses the upstream's address; nothing was sent.
    NotAllowed(NotAllowed),
    /// The upstream's breaker is open after failures in a row; nothing was sent. When to try
    /// again.
    Unavailable { retry_after: Duration },
    /// The route's outbound rate limit left no slot within its `maxWaitMs`; nothing was sent.
    /// When a slot is free.
    RateLimited { retry_after: Duration },
    /// The route's token endpoint gave no access token; nothing was sent upstream.
    Auth(AuthFailure),
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Connect(why) => write!(f, "the upstream could not be reached: {why}"),
            UpstreamError::Tls(why) => write!(f, "the TLS handshake with the upstream failed: {why}"),
            UpstreamError::Broken(why) => write!(f, "the connection to the upstream broke: {why}"),
            UpstreamError::Timeout => f.write_str("the upstream did not answer in time"),
            UpstreamError::TooLarge { limit } => {
                write!(f, "the upstream's answer is larger than {limit} bytes (RECAST_MAX_UPSTREAM_BYTES)")
            }
            UpstreamError::Coding(why) => f.write_str(why),
            UpstreamError::NotAllowed(refusal) => refusal.fmt(f),
            UpstreamError::Unavailable { .. } => f.write_str(
                "calls to this upstream failed repeatedly, so recast does not call it until its \
                 cooldown ends (RECAST_BREAKER_FAILURES, RECAST_BREAKER_COOLDOWN_MS); nothing was sent",
            ),
            UpstreamError::RateLimited { .. } => f.write_str(
                "the route's rateLimit (the upstream's quota) has no slot free within its maxWaitMs; nothing was sent",
            ),
            UpstreamError::Auth(failure) => write!(f, "{failure}; nothing was sent to the upstream"),
        }
    }
}

type Connector = HttpsConnector<Plain>;
/// The TCP connector every TLS connector wraps: the policy's resolver, and its check of literal
/// addresses.
type Plain = Guarded<HttpConnector<PolicyResolver>>;

/// How often idle connections past `IDLE_TIMEOUT` are looked for and closed.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// The pooled client; cheap to share.
#[derive(Clone)]
pub struct UpstreamClient {
    connector: Connector,
    plain: Plain,
    /// The roots every TLS connection trusts: Mozilla's, and `RECAST_UPSTREAM_CA_FILE`'s.
    roots: Arc<rustls::RootCertStore>,
    /// The connector of each route `tls` met so far, by its id (or why it cannot be made).
    route_connectors: Arc<PerKey<String, Result<Connector, String>>>,
    /// The HTTP/2 connections, shared by every worker.
    h2: Arc<h2::Connections>,
    /// Whether each upstream asked for a client certificate in its last full TLS handshake.
    certificates_asked: Arc<PerKey<Key, tls::CertificateAsked>>,
    pools: Arc<Pools>,
    settings: UpstreamSettings,
    policy: Arc<OutboundPolicy>,
    lookup: Arc<dyn Lookup>,
    breakers: Arc<Breakers>,
    budgets: Arc<retry::Budgets>,
    limiters: Arc<limit::Limiters>,
    tokens: Arc<oauth::Tokens>,
    /// The nodes alive in the cluster (1 for a node alone): each takes this share of every rate
    /// limit.
    nodes: Arc<AtomicU32>,
    /// Where the client's own tasks run (HTTP/2 connections, token fetches).
    spawner: Spawner,
    /// Where the spans of attempts go, when traces are exported.
    spans: Option<Arc<crate::telemetry::Recorder>>,
}

/// Where the client's own tasks run: behind the panic guard, and, once the service gives one, on
/// a runtime of its own, away from the workers, so that a worker busy with a mapping holds up no
/// other worker's call on a connection it would have opened.
#[derive(Clone)]
struct Spawner {
    tasks: Tasks,
    on: Option<tokio::runtime::Handle>,
}

impl Spawner {
    fn spawn<F>(&self, future: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        match &self.on {
            Some(handle) => drop(self.tasks.spawn_on(handle, PanicSite::Background, future)),
            None => drop(self.tasks.spawn(PanicSite::Background, future)),
        }
    }
}

impl UpstreamClient {
    /// A client that connects only where `policy` allows, resolving names with `lookup`.
    pub fn new(
        settings: UpstreamSettings,
        policy: Arc<OutboundPolicy>,
        lookup: Arc<dyn Lookup>,
    ) -> UpstreamClient {
        let resolver = PolicyResolver { policy: policy.clone(), lookup: lookup.clone() };
        let mut http = HttpConnector::new_with_resolver(resolver);
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(settings.connect_timeout));
        let plain = Guarded { inner: http, policy: policy.clone() };
        let roots = tls::roots(&[]).unwrap_or_else(|_| rustls::RootCertStore::empty());
        let connector = with_config(plain.clone(), tls::default_config(roots.clone()), settings.http2);
        // One per worker, and one for the calls made on any other thread.
        let pools = Arc::new(Pools((0..=settings.workers).map(|_| Pool::default()).collect()));
        let breakers = Arc::new(Breakers::new(settings.breaker));
        let budgets = Arc::default();
        let (limiters, tokens) = (Arc::default(), Arc::default());
        let nodes = Arc::new(AtomicU32::new(1));
        UpstreamClient {
            connector,
            plain,
            roots: Arc::new(roots),
            route_connectors: Arc::default(),
            h2: Arc::default(),
            certificates_asked: Arc::default(),
            pools,
            settings,
            policy,
            lookup,
            breakers,
            budgets,
            limiters,
            tokens,
            nodes,
            spawner: Spawner { tasks: Tasks::new(Arc::default()), on: None },
            spans: None,
        }
    }

    /// The client, recording the spans of its attempts into `recorder` (for calls whose trace
    /// is sampled).
    pub fn with_recorder(mut self, recorder: Option<Arc<crate::telemetry::Recorder>>) -> UpstreamClient {
        self.spans = recorder;
        self
    }

    /// The client, its tasks (HTTP/2 connections, token fetches) started through `tasks` on the
    /// runtime of `handle`.
    pub fn with_tasks(mut self, tasks: Tasks, handle: tokio::runtime::Handle) -> UpstreamClient {
        self.spawner = Spawner { tasks, on: Some(handle) };
        self
    }

    /// The client, trusting the certificates of `RECAST_UPSTREAM_CA_FILE` besides Mozilla's roots.
    pub fn with_extra_roots(
        mut self,
        extra: &[rustls::pki_types::CertificateDer<'static>],
    ) -> Result<UpstreamClient, String> {
        let roots = tls::roots(extra)?;
        self.connector =
            with_config(self.plain.clone(), tls::default_config(roots.clone()), self.settings.http2);
        self.roots = Arc::new(roots);
        Ok(self)
    }

    /// Sweeps every 30 seconds ([`UpstreamClient::sweep`]); ends once the client is gone.
    /// Whoever runs the client spawns it.
    pub fn sweeper(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let client = self.downgrade();
        async move {
            let mut every = tokio::time::interval(SWEEP_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                if !client.sweep(Instant::now()) {
                    break;
                }
            }
        }
    }

    /// One sweep, as of `now`: closes idle connections past their time, also when nothing calls
    /// their upstream any more, and lets go of what the client keeps per key (breakers, retry
    /// budgets, rate limiters, route TLS connectors, what upstreams asked in their handshakes,
    /// access tokens, the upstreams of HTTP/2 connections) once nothing used it for a while and
    /// forgetting it loses nothing. So routes that come and go leave nothing behind.
    pub fn sweep(&self, now: Instant) {
        self.downgrade().sweep(now);
    }

    /// How much the client keeps per key now, by kind (`/metrics`, and tests that routes leave
    /// nothing behind).
    pub fn kept(&self) -> KeptCounts {
        KeptCounts {
            breakers: self.breakers.len(),
            retry_budgets: self.budgets.len(),
            rate_limiters: self.limiters.len(),
            tls_connectors: self.route_connectors.len(),
            certificates_asked: self.certificates_asked.len(),
            tokens: self.tokens.len(),
            h2_upstreams: self.h2.len(),
        }
    }

    /// What the client keeps per key, without keeping it alive: its sweeper's hold on it.
    fn downgrade(&self) -> WeakClient {
        WeakClient {
            pools: Arc::downgrade(&self.pools),
            breakers: Arc::downgrade(&self.breakers),
            budgets: Arc::downgrade(&self.budgets),
            limiters: Arc::downgrade(&self.limiters),
            route_connectors: Arc::downgrade(&self.route_connectors),
            certificates_asked: Arc::downgrade(&self.certificates_asked),
            tokens: Arc::downgrade(&self.tokens),
            h2: Arc::downgrade(&self.h2),
        }
    }

    /// Checks the host of `uri` against the policy without connecting (registration's first
    /// step). The connector checks again, on the addresses it connects to.
    pub async fn check_policy(&self, uri: &http::Uri) -> Result<(), UpstreamError> {
        let host = uri.host().unwrap_or_default();
        let addresses = match literal_address(host) {
            Some(ip) => vec![ip],
            // Resolving is part of connecting, and has its time limit.
            None => tokio::time::timeout(self.settings.connect_timeout, self.lookup.lookup(host))
                .await
                .map_err(|_| UpstreamError::Timeout)?
                .map_err(|e| UpstreamError::Connect(format!("`{host}` cannot be resolved: {e}")))?,
        };
        self.policy.filter(host, &addresses).map(|_| ()).map_err(UpstreamError::NotAllowed)
    }

    pub fn settings(&self) -> UpstreamSettings {
        self.settings
    }

    /// The breakers of the origins called so far (`/metrics`).
    pub fn breakers(&self) -> Vec<OriginBreaker> {
        self.breakers.snapshot()
    }

    /// The retries of the origins called with retries so far (`/metrics`).
    pub fn retries(&self) -> Vec<OriginRetries> {
        self.budgets.snapshot()
    }

    /// The refusals of the rate limits called so far (`/metrics`).
    pub fn rate_limits(&self) -> Vec<LimiterCounts> {
        self.limiters.snapshot()
    }

    /// Sets how many nodes share each outbound rate limit (cluster mode, from the heartbeat).
    pub fn set_nodes(&self, nodes: u32) {
        self.nodes.store(nodes.max(1), Ordering::Relaxed);
    }

    /// How many nodes share each outbound rate limit.
    pub fn nodes(&self) -> u32 {
        self.nodes.load(Ordering::Relaxed)
    }

    /// The token fetches of the token endpoints called so far (`/metrics`).
    pub fn token_fetches(&self) -> Vec<TokenCounts> {
        self.tokens.snapshot()
    }
}

/// What the client keeps per key, held by its sweeper without keeping it alive.
struct WeakClient {
    pools: std::sync::Weak<Pools>,
    breakers: std::sync::Weak<Breakers>,
    budgets: std::sync::Weak<retry::Budgets>,
    limiters: std::sync::Weak<limit::Limiters>,
    route_connectors: std::sync::Weak<PerKey<String, Result<Connector, String>>>,
    certificates_asked: std::sync::Weak<PerKey<Key, tls::CertificateAsked>>,
    tokens: std::sync::Weak<oauth::Tokens>,
    h2: std::sync::Weak<h2::Connections>,
}

impl WeakClient {
    /// One sweep ([`UpstreamClient::sweep`]); `false` once the client is gone.
    fn sweep(&self, now: Instant) -> bool {
        let Some(pools) = self.pools.upgrade() else { return false };
        pools.0.iter().for_each(|pool| pool.sweep(now));
        if let Some(breakers) = self.breakers.upgrade() {
            breakers.sweep(SWEEP_EVERY, now);
        }
        if let Some(budgets) = self.budgets.upgrade() {
            budgets.sweep(SWEEP_EVERY);
        }
        if let Some(limiters) = self.limiters.upgrade() {
            limiters.sweep(SWEEP_EVERY);
        }
        if let Some(connectors) = self.route_connectors.upgrade() {
            connectors.sweep(SWEEP_EVERY, |_, _| true);
        }
        if let Some(asked) = self.certificates_asked.upgrade() {
            asked.sweep(SWEEP_EVERY, |_, _| true);
        }
        if let Some(tokens) = self.tokens.upgrade() {
            tokens.sweep(SWEEP_EVERY, now);
        }
        if let Some(h2) = self.h2.upgrade() {
            h2.sweep();
        }
        true
    }
}

/// What a route adds to a call: its outbound rate limit (with the route's uuid, which a limit of
/// the route is kept by), its retries, the token request of its OAuth2 client credentials, its
/// TLS, and its own breaker when it has one.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outbound<'a> {
    pub rate_limit: Option<(&'a RateLimitSettings, uuid::Uuid)>,
    pub retry: Option<&'a RetrySettings>,
    pub oauth: Option<&'a Arc<TokenRequest>>,
    pub tls: Option<&'a RouteTls>,
    /// The route whose own breaker counts the call (`"breaker": {"scope": "route"}`); `None`:
    /// the origin's.
    pub breaker: Option<uuid::Uuid>,
    /// An `http` upstream spoken to in HTTP/2 from the start (`"http2": "prior-knowledge"`).
    pub h2c: bool,
    /// The composed route's source the call is made for, named in its spans.
    pub source: Option<&'a str>,
}

/// What an attempt writes into its request beside the request itself, and into no cache key:
/// the token held, and the trace context of the attempt's span.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Extra<'a> {
    pub authorization: Option<&'a HeaderValue>,
    pub trace: Option<&'a Propagated>,
}

/// The trace context an attempt passes on: its span as the parent (`traceparent`), and the
/// caller's `tracestate` and `baggage` as they came.
#[derive(Debug, Clone)]
pub struct Propagated {
    /// Its text, written as it is (no header value made for it on HTTP/1.1).
    pub traceparent: [u8; crate::trace_context::LENGTH],
    /// The caller's `tracestate` and `baggage`.
    pub carried: Option<std::sync::Arc<crate::telemetry::Carried>>,
}

impl Propagated {
    fn state(&self) -> Option<&HeaderValue> {
        self.carried.as_deref().and_then(|carried| carried.state.as_ref())
    }

    fn baggage(&self) -> Option<&HeaderValue> {
        self.carried.as_deref().and_then(|carried| carried.baggage.as_ref())
    }

    /// The header lines it adds to `request`'s own, by name: its `traceparent` always (in place
    /// of one the request has), the caller's `tracestate` and `baggage` only where the request
    /// has none of its own (a header a route configures is never replaced by a caller's).
    pub(crate) fn lines<'a>(
        &'a self,
        request: &'a http::HeaderMap,
    ) -> impl Iterator<Item = (&'static str, &'a [u8])> + 'a {
        [
            (crate::trace_context::TRACEPARENT, Some(&self.traceparent[..])),
            (crate::trace_context::TRACESTATE, self.state().map(HeaderValue::as_bytes)),
            ("baggage", self.baggage().map(HeaderValue::as_bytes)),
        ]
        .into_iter()
        .filter(move |(name, _)| *name == crate::trace_context::TRACEPARENT || !request.contains_key(*name))
        .filter_map(|(name, value)| value.map(|value| (name, value)))
    }

    /// Whether a header of the request is one it replaces: `traceparent`, recast's own.
    pub(crate) fn replaces(&self, name: &http::HeaderName) -> bool {
        name.as_str() == crate::trace_context::TRACEPARENT
    }
}

/// What an attempt sends, where: the request, its origin (the breaker's key) and the route's TLS.
struct Target<'a> {
    request: &'a UpstreamRequest,
    origin: &'a str,
    tls: Option<&'a RouteTls>,
    /// The route whose own breaker counts the attempt; `None`: the origin's.
    breaker: Option<uuid::Uuid>,
    /// HTTP/2 with prior knowledge, for an `http` upstream.
    h2c: bool,
    /// The attempt's failure was another call's open, which it waited for (and which that call
    /// reported to the breaker).
    waited_for_failure: AtomicBool,
    /// For spans: the composed route's source, and whether this is a token fetch.
    source: Option<&'a str>,
    token: bool,
}

/// `scheme://host:port` of `uri`, the host in lower case and the port always written: what a
/// breaker is kept by.
fn origin(uri: &http::Uri) -> String {
    let scheme = uri.scheme_str().unwrap_or("http");
    let host = uri.host().unwrap_or_default().to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or(if scheme == "https" { 443 } else { 80 });
    format!("{scheme}://{host}:{port}")
}

#[cfg(test)]
mod tests;

pub(crate) use crate::logging::error_chain;
