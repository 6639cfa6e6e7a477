//! The `mapping_bounds` target: rules whose targets read expressions, mapped over a document
//! under small bounds (SPEC §1.8, §5). Property: the call ends within its budgets, whatever the
//! expressions would build or do. The harness (`fuzz/fuzz_targets/mapping_bounds.rs`) also
//! counts the bytes the process holds while the mapping runs, and times it.

use crate::exec;
use crate::json;
use crate::plan::Limit;
use crate::rules::{Limits, compile_json};

/// Bytes the values built by one mapping may take.
pub const BUILT_BYTES: usize = 256 << 10;

/// Bytes of the answer one mapping may write.
pub const ANSWER_BYTES: usize = 256 << 10;

/// Steps of work one mapping may take.
pub const STEPS: u64 = 200_000;

/// The most [`Prepared::map`] of a document of `input` bytes by rules with `patterns` patterns
/// may hold at once, in bytes: the values built, up to four times their budget (lists grow by
/// doubling and keep their old buffers in the arena; text is made, then copied into it); the
/// answers, up to eight times theirs (the plain one is held while the traced one is written,
/// each growing by doubling, and the trace copies the values once more); the document's tape (a
/// node of 24 bytes per byte of text at most), parsed once more for an `each` whose elements were
/// built; and the search caches of each pattern (its lazy DFA's, at most 2 MiB, and its
/// backtracker's).
pub fn memory_bound(input: usize, patterns: usize) -> usize {
    4 * BUILT_BYTES + 8 * ANSWER_BYTES + 64 * input + (1 << 20) + patterns * (3 << 20)
}

/// Rules and a document read from an input, ready to be mapped ([`Prepared::map`]): compiling
/// is not mapping, and the harness measures the mapping alone.
pub struct Prepared {
    rules: String,
    plan: crate::plan::Plan,
    document: Vec<u8>,
    /// Patterns of `regex_*` functions in the rules.
    pub patterns: usize,
}

/// What one input reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BoundsReached {
    /// The rules do not compile (an expression of the input's does not).
    Refused,
    /// The document is not JSON.
    DocumentRefused,
    /// Mapped within the bounds.
    Mapped,
    /// Stopped at a bound.
    Stopped(Limit),
}

/// The input's first line holds expressions separated by tabs, each read by a target (of type
/// `Json`, then `String`, then `Int`, in turn); a second line that starts with `each:` holds an
/// `each` expression; the rest is the document. Maps it plainly and traced. Checks: nothing
/// panics; both runs stop at the same bound or write the same output; an output is valid JSON
/// no longer than the answer's bound. (The harness checks the memory held and the time taken.)
pub fn mapping_bounds(data: &[u8]) -> BoundsReached {
    match prepare(data) {
        Ok(prepared) => prepared.map(),
        Err(reached) => reached,
    }
}

/// Reads and compiles an input of [`mapping_bounds`]; what it reached when it is not mapped.
pub fn prepare(data: &[u8]) -> Result<Prepared, BoundsReached> {
    let (first, rest) = super::expr::split(data);
    let (each, document) = match rest.strip_prefix(b"each:") {
        Some(line) => {
            let (each, document) = super::expr::split(line);
            (Some(each), document)
        }
        None => (None, rest),
    };
    let (Ok(first), Ok(each)) = (std::str::from_utf8(first), each.map(std::str::from_utf8).transpose())
    else {
        return Err(BoundsReached::Refused);
    };
    let types = ["Json", "String", "Int"];
    let (mut new, mut old) = (Vec::new(), Vec::new());
    for (i, expr) in first.split('\t').enumerate().take(16) {
        let expr = serde_json::to_string(expr).unwrap_or_default();
        new.push(format!(r#""t{i}":{{"key":"t{i}","type":"{}"}}"#, types[i % types.len()]));
        old.push(format!(r#""t{i}":{{"expr":{expr}}}"#));
    }
    let each = each.map(|e| format!(r#","each":{}"#, serde_json::to_string(e).unwrap_or_default()));
    let rules = format!(
        r#"{{"newBodyFields":{{{}}},"oldBodyFields":{{{}}}{}}}"#,
        new.join(","),
        old.join(","),
        each.unwrap_or_default()
    );
    let limits = Limits {
        max_rules: 16,
        max_depth: 16,
        max_expr_bytes: BUILT_BYTES,
        max_response_bytes: ANSWER_BYTES,
        max_mapping_steps: STEPS,
        max_source_calls: 64,
    };
    let Ok(compiled) = compile_json(rules.as_bytes(), &limits) else { return Err(BoundsReached::Refused) };
    let patterns =
        compiled.plan.programs.iter().map(|p| p.natives.iter().filter(|n| n.regex.is_some()).count()).sum();
    Ok(Prepared { rules, plan: compiled.plan, document: document.to_vec(), patterns })
}

impl Prepared {
    /// Maps the document plainly and traced; see [`mapping_bounds`].
    pub fn map(&self) -> BoundsReached {
        let (rules, plan) = (&self.rules, &self.plan);
        let mut text = self.document.clone();
        let mapped = json::with_parsed(&mut text, 16, |doc| {
            let mut plain = Vec::new();
            let outcome = exec::execute(plan, doc, 0, &mut plain);
            let mut traced = Vec::new();
            let trace = exec::execute_traced(plan, doc, 0, &mut traced);
            // A traced run stops where a plain one does; where the plain one does not, the trace
            // may pass a bound by itself (its entries count against the answer, its walks take
            // steps of their own), and the output written is the same either way.
            if let Some(limit) = outcome.limit {
                assert_eq!(
                    outcome.limit, trace.outcome.limit,
                    "{rules}: a traced run stops where a plain one does"
                );
                return BoundsReached::Stopped(limit);
            }
            assert_eq!(plain, traced, "{rules}: a traced run writes the same bytes");
            assert!(plain.len() <= ANSWER_BYTES, "{rules}: {} bytes written", plain.len());
            if let Err(e) = serde_json::from_slice::<serde_json::Value>(&plain) {
                panic!("{rules} wrote invalid JSON ({e}): {}", String::from_utf8_lossy(&plain));
            }
            BoundsReached::Mapped
        });
        mapped.unwrap_or(BoundsReached::DocumentRefused)
    }
}
