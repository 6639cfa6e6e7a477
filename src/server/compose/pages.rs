//! A request that follows its upstream's pages (SPEC §2.3 "Pages"), for a source or a route's
//! own upstream: pages fetched one after another, each a call with its retries, each read as it
//! comes (`route::paginate::Paging::read`: its items' elements written onto one list, its next
//! request made) and then let go, so that a call holds the items of the pages so far and one
//! page, not every page's whole answer.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::outcome::Paged;
use super::shared::{Shared, answer_of};
use crate::expr::Budget;
use crate::route::paginate::{After, PageError, Paging};
use crate::route::settings::CallSettings;
use crate::server::problem::UpstreamFailure;
use crate::server::state::State;
use crate::upstream::{Freshness, UpstreamRequest};

/// Pages followed to their end.
pub(in crate::server) struct Pages {
    /// The last page's status.
    pub status: u16,
    /// Every page's items, in page order, as one JSON list.
    pub joined: Vec<u8>,
    pub paged: Paged,
    /// What the pages' headers say of caching them, together.
    pub freshness: Freshness,
}

/// Follows `paging` from `first` (the request's own, page 1), as `name`'s (a source's) calls
/// with `calls`' settings: the pages' items joined, or the failure that ended it with the pages
/// fetched before. `fetched` counts the pages as they come (what a bound that ends the paging
/// from outside still knows); `until` is that bound, each page's call's deadline (its rate
/// limit's waits and its retries are decided by it).
#[allow(clippy::too_many_arguments)]
pub(in crate::server) async fn fetch_pages(
    state: &State,
    paging: &Paging,
    calls: &CallSettings,
    name: Option<&str>,
    first: &UpstreamRequest,
    shared: &Shared,
    fetched: &AtomicUsize,
    until: Option<tokio::time::Instant>,
) -> Result<Pages, (Option<u16>, UpstreamFailure, Paged)> {
    let config = &state.config;
    let mut paged = Paged { pages: 0, stopped: false, paged: true };
    let mut joined = Vec::with_capacity(1024);
    joined.push(b'[');
    let mut count = 0;
    // The URLs asked so far: a request made twice is a loop (method, headers and body are the
    // first request's on every page). A set: an upstream's URLs sharing a long prefix cost one
    // hash each, not a comparison with every earlier one.
    let mut asked: HashSet<String> = HashSet::new();
    let mut next: Option<UpstreamRequest> = None;
    let mut freshness: Option<Freshness> = None;
    // One expression budget for the whole paging, as a mapping has one.
    let budget = Budget::new(config.max_expr_bytes, config.max_mapping_steps);
    let failed = |failure: UpstreamFailure, status: Option<u16>, paged: Paged| {
        if matches!(failure, UpstreamFailure::Paging { .. }) {
            state.metrics.upstream_error(failure.kind());
        }
        Err((status, failure, paged))
    };
    loop {
        let request = next.as_ref().unwrap_or(first);
        let page = paged.pages + 1;
        if !asked.insert(request.uri.to_string()) {
            let why = format!(
                "page {page}'s request is the same as an earlier page's: the upstream's pages loop; nothing more was sent"
            );
            return failed(
                UpstreamFailure::Paging { location: format!("{}/next", paging.at), why },
                None,
                paged,
            );
        }
        let mut answer = match answer_of(state, calls, name, request, shared, paging.headers, until).await {
            Ok(answer) => answer,
            Err((status, failure)) => return Err((status, failure, paged)),
        };
        paged.pages = page;
        fetched.store(page, Ordering::Relaxed);
        let status = answer.status.as_u16();
        let headers = answer.headers.take().unwrap_or_default();
        freshness = Some(freshness.map_or(answer.freshness, |f| f.join(answer.freshness)));
        let held = joined.len();
        let len = answer.body.len();
        let read = paging.read(
            &mut answer.body,
            page,
            &headers,
            &request.uri,
            first,
            config.max_depth,
            &budget,
            &mut joined,
            &mut count,
        );
        // The page's answer goes; the items kept stay counted until the call ends.
        state.buffered.release(len);
        shared.let_go.fetch_add(len, Ordering::Relaxed);
        let kept = joined.len() - held;
        shared.indexes.fetch_add(kept, Ordering::Relaxed);
        state.buffered.add(kept);
        let read = match read {
            Ok(read) => read,
            Err(PageError::NotJson(why)) => {
                let failure = UpstreamFailure::NotJson(why);
                if let Some(span) = answer.span.take() {
                    span.fail(failure.kind().label(), "a page's answer is not JSON");
                }
                state.metrics.upstream_error(failure.kind());
                return Err((Some(status), failure, paged));
            }
            Err(PageError::Expression { location, why }) => {
                return failed(UpstreamFailure::Paging { location, why }, Some(status), paged);
            }
            Err(PageError::OffOrigin { location }) => {
                let why = format!(
                    "page {page}'s next URL leaves the source's origin (its scheme, host and port, with no user:pass@); nothing was sent there"
                );
                return failed(UpstreamFailure::Paging { location, why }, Some(status), paged);
            }
        };
        match read {
            After::Last => {
                joined.push(b']');
                return Ok(Pages { status, joined, paged, freshness: freshness.unwrap_or_default() });
            }
            After::Next(_) if page >= paging.max_pages && paging.stop_at_max => {
                paged.stopped = true;
                joined.push(b']');
                return Ok(Pages { status, joined, paged, freshness: freshness.unwrap_or_default() });
            }
            After::Next(_) if page >= paging.max_pages => {
                let why = format!(
                    "the upstream has more than {} pages (`maxPages`); `\"onMaxPages\": \"stop\"` keeps the pages fetched",
                    paging.max_pages
                );
                return failed(
                    UpstreamFailure::Paging { location: format!("{}/maxPages", paging.at), why },
                    Some(status),
                    paged,
                );
            }
            After::Next(request) => next = Some(*request),
        }
    }
}
