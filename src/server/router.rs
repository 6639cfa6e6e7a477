//! The router: every request that hyper reads, and every route call the lane reads, is answered
//! here under its request id, admitted or refused by the in-flight limit, sent to its handler by
//! method and path, and counted. Also the small handlers (health, readiness, metrics, the API
//! description) and request ids.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use http_body_util::Full;
use tracing::Level;
use uuid::Uuid;

use super::conduct::{Conduct, Sent};
use super::connection::{Activity, RequestBody};
use super::reply::{json, timing};
use super::{
    ApiError, Lifecycle, REQUEST_ID, Request, Response, SERVER_TIMING, State, admission, call, consumers,
    keys, management, mapping, playground, preview, traced,
};
use crate::callers::Memo;
use crate::config::RouteLabel;
use crate::logging::logged;
use crate::metrics::{Endpoint, Gauges, PanicSite};
use crate::table::Entry;

/// Answers one request that hyper read, from `peer`.
/// `memo`: the connection's last credential and what it made ([`crate::callers::memo`]).
pub(super) async fn handle(state: &State, request: Request, peer: Option<IpAddr>, memo: &Memo) -> Response {
    let request_id = state.request_ids.for_headers(request.headers());
    let path = request.uri().path();
    let inbound = traced::Inbound {
        method: request.method(),
        path,
        headers: request.headers(),
        // Its host and port only: an authority may carry a user and password.
        authority: request
            .uri()
            .authority()
            .map(|a| a.as_str().rsplit_once('@').map_or(a.as_str(), |(_, host)| host)),
        peer,
        version: match request.version() {
            http::Version::HTTP_10 => &crate::telemetry::keys::PROTOCOL_1_0,
            http::Version::HTTP_2 => &crate::telemetry::keys::PROTOCOL_2,
            _ => &crate::telemetry::keys::PROTOCOL_1_1,
        },
        route: traced::route_template(&segments(path), playground_file(&segments(path))),
    };
    let (scope, span) = traced::begin(state, &inbound);
    let ids = scope.ids();
    // Boxed: the answer's future is large (it can be any endpoint's), and the trace's and the
    // request id's wrappers each move what they are given.
    let respond = crate::tasks::boxed(|| respond(state, request, memo));
    stamped(request_id, Some(ids), traced::serve(scope, span, respond)).await
}

/// Whether a path of one segment is a file of the playground.
fn playground_file(segments: &[&str]) -> bool {
    matches!(segments, [name] if playground::has_file(name))
}

/// Answers a request under its id: every log line written meanwhile carries it and the ids of
/// `trace` (the `request` span, [`crate::logging`]), and the answer says it (`X-Request-Id`).
pub(super) async fn stamped(
    request_id: HeaderValue,
    trace: Option<crate::logging::TraceIds>,
    respond: impl Future<Output = Response>,
) -> Response {
    let (request_id, mut response) = crate::logging::within(request_id, trace, respond).await;
    response.headers_mut().insert(REQUEST_ID, request_id);
    response
}

async fn respond(state: &State, request: Request, memo: &Memo) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let segments = segments(&path);
    let endpoint = endpoint(&segments);
    // Boxed: `answered` moves the handler's future, the largest of every endpoint's.
    let handler = crate::tasks::boxed(|| dispatch(state, request, &segments, memo));
    answered(state, &method, &path, endpoint, handler).await
}

/// Admits a request to `endpoint` and answers it by `handler`, or with 503 when too many are in
/// flight; counts the answer and logs it.
pub(super) async fn answered(
    state: &State,
    method: &Method,
    path: &str,
    endpoint: Endpoint,
    handler: impl Future<Output = Result<Response, ApiError>>,
) -> Response {
    // Only the debug line below needs the time.
    let started = tracing::enabled!(tracing::Level::DEBUG).then(std::time::Instant::now);
    // Health checks stay answerable under any load; everything else takes a place or gets 503.
    let admitted = match endpoint {
        Endpoint::Health => Ok(None),
        _ => state.in_flight.enter().map(Some).ok_or(ApiError::Overloaded),
    };
    // A route call counts its answer on its route (`call::call`); the rest are counted here.
    let mut counted_by_call = admitted.is_ok() && endpoint == Endpoint::Call;
    let result = match admitted {
        // A panic is a bug; it must not take the connection (or the worker) with it. The
        // request's place is freed as the handler unwinds.
        Ok(_place) => crate::tasks::caught(handler).await.unwrap_or_else(|panic| {
            state.metrics.panicked(PanicSite::Request);
            logged!(Level::ERROR, %method, path, %panic, "a handler panicked; answered 500");
            counted_by_call = false;
            Err(ApiError::Internal)
        }),
        Err(overloaded) => Err(overloaded),
    };
    let mut response = result.unwrap_or_else(|e| e.to_response(path));
    let status = response.status().as_u16();
    if !counted_by_call {
        state.metrics.endpoint(endpoint, status);
        // Every answer to a route call says what its steps took (SPEC §2.2): here, no step ran.
        if endpoint == Endpoint::Call {
            let none = timing(&[("upstream", Duration::ZERO), ("map", Duration::ZERO)]);
            response.headers_mut().insert(SERVER_TIMING, none);
        }
    }
    if let Some(started) = started {
        logged!(Level::DEBUG, %method, path, status, micros = started.elapsed().as_micros() as u64, "answered");
    }
    response
}

/// A path's first three segments, the last holding the rest (`/v1/{uuid}/{path}`): what
/// [`endpoint`] and [`dispatch`] route by.
pub(super) fn segments(path: &str) -> smallvec::SmallVec<[&str; 3]> {
    path.strip_prefix('/').unwrap_or(path).splitn(3, '/').collect()
}

/// Which endpoint a path belongs to, for metrics; mirrors [`dispatch`].
pub(super) fn endpoint(segments: &[&str]) -> Endpoint {
    match segments {
        ["v1", "preview"] => Endpoint::Preview,
        ["v1", "mapping"] => Endpoint::Mapping,
        ["v1", "routes"] | ["v1", "routes", _] => Endpoint::Routes,
        ["v1", "keys"] | ["v1", "keys", "reseal"] => Endpoint::Keys,
        ["v1", "consumers"] | ["v1", "consumers", _] => Endpoint::Consumers,
        ["v1", _, _] => Endpoint::Call,
        ["healthz" | "readyz"] => Endpoint::Health,
        ["metrics"] => Endpoint::Metrics,
        ["openapi.json"] => Endpoint::OpenApi,
        [name] if playground::has_file(name) => Endpoint::Playground,
        _ => Endpoint::Other,
    }
}

/// Sends a request to its handler by method and path.
async fn dispatch(
    state: &State,
    request: Request,
    segments: &[&str],
    memo: &Memo,
) -> Result<Response, ApiError> {
    let method = request.method().clone();
    if admission::is_admin_path(segments)
        && let Some(token) = &state.admin
        && !token.admits(request.headers())
    {
        return Err(ApiError::AdminTokenRequired);
    }
    // A node from a routes file (SPEC §2.5) changes nothing through its admin API.
    if state.config.routes_file.is_some()
        && admission::is_admin_path(segments)
        && !matches!(segments, ["metrics"])
        && method != Method::GET
    {
        return Err(ApiError::ReadOnly);
    }
    match (&method, segments) {
        (&Method::POST, ["v1", "preview"]) => preview::preview(state, request).await,
        (_, ["v1", "preview"]) => Err(ApiError::MethodNotAllowed { allow: "POST" }),
        (&Method::POST, ["v1", "mapping"]) => mapping::register(state, request).await,
        (_, ["v1", "mapping"]) => Err(ApiError::MethodNotAllowed { allow: "POST" }),
        (&Method::GET, ["v1", "routes"]) => management::list(state, request.uri().query()).await,
        (_, ["v1", "routes"]) => Err(ApiError::MethodNotAllowed { allow: "GET" }),
        (_, ["v1", "routes", rest]) if rest.ends_with("/cache") => {
            let id = &rest[..rest.len() - "/cache".len()];
            let uuid = Uuid::try_parse(id).map_err(|_| ApiError::NotFound)?;
            match method {
                Method::DELETE => management::purge(state, uuid),
                _ => Err(ApiError::MethodNotAllowed { allow: "DELETE" }),
            }
        }
        (_, ["v1", "routes", rest]) if rest.ends_with("/try") => {
            let id = &rest[..rest.len() - "/try".len()];
            let uuid = Uuid::try_parse(id).map_err(|_| ApiError::NotFound)?;
            match method {
                Method::POST => mapping::try_route(state, request, uuid).await,
                _ => Err(ApiError::MethodNotAllowed { allow: "POST" }),
            }
        }
        (_, ["v1", "routes", rest]) if rest.ends_with("/stats") => {
            let id = &rest[..rest.len() - "/stats".len()];
            let uuid = Uuid::try_parse(id).map_err(|_| ApiError::NotFound)?;
            match method {
                Method::GET => management::stats(state, uuid, request.uri().query()),
                _ => Err(ApiError::MethodNotAllowed { allow: "GET" }),
            }
        }
        (_, ["v1", "routes", id]) => {
            let uuid = Uuid::try_parse(id).map_err(|_| ApiError::NotFound)?;
            match method {
                Method::GET => management::show(state, uuid),
                Method::PUT => mapping::update(state, request, uuid).await,
                Method::DELETE => management::delete(state, uuid, request.headers()).await,
                _ => Err(ApiError::MethodNotAllowed { allow: "GET, PUT, DELETE" }),
            }
        }
        (&Method::GET, ["v1", "keys"]) => keys::status(state).await,
        (_, ["v1", "keys"]) => Err(ApiError::MethodNotAllowed { allow: "GET" }),
        (&Method::POST, ["v1", "keys", "reseal"]) => keys::reseal(state, request.uri().query()).await,
        (_, ["v1", "keys", "reseal"]) => Err(ApiError::MethodNotAllowed { allow: "POST" }),
        (_, ["v1", "consumers"]) | (_, ["v1", "consumers", _]) => {
            consumers::handle(state, request, segments.get(2).copied()).await
        }
        (_, ["v1", id, rest]) => {
            let (parts, body) = request.into_parts();
            let request = call::RouteCall {
                method: &parts.method,
                path: parts.uri.path(),
                query: parts.uri.query(),
                headers: &parts.headers,
                body: Some(body),
                memo: Some(memo),
            };
            Ok(call::call(state, request, id, rest).await)
        }
        (&Method::GET, ["healthz"]) => Ok(json(StatusCode::OK, r#"{"status":"ok"}"#)),
        (&Method::GET, ["readyz"]) => Ok(readiness(state)),
        (_, ["healthz" | "readyz"]) => Err(ApiError::MethodNotAllowed { allow: "GET" }),
        (&Method::GET, ["metrics"]) => Ok(metrics(state)),
        (&Method::GET, ["openapi.json"]) => Ok(json(StatusCode::OK, OPENAPI.as_bytes())),
        (_, ["metrics" | "openapi.json"]) => Err(ApiError::MethodNotAllowed { allow: "GET" }),
        (_, [name]) if playground::has_file(name) => playground::file(&method, name),
        _ => Err(ApiError::NotFound),
    }
}

/// The OpenAPI 3.1 description of this API (`GET /openapi.json`); `tests/it/openapi.rs` sends
/// its examples and checks every answer against it.
pub const OPENAPI: &str = include_str!("../../docs/openapi.json");

/// The `route` label of every route call's answers under `RECAST_METRICS_ROUTE_LABEL=none`.
pub const ALL_ROUTES: &str = "all_routes";

/// `GET /metrics`: the Prometheus text exposition. Routes never called have no series, so a
/// scrape copies out only the counts of routes that were.
fn metrics(state: &State) -> Response {
    let (mut loaded, mut broken) = (0, 0);
    let mut called = Vec::new();
    state.table.for_each(|entry| {
        loaded += 1;
        match entry {
            Entry::Route(route) => {
                broken += usize::from(!route.serves());
                if !route.statuses.is_empty() {
                    called.push((route.uuid, route.statuses.clone()));
                }
            }
            Entry::Locked(_) => broken += 1,
        }
    });
    let gauges = Gauges {
        routes_loaded: loaded,
        routes_broken: broken,
        in_flight: state.in_flight.now(),
        lifecycle: state.lifecycle() as u8,
        store: state.store.health().map(|health| crate::metrics::StoreGauges {
            up: health.up,
            revision: health.revision,
            lag_seconds: health.lag.as_secs_f64(),
            nodes: state.client.nodes(),
        }),
        cache: state.cache.gauges(),
    };
    // Without the uuid label, every route's answers as one route's, however many routes.
    let all = (state.config.metrics_route_label == RouteLabel::None).then(|| {
        let all = crate::metrics::StatusCounts::default();
        called.drain(..).for_each(|(_, counts)| all.merge(&counts));
        all
    });
    let merged = all.as_ref().filter(|all| !all.is_empty()).map(|all| (ALL_ROUTES.to_owned(), all));
    let mut text = state.metrics.render(
        gauges,
        called.iter().map(|(uuid, counts)| (uuid.to_string(), &**counts)).chain(merged),
        crate::metrics::OutboundCounts {
            breakers: &state.client.breakers(),
            retries: &state.client.retries(),
            limits: &state.client.rate_limits(),
            tokens: &state.client.token_fetches(),
            kept: state.client.kept(),
            spans: state.tracer.recorder().map(|recorder| &recorder.counts),
        },
    );
    state.door.render_metrics(&mut text);
    if let Some(tls) = &state.tls {
        tls.render_metrics(&mut text);
    }
    let mut response = http::Response::new(Full::new(Bytes::from(text)));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    response
}

/// `GET /readyz`: 200 while running. In cluster mode the body also says how the node stands with
/// the database, and a node cut off from it for longer than `RECAST_MAX_STALENESS_MS` answers
/// 503 (`"status": "stale"`), so a load balancer can take it out.
fn readiness(state: &State) -> Response {
    let (mut status, mut ready) = match state.lifecycle() {
        Lifecycle::Running => ("running", true),
        Lifecycle::Idle => ("idle", false),
        Lifecycle::Stopped => ("stopped", false),
    };
    let Some(health) = state.store.health() else {
        let code = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
        return json(code, format!(r#"{{"status":"{status}"}}"#));
    };
    let lag = health.lag;
    let stale = state.config.max_staleness_ms.is_some_and(|max| lag > Duration::from_millis(max));
    if ready && stale {
        (status, ready) = ("stale", false);
    }
    let body = format!(
        r#"{{"status":"{status}","store":{{"kind":"postgres","up":{},"revision":{},"syncLagMs":{}}}}}"#,
        health.up,
        health.revision,
        lag.as_millis()
    );
    json(if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, body)
}

/// The client at the other end of a connection: its address, and the connection's memory of its
/// last credential and client certificate.
pub(super) struct Client {
    pub(super) peer: Option<IpAddr>,
    pub(super) memo: Memo,
    /// An HTTP/2 connection's account of its client.
    pub(super) conduct: Option<Arc<Conduct>>,
}

impl Client {
    pub(super) fn new(peer: Option<IpAddr>, memo: Memo) -> Client {
        Client { peer, memo, conduct: None }
    }
}

/// What hyper calls for each request of one connection (HTTP/1.1 after a hand-off, or each
/// HTTP/2 stream): the router's answer, the request counted in flight on the connection's
/// `activity` until its answer is sent, and the connection's memory of its last credential. An
/// HTTP/2 connection already holding more than `RECAST_MAX_RESPONSE_BYTES` of answers its client
/// has not taken answers 503 instead (`conduct.rs`).
pub(super) fn hyper_service(
    state: Arc<State>,
    activity: Arc<Activity>,
    client: Client,
) -> impl hyper::service::Service<
    http::Request<hyper::body::Incoming>,
    Response = http::Response<Sent>,
    Error = std::convert::Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ 'static {
    let Client { peer, memo, conduct } = client;
    let memo = Arc::new(memo);
    hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
        let (state, memo, conduct) = (state.clone(), memo.clone(), conduct.clone());
        let busy = activity.busy();
        let request = request.map(|body| RequestBody::new(body, activity.clone()));
        // Built in its box: a call's future holds kilobytes, which hyper would otherwise copy
        // as it takes the future, wraps it for the stream and spawns it (a copy each); so is
        // the handler's future inside it.
        crate::tasks::boxed(move || async move {
            // Decided before the answer is made: once made (its upstream called), it is sent.
            let held =
                conduct.as_ref().map(|c| c.untaken()).filter(|&held| held > state.config.max_response_bytes);
            let response = match held {
                Some(held) => untaken_answer(&state, request.uri().path(), held),
                None => crate::tasks::boxed(|| handle(&state, request, peer, &memo)).await,
            };
            let (parts, body) = response.into_parts();
            let bytes = body.into_inner().unwrap_or_default();
            // The request's place is let go of with its answer, once sent.
            Ok::<_, std::convert::Infallible>(http::Response::from_parts(
                parts,
                Sent::new(bytes, conduct, busy),
            ))
        })
    })
}

/// 503 for a call on an HTTP/2 connection holding `held` bytes of answers its client has not
/// taken.
fn untaken_answer(state: &State, path: &str, held: usize) -> Response {
    state.metrics.endpoint(endpoint(&segments(path)), 503);
    ApiError::Untaken { held, limit: state.config.max_response_bytes }.to_response(path)
}
