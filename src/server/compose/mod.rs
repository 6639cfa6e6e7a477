//! A composed route's call (SPEC §2.3): its sources run as their waits allow (each source's
//! request made from the answers it waits for and the caller's request: [`calls`]), each answer
//! checked and indexed once as it comes, identical requests sent once ([`shared`]), and the
//! route's plan maps the document of them all, read where each answer lies for what the plan
//! reads, never written into one text ([`document`]). What each source did ([`outcome`]) makes
//! `_sources`, `Recast-Partial` and `Server-Timing`. A route's own upstream is called by
//! `server::single`, not here.
//!
//! The call is one task: the sources under way are futures it polls, so a required failure or
//! the deadline drops them, which closes their connections (or resets their streams); nothing
//! not yet started is started after that.

mod calls;
mod document;
mod outcome;
mod pages;
mod request;
mod shared;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use futures_util::stream::{FuturesUnordered, StreamExt};
use http::HeaderValue;

use self::calls::{Prepared, Rendering, prepare, run_source};
use self::document::with_document;
pub(in crate::server) use self::outcome::Paged;
use self::outcome::{Done, Failure};
pub(in crate::server) use self::request::caller_request;
use self::request::{CallerRequest, request_document};
use self::shared::{Release, Shared};
use crate::callers::Caller;
use crate::exec;
use crate::expr::Budget;
use crate::route::composition::Composition;
use crate::route::render::CallerParts;
use crate::route::{MAPPED_AUTH, Route};
use crate::server::problem::{ApiError, UpstreamFailure};
use crate::server::state::State;
use crate::upstream::UpstreamRequest;

/// A call that mapped: its answer, and what each source did.
pub(in crate::server) struct Composed {
    pub body: Vec<u8>,
    /// `Recast-Partial`'s entries: the optional sources that failed.
    pub partial: Vec<String>,
    /// By source, in name order.
    pub reports: Vec<Report>,
    pub map: Duration,
    /// A registration's live call: the warnings of its trace (SPEC §1.8), located in the rules.
    pub warnings: Vec<crate::rules::Problem>,
    /// A *Try it* ([`Purpose::Try`]): the document the rules mapped, written out, which a
    /// preview of the rules can be made on.
    pub document: Option<Vec<u8>>,
}

/// What one source did, for `Server-Timing` and a registration's answer.
pub(in crate::server) struct Report {
    pub name: String,
    /// Its upstream's status (the last element's for `forEach`), when it answered.
    pub status: Option<u16>,
    pub took: Duration,
    pub calls: usize,
    /// Why an optional source failed, when it did (a registration's warnings).
    pub failed: Option<String>,
    /// A `forEach` source whose value was not a list: that value's type (a registration's
    /// warnings).
    pub not_a_list: Option<&'static str>,
    /// A paged source's pages fetched (every element's, for `forEach`).
    pub pages: Option<usize>,
}

/// A route's own paged upstream (`originalRoute.paginate`, SPEC §2.3 "Pages"): its pages
/// followed from `request` under the bounds of a composed call (`RECAST_MAX_SOURCE_CALLS`,
/// `RECAST_MAX_COMPOSED_BYTES`), their items joined into one list, the body the route maps.
pub(in crate::server) async fn own_pages(
    state: &State,
    paging: &crate::route::paginate::Paging,
    calls: &crate::route::settings::CallSettings,
    request: &UpstreamRequest,
    validating: bool,
) -> Result<(http::StatusCode, Vec<u8>, Paged, crate::upstream::Freshness), ApiError> {
    let config = &state.config;
    let shared = Shared::new(config);
    let _held = Release { state, shared: &shared };
    // Its pages are many calls, each with the client's deadline from its own start: the call's
    // deadline holds them all.
    let until = tokio::time::Instant::now() + state.client.settings().total_timeout;
    let counted = AtomicUsize::new(0);
    let fetched = tokio::time::timeout_at(
        until,
        pages::fetch_pages(state, paging, calls, None, request, &shared, &counted, Some(until)),
    );
    let Ok(fetched) = fetched.await else {
        state.metrics.upstream_error(UpstreamFailure::Timeout.kind());
        return Err(ApiError::Upstream { failure: UpstreamFailure::Timeout, validating });
    };
    match fetched {
        Ok(pages) => {
            let status = http::StatusCode::from_u16(pages.status).unwrap_or(http::StatusCode::OK);
            Ok((status, pages.joined, pages.paged, pages.freshness))
        }
        Err((_, failure, _)) => Err(ApiError::Upstream { failure, validating }),
    }
}

/// A source's `Server-Timing` entry's name: `src.<name>`, with a paged source's pages
/// (`src.orders;desc="pages=3"`).
pub(in crate::server) fn timing_name(report: &Report) -> String {
    match report.pages {
        Some(pages) => format!("src.{};desc=\"pages={pages}\"", report.name),
        None => format!("src.{}", report.name),
    }
}

/// How long after the deadline the sources still out are given up (they end at the deadline
/// by themselves, with what they have).
const DEADLINE_SLACK: Duration = Duration::from_millis(20);

/// A composed call that failed: its problem, and how long the sources that were done took
/// (`src.<name>`, for `Server-Timing`).
pub(in crate::server) struct Failed {
    pub error: ApiError,
    pub sources: Vec<(String, Duration)>,
}

/// Runs a call of the composed `route` (its `composition`) and maps the document. `request` is
/// what the call reads of the caller's request, as its cache key is made of it
/// ([`caller_request`]). A required failure answers as SPEC §2.3 says, as `purpose` has it.
pub(in crate::server) async fn run(
    state: &State,
    route: &Route,
    composition: &Composition,
    request: UpstreamRequest,
    caller: Option<&Caller>,
    purpose: Purpose,
) -> Result<Composed, Failed> {
    let mut sources = Vec::new();
    run_timed(state, route, composition, request, caller, purpose, &mut sources)
        .await
        .map_err(|error| Failed { error, sources })
}

/// Why a composed route's sources are called.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(in crate::server) enum Purpose {
    /// A call of the route.
    Call,
    /// An admin's live call (a registration's, an update's): the whole document read and traced
    /// for its warnings, a template's missing member told.
    Validate,
    /// A *Try it*: validated, and the document the rules mapped kept, to be shown.
    Try,
}

async fn run_timed(
    state: &State,
    route: &Route,
    composition: &Composition,
    request: UpstreamRequest,
    who: Option<&Caller>,
    purpose: Purpose,
    timings: &mut Vec<(String, Duration)>,
) -> Result<Composed, ApiError> {
    let who = route.caller_value(who);
    let validating = purpose != Purpose::Call;
    let caller = CallerRequest::of(&request);
    let mapped_auth = caller.headers.get(&MAPPED_AUTH);
    if composition.runtime_auth && mapped_auth.is_none() {
        return Err(ApiError::AuthRequired);
    }
    let Ok(compiled) = &route.rules else {
        return Err(ApiError::RouteUnavailable("its rules do not compile".to_owned()));
    };
    let config = &state.config;
    // A registration's live call reads the document whole: its trace suggests the names the
    // rules may have meant from the members they do not read.
    let wants = if validating { None } else { compiled.plan.wants.as_ref() };
    // Indexed once, read by every context and the document; not made when none reads it.
    state.metrics.composed.calls.fetch_add(1, Ordering::Relaxed);
    let read = composition.reads_request || wants.is_none_or(|w| w.reads_member("request"));
    let request_text = request_document(composition, &caller, read, config.max_depth)?;
    let shared = Shared::new(config);
    // The answers this call holds (RECAST_MAX_BUFFERED_BYTES) are let go when it returns.
    let _held = Release { state, shared: &shared };
    let parts = CallerParts { mapped_auth, ..CallerParts::default() };
    let budget = Budget::new(config.max_expr_bytes, config.max_mapping_steps);
    let sources = &composition.sources;
    let n = sources.len();
    let mut done: Vec<Option<Done>> = vec![None; n];
    // The sources started, and those whose failure `recast_source_failures_total` counted, by
    // bit.
    let (mut started, mut counted) = (Sources::default(), Sources::default());
    // The sources under way: a call of one source polls it alone; of more, as a set. (Boxed,
    // a source's call does not make this call's own state as large as its own.)
    let mut alone = None;
    let mut running = None;
    let deadline = tokio::time::Instant::now() + state.client.settings().total_timeout;
    // Every source's calls end at the deadline by themselves; this is what is left after it.
    // A source alone starts at once, and its calls end by the deadline.
    let mut given_up = (n > 1).then(|| Box::pin(tokio::time::sleep_until(deadline + DEADLINE_SLACK)));
    loop {
        // A required failure that just came starts nothing more.
        if let Some(error) = settle(state, composition, &done, &mut counted, validating) {
            return Err(error);
        }
        // Start what no longer waits; a source done at once may free others.
        let mut progressed = true;
        while progressed {
            progressed = false;
            for i in 0..n {
                if started.has(i) || !sources[i].after.iter().all(|&j| done[j].is_some()) {
                    continue;
                }
                started.add(i);
                let prepared = prepare(
                    state,
                    composition,
                    i,
                    &done,
                    &Rendering {
                        request_text: request_text.as_deref(),
                        shared: &shared,
                        caller: &parts,
                        identity: who,
                        budget: &budget,
                        validating,
                    },
                );
                match prepared {
                    Prepared::Done(outcome) => {
                        done[i] = Some(outcome);
                        progressed = true;
                    }
                    Prepared::Calls { requests, list } => {
                        let source = &sources[i];
                        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
                        let until = tokio::time::Instant::now()
                            + source.timeout.map_or(remaining, |t| t.min(remaining));
                        let shared = &shared;
                        // Not an `async` block that awaits it: that would copy the source's future
                        // into its own.
                        let call = move || {
                            run_source(state, source, requests, list, n == 1, shared, until)
                                .map(move |done| (i, done))
                        };
                        if n == 1 {
                            alone = Some(crate::tasks::boxed(call));
                        } else {
                            running.get_or_insert_with(FuturesUnordered::new).push(call());
                        }
                    }
                }
            }
        }
        // A required source that failed ends the call: what is under way is dropped here.
        if let Some(error) = settle(state, composition, &done, &mut counted, validating) {
            return Err(error);
        }
        if done.iter().all(Option::is_some) {
            break;
        }
        if alone.is_none() && running.as_ref().is_none_or(FuturesUnordered::is_empty) {
            // Nothing runs and something waits: it waits for a source that never started,
            // which the graph's check rules out.
            return Err(ApiError::RouteUnavailable("its sources wait for each other".to_owned()));
        }
        tokio::select! {
            biased;
            Some((i, outcome)) = next_done(&mut alone, &mut running) => {
                timings.push((format!("src.{}", sources[i].name), outcome.took));
                done[i] = Some(outcome);
            }
            () = expiry(&mut given_up) => {
                // Every required source answered: optional ones still out are `null`.
                if let Some(i) = (0..n).find(|&i| done[i].is_none() && !sources[i].optional) {
                    let failure = Failure::Upstream(UpstreamFailure::Timeout);
                    return Err(failure.to_error(&sources[i], None, validating));
                }
                for slot in done.iter_mut().filter(|d| d.is_none()) {
                    // Optional: a source of a composed route.
                    let failure = Failure::Upstream(UpstreamFailure::Timeout);
                    state.metrics.composed.failed(failure.kind(), true);
                    *slot = Some(Done::failed(failure));
                }
                break;
            }
        }
    }
    drop(running);
    let done: Vec<Done> = done.into_iter().map(|d| d.unwrap_or_else(Done::skipped)).collect();
    let mut partial = Vec::new();
    let mut reports = Vec::with_capacity(n);
    for &i in &composition.by_name {
        let (source, outcome) = (&sources[i], &done[i]);
        let failed = match (&outcome.failure, outcome.failed_elements) {
            (Some(failure), _) => Some(format!("{};status={}", source.name, failure.partial_status())),
            (None, 0) => None,
            (None, count) => {
                // The first element that failed: the kind of its failure, or its status.
                let status = outcome.ended.iter().find(|e| e.outcome != "ok").map_or_else(
                    || "failed".to_owned(),
                    |e| match (e.kind, e.status) {
                        (Some(kind), _) => kind.to_owned(),
                        (None, Some(status)) => status.to_string(),
                        (None, None) => e.outcome.to_owned(),
                    },
                );
                Some(format!("{};status={status};failed={count}", source.name))
            }
        };
        // The pages its requests fetched (a request sent for several elements counted once).
        let pages = source.paging.as_ref().map(|_| outcome.pages);
        // `"onMaxPages": "stop"` kept what it fetched, and says so: in the entry of its failed
        // elements if it has one (`;stopped=<n>`), else in one of its own.
        match (&failed, outcome.stopped) {
            (Some(entry), 0) => partial.push(entry.clone()),
            (Some(entry), stopped) => partial.push(format!("{entry};stopped={stopped}")),
            (None, 0) => {}
            (None, stopped) => {
                let mut entry = format!("{};status=max-pages;pages={}", source.name, outcome.pages);
                if outcome.list {
                    entry.push_str(&format!(";stopped={stopped}"));
                }
                partial.push(entry);
            }
        }
        reports.push(Report {
            name: source.name.clone(),
            status: outcome.ended.iter().rev().find_map(|e| e.status),
            took: outcome.took,
            calls: outcome.calls,
            failed,
            not_a_list: outcome.not_a_list,
            pages,
        });
    }
    let span = state.tracer.child(crate::telemetry::Kind::Internal, "map");
    let started = Instant::now();
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    let mut wrote = true;
    let mut document = None;
    let ran = with_document(composition, request_text.as_deref(), &done, wants, config.max_depth, |doc| {
        if !validating {
            return exec::execute_as(&compiled.plan, doc, 0, who, &mut out);
        }
        if purpose == Purpose::Try {
            let mut text = Vec::new();
            crate::json::value(&mut text, doc, 0);
            document = Some(text);
        }
        // A registration's live call is traced for its warnings.
        let trace = exec::execute_traced_as(&compiled.plan, doc, 0, who, &mut out);
        warnings = trace.notes;
        wrote = trace.wrote;
        trace.outcome
    });
    if validating && !compiled.plan.targets.is_empty() && (!wrote || out == b"{}" || out == b"[]") {
        warnings.push(crate::rules::Problem::new(
            "",
            "the live call's document maps to nothing: every target is null or left out, so the rules may not fit the sources' answers (see `preview`)",
        ));
    }
    let map = started.elapsed();
    if let Some(mut span) = span {
        // The document is the answers read in place: its size is theirs.
        let size = shared.bytes.load(Ordering::Relaxed);
        let written = match &ran {
            Ok(exec::Outcome { limit: Some(_), .. }) => Err(crate::metrics::UpstreamErrorKind::MappingLimit),
            Ok(_) => Ok(out.len()),
            Err(_) => Err(crate::metrics::UpstreamErrorKind::NotJson),
        };
        crate::server::map::mapping_span(&mut span, size, written);
        state.tracer.end_after(span, map);
    }
    match ran {
        Ok(exec::Outcome { limit: Some(limit), .. }) => Err(ApiError::Upstream {
            failure: UpstreamFailure::MappingLimit { limit, bound: compiled.plan.bounds().of(limit) },
            validating,
        }),
        Ok(outcome) => {
            if outcome.expression_errors > 0 {
                state
                    .metrics
                    .expression_errors
                    .fetch_add(u64::from(outcome.expression_errors), Ordering::Relaxed);
            }
            state.metrics.mapping.observe(map);
            if !partial.is_empty() {
                state.metrics.composed.partial.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Composed { body: out, partial, reports, map, warnings, document })
        }
        Err(why) => Err(ApiError::Upstream { failure: UpstreamFailure::NotJson(why), validating }),
    }
}

/// Counts the failures not counted yet (`recast_source_failures_total`), and answers the
/// problem of the first required source that failed, if one did.
fn settle(
    state: &State,
    composition: &Composition,
    done: &[Option<Done>],
    counted: &mut Sources,
    validating: bool,
) -> Option<ApiError> {
    let sources = &composition.sources;
    for (i, outcome) in done.iter().enumerate() {
        if let Some(failure) = outcome.as_ref().and_then(|d| d.failure.as_ref())
            && !counted.has(i)
        {
            counted.add(i);
            state.metrics.composed.failed(failure.kind(), sources[i].optional);
        }
    }
    done.iter().enumerate().find_map(|(i, d)| {
        let d = d.as_ref()?;
        let failure = d.failure.as_ref().filter(|f| !sources[i].optional || f.is_call_bound())?;
        Some(failure.to_error(&sources[i], d.element, validating))
    })
}

/// Sources of a composition by bit (a composition has at most `MAX_SOURCES`).
#[derive(Default, Clone, Copy)]
struct Sources(u32);

const _: () = assert!(crate::route::sources::MAX_SOURCES <= 32);

impl Sources {
    fn has(self, i: usize) -> bool {
        self.0 & (1 << i) != 0
    }

    fn add(&mut self, i: usize) {
        self.0 |= 1 << i;
    }
}

/// When `timer` ends; never without one.
async fn expiry(timer: &mut Option<Pin<Box<tokio::time::Sleep>>>) {
    match timer {
        Some(timer) => timer.await,
        None => std::future::pending().await,
    }
}

/// The next source under way to be done: the one source's call, or the first of several to end.
async fn next_done<F: Future>(
    alone: &mut Option<Pin<Box<F>>>,
    running: &mut Option<FuturesUnordered<F>>,
) -> Option<F::Output> {
    if let Some(call) = alone {
        let done = call.await;
        *alone = None;
        return Some(done);
    }
    running.as_mut()?.next().await
}

/// `Recast-Partial`'s value.
pub(in crate::server) fn partial_header(entries: &[String]) -> Option<HeaderValue> {
    if entries.is_empty() {
        return None;
    }
    HeaderValue::from_str(&entries.join(", ")).ok()
}
