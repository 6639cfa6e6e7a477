//! A route's own upstream's call (SPEC §2.2), every call of a route with `originalRoute` and a
//! registration's live call: the request the route built from the caller's, sent with the
//! route's settings, its 2xx JSON answer read for the plan and mapped in one pass
//! (`exec::map_text`), held in `RECAST_MAX_BUFFERED_BYTES`'s count until it is; any other
//! outcome answers as §2.2 says.

use std::time::{Duration, Instant};

use http::StatusCode;

use super::map::map_answer;
use super::problem::{ApiError, UpstreamFailure};
use super::state::State;
use crate::callers::Caller;
use crate::route::Route;
use crate::route::settings::CallSettings;
use crate::upstream::{Freshness, UpstreamRequest};

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
    Ok(Called { body, status: answer.status, freshness: answer.freshness, document, map })
}
