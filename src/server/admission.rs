//! What a request must pass before it is routed: the admin token on admin endpoints (SPEC §6),
//! and the in-flight limit (`RECAST_MAX_INFLIGHT`, SPEC §5), which health checks are exempt from.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::{HeaderMap, header};
use ring::digest::{SHA256, digest};
use subtle::ConstantTimeEq as _;

use crate::secrets::Secret;

/// The admin token, kept as its SHA-256 digest: comparing digests in constant time tells nothing
/// about the token through timing, its length included.
pub(super) struct AdminToken {
    digest: [u8; 32],
}

impl AdminToken {
    pub(super) fn new(token: &Secret) -> AdminToken {
        // Presented tokens are trimmed, so the configured one is too.
        AdminToken { digest: sha256(token.expose().trim().as_bytes()) }
    }

    /// Whether `headers` carry `Authorization: Bearer <the token>` (scheme in any case).
    pub(super) fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers.get(header::AUTHORIZATION) else { return false };
        let Some((scheme, token)) = value.as_bytes().split_at_checked(6) else { return false };
        if !scheme.eq_ignore_ascii_case(b"bearer") || token.first() != Some(&b' ') {
            return false;
        }
        let token = token.trim_ascii();
        bool::from(sha256(token).ct_eq(&self.digest))
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, bytes).as_ref());
    out
}

/// Whether a path belongs to the admin endpoints. `/metrics` is one: its series name every
/// route's uuid, and a uuid is all it takes to call a route.
pub(super) fn is_admin_path(segments: &[&str]) -> bool {
    matches!(
        segments,
        ["v1", "mapping"]
            | ["v1", "routes"]
            | ["v1", "routes", _]
            | ["v1", "keys"]
            | ["v1", "keys", "reseal"]
            | ["v1", "consumers"]
            | ["v1", "consumers", _]
            | ["metrics"]
    )
}

/// Counts requests in flight; [`InFlight::enter`] refuses above the limit.
pub(super) struct InFlight {
    now: Arc<AtomicUsize>,
    limit: usize,
}

/// Held while a request is served; leaving decrements the count.
pub(super) struct Admitted(Arc<AtomicUsize>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl InFlight {
    pub(super) fn new(limit: usize) -> InFlight {
        InFlight { now: Arc::new(AtomicUsize::new(0)), limit }
    }

    /// Requests in flight now.
    pub(super) fn now(&self) -> usize {
        self.now.load(Ordering::Relaxed)
    }

    /// A place for one more request, or `None` when `limit` are already in flight.
    pub(super) fn enter(&self) -> Option<Admitted> {
        let before = self.now.fetch_add(1, Ordering::AcqRel);
        let admitted = Admitted(self.now.clone());
        (before < self.limit).then_some(admitted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn with_authorization(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn only_the_exact_bearer_token_is_admitted() {
        let token = AdminToken::new(&Secret::new("s3cret-admin"));
        assert!(token.admits(&with_authorization("Bearer s3cret-admin")));
        assert!(token.admits(&with_authorization("bearer s3cret-admin")));
        assert!(token.admits(&with_authorization("BEARER  s3cret-admin ")));
        for wrong in [
            "Bearer s3cret-admi",
            "Bearer s3cret-admin2",
            "Basic s3cret-admin",
            "s3cret-admin",
            "Bearer",
            "Bearers3cret-admin",
            "Bearer ",
        ] {
            assert!(!token.admits(&with_authorization(wrong)), "{wrong}");
        }
        assert!(!token.admits(&HeaderMap::new()));
        let padded = AdminToken::new(&Secret::new(" s3cret-admin\n"));
        assert!(padded.admits(&with_authorization("Bearer s3cret-admin")));
    }

    #[test]
    fn the_in_flight_limit_refuses_above_it_and_frees_on_drop() {
        let limit = InFlight::new(2);
        let first = limit.enter().expect("1 of 2");
        let second = limit.enter().expect("2 of 2");
        assert!(limit.enter().is_none(), "3 of 2");
        drop(first);
        let third = limit.enter().expect("a place was freed");
        assert!(limit.enter().is_none());
        drop((second, third));
        assert_eq!(limit.now.load(Ordering::Acquire), 0, "refusals leave no count behind");
    }

    #[test]
    fn admin_paths_are_mapping_and_routes() {
        assert!(is_admin_path(&["v1", "mapping"]));
        assert!(is_admin_path(&["v1", "routes"]));
        assert!(is_admin_path(&["v1", "routes", "x"]));
        assert!(!is_admin_path(&["v1", "preview"]));
        assert!(!is_admin_path(&["v1", "0b9d6c4e-8f0e-4a51-9d3a-2b7f1c8e5a10", "meals"]));
        assert!(is_admin_path(&["metrics"]));
        assert!(is_admin_path(&["v1", "keys"]));
        assert!(is_admin_path(&["v1", "keys", "reseal"]));
        assert!(!is_admin_path(&["healthz"]));
    }
}

/// The upstream answers all calls hold at once (`RECAST_MAX_BUFFERED_BYTES`): counted from an
/// answer's arrival until its call has answered; while past the bound, new route calls answer
/// 503 at once.
#[derive(Debug)]
pub(crate) struct Buffered {
    held: AtomicUsize,
    max: usize,
}

impl Buffered {
    pub(crate) fn new(max: usize) -> Buffered {
        Buffered { held: AtomicUsize::new(0), max }
    }

    /// Whether the bound is passed: a new call is not taken.
    pub(crate) fn full(&self) -> bool {
        self.held.load(Ordering::Relaxed) > self.max
    }

    pub(crate) fn limit(&self) -> usize {
        self.max
    }

    /// Holds `bytes` more, until the holder, which keeps its own count, calls
    /// [`Buffered::release`].
    pub(crate) fn add(&self, bytes: usize) {
        self.held.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn release(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::Relaxed);
    }
}
