//! The upstream client: pooled keep-alive HTTP/1.1 connections, plain or TLS (rustls, Mozilla's
//! roots and those `tls` adds), or shared HTTP/2 connections to upstreams that pick `h2` ([`h2`]),
//! over which a route's request is sent and the answer read under a connect timeout, one
//! total deadline for the whole exchange, and a size limit on the body. Redirects are not
//! followed. Connections are made by hyper's connector behind the outbound policy
//! ([`crate::policy::Guarded`]); the exchange itself is [`wire`], driven by the calling task.

mod answer;
mod breaker;
mod call;
mod coding;
mod connect;
mod connector;
mod error;
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
mod spawner;
mod stream;
pub(crate) mod tls;
mod traced;
mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use tokio::time::Instant;

pub(crate) use self::connector::https_or_http;
use self::connector::{Connector, Plain, with_config};
use self::per_key::PerKey;
use self::pool::{Key, Pool, Pools};
use self::spawner::Spawner;
use crate::metrics::{KeptCounts, LimiterCounts, OriginBreaker, OriginRetries, TokenCounts};
use crate::policy::{Guarded, Lookup, OutboundPolicy, PolicyResolver, literal_address};
use crate::tasks::Tasks;
pub use answer::{Answer, AnsweredSpan, MediaType};
pub use breaker::{BreakerScope, BreakerSettings, Breakers};
pub use error::{AuthFailure, UpstreamError};
pub use freshness::{Freshness, MAX_DELTA_SECONDS};
pub use limit::{LimitScope, MAX_BURST, MAX_RATE, MAX_WAIT_MS, RateLimitSettings};
pub use oauth::{ClientAuth, ClientCredentials, TokenRequest};
pub(crate) use request::Extra;
use request::origin;
pub use request::{Propagated, UpstreamRequest};
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
    /// Whether a 2xx answer's headers are kept ([`Answer::headers`]): a paged call reads them.
    pub keep_headers: bool,
    /// A deadline earlier than the call's own (`RECAST_UPSTREAM_TIMEOUT_MS` from its start):
    /// what is left of the one deadline of a call that makes several (a paged upstream's pages).
    pub deadline: Option<tokio::time::Instant>,
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
    /// [`Outbound::keep_headers`].
    keep_headers: bool,
}

#[cfg(test)]
mod tests;

pub(crate) use crate::logging::error_chain;
