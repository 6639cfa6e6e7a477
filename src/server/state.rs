//! What every handler shares: the service's [`State`] (its settings, store, route table,
//! upstream client, cache, limits and tracer), where it is in its life, and what a request and
//! an answer are. It imports no handler.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::Full;

use super::admission::{AdminToken, Buffered, InFlight};
use super::fetched::Outcome;
use super::problem::ApiError;
use crate::cache::AnswerCache;
use crate::config::Config;
use crate::metrics::{Metrics, PanicSite, RulesSource};
use crate::store::{RouteStore, StoreError};
use crate::table::{Entry, RouteTable};
use crate::tasks::Tasks;
use crate::upstream::UpstreamClient;

/// How long compiling what one request sent may take ([`State::compile`]): rules and their
/// patterns, templates, a registration's members. The bounds of each part keep the worst far
/// below it; past it the request is refused.
pub(super) const COMPILE_BUDGET: Duration = Duration::from_secs(2);

/// What every handler answers with.
pub type Response = http::Response<Full<Bytes>>;

/// A request as hyper reads it, its body watched by the connection's driver.
pub(super) type Request = http::Request<super::connection::RequestBody>;

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

/// State shared by every connection.
pub struct State {
    pub(super) config: Config,
    pub(super) lifecycle: AtomicU8,
    pub(super) request_ids: RequestIds,
    /// Where routes are kept: the embedded RocksDB, or the database in cluster mode, chosen at
    /// start; the handlers never ask which.
    pub(super) store: Arc<dyn RouteStore>,
    pub(super) table: RouteTable,
    pub(super) client: UpstreamClient,
    pub(super) admin: Option<AdminToken>,
    pub(super) in_flight: InFlight,
    /// Upstream answers held by calls (`RECAST_MAX_BUFFERED_BYTES`).
    pub(super) buffered: Buffered,
    pub(super) metrics: Arc<Metrics>,
    /// Starts every task the service spawns, behind the panic guard.
    pub(super) tasks: Tasks,
    /// Held while a route is replaced or deleted, so those changes apply one at a time; a re-seal
    /// step hands it to the store, which holds it until the step is written.
    pub(super) writes: Arc<tokio::sync::Mutex<()>>,
    /// Held while this node re-seals the stored routes (`POST /v1/keys/reseal`): one at a time.
    pub(super) resealing: tokio::sync::Mutex<()>,
    /// Mapped answers of routes registered with `cache`, and the upstream calls under way for
    /// them.
    pub(super) cache: Arc<AnswerCache<Outcome>>,
    /// This state itself, for work that outlives the call that starts it (a cache refresh).
    pub(super) me: Weak<State>,
    /// A permit per core: what compiles rules, templates or a registration ([`State::compile`]).
    pub(super) compilers: Arc<tokio::sync::Semaphore>,
    /// How requests are sampled, and where their spans go.
    pub(super) tracer: crate::telemetry::Tracer,
    /// What every route's callers are checked against (SPEC §2.4): consumers and their keys,
    /// issuers' key sets, tokens verified, callers' counts.
    pub(super) door: Arc<crate::callers::Door>,
    /// HTTPS at the listener (SPEC §7), when it is served.
    pub(super) tls: Option<Arc<super::tls::ListenerTls>>,
}

impl State {
    /// Why a route loaded from the store (at start, or from another node) cannot serve calls,
    /// if it cannot: rules that no longer compile (counted), a broken configuration, or a seal
    /// the key ring cannot open.
    pub(super) fn stored_problem(&self, entry: &Entry) -> Option<String> {
        match entry {
            Entry::Route(route) => {
                if route.rules.is_err() {
                    self.metrics.compile_failure(RulesSource::Stored);
                }
                route.broken()
            }
            Entry::Locked(locked) => Some(locked.why.clone()),
        }
    }

    pub fn lifecycle(&self) -> Lifecycle {
        match self.lifecycle.load(Ordering::Acquire) {
            0 => Lifecycle::Idle,
            1 => Lifecycle::Running,
            _ => Lifecycle::Stopped,
        }
    }

    /// Moves from `from` to `to`, only if the state is still `from`.
    pub(super) fn advance(&self, from: Lifecycle, to: Lifecycle) {
        let moved =
            self.lifecycle.compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire);
        if moved.is_ok() {
            tracing::info!(state = ?to, routes = self.table.len(), "lifecycle");
        }
    }

    pub(super) fn enter(&self, next: Lifecycle) {
        self.lifecycle.store(next as u8, Ordering::Release);
        tracing::info!(state = ?next, routes = self.table.len(), "lifecycle");
    }

    /// Route calls and route management wait until the stored routes are loaded.
    pub(super) fn loaded(&self) -> Result<(), ApiError> {
        match self.lifecycle() {
            Lifecycle::Idle => Err(ApiError::Starting),
            _ => Ok(()),
        }
    }

    /// Runs `work`, a compile of what a request sent (rules, templates, a registration), off the
    /// async workers: on the blocking pool, at most one per core at once, and within
    /// [`COMPILE_BUDGET`], waiting for a compiler included. A worker only hands it over and
    /// waits, so that however costly the work, no other request on its thread waits with it.
    /// Work that outlasts the budget is answered then; it keeps its compiler until it ends, so
    /// no more compile at once than there are compilers.
    pub(super) async fn compile<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let deadline = tokio::time::Instant::now() + COMPILE_BUDGET;
        let permit = match tokio::time::timeout_at(deadline, self.compilers.clone().acquire_owned()).await {
            Ok(Ok(permit)) => permit,
            _ => return Err(ApiError::CompilersBusy { budget: COMPILE_BUDGET }),
        };
        let work = move || {
            let _permit = permit;
            work()
        };
        match tokio::time::timeout_at(deadline, self.tasks.blocking(PanicSite::Request, work)).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(_)) => Err(ApiError::Internal),
            Err(_) => Err(ApiError::CompileTooLong { budget: COMPILE_BUDGET }),
        }
    }

    /// The outcome of a store operation, as an answer would say it.
    pub(super) fn stored<T>(&self, result: Result<T, StoreError>) -> Result<T, ApiError> {
        result.map_err(|e| match e {
            StoreError::Unavailable(why) => ApiError::StoreUnavailable(why),
            StoreError::Conflict(why) => ApiError::Conflict(why),
            StoreError::Precondition(why) => ApiError::PreconditionFailed(why),
            StoreError::ResealRefused(why) => ApiError::ResealRefused(why),
            StoreError::NotFound => ApiError::NotFound,
            StoreError::Failed(why) => ApiError::Storage(why),
            StoreError::Panicked(_) => ApiError::Storage("the storage task did not finish".to_owned()),
        })
    }
}

/// Request ids: the client's `X-Request-Id` when it is sane, else a new one made of a random
/// per-process prefix and a counter (unique without a system call per request).
pub(super) struct RequestIds {
    prefix: u32,
    next: AtomicU64,
}

impl RequestIds {
    pub(super) fn new() -> RequestIds {
        let prefix = std::collections::hash_map::RandomState::new().build_hasher().finish() as u32;
        RequestIds { prefix, next: AtomicU64::new(1) }
    }

    pub(super) fn for_headers(&self, headers: &HeaderMap) -> HeaderValue {
        if let Some(given) = headers.get(REQUEST_ID)
            && is_sane_request_id(given.as_bytes())
        {
            return given.clone();
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut id = [0u8; 21];
        crate::hex::write_u64(&mut id[..8], u64::from(self.prefix));
        id[8] = b'-';
        crate::hex::write_u64(&mut id[9..], n);
        HeaderValue::from_bytes(&id).unwrap_or(HeaderValue::from_static("unknown"))
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
    fn generated_request_ids_are_prefix_and_counter_in_hex() {
        let ids = RequestIds { prefix: 0xdead_beef, next: AtomicU64::new(0x1_2345_6789) };
        assert_eq!(ids.for_headers(&HeaderMap::new()), "deadbeef-000123456789");
        assert_eq!(ids.for_headers(&HeaderMap::new()), "deadbeef-00012345678a");
    }

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
}
