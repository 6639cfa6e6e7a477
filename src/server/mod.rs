//! The HTTP server: accepts connections, routes each request to its handler, answers every error
//! through [`ApiError`], stamps `X-Request-Id` on every answer, loads the stored routes at start
//! and drains on shutdown.

mod admission;
mod call;
mod connection;
mod lane;
mod mapping;
mod playground;
mod preview;
pub mod problem;
mod routes;

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioTimer;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tracing::Level;
use uuid::Uuid;

use self::admission::{AdminToken, InFlight};
use self::connection::{Activity, Open};
use crate::config::{Config, DEFAULT_MAX_HEADERS};
use crate::logging::logged;
use crate::metrics::{Endpoint, Gauges, Metrics, RulesSource};
use crate::policy::{Lookup, OutboundPolicy, SystemLookup};
use crate::route::Route;
use crate::storage::{RawRecord, StorageError, Store};
use crate::table::RouteTable;
use crate::upstream::{BodyError, UpstreamClient, read_limited};
use crate::workers::Workers;
pub use preview::preview_output;
pub use problem::ApiError;

/// What every handler answers with.
pub type Response = http::Response<Full<Bytes>>;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

/// Where the service is in its life (SPEC §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Lifecycle {
    /// Starting: loading and compiling the stored routes; only health, readiness and previews
    /// are answered.
    Idle = 0,
    Running = 1,
    /// Shutting down: no new connections, in-flight requests finish.
    Stopped = 2,
}

/// Why the service could not run.
#[derive(Debug)]
pub enum RunError {
    Storage(StorageError),
    Io(std::io::Error),
    /// Settings that recast refuses to run with.
    Config(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Storage(e) => e.fmt(f),
            RunError::Io(e) => e.fmt(f),
            RunError::Config(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for RunError {}

/// State shared by every connection.
pub struct State {
    config: Config,
    lifecycle: AtomicU8,
    request_ids: RequestIds,
    store: Arc<Store>,
    table: RouteTable,
    client: UpstreamClient,
    admin: Option<AdminToken>,
    in_flight: InFlight,
    metrics: Metrics,
    /// Held while a route is replaced or deleted, so those changes apply one at a time.
    writes: tokio::sync::Mutex<()>,
}

impl State {
    pub fn lifecycle(&self) -> Lifecycle {
        match self.lifecycle.load(Ordering::Acquire) {
            0 => Lifecycle::Idle,
            1 => Lifecycle::Running,
            _ => Lifecycle::Stopped,
        }
    }

    /// Moves from `from` to `to`, only if the state is still `from`.
    fn advance(&self, from: Lifecycle, to: Lifecycle) {
        let moved =
            self.lifecycle.compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire);
        if moved.is_ok() {
            tracing::info!(state = ?to, routes = self.table.len(), "lifecycle");
        }
    }

    fn enter(&self, next: Lifecycle) {
        self.lifecycle.store(next as u8, Ordering::Release);
        tracing::info!(state = ?next, routes = self.table.len(), "lifecycle");
    }

    /// Route calls and route management wait until the stored routes are loaded.
    fn loaded(&self) -> Result<(), ApiError> {
        match self.lifecycle() {
            Lifecycle::Idle => Err(ApiError::Starting),
            _ => Ok(()),
        }
    }

    /// Runs a storage operation off the async workers (RocksDB writes are synced to disk).
    async fn storage<T: Send + 'static>(
        &self,
        operation: impl FnOnce(&Store) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || operation(&store)).await {
            Ok(result) => result.map_err(|e| ApiError::Storage(e.to_string())),
            Err(_) => Err(ApiError::Storage("the storage task did not finish".to_owned())),
        }
    }
}

/// Serves HTTP on `listener` until `shutdown` completes: opens the store in the configured data
/// directory, answers health checks at once, loads and compiles every stored route (`Idle`), then
/// serves everything (`Running`). On shutdown it stops accepting, lets requests in flight finish
/// within the grace period, closes the store and returns.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let outbound = Outbound {
        policy: Arc::new(OutboundPolicy::new(&config.upstream_allow)),
        lookup: Arc::new(SystemLookup),
    };
    run_with(listener, config, outbound, shutdown).await
}

/// Where upstream calls may go and how names are resolved.
pub struct Outbound {
    pub policy: Arc<OutboundPolicy>,
    pub lookup: Arc<dyn Lookup>,
}

/// [`run`] with the outbound policy and resolver given (harnesses that must stay on loopback).
pub async fn run_with(
    listener: TcpListener,
    config: Config,
    outbound: Outbound,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let listen = listener.local_addr().map_err(RunError::Io)?;
    config.check_exposure(listen).map_err(RunError::Config)?;
    let dir = config.data_dir.clone();
    let secret = config.secret_key.clone();
    let store = tokio::task::spawn_blocking(move || Store::open_holding_compactions(&dir, secret.as_ref()))
        .await
        .map_err(|e| RunError::Io(std::io::Error::other(e)))?
        .map_err(RunError::Storage)?;
    let state = Arc::new(State {
        client: UpstreamClient::new(config.upstream(), outbound.policy, outbound.lookup),
        admin: config.admin_token.as_ref().map(AdminToken::new),
        in_flight: InFlight::new(config.max_inflight),
        metrics: Metrics::default(),
        config,
        lifecycle: AtomicU8::new(Lifecycle::Idle as u8),
        request_ids: RequestIds::new(),
        store: Arc::new(store),
        table: RouteTable::default(),
        writes: tokio::sync::Mutex::new(()),
    });
    tracing::info!(state = ?Lifecycle::Idle, data = %state.store.dir().display(), "lifecycle");
    tracing::info!(key = %state.store.key_origin(), "stored routes are sealed with the secret key from");
    if state.store.migrated > 0 {
        tracing::info!(routes = state.store.migrated, "stored routes sealed with the secret key");
    }
    // Said before the loader starts, so these lines come before the `Running` one.
    tracing::info!(address = %listen, "listening");
    if state.admin.is_none() {
        tracing::warn!(
            "RECAST_ADMIN_TOKEN is not set: anyone who can reach {listen} can register and change routes"
        );
    }
    tracing::info!(upstream_allow = %state.config.upstream_allow, "outbound policy: public addresses, plus");
    let loader = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || {
            load_routes(&state);
            // Table files left to merge are merged from now on, in the background.
            if let Err(e) = state.store.resume_compactions() {
                tracing::error!(
                    error = %e,
                    "turning the store's background compactions back on failed; if they are still off, table files pile up until a restart"
                );
            }
            // Unless a shutdown came first: then the state stays `Stopped`.
            state.advance(Lifecycle::Idle, Lifecycle::Running);
        })
    };

    let mut http = hyper::server::conn::http1::Builder::new();
    // A client may close its sending side once its request is out (`shutdown(SHUT_WR)`) and
    // still get the answer.
    http.timer(TokioTimer::new())
        .half_close(true)
        .max_header_size(state.config.max_header_bytes)
        // `connection::drive` times heads itself, apart from idle waits for the next request.
        .header_read_timeout(None);
    // hyper keeps up to 100 headers on the stack; more means a heap allocation per request.
    if state.config.max_headers != DEFAULT_MAX_HEADERS {
        http.max_headers(state.config.max_headers);
    }
    let http = Arc::new(http);
    let timeouts = connection::Timeouts {
        idle: Duration::from_millis(state.config.idle_timeout_ms),
        head: Duration::from_millis(state.config.header_timeout_ms),
    };
    let open = Arc::new(Open::default());
    let workers = Workers::start(state.config.workers()).map_err(RunError::Io)?;
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    // Taken off this runtime's event loop, to join the loop of the worker it goes to.
                    let stream = match stream.into_std() {
                        Ok(stream) => stream,
                        Err(e) => {
                            tracing::warn!(error = %e, "accepted connection dropped");
                            continue;
                        }
                    };
                    let activity = Activity::new();
                    let registered = open.register(&activity);
                    let (worker, placed) = workers.place();
                    let state = state.clone();
                    let http = http.clone();
                    connections.spawn_on(async move {
                        let _registered = registered;
                        let _placed = placed;
                        let stream = match tokio::net::TcpStream::from_std(stream) {
                            Ok(stream) => stream,
                            Err(e) => return tracing::warn!(error = %e, "accepted connection dropped"),
                        };
                        let stream = connection::Watched::new(stream, activity.clone());
                        let connection = lane::Lane::new(state, stream, activity.clone(), http);
                        match connection::drive(connection, activity, timeouts).await {
                            Some(Err(e)) => tracing::debug!(error = %e, "connection ended with an error"),
                            None => tracing::debug!("connection dropped after its deadline"),
                            Some(Ok(())) => {}
                        }
                    }, worker);
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            // Reap finished connection tasks so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    state.enter(Lifecycle::Stopped);
    let grace = state.config.shutdown_grace();
    open.stop();
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drained).await.is_err() {
        tracing::warn!(open = connections.len(), ?grace, "grace period over; closing what is left");
    }
    connections.shutdown().await;
    // Store writes begun by a request finish before the store is closed; blocking work that
    // outlasts the grace period (a name lookup that hangs) is not waited for.
    if tokio::time::timeout(grace, tokio::task::spawn_blocking(move || workers.stop())).await.is_err() {
        tracing::warn!(?grace, "blocking work begun by requests is still running; not waiting for it");
    }
    if tokio::time::timeout(grace, loader).await.is_err() {
        // The loader holds the state; the store closes when it finishes (or the process exits).
        tracing::warn!("stopped while routes were still loading");
        return Ok(());
    }
    // Every connection task is gone, so this is the last reference: dropping it closes the store.
    drop(state);
    tracing::info!("stopped; storage closed");
    Ok(())
}

/// Loads and compiles every stored route into the table, decoding and compiling on one thread
/// per core while this one reads the store. A route that no longer compiles stays, and answers
/// 503 with the reason; an unreadable record is logged.
fn load_routes(state: &State) {
    /// Records handed to a decoding thread at a time.
    const BATCH: usize = 256;
    let limits = state.config.limits();
    let threads = crate::config::cores();
    let (batches, receiver) = std::sync::mpsc::sync_channel::<Vec<RawRecord>>(threads * 2);
    // Only the decoders hold the receiver, so if they all ended, sending fails instead of blocking.
    let receiver = Arc::new(Mutex::new(receiver));
    let counts = std::thread::scope(|scope| {
        let decoders: Vec<_> = (0..threads)
            .map(|_| {
                let receiver = receiver.clone();
                let limits = &limits;
                scope.spawn(move || {
                    let mut counts = Loaded::default();
                    loop {
                        // The lock is held only while waiting for the next batch.
                        let next = receiver.lock().unwrap_or_else(PoisonError::into_inner).recv();
                        let Ok(batch) = next else { break };
                        for record in batch {
                            let route = state.store.decode_record(&record).map_err(|e| e.to_string());
                            counts.add(state, route.and_then(|stored| Route::from_stored(stored, limits)));
                        }
                    }
                    counts
                })
            })
            .collect();
        drop(receiver);
        let mut counts = Loaded::default();
        let mut batch = Vec::with_capacity(BATCH);
        for record in state.store.records() {
            match record {
                Ok(record) => batch.push(record),
                Err(e) => counts.add(state, Err(e.to_string())),
            }
            if batch.len() == BATCH
                && batches.send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH))).is_err()
            {
                break;
            }
        }
        let _ = batches.send(batch);
        drop(batches);
        // A decoder that panicked is a bug; carry it on rather than serve with routes missing.
        decoders
            .into_iter()
            .map(|decoder| decoder.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .fold(counts, Loaded::sum)
    });
    tracing::info!(
        loaded = counts.loaded,
        broken = counts.broken,
        unreadable = counts.unreadable,
        "routes loaded"
    );
}

/// What loading the stored routes found.
#[derive(Default)]
struct Loaded {
    loaded: usize,
    broken: usize,
    unreadable: usize,
}

impl Loaded {
    /// Puts a loaded route in the table, or logs why it could not be loaded.
    fn add(&mut self, state: &State, route: Result<Route, String>) {
        match route {
            Ok(route) => {
                if let Some(why) = route.broken() {
                    self.broken += 1;
                    if route.rules.is_err() {
                        state.metrics.compile_failure(RulesSource::Stored);
                    }
                    tracing::error!(uuid = %route.uuid, %why, "stored route cannot serve calls; it answers 503");
                }
                self.loaded += 1;
                state.table.insert(Arc::new(route));
            }
            Err(why) => {
                self.unreadable += 1;
                tracing::error!(%why, "stored route skipped");
            }
        }
    }

    fn sum(self, other: Loaded) -> Loaded {
        Loaded {
            loaded: self.loaded + other.loaded,
            broken: self.broken + other.broken,
            unreadable: self.unreadable + other.unreadable,
        }
    }
}

/// Routes one request and finishes its answer.
async fn handle(state: &State, request: Request<Incoming>) -> Response {
    let request_id = state.request_ids.for_headers(request.headers());
    identified(request_id, serve(state, request)).await
}

/// Serves a request under its id: every log line written meanwhile carries it (the `request`
/// span, [`crate::logging`]), and the answer says it (`X-Request-Id`).
async fn identified(request_id: HeaderValue, serve: impl Future<Output = Response>) -> Response {
    let (request_id, mut response) = crate::logging::identified(request_id, serve).await;
    response.headers_mut().insert(REQUEST_ID, request_id);
    response
}

async fn serve(state: &State, request: Request<Incoming>) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let segments: Vec<&str> = path.strip_prefix('/').unwrap_or(&path).splitn(3, '/').collect();
    let endpoint = endpoint(&segments);
    answered(state, &method, &path, endpoint, route(state, request, &segments)).await
}

/// Admits a request to `endpoint` and answers it by `route`, or with 503 when too many are in
/// flight; counts the answer and logs it.
async fn answered(
    state: &State,
    method: &Method,
    path: &str,
    endpoint: Endpoint,
    route: impl Future<Output = Result<Response, ApiError>>,
) -> Response {
    // Only the debug line below needs the time.
    let started = tracing::enabled!(tracing::Level::DEBUG).then(std::time::Instant::now);
    // Health checks stay answerable under any load; everything else takes a place or gets 503.
    let admitted = match endpoint {
        Endpoint::Health => Ok(None),
        _ => state.in_flight.enter().map(Some).ok_or(ApiError::Overloaded),
    };
    // A route call counts its answer on its route (`call::call`); the rest are counted here.
    let counted_by_call = admitted.is_ok() && endpoint == Endpoint::Call;
    let result = match admitted {
        Ok(_place) => route.await,
        Err(overloaded) => Err(overloaded),
    };
    let response = result.unwrap_or_else(|e| e.to_response(path));
    let status = response.status().as_u16();
    if !counted_by_call {
        state.metrics.endpoint(endpoint, status);
    }
    if let Some(started) = started {
        logged!(Level::DEBUG, %method, path, status, micros = started.elapsed().as_micros() as u64, "answered");
    }
    response
}

/// Which endpoint a path belongs to, for metrics; mirrors [`route`].
fn endpoint(segments: &[&str]) -> Endpoint {
    match segments {
        ["v1", "preview"] => Endpoint::Preview,
        ["v1", "mapping"] => Endpoint::Mapping,
        ["v1", "routes"] | ["v1", "routes", _] => Endpoint::Routes,
        ["v1", _, _] => Endpoint::Call,
        ["healthz" | "readyz"] => Endpoint::Health,
        ["metrics"] => Endpoint::Metrics,
        ["openapi.json"] => Endpoint::OpenApi,
        [name] if playground::serves(name) => Endpoint::Playground,
        _ => Endpoint::Other,
    }
}

async fn route(state: &State, request: Request<Incoming>, segments: &[&str]) -> Result<Response, ApiError> {
    let method = request.method().clone();
    if admission::is_admin_path(segments)
        && let Some(token) = &state.admin
        && !token.admits(request.headers())
    {
        return Err(ApiError::AdminTokenRequired);
    }
    match (&method, segments) {
        (&Method::POST, ["v1", "preview"]) => preview::preview(state, request).await,
        (_, ["v1", "preview"]) => Err(ApiError::MethodNotAllowed { allow: "POST" }),
        (&Method::POST, ["v1", "mapping"]) => mapping::register(state, request).await,
        (_, ["v1", "mapping"]) => Err(ApiError::MethodNotAllowed { allow: "POST" }),
        (&Method::GET, ["v1", "routes"]) => routes::list(state, request.uri().query()).await,
        (_, ["v1", "routes"]) => Err(ApiError::MethodNotAllowed { allow: "GET" }),
        (_, ["v1", "routes", id]) => {
            let uuid = Uuid::try_parse(id).map_err(|_| ApiError::NotFound)?;
            match method {
                Method::GET => routes::get(state, uuid),
                Method::PUT => mapping::update(state, request, uuid).await,
                Method::DELETE => routes::delete(state, uuid).await,
                _ => Err(ApiError::MethodNotAllowed { allow: "GET, PUT, DELETE" }),
            }
        }
        (_, ["v1", id, rest]) => {
            let (parts, body) = request.into_parts();
            let request = call::CallRequest {
                method: &parts.method,
                path: parts.uri.path(),
                query: parts.uri.query(),
                headers: &parts.headers,
                body: Some(body),
            };
            Ok(call::call(state, request, id, rest).await)
        }
        (&Method::GET, ["healthz"]) => Ok(json(StatusCode::OK, r#"{"status":"ok"}"#)),
        (&Method::GET, ["readyz"]) => Ok(readiness(state)),
        (_, ["healthz" | "readyz"]) => Err(ApiError::MethodNotAllowed { allow: "GET" }),
        (&Method::GET, ["metrics"]) => Ok(metrics(state)),
        (&Method::GET, ["openapi.json"]) => Ok(json(StatusCode::OK, OPENAPI.as_bytes())),
        (_, ["metrics" | "openapi.json"]) => Err(ApiError::MethodNotAllowed { allow: "GET" }),
        (_, [name]) if playground::serves(name) => playground::serve(&method, name),
        _ => Err(ApiError::NotFound),
    }
}

/// The OpenAPI 3.1 description of this API (`GET /openapi.json`); `tests/it/openapi.rs` sends
/// its examples and checks every answer against it.
pub const OPENAPI: &str = include_str!("../../docs/openapi.json");

/// `GET /metrics`: the Prometheus text exposition. Routes never called have no series, so a
/// scrape copies out only the counts of routes that were.
fn metrics(state: &State) -> Response {
    let (mut loaded, mut broken) = (0, 0);
    let mut called = Vec::new();
    state.table.for_each(|route| {
        loaded += 1;
        broken += usize::from(!route.serves());
        if !route.requests.is_empty() {
            called.push((route.uuid, route.requests.clone()));
        }
    });
    let gauges = Gauges {
        routes_loaded: loaded,
        routes_broken: broken,
        in_flight: state.in_flight.now(),
        lifecycle: state.lifecycle() as u8,
    };
    let text =
        state.metrics.render(gauges, called.iter().map(|(uuid, counts)| (uuid.to_string(), &**counts)));
    let mut response = http::Response::new(Full::new(Bytes::from(text)));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    response
}

fn readiness(state: &State) -> Response {
    match state.lifecycle() {
        Lifecycle::Running => json(StatusCode::OK, r#"{"status":"running"}"#),
        Lifecycle::Idle => json(StatusCode::SERVICE_UNAVAILABLE, r#"{"status":"idle"}"#),
        Lifecycle::Stopped => json(StatusCode::SERVICE_UNAVAILABLE, r#"{"status":"stopped"}"#),
    }
}

/// A JSON answer.
pub fn json(status: StatusCode, body: impl Into<Bytes>) -> Response {
    let mut response = http::Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Reads a request body of at most `RECAST_MAX_REQUEST_BYTES`; larger bodies are refused before
/// they are read when `Content-Length` says so, else as soon as the limit is passed. The whole
/// body must arrive within `RECAST_HEADER_TIMEOUT_MS` (408 otherwise), so a client that drips it
/// cannot hold its place for long.
pub(crate) async fn read_body(
    state: &State,
    headers: &HeaderMap,
    body: Incoming,
) -> Result<Vec<u8>, ApiError> {
    let within = Duration::from_millis(state.config.header_timeout_ms);
    let limit = state.config.max_request_bytes;
    match tokio::time::timeout(within, read_limited(headers, body, limit)).await {
        Err(_) => Err(ApiError::BodyTimeout),
        Ok(read) => read.map_err(|e| match e {
            BodyError::TooLarge => ApiError::BodyTooLarge { limit },
            BodyError::Broken => ApiError::BodyUnreadable,
        }),
    }
}

/// The time now, in milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A `Server-Timing` header value: `name;dur=milliseconds` per entry, to the microsecond.
pub(crate) fn timing(entries: &[(&str, Duration)]) -> HeaderValue {
    let mut text = Vec::with_capacity(entries.len() * 24);
    let mut digits = itoa::Buffer::new();
    for (i, (name, elapsed)) in entries.iter().enumerate() {
        if i > 0 {
            text.extend_from_slice(b", ");
        }
        let micros = elapsed.as_micros();
        text.extend_from_slice(name.as_bytes());
        text.extend_from_slice(b";dur=");
        text.extend_from_slice(digits.format(micros / 1000).as_bytes());
        let fraction = (micros % 1000) as u16;
        text.extend_from_slice(&[
            b'.',
            b'0' + (fraction / 100) as u8,
            b'0' + (fraction / 10 % 10) as u8,
            b'0' + (fraction % 10) as u8,
        ]);
    }
    HeaderValue::from_bytes(&text).unwrap_or(HeaderValue::from_static("total;dur=0"))
}

/// Request ids: the client's `X-Request-Id` when it is sane, else a new one made of a random
/// per-process prefix and a counter (unique without a system call per request).
struct RequestIds {
    prefix: u32,
    next: AtomicU64,
}

impl RequestIds {
    fn new() -> RequestIds {
        let prefix = std::collections::hash_map::RandomState::new().build_hasher().finish() as u32;
        RequestIds { prefix, next: AtomicU64::new(1) }
    }

    fn for_headers(&self, headers: &HeaderMap) -> HeaderValue {
        if let Some(given) = headers.get(REQUEST_ID)
            && is_sane_request_id(given.as_bytes())
        {
            return given.clone();
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut id = [0u8; 21];
        hex(&mut id[..8], u64::from(self.prefix));
        id[8] = b'-';
        hex(&mut id[9..], n);
        HeaderValue::from_bytes(&id).unwrap_or(HeaderValue::from_static("unknown"))
    }
}

/// Writes the low `4 × out.len()` bits of `n` as lowercase hex digits, filling `out`.
fn hex(out: &mut [u8], mut n: u64) {
    for digit in out.iter_mut().rev() {
        *digit = b"0123456789abcdef"[(n & 0xf) as usize];
        n >>= 4;
    }
}

/// 1 to 128 characters of letters, digits and `-_.:`.
fn is_sane_request_id(id: &[u8]) -> bool {
    (1..=128).contains(&id.len())
        && id.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_keep_sane_client_ids_and_replace_others() {
        let ids = RequestIds::new();
        let with = |id: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(REQUEST_ID, HeaderValue::from_str(id).unwrap());
            ids.for_headers(&headers)
        };
        assert_eq!(with("abc-123_x.y:z"), "abc-123_x.y:z");
        let replaced = with("has space");
        assert_ne!(replaced, "has space");
        assert_ne!(with(&"a".repeat(129)), "a".repeat(129).as_str());
        let fresh = ids.for_headers(&HeaderMap::new());
        assert!(is_sane_request_id(fresh.as_bytes()));
        assert_ne!(fresh, replaced, "generated ids are unique");
    }

    #[test]
    fn server_timing_writes_milliseconds_to_the_microsecond() {
        let header =
            timing(&[("upstream", Duration::from_micros(1_234_567)), ("map", Duration::from_nanos(5_900))]);
        assert_eq!(header, "upstream;dur=1234.567, map;dur=0.005");
        assert_eq!(timing(&[("map", Duration::ZERO)]), "map;dur=0.000");
    }

    #[test]
    fn generated_request_ids_are_prefix_and_counter_in_hex() {
        let ids = RequestIds { prefix: 0xdead_beef, next: AtomicU64::new(0x1_2345_6789) };
        assert_eq!(ids.for_headers(&HeaderMap::new()), "deadbeef-000123456789");
        assert_eq!(ids.for_headers(&HeaderMap::new()), "deadbeef-00012345678a");
    }
}
