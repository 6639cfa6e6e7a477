//! `POST /v1/preview` (SPEC §2): maps a sample with rules; nothing is stored and nothing is called.

use std::time::Instant;

use http::StatusCode;

use super::problem::write_problems;
use super::reply::{json, read_body, timing};
use super::{ApiError, Request, Response, SERVER_TIMING, State};
use crate::exec;
use crate::json::{self as tape};
use crate::metrics::{Metrics, RulesSource};
use crate::plan::Limit;
use crate::rules::{Compiled, Limits, MAX_LISTED, Problem, compile_value};
use crate::suggest;

/// Members of a preview body.
const SAMPLE: &str = "originalResponse";
const RULES: &str = "mappingRules";
/// A sample `$caller` (SPEC §2.4), optional.
const CALLER: &str = "caller";

pub(super) async fn preview(state: &State, request: Request) -> Result<Response, ApiError> {
    let traced = trace_flag(request.uri().query())?;
    let (parts, body) = request.into_parts();
    let mut body = read_body(state, &parts.headers, body).await?;
    let started = Instant::now();
    // The sample sits one level inside the body, so the body may nest one level more. A body
    // that is not JSON is told where its mistake is, in words (a check of its own: the parser
    // rewrites the text it reads).
    let depth = state.config.max_depth + 1;
    let refused = |e: &tape::JsonError| {
        ApiError::bad_body(&body, e, |limit| {
            format!(
                "the body nests deeper than {limit} levels: the sample (`{SAMPLE}`) may nest at most {} (RECAST_MAX_DEPTH)",
                limit - 1
            )
        })
    };
    tape::diagnose(&body, depth).map_err(|e| refused(&e))?;
    // Compiled and mapped off the async workers, within the budget of one compile: whatever
    // rules a preview holds, a worker only hands them over.
    let (limits, metrics) = (state.config.limits(), state.metrics.clone());
    let out = state
        .compile(move || {
            tape::with_parsed(&mut body, depth, |nodes| map_sample(&limits, &metrics, nodes, traced))
                .map_err(|e| ApiError::InvalidJson(e.to_string()))?
        })
        .await??;
    let mut response = json(StatusCode::OK, out);
    response.headers_mut().insert(SERVER_TIMING, timing(&[("map", started.elapsed())]));
    Ok(response)
}

/// Compiles the body's rules and maps its sample; with `traced`, wraps the output with the trace
/// and the warnings.
fn map_sample(
    limits: &Limits,
    metrics: &Metrics,
    nodes: &tape::Doc<'_, '_>,
    traced: bool,
) -> Result<Vec<u8>, ApiError> {
    let (sample, rules, caller) = members(nodes)?;
    let caller = match caller {
        Some(at) if matches!(nodes[at], tape::Node::Object { .. }) => {
            Some(crate::expr::Const::from_tape(nodes, at))
        }
        Some(_) => {
            return Err(ApiError::InvalidBody(vec![Problem::new(
                format!("/{CALLER}"),
                "must be an object: a sample `$caller`, such as {\"kind\": \"jwt\", \"id\": \"u1\", \"claims\": {...}}",
            )]));
        }
        None => None,
    };
    let compiled = compile_value(nodes, rules, limits).map_err(|problems| {
        metrics.compile_failure(RulesSource::Preview);
        ApiError::InvalidRules(problems)
    })?;
    preview_output(compiled, nodes, sample, caller.as_ref(), traced)
        .map_err(|(limit, bound)| ApiError::PreviewLimit { limit, bound })
}

/// A preview's answer: the output alone, or with `traced` `{"output", "trace", "warnings"}`.
/// `recast preview` prints the same. When the mapping passed one of its bounds: which, and where
/// that bound stands.
pub fn preview_output(
    compiled: Compiled,
    nodes: &tape::Doc<'_, '_>,
    sample: usize,
    caller: Option<&crate::expr::Const>,
    traced: bool,
) -> Result<Vec<u8>, (Limit, u64)> {
    let bounds = compiled.plan.bounds();
    let stopped = |limit: Limit| (limit, bounds.of(limit));
    let mut out = Vec::with_capacity(1024);
    if !traced {
        let outcome = exec::execute_as(&compiled.plan, nodes, sample, caller, &mut out);
        return match outcome.limit {
            Some(limit) => Err(stopped(limit)),
            None => Ok(out),
        };
    }
    out.extend_from_slice(b"{\"output\":");
    let trace = exec::execute_traced_as(&compiled.plan, nodes, sample, caller, &mut out);
    if let Some(limit) = trace.outcome.limit {
        return Err(stopped(limit));
    }
    // The trace repeats values of the output and tells of each: the whole answer stays within
    // the bound.
    if out.len().saturating_add(trace.bytes()) > bounds.answer_bytes {
        return Err(stopped(Limit::Answer));
    }
    out.extend_from_slice(b",\"trace\":");
    trace.write_entries(&mut out);
    out.extend_from_slice(b",\"warnings\":");
    let warnings: Vec<_> = compiled.warnings.into_iter().chain(trace.notes).collect();
    write_problems(&mut out, &warnings);
    out.push(b'}');
    Ok(out)
}

/// `?trace=true` (also `?trace` and `?trace=1`); `false`/`0` or no parameter turn it off.
fn trace_flag(query: Option<&str>) -> Result<bool, ApiError> {
    let mut traced = false;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match (name, value) {
            ("trace", "" | "true" | "1") => traced = true,
            ("trace", "false" | "0") => traced = false,
            ("trace", _) => {
                return Err(ApiError::InvalidQuery(format!("`trace` takes true or false, not `{value}`")));
            }
            _ => {}
        }
    }
    Ok(traced)
}

/// Finds the sample and the rules in the body, which must hold exactly those two members;
/// every problem with the body's shape is listed, at its location.
fn members(nodes: &tape::Nodes<'_>) -> Result<(usize, usize, Option<usize>), ApiError> {
    let shape = || format!("the body must be a JSON object with `{SAMPLE}` and `{RULES}`");
    let members =
        tape::members(nodes, 0).ok_or_else(|| ApiError::InvalidBody(vec![Problem::new("", shape())]))?;
    let (mut sample, mut rules, mut caller) = (None, None, None);
    let mut problems = Vec::new();
    // Members named for one that is missing: reported as misspelt, not also as missing.
    let mut meant = Vec::new();
    let mut unlisted = 0usize;
    for (name, at) in members {
        let slot = match name {
            SAMPLE => &mut sample,
            RULES => &mut rules,
            CALLER => &mut caller,
            other => {
                // A body of many unknown members lists as many as an answer shows, and counts
                // the rest.
                // (One place is left for the line that counts the rest.)
                if problems.len() < MAX_LISTED - 1 {
                    let mut at = String::new();
                    tape::push_pointer(&mut at, other);
                    problems
                        .push(Problem::new(at, suggest::unknown("member", other, &[SAMPLE, RULES, CALLER])));
                    meant.extend(suggest::closest(other, [SAMPLE, RULES]));
                } else {
                    unlisted += 1;
                }
                continue;
            }
        };
        if slot.replace(at).is_some() {
            problems.push(Problem::new(format!("/{name}"), format!("member `{name}` is given twice")));
        }
    }
    for (name, found) in [(SAMPLE, sample), (RULES, rules)] {
        if found.is_none() && !meant.contains(&name) {
            problems.push(Problem::new(format!("/{name}"), format!("missing required member `{name}`")));
        }
    }
    if unlisted > 0 {
        problems.push(Problem::new("", format!("{unlisted} more unknown members are not listed")));
    }
    match (sample, rules) {
        (Some(sample), Some(rules)) if problems.is_empty() => Ok((sample, rules, caller)),
        _ => Err(ApiError::InvalidBody(problems)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_flag_reads_true_false_and_refuses_the_rest() {
        assert!(!trace_flag(None).unwrap());
        assert!(trace_flag(Some("trace=true")).unwrap());
        assert!(trace_flag(Some("a=b&trace")).unwrap());
        assert!(!trace_flag(Some("trace=true&trace=false")).unwrap());
        assert!(trace_flag(Some("trace=yes")).is_err());
    }
}
