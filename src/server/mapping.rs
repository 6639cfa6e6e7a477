//! `POST /v1/mapping` and `PUT /v1/routes/{uuid}` (SPEC §2.1): validate a registration, make one
//! live call exactly as a route call would, and store the route only if that call maps.

use std::sync::Arc;

use http::{HeaderMap, HeaderValue, StatusCode, header};
use uuid::Uuid;

use super::call::{call_upstream, map_answer};
use super::problem::{UpstreamFailure, write_problems};
use super::reply::{json, now_ms, read_body};
use super::{ApiError, Request, Response, State};
use crate::json::{JsonError, write};
use crate::logging::logged;
use crate::metrics::RulesSource;
use crate::route::{CallError, FromClient, MAPPED_AUTH, Registration, Route};
use crate::upstream::UpstreamError;

pub(super) async fn register(state: &State, request: Request) -> Result<Response, ApiError> {
    state.loaded()?;
    let (parts, body) = request.into_parts();
    let body = read_body(state, &parts.headers, body).await?;
    let config = registration(&body)?
        .validate(parts.headers.contains_key(&MAPPED_AUTH), None)
        .map_err(ApiError::InvalidRegistration)?;
    let now = now_ms();
    let mut route = Route::new(Uuid::new_v4(), now, now, config, &state.config.limits());
    let preview = live_call(state, &route, &parts.headers).await?;
    route.revision = state.stored(state.store.create(route.to_stored()).await)?;
    let route = Arc::new(route);
    state.table.apply_shared(route.clone());
    logged!(tracing::Level::INFO, uuid = %route.uuid, path = %route.config.path, "route registered");
    let mut response = registered(StatusCode::CREATED, &route, &preview);
    if let Ok(location) = HeaderValue::try_from(route.public_path()) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

pub(super) async fn update(state: &State, request: Request, uuid: Uuid) -> Result<Response, ApiError> {
    state.loaded()?;
    let existing = state.table.get(&uuid).ok_or(ApiError::NotFound)?;
    let (parts, body) = request.into_parts();
    let body = read_body(state, &parts.headers, body).await?;
    let config = registration(&body)?
        .validate(parts.headers.contains_key(&MAPPED_AUTH), Some(&existing.config.path))
        .map_err(ApiError::InvalidRegistration)?;
    let mut route = Route::new(uuid, existing.created_at, now_ms(), config, &state.config.limits());
    // The route's answer counts go on across the change.
    route.statuses = existing.statuses.clone();
    // Validated like a registration; until it passes, the old route keeps serving.
    let preview = live_call(state, &route, &parts.headers).await?;
    let _writing = state.writes.lock().await;
    if state.table.get(&uuid).is_none() {
        return Err(ApiError::NotFound);
    }
    // In cluster mode the database takes it only if it still holds the version this update began
    // from: two nodes updating at once get one 200 and one 409, never two overwrites.
    route.revision = state.stored(state.store.replace(route.to_stored(), existing.revision).await)?;
    let route = Arc::new(route);
    state.table.apply_shared(route.clone());
    state.cache.drop_route(uuid);
    logged!(tracing::Level::INFO, uuid = %uuid, "route updated");
    Ok(registered(StatusCode::OK, &route, &preview))
}

fn registration(body: &[u8]) -> Result<Registration, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            ApiError::InvalidJson(JsonError::Syntax(e.to_string()))
        } else {
            ApiError::InvalidRequest(format!("the registration is not valid: {e}"))
        }
    })
}

/// Checks that the route compiles and makes its live call; returns the mapped output.
async fn live_call(state: &State, route: &Route, headers: &HeaderMap) -> Result<Vec<u8>, ApiError> {
    if let Err(problems) = &route.rules {
        state.metrics.compile_failure(RulesSource::Registration);
        return Err(ApiError::InvalidRules(problems.clone()));
    }
    let client = FromClient { query: None, headers: Some(headers), body: Default::default() };
    let request = route.upstream_request(&client).map_err(|e| match e {
        CallError::AuthRequired => ApiError::AuthRequired,
        CallError::Broken(why) => ApiError::InvalidRequest(why),
    })?;
    // SPEC §2.1 step 1: the upstream's address against the outbound policy, before any call.
    let failed = |failure| ApiError::Upstream { failure, validating: true };
    if let Err(refused) = state.client.check_policy(&request.uri).await {
        let failure = UpstreamFailure::from(refused);
        state.metrics.upstream_error(failure.kind());
        return Err(failed(failure));
    }
    // The token endpoint of OAuth2 client credentials passes the same policy (a name that does
    // not resolve is left to the live call, which answers that no token came).
    if let Some(token) = route.token_request()
        && let Err(UpstreamError::NotAllowed(refusal)) = state.client.check_policy(token.uri()).await
    {
        let failure = UpstreamFailure::NotAllowed(format!("the token URL: {refusal}"));
        state.metrics.upstream_error(failure.kind());
        return Err(failed(failure));
    }
    let mut answer = call_upstream(state, &request, route).await.0.map_err(failed)?;
    map_answer(state, route, &mut answer).0.map_err(failed)
}

/// The answer to a registration or update: `{"uuid", "path", "method", "preview", "warnings"}`.
fn registered(status: StatusCode, route: &Route, preview: &[u8]) -> Response {
    let mut body = Vec::with_capacity(preview.len() + 256);
    body.extend_from_slice(b"{\"uuid\":");
    write::string(&mut body, &route.uuid.to_string());
    body.extend_from_slice(b",\"path\":");
    write::string(&mut body, &route.public_path());
    body.extend_from_slice(b",\"method\":");
    write::string(&mut body, route.method.as_str());
    body.extend_from_slice(b",\"preview\":");
    body.extend_from_slice(preview);
    body.extend_from_slice(b",\"warnings\":");
    let warnings = route.rules.as_ref().map(|c| c.warnings.as_slice()).unwrap_or_default();
    write_problems(&mut body, warnings);
    if route.revision != 0 {
        // Cluster mode: the revision of the database change that stored it.
        body.extend_from_slice(b",\"revision\":");
        write::u64(&mut body, route.revision);
    }
    body.push(b'}');
    json(status, body)
}
