//! `{METHOD} /v1/{uuid}/{path}` (SPEC §2.2): calls a route's upstream and answers with the mapped
//! body; and the mapping of an upstream answer, shared with the registration's live call.

use std::time::{Duration, Instant};

use http::{Method, Request};
use hyper::body::Incoming;
use uuid::Uuid;

use super::problem::UpstreamFailure;
use super::{ApiError, Response, SERVER_TIMING, State, json, read_body, timing};
use crate::route::{CallError, ClientRequest, Route};
use crate::upstream::Answer;
use crate::{exec, json as tape};

pub(super) async fn call(state: &State, request: Request<Incoming>, uuid: Uuid, path: &str) -> Response {
    let instance = request.uri().path().to_owned();
    let mut timings = Timings::default();
    let mut response = match forward(state, request, uuid, path, &mut timings).await {
        Ok(response) => response,
        Err(e) => e.to_response(&instance),
    };
    // Every answer of a route call says how long the upstream and the mapping took (SPEC §2.2),
    // zero for a step that did not happen.
    let header = timing(&[("upstream", timings.upstream), ("map", timings.map)]);
    response.headers_mut().insert(SERVER_TIMING, header);
    response
}

#[derive(Default)]
struct Timings {
    upstream: Duration,
    map: Duration,
}

async fn forward(
    state: &State,
    request: Request<Incoming>,
    uuid: Uuid,
    path: &str,
    timings: &mut Timings,
) -> Result<Response, ApiError> {
    state.loaded()?;
    let route = state.table.get(&uuid).ok_or(ApiError::NotFound)?;
    if path != route.config.path {
        return Err(ApiError::NotFound);
    }
    if let Some(why) = route.broken() {
        return Err(ApiError::RouteUnavailable(why));
    }
    if request.method() != route.method {
        return Err(ApiError::MethodNotAllowed { allow: method_name(&route.method) });
    }
    let (parts, body) = request.into_parts();
    let body = read_body(state, &parts.headers, body).await?;
    let client = ClientRequest { query: parts.uri.query(), headers: Some(&parts.headers), body: body.into() };
    let upstream = route.upstream_request(&client).map_err(|e| match e {
        CallError::AuthRequired => ApiError::AuthRequired,
        CallError::Broken(why) => ApiError::RouteUnavailable(why),
    })?;
    let started = Instant::now();
    let answer = state.client.call(upstream).await;
    timings.upstream = started.elapsed();
    let mut answer = answer.map_err(|e| ApiError::Upstream { failure: e.into(), validating: false })?;
    let started = Instant::now();
    let mapped = map_answer(&route, &mut answer, state.config.max_depth);
    timings.map = started.elapsed();
    let mapped = mapped.map_err(|failure| ApiError::Upstream { failure, validating: false })?;
    Ok(json(answer.status, mapped))
}

/// Maps a 2xx JSON answer by the route's rules; any other answer is a failure. The upstream's
/// body is never passed on.
pub(super) fn map_answer(
    route: &Route,
    answer: &mut Answer,
    max_depth: usize,
) -> Result<Vec<u8>, UpstreamFailure> {
    if !answer.status.is_success() {
        return Err(UpstreamFailure::Status(answer.status));
    }
    let Ok(compiled) = &route.rules else {
        return Err(UpstreamFailure::NotJson("the route's rules do not compile".to_owned()));
    };
    let mut out = Vec::with_capacity(answer.body.len() / 2 + 64);
    tape::with_parsed(&mut answer.body, max_depth, |nodes| exec::execute(&compiled.plan, nodes, 0, &mut out))
        .map_err(|e| UpstreamFailure::NotJson(e.to_string()))?;
    Ok(out)
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
