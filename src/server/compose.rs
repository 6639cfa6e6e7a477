//! Every route's call, one way: a route's schedule of sources (`route::composition`). A composed
//! route's sources (SPEC §2.3) run as their waits allow (each source's request made from the
//! answers it waits for and the caller's request), each answer is checked and indexed once as it
//! comes (`json::ondemand::Indexed`), and the route's plan maps the document of them all, read
//! where each answer lies for what the plan reads (`json::ondemand::with_parts`), never written
//! into one text. A route with `originalRoute` is the one-source case (`Call::Own`): the source
//! sends the request the route built from the caller's (SPEC §2.2), its answer is the document,
//! read once as it is mapped (`exec::map_text`), and its failures answer as §2.2 says, with no
//! source named; the bounds of a composition (`RECAST_MAX_SOURCE_CALLS`,
//! `RECAST_MAX_COMPOSED_BYTES`) are not its.
//!
//! The call is one task: the sources under way are futures it polls, so a required failure or
//! the deadline drops them, which closes their connections (or resets their streams); nothing
//! not yet started is started after that.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::stream::{FuturesUnordered, StreamExt};
use http::{HeaderMap, HeaderValue, StatusCode};

use super::call::{map_answer, not_json};
use super::problem::UpstreamFailure;
use super::{ApiError, State};
use crate::exec;
use crate::expr::{Arena, Budget};
use crate::json::ondemand::{Indexed, Part, with_parts};
use crate::json::{self, Doc};
use crate::metrics::SourceFailureKind;
use crate::route::composition::{
    Call, Caller, Composition, Source, SourceError, check_body, request_context,
};
use crate::route::template::Context;
use crate::route::{MAPPED_AUTH, Route};
use crate::upstream::{Answer, Freshness, Outbound, UpstreamRequest};
use bumpalo::Bump;

/// The caller's request as a composed route reads it.
pub(super) struct CallerRequest<'a> {
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
}

impl<'a> CallerRequest<'a> {
    /// The caller's request as [`caller_request`] wrote it.
    pub fn of(request: &'a UpstreamRequest) -> CallerRequest<'a> {
        CallerRequest { query: request.uri.query(), headers: &request.headers, body: request.body.clone() }
    }
}

/// What a composed route's call reads of the caller's request, written as a request that is
/// never sent: its digest is the cache key's (SPEC §2.3: the whole query, normalised; the
/// forwarded headers; `X-Mapped-Auth` when a source is `Runtime`; the body), and
/// [`CallerRequest::of`] reads it back. A runtime-auth route called without `X-Mapped-Auth`
/// answers 401 here, before anything is made.
pub(super) fn caller_request(
    composition: &Composition,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<UpstreamRequest, ApiError> {
    let mapped_auth = headers.get(&MAPPED_AUTH);
    if composition.runtime_auth && mapped_auth.is_none() {
        return Err(ApiError::AuthRequired);
    }
    // The query's pairs by name (a name's values keep their order): `a=1&b=2` and `b=2&a=1`
    // read the same.
    let mut pairs: Vec<(String, String)> =
        url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()).into_owned().collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut normalised = url::form_urlencoded::Serializer::new(String::from("http://composed.invalid/?"));
    normalised.extend_pairs(&pairs);
    let uri = normalised.finish();
    let uri = http::Uri::try_from(uri.trim_end_matches('?'))
        .map_err(|_| ApiError::InvalidQuery("the query cannot be read".to_owned()))?;
    let mut kept = HeaderMap::new();
    for name in &composition.forward_headers {
        for value in headers.get_all(name) {
            kept.append(name.clone(), value.clone());
        }
    }
    if composition.runtime_auth
        && let Some(value) = mapped_auth
    {
        let mut value = value.clone();
        value.set_sensitive(true);
        kept.insert(MAPPED_AUTH, value);
    }
    Ok(UpstreamRequest { method: http::Method::GET, uri, headers: kept, body })
}

/// A call that mapped: its answer, and what each source did.
pub(super) struct Composed {
    pub body: Vec<u8>,
    /// The answer's status: a route's own upstream's (a 2xx), 200 for a composed route.
    pub status: StatusCode,
    /// What a route's own upstream said of caching its answer (nothing for a composed route).
    pub freshness: Freshness,
    /// A registration's live call of a route's own upstream: its answer as it came, for the
    /// trace of its warnings (mapping may rewrite the text it reads).
    pub document: Option<Vec<u8>>,
    /// `Recast-Partial`'s entries: the optional sources that failed.
    pub partial: Vec<String>,
    /// By source, in name order.
    pub reports: Vec<Report>,
    pub map: Duration,
    /// A registration's live call: the warnings of its trace (SPEC §1.8), located in the rules.
    pub warnings: Vec<crate::rules::Problem>,
}

/// What one source did, for `Server-Timing` and a registration's answer.
pub(super) struct Report {
    pub name: String,
    /// Its upstream's status (the last element's for `forEach`), when it answered.
    pub status: Option<u16>,
    pub took: Duration,
    pub calls: usize,
    /// Why an optional source failed, when it did (a registration's warnings).
    pub failed: Option<String>,
}

/// A source's value in the document: answers checked and indexed as they came; or a route's own
/// upstream's answer, which is the document, read as it is mapped.
#[derive(Clone)]
enum Value {
    Null,
    One(Arc<Indexed>),
    List(Vec<Option<Arc<Indexed>>>),
    Answer(Arc<Answer>),
}

/// How one call of a source ended, for `_sources`.
#[derive(Clone, Copy)]
struct Ended {
    status: Option<u16>,
    outcome: &'static str,
    /// A failure other than an answer's status: its kind (`Recast-Partial`'s `status=`).
    kind: Option<&'static str>,
}

/// A source that is done.
#[derive(Clone)]
struct Done {
    value: Value,
    /// One per call; one for a source not called.
    ended: Vec<Ended>,
    list: bool,
    failure: Option<Failure>,
    /// How many `forEach` elements failed (an optional source's).
    failed_elements: usize,
    took: Duration,
    calls: usize,
}

/// Why a source failed.
#[derive(Debug, Clone)]
enum Failure {
    Upstream(UpstreamFailure),
    Template(SourceError),
    /// A source it waits for failed.
    Dependency(String),
    /// `forEach` gave more elements than `maxCalls`.
    TooManyElements {
        given: usize,
        max: usize,
        location: String,
        only_request: bool,
    },
}

impl Failure {
    /// The kind `recast_source_failures_total` counts it by.
    fn kind(&self) -> SourceFailureKind {
        match self {
            Failure::Upstream(failure) => SourceFailureKind::Upstream(failure.kind()),
            Failure::Template(_) => SourceFailureKind::Template,
            Failure::Dependency(_) => SourceFailureKind::Dependency,
            Failure::TooManyElements { .. } => SourceFailureKind::TooManyElements,
        }
    }

    /// `Recast-Partial`'s `status=`: the upstream's status, or the kind of failure.
    fn partial_status(&self) -> String {
        match self {
            Failure::Upstream(UpstreamFailure::Status(status, _)) => status.as_u16().to_string(),
            Failure::Upstream(failure) => failure.kind().label().to_owned(),
            Failure::Template(SourceError::AuthRequired) => "auth-required".to_owned(),
            Failure::Template(_) => "template".to_owned(),
            Failure::Dependency(_) => "dependency".to_owned(),
            Failure::TooManyElements { .. } => "too-many-elements".to_owned(),
        }
    }

    fn is_timeout(&self) -> bool {
        matches!(self, Failure::Upstream(UpstreamFailure::Timeout))
    }

    /// A bound of the whole call (`RECAST_MAX_COMPOSED_BYTES`, `RECAST_MAX_SOURCE_CALLS`):
    /// it ends the call, optional source or not.
    fn is_call_bound(&self) -> bool {
        matches!(
            self,
            Failure::Upstream(
                UpstreamFailure::ComposedTooLarge { .. } | UpstreamFailure::TooManyCalls { .. }
            )
        )
    }

    /// The problem a required source's failure answers with: a route's own upstream's as SPEC
    /// §2.2 says, a composed route's source's with its name (§2.3).
    fn to_error(&self, source: &Source, validating: bool) -> ApiError {
        let error = match self {
            Failure::Upstream(failure) => ApiError::Upstream { failure: failure.clone(), validating },
            Failure::Template(SourceError::AuthRequired) => ApiError::AuthRequired,
            Failure::Template(SourceError::Template { location, why, only_request }) => {
                ApiError::Template { location: location.clone(), why: why.clone(), caller: *only_request }
            }
            Failure::Dependency(dependency) => ApiError::Upstream {
                failure: UpstreamFailure::Unreachable(format!(
                    "it waits for the source `{dependency}`, which failed"
                )),
                validating,
            },
            Failure::TooManyElements { given, max, location, only_request } => ApiError::Template {
                location: location.clone(),
                why: format!(
                    "it gives {given} elements, more than `maxCalls` ({max}); the list is never cut short"
                ),
                caller: *only_request,
            },
        };
        match source.call {
            Call::Own => error,
            Call::Rendered(_) => ApiError::Source { name: source.name.clone(), error: Box::new(error) },
        }
    }
}

impl Done {
    fn skipped() -> Done {
        Done {
            value: Value::Null,
            ended: vec![Ended { status: None, outcome: "skipped", kind: None }],
            list: false,
            failure: None,
            failed_elements: 0,
            took: Duration::ZERO,
            calls: 0,
        }
    }

    fn failed(failure: Failure) -> Done {
        let outcome = if failure.is_timeout() { "timeout" } else { "failed" };
        Done {
            value: Value::Null,
            ended: vec![Ended { status: None, outcome, kind: None }],
            list: false,
            failure: Some(failure),
            failed_elements: 0,
            took: Duration::ZERO,
            calls: 0,
        }
    }
}

/// What one call shares among its sources: the requests it may still send and the bytes its
/// answers may still take.
struct Shared {
    calls_left: AtomicUsize,
    /// The answers' bytes (`RECAST_MAX_COMPOSED_BYTES`).
    bytes: AtomicUsize,
    /// What their indexes hold beside them (also in `RECAST_MAX_BUFFERED_BYTES`'s count).
    indexes: AtomicUsize,
    max_bytes: usize,
    max_calls: usize,
    /// The requests sent so far (see [`Shared::once`]): identical ones are sent once and their
    /// answer shared, across sources.
    sent: std::sync::Mutex<Vec<Sent>>,
}

/// A request of the call, sent or being sent, and the answer it got or is getting. Two requests
/// are the same when they send the same (method, URL, every header, the body:
/// `UpstreamRequest::same_as`, looked for by `fingerprint`) and add the same credentials and
/// certificate as they are sent (a source's OAuth2 token request and `tls`, by identity: two
/// sources with either never share).
struct Sent {
    fingerprint: u64,
    oauth: usize,
    tls: usize,
    request: Arc<UpstreamRequest>,
    answer: Arc<tokio::sync::OnceCell<CallResult>>,
}

impl Shared {
    /// The answer to `request` of `source` (whose `fingerprint` is given): the one an identical
    /// request of this call got or is getting, else a new call's.
    async fn once(
        &self,
        state: &State,
        source: &Source,
        request: UpstreamRequest,
        fingerprint: u64,
    ) -> CallResult {
        let identity = |arc: Option<usize>| arc.unwrap_or(0);
        let oauth = identity(source.oauth.as_ref().map(|a| Arc::as_ptr(a) as usize));
        let tls = identity(source.tls.as_ref().map(|a| Arc::as_ptr(a) as usize));
        let (request, answer) = {
            let mut sent = self.sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let same = sent.iter().find(|s| {
                (s.fingerprint, s.oauth, s.tls) == (fingerprint, oauth, tls) && s.request.same_as(&request)
            });
            match same {
                Some(same) => (same.request.clone(), same.answer.clone()),
                None => {
                    let (request, answer) = (Arc::new(request), Arc::default());
                    sent.push(Sent {
                        fingerprint,
                        oauth,
                        tls,
                        request: Arc::clone(&request),
                        answer: Arc::clone(&answer),
                    });
                    (request, answer)
                }
            }
        };
        answer.get_or_init(|| one_call(state, source, &request, self)).await.clone()
    }

    /// Takes `n` of the requests left, or says there are not so many.
    fn take_calls(&self, n: usize) -> bool {
        self.calls_left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(n)).is_ok()
    }
}

/// How long after the deadline the sources still out are given up (they end at the deadline
/// by themselves, with what they have).
const DEADLINE_SLACK: Duration = Duration::from_millis(20);

/// Lets go of the bytes a call's answers held in `RECAST_MAX_BUFFERED_BYTES`'s count.
struct Release<'a> {
    state: &'a State,
    shared: &'a Shared,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let held = self.shared.bytes.load(Ordering::Relaxed) + self.shared.indexes.load(Ordering::Relaxed);
        self.state.buffered.release(held);
    }
}

/// A composed call that failed: its problem, and how long the sources that were done took
/// (`src.<name>`, for `Server-Timing`).
pub(super) struct Failed {
    pub error: ApiError,
    pub sources: Vec<(String, Duration)>,
}

/// Runs a call of `route` (its `schedule`) and maps the document. `request` is the call's
/// request as its cache key is made of it: a route's own upstream's, which its one source sends
/// ([`crate::route::Route::upstream_request`]), or what a composed route reads of the caller's
/// ([`caller_request`]). A required failure answers as SPEC §2.2 and §2.3 say; `validating` for
/// a registration's live call.
pub(super) async fn run(
    state: &State,
    route: &Route,
    schedule: &Composition,
    request: UpstreamRequest,
    validating: bool,
) -> Result<Composed, Failed> {
    let mut sources = Vec::new();
    run_timed(state, route, schedule, request, validating, &mut sources)
        .await
        .map_err(|error| Failed { error, sources })
}

async fn run_timed(
    state: &State,
    route: &Route,
    composition: &Composition,
    request: UpstreamRequest,
    validating: bool,
    timings: &mut Vec<(String, Duration)>,
) -> Result<Composed, ApiError> {
    let own = composition.is_own();
    // A route's own upstream sends the request; a composed route's sources read it.
    let (mut own_request, read) = if own { (Some(request), None) } else { (None, Some(request)) };
    let caller = read.as_ref().map(CallerRequest::of);
    let mapped_auth = caller.as_ref().and_then(|caller| caller.headers.get(&MAPPED_AUTH));
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
    let request_text = match &caller {
        Some(caller) => {
            state.metrics.composed.calls.fetch_add(1, Ordering::Relaxed);
            let read = composition.reads_request || wants.is_none_or(|w| w.reads_member("request"));
            request_document(composition, caller, read, config.max_depth)?
        }
        None => None,
    };
    let shared = Shared {
        calls_left: AtomicUsize::new(config.max_source_calls),
        bytes: AtomicUsize::new(0),
        indexes: AtomicUsize::new(0),
        max_bytes: config.max_composed_bytes,
        max_calls: config.max_source_calls,
        sent: Default::default(),
    };
    // The answers this call holds (RECAST_MAX_BUFFERED_BYTES) are let go when it returns.
    let _held = Release { state, shared: &shared };
    let who = Caller { mapped_auth };
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
                let prepared = match own_request.take() {
                    // A route's own upstream: the request the route built.
                    Some(request) => Prepared::Calls { requests: vec![request], list: false },
                    None => prepare(state, composition, i, request_text.as_deref(), &done, &who, &budget),
                };
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
                if !own {
                    timings.push((format!("src.{}", sources[i].name), outcome.took));
                }
                done[i] = Some(outcome);
            }
            () = expiry(&mut given_up) => {
                // Every required source answered: optional ones still out are `null`.
                if let Some(i) = (0..n).find(|&i| done[i].is_none() && !sources[i].optional) {
                    let failure = Failure::Upstream(UpstreamFailure::Timeout);
                    return Err(failure.to_error(&sources[i], validating));
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
    if own {
        // The answer is the document, read as it is mapped (a failure has answered above).
        let Some(Value::Answer(answer)) = done.into_iter().next().map(|d| d.value) else {
            return Err(ApiError::Internal);
        };
        // Its only holder by now: nothing shares a route's own answer.
        let mut answer = Arc::try_unwrap(answer).map_err(|_| ApiError::Internal)?;
        let document = validating.then(|| answer.body.clone());
        let (mapped, map) = map_answer(state, route, &mut answer);
        let body = mapped.map_err(|failure| ApiError::Upstream { failure, validating })?;
        return Ok(Composed {
            body,
            status: answer.status,
            freshness: answer.freshness,
            document,
            partial: Vec::new(),
            reports: Vec::new(),
            map,
            warnings: Vec::new(),
        });
    }
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
        if let Some(entry) = &failed {
            partial.push(entry.clone());
        }
        reports.push(Report {
            name: source.name.clone(),
            status: outcome.ended.iter().rev().find_map(|e| e.status),
            took: outcome.took,
            calls: outcome.calls,
            failed,
        });
    }
    let span = state.tracer.child(crate::telemetry::Kind::Internal, "map");
    let started = Instant::now();
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    let mut wrote = true;
    let ran = with_document(composition, request_text.as_deref(), &done, wants, config.max_depth, |doc| {
        if !validating {
            return exec::execute(&compiled.plan, doc, 0, &mut out);
        }
        // A registration's live call is traced for its warnings.
        let trace = exec::execute_traced(&compiled.plan, doc, 0, &mut out);
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
        super::call::mapping_span(&mut span, size, written);
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
            Ok(Composed {
                body: out,
                status: StatusCode::OK,
                freshness: Freshness::default(),
                document: None,
                partial,
                reports,
                map,
                warnings,
            })
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
            if let Call::Rendered(_) = sources[i].call {
                state.metrics.composed.failed(failure.kind(), sources[i].optional);
            }
        }
    }
    done.iter().enumerate().find_map(|(i, d)| {
        let failure = d.as_ref()?.failure.as_ref().filter(|f| !sources[i].optional || f.is_call_bound())?;
        Some(failure.to_error(&sources[i], validating))
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

/// What starting a source comes to: done at once (skipped, failed), or calls to make.
enum Prepared {
    Done(Done),
    Calls { requests: Vec<UpstreamRequest>, list: bool },
}

/// Evaluates a source's `when` and `forEach` and renders its requests over its context.
fn prepare(
    state: &State,
    composition: &Composition,
    i: usize,
    request_text: Option<&Indexed>,
    done: &[Option<Done>],
    caller: &Caller<'_>,
    budget: &Budget,
) -> Prepared {
    let source = &composition.sources[i];
    let config = &state.config;
    let dependency = source
        .after
        .iter()
        .find(|&&j| done[j].as_ref().is_some_and(|d| d.failure.is_some()))
        .map(|&j| composition.sources[j].name.clone());
    let prepared = with_context(composition, source, request_text, done, config.max_depth, |doc| {
        // One budget for every source's templates, `when` and `forEach` in the call.
        let bump = Bump::new();
        let arena = Arena::new(&bump, budget);
        let context = Context { doc, item: None, arena: &arena };
        match source.wanted(&context) {
            Ok(false) => return Prepared::Done(Done::skipped()),
            Err(e) => return Prepared::Done(Done::failed(Failure::Template(e))),
            Ok(true) => {}
        }
        if let Some(dependency) = dependency {
            return Prepared::Done(Done::failed(Failure::Dependency(dependency)));
        }
        if source.for_each.is_none() {
            return match source.request(&context, caller) {
                Ok(request) => Prepared::Calls { requests: vec![request], list: false },
                Err(e) => Prepared::Done(Done::failed(Failure::Template(e))),
            };
        }
        let elements = match source.elements(&context) {
            Ok(elements) => elements,
            Err(e) => return Prepared::Done(Done::failed(Failure::Template(e))),
        };
        if elements.len() > source.max_calls {
            let only_request = source.for_each.as_ref().is_some_and(|e| e.only_request);
            return Prepared::Done(Done::failed(Failure::TooManyElements {
                given: elements.len(),
                max: source.max_calls,
                location: source.for_each_location().to_owned(),
                only_request,
            }));
        }
        let mut requests = Vec::with_capacity(elements.len());
        for item in elements {
            let context = Context { doc, item: Some(item), arena: &arena };
            match source.request(&context, caller) {
                Ok(request) => requests.push(request),
                Err(e) => return Prepared::Done(Done::failed(Failure::Template(e))),
            }
        }
        Prepared::Calls { requests, list: true }
    });
    prepared
        .unwrap_or_else(|why| Prepared::Done(Done::failed(Failure::Upstream(UpstreamFailure::NotJson(why)))))
}

/// Makes a source's calls, at most `concurrency` at a time, identical requests once; its value
/// is the answer, or for `forEach` the answers in element order. `alone`: the call has no other
/// source, so a single request has nothing to be the same as. Its `took` runs from its first poll.
async fn run_source(
    state: &State,
    source: &Source,
    requests: Vec<UpstreamRequest>,
    list: bool,
    alone: bool,
    shared: &Shared,
    until: tokio::time::Instant,
) -> Done {
    let started = Instant::now();
    // Identical rendered requests are sent once and their answer shared (by fingerprint: `None`,
    // a request alone, is neither looked for nor kept).
    let mut unique: Vec<(UpstreamRequest, Option<u64>)> = Vec::new();
    let mut of_element = Vec::with_capacity(requests.len());
    if alone && requests.len() == 1 {
        of_element.push(0);
        unique.extend(requests.into_iter().map(|request| (request, None)));
    } else {
        for request in requests {
            let fingerprint = Some(request.fingerprint());
            match unique.iter().position(|(r, f)| *f == fingerprint && r.same_as(&request)) {
                Some(at) => of_element.push(at),
                None => {
                    of_element.push(unique.len());
                    unique.push((request, fingerprint));
                }
            }
        }
    }
    let calls = unique.len();
    let mut answers: Vec<Option<CallResult>> = vec![None; calls];
    // Each call ends at the source's bound: the answers that came before it are kept, and the
    // elements still out are `timeout`.
    // The one call of a source alone in its call starts with the call, so the upstream client
    // ends it by the call's deadline; any other is held to the source's bound (`forEach` calls
    // waiting for their turn start late).
    let bounded = !(alone && calls == 1) || source.timeout.is_some();
    let until = bounded.then_some(until);
    if calls == 1 {
        // One call: awaited as it is, with nothing to run beside it (and called here, not
        // taken from an iterator, which would copy its future into this one).
        if let Some((request, fingerprint)) = unique.pop() {
            answers[0] = Some(source_call(state, source, request, fingerprint, shared, until).await);
        }
    } else {
        let calls_of = unique
            .into_iter()
            .map(|(request, fingerprint)| source_call(state, source, request, fingerprint, shared, until));
        let mut stream = futures_util::stream::iter(calls_of).buffered(source.concurrency);
        let mut index = 0;
        while let Some(answer) = stream.next().await {
            let failed = answer.is_err();
            answers[index] = Some(answer);
            index += 1;
            // A required source fails at its first failed call (and any source at a bound of
            // the whole call); the others under way are dropped.
            let bound = matches!(
                answers[index - 1],
                Some(Err((
                    _,
                    UpstreamFailure::ComposedTooLarge { .. } | UpstreamFailure::TooManyCalls { .. }
                )))
            );
            if failed && (!source.optional || bound) {
                break;
            }
        }
    }
    let mut ended = Vec::with_capacity(of_element.len());
    let mut values = Vec::with_capacity(of_element.len());
    let mut failure = None;
    let mut failed_elements = 0;
    for &at in &of_element {
        match &answers[at] {
            Some(Ok((status, body))) => {
                ended.push(Ended { status: Some(*status), outcome: "ok", kind: None });
                values.push(Some(body.clone()));
            }
            Some(Err((status, why))) => {
                let outcome = if matches!(why, UpstreamFailure::Timeout) { "timeout" } else { "failed" };
                let kind = match why {
                    UpstreamFailure::Status(..) => None,
                    other => Some(other.kind().label()),
                };
                ended.push(Ended { status: *status, outcome, kind });
                values.push(None);
                failed_elements += 1;
                failure.get_or_insert_with(|| why.clone());
            }
            None => {
                // Not called: a required source failed at an element before it.
                ended.push(Ended { status: None, outcome: "failed", kind: None });
                values.push(None);
            }
        }
    }
    if !list {
        let value = values.into_iter().next().flatten().unwrap_or(Value::Null);
        return Done {
            value,
            ended,
            list,
            failure: failure.map(Failure::Upstream),
            failed_elements: 0,
            took: started.elapsed(),
            calls,
        };
    }
    // A `forEach` source fails when it is required and an element failed; an optional one
    // keeps `null` at that element's place, unless the element passed a bound of the whole call.
    let failure = failure.map(Failure::Upstream).filter(|f| !source.optional || f.is_call_bound());
    // A `forEach` source's answers are all indexed (only a route's own upstream's is not).
    let values = values.into_iter().map(|v| if let Some(Value::One(text)) = v { Some(text) } else { None });
    Done {
        value: Value::List(values.collect()),
        ended,
        list,
        failure,
        failed_elements,
        took: started.elapsed(),
        calls,
    }
}

/// One request of a source (`fingerprint`: see [`Shared::once`]), ended by `until` if given.
async fn source_call(
    state: &State,
    source: &Source,
    request: UpstreamRequest,
    fingerprint: Option<u64>,
    shared: &Shared,
    until: Option<tokio::time::Instant>,
) -> CallResult {
    let answer = async {
        match fingerprint {
            Some(fingerprint) => shared.once(state, source, request, fingerprint).await,
            None => one_call(state, source, &request, shared).await,
        }
    };
    let Some(until) = until else { return answer.await };
    match tokio::time::timeout_at(until, answer).await {
        Ok(answer) => answer,
        Err(_) => Err((None, UpstreamFailure::Timeout)),
    }
}

/// How one request of a source ended: its status and body (indexed, or a route's own
/// upstream's answer, [`Value::One`] or [`Value::Answer`]), or its status (when it answered) and
/// why it failed.
type CallResult = Result<(u16, Value), (Option<u16>, UpstreamFailure)>;

/// One request of a source: its answer's status and body when it is a 2xx JSON answer.
async fn one_call(state: &State, source: &Source, request: &UpstreamRequest, shared: &Shared) -> CallResult {
    // `RECAST_MAX_SOURCE_CALLS` and `RECAST_MAX_COMPOSED_BYTES` bound a composition's sources.
    let own = matches!(source.call, Call::Own);
    let attempts = 1 + source.retry.as_ref().map_or(0, |r| usize::from(r.attempts));
    if !own && !shared.take_calls(attempts) {
        return Err((None, UpstreamFailure::TooManyCalls { limit: shared.max_calls }));
    }
    let outbound = Outbound {
        rate_limit: source.rate_limit.as_ref().map(|limit| (limit, source.key)),
        retry: source.retry.as_ref(),
        oauth: source.oauth.as_ref(),
        tls: source.tls.as_deref(),
        breaker: source.breaker,
        h2c: source.h2c,
        source: (!own).then_some(source.name.as_str()),
    };
    let started = Instant::now();
    // The exchange's state is large: boxed, the futures that hold this call (the source's, the
    // element's under `concurrency`) stay small and are not copied whole each time they move.
    let answer = crate::tasks::boxed(|| state.client.call_with(request, &outbound)).await;
    state.metrics.upstream.observe(started.elapsed());
    let fail = |status: Option<u16>, failure: UpstreamFailure| {
        state.metrics.upstream_error(failure.kind());
        Err((status, failure))
    };
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
    if own {
        // Held until it is mapped, as every answer is (`RECAST_MAX_BUFFERED_BYTES`); it is the
        // document, and its mapping reads it in one pass.
        return Ok((status, Value::Answer(Arc::new(answer))));
    }
    if total > shared.max_bytes {
        return fail(Some(status), UpstreamFailure::ComposedTooLarge { limit: shared.max_bytes });
    }
    // The document puts an answer two levels down (a member, an element of a `forEach` list).
    let (len, empty) = (answer.body.len(), answer.body.is_empty());
    match Indexed::new(answer.body, state.config.max_depth.saturating_sub(2)) {
        Ok(indexed) => {
            let index = indexed.held_bytes().saturating_sub(len);
            shared.indexes.fetch_add(index, Ordering::Relaxed);
            state.buffered.add(index);
            Ok((status, Value::One(Arc::new(indexed))))
        }
        Err(e) => fail(Some(status), UpstreamFailure::NotJson(not_json(empty, answer.content_type, &e))),
    }
}

/// `request` of the context (`crate::route::composition::request_context`), indexed, when
/// something reads it (`read`); a body that is not JSON answers 400 either way.
fn request_document(
    composition: &Composition,
    caller: &CallerRequest<'_>,
    read: bool,
    max_depth: usize,
) -> Result<Option<Arc<Indexed>>, ApiError> {
    let refused = |e: &json::JsonError| {
        ApiError::bad_body(&caller.body, e, |limit| format!("the body nests deeper than {limit} levels"))
    };
    if !read {
        return check_body(&caller.body, max_depth).map(|()| None).map_err(|e| refused(&e));
    }
    let text =
        request_context(caller.query, caller.headers, &composition.forward_headers, &caller.body, max_depth)
            .map_err(|e| refused(&e))?;
    // The document puts it one level down; its body was checked two levels down.
    Indexed::new(text, max_depth.saturating_sub(1)).map(|text| Some(Arc::new(text))).map_err(|e| refused(&e))
}

/// Runs `f` on a source's context: `request` and the values of the sources it reads, for what
/// its expressions read of them.
fn with_context<R>(
    composition: &Composition,
    source: &Source,
    request_text: Option<&Indexed>,
    done: &[Option<Done>],
    max_depth: usize,
    f: impl FnOnce(&Doc<'_, '_>) -> R,
) -> Result<R, String> {
    let mut names: Vec<&str> = vec!["request"];
    let mut parts: Vec<Part<'_>> = vec![request_text.map_or(Part::Null, Part::One)];
    for &j in &source.reads {
        names.push(&composition.sources[j].name);
        parts.push(done[j].as_ref().map_or(Part::Null, |d| d.value.part()));
    }
    read(&names, &parts, Some(&source.context), max_depth, f)
}

/// Runs `f` on the document the rules map (each source's value, `request` and `_sources`),
/// read for what `wants` says the plan reads (`None`: all of it); `request` is there when
/// something reads it, and `_sources` is made only when the plan reads it.
fn with_document<R>(
    composition: &Composition,
    request_text: Option<&Indexed>,
    done: &[Done],
    wants: Option<&json::ondemand::Wants>,
    max_depth: usize,
    f: impl FnOnce(&Doc<'_, '_>) -> R,
) -> Result<R, String> {
    let sources = if wants.is_none_or(|w| w.reads_member("_sources")) {
        let text = sources_document(composition, done);
        Some(
            Indexed::new(text, max_depth.saturating_sub(1))
                .map_err(|e| format!("`_sources` is not JSON: {e}"))?,
        )
    } else {
        None
    };
    let mut names: Vec<&str> =
        composition.by_name.iter().map(|&i| composition.sources[i].name.as_str()).collect();
    let mut parts: Vec<Part<'_>> = composition.by_name.iter().map(|&i| done[i].value.part()).collect();
    names.extend(["request", "_sources"]);
    parts
        .extend([request_text.map_or(Part::Null, Part::One), sources.as_ref().map_or(Part::Null, Part::One)]);
    read(&names, &parts, wants, max_depth, f)
}

/// `_sources`: each source's status and outcome (lists for `forEach`).
fn sources_document(composition: &Composition, done: &[Done]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 * done.len());
    out.push(b'{');
    for (n, &i) in composition.by_name.iter().enumerate() {
        let (source, outcome) = (&composition.sources[i], &done[i]);
        if n > 0 {
            out.push(b',');
        }
        json::write::string(&mut out, &source.name);
        let status = |out: &mut Vec<u8>, e: &Ended| match e.status {
            Some(status) => json::write::u64(out, u64::from(status)),
            None => out.extend_from_slice(b"null"),
        };
        if outcome.list {
            out.extend_from_slice(b":{\"status\":[");
            for (i, e) in outcome.ended.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                status(&mut out, e);
            }
            out.extend_from_slice(b"],\"outcome\":[");
            for (i, e) in outcome.ended.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json::write::string(&mut out, e.outcome);
            }
            out.extend_from_slice(b"]}");
        } else {
            let e = outcome.ended.first().copied().unwrap_or(Ended {
                status: None,
                outcome: "skipped",
                kind: None,
            });
            out.extend_from_slice(b":{\"status\":");
            status(&mut out, &e);
            out.extend_from_slice(b",\"outcome\":");
            json::write::string(&mut out, e.outcome);
            out.push(b'}');
        }
    }
    out.push(b'}');
    out
}

impl Value {
    fn part(&self) -> Part<'_> {
        match self {
            Value::Null => Part::Null,
            Value::One(text) => Part::One(text),
            Value::List(items) => Part::List(items.iter().map(Option::as_deref).collect()),
            // Never a part: a route's own upstream's answer is the document itself.
            Value::Answer(_) => Part::Null,
        }
    }
}

/// The object `{names[i]: parts[i]}` as a document ([`with_parts`]).
fn read<R>(
    names: &[&str],
    parts: &[Part<'_>],
    wants: Option<&json::ondemand::Wants>,
    max_depth: usize,
    f: impl FnOnce(&Doc<'_, '_>) -> R,
) -> Result<R, String> {
    with_parts(names, parts, wants, max_depth, f)
        .map_err(|(member, e)| format!("the answer of `{}` is not JSON: {e}", names[member]))
}

/// `Recast-Partial`'s value.
pub(super) fn partial_header(entries: &[String]) -> Option<HeaderValue> {
    if entries.is_empty() {
        return None;
    }
    HeaderValue::from_str(&entries.join(", ")).ok()
}
