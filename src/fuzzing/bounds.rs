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

/// The most a mapping of a document of `input` bytes may hold at once, in bytes: a few times
/// each budget (lists grow by doubling and keep their old buffers in the arena; the answer
/// grows by doubling too; a traced run copies each value once more), and the document's tape
/// (a node of 24 bytes per byte of text at most), parsed once more for an `each` whose elements
/// were built.
pub fn memory_bound(input: usize) -> usize {
    4 * BUILT_BYTES + 4 * ANSWER_BYTES + 64 * input + (1 << 20)
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
        return BoundsReached::Refused;
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
    };
    let Ok(compiled) = compile_json(rules.as_bytes(), &limits) else { return BoundsReached::Refused };
    let mut text = document.to_vec();
    let mapped = json::with_parsed(&mut text, 16, |doc| {
        let mut plain = Vec::new();
        let outcome = exec::execute(&compiled.plan, doc, 0, &mut plain);
        let mut traced = Vec::new();
        let trace = exec::execute_traced(&compiled.plan, doc, 0, &mut traced);
        assert_eq!(outcome.limit, trace.outcome.limit, "{rules}: a traced run stops where a plain one does");
        if let Some(limit) = outcome.limit {
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
