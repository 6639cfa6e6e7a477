//! What one composed call shares among its sources: the requests it may still send, the bytes
//! its answers hold, and the requests sent so far (identical ones are sent once).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::server::state::State;
use crate::upstream::UpstreamRequest;

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
        let held = self.shared.bytes.load(Ordering::Relaxed)
            + self.shared.indexes.load(Ordering::Relaxed)
            + self.shared.requests.load(Ordering::Relaxed);
        self.state.buffered.release(held);
    }
}
