//! `{METHOD} /v1/{uuid}/{path}` (SPEC §2.2): calls a route's upstream and answers with the mapped
//! body; and the upstream exchange and mapping that the registration's live call shares.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, Method};
use uuid::Uuid;

use super::connection::RequestBody;
use super::problem::UpstreamFailure;
use super::router::{json, read_body, timing};
use super::{ApiError, Response, SERVER_TIMING, State};
use crate::metrics::{Endpoint, UpstreamErrorKind};
use crate::route::{CallError, FromClient, Route, UpstreamRequest};
use crate::upstream::Answer;
use crate::{exec, json as tape};

/// A route call's request, as the router or the lane read it.
pub(super) struct RouteCall<'a> {
    pub method: &'a Method,
    /// The request's path, for problem details.
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
    /// The body, read only once the route is found and takes the method; `None` when the
    /// request has none.
    pub body: Option<RequestBody>,
}

/// Answers a call of the route `uuid` whose path below `/v1/{uuid}/` is `route_path`.
pub(super) async fn call(state: &State, request: RouteCall<'_>, uuid: &str, route_path: &str) -> Response {
    let instance = request.path;
    let mut tally = Tally::default();
    let mut response = match forward(state, request, uuid, route_path, &mut tally).await {
        Ok(response) => response,
        Err(e) => e.to_response(instance),
    };
    // Every answer of a route call says how long the upstream and the mapping took (SPEC §2.2),
    // zero for a step that did not happen.
    let header = timing(&[("upstream", tally.upstream), ("map", tally.map)]);
    response.headers_mut().insert(SERVER_TIMING, header);
    let status = response.status().as_u16();
    match &tally.route {
        Some(route) => route.statuses.record(status),
        None => state.metrics.endpoint(Endpoint::Call, status),
    }
    response
}

/// What a call did, for its headers and metrics.
#[derive(Default)]
struct Tally {
    /// The route called, once it was found.
    route: Option<Arc<Route>>,
    upstream: Duration,
    map: Duration,
}

async fn forward(
    state: &State,
    request: RouteCall<'_>,
    uuid: &str,
    route_path: &str,
    tally: &mut Tally,
) -> Result<Response, ApiError> {
    let uuid = Uuid::try_parse(uuid).map_err(|_| ApiError::NotFound)?;
    state.loaded()?;
    let route = state.table.get(&uuid).ok_or(ApiError::NotFound)?;
    let route = &*tally.route.insert(route);
    if route_path != route.config.path {
        return Err(ApiError::NotFound);
    }
    if let Some(why) = route.broken() {
        return Err(ApiError::RouteUnavailable(why));
    }
    if *request.method != route.method {
        return Err(ApiError::MethodNotAllowed { allow: method_name(&route.method) });
    }
    let body = match request.body {
        Some(body) => read_body(state, request.headers, body).await?,
        None => Vec::new(),
    };
    let client = FromClient { query: request.query, headers: Some(request.headers), body: body.into() };
    let upstream = route.upstream_request(&client).map_err(|e| match e {
        CallError::AuthRequired => ApiError::AuthRequired,
        CallError::Broken(why) => ApiError::RouteUnavailable(why),
    })?;
    let failed = |failure| ApiError::Upstream { failure, validating: false };
    let (answer, upstream_took) = call_upstream(state, upstream).await;
    tally.upstream = upstream_took;
    let mut answer = answer.map_err(failed)?;
    let (mapped, map_took) = map_answer(state, route, &mut answer);
    tally.map = map_took;
    Ok(json(answer.status, mapped.map_err(failed)?))
}

/// Sends a request upstream and reads the answer; counts the time it took and any failure.
pub(super) async fn call_upstream(
    state: &State,
    request: UpstreamRequest,
) -> (Result<Answer, UpstreamFailure>, Duration) {
    let started = Instant::now();
    let answer = state.client.call(request).await;
    let took = started.elapsed();
    state.metrics.upstream.observe(took);
    let answer = answer.map_err(UpstreamFailure::from);
    if let Err(failure) = &answer {
        state.metrics.upstream_error(failure.kind());
    }
    (answer, took)
}

/// Maps a 2xx JSON answer by the route's rules; any other answer is a failure, counted by kind.
/// The upstream's body is never passed on. Returns the time the mapping took (zero when there
/// was nothing to map).
pub(super) fn map_answer(
    state: &State,
    route: &Route,
    answer: &mut Answer,
) -> (Result<Vec<u8>, UpstreamFailure>, Duration) {
    let (mapped, took) = map_success(route, answer, state.config.max_depth);
    match &mapped {
        Ok(_) => state.metrics.mapping.observe(took),
        Err(failure) => state.metrics.upstream_error(failure.kind()),
    }
    (mapped, took)
}

fn map_success(
    route: &Route,
    answer: &mut Answer,
    max_depth: usize,
) -> (Result<Vec<u8>, UpstreamFailure>, Duration) {
    if !answer.status.is_success() {
        return (Err(UpstreamFailure::Status(answer.status)), Duration::ZERO);
    }
    let Ok(compiled) = &route.rules else {
        return (
            Err(UpstreamFailure::NotJson("the route's rules do not compile".to_owned())),
            Duration::ZERO,
        );
    };
    let started = Instant::now();
    let mut out = Vec::with_capacity(answer.body.len() / 2 + 64);
    let parsed = tape::with_parsed(&mut answer.body, max_depth, |nodes| {
        exec::execute(&compiled.plan, nodes, 0, &mut out)
    });
    let took = started.elapsed();
    (parsed.map(|()| out).map_err(|e| UpstreamFailure::NotJson(e.to_string())), took)
}

impl UpstreamFailure {
    /// The `kind` label of `recast_upstream_errors_total`.
    pub(super) fn kind(&self) -> UpstreamErrorKind {
        match self {
            UpstreamFailure::Status(status) if status.is_client_error() => UpstreamErrorKind::Status4xx,
            UpstreamFailure::Status(status) if status.is_server_error() => UpstreamErrorKind::Status5xx,
            UpstreamFailure::Status(_) => UpstreamErrorKind::StatusOther,
            UpstreamFailure::Unreachable(_) => UpstreamErrorKind::Unreachable,
            UpstreamFailure::Timeout => UpstreamErrorKind::Timeout,
            UpstreamFailure::TooLarge { .. } => UpstreamErrorKind::TooLarge,
            UpstreamFailure::NotJson(_) => UpstreamErrorKind::NotJson,
            UpstreamFailure::Encoding(_) => UpstreamErrorKind::Encoding,
            UpstreamFailure::NotAllowed(_) => UpstreamErrorKind::NotAllowed,
        }
    }
}

/// The name of one of the methods a route may have, for `Allow`.
fn method_name(method: &Method) -> &'static str {
    match *method {
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        _ => "GET",
    }
}
