//! Replays the fuzz targets' seed corpora (`fuzz/corpus/<target>.tar.gz`, one archive per
//! target; `fuzz/corpus.sh` unpacks, runs, merges and packs them), so a regression that the
//! fuzzers once covered fails `cargo test` without a fuzzer installed.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::Path;

use recast::fuzzing::{Reached, rules_then_execute};

/// Every input of `target`'s seed corpus, by name.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(format!("{target}.tar.gz"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let mut files: Vec<(String, Vec<u8>)> = archive
        .entries()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .map(|entry| {
            let mut entry = entry.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let name = entry.path().expect("an input's name").display().to_string();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).expect("an input");
            (name, data)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn rules_exec_corpus_replays_and_reaches_the_executor() {
    let files = corpus("rules_exec");
    assert!(files.len() >= 50, "only {} seeds", files.len());
    let mut reached: HashMap<Reached, usize> = HashMap::new();
    for (name, data) in &files {
        let outcome = std::panic::catch_unwind(|| rules_then_execute(data))
            .unwrap_or_else(|_| panic!("seed {name} fails"));
        *reached.entry(outcome).or_default() += 1;
    }
    // The corpus is only worth replaying if it drives rules through the executor.
    let mapped = reached.get(&Reached::Mapped).copied().unwrap_or(0);
    assert!(mapped * 4 >= files.len(), "only {mapped} of {} seeds map anything: {reached:?}", files.len());
    assert!(reached.contains_key(&Reached::RulesRefused), "no seed exercises rule problems: {reached:?}");
}

/// Replays one target's corpus through `run`, and returns how often each outcome came up.
fn replay<R: std::hash::Hash + Eq + std::fmt::Debug>(
    target: &str,
    run: impl Fn(&[u8]) -> R,
) -> HashMap<R, usize> {
    let files = corpus(target);
    assert!(files.len() >= 10, "{target}: only {} seeds", files.len());
    let mut reached = HashMap::new();
    for (name, data) in &files {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(data)))
            .unwrap_or_else(|_| panic!("{target}: seed {name} fails"));
        *reached.entry(outcome).or_default() += 1;
    }
    reached
}

#[test]
fn rules_compile_corpus_replays_both_outcomes() {
    let reached = replay("rules_compile", recast::fuzzing::rules_compile);
    assert!(
        reached.contains_key(&Reached::Mapped) && reached.contains_key(&Reached::RulesRefused),
        "{reached:?}"
    );
}

#[test]
fn exec_document_corpus_replays_and_maps() {
    let reached = replay("exec_document", recast::fuzzing::exec_document);
    assert!(reached.get(&Reached::Mapped).copied().unwrap_or(0) >= 10, "{reached:?}");
}

#[test]
fn upstream_url_corpus_replays() {
    let reached = replay("upstream_url", recast::fuzzing::upstream_url);
    // Worth replaying only if seeds reach both accepted routes (whose requests are checked) and
    // refused ones.
    assert!(
        reached.contains_key(&Reached::Mapped) && reached.contains_key(&Reached::RulesRefused),
        "{reached:?}"
    );
}

#[test]
fn http_request_corpus_replays_against_the_service() {
    use recast::fuzzing::{Ending, HttpReached, http_request, http_request_ending};
    let reached = replay("http_request", http_request);
    for class in [2, 4] {
        assert!(reached.contains_key(&HttpReached::Answered(class)), "no {class}xx answer: {reached:?}");
    }
    // The stored route answers through its upstream. (Half-closing instead races the upstream's
    // answer against the service noticing the client's end; `edges.rs` pins that with an upstream
    // that holds its answer.)
    let call = format!("GET {} HTTP/1.1\r\nhost: f\r\n\r\n", recast::fuzzing::ROUTE_PATH);
    assert_eq!(http_request_ending(call.as_bytes(), Ending::Closing), HttpReached::Answered(2));
}

#[test]
fn upstream_answer_corpus_replays_and_the_next_call_gets_its_own_answer() {
    use recast::fuzzing::{AnswerReached, upstream_answer};
    let reached = replay("upstream_answer", upstream_answer);
    assert!(
        reached.contains_key(&AnswerReached::Answered(2)) && reached.contains_key(&AnswerReached::Failed),
        "{reached:?}"
    );
}

#[test]
fn upstream_headers_corpus_replays_every_outcome() {
    use recast::fuzzing::{HeadersReached, upstream_headers};
    let reached = replay("upstream_headers", upstream_headers);
    for outcome in [HeadersReached::Kept, HeadersReached::Forbidden, HeadersReached::NoFreshness] {
        assert!(reached.contains_key(&outcome), "no seed reaches {outcome:?}: {reached:?}");
    }
}

#[test]
fn trace_context_corpus_replays_every_outcome() {
    use recast::fuzzing::{TraceReached, trace_context};
    let reached = replay("trace_context", trace_context);
    for outcome in [TraceReached::NoParent, TraceReached::Parent, TraceReached::ParentAndState] {
        assert!(reached.contains_key(&outcome), "no seed reaches {outcome:?}: {reached:?}");
    }
}

#[test]
fn caller_token_corpus_replays_every_outcome() {
    use recast::fuzzing::{TokenReached, caller_token};
    let reached = replay("caller_token", caller_token);
    for outcome in [
        TokenReached::Refused,
        TokenReached::NoKey,
        TokenReached::BadSignature,
        TokenReached::ClaimsRefused,
        TokenReached::Admitted,
    ] {
        assert!(reached.contains_key(&outcome), "no seed reaches {outcome:?}: {reached:?}");
    }
    assert!(reached[&TokenReached::Admitted] >= 5, "every algorithm's seed is admitted: {reached:?}");
}

#[test]
fn expr_eval_corpus_replays_every_outcome() {
    use recast::fuzzing::{ExprReached, expr_eval};
    let reached = replay("expr_eval", expr_eval);
    for outcome in [ExprReached::Value, ExprReached::Failed, ExprReached::Refused] {
        assert!(reached.contains_key(&outcome), "no seed reaches {outcome:?}: {reached:?}");
    }
}

/// The differential target's oracle is a fuzz-only dependency; its seeds replay through
/// `expr_eval`'s checks, and through the original language's evaluation.
#[test]
fn expr_differential_corpus_replays() {
    use recast::fuzzing::{ExprOutcome, expr_eval, expr_run_original};
    let reached = replay("expr_differential", expr_eval);
    assert!(reached.len() >= 2, "{reached:?}");
    let original =
        replay("expr_differential", |data| matches!(expr_run_original(data), ExprOutcome::Value(_)));
    assert!(original.contains_key(&true), "{original:?}");
}

#[test]
fn plain_paths_corpus_replays_and_maps() {
    let reached = replay("plain_paths", recast::fuzzing::plain_paths);
    assert!(reached.get(&Reached::Mapped).copied().unwrap_or(0) >= 100, "{reached:?}");
}

#[test]
fn json_index_corpus_replays_both_verdicts() {
    let reached = replay("json_index", recast::fuzzing::json_index);
    assert!(
        reached.get(&Reached::Mapped).copied().unwrap_or(0) >= 50
            && reached.get(&Reached::DocumentRefused).copied().unwrap_or(0) >= 50,
        "{reached:?}"
    );
}

#[test]
fn upstream_answer_h2_corpus_replays_and_the_next_call_gets_its_own_answer() {
    use recast::fuzzing::{AnswerReached, upstream_answer_h2};
    let reached = replay("upstream_answer_h2", upstream_answer_h2);
    for outcome in [AnswerReached::Answered(2), AnswerReached::Answered(4), AnswerReached::Failed] {
        assert!(reached.contains_key(&outcome), "no seed reaches {outcome:?}: {reached:?}");
    }
}

#[test]
fn mapping_bounds_corpus_replays_and_meets_each_bound() {
    use recast::fuzzing::BoundsReached;
    use recast::plan::Limit;
    let reached = replay("mapping_bounds", recast::fuzzing::mapping_bounds);
    // Worth replaying only if seeds map within the bounds and stop at each of them.
    for wanted in [
        BoundsReached::Mapped,
        BoundsReached::Stopped(Limit::Built),
        BoundsReached::Stopped(Limit::Steps),
        BoundsReached::Stopped(Limit::Answer),
    ] {
        assert!(reached.contains_key(&wanted), "no seed reaches {wanted:?}: {reached:?}");
    }
}

#[test]
fn compose_render_corpus_replays_rendered_and_refused_requests() {
    let reached = replay("compose_render", recast::fuzzing::compose_render);
    // Requests rendered and checked, templates refused at registration, values that fail their
    // source.
    for outcome in [Reached::Mapped, Reached::RulesRefused, Reached::DocumentRefused] {
        assert!(
            reached.get(&outcome).copied().unwrap_or(0) >= 10,
            "few seeds reach {outcome:?}: {reached:?}"
        );
    }
}

#[test]
fn compose_compile_corpus_replays_accepted_and_refused_compositions() {
    let reached = replay("compose_compile", recast::fuzzing::compose_compile);
    for outcome in [Reached::Mapped, Reached::RulesRefused] {
        assert!(
            reached.get(&outcome).copied().unwrap_or(0) >= 10,
            "few seeds reach {outcome:?}: {reached:?}"
        );
    }
}

#[test]
fn compose_pages_corpus_replays_pages_read_and_paginate_refused() {
    let reached = replay("compose_pages", recast::fuzzing::compose_pages);
    // A next request made, a last page, a page refused, a `paginate` refused.
    for outcome in [Reached::Mapped, Reached::MappedNothing, Reached::DocumentRefused, Reached::RulesRefused]
    {
        assert!(
            reached.get(&outcome).copied().unwrap_or(0) >= 10,
            "few seeds reach {outcome:?}: {reached:?}"
        );
    }
}
