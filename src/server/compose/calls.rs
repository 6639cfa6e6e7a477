//! Starting a source and making its calls: its `when` and `forEach` evaluated and its requests
//! rendered over its context, then sent at most `concurrency` at a time, identical ones once,
//! each answer checked and indexed as it comes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bumpalo::Bump;
use futures_util::stream::StreamExt;

use super::document::with_context;
use super::outcome::{CallResult, Done, Ended, Failure, Paged, Value};
use super::pages::fetch_pages;
use super::shared::answer_of;
use super::shared::{Sent, Shared};
use crate::expr::{Arena, Budget};
use crate::json::ondemand::Indexed;
use crate::route::composition::{Composition, Elements, Source};
use crate::route::render::CallerParts;
use crate::route::template::Context;
use crate::server::map::not_json;
use crate::server::problem::UpstreamFailure;
use crate::server::state::State;
use crate::upstream::{MediaType, UpstreamRequest};

/// What starting a source comes to: done at once (skipped, failed), or calls to make.
pub(super) enum Prepared {
    Done(Done),
    Calls { requests: Vec<UpstreamRequest>, list: bool },
}

/// What every source of one call renders its requests with.
pub(super) struct Rendering<'a> {
    /// `request` of the context, when something reads it.
    pub(super) request_text: Option<&'a Indexed>,
    /// What the call's sources share: the rendered requests' bytes are counted there.
    pub(super) shared: &'a Shared,
    pub(super) caller: &'a CallerParts<'a>,
    /// `$caller` (SPEC §2.4): `None` on an open route.
    pub(super) identity: Option<&'a crate::expr::Const>,
    /// One budget for every source's templates, `when` and `forEach` in the call.
    pub(super) budget: &'a Budget,
    /// An admin's live call: a template's missing member is told ([`Context::explain`]).
    pub(super) validating: bool,
}

/// Evaluates a source's `when` and `forEach` and renders its requests over its context.
pub(super) fn prepare(
    state: &State,
    composition: &Composition,
    i: usize,
    done: &[Option<Done>],
    call: &Rendering<'_>,
) -> Prepared {
    let Rendering { request_text, shared, caller, identity, budget, validating } = *call;
    let who = identity.map_or(crate::expr::Val::Null, crate::expr::Val::from_const);
    // `RECAST_MAX_BUFFERED_BYTES` is checked as each source that is called starts (and as each
    // of its requests is rendered, and sent): a call admitted under it ends once it is passed.
    let buffered = || {
        let failure = UpstreamFailure::Buffered { limit: state.buffered.limit() };
        state.metrics.upstream_error(failure.kind());
        Failure::Upstream(failure)
    };
    let source = &composition.sources[i];
    let config = &state.config;
    let dependency = source
        .after
        .iter()
        .find(|&&j| done[j].as_ref().is_some_and(|d| d.failure.is_some()))
        .map(|&j| composition.sources[j].name.clone());
    let prepared = with_context(composition, source, request_text, done, config.max_depth, |doc| {
        let bump = Bump::new();
        let arena = Arena::new(&bump, budget);
        let context = Context { doc, item: None, caller: who, arena: &arena, explain: validating };
        match source.wanted(&context) {
            Ok(false) => return Prepared::Done(Done::skipped()),
            Err(e) => return Prepared::Done(Done::failed(Failure::Template(e))),
            Ok(true) => {}
        }
        if let Some(dependency) = dependency {
            return Prepared::Done(Done::failed(Failure::Dependency(dependency)));
        }
        if state.buffered.full() {
            return Prepared::Done(Done::failed(buffered()));
        }
        if source.for_each.is_none() {
            return match source.request(&context, caller) {
                Ok(request) if !shared.hold_request(state, &request) => {
                    Prepared::Done(Done::failed(buffered()))
                }
                Ok(request) => Prepared::Calls { requests: vec![request], list: false },
                Err(e) => Prepared::Done(Done::failed(Failure::Template(e))),
            };
        }
        let elements = match source.elements(&context) {
            Ok(Elements::Of(elements)) => elements,
            // Not a list: no call (SPEC §1.6: a scalar or nothing has no elements), but said:
            // counted, and named in `_sources` (a registration warns of it).
            Ok(Elements::NotAList(kind)) => {
                state.metrics.composed.not_a_list.fetch_add(1, Ordering::Relaxed);
                return Prepared::Done(Done::not_a_list(kind));
            }
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
        for (element, item) in elements.into_iter().enumerate() {
            let context = Context { doc, item: Some(item), caller: who, arena: &arena, explain: validating };
            match source.request(&context, caller) {
                Ok(request) if !shared.hold_request(state, &request) => {
                    return Prepared::Done(Done { element: Some(element), ..Done::failed(buffered()) });
                }
                Ok(request) => requests.push(request),
                Err(e) => {
                    return Prepared::Done(Done {
                        element: Some(element),
                        ..Done::failed(Failure::Template(e))
                    });
                }
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
pub(super) async fn run_source(
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
    // A paged request is many calls, each with the client's deadline from its own start: the
    // source's bound holds them all.
    let bounded = !(alone && calls == 1) || source.timeout.is_some() || source.paging.is_some();
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
                    UpstreamFailure::ComposedTooLarge { .. }
                        | UpstreamFailure::TooManyCalls { .. }
                        | UpstreamFailure::Buffered { .. },
                    _
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
    let mut first_failed = None;
    for (element, &at) in of_element.iter().enumerate() {
        match &answers[at] {
            Some(Ok((status, body, paged))) => {
                ended.push(Ended { status: Some(*status), outcome: "ok", kind: None, paged: *paged });
                values.push(Some(body.clone()));
            }
            Some(Err((status, why, paged))) => {
                let outcome = if matches!(why, UpstreamFailure::Timeout) { "timeout" } else { "failed" };
                let kind = match why {
                    UpstreamFailure::Status(..) => None,
                    other => Some(other.kind().label()),
                };
                ended.push(Ended { status: *status, outcome, kind, paged: *paged });
                values.push(None);
                failed_elements += 1;
                if failure.is_none() {
                    failure = Some(why.clone());
                    first_failed = Some(element);
                }
            }
            None => {
                // Not called: a required source failed at an element before it.
                ended.push(Ended { status: None, outcome: "failed", kind: None, paged: Paged::default() });
                values.push(None);
            }
        }
    }
    // Each request sent once, whatever the elements that share its answer.
    let (pages, stopped) = answers
        .iter()
        .flatten()
        .map(|answer| match answer {
            Ok((_, _, paged)) | Err((_, _, paged)) => *paged,
        })
        .fold((0, 0), |(pages, stopped), paged| (pages + paged.pages, stopped + usize::from(paged.stopped)));
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
            not_a_list: None,
            element: None,
            pages,
            stopped,
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
        not_a_list: None,
        element: first_failed,
        pages,
        stopped,
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
    // The pages a paged request fetched so far, kept when its bound ends it.
    let fetched = AtomicUsize::new(0);
    let answer = async {
        match fingerprint {
            // A paged request's answer is its pages joined: never another source's answer.
            Some(fingerprint) if source.paging.is_none() => {
                once(shared, state, source, request, fingerprint).await
            }
            _ => one_call(state, source, &request, shared, &fetched, until).await,
        }
    };
    let Some(until) = until else { return answer.await };
    match tokio::time::timeout_at(until, answer).await {
        Ok(answer) => answer,
        Err(_) => Err((
            None,
            UpstreamFailure::Timeout,
            Paged { paged: source.paging.is_some(), pages: fetched.load(Ordering::Relaxed), stopped: false },
        )),
    }
}

/// One request of a source: its answer's status and body when it is a 2xx JSON answer; a
/// paged source's request follows its pages ([`super::pages`]).
/// `fetched` counts a paged request's pages as they come.
async fn one_call(
    state: &State,
    source: &Source,
    request: &UpstreamRequest,
    shared: &Shared,
    fetched: &AtomicUsize,
    until: Option<tokio::time::Instant>,
) -> CallResult {
    if let Some(paging) = &source.paging {
        return match fetch_pages(
            state,
            paging,
            &source.calls,
            Some(&source.name),
            request,
            shared,
            fetched,
            until,
        )
        .await
        {
            Ok(pages) => {
                let paged = pages.paged;
                index(state, shared, pages.status, pages.joined, None, MediaType::default())
                    .map(|(s, v, _)| (s, v, paged))
                    .map_err(|(s, f, _)| (s, f, paged))
            }
            Err(failed) => Err(failed),
        };
    }
    let mut answer =
        match answer_of(state, &source.calls, Some(&source.name), request, shared, false, None).await {
            Ok(answer) => answer,
            Err((status, failure)) => return Err((status, failure, Paged::default())),
        };
    let status = answer.status.as_u16();
    // Its CLIENT span, recorded once the body is known to be JSON (or as failed when not).
    let span = answer.span.take();
    index(state, shared, status, answer.body, span, answer.content_type)
}

/// An answer's body checked and indexed, its index counted in the call's bytes.
fn index(
    state: &State,
    shared: &Shared,
    status: u16,
    body: Vec<u8>,
    span: Option<crate::upstream::AnsweredSpan>,
    content_type: MediaType,
) -> CallResult {
    // The document puts an answer two levels down (a member, an element of a `forEach` list).
    let (len, empty) = (body.len(), body.is_empty());
    match Indexed::new(body, state.config.max_depth.saturating_sub(2)) {
        Ok(indexed) => {
            let index = indexed.held_bytes().saturating_sub(len);
            shared.indexes.fetch_add(index, Ordering::Relaxed);
            state.buffered.add(index);
            Ok((status, Value::One(Arc::new(indexed)), Paged::default()))
        }
        Err(e) => {
            let failure = UpstreamFailure::NotJson(not_json(empty, content_type, &e));
            if let (UpstreamFailure::NotJson(why), Some(span)) = (&failure, span) {
                span.fail(failure.kind().label(), why);
            }
            state.metrics.upstream_error(failure.kind());
            Err((Some(status), failure, Paged::default()))
        }
    }
}

/// The answer to `request` of `source` (whose `fingerprint` is given): the one an identical
/// request of this call got or is getting, else a new call's.
async fn once(
    shared: &Shared,
    state: &State,
    source: &Source,
    request: UpstreamRequest,
    fingerprint: u64,
) -> CallResult {
    let identity = |arc: Option<usize>| arc.unwrap_or(0);
    let oauth = identity(source.calls.oauth.as_ref().map(|a| Arc::as_ptr(a) as usize));
    let tls = identity(source.calls.tls.as_ref().map(|a| Arc::as_ptr(a) as usize));
    let (request, answer) = {
        let mut sent = shared.sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
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
    // Not a paged request (those are never shared): nothing counts its pages.
    let unpaged = AtomicUsize::new(0);
    answer.get_or_init(|| one_call(state, source, &request, shared, &unpaged, None)).await.clone()
}
