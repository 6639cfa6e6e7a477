//! The upstream client: pooled keep-alive HTTP/1.1 connections, plain or TLS (rustls, Mozilla's
//! roots and those `tls` adds), or shared HTTP/2 connections to upstreams that pick `h2` ([`h2`]),
//! over which a route's request is sent and the answer read under a connect timeout, one
//! total deadline for the whole exchange, and a size limit on the body. Redirects are not
//! followed. Connections are made by hyper's connector behind the outbound policy
//! ([`crate::policy::Guarded`]); the exchange itself is [`wire`], driven by the calling task.

mod breaker;
mod coding;
mod freshness;
mod h2;
mod limit;
mod oauth;
mod per_key;
mod request;
mod retry;
mod tls;
mod wire;

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::{HeaderValue, Method, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tower_service::Service as _;
use tracing::{Instrument as _, Level};

use self::per_key::PerKey;
use crate::logging::logged;
use crate::metrics::{KeptCounts, LimiterCounts, OriginBreaker, OriginRetries, PanicSite, TokenCounts};
use crate::policy::{
    Guarded, Lookup, NotAllowed, OutboundPolicy, PolicyResolver, literal_address, refusal_in,
};
use crate::tasks::Tasks;
pub use breaker::{BreakerScope, BreakerSettings, Breakers};
pub use freshness::{Freshness, MAX_DELTA_SECONDS};
pub use limit::{LimitScope, MAX_BURST, MAX_RATE, MAX_WAIT_MS, RateLimitSettings};
pub use oauth::{AuthFailure, ClientAuth, ClientCredentials, TokenRequest};
pub use request::UpstreamRequest;
pub use retry::{Failure, MAX_ATTEMPTS, RetryOn, RetrySettings, retriable_status};
pub use tls::{CertificateAsked, RouteTls, TlsProblem, TlsSettings, read_ca_file};

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

/// How long a pooled connection may stay idle before it is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// The most idle connections kept per upstream host.
const MAX_IDLE_PER_HOST: usize = 1024;
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
        }
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

    /// Sends `request` and reads the answer, all within the total deadline, unless the breaker of
    /// the request's origin is open.
    pub async fn call(&self, request: UpstreamRequest) -> Result<Answer, UpstreamError> {
        self.call_with(&request, &Outbound::default()).await
    }

    /// [`UpstreamClient::call`] under a route's rate limit, with its OAuth2 token, sending the
    /// request again as its `retry` says: the deadline is the whole call's, waits for a slot,
    /// token fetches, retries and their waits included; each retry is taken from the budget of
    /// the request's origin, and needs a slot of the rate limit free at once.
    pub async fn call_with(
        &self,
        request: &UpstreamRequest,
        outbound: &Outbound<'_>,
    ) -> Result<Answer, UpstreamError> {
        // One reading of the clock: the deadline, and the time the pool counts idleness from.
        let started = Instant::now();
        let deadline = started + self.settings.total_timeout;
        let origin = origin(&request.uri);
        // In a cluster, this node's share of the limit, kept apart from the shares of other counts.
        let limit = outbound.rate_limit.map(|(settings, route)| match self.nodes() {
            1 => (Cow::Borrowed(settings), settings.key(&route.to_string(), &origin)),
            nodes => {
                let key = format!("{} /{nodes}", settings.key(&route.to_string(), &origin));
                (Cow::Owned(settings.share(nodes)), key)
            }
        });
        if let Some((settings, key)) = &limit {
            // A slot found in the last quarter of the call's time would leave the attempt too
            // little of it (and its timeout would count against a healthy upstream's breaker).
            let wait = Duration::from_millis(settings.max_wait_ms).min(
                deadline.saturating_duration_since(started).saturating_sub(self.settings.total_timeout / 4),
            );
            if let Err(free_in) = self.limiters.take(key, settings, wait).await {
                return Err(UpstreamError::RateLimited { retry_after: free_in });
            }
        }
        let retry = outbound.retry;
        if retry.is_some() {
            self.budgets.called(&origin);
        }
        // A wait for a slot of the limit is not part of the first attempt's time.
        let (mut now, mut retries) = (if limit.is_some() { Instant::now() } else { started }, 0);
        let limit_key = limit.as_ref().map(|(settings, key)| (&**settings, key.as_str()));
        let target = Target {
            request,
            origin: &origin,
            tls: outbound.tls,
            breaker: outbound.breaker,
            h2c: outbound.h2c && self.settings.http2,
            waited_for_failure: AtomicBool::new(false),
        };
        // Whether this call has fetched a new token after a 401 (once at most).
        let mut renewed = false;
        loop {
            let until = retry.map_or(deadline, |settings| settings.attempt_deadline(retries, now, deadline));
            let outcome = match outbound.oauth {
                None => self.attempt(&target, None, now, until).await,
                Some(token) => self.authorized(&target, token, until, limit_key, &mut renewed).await,
            };
            let Some(settings) = retry.filter(|s| retries < s.attempts && s.covers(&outcome)) else {
                return outcome;
            };
            let wait = retry::wait_before(retries, &outcome);
            if wait >= deadline.saturating_duration_since(Instant::now()) || !self.budgets.take(&origin) {
                return outcome;
            }
            logged!(Level::DEBUG, upstream = %origin, retry = retries + 1, of = settings.attempts, wait_ms = wait.as_millis() as u64, "retrying the upstream call");
            tokio::time::sleep(wait).await;
            // A retry is a call the upstream counts: it needs a slot of the limit, free now.
            if let Some((limit, key)) = &limit
                && self.limiters.take(key, limit, Duration::ZERO).await.is_err()
            {
                self.budgets.give_back(&origin);
                return outcome;
            }
            self.budgets.sent(&origin);
            now = Instant::now();
            retries += 1;
        }
    }

    /// An attempt with the route's OAuth2 token, within `deadline`. A 401 answer to it makes the
    /// call fetch a new token and send once more (with a slot of the rate limit free at once),
    /// unless the call did so already.
    async fn authorized(
        &self,
        target: &Target<'_>,
        token: &Arc<TokenRequest>,
        deadline: Instant,
        limit: Option<(&RateLimitSettings, &str)>,
        renewed: &mut bool,
    ) -> Result<Answer, UpstreamError> {
        let bearer = self.bearer(token, deadline, None).await?;
        let answer = self.attempt(target, Some(&bearer.value), Instant::now(), deadline).await;
        if *renewed || !matches!(&answer, Ok(answer) if answer.status == StatusCode::UNAUTHORIZED) {
            return answer;
        }
        *renewed = true;
        // A token asked for a moment ago is not replaced (an upstream that rejects every token
        // would have every call ask for one); a replacement that fails leaves the 401 the answer.
        if !self.tokens.may_replace(token, bearer.serial()) {
            return answer;
        }
        let Ok(bearer) = self.bearer(token, deadline, Some(bearer.serial())).await else {
            return answer;
        };
        if let Some((settings, key)) = limit
            && self.limiters.take(key, settings, Duration::ZERO).await.is_err()
        {
            return answer;
        }
        logged!(Level::DEBUG, upstream = %target.origin, "the upstream rejected the access token; sending once more with a new one");
        self.attempt(target, Some(&bearer.value), Instant::now(), deadline).await
    }

    /// One attempt of a call, through the origin's breaker, within `deadline`, with
    /// `authorization` in place of any `Authorization` header the request has.
    async fn attempt(
        &self,
        target: &Target<'_>,
        authorization: Option<&HeaderValue>,
        started: Instant,
        deadline: Instant,
    ) -> Result<Answer, UpstreamError> {
        let ticket = self
            .breakers
            .admit(target.origin, target.breaker, started)
            .map_err(|refused| UpstreamError::Unavailable { retry_after: refused.retry_after })?;
        target.waited_for_failure.store(false, Ordering::Relaxed);
        let exchange = self.exchange_pooled(target, authorization, started);
        let answer = match tokio::time::timeout_at(deadline, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err(UpstreamError::Timeout),
        };
        // A refusal of the policy says nothing of the upstream: not reported (a probe that ends
        // so lets the next call probe). Nor is the failure of another call's open this one
        // waited for: that call reported it.
        let failed = match &answer {
            Err(_) if target.waited_for_failure.load(Ordering::Relaxed) => None,
            Ok(answer) => Some(answer.status.is_server_error()),
            Err(
                UpstreamError::Connect(_)
                | UpstreamError::Tls(_)
                | UpstreamError::Broken(_)
                | UpstreamError::Timeout,
            ) => Some(true),
            Err(
                UpstreamError::NotAllowed(_)
                | UpstreamError::Unavailable { .. }
                | UpstreamError::RateLimited { .. }
                | UpstreamError::Auth(_),
            ) => None,
            // It answered.
            Err(UpstreamError::TooLarge { .. } | UpstreamError::Coding(_)) => Some(false),
        };
        if let Some(failed) = failed {
            ticket.report(!failed, Instant::now());
        }
        answer
    }

    /// One exchange on a pooled connection, or a new one. When a pooled connection fails before
    /// any byte of the answer (the upstream closed it while idle), the request is sent once more
    /// on a new connection: any request when not one byte of it was written, an idempotent one
    /// otherwise. A new connection the upstream's host refuses is tried once more for any
    /// request.
    async fn exchange_pooled(
        &self,
        target: &Target<'_>,
        authorization: Option<&HeaderValue>,
        started: Instant,
    ) -> Result<Answer, UpstreamError> {
        let request = target.request;
        let key = Key::of(&request.uri, target.tls)?;
        // An upstream that may speak HTTP/2 (an `http` upstream's only for a route that asked
        // for it): a connection to it with a stream free carries the call.
        if !self.may_speak_h2(target) {
            return self.exchange_h1(target, &key, authorization, started, None).await;
        }
        match self.via(target, &key).await? {
            Fresh::Http2(lease) => self.exchange_h2(lease, target, &key, authorization).await,
            Fresh::Http1(connection) => {
                self.exchange_h1(target, &key, authorization, started, connection).await
            }
        }
    }

    /// How a call reaches `key`'s upstream that may speak HTTP/2: a stream on a connection to it
    /// with one free, else HTTP/1.1 when the upstream picked that (with the new connection that
    /// found it out, if this call made it). When every connection is full, none is open, or the
    /// upstream was not met yet, one call opens a connection and the others wait for it (and
    /// for its server to say how many streams it allows), then take a stream on it, or go on in
    /// HTTP/1.1, or answer the open's failure.
    async fn via(
        &self,
        target: &Target<'_>,
        key: &Key,
    ) -> Result<Fresh<Option<wire::Connection>>, UpstreamError> {
        // The opener's lock is held until the open ends, and waited for in turn.
        let (found, turn) = match self.h2.find(key) {
            h2::Found::Open(opener) => {
                let turn = opener.turn.clone().lock_owned().await;
                (self.h2.after_lock(key, &opener).await, Some(turn))
            }
            found => (found, None),
        };
        match found {
            h2::Found::Lease(lease) => Ok(Fresh::Http2(lease)),
            h2::Found::Http1 => Ok(Fresh::Http1(None)),
            h2::Found::Failed(failure) => {
                target.waited_for_failure.store(true, Ordering::Relaxed);
                Err(failure)
            }
            h2::Found::Open(_) => match self.open_shared(target, key, turn).await? {
                Fresh::Http2(lease) => Ok(Fresh::Http2(lease)),
                Fresh::Http1(connection) => Ok(Fresh::Http1(Some(connection))),
            },
        }
    }

    /// Opens a connection to `key`'s upstream that may speak HTTP/2, in a task of its own on the
    /// client's runtime, which holds the opener's lock (`turn`) until the open ends. A
    /// connection is driven by the event loop of the runtime that made it: one that every
    /// worker's calls may ride is made away from the workers, so that a worker busy with a
    /// mapping holds up none of them. And the open is the upstream's, not the call's: a call
    /// that gives up while it waits cancels nothing, and its failure is kept for the calls that
    /// waited. A connection that picked HTTP/1.1 serves the call and is not pooled (its event
    /// loop is not its worker's).
    async fn open_shared(
        &self,
        target: &Target<'_>,
        key: &Key,
        turn: Option<tokio::sync::OwnedMutexGuard<()>>,
    ) -> Result<Fresh, UpstreamError> {
        let connector = self.connector_for(target.tls)?;
        let (client, key, uri) = (self.clone(), key.clone(), target.request.uri.clone());
        let (h2c, may_speak_h2) = (target.h2c, self.may_speak_h2(target));
        let (sent, outcome) = tokio::sync::oneshot::channel();
        // Logged lines of the open name the call that began it.
        let span = crate::logging::request_span!().unwrap_or_else(tracing::Span::none);
        self.spawner.spawn(
            async move {
                let _turn = turn;
                let fresh = client.fresh_with(connector, &uri, &key, h2c, may_speak_h2).await;
                if let Err(failure) = &fresh {
                    client.h2.open_failed(&key, failure);
                }
                let _ = sent.send(fresh);
            }
            .instrument(span),
        );
        let mut fresh = outcome.await.unwrap_or_else(|_| {
            Err(UpstreamError::Broken("the connection's open ended without an outcome".to_owned()))
        })?;
        if let (Fresh::Http1(connection), true) = (&mut fresh, self.spawner.on.is_some()) {
            connection.poolable = false;
        }
        Ok(fresh)
    }

    /// An HTTP/1.1 exchange: on `connection` when given, else on a pooled connection or a new one
    /// (which may turn out to be HTTP/2).
    async fn exchange_h1(
        &self,
        target: &Target<'_>,
        key: &Key,
        authorization: Option<&HeaderValue>,
        started: Instant,
        connection: Option<wire::Connection>,
    ) -> Result<Answer, UpstreamError> {
        let request = target.request;
        let key = key.clone();
        let bytes = wire::encode(request, authorization, self.settings.compression);
        let head_only = request.method == Method::HEAD;
        let limit = self.settings.max_body;
        let pool = self.pools.here();
        // A route that asked for HTTP/2 from the start never takes an HTTP/1.1 connection.
        // A new connection given (the one that found out the upstream speaks HTTP/1.1) goes
        // first: a pooled one stays in the pool.
        let mut pooled = if target.h2c || connection.is_some() { None } else { pool.take(&key, started) };
        let mut given = connection;
        loop {
            let reused = pooled.is_some();
            let mut connection = match pooled.take().or_else(|| given.take()) {
                Some(connection) => connection,
                None => match self.fresh(target, &key).await? {
                    Fresh::Http2(lease) => return self.exchange_h2(lease, target, &key, authorization).await,
                    Fresh::Http1(connection) => connection,
                },
            };
            match connection.exchange(&bytes, head_only, limit).await {
                Ok((answer, reuse)) => {
                    logged!(
                        Level::TRACE,
                        upstream = %key.1,
                        status = answer.status.as_u16(),
                        bytes = answer.body.len(),
                        reused,
                        kept = (reuse == wire::Reuse::Keep),
                        "upstream answered"
                    );
                    if reuse == wire::Reuse::Keep && connection.poolable {
                        pool.put(key, connection, started);
                    }
                    return Ok(answer);
                }
                Err(wire::Failed::Unsent(why)) if reused => {
                    logged!(Level::DEBUG, upstream = %key.1, %why, "a pooled connection was closed before the request went out; sending on a new one");
                    continue;
                }
                Err(wire::Failed::Stale(why)) if reused && request.method.is_idempotent() => {
                    logged!(Level::DEBUG, upstream = %key.1, %why, "a pooled connection was closed; sending on a new one");
                    continue;
                }
                Err(failed) => return Err(self.failure(failed)),
            }
        }
    }

    /// A call over HTTP/2 on `lease`. A stream the upstream never processed (refused, or dropped
    /// before it went out) is sent again, whatever its method, up to [`H2_SENDS`] times in all;
    /// one a `GOAWAY` ended is sent again if its method is idempotent. Each time the connection
    /// that failed is taken out of use, and the call goes to another with a stream free, or a new
    /// one.
    async fn exchange_h2(
        &self,
        mut lease: h2::Lease,
        target: &Target<'_>,
        key: &Key,
        authorization: Option<&HeaderValue>,
    ) -> Result<Answer, UpstreamError> {
        let (compression, limit) = (self.settings.compression, self.settings.max_body);
        let request = target.request;
        let mut sends = 1;
        loop {
            let outcome = h2::exchange(&lease, request, authorization, compression, limit).await;
            // A connection that failed is taken out of use, whether or not the call goes on.
            if matches!(
                &outcome,
                Err(wire::Failed::Unsent(_)
                    | wire::Failed::Stale(_)
                    | wire::Failed::Broken(_)
                    | wire::Failed::Tls(_))
            ) {
                self.h2.forget(key, &lease);
            }
            let why = match outcome {
                Err(wire::Failed::Unsent(why)) if sends < H2_SENDS => why,
                Err(wire::Failed::Stale(why)) if sends < H2_SENDS && request.method.is_idempotent() => why,
                outcome => return outcome.map_err(|failed| self.failure(failed)),
            };
            drop(lease);
            sends += 1;
            logged!(Level::DEBUG, upstream = %key.1, %why, "the upstream did not process the HTTP/2 stream; sending again");
            lease = match self.via(target, key).await? {
                Fresh::Http2(lease) => lease,
                Fresh::Http1(connection) => {
                    let started = Instant::now();
                    return Box::pin(self.exchange_h1(target, key, authorization, started, connection)).await;
                }
            };
        }
    }

    /// A new connection to `key`'s upstream: HTTP/2 when its TLS picked `h2` (kept for the calls
    /// after), else HTTP/1.1. A connection the upstream's host refuses is tried once more (nothing
    /// was sent).
    async fn fresh(&self, target: &Target<'_>, key: &Key) -> Result<Fresh, UpstreamError> {
        let connector = self.connector_for(target.tls)?;
        self.fresh_with(connector, &target.request.uri, key, target.h2c, self.may_speak_h2(target)).await
    }

    /// [`UpstreamClient::fresh`] by `connector` to `uri`, in HTTP/2 from the start when `h2c`;
    /// `may_speak_h2`: the upstream is remembered as one that picked HTTP/1.1 when it does.
    async fn fresh_with(
        &self,
        connector: Connector,
        uri: &http::Uri,
        key: &Key,
        h2c: bool,
        may_speak_h2: bool,
    ) -> Result<Fresh, UpstreamError> {
        let (stream, asked) = match self.connect(connector.clone(), uri).await {
            Err(Connecting::Refused(why)) => {
                logged!(Level::DEBUG, upstream = %key.1, %why, "the connection was refused; trying once more");
                self.connect(connector, uri).await.map_err(Connecting::into_error)?
            }
            connected => connected.map_err(Connecting::into_error)?,
        };
        let asked = self.certificate_asked(key, asked, &stream);
        if h2c || h2::negotiated(&stream) {
            let lease = self
                .h2
                .add(key.clone(), stream, asked, &self.spawner)
                .await
                .map_err(|failed| self.failure(failed))?;
            logged!(Level::DEBUG, upstream = %key.1, "the upstream speaks HTTP/2");
            return Ok(Fresh::Http2(lease));
        }
        if may_speak_h2 {
            self.h2.picked_http1(key);
        }
        let mut connection = wire::Connection::new(stream);
        connection.certificate_asked = asked;
        Ok(Fresh::Http1(connection))
    }

    /// Whether `key`'s upstream asked for a client certificate, by what the handshake of its new
    /// connection `stream` saw (`asked`). A resumed TLS session is not asked again (RFC 8446
    /// §4.3.2): it is answered by what the last full handshake saw.
    fn certificate_asked(
        &self,
        key: &Key,
        asked: Option<tls::CertificateAsked>,
        stream: &wire::Stream,
    ) -> Option<tls::CertificateAsked> {
        let resumed = match stream.inner() {
            hyper_rustls::MaybeHttpsStream::Https(tls) => {
                tls.inner().get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed)
            }
            hyper_rustls::MaybeHttpsStream::Http(_) => return None,
        };
        let seen = &self.certificates_asked;
        match asked {
            Some(asked) => {
                seen.insert(key.clone(), asked);
                Some(asked)
            }
            None if resumed => seen.get(key).map(|asked| *asked),
            None => {
                seen.remove(key);
                None
            }
        }
    }

    /// Whether `target`'s upstream may be spoken to in HTTP/2: an `https` one unless
    /// `RECAST_UPSTREAM_HTTP2=off`, an `http` one when its route asked for prior knowledge.
    fn may_speak_h2(&self, target: &Target<'_>) -> bool {
        target.h2c || (self.settings.http2 && target.request.uri.scheme() == Some(&Scheme::HTTPS))
    }

    /// What a failed exchange is to the call.
    fn failure(&self, failed: wire::Failed) -> UpstreamError {
        match failed {
            wire::Failed::Unsent(why) | wire::Failed::Stale(why) | wire::Failed::Broken(why) => {
                UpstreamError::Broken(why)
            }
            wire::Failed::Tls(why) => UpstreamError::Tls(why),
            wire::Failed::TooLarge => UpstreamError::TooLarge { limit: self.settings.max_body },
            wire::Failed::UnknownCoding(name) => UpstreamError::Coding(format!(
                "the upstream answered in the content coding `{name}`, which recast does not decode (it decodes gzip and br)"
            )),
            wire::Failed::Undecodable(why) => UpstreamError::Coding(why),
        }
    }

    /// The connector of a route's `tls`, or the default one.
    fn connector_for(&self, tls: Option<&RouteTls>) -> Result<Connector, UpstreamError> {
        match tls {
            None => Ok(self.connector.clone()),
            Some(tls) => {
                let made = self.route_connectors.get_or(&format!("{:016x}", tls.id()), || {
                    tls.client_config(&self.roots)
                        .map(|config| with_config(self.plain.clone(), config, self.settings.http2))
                });
                (*made).clone().map_err(UpstreamError::Tls)
            }
        }
    }

    /// A new connection to `uri`'s upstream by `connector`, and whether its TLS handshake asked
    /// for a client certificate.
    async fn connect(
        &self,
        mut connector: Connector,
        uri: &http::Uri,
    ) -> Result<(wire::Stream, Option<tls::CertificateAsked>), Connecting> {
        let connecting = connector.call(uri.clone());
        // The connector logs too (at debug); its lines name the request like ours.
        let logs = tracing::enabled!(target: "hyper_util::client::legacy::connect::http", Level::DEBUG);
        let span = logs.then(|| crate::logging::request_span!()).flatten();
        let connecting = async move {
            match span {
                Some(span) => connecting.instrument(span).await,
                None => connecting.await,
            }
        };
        // The TLS handshake too is part of connecting, and has its time limit.
        let limit = self.settings.connect_timeout;
        let Ok((connected, asked)) = tokio::time::timeout(limit, tls::noting_asked(connecting)).await else {
            return Err(Connecting::Failed(UpstreamError::Connect(format!(
                "no connection within RECAST_UPSTREAM_CONNECT_TIMEOUT_MS ({} ms)",
                limit.as_millis()
            ))));
        };
        let stream = connected.map_err(|e| {
            if let Some(refusal) = refusal_in(&*e) {
                return Connecting::Failed(UpstreamError::NotAllowed(refusal.clone()));
            }
            let why = error_chain(&*e);
            if connection_refused(&*e) {
                Connecting::Refused(why)
            } else if tls::is_tls_failure(&*e) {
                Connecting::Failed(UpstreamError::Tls(why))
            } else {
                Connecting::Failed(UpstreamError::Connect(why))
            }
        })?;
        logged!(Level::DEBUG, upstream = ?uri.authority().map(Authority::as_str), "connected to the upstream");
        Ok((TokioIo::new(stream), asked))
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

/// How many times an HTTP/2 call is sent at most when the upstream did not process it.
const H2_SENDS: usize = 3;

/// A new connection, by the protocol its upstream picked (or, as [`UpstreamClient::via`]
/// answers, the way to the upstream).
enum Fresh<Http1 = wire::Connection> {
    Http2(h2::Lease),
    Http1(Http1),
}

/// Why no connection was made: refused by the upstream's host (nothing was sent, so a request
/// of any method may try once more), or anything else.
enum Connecting {
    Refused(String),
    Failed(UpstreamError),
}

impl Connecting {
    fn into_error(self) -> UpstreamError {
        match self {
            Connecting::Refused(why) => UpstreamError::Connect(why),
            Connecting::Failed(error) => error,
        }
    }
}

/// Whether a connector's error is, at its root, a refused TCP connection.
fn connection_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cause = e.source();
    }
    false
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
}

/// `scheme://host:port` of `uri`, the host in lower case and the port always written: what a
/// breaker is kept by.
fn origin(uri: &http::Uri) -> String {
    let scheme = uri.scheme_str().unwrap_or("http");
    let host = uri.host().unwrap_or_default().to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or(if scheme == "https" { 443 } else { 80 });
    format!("{scheme}://{host}:{port}")
}

/// Where a pooled connection goes: scheme and authority, and the route TLS it was made with (0:
/// none), so that a connection that presented one route's certificate carries no other's call.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key(Scheme, Authority, u64);

impl Key {
    fn of(uri: &http::Uri, tls: Option<&RouteTls>) -> Result<Key, UpstreamError> {
        match (uri.scheme(), uri.authority()) {
            (Some(scheme), Some(authority)) => {
                Ok(Key(scheme.clone(), authority.clone(), tls.map_or(0, RouteTls::id)))
            }
            _ => Err(UpstreamError::Connect(format!("`{uri}` is not an absolute URL"))),
        }
    }
}

/// The idle connections of each worker (index = worker number), and of other threads (0).
struct Pools(Box<[Pool]>);

impl Pools {
    /// The calling thread's pool.
    fn here(&self) -> &Pool {
        // Both counts come from the same setting; a client made for fewer workers would share.
        let worker = crate::workers::current();
        debug_assert!(worker < self.0.len(), "worker {worker} has no pool of its own");
        &self.0[worker % self.0.len()]
    }
}

/// Idle connections by upstream, newest last.
#[derive(Default)]
struct Pool {
    idle: Mutex<HashMap<Key, Vec<wire::Connection>, BuildHasherDefault<Fnv>>>,
}

impl Pool {
    /// The most recently used idle connection to `key` that is still open at `now`.
    fn take(&self, key: &Key, now: Instant) -> Option<wire::Connection> {
        loop {
            let connection = self.idle.lock().unwrap_or_else(PoisonError::into_inner).get_mut(key)?.pop();
            let mut connection = connection?;
            if now.saturating_duration_since(connection.idle_since) < IDLE_TIMEOUT && connection.is_open() {
                return Some(connection);
            }
        }
    }

    /// Closes the connections idle since before `now - IDLE_TIMEOUT`, and forgets upstreams with
    /// none left.
    fn sweep(&self, now: Instant) {
        let mut closed = Vec::new();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|_, connections| {
            closed.extend(connections.drain(..expired(connections, now)));
            !connections.is_empty()
        });
        drop(idle);
        drop(closed);
    }

    /// Keeps a connection for the next request to `key`, idle from `now` (the start of the
    /// exchange it served, a little early, so it expires no later than it should); closes those
    /// idle too long.
    fn put(&self, key: Key, mut connection: wire::Connection, now: Instant) {
        connection.idle_since = now;
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let connections = idle.entry(key).or_default();
        let over = (connections.len() + 1).saturating_sub(MAX_IDLE_PER_HOST);
        let closed: Vec<_> = connections.drain(..expired(connections, now).max(over)).collect();
        connections.push(connection);
        drop(idle);
        drop(closed);
    }
}

/// How many of an upstream's idle connections (oldest first) have been idle too long at `now`.
fn expired(connections: &[wire::Connection], now: Instant) -> usize {
    connections.iter().take_while(|c| now.saturating_duration_since(c.idle_since) >= IDLE_TIMEOUT).count()
}

/// FNV-1a for the pool's keys: a handful of upstream authorities named by registered routes, so a
/// keyed hash buys nothing, and an `Authority` is hashed a byte at a time.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// `inner` with TLS (rustls with ring, Mozilla's roots) for `https://` URLs, HTTP/1.1.
pub(crate) fn https_or_http<C>(inner: C) -> HttpsConnector<C> {
    let roots = tls::roots(&[]).unwrap_or_else(|_| rustls::RootCertStore::empty());
    with_config(inner, tls::default_config(roots), false)
}

/// `inner` with TLS as `config` says for `https://` URLs: HTTP/1.1, and HTTP/2 offered by ALPN
/// when `http2`.
fn with_config<C>(inner: C, config: rustls::ClientConfig, http2: bool) -> HttpsConnector<C> {
    let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config).https_or_http();
    if http2 {
        builder.enable_all_versions().wrap_connector(inner)
    } else {
        builder.enable_http1().wrap_connector(inner)
    }
}

#[cfg(test)]
mod tests;

/// An error and its causes, on one line.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
