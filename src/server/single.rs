//! A route's own upstream's call (SPEC §2.2), every call of a route with `originalRoute` and a
//! registration's live call: the request the route built from the caller's, sent with the
//! route's settings, its 2xx JSON answer read for the plan and mapped in one pass
//! (`exec::map_text`), held in `RECAST_MAX_BUFFERED_BYTES`'s count until it is; any other
//! outcome answers as §2.2 says.

use std::time::{Duration, Instant};

use http::StatusCode;

use super::compose::{self, Paged};
use super::map::map_answer;
use super::problem::{ApiError, UpstreamFailure};
use super::state::State;
use crate::callers::Caller;
use crate::route::Route;
use crate::route::paginate::Paging;
use crate::route::settings::CallSettings;
use crate::upstream::{Answer, Freshness, MediaType, UpstreamRequest};

/// A call that mapped.
pub(super) struct Called {
    pub body: Vec<u8>,
    /// The upstream's status (a 2xx).
    pub status: StatusCode,
    /// What the upstream said of caching its answer.
    pub freshness: Freshness,
    /// A registration's live call: the answer as it came, for the trace of its warnings
    /// (mapping may rewrite the text it reads).
    pub document: Option<Vec<u8>>,
    pub map: Duration,
    /// A paged upstream's pages (SPEC §2.3 "Pages").
    pub paged: Option<Paged>,
}

/// Lets go of an answer's bytes in `RECAST_MAX_BUFFERED_BYTES`'s count.
struct Held<'a>(&'a State, usize);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.buffered.release(self.1);
    }
}

/// Sends `request` (the route's own, built by [`Route::upstream_request`]) and maps the answer.
/// `validating`: a registration's live call.
pub(super) async fn run(
    state: &State,
    route: &Route,
    calls: &CallSettings,
    request: UpstreamRequest,
    caller: Option<&Caller>,
    validating: bool,
) -> Result<Called, ApiError> {
    let route_paging = route.single().and_then(|own| own.paging.as_ref());
    if let Some(paging) = route_paging {
        return paged(state, route, paging, calls, &request, caller, validating).await;
    }
    let outbound = calls.outbound(None);
    let started = Instant::now();
    // The exchange's state is large: boxed, this call's future stays small.
    let answer = crate::tasks::boxed(|| state.client.call_with(&request, &outbound)).await;
    state.metrics.upstream.observe(started.elapsed());
    let failed = |failure: UpstreamFailure| {
        state.metrics.upstream_error(failure.kind());
        ApiError::Upstream { failure, validating }
    };
    let mut answer = answer.map_err(|e| failed(UpstreamFailure::from(e)))?;
    if !answer.status.is_success() {
        return Err(failed(UpstreamFailure::Status(answer.status, answer.certificate_asked)));
    }
    state.buffered.add(answer.body.len());
    let _held = Held(state, answer.body.len());
    let document = validating.then(|| answer.body.clone());
    let (mapped, map) = map_answer(state, route, &mut answer, caller);
    // An answer that is not JSON is the upstream's failure: its CLIENT span says so.
    if let (Err(failure @ UpstreamFailure::NotJson(why)), Some(span)) = (&mapped, answer.span.take()) {
        span.fail(failure.kind().label(), why);
    }
    let body = mapped.map_err(|failure| ApiError::Upstream { failure, validating })?;
    Ok(Called { body, status: answer.status, freshness: answer.freshness, document, map, paged: None })
}

/// [`run`] for a route whose upstream pages: its pages joined ([`compose::own_pages`]) are the
/// answer mapped, as one answer's body would be.
async fn paged(
    state: &State,
    route: &Route,
    paging: &Paging,
    calls: &CallSettings,
    request: &UpstreamRequest,
    caller: Option<&Caller>,
    validating: bool,
) -> Result<Called, ApiError> {
    let (status, joined, paged, freshness) =
        crate::tasks::boxed(|| compose::own_pages(state, paging, calls, request, validating)).await?;
    let mut answer = Answer {
        status,
        body: joined,
        freshness,
        retry_after: None,
        certificate_asked: None,
        content_type: MediaType::default(),
        http2: false,
        headers: None,
        span: None,
    };
    state.buffered.add(answer.body.len());
    let _held = Held(state, answer.body.len());
    let document = validating.then(|| answer.body.clone());
    let (mapped, map) = map_answer(state, route, &mut answer, caller);
    let body = mapped.map_err(|failure| ApiError::Upstream { failure, validating })?;
    Ok(Called { body, status, freshness: answer.freshness, document, map, paged: Some(paged) })
}
