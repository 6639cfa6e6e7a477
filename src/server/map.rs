//! The mapping of an upstream's answer by a route's rules: a 2xx JSON answer read for the plan
//! and mapped in one pass (`exec::map_text`), any other answer a failure counted by its kind;
//! the mapping's span; and what an answer that is not JSON was, in words.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::problem::UpstreamFailure;
use super::state::State;
use crate::exec;
use crate::json::JsonError;
use crate::metrics::{Metrics, UpstreamErrorKind};
use crate::route::Route;
use crate::telemetry::{Kind, Span, keys};
use crate::upstream::{Answer, MediaType};

/// Maps a 2xx JSON answer by the route's rules; any other answer is a failure, counted by kind.
/// The upstream's body is never passed on. Returns the time the mapping took (zero when there
/// was nothing to map).
pub(super) fn map_answer(
    state: &State,
    route: &Route,
    answer: &mut Answer,
    caller: Option<&crate::callers::Caller>,
) -> (Result<Vec<u8>, UpstreamFailure>, Duration) {
    let span = state.tracer.child(Kind::Internal, "map");
    let size = answer.body.len();
    let (mapped, took) = map_success(route, answer, state.config.max_depth, &state.metrics, caller);
    match &mapped {
        Ok(_) => state.metrics.mapping.observe(took),
        Err(failure) => state.metrics.upstream_error(failure.kind()),
    }
    if let Some(mut span) = span {
        mapping_span(&mut span, size, mapped.as_ref().map(Vec::len).map_err(|failure| failure.kind()));
        state.tracer.end_after(span, took);
    }
    (mapped, took)
}

/// The attributes of a mapping's span: the size of the document read and of the answer
/// written, or why there is none (Error).
pub(super) fn mapping_span(span: &mut Span, document: usize, written: Result<usize, UpstreamErrorKind>) {
    span.set(&keys::DOCUMENT_SIZE, document as i64);
    match written {
        Ok(written) => span.set(&keys::OUTPUT_SIZE, written as i64),
        Err(kind) => {
            span.set(&keys::ERROR_TYPE, kind.label());
            span.fail(kind.label());
        }
    }
}

fn map_success(
    route: &Route,
    answer: &mut Answer,
    max_depth: usize,
    metrics: &Metrics,
    caller: Option<&crate::callers::Caller>,
) -> (Result<Vec<u8>, UpstreamFailure>, Duration) {
    if !answer.status.is_success() {
        return (Err(UpstreamFailure::Status(answer.status, answer.certificate_asked)), Duration::ZERO);
    }
    let Ok(compiled) = &route.rules else {
        return (
            Err(UpstreamFailure::NotJson("the route's rules do not compile".to_owned())),
            Duration::ZERO,
        );
    };
    let started = Instant::now();
    let mut out = Vec::with_capacity(answer.body.len() / 2 + 64);
    let empty = answer.body.is_empty();
    let parsed =
        exec::map_text_as(&compiled.plan, &mut answer.body, max_depth, route.caller_value(caller), &mut out);
    let took = started.elapsed();
    if let Ok(outcome) = &parsed
        && outcome.expression_errors > 0
    {
        metrics.expression_errors.fetch_add(u64::from(outcome.expression_errors), Ordering::Relaxed);
    }
    let mapped = match parsed {
        Ok(exec::Outcome { limit: Some(limit), .. }) => {
            Err(UpstreamFailure::MappingLimit { limit, bound: compiled.plan.bounds().of(limit) })
        }
        Ok(_) => Ok(out),
        Err(e) => Err(UpstreamFailure::NotJson(not_json(empty, answer.content_type, &e))),
    };
    (mapped, took)
}

/// What an upstream's 2xx answer that is not JSON was, in words: what its `Content-Type` said
/// and what is wrong, never the body itself.
pub(super) fn not_json(empty: bool, content_type: MediaType, error: &JsonError) -> String {
    if empty {
        return "the upstream answered with an empty body, not JSON".to_owned();
    }
    match (content_type.as_str(), error) {
        (_, JsonError::TooDeep { limit }) => {
            format!("the upstream's JSON nests deeper than {limit} levels (RECAST_MAX_DEPTH)")
        }
        (Some(_), error) if content_type.is_json() => {
            format!(
                "the upstream's answer says it is JSON (`{}`) but is not valid JSON: {error}",
                content_type.as_str().unwrap_or_default()
            )
        }
        (Some(kind), _) => format!("the upstream answered with `{kind}`, not JSON"),
        (None, error) => {
            format!("the upstream answered with something that is not JSON (no Content-Type): {error}")
        }
    }
}
