//! What one composed call shares among its sources: the requests it may still send, the bytes
//! its answers hold, and the requests sent so far (identical ones are sent once).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::Instant;

use crate::route::settings::CallSettings;
use crate::server::problem::UpstreamFailure;
use crate::server::state::State;
use crate::upstream::{Answer, Outbound, UpstreamRequest};

use super::outcome::CallResult;

/// What one call shares among its sources: the requests it may still send and the bytes its
/// answers may still take.
pub(super) struct Shared {
    pub(super) calls_left: AtomicUsize,
    /// The answers' bytes (`RECAST_MAX_COMPOSED_BYTES`).
    pub(super) bytes: AtomicUsize,
    /// What their indexes hold beside them (also in `RECAST_MAX_BUFFERED_BYTES`'s count).
    pub(super) indexes: AtomicUsize,
    /// What the requests its sources rendered hold (also in `RECAST_MAX_BUFFERED_BYTES`'s
    /// count, until the call ends: a `forEach` source's are all rendered before the first is
    /// sent).
    pub(super) requests: AtomicUsize,
    /// What of `bytes` was let go before the call ended (a paged request's pages, once read).
    pub(super) let_go: AtomicUsize,
    pub(super) max_bytes: usize,
    pub(super) max_calls: usize,
    /// The requests sent so far (see [`Shared::once`]): identical ones are sent once and their
    /// answer shared, across sources.
    pub(super) sent: std::sync::Mutex<Vec<Sent>>,
}

/// A request of the call, sent or being sent, and the answer it got or is getting. Two requests
/// are the same when they send the same (method, URL, every header, the body:
/// `UpstreamRequest::same_as`, looked for by `fingerprint`) and add the same credentials and
/// certificate as they are sent (a source's OAuth2 token request and `tls`, by identity: two
/// sources with either never share).
pub(super) struct Sent {
    pub(super) fingerprint: u64,
    pub(super) oauth: usize,
    pub(super) tls: usize,
    pub(super) request: Arc<UpstreamRequest>,
    pub(super) answer: Arc<tokio::sync::OnceCell<CallResult>>,
}

impl Shared {
    /// What one call starts with: `RECAST_MAX_SOURCE_CALLS` requests and
    /// `RECAST_MAX_COMPOSED_BYTES` of answers.
    pub(super) fn new(config: &crate::config::Config) -> Shared {
        Shared {
            calls_left: AtomicUsize::new(config.max_source_calls),
            bytes: AtomicUsize::new(0),
            let_go: AtomicUsize::new(0),
            indexes: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            max_bytes: config.max_composed_bytes,
            max_calls: config.max_source_calls,
            sent: Default::default(),
        }
    }

    /// Counts a rendered request's bytes in the call's and the process's; whether the process's
    /// bound (`RECAST_MAX_BUFFERED_BYTES`) still holds.
    pub(super) fn hold_request(&self, state: &State, request: &UpstreamRequest) -> bool {
        let bytes = request.held_bytes();
        self.requests.fetch_add(bytes, Ordering::Relaxed);
        state.buffered.add(bytes);
        !state.buffered.full()
    }

    /// Takes `n` of the requests left, or says there are not so many.
    pub(super) fn take_calls(&self, n: usize) -> bool {
        self.calls_left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(n)).is_ok()
    }
}

/// Lets go of the bytes a call's answers held in `RECAST_MAX_BUFFERED_BYTES`'s count.
pub(super) struct Release<'a> {
    pub(super) state: &'a State,
    pub(super) shared: &'a Shared,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let held = (self.shared.bytes.load(Ordering::Relaxed))
            .saturating_sub(self.shared.let_go.load(Ordering::Relaxed))
            + self.shared.indexes.load(Ordering::Relaxed)
            + self.shared.requests.load(Ordering::Relaxed);
        self.state.buffered.release(held);
    }
}

/// One request of a source's, or of a route's own paged upstream: its 2xx answer, its body
/// counted in the call's bytes (`RECAST_MAX_COMPOSED_BYTES`) and the process's. `name`: the
/// source's; `keep_headers`: the answer's headers are kept (a page's).
pub(super) async fn answer_of(
    state: &State,
    calls: &CallSettings,
    name: Option<&str>,
    request: &UpstreamRequest,
    shared: &Shared,
    keep_headers: bool,
    deadline: Option<tokio::time::Instant>,
) -> Result<Answer, (Option<u16>, UpstreamFailure)> {
    let fail = |status: Option<u16>, failure: UpstreamFailure| {
        state.metrics.upstream_error(failure.kind());
        Err((status, failure))
    };
    // Nothing more is sent past `RECAST_MAX_BUFFERED_BYTES`.
    if state.buffered.full() {
        return fail(None, UpstreamFailure::Buffered { limit: state.buffered.limit() });
    }
    // `RECAST_MAX_SOURCE_CALLS` and `RECAST_MAX_COMPOSED_BYTES` bound a composition's sources.
    if !shared.take_calls(calls.attempts()) {
        return Err((None, UpstreamFailure::TooManyCalls { limit: shared.max_calls }));
    }
    let outbound = Outbound { keep_headers, deadline, ..calls.outbound(name) };
    let started = Instant::now();
    // The exchange's state is large: boxed, the futures that hold this call (the source's, the
    // element's under `concurrency`) stay small and are not copied whole each time they move.
    let answer = crate::tasks::boxed(|| state.client.call_with(request, &outbound)).await;
    state.metrics.upstream.observe(started.elapsed());
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) => return fail(None, UpstreamFailure::from(e)),
    };
    let status = answer.status.as_u16();
    if !answer.status.is_success() {
        return fail(Some(status), UpstreamFailure::Status(answer.status, answer.certificate_asked));
    }
    let total = shared.bytes.fetch_add(answer.body.len(), Ordering::Relaxed) + answer.body.len();
    state.buffered.add(answer.body.len());
    if total > shared.max_bytes {
        return fail(Some(status), UpstreamFailure::ComposedTooLarge { limit: shared.max_bytes });
    }
    Ok(answer)
}
