//! `{METHOD} /v1/{uuid}/{path}` (SPEC §2.2, §2.3): finds the route, builds the request its call
//! reads (a route's own upstream's, or what a composed route reads of the caller's), answers
//! from the cache or joins its flight when the route has `cache`, and otherwise calls: a route's
//! own upstream through `single`, a composed route's sources through `compose`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use uuid::Uuid;

use super::compose;
use super::connection::RequestBody;
use super::fetched::{MappedAnswer, Outcome};
use super::problem::{ApiError, UpstreamFailure};
use super::reply::{json, read_body, timing};
use super::single;
use super::state::{Response, SERVER_TIMING, State};
use super::traced::{self, CallFacts};
use crate::cache::{self, CacheStatus, Joined, Key, Leader, Lookup, TimedOut};
use crate::callers::{Caller, Decision, Memo};
use crate::metrics::{CacheCounts, Endpoint, PanicSite};
use crate::route::{CacheSettings, CallError, FromClient, Route};
use crate::table::Entry;
use crate::trace_context::TraceParent;
use crate::upstream::UpstreamRequest;

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
    /// The connection's last credential and what it made.
    pub memo: Option<&'a Memo>,
}

/// Answers a call of the route `uuid` whose path below `/v1/{uuid}/` is `route_path`.
pub(super) async fn call(state: &State, request: RouteCall<'_>, uuid: &str, route_path: &str) -> Response {
    let instance = request.path;
    let mut record = CallRecord::default();
    // The route called, once it was found.
    let mut called = None;
    let mut error = None;
    let mut response = match forward(state, request, uuid, route_path, &mut called, &mut record).await {
        Ok(response) => response,
        Err(e) => {
            error = Some(e.kind());
            e.to_response(instance)
        }
    };
    // Every answer of a route call says how long the upstream and the mapping took (SPEC §2.2),
    // zero for a step that did not happen; one answered from the cache has no upstream step,
    // only the lookup.
    let header = match record.lookup {
        Some(lookup) => timing(&[("cache", lookup)]),
        // A composed route: an entry per source (`src.<name>`), then the mapping.
        None if !record.sources.is_empty() => {
            let mut entries: Vec<(&str, Duration)> =
                record.sources.iter().map(|(name, took)| (name.as_str(), *took)).collect();
            entries.push(("map", record.map));
            timing(&entries)
        }
        None => timing(&[("upstream", record.upstream), ("map", record.map)]),
    };
    response.headers_mut().insert(SERVER_TIMING, header);
    if let Some(status) = record.cache {
        response.headers_mut().insert(CACHE_STATUS, status.header());
    }
    let status = response.status().as_u16();
    match &called {
        Some(route) => {
            route.statuses.record(status);
            route.stats.record(error, record.latency());
        }
        None => state.metrics.endpoint(Endpoint::Call, status),
    }
    if let Some(route) = &called {
        traced::note_call(CallFacts {
            route: route.uuid,
            cache: record.cache.map(CacheStatus::label),
            link: record.link,
            caller: record.caller.take(),
        });
    }
    response
}

/// Whether the path a call came with is the route's: as registered, or percent-encoded (clients
/// made from an OpenAPI description send `shop%2Forders%2F1042` for `shop/orders/1042`).
fn same_path(called: &str, registered: &str) -> bool {
    called == registered
        || called.contains('%')
            && percent_encoding::percent_decode_str(called)
                .decode_utf8()
                .is_ok_and(|decoded| decoded == registered)
}

/// What a call did, for its headers and metrics.
#[derive(Default)]
struct CallRecord {
    upstream: Duration,
    map: Duration,
    /// Answered from the cache: how long the lookup took.
    lookup: Option<Duration>,
    /// What the cache did, for a route with `cache`.
    cache: Option<CacheStatus>,
    /// A composed route's sources: `src.<name>` and how long each took.
    sources: Vec<(String, Duration)>,
    /// The span of the call that went upstream for this one (a coalesced miss).
    link: Option<TraceParent>,
    /// Who called, on a route with `callers`.
    caller: Option<Arc<Caller>>,
}

impl CallRecord {
    /// How long the call's steps took: the cache lookup of an answer from the cache, else the
    /// upstream calls and the mapping; `None` for a call refused before either.
    fn latency(&self) -> Option<Duration> {
        match self.lookup {
            Some(lookup) => Some(lookup),
            None => Some(self.upstream + self.map).filter(|took| !took.is_zero()),
        }
    }
}

/// RFC 9211.
const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

async fn forward(
    state: &State,
    request: RouteCall<'_>,
    uuid: &str,
    route_path: &str,
    called: &mut Option<Arc<Route>>,
    record: &mut CallRecord,
) -> Result<Response, ApiError> {
    let uuid = Uuid::try_parse(uuid).map_err(|_| ApiError::NotFound)?;
    state.loaded()?;
    let route = match state.table.get(&uuid).ok_or(ApiError::NotFound)? {
        Entry::Route(route) => route,
        // A route the key ring cannot open has no known path: any path under its uuid is told why.
        Entry::Locked(locked) => return Err(ApiError::RouteUnavailable(locked.why.clone())),
    };
    let route = &*called.insert(route);
    if !same_path(route_path, &route.config.path) {
        return Err(ApiError::NotFound);
    }
    if let Some(why) = route.broken() {
        return Err(ApiError::RouteUnavailable(why));
    }
    if *request.method != route.method {
        return Err(ApiError::MethodNotAllowed { allow: method_name(&route.method) });
    }
    // Who calls (SPEC §2.4): before the cache, the body and any upstream call.
    let caller = match route.gate() {
        None => None,
        Some(gate) => {
            let (headers, query, nodes, memo) =
                (request.headers, request.query, state.client.nodes(), request.memo);
            Some(match state.door.admit_now(gate, headers, query, nodes, memo) {
                Decision::Admitted(caller) => caller,
                Decision::Refused(refusal) => return Err(ApiError::Caller(refusal)),
                // A token to verify first, its key set perhaps to fetch: boxed, so that a call
                // that never waits does not carry that future in its own.
                Decision::Wait => Box::pin(state.door.admit_waiting(gate, headers, nodes, memo))
                    .await
                    .map_err(ApiError::Caller)?,
            })
        }
    };
    record.caller.clone_from(&caller);
    // The upstream answers calls hold (RECAST_MAX_BUFFERED_BYTES): past the bound, no new call.
    if state.buffered.full() {
        return Err(ApiError::Buffered { limit: state.buffered.limit() });
    }
    let body = match request.body {
        Some(body) => read_body(state, request.headers, body).await?,
        None => Vec::new(),
    };
    let upstream = match route.composition() {
        // What the call reads of the caller's request, as the request a cache key is made of.
        Some(composition) => {
            compose::caller_request(composition, request.query, request.headers, body.into())?
        }
        None => {
            let client = FromClient {
                query: request.query,
                headers: Some(request.headers),
                body: body.into(),
                caller: route.caller_value(caller.as_deref()),
            };
            route.upstream_request(&client).map_err(|e| match e {
                CallError::AuthRequired => ApiError::AuthRequired,
                CallError::Broken(why) => ApiError::RouteUnavailable(why),
                CallError::Template { location, why } => ApiError::Template { location, why, caller: true },
            })?
        }
    };
    if let Some(settings) = route.config.cache {
        if state.cache.enabled() {
            return cached(state, route, settings, upstream, caller, record).await;
        }
        record.cache = Some(CacheStatus::Off);
    }
    let outcome = fetch(state, route, upstream, caller).await;
    answer(outcome, record)
}

/// The optional sources of a composed call that failed (SPEC §2.3).
pub(super) const RECAST_PARTIAL: HeaderName = HeaderName::from_static("recast-partial");

/// A call of a route with a cache: from a fresh entry; from a stale one while one refresh runs;
/// else from one upstream call shared with every concurrent call of the same key.
async fn cached(
    state: &State,
    route: &Arc<Route>,
    settings: CacheSettings,
    upstream: UpstreamRequest,
    caller: Option<Arc<Caller>>,
    record: &mut CallRecord,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    // A route that reads `$caller` keeps each caller's answers apart (SPEC §2.4).
    let identity = caller.as_ref().filter(|_| route.reads_caller()).map(|c| &c.identity);
    let key = Key::for_caller(route, &upstream, identity);
    // A waiter waits no longer than its own upstream call could have taken, and its mapping.
    let deadline = tokio::time::Instant::now() + state.client.settings().total_timeout + MAPPING_TIME;
    let counts = &state.metrics.cache;
    let (entry, fresh) = match state.cache.find(&key) {
        Lookup::Fresh(entry) => {
            CacheCounts::count(&counts.hits);
            (entry, true)
        }
        Lookup::Stale(entry) => {
            CacheCounts::count(&counts.stale);
            if let Joined::Leader(leader) = state.cache.join(&key) {
                refresh(state, route, settings, upstream, caller.clone(), leader);
            }
            (entry, false)
        }
        Lookup::Nothing => {
            let (waiter, collapsed) = match state.cache.join(&key) {
                Joined::Leader(leader) => {
                    CacheCounts::count(&counts.misses);
                    // The upstream call is the flight's, not this call's: it runs in a task of
                    // its own, and this call waits for its outcome like the others, so that a
                    // caller who hangs up cancels nothing (the calls waiting would otherwise send
                    // the request again, a second `POST` behind a `GET` route).
                    let waiter = leader.waiter();
                    fly(state, route, settings, upstream.clone(), caller.clone(), leader);
                    (waiter, false)
                }
                Joined::Waiter(waiter) => {
                    CacheCounts::count(&counts.coalesced);
                    (waiter, true)
                }
            };
            return match waiter.wait(deadline).await {
                Ok(Some(outcome))
                    if collapsed && outcome.mapped.as_ref().is_ok_and(|m| m.freshness.no_store) =>
                {
                    // The upstream said this answer is not to be reused: this call makes its
                    // own.
                    let outcome = fetch(state, route, upstream, caller).await;
                    record.cache = Some(miss(&outcome, false));
                    answer(outcome, record)
                }
                Ok(Some(outcome)) => {
                    record.cache = Some(miss(&outcome, collapsed));
                    if collapsed {
                        record.link = outcome.traced;
                    }
                    answer(outcome, record)
                }
                // The flight's task ended without an outcome: it panicked (counted and logged),
                // and a panic answers 500 as it would have in this call's own task. (Leading
                // again would send the request again, as often as it panics.)
                Ok(None) => {
                    record.cache = Some(CacheStatus::Miss { stored: None, collapsed });
                    Err(ApiError::Internal)
                }
                Err(TimedOut) => {
                    record.cache = Some(CacheStatus::Miss { stored: None, collapsed });
                    Err(ApiError::Upstream { failure: UpstreamFailure::Timeout, validating: false })
                }
            };
        }
    };
    let now = tokio::time::Instant::now();
    record.lookup = Some(started.elapsed());
    let ttl = entry.ttl(now);
    record.cache = Some(if fresh { CacheStatus::Hit { ttl } } else { CacheStatus::Stale { ttl } });
    let mut response = json(entry.status, entry.body.clone());
    response.headers_mut().insert(http::header::AGE, HeaderValue::from(entry.age(now)));
    Ok(response)
}

/// What a call waiting on a flight allows beyond the upstream call's own timeout: the mapping of
/// its answer, bounded by `RECAST_MAX_MAPPING_STEPS` to tens of milliseconds.
const MAPPING_TIME: Duration = Duration::from_secs(1);

/// A leader's outcome: kept when the route and the upstream allow, then handed to the calls
/// waiting on its flight. Returns it with `stored` filled in.
fn lead(leader: Leader<Outcome>, mut outcome: Outcome, settings: CacheSettings) -> Outcome {
    // A partial answer (an optional source failed) is never kept.
    if let Ok(mapped) = &mut outcome.mapped
        && mapped.partial.is_none()
    {
        let offered =
            cache::Mapped { status: mapped.status, body: &mapped.body, freshness: &mapped.freshness };
        mapped.stored = leader.store(offered, settings);
    }
    leader.share(outcome.clone());
    outcome
}

/// Refreshes a stale entry in the background: the call that found it has its answer already.
fn refresh(
    state: &State,
    route: &Arc<Route>,
    settings: CacheSettings,
    request: UpstreamRequest,
    caller: Option<Arc<Caller>>,
    leader: Leader<Outcome>,
) {
    fly_at(PanicSite::Refresh, state, route, settings, request, caller, leader);
}

/// Makes a flight's upstream call in a task of its own, which hands its outcome to the calls
/// waiting on it whether or not they are still there.
fn fly(
    state: &State,
    route: &Arc<Route>,
    settings: CacheSettings,
    request: UpstreamRequest,
    caller: Option<Arc<Caller>>,
    leader: Leader<Outcome>,
) {
    fly_at(PanicSite::Flight, state, route, settings, request, caller, leader);
}

fn fly_at(
    site: PanicSite,
    state: &State,
    route: &Arc<Route>,
    settings: CacheSettings,
    request: UpstreamRequest,
    caller: Option<Arc<Caller>>,
    leader: Leader<Outcome>,
) {
    let (Some(state), route) = (state.me.upgrade(), route.clone()) else { return };
    // A panic drops the leader, which hands nothing on: its waiters answer 500. A miss's flight
    // that every caller waiting for has left is called off: the calls admitted bound the work
    // under way (`RECAST_MAX_INFLIGHT`), and no one would take its answer. A refresh has no
    // caller waiting and runs to its end.
    let may_be_orphaned = site == PanicSite::Flight;
    // The flight's upstream calls are children of the span of the call that started it; the
    // calls that wait for it link to that span.
    let scope = crate::telemetry::current();
    let traced = scope.as_ref().map(|scope| scope.span);
    state.tasks.clone().spawn(
        site,
        crate::telemetry::maybe_within(scope, async move {
            let fetched = tokio::select! {
                outcome = fetch(&state, &route, request, caller) => Some(outcome),
                () = leader.unwaited(), if may_be_orphaned => None,
            };
            if let Some(mut outcome) = fetched {
                outcome.traced = traced;
                lead(leader, outcome, settings);
            }
        }),
    );
}

/// The `Cache-Status` of a call that went upstream (or waited for the call that did).
fn miss(outcome: &Outcome, collapsed: bool) -> CacheStatus {
    let stored = outcome.mapped.as_ref().ok().and_then(|mapped| mapped.stored);
    CacheStatus::Miss { stored, collapsed }
}

/// A call's upstream calls and the mapping of their answers: a route's own upstream
/// (`single`), or a composed route's sources (`compose`).
async fn fetch(
    state: &State,
    route: &Route,
    request: UpstreamRequest,
    caller: Option<Arc<Caller>>,
) -> Outcome {
    let started = Instant::now();
    let caller = caller.as_deref();
    if let Some(own) = route.single() {
        return match single::run(state, route, &own.calls, request, caller, false).await {
            Ok(called) => Outcome {
                upstream: started.elapsed().saturating_sub(called.map),
                map: called.map,
                // A paged upstream's entry says its pages: `upstream;desc="pages=3";dur=…`.
                sources: called
                    .paged
                    .map(|paged| {
                        let name = format!("upstream;desc=\"pages={}\"", paged.pages);
                        (name, started.elapsed().saturating_sub(called.map))
                    })
                    .into_iter()
                    .collect(),
                traced: None,
                mapped: Ok(MappedAnswer {
                    status: called.status,
                    body: called.body.into(),
                    freshness: called.freshness,
                    stored: None,
                    // `"onMaxPages": "stop"` kept the pages fetched, and says so.
                    partial: called.paged.filter(|paged| paged.stopped).and_then(|paged| {
                        compose::partial_header(&[format!(
                            "originalRoute;status=max-pages;pages={}",
                            paged.pages
                        )])
                    }),
                }),
            },
            Err(error) => Outcome {
                mapped: Err(error),
                upstream: started.elapsed(),
                map: Duration::ZERO,
                sources: Vec::new(),
                traced: None,
            },
        };
    }
    let Some(composition) = route.composition() else {
        let why = route.broken().unwrap_or_default();
        return Outcome {
            mapped: Err(ApiError::RouteUnavailable(why)),
            upstream: Duration::ZERO,
            map: Duration::ZERO,
            sources: Vec::new(),
            traced: None,
        };
    };
    match compose::run(state, route, composition, request, caller, compose::Purpose::Call).await {
        Ok(composed) => Outcome {
            upstream: started.elapsed().saturating_sub(composed.map),
            map: composed.map,
            sources: composed.reports.iter().map(|r| (compose::timing_name(r), r.took)).collect(),
            traced: None,
            mapped: Ok(MappedAnswer {
                status: http::StatusCode::OK,
                body: composed.body.into(),
                freshness: crate::upstream::Freshness::default(),
                stored: None,
                partial: compose::partial_header(&composed.partial),
            }),
        },
        Err(failed) => Outcome {
            mapped: Err(failed.error),
            upstream: started.elapsed(),
            map: Duration::ZERO,
            // A composed route's sources that were done.
            sources: failed.sources,
            traced: None,
        },
    }
}

/// The answer to a call from an upstream call's outcome.
fn answer(outcome: Outcome, record: &mut CallRecord) -> Result<Response, ApiError> {
    record.upstream = outcome.upstream;
    record.map = outcome.map;
    record.sources = outcome.sources;
    match outcome.mapped {
        Ok(mapped) => {
            let mut response = json(mapped.status, mapped.body);
            if let Some(partial) = mapped.partial {
                response.headers_mut().insert(RECAST_PARTIAL, partial);
            }
            Ok(response)
        }
        Err(error) => Err(error),
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

#[cfg(test)]
mod tests {
    use super::same_path;

    #[test]
    fn a_path_matches_as_registered_or_percent_encoded() {
        assert!(same_path("shop/orders/1042", "shop/orders/1042"));
        assert!(same_path("shop%2Forders%2F1042", "shop/orders/1042"));
        assert!(same_path("shop%2forders/1042", "shop/orders/1042"));
        assert!(same_path("caf%C3%A9", "café"));
        assert!(!same_path("shop%2Forders", "shop/orders/1042"));
        assert!(!same_path("shop%2", "shop/orders"));
        // A registered path with a `%` of its own is matched as written.
        assert!(same_path("100%25", "100%25"));
        assert!(!same_path("%FF", "\u{FFFD}"));
    }
}
